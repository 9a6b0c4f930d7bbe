"""Inducing-point GP models: SGPR (collapsed, with DTC and FITC), SVGP and VGP.

SVGP ([Hensman2013], [Hensman2015]) keeps q(u) explicit; its bound on a minibatch B of n
points is  (n / |B|) sum_{i in B} E_{q(f_i)}[log p(y_i | f_i)] - KL(q(u) || p(u))
(the minibatch estimate of [Hensman2013]). VGP is the non-sparse case Z = X ([Opper2009]).
SGPR integrates u out for a Gaussian likelihood ([Titsias2009]):

    F = log N(y | m, Q + s2 I) - tr(K - Q) / (2 s2),    Q = Knm Kmm^-1 Kmn,

DTC drops the trace term ([Seeger2003]) and FITC replaces s2 I by s2 I + diag(K - Q)
([Snelson2006]; the names of [Quinonero-Candela2005]). All three give q(u) in closed form
(with the per-point noise d: precision of v = Lmm^-1 u is I + A D^-1 A^T and
theta1 = A D^-1 r). With an augmentable likelihood SGPR collapses the augmented bound
given q(w) the same way: the sites (beta, gamma) are Gaussian, pseudo-targets beta / gamma
with noise 1 / gamma (``SGPR.collapsed``; the Gaussian is the case w = 1). Method "taylor"
collapses the second-order Taylor expansion of log p(y_i | f_i) at points xi_i instead (a
Laplace-type approximation, [Rasmussen2006] Sec. 3.4, collapsed as [Izmailov2016] collapse
the Jaakkola-Jordan bound): Gaussian sites again, but an approximate objective, not a
bound (``SGPR``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

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


# --- SGPR ------------------------------------------------------------------------------


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
    """The collapsed augmented bound at X given q(w) and the pieces of its optimal q(u)
    (whitened, v = Lmm^-1 u: precision P = I + A Gamma A^T, P E[v] = theta1)."""

    bound: jax.Array
    A: jax.Array  # Lmm^-1 Kmn
    P: jax.Array  # I + A Gamma A^T
    LP: jax.Array  # cholesky(P)
    theta1: jax.Array  # A (beta - gamma * prior_mean)
    c: jax.Array  # LP^-1 theta1
    residual_var: jax.Array  # diag(K - Q)
    prior_mean: jax.Array  # mean(X)


class TaylorPoint(NamedTuple):
    """The state of SGPR's method "taylor": the points xi (n,) at which log p(y_i | f_i) is
    expanded to second order."""

    xi: jax.Array


class SGPR(eqx.Module):
    """Sparse GP with u integrated out: Titsias' collapsed bound ("vfe", default), or the
    DTC / FITC approximate marginal likelihoods ("dtc", "fitc", Gaussian likelihood only),
    or the second-order Taylor approximation ("taylor").

    ``likelihood`` is Gaussian (default, ``noise`` its variance) or any augmentable
    likelihood of one latent function (``augmentedgp.likelihoods.augmentable()``:
    Logistic, StudentT, Laplace, ...). Given q(w) the augmented sites are Gaussian, so the
    bound collapses as Titsias' does, with pseudo-targets beta / gamma and noise 1 / gamma
    ([Titsias2009]; for the logistic this is the Jaakkola-Jordan bound, [Jaakkola2000],
    collapsed as in [Izmailov2016]). The q(w) state ``q_aux`` is the likelihood's own
    NamedTuple (``Tilt`` for the scale mixtures); a Gaussian needs none (w = 1).
    ``augmentedgp.training.collapsed.fit_collapsed`` alternates its closed-form update
    (:meth:`update_aux`) with L-BFGS on the bound.

    "taylor" (the second-order Taylor approximation in place of [Izmailov2016]'s
    Jaakkola-Jordan bound): any likelihood of one latent function that is
    twice differentiable and log-concave (Logistic, Probit, Poisson, ...; augmentable or
    not). Each log p(y_i | f_i) is replaced by its second-order Taylor expansion at xi_i,
    whose expectation under q(f_i) = N(m_i, S_i) is

        log p(y_i | xi_i) + g_i (m_i - xi_i) - W_i ((m_i - xi_i)^2 + S_i) / 2,

    g and -W the first and second derivatives at xi: Gaussian sites (beta, gamma) =
    (g + W xi, W), collapsed as above. The state ``q_aux`` is a :class:`TaylorPoint`,
    updated to xi = E_q[f]: the expansion at the mean, where the first-order term vanishes
    (not a stationary point of the objective in xi: its derivative there is
    S_i d^3 log p / df^3 / 2). At that fixed point q(u) is the Laplace approximation of the
    DTC model (with Z = X the objective is the Laplace log marginal likelihood): the
    objective approximates log p(y) but is not a lower bound -- it can lie above log p(y) --
    and the updates need not increase it. :meth:`elbo` gives the ELBO of its q(u), a bound.
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean
    inducing: Parameter
    method: str = eqx.field(static=True, default="vfe")

    def __init__(self, kernel: Kernel, inducing: Float[ArrayLike, "M d"] | Parameter, *,
                 noise: float | Parameter | None = None, likelihood: Likelihood | None = None,
                 mean: Mean | None = None, method: str = "vfe"):
        if likelihood is not None and noise is not None:
            raise ValueError("give either likelihood or noise (the Gaussian noise variance)")
        likelihood = Gaussian(1.0 if noise is None else noise) if likelihood is None else likelihood
        _check_kernel_likelihood(kernel, likelihood)
        if method not in ("vfe", "dtc", "fitc", "taylor"):
            raise ValueError(f"method must be 'vfe', 'dtc', 'fitc' or 'taylor', got {method!r}")
        _check_sgpr_likelihood(likelihood, method)
        self.kernel, self.likelihood, self.method = kernel, likelihood, method
        self.mean = Zero() if mean is None else mean
        self.inducing = inducing_parameter(inducing)

    @property
    def gaussian(self) -> bool:
        """Whether the likelihood is Gaussian (no q(w) state needed)."""
        return isinstance(self.likelihood, Gaussian)

    @property
    def has_aux(self) -> bool:
        """Whether the objective depends on a local state ``q_aux``: q(w) of an augmented
        likelihood, or the expansion points of method "taylor"."""
        return self.method == "taylor" or not self.gaussian

    def _terms(self, X, y, method=None):
        method = method or self.method
        Z = self.inducing.value
        Lmm, A = linalg.cholesky_project(self.kernel(Z), self.kernel(Z, X))
        residual_var = self.kernel.diag(X) - jnp.sum(A**2, 0)  # diag(K - Q)
        s2 = self.likelihood.variance.value
        d = s2 + residual_var if method == "fitc" else jnp.full(X.shape[:1], s2, X.dtype)
        return A, y - self.mean(X), d, residual_var, s2

    def collapsed(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None,
                  trace: bool = True) -> CollapsedTerms:
        """The collapsed bound given q(w) = ``q_aux`` (traceable; None: w = 1, Gaussian), or
        the Taylor objective given the expansion points (method "taylor").

        Given q(w) the data term is sum_i E0_i + r_i g_i - gamma_i g_i^2 / 2 in g = f - m0,
        with (beta, gamma) the sites, r = beta - gamma m0 and E0_i the data term at f = m0
        (``augmented_expectations`` at zero variance; "taylor": the expansion at m0).
        Integrating u out as [Titsias2009]:

            F = sum E0 + 1/2 theta1^T P^-1 theta1 - 1/2 log|P| - 1/2 sum gamma diag(K - Q),

        P = I + A Gamma A^T, theta1 = A r; DTC (``trace=False``) drops the last term. With a
        Gaussian likelihood (gamma = 1 / s2, beta = y / s2) it is Titsias' bound.
        """
        Z = self.inducing.value
        _, A = linalg.cholesky_project(self.kernel(Z), self.kernel(Z, X))
        resid = self.kernel.diag(X) - jnp.sum(A**2, 0)
        m0 = self.mean(X)
        beta, gamma, e0 = self._quadratic_sites(y, m0, q_aux)
        theta1 = A @ (beta - gamma * m0)
        P = jnp.eye(A.shape[0], dtype=A.dtype) + (A * gamma) @ A.T
        LP = linalg.cholesky(P)
        c = linalg.solve_lower(LP, theta1)
        bound = jnp.sum(e0) + 0.5 * jnp.sum(c**2) - 0.5 * linalg.logdet_chol(LP)
        if trace:
            bound = bound - 0.5 * jnp.sum(gamma * resid)  # the trace term of [Titsias2009]
        return CollapsedTerms(bound, A, P, LP, theta1, c, resid, m0)

    def _quadratic_sites(self, y, m0, q_aux):
        """(beta, gamma, E0): the data term as a quadratic in f (module docstring)."""
        lik = self.likelihood
        if self.method == "taylor":
            # log p(y | f) ~ log p(y | xi) + g (f - xi) - W (f - xi)^2 / 2 (second order at xi)
            xi = q_aux.xi
            g, W = lik.grad_log_prob(y, xi), -lik.hess_log_prob(y, xi)
            e0 = lik.log_prob(y, xi) + g * (m0 - xi) - 0.5 * W * (m0 - xi) ** 2
            return g + W * xi, W, e0
        if q_aux is None:
            if not self.gaussian:
                raise ValueError("the collapsed bound of a non-Gaussian likelihood needs the "
                                 "q(w) state q_aux (model.initial_aux(X, y))")
            q_aux = lik.aux_posterior(y, m0, jnp.zeros_like(m0))  # any: w = 1
        beta, gamma = (jnp.broadcast_to(s, m0.shape) for s in lik.aux_sites(y, q_aux))
        return beta, gamma, lik.augmented_expectations(y, m0, jnp.zeros_like(m0), q_aux)

    def training_objective(self, X, y, method=None, q_aux=None):
        """The objective on validated arrays (traceable): the collapsed bound (vfe), the
        DTC / FITC log marginal likelihood or the Taylor approximation (taylor);
        ``q_aux``: the q(w) state (non-Gaussian) or the ``TaylorPoint``."""
        method = method or self.method
        if method != "fitc":
            return self.collapsed(X, y, q_aux, trace=method != "dtc").bound
        A, r, d, resid, s2 = self._terms(X, y, method)
        return _lowrank_terms(r, A, d)[0]

    def marginals(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None
                      ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """(mean, var) of f(X) under the optimal q(u) given q(w) (traceable)."""
        t = self.collapsed(X, y, q_aux)
        V = linalg.solve_lower(t.LP, t.A)  # P^-1 = LP^-T LP^-1
        return t.prior_mean + V.T @ t.c, t.residual_var + jnp.sum(V**2, 0)

    def aux_step(self, X: Float[Array, "n d"], y: Shaped[Array, " n"], q_aux=None):
        """The optimal q(w) given the optimal q(u) given ``q_aux`` (traceable): one
        coordinate-ascent sweep ([Galy-Fajou2020, Algorithm 1], local step, after the
        closed-form global step); "taylor": the expansion points xi = E_q[f]."""
        mean, var = self.marginals(X, y, q_aux)
        if self.method == "taylor":
            return TaylorPoint(mean)
        return self.likelihood.aux_posterior(y, mean, var)

    def _upper_bound(self, X, y):
        A, r, d, resid, s2 = self._terms(X, y, "vfe")  # [Titsias2014], c = tr(K - Q)
        lower_det = _lowrank_terms(jnp.zeros_like(r), A, d)[0]
        tail = _lowrank_terms(r, A, d + jnp.sum(resid))[0] - _lowrank_terms(
            jnp.zeros_like(r), A, d + jnp.sum(resid))[0]
        return lower_det + tail

    def validate_data(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]
                      ) -> tuple[Float[Array, "n d"], Shaped[Array, " n"]]:
        """(X, y) checked at the public boundary and as JAX arrays (a clear ValueError
        otherwise)."""
        X = check_X(X, d=self.inducing.value.shape[1])
        return jnp.asarray(X), jnp.asarray(self.likelihood.targets(y, X.shape[0]))

    def check_aux(self, y: Shaped[Array, " n"], q_aux):
        """``q_aux`` checked against the likelihood's q(w) type and the n targets (a clear
        ValueError otherwise; a ``TaylorPoint`` for method "taylor"), as JAX arrays; None
        stays None when the objective needs no state (a Gaussian likelihood, not "taylor")."""
        if q_aux is None:
            if not self.has_aux:
                return None
            what = ("TaylorPoint, the expansion points" if self.method == "taylor"
                    else "q(w) state")
            raise ValueError(f"SGPR with {type(self.likelihood).__name__} (method "
                             f"{self.method!r}) needs q_aux, the {what}: start from "
                             "model.initial_aux(X, y), or fit the model "
                             "(augmentedgp.training.collapsed.fit_collapsed)")
        zeros = jnp.zeros(jnp.shape(y))
        ref = (TaylorPoint(jax.ShapeDtypeStruct(zeros.shape, zeros.dtype))
               if self.method == "taylor"
               else jax.eval_shape(self.likelihood.aux_posterior, y, zeros, zeros))
        if type(q_aux) is not type(ref) or any(
                jnp.shape(a) != r.shape for a, r in zip(q_aux, ref, strict=True)):
            raise ValueError(f"q_aux must be a {type(ref).__name__} with fields of shape "
                             f"{[r.shape for r in ref]} (from initial_aux / update_aux)")
        return jax.tree_util.tree_map(jnp.asarray, q_aux)

    def _public(self, X, y, q_aux):
        X, y = self.validate_data(X, y)
        return X, y, self.check_aux(y, q_aux)

    def objective(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  q_aux=None) -> float:
        """The training objective: the collapsed bound (vfe; at the q(w) state ``q_aux``
        for a non-Gaussian likelihood), the log marginal likelihood of the DTC / FITC
        approximation, or the Taylor approximation at the expansion points ``q_aux``
        (taylor: not a bound)."""
        return float(_sgpr_objective(self, *self._public(X, y, q_aux)))

    def elbo(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], q_aux=None) -> float:
        """The collapsed lower bound on log p(y) (whatever ``method``): Titsias' for a
        Gaussian likelihood; otherwise the augmented bound at q(w) = ``q_aux`` and its
        optimal q(u) (the SVGP augmented ELBO there); "taylor": the SVGP ELBO of the q(u)
        of the expansion points ``q_aux``."""
        X, y, q_aux = self._public(X, y, q_aux)
        if self.method == "taylor":
            return float(_elbo_jit(_sgpr_svgp(self, X, y, q_aux), X, y, 1.0))
        return float(_sgpr_elbo(self, X, y, q_aux))

    def initial_aux(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]):
        """The optimal q(w) when q(u) is the prior p(u): a starting q(w) state ("taylor":
        the expansion points at the prior mean)."""
        X, y = self.validate_data(X, y)
        return _sgpr_initial_aux(self, X, y)

    def update_aux(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], q_aux=None):
        """The closed-form q(w) update: optimal given the optimal q(u) given ``q_aux``
        (never lowers :meth:`elbo`); "taylor": the expansion points xi = E_q[f] under the
        q(u) of ``q_aux`` (a fixed-point step: it need not raise :meth:`objective`)."""
        return _sgpr_aux_update(self, *self._public(X, y, q_aux))

    def upper_bound(self, X: Float[ArrayLike, "n d"], y: Float[ArrayLike, " n"]) -> float:
        """Titsias' upper bound on log p(y) ([Titsias2014]): a diagnostic of the gap
        (Gaussian likelihood only)."""
        if not self.gaussian:
            raise ValueError("upper_bound needs a Gaussian likelihood")
        return float(_sgpr_upper(self, *self.validate_data(X, y)))

    def optimal_q(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  q_aux=None) -> NaturalQ:
        """The closed-form q(u) of the method (given q(w) = ``q_aux`` for a non-Gaussian
        likelihood), as whitened natural parameters."""
        return _sgpr_q(self, *self._public(X, y, q_aux))

    def to_svgp(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                q_aux=None) -> SVGP:
        """An SVGP holding this model's optimal q(u) (given ``q_aux``): predictions without
        the data."""
        return _sgpr_svgp(self, *self._public(X, y, q_aux))


def _check_sgpr_likelihood(likelihood, method):
    name = type(likelihood).__name__
    if method == "taylor":
        if (getattr(likelihood, "num_latent", 1) != 1 or not likelihood.twice_differentiable
                or not likelihood.log_concave):
            raise ValueError(f"method 'taylor' needs a likelihood of one latent function that "
                             f"is twice differentiable and log-concave (its sites' precision "
                             f"-d^2 log p / df^2 must be >= 0); {name} is not: use method="
                             "'vfe' (augmentable likelihoods) or SVGP")
        return
    if isinstance(likelihood, Gaussian):
        return
    if not isinstance(likelihood, Augmented):
        names = ", ".join(c.__name__ for c in augmentable())
        raise ValueError(f"SGPR needs a Gaussian or augmentable likelihood ({names}); use SVGP "
                         f"for {name}")
    if getattr(likelihood, "num_latent", 1) != 1:
        raise ValueError(f"SGPR takes likelihoods of one latent function; use SVGP (with "
                         f"AnalyticVI) for {name}")
    if method != "vfe":
        raise ValueError(f"method {method!r} needs a Gaussian likelihood; SGPR with {name} "
                         "takes method='vfe' (the collapsed augmented bound), or use SVGP")


@eqx.filter_jit
def _sgpr_objective(model, X, y, q_aux):
    return model.training_objective(X, y, q_aux=q_aux)


@eqx.filter_jit
def _sgpr_elbo(model, X, y, q_aux):
    return model.training_objective(X, y, "vfe", q_aux)


@eqx.filter_jit
def _sgpr_upper(model, X, y):
    return model._upper_bound(X, y)


@eqx.filter_jit
def _sgpr_initial_aux(model, X, y):
    if model.method == "taylor":
        return TaylorPoint(model.mean(X))
    return model.likelihood.aux_posterior(y, model.mean(X), model.kernel.diag(X))


@eqx.filter_jit
def _sgpr_aux_update(model, X, y, q_aux):
    return model.aux_step(X, y, q_aux)


@eqx.filter_jit
def _sgpr_q(model, X, y, q_aux=None):
    if model.method == "fitc":
        A, r, d, _, _ = model._terms(X, y)
        P = jnp.eye(A.shape[0], dtype=A.dtype) + (A / d) @ A.T
        return NaturalQ(Parameter(A @ (r / d)), Parameter(-0.5 * P), whiten=True)
    t = model.collapsed(X, y, q_aux)
    return NaturalQ(Parameter(t.theta1), Parameter(-0.5 * t.P), whiten=True)


def _sgpr_svgp(model, X, y, q_aux):
    return SVGP(model.kernel, model.likelihood, model.inducing, mean=model.mean,
                q=_sgpr_q(model, X, y, q_aux))


@eqx.filter_jit
def _elbo_jit(model, X, y, scale, augmented=False):
    return model._elbo(X, y, scale, augmented)


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


__all__ = ["SGPR", "SVGP", "VGP", "SparsePosterior", "Projection", "CollapsedTerms", "TaylorPoint",
           "latent_prior", "inducing_parameter"]
