"""Inducing-point GP models: the collapsed ones (SGPR, DTC, FITC, TaylorSGPR), SVGP and VGP.

SVGP ([Hensman2013], [Hensman2015]) keeps q(u) explicit; its bound on a minibatch B of n
points is  (n / |B|) sum_{i in B} E_{q(f_i)}[log p(y_i | f_i)] - KL(q(u) || p(u))
(the minibatch estimate of [Hensman2013]). VGP is the non-sparse case Z = X ([Opper2009]).

The collapsed models (base class ``CollapsedSparseGP``) integrate u out. ``SGPR`` is
Titsias' bound for a Gaussian likelihood ([Titsias2009]):

    F = log N(y | m, Q + s2 I) - tr(K - Q) / (2 s2),    Q = Knm Kmm^-1 Kmn,

``DTC`` drops the trace term ([Seeger2003]) and ``FITC`` replaces s2 I by
s2 I + diag(K - Q) ([Snelson2006]; both names are [Quinonero-Candela2005]'s). All give
q(u) in closed form: each writes its data term as Gaussian sites (beta, gamma) --
pseudo-targets beta / gamma with noise 1 / gamma -- and ``collapse`` integrates u out
(precision of v = Lmm^-1 u: I + A Gamma A^T, theta1 = A (beta - gamma m)). With an
augmentable likelihood SGPR collapses the augmented bound given q(w) the same way (the
Gaussian is the case w = 1). ``TaylorSGPR`` collapses the second-order Taylor expansion of
log p(y_i | f_i) at points xi_i instead (a Laplace-type approximation, [Rasmussen2006]
Sec. 3.4, collapsed as [Izmailov2016] collapse the Jaakkola-Jordan bound): Gaussian sites
again, but an approximate objective, not a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Shaped

from augmentedgp.augmentation.protocol import Augmented
from augmentedgp.core import linalg
from augmentedgp.core.params import Parameter, fixed, real
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import check_X
from augmentedgp.kernels.covariance import Kernel
from augmentedgp.kernels.means import Mean, Zero
from augmentedgp.likelihoods import augmentable
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.robust import Gaussian
from augmentedgp.models.sites import FittedPosterior, Predictive
from augmentedgp.variational.families import NaturalQ, QPosterior, make_q, map_latents

_LOG_2PI = math.log(2.0 * math.pi)


def inducing_parameter(Z: Float[ArrayLike, "M d"] | Parameter) -> Parameter:
    if isinstance(Z, Parameter):
        arr = np.asarray(Z.value)
    else:
        arr = check_X(Z, "inducing")
    if arr.ndim != 2:
        raise ValueError(f"inducing must be 2-D of shape (M, d), got shape {arr.shape}")
    if np.unique(arr, axis=0).shape[0] < arr.shape[0]:
        raise ValueError("inducing has repeated rows; inducing points must be distinct "
                         "(use augmentedgp.inducing to choose them)")
    return Z if isinstance(Z, Parameter) else real(arr, "inducing")


def _check_kernel_likelihood(kernel, likelihood):
    if not isinstance(likelihood, Likelihood):
        raise ValueError(f"likelihood must be an augmentedgp likelihood, got {likelihood!r}")
    kernels = kernel if isinstance(kernel, list | tuple) else [kernel]
    for k in kernels:
        if not isinstance(k, Kernel):
            raise ValueError(f"kernel must be an augmentedgp kernel, got {type(k).__name__}")


def _stack(items, what: str, num_latent: int):
    """One module whose leaves lead with the latent axis, from one module per latent."""
    items = list(items)
    if num_latent == 1:
        raise ValueError(f"a list of {what}s is for likelihoods with several latent functions")
    if len(items) != num_latent:
        raise ValueError(f"give one {what} per latent function ({num_latent}), got {len(items)}")
    if len({jax.tree_util.tree_structure(x) for x in items}) != 1:
        raise ValueError(f"the per-latent {what}s must have the same type and settings "
                         "(trainable / fixed, priors) so that they can be stacked")
    try:
        return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *items)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the per-latent {what}s must have parameters of equal shapes: {err}") \
            from None


def latent_prior(kernel, likelihood, mean):
    """(kernel, mean, latent_kernels, latent_means) of a model with ``likelihood``: one kernel
    (mean) shared by the latent functions, or a list of one per latent stacked into one
    module whose leaves lead with the latent axis."""
    _check_kernel_likelihood(kernel, likelihood)
    C = getattr(likelihood, "num_latent", 1)
    latent_kernels, latent_means = isinstance(kernel, list | tuple), isinstance(mean, list | tuple)
    kernel = _stack(kernel, "kernel", C) if latent_kernels else kernel
    mean = _stack(mean, "mean", C) if latent_means else Zero() if mean is None else mean
    return kernel, mean, latent_kernels, latent_means


class Projection(NamedTuple):
    """Everything the bound and the natural-gradient step need at the points X. With C
    latent functions every field leads with the latent axis, except prior_mean, mean and
    var, which are (n, C) (var is (C, n, n) with full_cov)."""

    Kmm: jax.Array
    Lmm: jax.Array
    Kmn: jax.Array
    A: jax.Array  # Lmm^-1 Kmn
    kdiag: jax.Array
    prior_mean: jax.Array  # mean(X)
    mean: jax.Array  # E_q[f(X)]
    var: jax.Array  # V_q[f(X)]


@eqx.filter_jit
def _prior_cholesky(kernel, Z):
    """cholesky(K(Z, Z)) as one compiled program (eager ops would compile one by one)."""
    return linalg.cholesky(kernel(Z))


class SVGP(Predictive):
    """Sparse variational GP: f ~ GP(mean, kernel), y_i ~ likelihood(f(x_i)), q(u) at Z.

    ``inducing``: (M, d) array (trained by default) or a Parameter (``params.fixed`` to
    freeze it). ``q``: "whitened" (default), "cholesky", "natural", "natural_whitened",
    "site" or a :class:`~augmentedgp.variational.QPosterior`; it starts at the prior.

    A likelihood with C > 1 latent functions (multi-class, heteroscedastic) gets C
    independent GPs with shared inducing inputs and one q(u^c) each, stored stacked (every
    q leaf leads with the latent axis) and mapped over (``variational.map_latents``).
    ``kernel`` (and ``mean``) is then one module shared by all latents or a list of C
    modules of one type, stacked likewise; predictions are (n, C).
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean
    inducing: Parameter | None
    q: QPosterior | None
    latent_kernels: bool = eqx.field(static=True, default=False)
    latent_means: bool = eqx.field(static=True, default=False)

    def __init__(self, kernel: Kernel | Sequence[Kernel], likelihood: Likelihood,
                 inducing: Float[ArrayLike, "M d"] | Parameter, *,
                 mean: Mean | Sequence[Mean] | None = None, q: str | QPosterior = "whitened"):
        self.kernel, self.mean, self.latent_kernels, self.latent_means = latent_prior(
            kernel, likelihood, mean)
        self.likelihood = likelihood
        self.inducing = inducing_parameter(inducing)
        self.q = self._initial_q(q, jnp.asarray(self.inducing.value))

    def _initial_q(self, kind, Z):
        """q at the prior (one per latent), or the given QPosterior after a shape check.
        Only the unwhitened families need the factor of Kmm; a whitened q(v) starts at
        N(0, I), whose factor is the identity (and nothing is factorised or compiled)."""
        unwhitened = isinstance(kind, str) and kind in ("cholesky", "natural")
        make = lambda k: make_q(kind, _prior_cholesky(k, Z) if unwhitened
                                else np.eye(Z.shape[0], dtype=Z.dtype))
        C = self.num_latent
        if C == 1:
            return make(self.kernel)
        if isinstance(kind, QPosterior):
            lead = {leaf.shape[0] for leaf in jax.tree_util.tree_leaves(kind)}
            if lead != {C}:
                raise ValueError(f"q for {C} latent functions must have leaves leading with "
                                 f"the latent axis of size {C}")
            return kind
        if self.latent_kernels:  # construction only (parameter constructors are numpy)
            kernels = [jax.tree_util.tree_map(lambda x, c=c: x[c], self.kernel) for c in range(C)]
            return _stack([make(k) for k in kernels], "q", C)
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (C, *x.shape)),
                                      make(self.kernel))

    @property
    def num_latent(self) -> int:
        """The number of latent functions C."""
        return getattr(self.likelihood, "num_latent", 1)

    def _per_latent(self, prior_fn, posterior_fn):
        """posterior_fn(q, prior_fn(kernel, mean)) for each latent function; the prior part
        is computed once when the kernel and mean are shared (``map_latents``)."""
        if self.num_latent == 1:
            return posterior_fn(self.q, prior_fn(self.kernel, self.mean))
        if self.latent_kernels or self.latent_means:
            prior = map_latents(prior_fn, (self.kernel, self.mean),
                                (self.latent_kernels, self.latent_means))
            return map_latents(posterior_fn, (self.q, prior), (True, True))
        return map_latents(posterior_fn, (self.q, prior_fn(self.kernel, self.mean)),
                           (True, False))

    # --- the bound ------------------------------------------------------------------------

    def project(self, X: Float[Array, "n d"], full_cov: bool = False) -> Projection:
        return self._project(X, full_cov)[0]

    def _project(self, X, full_cov: bool = False, kl: bool = False):
        """(Projection at X, KL(q(u) || p(u)) if ``kl`` else None)."""
        Z = self.inducing.value

        def prior(kernel, mean):
            Kmm = kernel(Z)
            Kmn = kernel(Z, X)
            Lmm, A = linalg.cholesky_project(Kmm, Kmn)
            return Kmm, Lmm, Kmn, A, kernel.diag(X), kernel(X) if full_cov else None, mean(X)

        def posterior(q, prior):
            Kmm, Lmm, Kmn, A, kdiag, Kxx, m0 = prior
            if kl:
                mean_g, var, kl_value = q.conditional_kl(Kmm, Lmm, Kmn, A, kdiag)
            else:
                (mean_g, var), kl_value = q.conditional(Kmm, Lmm, Kmn, A, kdiag, Kxx,
                                                        full_cov), jnp.zeros(())
            return Projection(Kmm, Lmm, Kmn, A, kdiag, m0, m0 + mean_g, var), kl_value

        p, kl_value = self._per_latent(prior, posterior)
        if self.num_latent > 1:
            p = p._replace(prior_mean=p.prior_mean.T, mean=p.mean.T,
                           var=p.var if full_cov else p.var.T)
            kl_value = jnp.sum(kl_value)
        return p, (kl_value if kl else None)

    def prior_factors(self):
        """(Kmm, its jittered Cholesky factor) at the inducing inputs, leading with the latent
        axis when there are several latent functions."""
        Z = self.inducing.value

        def prior(kernel, mean):
            Kmm = kernel(Z)
            return Kmm, linalg.cholesky(Kmm)

        return self._per_latent(prior, lambda q, p: p)

    def prior_kl(self) -> Float[Array, ""]:
        """KL(q(u) || p(u)) (summed over the latent functions)."""
        self.input_dim()
        Z = self.inducing.value

        def prior(kernel, mean):
            Kmm = kernel(Z)
            return Kmm, linalg.cholesky(Kmm)

        return jnp.sum(self._per_latent(prior, lambda q, p: q.kl(*p)))

    def _elbo(self, X, y, scale=1.0, augmented: bool = False):
        expectations = (self.likelihood.augmented_expectations if augmented
                        else self.likelihood.variational_expectations)
        return self.elbo_projection(X, y, scale, expectations)[0]

    def elbo_projection(self, X, y, scale, expectations):
        """(ELBO with the data term ``expectations(y, mean, var)`` scaled by ``scale``, the
        projection at X)."""
        p, kl = self._project(X, kl=True)
        return scale * jnp.sum(expectations(y, p.mean, p.var)) - kl, p

    def input_dim(self) -> int:
        """The number of input columns d (of the inducing inputs)."""
        if self.inducing is None:
            raise ValueError("this VGP is not bound to data yet: use augmentedgp.fit(model, X, "
                             "y) or model.bind(X)")
        return self.inducing.value.shape[1]

    def validate_data(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], name: str = "X"
                      ) -> tuple[Float[Array, "n d"], Shaped[Array, " n"]]:
        """(X, y) checked at the public boundary and as JAX arrays (a clear ValueError
        otherwise)."""
        X = check_X(X, name, d=self.input_dim())
        y = self.likelihood.targets(y, X.shape[0], "y" if name == "X" else "ynew")
        return jnp.asarray(X), jnp.asarray(y)

    def elbo(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
             num_data: int | None = None, augmented: bool = False) -> float:
        """The evidence lower bound on (X, y); with ``num_data`` the minibatch estimate
        (num_data / len(X)) sum E[log p] - KL of the bound on num_data points. With
        ``augmented=True`` the bound of the augmented model at the optimal q(w) (what
        AnalyticVI maximises; never above the plain bound)."""
        _check_augmented(self.likelihood, augmented)
        X, y = self.validate_data(X, y)
        scale = 1.0 if num_data is None else num_data / X.shape[0]
        return float(_elbo_jit(self, X, y, jnp.asarray(scale), augmented))

    # --- predictions ----------------------------------------------------------------------

    def _check_new(self, Xnew):
        return jnp.asarray(check_X(Xnew, "Xnew", d=self.input_dim()))

    @limits
    def predict_f(self, Xnew: Float[ArrayLike, "n d"], full_cov: bool = False
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"] | Float[Array, "*C n n"]]:
        """Latent mean (n*,) and variance (n*,), or covariance (n*, n*) with full_cov;
        with C latent functions (n*, C) and (n*, C), or (C, n*, n*)."""
        return _predict_f(self, self._check_new(Xnew), full_cov)

    def _moments(self, Xnew, full_cov: bool = False):
        """predict_f without validation (traceable)."""
        return _predict_f(self, Xnew, full_cov)

    @property
    def num_inducing(self) -> int:
        self.input_dim()
        return int(self.inducing.value.shape[0])


class VGP(SVGP):
    """Full (non-sparse) variational GP: q(f(X)) = N(m, S) at the n training inputs
    (Opper & Archambeau 2009), any likelihood. ``fit`` binds it to X (Z = X, fixed)."""

    q_kind: str = eqx.field(static=True, default="whitened")

    def __init__(self, kernel: Kernel | Sequence[Kernel], likelihood: Likelihood, *,
                 mean: Mean | Sequence[Mean] | None = None, q: str = "whitened"):
        self.kernel, self.mean, self.latent_kernels, self.latent_means = latent_prior(
            kernel, likelihood, mean)
        self.likelihood = likelihood
        make_q(q, jnp.eye(1))  # validates the kind
        self.inducing, self.q, self.q_kind = None, None, q

    def bind(self, X: Float[ArrayLike, "n d"]) -> VGP:
        """This model with its latent values at the rows of X (q at the prior), unless it
        is already bound to X."""
        X = check_X(X)
        if self.inducing is not None and np.array_equal(np.asarray(self.inducing.value), X):
            return self
        return eqx.tree_at(lambda m: (m.inducing, m.q), self,
                           (fixed(real(X, "inducing")), self._initial_q(self.q_kind,
                                                                        jnp.asarray(X))),
                           is_leaf=lambda x: x is None)


# --- collapsed sparse GPs: SGPR, DTC, FITC, TaylorSGPR -----------------------------------


def _lowrank_terms(r, A, d):
    """(log N(r | 0, A^T A + diag(d)), L_B, c) with B = I + A D^-1 A^T and
    c = L_B^-1 A D^-1 r, in O(n M^2) (matrix determinant lemma and Woodbury)."""
    Ad = A / jnp.sqrt(d)
    LB = linalg.cholesky(jnp.eye(A.shape[0], dtype=A.dtype) + Ad @ Ad.T)
    c = linalg.solve_lower(LB, A @ (r / d))
    quad = jnp.sum(r**2 / d) - jnp.sum(c**2)
    logdet = linalg.logdet_chol(LB) + jnp.sum(jnp.log(d))
    return -0.5 * (r.shape[0] * _LOG_2PI + logdet + quad), LB, c


class CollapsedTerms(NamedTuple):
    """The collapsed objective at X given the sites and the pieces of its optimal q(u)
    (whitened, v = Lmm^-1 u: precision P = I + A Gamma A^T, P E[v] = theta1)."""

    bound: jax.Array
    A: jax.Array  # Lmm^-1 Kmn
    P: jax.Array  # I + A Gamma A^T
    LP: jax.Array  # cholesky(P)
    theta1: jax.Array  # A (beta - gamma * prior_mean)
    c: jax.Array  # LP^-1 theta1
    residual_var: jax.Array  # diag(K - Q)
    prior_mean: jax.Array  # mean(X)


class Sites(NamedTuple):
    """The data term as a quadratic in f: sum_i e0_i + r_i g_i - gamma_i g_i^2 / 2, with
    g = f - prior_mean and r = beta - gamma prior_mean: Gaussian sites, pseudo-targets
    beta / gamma with noise variance 1 / gamma."""

    beta: jax.Array
    gamma: jax.Array
    e0: jax.Array  # the data term at f = prior_mean


class TaylorPoint(NamedTuple):
    """The state of :class:`TaylorSGPR`: the points xi (n,) at which log p(y_i | f_i) is
    expanded to second order."""

    xi: jax.Array


def collapse(A: Float[Array, "M n"], prior_mean: Float[Array, " n"],
             residual_var: Float[Array, " n"], sites: Sites, trace: bool = True
             ) -> CollapsedTerms:
    """Gaussian sites with u integrated out ([Titsias2009]; traceable): with
    A = Lmm^-1 Kmn, P = I + A Gamma A^T and theta1 = A r,

        F = sum e0 + 1/2 theta1^T P^-1 theta1 - 1/2 log|P| - 1/2 sum gamma diag(K - Q),

    the log marginal likelihood of the sites under the DTC prior (Q = Knm Kmm^-1 Kmn) less
    Titsias' trace term, which ``trace=False`` drops ([Quinonero-Candela2005])."""
    beta, gamma, e0 = sites
    theta1 = A @ (beta - gamma * prior_mean)
    P = jnp.eye(A.shape[0], dtype=A.dtype) + (A * gamma) @ A.T
    LP = linalg.cholesky(P)
    c = linalg.solve_lower(LP, theta1)
    bound = jnp.sum(e0) + 0.5 * jnp.sum(c**2) - 0.5 * linalg.logdet_chol(LP)
    if trace:
        bound = bound - 0.5 * jnp.sum(gamma * residual_var)  # the trace term of [Titsias2009]
    return CollapsedTerms(bound, A, P, LP, theta1, c, residual_var, prior_mean)


# The model classes that replaced SGPR's ``method`` argument (and its saved field).
_MODEL_OF_METHOD = {"vfe": "SGPR", "dtc": "DTC", "fitc": "FITC", "taylor": "TaylorSGPR"}


def _reject_removed(cls, removed: dict):
    """A TypeError for keyword arguments the constructor does not take, naming the class to
    use for the removed ``method``."""
    if not removed:
        return
    if "method" not in removed:
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                        f"{next(iter(removed))!r}")
    method = removed["method"]
    new = _MODEL_OF_METHOD.get(method.lower()) if isinstance(method, str) else None
    if new == cls.__name__:
        hint = f"drop it: {new} is that model"
    elif new is not None:
        hint = f"use augmentedgp.{new}(kernel, inducing, ...) instead"
    else:
        hint = ("choose the model's class: augmentedgp.SGPR (Titsias' bound), DTC, FITC or "
                "TaylorSGPR")
    raise TypeError(f"{cls.__name__} takes no method argument (each collapsed sparse model is "
                    f"its own class); for method={method!r} {hint}")


class CollapsedSparseGP(eqx.Module):
    """Base class of the sparse GPs with the inducing values u integrated out in closed
    form: :class:`SGPR` (Titsias' collapsed bound), :class:`DTC`, :class:`FITC` and
    :class:`TaylorSGPR`. Not instantiated itself.

    Each model writes its data term as Gaussian sites (:class:`Sites`, :meth:`sites`) and
    integrates u out with :func:`collapse` (``A = Lmm^-1 Kmn``, in O(n M^2)); the models
    differ in their sites (the likelihood's, with FITC's heteroscedastic noise
    s2 + diag(K - Q), or a Taylor expansion) and in whether the objective keeps Titsias'
    trace term (:meth:`training_objective`). Every model gives its optimal q(u) in closed
    form (:meth:`optimal_q`, :meth:`to_svgp`).

    The traceable methods take validated arrays (:meth:`validate_data`, :meth:`check_aux`)
    and are what training differentiates: :meth:`collapsed`, :meth:`training_objective`,
    :meth:`lower_bound`, :meth:`marginals`, :meth:`aux_step`; the others validate their
    input and return Python floats or models. ``has_aux``: whether the objective depends on
    a local state ``q_aux`` (q(w) of an augmented likelihood, or the expansion points of
    :class:`TaylorSGPR`), which ``augmentedgp.fit`` then updates in closed form between
    L-BFGS rounds (``augmentedgp.training.collapsed.fit_collapsed``).

    The constructors take ``kernel``, ``inducing`` (an (M, d) array, trained by default, or
    a Parameter), ``noise`` or ``likelihood`` and ``mean``; the ``method`` argument of the
    former single SGPR class is refused with a TypeError naming the class to use.
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean
    inducing: Parameter

    # what the state q_aux is, for the messages
    aux_description: ClassVar[str] = "q(w) state"

    def __init__(self, kernel: Kernel, inducing: Float[ArrayLike, "M d"] | Parameter, *,
                 noise: float | Parameter | None = None, likelihood: Likelihood | None = None,
                 mean: Mean | None = None, **removed):
        _reject_removed(type(self), removed)
        if type(self) is CollapsedSparseGP:
            raise TypeError("CollapsedSparseGP is a base class: use SGPR, DTC, FITC or "
                            "TaylorSGPR")
        if likelihood is not None and noise is not None:
            raise ValueError("give either likelihood or noise (the Gaussian noise variance)")
        likelihood = Gaussian(1.0 if noise is None else noise) if likelihood is None else likelihood
        _check_kernel_likelihood(kernel, likelihood)
        type(self).check_likelihood(likelihood)
        self.kernel, self.likelihood = kernel, likelihood
        self.mean = Zero() if mean is None else mean
        self.inducing = inducing_parameter(inducing)

    @classmethod
    def check_likelihood(cls, likelihood: Likelihood) -> None:
        """Raise a ValueError unless the model takes ``likelihood`` (default: a Gaussian)."""
        if not isinstance(likelihood, Gaussian):
            raise ValueError(f"{cls.__name__} needs a Gaussian likelihood; use SGPR (the "
                             f"collapsed augmented bound) or SVGP for "
                             f"{type(likelihood).__name__}")

    @property
    def gaussian(self) -> bool:
        """Whether the likelihood is Gaussian (no q(w) state needed)."""
        return isinstance(self.likelihood, Gaussian)

    @property
    def has_aux(self) -> bool:
        """Whether the objective depends on a local state ``q_aux``: q(w) of an augmented
        likelihood, or the expansion points of :class:`TaylorSGPR`."""
        return not self.gaussian

    # --- traceable: validated arrays in, arrays out ---------------------------------------

    def prior_terms(self, X: Float[Array, "n d"]
                    ) -> tuple[Float[Array, "M n"], Float[Array, " n"], Float[Array, " n"]]:
        """(A = Lmm^-1 Kmn, diag(K - Q), mean(X)) at X: the prior's part of every collapsed
        objective (traceable)."""
        Z = self.inducing.value
        _, A = linalg.cholesky_project(self.kernel(Z), self.kernel(Z, X))
        return A, self.kernel.diag(X) - jnp.sum(A**2, 0), self.mean(X)

    def likelihood_sites(self, y: Shaped[Array, " n"], prior_mean: Float[Array, " n"],
                         q_aux=None) -> Sites:
        """The likelihood's own sites (traceable): Gaussian, beta = y / s2 and
        gamma = 1 / s2 (``q_aux`` None: w = 1); augmented, the sites given q(w) = ``q_aux``
        (``aux_sites``), whose e0 is ``augmented_expectations`` at f = prior_mean."""
        lik = self.likelihood
        if q_aux is None:
            if not self.gaussian:
                raise ValueError("the collapsed bound of a non-Gaussian likelihood needs the "
                                 "q(w) state q_aux (model.initial_aux(X, y))")
            q_aux = lik.aux_posterior(y, prior_mean, jnp.zeros_like(prior_mean))  # any: w = 1
        beta, gamma = (jnp.broadcast_to(s, prior_mean.shape) for s in lik.aux_sites(y, q_aux))
        zeros = jnp.zeros_like(prior_mean)
        return Sites(beta, gamma, lik.augmented_expectations(y, prior_mean, zeros, q_aux))

    def sites(self, y: Shaped[Array, " n"], prior_mean: Float[Array, " n"],
              residual_var: Float[Array, " n"], q_aux=None) -> Sites:
        """The model's sites (traceable): by default the likelihood's
        (:meth:`likelihood_sites`); FITC and TaylorSGPR override it."""
        return self.likelihood_sites(y, prior_mean, q_aux)

    def collapsed(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None,
                  trace: bool = True) -> CollapsedTerms:
        """The model's sites at X with u integrated out (:func:`collapse`; traceable):
        given q(w) = ``q_aux`` (None: w = 1, Gaussian) the data term is
        sum_i e0_i + r_i g_i - gamma_i g_i^2 / 2 in g = f - m0, and

            F = sum e0 + 1/2 theta1^T P^-1 theta1 - 1/2 log|P| - 1/2 sum gamma diag(K - Q),

        P = I + A Gamma A^T, theta1 = A r; ``trace=False`` drops the last term. With a
        Gaussian likelihood (gamma = 1 / s2, beta = y / s2) it is Titsias' bound."""
        A, residual_var, m0 = self.prior_terms(X)
        return collapse(A, m0, residual_var, self.sites(y, m0, residual_var, q_aux), trace)

    @eqx.filter_jit
    def training_objective(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                           ) -> Float[Array, ""]:
        """The objective that training maximises, on validated arrays (traceable, compiled
        when called outside a trace); ``q_aux``: the state (``has_aux``)."""
        return self.collapsed(X, y, q_aux).bound

    @eqx.filter_jit
    def lower_bound(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                    ) -> Float[Array, ""]:
        """The collapsed lower bound on log p(y), on validated arrays (traceable): Titsias'
        for a Gaussian likelihood; otherwise the augmented bound at q(w) = ``q_aux`` and its
        optimal q(u)."""
        A, residual_var, m0 = self.prior_terms(X)
        return collapse(A, m0, residual_var, self.likelihood_sites(y, m0, q_aux)).bound

    def marginals(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                  ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """(mean, var) of f(X) under the model's optimal q(u) given ``q_aux`` (traceable)."""
        t = self.collapsed(X, y, q_aux)
        V = linalg.solve_lower(t.LP, t.A)  # P^-1 = LP^-T LP^-1
        return t.prior_mean + V.T @ t.c, t.residual_var + jnp.sum(V**2, 0)

    @eqx.filter_jit
    def closed_form_q(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                      ) -> NaturalQ:
        """The model's optimal q(u) given ``q_aux`` as whitened natural parameters, on
        validated arrays (traceable; :meth:`optimal_q` validates)."""
        t = self.collapsed(X, y, q_aux)
        return NaturalQ(Parameter(t.theta1), Parameter(-0.5 * t.P), whiten=True)

    @eqx.filter_jit
    def prior_aux(self, X: Float[Array, "n d"], y: Shaped[Array, " n"]):
        """The optimal state when q(u) is the prior p(u) (traceable; :meth:`initial_aux`
        validates)."""
        return self.likelihood.aux_posterior(y, self.mean(X), self.kernel.diag(X))

    @eqx.filter_jit
    def aux_step(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None):
        """The optimal q(w) given the optimal q(u) given ``q_aux`` (traceable): one
        coordinate-ascent sweep ([Galy-Fajou2020, Algorithm 1], local step, after the
        closed-form global step)."""
        mean, var = self.marginals(X, y, q_aux)
        return self.likelihood.aux_posterior(y, mean, var)

    def aux_template(self, y: Shaped[Array, " n"]):
        """The state's type and field shapes for n targets (``jax.ShapeDtypeStruct``s)."""
        zeros = jnp.zeros(jnp.shape(y))
        return jax.eval_shape(self.likelihood.aux_posterior, y, zeros, zeros)

    @eqx.filter_jit
    def collapsed_upper_bound(self, X: Float[Array, "n d"], y: Float[Array, " n"]
                              ) -> Float[Array, ""]:
        """Titsias' upper bound on log p(y) ([Titsias2014], c = tr(K - Q)) on validated
        arrays (traceable; Gaussian likelihood)."""
        A, residual_var, m0 = self.prior_terms(X)
        r = y - m0
        d = jnp.full(X.shape[:1], self.likelihood.variance.value, X.dtype)
        lower_det = _lowrank_terms(jnp.zeros_like(r), A, d)[0]
        loose = d + jnp.sum(residual_var)
        return lower_det + _lowrank_terms(r, A, loose)[0] - _lowrank_terms(
            jnp.zeros_like(r), A, loose)[0]

    # --- public: checked input ------------------------------------------------------------

    def validate_data(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]
                      ) -> tuple[Float[Array, "n d"], Shaped[Array, " n"]]:
        """(X, y) checked at the public boundary and as JAX arrays (a clear ValueError
        otherwise)."""
        X = check_X(X, d=self.inducing.value.shape[1])
        return jnp.asarray(X), jnp.asarray(self.likelihood.targets(y, X.shape[0]))

    def check_aux(self, y: Shaped[Array, " n"], q_aux):
        """``q_aux`` checked against the model's state type (:meth:`aux_template`) and the n
        targets (a clear ValueError otherwise), as JAX arrays; None stays None when the
        objective needs no state (``has_aux`` False)."""
        if q_aux is None:
            if not self.has_aux:
                return None
            raise ValueError(f"{type(self).__name__} with {type(self.likelihood).__name__} "
                             f"needs q_aux, the {self.aux_description}: start from "
                             "model.initial_aux(X, y), or fit the model "
                             "(augmentedgp.training.collapsed.fit_collapsed)")
        ref = self.aux_template(y)
        if type(q_aux) is not type(ref) or any(
                jnp.shape(a) != r.shape for a, r in zip(q_aux, ref, strict=True)):
            raise ValueError(f"q_aux must be a {type(ref).__name__} with fields of shape "
                             f"{[r.shape for r in ref]} (from initial_aux / update_aux)")
        return jax.tree_util.tree_map(jnp.asarray, q_aux)

    def _validated(self, X, y, q_aux):
        X, y = self.validate_data(X, y)
        return X, y, self.check_aux(y, q_aux)

    def objective(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  q_aux=None) -> float:
        """The training objective (:meth:`training_objective`) on checked input."""
        return float(self.training_objective(*self._validated(X, y, q_aux)))

    def elbo(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], q_aux=None) -> float:
        """A lower bound on log p(y) whatever the model's objective
        (:meth:`lower_bound`): Titsias' collapsed bound for a Gaussian likelihood (also for
        DTC and FITC); otherwise the augmented bound at q(w) = ``q_aux`` and its optimal
        q(u) (the SVGP augmented ELBO there)."""
        return float(self.lower_bound(*self._validated(X, y, q_aux)))

    def initial_aux(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]):
        """The optimal state when q(u) is the prior p(u): a starting q(w) state."""
        return self.prior_aux(*self.validate_data(X, y))

    def update_aux(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], q_aux=None):
        """The closed-form state update (:meth:`aux_step`): for q(w), optimal given the
        optimal q(u) given ``q_aux`` (never lowers :meth:`elbo`)."""
        return self.aux_step(*self._validated(X, y, q_aux))

    def upper_bound(self, X: Float[ArrayLike, "n d"], y: Float[ArrayLike, " n"]) -> float:
        """Titsias' upper bound on log p(y) ([Titsias2014]): a diagnostic of the gap
        (Gaussian likelihood only)."""
        if not self.gaussian:
            raise ValueError("upper_bound needs a Gaussian likelihood")
        return float(self.collapsed_upper_bound(*self.validate_data(X, y)))

    def optimal_q(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  q_aux=None) -> NaturalQ:
        """The model's closed-form q(u) (given q(w) = ``q_aux`` for a non-Gaussian
        likelihood), as whitened natural parameters."""
        return self.closed_form_q(*self._validated(X, y, q_aux))

    def to_svgp(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                q_aux=None) -> SVGP:
        """An SVGP holding this model's optimal q(u) (given ``q_aux``): predictions without
        the data."""
        return SVGP(self.kernel, self.likelihood, self.inducing, mean=self.mean,
                    q=self.optimal_q(X, y, q_aux))


class SGPR(CollapsedSparseGP):
    """Sparse GP regression with u integrated out: Titsias' collapsed bound ([Titsias2009])

        F = log N(y | m, Q + s2 I) - tr(K - Q) / (2 s2),    Q = Knm Kmm^-1 Kmn,

    a lower bound on log p(y) whose optimum in q(u) is closed-form.

    ``likelihood`` is Gaussian (default, ``noise`` its variance) or any augmentable
    likelihood of one latent function (``augmentedgp.likelihoods.augmentable()``:
    Logistic, StudentT, Laplace, ...). Given q(w) the augmented sites are Gaussian, so the
    bound collapses as Titsias' does, with pseudo-targets beta / gamma and noise 1 / gamma
    ([Titsias2009]; for the logistic this is the Jaakkola-Jordan bound, [Jaakkola2000],
    collapsed as in [Izmailov2016]). The q(w) state ``q_aux`` is the likelihood's own
    NamedTuple (``Tilt`` for the scale mixtures); a Gaussian needs none (w = 1).
    ``augmentedgp.training.collapsed.fit_collapsed`` alternates its closed-form update
    (:meth:`update_aux`) with L-BFGS on the bound.

    The approximate marginal likelihoods of the same inducing inputs are :class:`DTC` and
    :class:`FITC`; the second-order Taylor approximation is :class:`TaylorSGPR`.
    """

    @classmethod
    def check_likelihood(cls, likelihood: Likelihood) -> None:
        """Raise a ValueError unless ``likelihood`` is Gaussian or augmentable, of one
        latent function."""
        name = type(likelihood).__name__
        if isinstance(likelihood, Gaussian):
            return
        if not isinstance(likelihood, Augmented):
            names = ", ".join(c.__name__ for c in augmentable())
            raise ValueError(f"SGPR needs a Gaussian or augmentable likelihood ({names}); use "
                             f"SVGP (or TaylorSGPR, for a log-concave one) for {name}")
        if getattr(likelihood, "num_latent", 1) != 1:
            raise ValueError(f"SGPR takes likelihoods of one latent function; use SVGP (with "
                             f"AnalyticVI) for {name}")


class DTC(CollapsedSparseGP):
    """Deterministic training conditional ([Seeger2003]; the name of
    [Quinonero-Candela2005]): the exact log marginal likelihood of the approximate model
    y ~ N(m, Q + s2 I), Q = Knm Kmm^-1 Kmn -- :class:`SGPR`'s objective without Titsias'
    trace term, so not a lower bound on log p(y) (:meth:`elbo` is Titsias' bound).
    Gaussian likelihood only (``noise`` its variance). The q(u) is the same as SGPR's."""

    @eqx.filter_jit
    def training_objective(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                           ) -> Float[Array, ""]:
        """log N(y | m, Q + s2 I) on validated arrays (traceable)."""
        return self.collapsed(X, y, q_aux, trace=False).bound


class FITC(CollapsedSparseGP):
    """Fully independent training conditional ([Snelson2006], as the sparse
    pseudo-input GP; the name of [Quinonero-Candela2005]): the exact log marginal likelihood
    of y ~ N(m, Q + diag(K - Q) + s2 I), i.e. DTC with the heteroscedastic noise
    s2 + diag(K - Q) (:meth:`sites`), not a lower bound on log p(y) (:meth:`elbo` is
    Titsias' bound). Gaussian likelihood only (``noise`` its variance); its q(u) is the
    posterior of u under that model."""

    def sites(self, y: Shaped[Array, " n"], prior_mean: Float[Array, " n"],
              residual_var: Float[Array, " n"], q_aux=None) -> Sites:
        """Gaussian sites of noise d = s2 + diag(K - Q): beta = y / d, gamma = 1 / d,
        e0 = log N(y | m, d) (traceable)."""
        d = self.likelihood.variance.value + residual_var
        r = y - prior_mean
        return Sites(y / d, 1.0 / d, -0.5 * (_LOG_2PI + jnp.log(d) + r**2 / d))

    @eqx.filter_jit
    def training_objective(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                           ) -> Float[Array, ""]:
        """log N(y | m, Q + diag(K - Q) + s2 I) on validated arrays (traceable)."""
        return self.collapsed(X, y, q_aux, trace=False).bound


class TaylorSGPR(CollapsedSparseGP):
    """Sparse GP with each log p(y_i | f_i) replaced by its second-order Taylor expansion at
    points xi_i and u integrated out: a Laplace-type approximation ([Rasmussen2006]
    Sec. 3.4), collapsed as [Izmailov2016] collapse the Jaakkola-Jordan bound, for any
    likelihood of one latent function that is twice differentiable and log-concave
    (Logistic, Probit, Poisson, ...; augmentable or not). The expectation of the expansion
    under q(f_i) = N(m_i, S_i) is

        log p(y_i | xi_i) + g_i (m_i - xi_i) - W_i ((m_i - xi_i)^2 + S_i) / 2,

    g and -W the first and second derivatives at xi: Gaussian sites (beta, gamma) =
    (g + W xi, W), collapsed as :class:`SGPR`'s. The state ``q_aux`` is a
    :class:`TaylorPoint`, updated to xi = E_q[f]: the expansion at the mean, where the
    first-order term vanishes (not a stationary point of the objective in xi: its
    derivative there is S_i d^3 log p / df^3 / 2). At that fixed point q(u) is the Laplace
    approximation of the DTC model (with Z = X the objective is the Laplace log marginal
    likelihood): the objective approximates log p(y) but is not a lower bound -- it can lie
    above log p(y) -- and the updates need not increase it. :meth:`elbo` gives the ELBO of
    its q(u), a bound.
    """

    aux_description: ClassVar[str] = "TaylorPoint, the expansion points"

    @classmethod
    def check_likelihood(cls, likelihood: Likelihood) -> None:
        """Raise a ValueError unless ``likelihood`` has one latent function and is twice
        differentiable and log-concave."""
        if (getattr(likelihood, "num_latent", 1) != 1 or not likelihood.twice_differentiable
                or not likelihood.log_concave):
            raise ValueError(f"TaylorSGPR needs a likelihood of one latent function that is "
                             f"twice differentiable and log-concave (its sites' precision "
                             f"-d^2 log p / df^2 must be >= 0); {type(likelihood).__name__} "
                             "is not: use SGPR (augmentable likelihoods) or SVGP")

    @property
    def has_aux(self) -> bool:
        """True: the objective depends on the expansion points."""
        return True

    def sites(self, y: Shaped[Array, " n"], prior_mean: Float[Array, " n"],
              residual_var: Float[Array, " n"], q_aux=None) -> Sites:
        """The second-order expansion at xi = ``q_aux.xi`` (traceable):
        log p(y | f) ~ log p(y | xi) + g (f - xi) - W (f - xi)^2 / 2, as sites
        (g + W xi, W) with e0 the expansion at f = prior_mean."""
        lik, xi = self.likelihood, q_aux.xi
        g, W = lik.grad_log_prob(y, xi), -lik.hess_log_prob(y, xi)
        e0 = (lik.log_prob(y, xi) + g * (prior_mean - xi)
              - 0.5 * W * (prior_mean - xi) ** 2)
        return Sites(g + W * xi, W, e0)

    @eqx.filter_jit
    def lower_bound(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                    ) -> Float[Array, ""]:
        """The ELBO of the q(u) of the expansion points ``q_aux`` (traceable):
        sum_i E_q[log p(y_i | f_i)] - KL(q(u) || p(u)), the SVGP ELBO of :meth:`to_svgp`.
        With whitened q(v) = N(P^-1 theta1, P^-1), KL = (tr P^-1 + |E v|^2 - M + log|P|) / 2.
        """
        t = self.collapsed(X, y, q_aux)
        V = linalg.solve_lower(t.LP, t.A)
        mean, var = t.prior_mean + V.T @ t.c, t.residual_var + jnp.sum(V**2, 0)
        Ev = linalg.solve_upper_t(t.LP, t.c)  # P^-1 theta1 = LP^-T c
        Linv = linalg.solve_lower(t.LP, jnp.eye(t.P.shape[0], dtype=t.P.dtype))
        kl = 0.5 * (jnp.sum(Linv**2) + jnp.sum(Ev**2) - t.P.shape[0]
                    + linalg.logdet_chol(t.LP))
        return jnp.sum(self.likelihood.variational_expectations(y, mean, var)) - kl

    @eqx.filter_jit
    def prior_aux(self, X: Float[Array, "n d"], y: Shaped[Array, " n"]) -> TaylorPoint:
        """The expansion points at the prior mean (traceable)."""
        return TaylorPoint(self.mean(X))

    @eqx.filter_jit
    def aux_step(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                 ) -> TaylorPoint:
        """The expansion points xi = E_q[f] under the q(u) of ``q_aux`` (traceable; a
        fixed-point step: it need not raise :meth:`objective`)."""
        return TaylorPoint(self.marginals(X, y, q_aux)[0])

    def aux_template(self, y: Shaped[Array, " n"]) -> TaylorPoint:
        """A TaylorPoint of n expansion points (``jax.ShapeDtypeStruct``)."""
        zeros = jnp.zeros(jnp.shape(y))
        return TaylorPoint(jax.ShapeDtypeStruct(zeros.shape, zeros.dtype))


@eqx.filter_jit
def _elbo_jit(model, X, y, scale, augmented=False):
    lik = model.likelihood
    expectations = lik.augmented_expectations if augmented else lik.variational_expectations
    return model.elbo_projection(X, y, scale, expectations)[0]


@eqx.filter_jit
def _gap_per_point(model, X, y):
    p, lik = model.project(X), model.likelihood
    return (lik.variational_expectations(y, p.mean, p.var)
            - lik.augmented_expectations(y, p.mean, p.var))


def _check_augmented(likelihood, augmented):
    if augmented and not isinstance(likelihood, Augmented):
        raise ValueError(f"{type(likelihood).__name__} has no augmentation")


@eqx.filter_jit
def _predict_f(model, Xnew, full_cov):
    p = model.project(Xnew, full_cov)
    return p.mean, p.var


class SparsePosterior(FittedPosterior):
    """A fitted SGPR / SVGP / VGP: the model (with its q(u)), the training data and the
    training history. Predictions need only the model; ``elbo()`` uses the data."""

    model: SVGP
    X: jax.Array
    y: jax.Array
    history: object = eqx.field(static=True, default=None)

    @limits
    def predict_f(self, Xnew: Float[ArrayLike, "n d"], full_cov: bool = False
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"] | Float[Array, "*C n n"]]:
        return self.model.predict_f(Xnew, full_cov)

    def _moments(self, Xnew, full_cov: bool = False):
        return self.model._moments(Xnew, full_cov)

    def _check_new(self, Xnew):
        return self.model._check_new(Xnew)

    def elbo(self, augmented: bool = False) -> float:
        """The SVGP evidence lower bound on the full training data (``augmented=True``: the
        augmented model's bound at the optimal q(w), see :meth:`SVGP.elbo`)."""
        _check_augmented(self.likelihood, augmented)
        self._check_training_data()
        return float(_elbo_jit(self.model, self.X, self.y, 1.0, augmented))

    def _check_training_data(self):
        if self.X is None:
            raise ValueError("this posterior holds no training data (fitted by "
                             "augmentedgp.training.distributed.fit); use model.elbo(X, y) on "
                             "the data")

    def augmentation_gap(self, per_point: bool = False) -> float | np.ndarray:
        """elbo() - elbo(augmented=True) = sum_i E_q[log phi(h_i^2)] - log phi(E_q[h_i^2])
        >= 0: how much the augmented bound gives away at this q(f)
        ([Galy-Fajou2020, App. A.4.3]); with ``per_point`` the n terms of that sum,
        E_q[log p(y_i | f_i)] minus the augmented data term at the optimal q(w_i) (the KL
        terms cancel, so the total is their sum: one pass over the data). A large gap per
        point is what biases hyperparameters learned on the augmented bound (QuadratureVI
        learns them on elbo())."""
        _check_augmented(self.likelihood, True)
        self._check_training_data()
        gap = np.asarray(_gap_per_point(self.model, self.X, self.y))
        return gap if per_point else float(np.sum(gap))

    @property
    def inducing(self) -> Float[Array, "M d"]:
        return self.model.inducing.value


__all__ = ["CollapsedSparseGP", "SGPR", "DTC", "FITC", "TaylorSGPR", "SVGP", "VGP",
           "SparsePosterior", "Projection", "CollapsedTerms", "Sites", "TaylorPoint", "collapse",
           "latent_prior", "inducing_parameter"]
