"""Gauss-Hermite quadrature of expectations under univariate Gaussians."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=16)
def hermite_nodes(n: int):
    x, w = np.polynomial.hermite.hermgauss(n)  # for int exp(-x^2) g(x) dx
    return x * math.sqrt(2.0), w / math.sqrt(math.pi)  # for E_{N(0,1)}[g]


def gauss_hermite(fn, mean, var, n: int = 32):
    """E[fn(f)] for f ~ N(mean, var), elementwise over broadcast mean/var.

    ``fn`` maps an array of latent values (..., n) to values of the same shape.
    """
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + jnp.sqrt(jnp.asarray(var))[..., None] * x
    return jnp.sum(fn(f) * w, axis=-1)


def log_gauss_hermite(log_fn, mean, var, n: int = 100):
    """log E[exp(log_fn(f))] for f ~ N(mean, var), computed with logsumexp (no underflow)."""
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + jnp.sqrt(jnp.asarray(var))[..., None] * x
    return jax.scipy.special.logsumexp(log_fn(f) + jnp.log(w), axis=-1)
