"""Variational inference settings for SVGP and VGP: Gauss-Hermite expectations (QuadratureVI,
QuadratureSVI) or the likelihood's augmentation in closed form (AnalyticVI, AnalyticSVI).
Each gives the data term of the bound and the Gaussian sites (beta, gamma) that the one
natural-gradient step consumes.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, Shaped

from augmentedgp.augmentation.protocol import Augmented
from augmentedgp.core.errors import user_stacklevel
from augmentedgp.core.validation import check_int
from augmentedgp.likelihoods import augmentable
from augmentedgp.likelihoods.base import Likelihood, MultiLatent
from augmentedgp.models.sparse import SVGP, VGP
from augmentedgp.variational.natgrad import quadrature_sites
from augmentedgp.variational.schedules import Schedule, as_schedule


class VariationalInference(eqx.Module):
    """What the SVGP / VGP training step needs from an inference method: the data term of
    the bound (``expectations``), the Gaussian sites of the natural step (``sites``), the
    step size schedule and the minibatch size (None: full batch)."""

    step_size: Schedule
    natural: bool = eqx.field(static=True, default=True)
    batch_size: int | None = eqx.field(static=True, default=None)
    psd_sites = False  # True where every site precision gamma is >= 0 by construction

    def check(self, model: SVGP) -> None:
        if not isinstance(model, SVGP):
            raise ValueError(f"{type(self).__name__} is for SVGP and VGP models, got "
                             f"{type(model).__name__}")
        if self.batch_size is not None and isinstance(model, VGP):
            full = type(self).__name__.replace("SVI", "VI")
            raise ValueError(f"VGP is full batch: use {full}, or SVGP for minibatches")

    def _set_batch_size(self, batch_size):
        self.batch_size = check_int(batch_size, "batch_size")


def _check_natural(natural) -> bool:
    if not isinstance(natural, bool | np.bool_):
        raise TypeError(f"natural must be True or False, got {type(natural).__name__} "
                        f"{natural!r}")
    return bool(natural)


class QuadratureVI(VariationalInference):
    """Variational inference for SVGP and VGP on the full batch, with one-dimensional
    numerical expectations of log p(y|f): each likelihood's ``variational_expectations`` at
    its default accuracy (Gauss-Hermite, 20 nodes for most; 64 for the negative binomial,
    Gamma and Beta; a 256-node trapezoid rule in log w for the Student-t), or with
    ``n_points`` nodes.

    With ``natural=True`` (default) each iteration takes an Adam step on the
    hyperparameters and inducing inputs, then a natural-gradient step of size
    ``step_size`` (a float in (0, 1] or a schedule) on q(u) ([Salimbeni2018];
    [Kobe2021, Sec. 4.1.1]);
    with ``natural=False`` the optimizer moves q(u) too ("Adam optimisation").
    """

    n_points: int | None = eqx.field(static=True, default=None)

    def __init__(self, step_size=1.0, *, natural: bool = True, n_points: int | None = None):
        self.step_size, self.natural = as_schedule(step_size), _check_natural(natural)
        self.n_points = check_int(n_points, "n_points", allow_none=True)
        self.batch_size = None

    def expectations(self, likelihood: Likelihood, y: Shaped[Array, " n"],
                     mean: Float[Array, " n *C"], var: Float[Array, " n *C"],
                     key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """E_q[log p(y_i | f_i)] at the marginals of q(f) (``key`` seeds Monte Carlo
        likelihoods such as the softmax)."""
        return likelihood.variational_expectations(y, mean, var, self.n_points, key)

    def sites(self, likelihood: Likelihood, y: Shaped[Array, " n"],
              mean: Float[Array, " n *C"], var: Float[Array, " n *C"],
              prior_mean: Float[Array, " n *C"], key: PRNGKeyArray | None = None
              ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"]]:
        """Gaussian sites (beta, gamma) of the data at the current marginals of q(f)."""
        return quadrature_sites(likelihood, y, mean, var, prior_mean, self.n_points, key)


class QuadratureSVI(QuadratureVI):
    """Stochastic QuadratureVI on minibatches of ``batch_size`` points (epochs of shuffled
    batches), the data term scaled by n / |B| (Hensman et al. 2013). The natural-gradient
    step size defaults to 0.1; pass a schedule (``RobbinsMonro``, ``Warmup``) to decay it."""

    def __init__(self, batch_size: int, step_size=0.1, *, natural: bool = True,
                 n_points: int | None = None):
        super().__init__(step_size, natural=natural, n_points=n_points)
        self._set_batch_size(batch_size)


OBJECTIVES = ("augmented", "exact", "tight")
# The mean augmentation gap per training point (nats) above which a fit on the augmented
# objective warns. Measured on the reduced real problems of tests/test_analytic_vi.py and on
# letter / digits (benchmarks/RESULTS.md): the test NLL that hyperparameters learned on the
# augmented bound lose against the plain ELBO is about the mean gap per point (0.007 / 0.008
# on a9a, 0.028 / 0.023 Laplace, 0.12 / 0.19 logistic-Poisson, 0.18 / 0.13 letter, 0.26 /
# 0.30 digits).
GAP_WARNING = 0.05
# ... checked only after a fit of at least GAP_MIN_ITER iterations: before, the gap measures
# the start (a Student-t fit of 20 points: 0.26 nats per point after 3 iterations, 0.026
# after 500), not the bound the hyperparameters were learned on.
GAP_MIN_ITER = 100


class AnalyticVI(VariationalInference):
    """Augmented conjugate variational inference ([Wenzel2019];
    [Galy-Fajou2020, Algorithm 1]) for SVGP and VGP on the full batch.

    The likelihood is augmented (:mod:`augmentedgp.augmentation`) and q(f, w) = q(f) q(w).
    Each iteration sets every q(w_i) to its optimum given q(f) (local step), then moves the
    natural parameters of q(u) a step ``step_size`` towards their optimum given q(w) --
    step 1 is the CAVI update -- and takes an Adam step on the hyperparameters (kernel,
    inducing inputs, likelihood parameters).

    ``objective`` is the bound those hyperparameter steps climb (and the history records):
    ``"augmented"`` (default) the augmented bound at the optimal q(w), every expectation in
    closed form ([Galy-Fajou2020, Algorithm 1]); ``"exact"`` the plain ELBO, E_q[log p(y | f)]
    by the likelihood's ``variational_expectations`` at its default accuracy (``n_points``:
    its node count instead; Monte Carlo for the multi-class terms). The augmented bound's
    Jensen gap E_q[log phi(h^2)] - log phi(E_q[h^2]) ([Galy-Fajou2020, App. A.4.3])
    penalises latent variance, so hyperparameters learned on it shrink the kernel (on 3,000
    rows of letter, 5 classes, the logistic-softmax's test NLL after GPClassifier's default
    budget is 0.125 on it, 0.056 with ``"exact"``). q(u) takes the same closed-form augmented
    steps either way, so ``"exact"`` is a mixed scheme, not the ascent of one objective: q(u)
    is optimal for the augmented bound, the hyperparameters climb the plain ELBO at that q,
    whose gap term rewards latent variance that q(u) never pays for. It is better in short
    fits and then drifts: on the same rows with batch 200 the NLL was 0.057 after 2,000
    steps and 0.097 after 6,000, the kernel variance then 668 (the augmented objective:
    0.118, variance 33); QuadratureVI, at the plain ELBO's optimum, kept it at 5 over
    2,000 full-batch steps on 1,000 of those rows. Hence not the default.

    ``"tight"``: the plain ELBO at its optimum, reached from the augmented one. The first
    half of ``max_iter`` (or until it converges) is the ``"augmented"`` fit; the rest
    continues from it with the tight Gaussian sites of QuadratureVI / QuadratureSVI
    (derivatives of E_q[log p(y | f)]; :func:`tight_stage`), the hyperparameters on the
    ELBO. Its fixed point is QuadratureVI's, so it removes the augmentation gap from q(u)
    and from the hyperparameters alike; the closed-form steps take it there from the prior
    (where tight steps of size 1 can diverge: the Laplace likelihood) and most of the way
    at a lower cost per step.
    """

    psd_sites = True  # gamma = 2 E[w] b^2 >= 0
    objective: str = eqx.field(static=True, default="augmented")
    n_points: int | None = eqx.field(static=True, default=None)

    def __init__(self, step_size=1.0, *, objective: str = "augmented",
                 n_points: int | None = None):
        self.step_size = as_schedule(step_size)
        self._set_objective(objective, n_points)

    def _set_objective(self, objective, n_points):
        if not isinstance(objective, str) or objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.n_points = check_int(n_points, "n_points", allow_none=True)

    def check(self, model: SVGP) -> None:
        super().check(model)
        if not isinstance(model.likelihood, Augmented):
            names = ", ".join(c.__name__ for c in augmentable())
            raise ValueError(f"{type(self).__name__} needs an augmentable likelihood ({names}); "
                             f"use QuadratureVI for {type(model.likelihood).__name__}")

    def expectations(self, likelihood: Likelihood, y: Shaped[Array, " n"],
                     mean: Float[Array, " n *C"], var: Float[Array, " n *C"],
                     key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """The data term of the hyperparameter objective: the augmented one at the optimal
        q(w) (closed form: no key needed), or E_q[log p(y_i | f_i)] (``objective="exact"``;
        ``key`` seeds Monte Carlo terms)."""
        if self.objective == "exact":
            return likelihood.variational_expectations(y, mean, var, self.n_points, key)
        return likelihood.augmented_expectations(y, mean, var)

    def sites(self, likelihood: Likelihood, y: Shaped[Array, " n"],
              mean: Float[Array, " n *C"], var: Float[Array, " n *C"],
              prior_mean: Float[Array, " n *C"], key: PRNGKeyArray | None = None
              ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"]]:
        """E_{q(w)} of the augmented sites, q(w) optimal given the marginals of q(f); beta
        is shifted to the latent g = f - prior_mean that the natural step works on."""
        beta, gamma = likelihood.aux_sites(y, likelihood.aux_posterior(y, mean, var))
        return beta - gamma * prior_mean, gamma


def quadrature_step(likelihood: Likelihood) -> float:
    """QuadratureVI's full-batch natural step where the library chooses it (the estimators,
    the tight stage): 1 (Newton-like) for one latent function with a log-concave
    likelihood; 0.5 for several (the softmax's sites overshoot at 1: on 1,000 rows of
    letter, 5 classes, M = 100, 500 steps, the objective oscillated between 318 and 418 and
    the test NLL was 0.216; 0.122 with step 0.5, 0.120 with 0.2); 0.2 where log p(y | f) is
    not flagged log-concave (the Student-t's sites turn negative, the Laplace's curvature
    sits at a kink: GPRegressor on 2,000 protein rows with 5% outliers, 500 steps, reached
    test NLL 1.40 / 1.24 / 1.18 (Student-t) and 3.14 / 1.190 / 1.191 (Laplace, whose
    objective oscillated at 1) with steps 1 / 0.5 / 0.2; on a9a and bike counts 1 and 0.5
    were level)."""
    if isinstance(likelihood, MultiLatent):
        return 0.5
    return 1.0 if likelihood.log_concave else 0.2


def tight_stage(inference: AnalyticVI, likelihood: Likelihood) -> QuadratureVI:
    """The tight counterpart of an augmented inference (``objective="tight"``'s second
    stage): QuadratureSVI with its default step 0.1 on the same minibatches, or QuadratureVI
    with :func:`quadrature_step`; the same ``n_points``."""
    if inference.batch_size is not None:
        return QuadratureSVI(inference.batch_size, n_points=inference.n_points)
    return QuadratureVI(quadrature_step(likelihood), n_points=inference.n_points)


def stages(inference: VariationalInference, likelihood: Likelihood, max_iter: int
           ) -> list[tuple[VariationalInference, int]]:
    """The fits (inference, iterations) that one fit of ``max_iter`` iterations runs in
    turn, each from where the one before stopped: ``inference`` alone, or for
    ``objective="tight"`` the augmented fit for half of them and :func:`tight_stage` for
    the rest (the second stage's count is an upper bound: it gets what the first left)."""
    if not (isinstance(inference, AnalyticVI) and inference.objective == "tight"):
        return [(inference, max_iter)]
    first = (max_iter + 1) // 2
    augmented = (AnalyticVI(inference.step_size, n_points=inference.n_points)
                 if inference.batch_size is None else
                 AnalyticSVI(inference.batch_size, inference.step_size,
                             n_points=inference.n_points))
    return [(augmented, first), (tight_stage(inference, likelihood), max_iter - first)]


def warn_if_loose(inference, posterior) -> None:
    """After a fit of ``posterior`` with ``inference``: a UserWarning naming the remedies
    when the hyperparameters were learned on the augmented bound and its mean gap per
    training point (``posterior.augmentation_gap() / n``) exceeds GAP_WARNING nats after
    at least GAP_MIN_ITER iterations."""
    if not (isinstance(inference, AnalyticVI) and inference.objective == "augmented"
            and posterior.history.n_iter >= GAP_MIN_ITER):
        return
    n = posterior.y.shape[0]
    gap = posterior.augmentation_gap() / n
    if gap > GAP_WARNING:
        warnings.warn(f"the augmented bound lies {gap:.3f} nats per point below the ELBO "
                      "(augmentation_gap()): hyperparameters learned on it may lose about as "
                      "much test NLL per point; QuadratureVI / QuadratureSVI (estimators: "
                      "inference=\"quadrature\") and AnalyticVI / AnalyticSVI("
                      "objective=\"tight\") fit q(u) and the hyperparameters on the ELBO",
                      UserWarning, stacklevel=user_stacklevel())


class AnalyticSVI(AnalyticVI):
    """Stochastic AnalyticVI ([Wenzel2019, Sec. 4.3, eq. 12]; [Galy-Fajou2020, Algorithm 3]):
    minibatches of ``batch_size`` points, the data term and the sites scaled by n / |B|,
    natural parameters interpolated with step ``step_size`` as in [Wenzel2019, eq. 12] (the
    printed [Galy-Fajou2020, Algorithm 3] omits the scaling and interpolates the mean and
    covariance instead). The step defaults to 0.1, as QuadratureSVI's; the papers' decaying
    Robbins-Monro (t + 1)^-0.51 (``schedules.RobbinsMonro()``) shrinks too fast for the
    counts and the Laplace likelihood: within the X-GPC benchmark's budgets the constant step
    brought 11 of its 12 problems within 0.5% of QuadratureSVI's test NLL, against 9 with
    Robbins-Monro (benchmarks/RESULTS.md, "XGPC: augmented SVI vs GPflow / GPyTorch")."""

    def __init__(self, batch_size: int, step_size=0.1, *, objective: str = "augmented",
                 n_points: int | None = None):
        super().__init__(step_size, objective=objective, n_points=n_points)
        self._set_batch_size(batch_size)
