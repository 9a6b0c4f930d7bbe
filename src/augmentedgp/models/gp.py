"""Full (non-sparse) GP models."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from augmentedgp.core import linalg
from augmentedgp.core.errors import NotPositiveDefiniteError
from augmentedgp.core.linalg import site_factors
from augmentedgp.core.loop import History
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import check_X
from augmentedgp.kernels.covariance import Kernel
from augmentedgp.kernels.means import Mean, Zero
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.robust import Gaussian
from augmentedgp.models.approximations import EP, Exact, Laplace, whitened_factors
from augmentedgp.models.sites import SitePosterior


class GP(eqx.Module):
    """f ~ GP(mean, kernel), y_i ~ likelihood(f(x_i)).

    With the default Gaussian likelihood (``noise`` is its variance, one positive number)
    inference is exact;
    with a binary likelihood use ``Laplace()`` (default) or ``EP()`` (probit).
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean

    def __init__(self, kernel: Kernel, likelihood: Likelihood | None = None, *,
                 mean: Mean | None = None, noise=None):
        if not isinstance(kernel, Kernel):
            raise ValueError(f"kernel must be an augmentedgp kernel, got {type(kernel).__name__}")
        if likelihood is not None and noise is not None:
            raise ValueError("give either likelihood or noise (the Gaussian noise variance), "
                             "not both")
        if likelihood is None:
            likelihood = Gaussian(1.0 if noise is None else noise)
        if not isinstance(likelihood, Likelihood):
            raise ValueError(f"likelihood must be an augmentedgp likelihood, got {likelihood!r}")
        if getattr(likelihood, "num_latent", 1) > 1:
            raise ValueError(f"{type(likelihood).__name__} has several latent functions: use "
                             "SVGP or VGP")
        self.kernel = kernel
        self.likelihood = likelihood
        self.mean = Zero() if mean is None else mean

    def default_inference(self) -> Exact | Laplace:
        return Exact() if isinstance(self.likelihood, Gaussian) else Laplace()

    def resolve_inference(self, inference: Exact | Laplace | EP | None = None
                         ) -> Exact | Laplace | EP:
        """The given inference method (or the default), checked against this model."""
        inference = inference or self.default_inference()
        inference.check(self)
        return inference

    def validate_data(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"]
                      ) -> tuple[Float[Array, "n d"], Shaped[Array, " n"]]:
        """(X, y) checked at the public boundary and as JAX arrays (a clear ValueError
        otherwise)."""
        X = check_X(X)
        y = self.likelihood.targets(y, X.shape[0])
        return jnp.asarray(X), jnp.asarray(y)

    @limits
    def log_marginal_likelihood(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                                inference: Exact | Laplace | EP | None = None) -> float:
        """log p(y | X) at the current hyperparameters (approximate for Laplace/EP)."""
        inference = self.resolve_inference(inference)
        X, y = self.validate_data(X, y)
        value = _lml(self, X, y, inference)
        if not jnp.isfinite(value):
            raise NotPositiveDefiniteError("kernel matrix")
        return float(value)

    @limits
    def posterior(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  inference: Exact | Laplace | EP | None = None,
                  history: History | None = None) -> SitePosterior:
        """Condition on data at the current hyperparameters (no optimisation)."""
        inference = self.resolve_inference(inference)
        X, y = self.validate_data(X, y)
        post = _posterior(self, X, y, inference)
        if post.prior_factor is not None:
            linalg.check_cholesky(post.prior_factor, "kernel matrix")
        linalg.check_cholesky(post.L, "posterior system matrix")
        if not bool(jnp.isfinite(post.lml)):
            raise NotPositiveDefiniteError("kernel matrix")
        return dataclasses.replace(post, history=history)


@eqx.filter_jit
def _lml(model, X, y, inference):
    return inference.log_marginal_likelihood(model, X, y)


def _posterior(model, X, y, inference):
    tau, nu, lml = _sites(model, X, y, inference)
    if bool(jnp.any(tau < 0.0)):  # a Laplace mode of a likelihood that is not log-concave
        Lk, L, alpha = _whitened(model, X, tau, nu)
        return SitePosterior(model, X, y, jnp.sqrt(jnp.abs(tau)), L, alpha, lml, Lk)
    s, L, alpha = _site_factors(model, X, tau, nu)
    return SitePosterior(model, X, y, s, L, alpha, lml)


@eqx.filter_jit
def _sites(model, X, y, inference):
    return inference.approximate(model, X, y)


@eqx.filter_jit
def _site_factors(model, X, tau, nu):
    return site_factors(model.kernel(X), tau, nu)


@eqx.filter_jit
def _whitened(model, X, tau, nu):
    return whitened_factors(model.kernel(X), tau, nu)


__all__ = ["GP", "Exact", "Laplace", "EP"]
