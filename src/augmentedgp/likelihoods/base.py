"""The likelihood protocol: the abstract base classes :class:`Likelihood` (one latent
function) and :class:`MultiLatent` (several). The numerics the families share live below
this layer: quadrature in :mod:`augmentedgp.core.quadrature`, target and argument checks in
:mod:`augmentedgp.core.validation`, :func:`~augmentedgp.core.params.scalar_positive` in
:mod:`augmentedgp.core.params`, and the mixing densities of the scale mixtures in
:mod:`augmentedgp.likelihoods.numerics`."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.quadrature import gauss_hermite, log_gauss_hermite
from augmentedgp.core.validation import check_finite, check_y


class Likelihood(eqx.Module):
    """The likelihood protocol: an observation model p(y | f), elementwise over the
    observations.

    A new likelihood subclasses this class and gives its three abstract methods:

    - ``log_prob(y, f)``: log p(y | f), elementwise (f is (n, C) with ``num_latent`` C > 1);
    - ``conditional_mean(f)`` and ``conditional_variance(f)``: E[y | f] and Var[y | f] (for
      binary labels, of the indicator of y = +1; for class labels, of the indicators of the
      classes, (n, C)).

    The other methods have generic implementations (autodiff for the derivatives,
    Gauss-Hermite for the expectations) that a subclass may override with closed forms,
    keeping their signatures: ``grad_log_prob(y, f)``, ``hess_log_prob(y, f)``,
    ``variational_expectations(y, mean, var, n=None, key=None)``,
    ``predictive_log_prob(y, mean, var)``, ``predict_y(mean, var, n=None)`` and
    ``check_targets(y, name="y")``; ``predictive_quantile(mean, var, level)`` (host-side)
    has no generic form. Class attributes: ``support``, the set of targets y ("real",
    "positive", "unit", "binary", "counts" or "classes"), ``normalised``
    (False for a pseudo-likelihood whose p(y | f) does not sum to 1 over y) and
    ``twice_differentiable`` (False where log p(y | f) has a kink in f, so that its
    curvature is zero almost everywhere: the Laplace approximation refuses it) and
    ``log_concave`` (True where log p(y | f) is concave in f for every y, so that the
    Laplace approximation's W = -d^2 log p / df^2 is never negative and it compiles only
    its Cholesky form; False, the default, is always correct).

    A conditionally conjugate likelihood subclasses
    :class:`~augmentedgp.augmentation.Augmented` as well.
    :func:`augmentedgp.testing.check_likelihood` checks a likelihood against numerical
    integration and autodiff.
    """

    support: ClassVar[str] = "real"
    normalised: ClassVar[bool] = True
    twice_differentiable: ClassVar[bool] = True
    log_concave: ClassVar[bool] = False

    @property
    def num_latent(self) -> int:
        """The number of latent functions f (1; several for :class:`MultiLatent`)."""
        return 1

    @abc.abstractmethod
    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                 ) -> Float[Array, "*batch"]:
        """log p(y | f), elementwise."""

    @abc.abstractmethod
    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        """E[y | f]."""

    @abc.abstractmethod
    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        """Var[y | f]."""

    def grad_log_prob(self, y: Shaped[Array, " n"], f: Float[Array, " n"]
                      ) -> Float[Array, " n"]:
        """d/df log p(y|f), elementwise."""
        return jax.vmap(jax.grad(self.log_prob, argnums=1))(y, f)

    def hess_log_prob(self, y: Shaped[Array, " n"], f: Float[Array, " n"]
                      ) -> Float[Array, " n"]:
        """d^2/df^2 log p(y|f), elementwise (the negative of W in Laplace)."""
        return jax.vmap(jax.grad(lambda yi, fi: self.grad_log_prob(yi[None], fi[None])[0], 1))(y, f)

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        """Validated targets in the internal encoding (raises ValueError); by default
        finite real numbers."""
        return check_finite(y, name)

    def targets(self, y: ArrayLike, n: int, name: str = "y") -> Shaped[ArrayLike, " n"]:
        """``check_targets`` of a numeric vector of n targets (an (n, 1) column is accepted)."""
        return self.check_targets(check_y(y, n, name), name)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n *C"],
                            var: Float[Array, " n *C"]) -> Float[Array, " n"]:
        """log int p(y|f) N(f | mean, var) df, elementwise (100-point Gauss-Hermite in log
        space: ~1e-12 relative for a likelihood as narrow as a third of the latent sd)."""
        return log_gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var)

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n *C"],
                                 var: Float[Array, " n *C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """E_{N(f | mean, var)}[log p(y | f)], elementwise: the data term of the ELBO
        ([Hensman2015]). Gauss-Hermite with ``n`` nodes (None: the likelihood's default,
        20 here) unless a closed form exists; ``key`` seeds the likelihoods that use Monte
        Carlo (ignored by the others)."""
        n = 20 if n is None else n
        return gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var, n)

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                  ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """Mean and variance of y when f ~ N(mean, var) (law of total variance,
        Gauss-Hermite with ``n`` nodes, None: 32; closed forms ignore ``n``)."""
        n = 32 if n is None else n
        ey = gauss_hermite(self.conditional_mean, mean, var, n)
        ey2 = gauss_hermite(lambda f: self.conditional_variance(f) + self.conditional_mean(f) ** 2,
                            mean, var, n)
        return ey, jnp.maximum(ey2 - ey**2, 0.0)

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y when f ~ N(mean, var), elementwise (numpy in and
        out, computed on the host). Implemented by Gaussian (closed form), StudentT and
        Laplace (:func:`~augmentedgp.likelihoods.quantiles.noise_quantile`), Poisson and
        NegativeBinomial (:func:`~augmentedgp.likelihoods.quantiles.count_quantile`); a
        NotImplementedError here."""
        raise NotImplementedError(
            f"{type(self).__name__} has no predictive quantiles (implemented for Gaussian, "
            "StudentT, Laplace, Poisson and NegativeBinomial)")


class MultiLatent(Likelihood):
    """A likelihood of ``num_latent`` latent functions: f and the marginals mean, var are
    (n, C) arrays. Subclasses give ``num_latent`` besides the methods of
    :class:`Likelihood`; they have no derivatives in f (no Laplace or EP)."""

    @property
    @abc.abstractmethod
    def num_latent(self) -> int:
        """The number C of latent functions."""

    def grad_log_prob(self, y: Shaped[Array, " n"], f: Float[Array, " n C"]) -> Array:
        """Not available: raises TypeError (several latent functions)."""
        raise TypeError(f"{type(self).__name__} has several latent functions: use SVGP or "
                        "VGP, not the Laplace or EP approximations")

    def hess_log_prob(self, y: Shaped[Array, " n"], f: Float[Array, " n C"]) -> Array:
        """Not available: raises TypeError (several latent functions)."""
        return self.grad_log_prob(y, f)

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """Not available: raises TypeError (y depends on several latent functions)."""
        raise TypeError(f"{type(self).__name__} has several latent functions: its predictive "
                        "quantiles are not implemented")


# names this module used to define, and where they live now (old imports keep working)
_MOVED = {
    "kinked_expectation": ("augmentedgp.core.quadrature", "kinked_expectation"),
    "legendre_nodes": ("augmentedgp.core.quadrature", "legendre_nodes"),
    "laguerre_nodes": ("augmentedgp.core.quadrature", "laguerre_nodes"),
    "uniform_nodes": ("augmentedgp.core.quadrature", "uniform_nodes"),
    "qmc_normal": ("augmentedgp.core.quadrature", "qmc_normal"),
    "mc_expectation": ("augmentedgp.core.quadrature", "mc_expectation"),
    "count_targets": ("augmentedgp.core.validation", "check_counts"),
    "scalar_positive": ("augmentedgp.core.params", "scalar_positive"),
    "sqrt_floor": ("augmentedgp.likelihoods.numerics", "sqrt_floor"),
    "log_inv_gamma": ("augmentedgp.likelihoods.numerics", "log_inv_gamma"),
    "log_gamma_density": ("augmentedgp.likelihoods.numerics", "log_gamma_density"),
    "log_2cosh_half": ("augmentedgp.likelihoods.numerics", "log_2cosh_half"),
}


def __getattr__(name: str):
    """The helpers that moved out of this module, with a DeprecationWarning naming their new
    home."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    module, new = _MOVED[name]
    warnings.warn(f"augmentedgp.likelihoods.base.{name} moved to {module}.{new}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), new)
