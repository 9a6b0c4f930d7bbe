"""``Plan``: the training the library chooses from the data size, the likelihood and a
budget -- what the scikit-learn estimators and the command line run, and what
``agp.fit(agp.GP(kernel, likelihood), X, y, agp.Plan())`` runs for any user.

Given the prior (kernel, mean) and likelihood of a GP or VGP, a plan chooses (see
:meth:`Plan.choose`; the measurements behind each number are in docs/performance.md,
"The default training plan"):

- the model: the full model (an exact GP for a Gaussian likelihood, else a VGP) up to
  ``n_inducing`` points, a sparse one above (SGPR, else SVGP) with ``n_inducing`` k-means
  inducing inputs;
- the inference: type-II maximum likelihood for a Gaussian likelihood; otherwise augmented
  conjugate VI where the likelihood is augmentable (its objective per likelihood:
  :func:`augmented_objective`), quadrature VI elsewhere;
- the budget: full batch up to ``FULL_BATCH_MAX`` points; above, minibatches of
  ``AUTO_BATCH`` for ``SVI_EPOCHS`` epochs, stopping on epoch averages of the objective,
  then ``FINISH_ITER`` full-batch iterations.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import equinox as eqx
import jax
import numpy as np

from augmentedgp.augmentation.protocol import Augmented
from augmentedgp.core.params import fixed, is_parameter
from augmentedgp.core.validation import check_int
from augmentedgp.inference.vi import (
    AnalyticSVI,
    AnalyticVI,
    QuadratureSVI,
    QuadratureVI,
    VariationalInference,
    quadrature_step,
    stages,
)
from augmentedgp.likelihoods import Gaussian, Laplace, LogisticSoftmax, NegativeBinomial, StudentT
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.models import inducing
from augmentedgp.models.gp import GP
from augmentedgp.models.sparse import SGPR, SVGP, VGP
from augmentedgp.variational.families import QPosterior
from augmentedgp.variational.schedules import RobbinsMonro

GAUSSIAN_FULL_MAX, GAUSSIAN_INDUCING = 2000, 500  # n_inducing="auto", Gaussian likelihood
VARIATIONAL_INDUCING = 100  # n_inducing="auto", other likelihoods
FULL_BATCH_MAX = 2000  # batch_size="auto": minibatches above this many points
AUTO_BATCH = 1000
SVI_EPOCHS, SVI_MIN_ITER, SVI_MAX_ITER = 30, 600, 5000
SVI_TOL = 1e-4  # relative change of the epoch-averaged objective
FINISH_ITER = 10  # full-batch iterations after the minibatches
FINISH_TOL = 1e-3  # their relative change below which the fit has converged
MARGINAL_ITER, FULL_BATCH_ITER, MINIBATCH_ITER = 200, 500, 2000  # budgets otherwise

Objective = Literal["augmented", "tight", "exact"]


def augmented_objective(likelihood: Likelihood, minibatch: bool) -> Objective:
    """AnalyticVI's objective for a plan: "tight" (the augmented fit, then tight sites) for
    the Student-t, Laplace and negative-binomial likelihoods and the full-batch
    logistic-softmax; "exact" for the logistic-softmax with minibatches; "augmented"
    otherwise (docs/performance.md, "The default training plan")."""
    if isinstance(likelihood, LogisticSoftmax):
        return "exact" if minibatch else "tight"
    return "tight" if isinstance(likelihood, StudentT | Laplace | NegativeBinomial) else "augmented"


class Choice(NamedTuple):
    """What a plan runs on n points: the model's size (``n_inducing`` None: the full
    model), the inference (None: type-II maximum likelihood), the iterations, the stopping
    rule's settings, and the full-batch iterations after a minibatch stage (``finish``, by
    ``finish_inference``)."""

    sparse: bool
    n_inducing: int | None
    inference: VariationalInference | None
    max_iter: int
    budget: bool  # True: max_iter is the plan's default budget, not the user's
    tol: float | None
    window: int | None
    finish: int
    finish_inference: VariationalInference | None


def _count_or(value, name: str, words: tuple[str, ...]):
    if isinstance(value, str):
        if value not in words:
            raise ValueError(f"{name} must be a positive integer, None or "
                             f"{' or '.join(map(repr, words))}, got {value!r}")
        return value
    return check_int(value, name, allow_none=True)


class Plan(eqx.Module):
    """The library's choice of model, inference and budget for a GP prior and likelihood
    on n points (module docstring); ``agp.fit(GP(kernel, likelihood), X, y, Plan())`` or,
    for a likelihood of several latent functions, ``VGP(kernel, likelihood)``.

    ``n_inducing``: "auto" (100 for non-Gaussian likelihoods; for a Gaussian one the exact
    GP up to 2000 points and 500 above), None (never sparse) or the threshold and number
    of inducing inputs. ``batch_size``: "auto", None (full batch) or a minibatch size (no
    full-batch finish). ``inference``: "auto" (augmented VI where the likelihood allows),
    "analytic" or "quadrature". ``fixed_hyperparameters``: keep the kernel and likelihood
    parameters (and inducing inputs) at their initial values and fit q(u) alone.
    ``fit``'s ``max_iter`` replaces the plan's budget, ``key`` seeds k-means and the
    minibatches, ``verbose`` shows progress; the other settings are the plan's.
    """

    n_inducing: int | None | str = eqx.field(static=True, default="auto")
    batch_size: int | None | str = eqx.field(static=True, default="auto")
    inference: str = eqx.field(static=True, default="auto")
    fixed_hyperparameters: bool = eqx.field(static=True, default=False)

    def __init__(self, n_inducing: int | None | str = "auto",
                 batch_size: int | None | str = "auto", inference: str = "auto",
                 fixed_hyperparameters: bool = False):
        self.n_inducing = _count_or(n_inducing, "n_inducing", ("auto",))
        self.batch_size = _count_or(batch_size, "batch_size", ("auto",))
        if not isinstance(inference, str) or inference not in ("auto", "analytic",
                                                                "quadrature"):
            raise ValueError("inference must be one of ['analytic', 'auto', 'quadrature'], "
                             f"got {inference!r}")
        self.inference = inference
        self.fixed_hyperparameters = bool(fixed_hyperparameters)

    def check(self, model) -> None:
        """A ValueError unless ``inference="analytic"`` meets an augmentable likelihood."""
        self._augmented(model.likelihood)

    def _augmented(self, likelihood: Likelihood) -> bool:
        augmented = self.inference != "quadrature" and isinstance(likelihood, Augmented)
        if self.inference == "analytic" and not augmented:
            raise ValueError(f"inference='analytic' needs an augmentable likelihood; "
                             f"{type(likelihood).__name__} is not (use 'auto' or 'quadrature')")
        return augmented

    def choose(self, likelihood: Likelihood, n: int, max_iter: int | None = None) -> Choice:
        """The model size, inference and budget for ``n`` points (``max_iter``: the user's
        iterations, None for the plan's)."""
        gaussian = isinstance(likelihood, Gaussian)
        augmented = self._augmented(likelihood)
        if self.n_inducing == "auto":
            M = (GAUSSIAN_INDUCING if n > GAUSSIAN_FULL_MAX else None) if gaussian \
                else VARIATIONAL_INDUCING
        else:
            M = self.n_inducing
        # an explicit batch_size below n means minibatches, which need the sparse model
        # (with n <= M inducing points at the unique inputs it is the full one)
        minibatch = not gaussian and isinstance(self.batch_size, int) and self.batch_size < n
        sparse = (M is not None and n > M) or minibatch
        if gaussian:
            return Choice(sparse, M, None, max_iter or MARGINAL_ITER, max_iter is None, None,
                          None, 0, None)
        tol = window = None
        finish = 0
        if self.batch_size == "auto" and sparse and n > FULL_BATCH_MAX:
            batch = AUTO_BATCH
            epoch = -(-n // AUTO_BATCH)
            iters = max_iter or int(np.clip(SVI_EPOCHS * epoch, SVI_MIN_ITER, SVI_MAX_ITER))
            # an epoch's minibatches sum over every point once: their mean over an epoch is
            # the full objective, without the minibatch noise of a shorter window
            tol, window, finish = SVI_TOL, max(epoch, 20), FINISH_ITER
        elif self.batch_size in ("auto", None) or self.batch_size >= n:
            batch, iters = None, max_iter or FULL_BATCH_ITER
        else:
            batch, iters = self.batch_size, max_iter or MINIBATCH_ITER
        if augmented:
            objective = augmented_objective(likelihood, batch is not None)
            # Robbins-Monro steps, not AnalyticSVI's constant default: the plan stops on the
            # settled objective, and with the constant step the tight stage stopped early
            full = AnalyticVI(objective=objective)
            inference = (full if batch is None else
                         AnalyticSVI(batch, step_size=RobbinsMonro(), objective=objective))
        else:
            full = QuadratureVI(quadrature_step(likelihood))
            inference = full if batch is None else QuadratureSVI(batch)
        # the full-batch finish runs the last stage of the fit (the tight sites of "tight")
        finishing = stages(full, likelihood, finish)[-1][0] if finish else None
        return Choice(sparse, M, inference, iters, max_iter is None, tol, window, finish,
                      finishing)

    def model(self, spec: GP | VGP, X: np.ndarray, key, choice: Choice):
        """The model ``choice`` describes, with the prior and likelihood of ``spec``: GP or
        SGPR (Gaussian likelihood), VGP or SVGP (k-means inducing inputs of X, or its
        unique rows when there are at most M)."""
        kernel, mean, likelihood = _prior(spec)
        gaussian = choice.inference is None
        if choice.sparse:
            unique = np.unique(X, axis=0)
            M = choice.n_inducing
            Z = unique if M is None or len(unique) <= M else inducing.kmeans(X, M, key)
            model = (SGPR(kernel, Z, likelihood=likelihood, mean=mean) if gaussian else
                     SVGP(kernel, likelihood, Z, mean=mean, q=self._q(likelihood)))
        else:
            model = (GP(kernel, likelihood, mean=mean) if gaussian else
                     VGP(kernel, likelihood, mean=mean, q=self._q(likelihood)))
        return _fixed(model) if self.fixed_hyperparameters else model

    def _q(self, likelihood: Likelihood) -> str:
        return "natural_whitened" if self._augmented(likelihood) else "whitened"


def _prior(spec: GP | VGP):
    """(kernel, mean, likelihood) of a GP or unbound VGP, with per-latent kernels and means
    as lists (a VGP stores them stacked)."""
    if not isinstance(spec, GP | VGP):
        raise ValueError(f"Plan trains a GP or VGP (its prior and likelihood), got "
                         f"{type(spec).__name__}")
    kernel, mean = spec.kernel, spec.mean
    C = getattr(spec.likelihood, "num_latent", 1)
    unstack = lambda m: [jax.tree_util.tree_map(lambda x, c=c: x[c], m) for c in range(C)]
    if getattr(spec, "latent_kernels", False):
        kernel = unstack(kernel)
    if getattr(spec, "latent_means", False):
        mean = unstack(mean)
    return kernel, mean, spec.likelihood


def _fixed(model):
    """``model`` with every hyperparameter (and inducing input) fixed; q(u) is still fitted."""
    skip = lambda x: is_parameter(x) or isinstance(x, QPosterior)
    return jax.tree_util.tree_map(lambda p: fixed(p) if is_parameter(p) else p, model,
                                  is_leaf=skip)


__all__ = ["Choice", "Plan", "augmented_objective"]
