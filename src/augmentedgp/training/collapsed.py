"""``fit_collapsed``: SGPR with an augmentable likelihood, by collapsed augmented VI (or
TaylorSGPR, by the collapsed second-order Taylor approximation).

Given q(w) the augmented sites are Gaussian, so the optimal q(u) is closed form and the
bound collapses as [Titsias2009]'s (``SGPR.collapsed``; for the logistic likelihood it is
the Jaakkola-Jordan bound [Jaakkola2000] collapsed as in [Izmailov2016]). Each round:

1. ``sweeps`` closed-form coordinate-ascent updates of q(w) at the current
   hyperparameters, each optimal given the optimal q(u) given the previous q(w)
   ([Galy-Fajou2020, Algorithm 1], with the global step in closed form);
2. at most ``lbfgs_iter`` L-BFGS iterations on the collapsed bound (plus log prior) over
   the kernel, likelihood, mean and inducing parameters, q(w) fixed, warm-started from the
   previous round's parameters.

Both steps never lower the bound. For a TaylorSGPR the state is the expansion points xi,
step 1 sets xi = E_q[f] and step 2 runs on the Taylor objective: an approximation, not a
bound, which neither step is guaranteed to increase (``TaylorSGPR``). Training stops when the
relative change of the bound over a round, |F_k - F_{k-1}| / (|F_{k-1}| + 1), is below
``tol``, or after ``max_rounds`` rounds. The returned posterior holds the optimal q(u) given
the final q(w).
"""

from __future__ import annotations

import dataclasses
import time

import equinox as eqx
import numpy as np
from jax import lax
from jaxtyping import ArrayLike, Float, Shaped

from augmentedgp.core.loop import History, minimize, progress
from augmentedgp.core.params import log_prior
from augmentedgp.core.validation import check_int
from augmentedgp.inference.collapsed import CollapsedVI
from augmentedgp.models.sparse import SGPR, CollapsedSparseGP, SparsePosterior, TaylorSGPR
from augmentedgp.training.dispatch import FitSettings, register

MAX_ITER = 1000  # L-BFGS iterations in all when fit's max_iter is left at None


@dataclasses.dataclass(eq=False)
class CollapsedHistory(History):
    """The History of a collapsed fit: ``objective`` and ``wall_time`` per L-BFGS iteration
    (the negative bound minus log prior, all rounds in turn); per round, ``bounds``: the
    collapsed bound (plus log prior; the Taylor objective for TaylorSGPR) after the
    round; ``q_aux``: the final q(w) state (a ``TaylorPoint`` for TaylorSGPR)."""

    bounds: np.ndarray | None = None
    q_aux: object = None

    @property
    def n_rounds(self) -> int:
        """The number of rounds run."""
        return 0 if self.bounds is None else int(self.bounds.shape[0])


def _negative_bound(model, q_aux, X, y):
    """-(collapsed bound at q(w) + log prior): what L-BFGS minimises."""
    return -(model.training_objective(X, y, q_aux=q_aux) + log_prior(model))


@eqx.filter_jit
def _sweeps(model, X, y, q_aux, n):
    """``n`` closed-form q(w) updates at fixed hyperparameters."""
    return lax.fori_loop(0, n, lambda _, q: model.aux_step(X, y, q), q_aux)


@eqx.filter_jit
def _bound(model, X, y, q_aux):
    return model.training_objective(X, y, q_aux=q_aux) + log_prior(model)


def fit_collapsed(model: SGPR | TaylorSGPR, X: Float[ArrayLike, "n d"],
                  y: Shaped[ArrayLike, " n"], *, max_rounds: int = 100, lbfgs_iter: int = 50,
                  sweeps: int = 3, tol: float = 1e-6, q_aux=None, callback=None,
                  verbose: bool = False) -> SparsePosterior:
    """Fit an SGPR (augmentable or Gaussian likelihood) or a TaylorSGPR by alternating
    closed-form q(w) updates with L-BFGS on the collapsed bound (module docstring).

    ``q_aux``: the starting q(w) state (default: ``model.initial_aux(X, y)``, optimal for
    q(u) = p(u)). ``callback(round, objective, model)`` runs after every round, with the
    objective -(bound + log prior), and may return True to stop. Returns a
    :class:`~augmentedgp.models.SparsePosterior` whose model is an SVGP holding the optimal
    q(u) given the final q(w), with a :class:`CollapsedHistory`.
    """
    if not isinstance(model, SGPR | TaylorSGPR):
        raise ValueError(f"fit_collapsed is for SGPR and TaylorSGPR models, got "
                         f"{type(model).__name__} (fit DTC and FITC with augmentedgp.fit)")
    max_rounds = check_int(max_rounds, "max_rounds")
    lbfgs_iter = check_int(lbfgs_iter, "lbfgs_iter")
    sweeps = check_int(sweeps, "sweeps", low=0)
    if not (tol >= 0.0):
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    Xa, ya = model.validate_data(X, y)
    q_aux = model.initial_aux(Xa, ya) if q_aux is None else model.check_aux(ya, q_aux)
    values, times, bounds = [], [], []
    start = time.perf_counter()
    message, status = "max_rounds reached", "max_iter"
    report = progress(verbose, max_rounds, "collapsed VI")
    try:
        for k in range(max_rounds):
            q_aux = _sweeps(model, Xa, ya, q_aux, sweeps)
            round_start = time.perf_counter() - start
            model, hist = minimize(_negative_bound, model, q_aux, Xa, ya, optimizer="lbfgs",
                                   max_iter=lbfgs_iter, tol=1e-12)
            values.extend(hist.objective.tolist())
            times.extend((round_start + hist.wall_time).tolist())
            bounds.append(float(_bound(model, Xa, ya, q_aux)))
            report(k + 1, -bounds[-1])
            if not np.isfinite(bounds[-1]):
                raise ValueError(f"the collapsed bound became non-finite in round {k + 1}")
            if callback is not None and callback(k + 1, -bounds[-1], model):
                message, status = "stopped by callback", "callback"
                break
            if k > 0 and abs(bounds[-1] - bounds[-2]) / (abs(bounds[-2]) + 1.0) < tol:
                message, status = "converged (relative change of the bound below tol)", "converged"
                break
    finally:
        report(None, None)
    hist = CollapsedHistory(np.array(values), np.array(times), status, message,
                            bounds=np.array(bounds), q_aux=q_aux)
    return SparsePosterior(model.to_svgp(Xa, ya, q_aux), Xa, ya, hist)


@register(CollapsedSparseGP, CollapsedVI)
def fit_collapsed_vi(model: SGPR | TaylorSGPR, X: Float[ArrayLike, "n d"],
                     y: Shaped[ArrayLike, " n"], inference: CollapsedVI,
                     s: FitSettings) -> SparsePosterior:
    """``fit``'s training of a collapsed model with q(w) state: :func:`fit_collapsed` with
    ``ceil(max_iter / inference.lbfgs_iter)`` rounds (``max_iter`` L-BFGS iterations in
    all, 1000 by default) and ``tol`` (default 1e-6)."""
    s.reject("optimizer", "n_restarts", "validation_data", "hyper_every",
             why="do not apply to collapsed augmented VI (rounds of closed-form q(w) updates "
                 "and L-BFGS)")
    inference.check(model)
    max_iter = MAX_ITER if s.max_iter is None else s.max_iter
    rounds = max(1, -(-max_iter // inference.lbfgs_iter))
    return fit_collapsed(model, X, y, max_rounds=rounds, lbfgs_iter=inference.lbfgs_iter,
                         sweeps=inference.sweeps, tol=1e-6 if s.tol is None else s.tol,
                         callback=s.callback, verbose=s.verbose)


__all__ = ["CollapsedHistory", "fit_collapsed", "fit_collapsed_vi"]
