"""Inference for the collapsed sparse models (SGPR and its relatives), whose optimal q(u)
is closed form given the hyperparameters (and, for an augmented likelihood, given q(w)).

- :class:`Collapsed`: type-II maximum likelihood (MAP with priors) of the collapsed bound
  [Titsias2009] (or the DTC / FITC log likelihood [Quinonero-Candela2005]) of a Gaussian
  likelihood: the default for those models.
- :class:`CollapsedVI`: rounds of closed-form q(w) updates and L-BFGS on the collapsed
  augmented bound [Galy-Fajou2020, Algorithm 1] (or on the second-order Taylor objective):
  the default for a collapsed model with an augmented likelihood or Taylor expansion
  points (``model.has_aux``).
"""

from __future__ import annotations

import equinox as eqx

from augmentedgp.core.validation import check_int


class Collapsed(eqx.Module):
    """Type-II maximum likelihood of a collapsed model's objective
    (``model.training_objective``), q(u) at its optimum given the hyperparameters."""

    def check(self, model) -> None:
        """A ValueError unless ``model`` has no q(w) state (a Gaussian likelihood)."""
        if model.has_aux:
            raise ValueError(f"this {type(model).__name__} has an augmented likelihood or "
                             "expansion points: fit it with CollapsedVI (the default)")


class CollapsedVI(eqx.Module):
    """Collapsed augmented VI: each round ``sweeps`` closed-form q(w) updates, then at most
    ``lbfgs_iter`` L-BFGS iterations on the collapsed bound at that q(w)
    (:func:`augmentedgp.training.fit_collapsed`)."""

    lbfgs_iter: int = eqx.field(static=True, default=50)
    sweeps: int = eqx.field(static=True, default=3)

    def __init__(self, lbfgs_iter: int = 50, sweeps: int = 3):
        self.lbfgs_iter = check_int(lbfgs_iter, "lbfgs_iter")
        self.sweeps = check_int(sweeps, "sweeps", low=0)

    def check(self, model) -> None:
        """A ValueError unless ``model`` carries a q(w) state (``model.has_aux``)."""
        if not model.has_aux:
            raise ValueError(f"CollapsedVI is for collapsed models with an augmented "
                             f"likelihood or expansion points; this {type(model).__name__} has "
                             "a Gaussian likelihood: fit it with Collapsed (the default)")


__all__ = ["Collapsed", "CollapsedVI"]
