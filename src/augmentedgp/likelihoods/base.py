"""The likelihood protocol and helpers shared by the likelihood families."""

from __future__ import annotations

import abc
import functools
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import gammaln

from augmentedgp.augmentation.protocol import log_cosh_sqrt
from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.quadrature import gauss_hermite, log_gauss_hermite
from augmentedgp.core.validation import check_finite, check_positive, check_y

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def sqrt_floor(t):
    """sqrt(t), floored at 1e-150 so that its reciprocal stays finite."""
    return jnp.sqrt(jnp.maximum(t, 1e-300))


@functools.lru_cache(maxsize=1)
def laguerre_nodes(n: int = 64):
    return np.polynomial.laguerre.laggauss(n)  # for int_0^inf e^{-x} g(x) dx


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
    ``check_targets(y, name="y")``. Class attributes: ``support``, the set of targets y
    ("real", "positive", "unit", "binary", "counts" or "classes"), ``normalised``
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
    def log_prob(self, y, f):
        """log p(y | f), elementwise."""

    @abc.abstractmethod
    def conditional_mean(self, f):
        """E[y | f]."""

    @abc.abstractmethod
    def conditional_variance(self, f):
        """Var[y | f]."""

    def grad_log_prob(self, y, f):
        """d/df log p(y|f), elementwise."""
        return jax.vmap(jax.grad(self.log_prob, argnums=1))(y, f)

    def hess_log_prob(self, y, f):
        """d^2/df^2 log p(y|f), elementwise (the negative of W in Laplace)."""
        return jax.vmap(jax.grad(lambda yi, fi: self.grad_log_prob(yi[None], fi[None])[0], 1))(y, f)

    def check_targets(self, y, name: str = "y"):
        """Validated targets in the internal encoding (raises ValueError); by default
        finite real numbers."""
        return check_finite(y, name)

    def targets(self, y, n: int, name: str = "y"):
        """``check_targets`` of a numeric vector of n targets (an (n, 1) column is accepted)."""
        return self.check_targets(check_y(y, n, name), name)

    def predictive_log_prob(self, y, mean, var):
        """log int p(y|f) N(f | mean, var) df, elementwise (100-point Gauss-Hermite in log
        space: ~1e-12 relative for a likelihood as narrow as a third of the latent sd)."""
        return log_gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var)

    def variational_expectations(self, y, mean, var, n: int | None = None, key=None):
        """E_{N(f | mean, var)}[log p(y | f)], elementwise: the data term of the ELBO
        ([Hensman2015]). Gauss-Hermite with ``n`` nodes (None: the likelihood's default,
        20 here) unless a closed form exists; ``key`` seeds the likelihoods that use Monte
        Carlo (ignored by the others)."""
        n = 20 if n is None else n
        return gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var, n)

    def predict_y(self, mean, var, n: int | None = None):
        """Mean and variance of y when f ~ N(mean, var) (law of total variance,
        Gauss-Hermite with ``n`` nodes, None: 32; closed forms ignore ``n``)."""
        n = 32 if n is None else n
        ey = gauss_hermite(self.conditional_mean, mean, var, n)
        ey2 = gauss_hermite(lambda f: self.conditional_variance(f) + self.conditional_mean(f) ** 2,
                            mean, var, n)
        return ey, jnp.maximum(ey2 - ey**2, 0.0)


def scalar_positive(value, name: str) -> Parameter:
    """A positive scalar hyperparameter: a scalar-valued :class:`Parameter` as it is, or a
    finite real number > 0 as a trainable one (a ValueError naming ``name`` otherwise:
    arrays, booleans, strings, NaN, inf, values <= 0)."""
    if isinstance(value, Parameter):
        if jnp.ndim(value.value) != 0:
            raise ValueError(f"{name} must be a scalar Parameter, got shape "
                             f"{jnp.shape(value.value)}")
        return value
    return positive(check_positive(value, name), name)


def count_targets(y, name: str = "y", integer: bool = True) -> np.ndarray:
    """Non-negative integer counts (any non-negative values if not ``integer``), as floats."""
    arr = check_finite(y, name)
    if np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative counts, got minimum {arr.min()}")
    if integer and np.any(arr != np.round(arr)):
        bad = arr[arr != np.round(arr)]
        raise ValueError(f"{name} must hold integer counts, got non-integer values {bad[:6]}")
    return arr


@functools.lru_cache(maxsize=4)
def legendre_nodes(n: int):
    return np.polynomial.legendre.leggauss(n)  # for int_{-1}^{1} g(x) dx


_PANEL_Z = (-12.0, -8.0, -5.0, -3.0, -1.5, 0.0, 1.5, 3.0, 5.0, 8.0, 12.0)


def kinked_expectation(fn, mean, var, kinks, n: int = 20, log: bool = False):
    """E[fn(f)] for f ~ N(mean, var), elementwise, where fn is smooth except at ``kinks``
    (..., K): kinks, jumps or transitions narrower than the latent sd. Gauss-Legendre with
    ``n`` nodes on each panel of z = (f - mean) / sd between {0, +-1.5, +-3, +-5, +-8, +-12}
    (tail mass beyond 12: 1e-33) and the kinks inside that range, so that a kink is a panel
    end and the rule converges as for a smooth integrand. ``fn`` maps latent values
    (..., panels, n) to values of that shape. With ``log``: log E[exp(fn(f))], fn the log
    of a positive function (logsumexp: no underflow). var = 0 gives fn(mean)."""
    kinks = jnp.asarray(kinks, float)  # numpy broadcasting of mean, var and the kinks' y
    mean, var, _ = jnp.broadcast_arrays(jnp.asarray(mean, float), jnp.asarray(var, float),
                                        kinks[..., 0])
    kinks = jnp.broadcast_to(kinks, mean.shape + kinks.shape[-1:])
    pos = var > 0.0
    s = jnp.where(pos, jnp.sqrt(jnp.where(pos, var, 1.0)), 0.0)  # finite gradient at var = 0
    zk = jnp.where(pos[..., None], (kinks - mean[..., None]) / jnp.where(pos, s, 1.0)[..., None],
                   -12.0)
    grid = jnp.broadcast_to(jnp.asarray(_PANEL_Z), mean.shape + (len(_PANEL_Z),))
    z = jnp.sort(jnp.concatenate([grid, jnp.clip(zk, -12.0, 12.0)], -1), -1)
    x, w = legendre_nodes(n)
    half = 0.5 * (z[..., 1:] - z[..., :-1])
    zz = 0.5 * (z[..., 1:] + z[..., :-1])[..., None] + half[..., None] * x  # (..., P, n)
    f = mean[..., None, None] + s[..., None, None] * zz
    # the panel widths enter linearly, not through their log: a panel of width 0 (a kink on
    # a grid point, or two clipped to +-12) then has a finite derivative in its width, the
    # one that cancels its neighbour's as a kink moves with the mean (log 0 made it NaN)
    width = w * half[..., None]
    log_density = -0.5 * zz**2 - 0.5 * _LOG_2PI
    if log:  # log sum width e^(fn + log density), shifted by its largest term
        a = fn(f) + log_density
        top = lax.stop_gradient(jnp.max(a, axis=(-2, -1), keepdims=True))
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        total = jnp.sum(width * jnp.exp(a - top), axis=(-2, -1))
        return jnp.log(total) + top[..., 0, 0]
    return jnp.sum(fn(f) * width * jnp.exp(log_density), axis=(-2, -1))


def log_inv_gamma(w, shape, scale):
    """log density of InvGamma(shape, scale) at w > 0 (Laplace transform
    2 (scale t)^{shape/2} K_shape(2 sqrt(scale t)) / Gamma(shape))."""
    return (shape * jnp.log(scale) - gammaln(shape) - (shape + 1.0) * jnp.log(w) - scale / w)


def log_gamma_density(w, shape, rate):
    """log density of Gamma(shape, rate) at w > 0 (Laplace transform (1 + t / rate)^-shape)."""
    return shape * jnp.log(rate) - gammaln(shape) + (shape - 1.0) * jnp.log(w) - rate * w


def uniform_nodes(lo, hi, n: int):
    """n equispaced nodes on [lo, hi] (broadcast, nodes on a new last axis) and the step.
    Full weights at the ends: the integrands using this are negligible there."""
    lo, hi = jnp.broadcast_arrays(jnp.asarray(lo, float), jnp.asarray(hi, float))
    h = (hi - lo) / (n - 1)
    return lo[..., None] + h[..., None] * jnp.arange(n), h



@functools.lru_cache(maxsize=8)
def qmc_normal(n_samples: int, dim: int) -> np.ndarray:
    """(n_samples, dim) scrambled-Sobol standard normal points (fixed seed): quasi-Monte
    Carlo error ~ 1 / n_samples for smooth integrands (Owen 1998)."""
    import warnings

    from scipy.stats import norm, qmc

    with warnings.catch_warnings():  # balance is exact only for powers of 2; fine for any n
        warnings.simplefilter("ignore", UserWarning)
        u = qmc.Sobol(dim, scramble=True, seed=0).random(n_samples)
    return norm.ppf(np.clip(u, 1e-12, 1.0 - 1e-12))


def mc_expectation(fn, mean, var, n_samples, key=None):
    """E[fn(f_i)] for f_i ~ N(mean_i, diag var_i), per row i; ``fn`` maps (..., C) latent
    vectors to (...) or (..., K). With a key: independent pseudo-random draws for every row
    (unbiased stochastic gradients); without: the same quasi-Monte Carlo points for every
    row, rows taken in batches to bound memory."""
    if key is not None:
        eps = jax.random.normal(key, (mean.shape[0], n_samples, mean.shape[-1]), mean.dtype)
        return jnp.mean(fn(mean[:, None, :] + jnp.sqrt(var)[:, None, :] * eps), axis=1)
    eps = jnp.asarray(qmc_normal(n_samples, mean.shape[-1]), mean.dtype)
    row = lambda mv: jnp.mean(fn(mv[0] + jnp.sqrt(mv[1]) * eps), axis=0)
    return lax.map(row, (mean, var), batch_size=32)


def log_2cosh_half(c2):
    """log(2 cosh(c / 2)) from c^2."""
    return _LOG_2 + log_cosh_sqrt(c2)


class MultiLatent(Likelihood):
    """A likelihood of ``num_latent`` latent functions: f and the marginals mean, var are
    (n, C) arrays. Subclasses give ``num_latent`` besides the methods of
    :class:`Likelihood`; they have no derivatives in f (no Laplace or EP)."""

    @property
    @abc.abstractmethod
    def num_latent(self) -> int:
        """The number C of latent functions."""

    def grad_log_prob(self, y, f):
        """Not available: raises TypeError (several latent functions)."""
        raise TypeError(f"{type(self).__name__} has several latent functions: use SVGP or "
                        "VGP, not the Laplace or EP approximations")

    def hess_log_prob(self, y, f):
        """Not available: raises TypeError (several latent functions)."""
        return self.grad_log_prob(y, f)


def check_samples(num_samples, predict_samples):
    for name, v in (("num_samples", num_samples), ("predict_samples", predict_samples)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(num_samples), int(predict_samples)
