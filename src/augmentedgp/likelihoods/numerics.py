"""Numerics shared by the likelihood families: the Laplace transforms phi and mixing
densities p(w) of the scale mixtures, and the Polya-Gamma normaliser log(2 cosh(c / 2))."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from augmentedgp.augmentation.protocol import log_cosh_sqrt

_LOG_2 = math.log(2.0)


def sqrt_floor(t) -> jax.Array:
    """sqrt(t), floored at 1e-150 so that its reciprocal stays finite."""
    return jnp.sqrt(jnp.maximum(t, 1e-300))


def log_inv_gamma(w, shape, scale) -> jax.Array:
    """log density of InvGamma(shape, scale) at w > 0 (Laplace transform
    2 (scale t)^{shape/2} K_shape(2 sqrt(scale t)) / Gamma(shape))."""
    return (shape * jnp.log(scale) - gammaln(shape) - (shape + 1.0) * jnp.log(w) - scale / w)


def log_gamma_density(w, shape, rate) -> jax.Array:
    """log density of Gamma(shape, rate) at w > 0 (Laplace transform (1 + t / rate)^-shape)."""
    return shape * jnp.log(rate) - gammaln(shape) + (shape - 1.0) * jnp.log(w) - rate * w


def log_gamma_half_ratio(nu) -> jax.Array:
    """log Gamma((nu + 1) / 2) - log Gamma(nu / 2), the Student-t normaliser. For x = nu / 2
    >= 100 by its asymptotic series 1/2 log x - 1/(8x) + 1/(192x^3) + 1/(640x^5)
    - 17/(14336x^7) (error below 4e-13 there, by mpmath): the difference of the two
    gammaln values loses |log Gamma(x)| * 1e-16 (2.7e-6 at df = 1e9)."""
    x = 0.5 * nu
    big = x >= 100.0
    xb = jnp.where(big, x, 100.0)
    series = (0.5 * jnp.log(xb) - 1.0 / (8.0 * xb) + 1.0 / (192.0 * xb**3)
              + 1.0 / (640.0 * xb**5) - 17.0 / (14336.0 * xb**7))
    xs = jnp.where(big, 1.0, x)
    return jnp.where(big, series, gammaln(xs + 0.5) - gammaln(xs))


def log_2cosh_half(c2) -> jax.Array:
    """log(2 cosh(c / 2)) from c^2."""
    return _LOG_2 + log_cosh_sqrt(c2)
