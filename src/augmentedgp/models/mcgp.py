"""MCGP: a GP model sampled by augmented Gibbs sampling, and its sample-based posterior."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp
from jaxtyping import Array, ArrayLike, Float, Shaped

from augmentedgp.augmentation.protocol import Augmented
from augmentedgp.core import diagnostics, linalg
from augmentedgp.core.params import Parameter, fixed, partition_trainable
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import check_X
from augmentedgp.kernels.covariance import Kernel
from augmentedgp.kernels.means import Mean
from augmentedgp.likelihoods import augmentable
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.models.sites import FittedPosterior, check_moments
from augmentedgp.models.sparse import SVGP, inducing_parameter, latent_prior
from augmentedgp.variational.families import map_latents


class MCGP(eqx.Module):
    """A GP model sampled by augmented Gibbs: f ~ GP(mean, kernel), y_i ~ likelihood(f(x_i))
    with an augmented likelihood (see ``augmentedgp.likelihoods.augmentable()``).

    ``inducing`` (M, d) selects the sparse sampler of [Galy-Fajou2022, Sec. 7.5] (u at Z,
    f_i ~ p(f_i | u)), for n beyond a few thousand. Hyperparameters are held at their
    values; fit them first (e.g. with an SVGP) or pass the values to sample at. Several
    latent functions work as in :class:`~augmentedgp.SVGP` (one kernel shared, or a list of
    C kernels).
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean
    inducing: Parameter | None
    latent_kernels: bool = eqx.field(static=True, default=False)
    latent_means: bool = eqx.field(static=True, default=False)

    def __init__(self, kernel: Kernel | Sequence[Kernel], likelihood: Likelihood, *,
                 mean: Mean | Sequence[Mean] | None = None,
                 inducing: Float[ArrayLike, "M d"] | Parameter | None = None):
        if isinstance(likelihood, Likelihood) and not isinstance(likelihood, Augmented):
            raise ValueError(f"{type(likelihood).__name__} has no augmentation, so it cannot be "
                             "Gibbs-sampled; augmented likelihoods: "
                             f"{', '.join(c.__name__ for c in augmentable())}")
        self.kernel, self.mean, self.latent_kernels, self.latent_means = latent_prior(
            kernel, likelihood, mean)
        self.likelihood = likelihood
        self.inducing = None if inducing is None else fixed(inducing_parameter(inducing))

    num_latent = SVGP.num_latent

    def validate_data(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]
                      ) -> tuple[Float[Array, "n d"], Shaped[Array, " n"]]:
        """(X, y) checked at the public boundary and as JAX arrays (a clear ValueError
        otherwise)."""
        d = None if self.inducing is None else self.inducing.value.shape[1]
        X = check_X(X, d=d)
        return jnp.asarray(X), jnp.asarray(self.likelihood.targets(y, X.shape[0]))

    def priors(self, anchor: Float[Array, "m d"], X: Float[Array, "n d"]
              ) -> tuple[FullPrior | SparsePrior, bool]:
        """See :func:`latent_priors`."""
        return latent_priors(self, anchor, X)


class FullPrior(NamedTuple):
    K: jax.Array
    L: jax.Array
    m0: jax.Array


class SparsePrior(NamedTuple):
    Lmm: jax.Array
    A: jax.Array  # Lmm^-1 Kmn
    resid: jax.Array  # diag(Knn - Qnn)
    m0: jax.Array


def latent_priors(model, anchor: Float[Array, "m d"], X: Float[Array, "n d"]
                 ) -> tuple[FullPrior | SparsePrior, bool]:
    """(stacked per-latent priors at X, whether they are per latent) of a model with
    ``kernel``, ``mean`` and the latent flags (MCGP, SVGP, VGP): kernel and mean evaluated
    once when shared. ``anchor`` is X (full) or Z (sparse)."""

    def prior(kernel, mean):
        if anchor is X:
            K = kernel(X)
            return FullPrior(K, linalg.cholesky(K), mean(X))
        Lmm, A = linalg.cholesky_project(kernel(anchor), kernel(anchor, X))
        resid = jnp.maximum(kernel.diag(X) - jnp.sum(A**2, 0), 0.0)
        return SparsePrior(Lmm, A, resid, mean(X))

    if model.num_latent > 1 and (model.latent_kernels or model.latent_means):
        return map_latents(prior, (model.kernel, model.mean),
                           (model.latent_kernels, model.latent_means)), True
    return prior(model.kernel, model.mean), False


class MCPosterior(FittedPosterior):
    """Samples from an :class:`MCGP` posterior and predictions averaged over them.

    ``f``: samples of the latent values at the training inputs, (n_chains, n_samples, n)
    or (n_chains, n_samples, n, C); ``v``: the whitened values they are conditioned on
    (L^-1 (f - m) at X, or Lmm^-1 u at the inducing points); ``aux``: the auxiliary draws
    (with ``GibbsSampling(store_aux=True)``); ``hyper``: the trainable parameters' raw
    values per sample (with ``hyper_every``; ``models`` holds them as one MCGP whose
    parameters lead with (n_chains, n_samples)), and predictions then average over them."""

    model: MCGP
    X: jax.Array
    y: jax.Array
    f: jax.Array
    v: jax.Array
    hyper: object = None
    aux: object = None

    @property
    def models(self) -> MCGP:
        """The model with every trainable parameter's samples, (n_chains, n_samples, ...)."""
        if self.hyper is None:
            raise ValueError("no hyperparameter samples: use GibbsSampling(hyper_every=k)")
        return eqx.combine(self.hyper, partition_trainable(self.model)[1])

    @property
    def n_chains(self) -> int:
        return int(self.f.shape[0])

    @property
    def n_samples(self) -> int:
        return int(self.f.shape[1])

    def _check_new(self, Xnew):
        return jnp.asarray(check_X(Xnew, "Xnew", d=self.X.shape[1]))

    def _conditionals(self, Xnew, full_cov=False):
        """Per-sample means (S, n*[, C]) and the shared variance (n*[, C]) -- or covariance
        ((C,) n*, n*) -- of f(Xnew) given each sample (S = n_chains * n_samples)."""
        return _conditionals(self, self._check_new(Xnew), full_cov)

    @limits
    def predict_f(self, Xnew: Float[ArrayLike, "n d"], full_cov: bool = False
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"] | Float[Array, "*C n n"]]:
        """Posterior mean and variance (or covariance) of f(Xnew): the moments of the
        mixture over samples of the Gaussian conditionals p(f(Xnew) | sample)."""
        means, var = self._conditionals(Xnew, full_cov)
        mean = jnp.mean(means, 0)
        if not full_cov:
            var = jnp.mean(var, 0) if self.hyper is not None else var  # per-sample variances
            return mean, var + jnp.var(means, 0)
        d = means - mean
        if d.ndim == 2:
            return mean, var + d.T @ d / d.shape[0]
        return mean, var + jnp.einsum("sic,sjc->cij", d, d) / d.shape[0]

    @limits
    def predict_y(self, Xnew: Float[ArrayLike, "n d"]
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"]]:
        """Mean and variance of y at Xnew, mixed over the samples (multi-class: the class
        probabilities p and p (1 - p), as for the other posteriors)."""
        if hasattr(self.likelihood, "classes"):  # class probabilities p and p (1 - p)
            p = self.predict_proba(Xnew)
            return p, p * (1.0 - p)
        means, var = self._conditionals(Xnew)
        ey, vy = self.likelihood.predict_y(means, var)
        mean = jnp.mean(ey, 0)
        return check_moments(self.likelihood, mean, jnp.mean(vy + ey**2, 0) - mean**2)

    def predict_quantiles(self, Xnew: Float[ArrayLike, "n d"],
                          quantiles: ArrayLike = (0.025, 0.5, 0.975)) -> np.ndarray:
        """Not implemented: the predictive distribution is a mixture over the samples, not
        the Gaussian q(f) the likelihood's ``predictive_quantile`` integrates over."""
        raise NotImplementedError("MCPosterior has no predictive quantiles: q(f) is a "
                                  "mixture over the samples")

    @limits
    def predict_proba(self, Xnew: Float[ArrayLike, "n d"]) -> Float[Array, " n *C"]:
        """p(y = +1 | Xnew, data) (n*,), or p(y = k | Xnew, data) (n*, C): the average over
        samples of p(y | f(Xnew)) integrated over p(f(Xnew) | sample) (by the likelihood's
        quadrature for binary likelihoods; by one draw per sample for multi-class ones)."""
        if not hasattr(self.likelihood, "predict_proba"):
            raise TypeError("predict_proba needs a classification likelihood (binary or "
                            f"multi-class), not {self.likelihood}")
        means, var = self._conditionals(Xnew)
        if means.ndim == 2:
            return jnp.mean(self.likelihood.predict_proba(means, var), 0)
        return _class_proba(self.likelihood, means, var)

    @limits
    def predict_log_density(self, Xnew: Float[ArrayLike, "n d"], ynew: Shaped[ArrayLike, " n"]
                            ) -> Float[Array, " n"]:
        """log p(y* | x*, data) per test point: log of the sample average of p(y* | sample)."""
        Xnew = self._check_new(Xnew)
        ynew = jnp.asarray(self.likelihood.targets(ynew, Xnew.shape[0], "ynew"))
        if hasattr(self.likelihood, "classes"):
            proba = self.predict_proba(Xnew)
            return jnp.log(jnp.take_along_axis(proba, ynew[:, None], 1)[:, 0])
        means, var = self._conditionals(Xnew)
        logp = self.likelihood.predictive_log_prob(ynew, means, var)
        return logsumexp(logp, 0) - math.log(logp.shape[0])

    # --- diagnostics ---------------------------------------------------------------------

    def rhat(self) -> Float[np.ndarray, " n *C"]:
        """Rank-normalised split R-hat of f at each training input (n,) or (n, C)."""
        return diagnostics.split_rhat(self.f)

    def ess(self) -> Float[np.ndarray, " n *C"]:
        """Bulk effective sample size of f at each training input (n,) or (n, C)."""
        return diagnostics.ess_bulk(self.f)

    def summary(self) -> dict:
        """Mean, sd, R-hat, bulk and tail ESS and lag-1 autocorrelation of f (per input)."""
        return diagnostics.summary(self.f)


@eqx.filter_jit
def _conditionals(post: MCPosterior, Xnew, full_cov):
    S = post.f.shape[0] * post.f.shape[1]
    V = post.v.reshape(S, *post.v.shape[2:])
    anchor = post.X if post.model.inducing is None else post.model.inducing.value
    if post.hyper is None:
        return _conditionals_at(post.model, anchor, Xnew, V, full_cov)
    # hyperparameters per sample: each sample's conditional under its own; variances per
    # sample (S, n*[, C]), covariances averaged over the samples
    hyper = jax.tree_util.tree_map(lambda x: x.reshape(S, *x.shape[2:]), post.hyper)
    static = partition_trainable(post.model)[1]

    def one(a):
        mean, var = _conditionals_at(eqx.combine(a[0], static), anchor, Xnew, a[1][None],
                                     full_cov)
        return mean[0], var

    if not full_cov:
        return lax.map(one, (hyper, V))
    shape = jax.eval_shape(one, jax.tree_util.tree_map(lambda x: x[0], (hyper, V)))[1]

    def add(total, a):
        mean, var = one(a)
        return total + var, mean

    total, means = lax.scan(add, jnp.zeros(shape.shape, shape.dtype), (hyper, V))
    return means, total / S


def _conditionals_at(model, anchor, Xnew, V, full_cov):

    def cond(kernel, mean):
        L = linalg.cholesky(kernel(anchor))
        As = linalg.solve_lower(L, kernel(anchor, Xnew))
        if full_cov:
            return As, kernel(Xnew) - As.T @ As, mean(Xnew)
        return As, jnp.maximum(kernel.diag(Xnew) - jnp.sum(As**2, 0), 0.0), mean(Xnew)

    if model.num_latent == 1:
        As, var, m0 = cond(model.kernel, model.mean)
        return m0 + V @ As, var
    if model.latent_kernels or model.latent_means:
        As, var, m0 = map_latents(cond, (model.kernel, model.mean),
                                  (model.latent_kernels, model.latent_means))
        means = m0.T + jnp.einsum("smc,cmj->sjc", V, As)
    else:
        As, var, m0 = cond(model.kernel, model.mean)
        means = m0[:, None] + jnp.einsum("smc,mj->sjc", V, As)
        var = jnp.broadcast_to(var, (model.num_latent, *var.shape))
    return means, var if full_cov else var.T


@eqx.filter_jit
def _class_proba(likelihood, means, var):
    """Sample average of p(y = k | f*), f* ~ N(mean_s, var): one draw per sample, with a
    fixed key (deterministic predictions)."""
    eps = jax.random.normal(jax.random.PRNGKey(0), means.shape, means.dtype)
    F = means + jnp.sqrt(var) * eps
    codes = jnp.arange(likelihood.num_latent)
    logp = jax.vmap(lambda k: likelihood.log_prob(jnp.full(F.shape[:-1], k), F), out_axes=-1)(
        codes)
    return jnp.mean(jnp.exp(logp), 0)


__all__ = ["MCGP", "MCPosterior", "FullPrior", "SparsePrior", "latent_priors"]
