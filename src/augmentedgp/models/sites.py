"""The posterior of a full GP whose approximation is a product of Gaussian sites.

Exact regression (sites N(y_i | f_i, s^2)), Laplace (sites at the mode) and EP all give
q(f) proportional to p(f) prod_i N(f_i | nu_i / tau_i, 1 / tau_i) on g = f - m(X), so one
class predicts for all three (Rasmussen & Williams Algorithms 2.1, 3.2 and 3.6):

    B = I + S K S,  S = diag(sqrt(tau)),  L = chol(B)
    alpha = S B^{-1} S (nu / tau)                      (= K^{-1} E[g])
    E[f*] = m(x*) + k*^T alpha,   V[f*] = k** - |L^{-1} S k*|^2
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core import linalg
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import MAX_VALUES, check_int, check_key, check_X, require_finite
from augmentedgp.kernels.covariance import Kernel
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.quantiles import check_levels


def check_moments(likelihood, mean: Float[Array, " n *C"], var: Float[Array, " n *C"]
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"]]:
    """(mean, var) of y if finite (traced values pass); a ValueError if they overflow. The
    likelihood's ``predict_y`` has already refused moments that do not exist (Student-t
    noise with df <= 2)."""
    return require_finite(f"predict_y under {type(likelihood).__name__}: the predictive "
                          "moments of y", mean, var)


class Predictive(eqx.Module):
    """The prediction verbs, from a subclass's ``predict_f(Xnew, full_cov)``,
    ``_check_new(Xnew)`` (validated inputs) and ``likelihood``."""

    def predict_f(self, Xnew: Float[ArrayLike, "n d"], full_cov: bool = False
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"] | Float[Array, "*C n n"]]:
        raise NotImplementedError

    @limits
    def predict_y(self, Xnew: Float[ArrayLike, "n d"]
                  ) -> tuple[Float[Array, " n *C"], Float[Array, " n *C"]]:
        """Mean and variance of y at Xnew (for binary likelihoods: p(y=+1) and p(1-p)).
        A ValueError where they do not exist (Student-t noise with df <= 2) or overflow."""
        return check_moments(self.likelihood, *self.likelihood.predict_y(*self.predict_f(Xnew)))

    @limits
    def predict_quantiles(self, Xnew: Float[ArrayLike, "n d"],
                          quantiles: ArrayLike = (0.025, 0.5, 0.975)) -> Float[np.ndarray, "n q"]:
        """Quantiles of the predictive distribution of y at Xnew, shape (n*, len(quantiles))
        (numpy): the likelihood's ``predictive_quantile`` at each level, over the marginals
        of q(f) from ``predict_f``. ``quantiles``: levels strictly inside (0, 1). Likelihoods
        of one latent function: Gaussian, StudentT, Laplace, Poisson, NegativeBinomial."""
        levels = check_levels(quantiles)
        mean, var = (np.asarray(a) for a in self.predict_f(Xnew))
        return np.stack([self.likelihood.predictive_quantile(mean, var, level)
                         for level in levels], 1)

    @limits
    def predict_proba(self, Xnew: Float[ArrayLike, "n d"]) -> Float[Array, " n *C"]:
        """p(y = +1 | Xnew, data) (n*,) for binary likelihoods, or p(y = k | Xnew, data)
        (n*, C) for multi-class ones, averaged over the latent posterior."""
        if not hasattr(self.likelihood, "predict_proba"):
            raise TypeError("predict_proba needs a classification likelihood (binary or "
                            f"multi-class), not {self.likelihood}")
        return self.likelihood.predict_proba(*self.predict_f(Xnew))

    @limits
    def predict_log_density(self, Xnew: Float[ArrayLike, "n d"], ynew: Shaped[ArrayLike, " n"]
                            ) -> Float[Array, " n"]:
        """log p(y* | x*, data) = log int p(y*|f) q(f) df per test point (n*,)."""
        Xnew = self._check_new(Xnew)
        ynew = jnp.asarray(self.likelihood.targets(ynew, Xnew.shape[0], "ynew"))
        return self.likelihood.predictive_log_prob(ynew, *self.predict_f(Xnew))

    @limits
    def sample_f(self, key: PRNGKeyArray, Xnew: Float[ArrayLike, "n d"], n_samples: int = 1
                 ) -> Float[Array, "S n *C"]:
        """Joint posterior samples of f at Xnew, shape (n_samples, n*) -- or
        (n_samples, n*, C) for C latent functions (independent across latents). ``key``: a
        ``jax.random.key`` (or a legacy ``PRNGKey``); ``n_samples``: a positive integer."""
        key = check_key(key)
        n_samples = check_int(n_samples, "n_samples")
        mean, cov = self.predict_f(Xnew, full_cov=True)
        if n_samples * mean.size > MAX_VALUES:
            raise ValueError(f"n_samples = {n_samples} draws of {mean.size} values exceed "
                             f"{MAX_VALUES} values (8 bytes each, kept in memory)")
        single = mean.ndim == 1
        if single:
            mean, cov = mean[:, None], cov[None]
        Lc = linalg.check_cholesky(jax.lax.map(linalg.cholesky, cov),
                                   "posterior covariance at Xnew")
        eps = jax.random.normal(key, (n_samples, *mean.shape), dtype=mean.dtype)
        samples = mean + jnp.einsum("cij,sjc->sic", Lc, eps)
        return samples[..., 0] if single else samples

    @limits
    def predict_class(self, Xnew: Float[ArrayLike, "n d"]) -> Shaped[np.ndarray, " n"]:
        """The most probable class label at each row of Xnew (multi-class likelihoods),
        in the labels the likelihood was given."""
        classes = getattr(self.likelihood, "classes", None)
        if classes is None:
            raise TypeError(f"predict_class needs a multi-class likelihood, not {self.likelihood}")
        return np.asarray(classes)[np.argmax(np.asarray(self.predict_proba(Xnew)), axis=1)]


class FittedPosterior(Predictive):
    """A posterior that holds its fitted ``model``: its kernel and likelihood are the
    model's."""

    @property
    def kernel(self) -> Kernel:
        return self.model.kernel

    @property
    def likelihood(self) -> Likelihood:
        return self.model.likelihood


class SitePosterior(FittedPosterior):
    """A fitted full GP: predictions, samples and the (approximate) log marginal likelihood.

    Immutable; returned by :func:`augmentedgp.fit` and ``GP.posterior``. ``L`` is the
    Cholesky factor of the system matrix B = I + S K S; where a Laplace approximation
    has negative site precisions (a likelihood that is not log-concave), ``prior_factor``
    holds Lk = chol(K), ``L`` is chol(I + Lk^T W Lk) and ``sqrt_tau`` is sqrt|W|
    (:class:`~augmentedgp.models.approximations.WhitenedFactors`). Either way
    log|L L^T| = log|K| - log|Sigma| and tr((L L^T)^-1) = tr(K^-1 Sigma).
    """

    model: eqx.Module
    X: jax.Array
    y: jax.Array
    sqrt_tau: jax.Array
    L: jax.Array
    alpha: jax.Array
    lml: jax.Array
    prior_factor: jax.Array | None = None
    history: object = eqx.field(static=True, default=None)

    def log_marginal_likelihood(self) -> float:
        """log p(y | X, theta): exact for regression, approximate for Laplace and EP."""
        return float(self.lml)

    def _check_new(self, Xnew):
        return jnp.asarray(check_X(Xnew, "Xnew", d=self.X.shape[1]))

    @limits
    def predict_f(self, Xnew: Float[ArrayLike, "n d"], full_cov: bool = False
                  ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        """Latent mean (n*,) and variance (n*,) -- or covariance (n*, n*) with full_cov."""
        # the arrays, not self: its static history would make every fit compile anew
        return self._moments(self._check_new(Xnew), full_cov)

    def _moments(self, Xnew, full_cov: bool = False):
        """predict_f without validation (traceable)."""
        if self.prior_factor is not None:
            return _predict_f_whitened(self.model, self.X, self.alpha, self.L, self.prior_factor,
                                       Xnew, full_cov)
        return _predict_f(self.model, self.X, self.alpha, self.L, self.sqrt_tau, Xnew, full_cov)


@eqx.filter_jit
def _predict_f(model, X, alpha, L, sqrt_tau, Xnew, full_cov: bool):
    Ksx = model.kernel(X, Xnew)
    mean = model.mean(Xnew) + Ksx.T @ alpha
    V = linalg.solve_lower(L, sqrt_tau[:, None] * Ksx)
    if full_cov:
        return mean, model.kernel(Xnew) - V.T @ V
    return mean, jnp.maximum(model.kernel.diag(Xnew) - jnp.sum(V**2, axis=0), 0.0)


@eqx.filter_jit
def _predict_f_whitened(model, X, alpha, L, Lk, Xnew, full_cov: bool):
    """V[f*] = k** - k*^T (K + W^-1)^-1 k* = k** - |Lk^-1 k*|^2 + |L^-1 Lk^-1 k*|^2."""
    Ksx = model.kernel(X, Xnew)
    mean = model.mean(Xnew) + Ksx.T @ alpha
    Vk = linalg.solve_lower(Lk, Ksx)
    Va = linalg.solve_lower(L, Vk)
    if full_cov:
        return mean, model.kernel(Xnew) - Vk.T @ Vk + Va.T @ Va
    return mean, jnp.maximum(model.kernel.diag(Xnew) - jnp.sum(Vk**2, axis=0)
                             + jnp.sum(Va**2, axis=0), 0.0)
