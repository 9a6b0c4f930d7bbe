"""Gauss-Hermite quadrature of expectations under univariate Gaussians."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.stats
import numpy as np
from jax import lax


@functools.lru_cache(maxsize=16)
def hermite_nodes(n: int):
    x, w = np.polynomial.hermite.hermgauss(n)  # for int exp(-x^2) g(x) dx
    return x * math.sqrt(2.0), w / math.sqrt(math.pi)  # for E_{N(0,1)}[g]


@jax.custom_jvp
def _sd(var):
    """sqrt(var), whose derivative at var = 0 is taken as 0 instead of inf: a variance
    clamped at 0 (the residual variance of a sparse GP at an inducing input) then passes a
    zero gradient, not 0 * inf = NaN, through the quadrature nodes."""
    return jnp.sqrt(var)


@_sd.defjvp
def _sd_jvp(primals, tangents):
    sd = jnp.sqrt(primals[0])
    positive = sd > 0.0
    return sd, jnp.where(positive, 0.5 / jnp.where(positive, sd, 1.0), 0.0) * tangents[0]


def gauss_hermite(fn, mean, var, n: int = 32):
    """E[fn(f)] for f ~ N(mean, var), elementwise over broadcast mean/var.

    ``fn`` maps an array of latent values (..., n) to values of the same shape.
    """
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + _sd(jnp.asarray(var, float))[..., None] * x
    return jnp.sum(fn(f) * w, axis=-1)


def log_gauss_hermite(log_fn, mean, var, n: int = 100):
    """log E[exp(log_fn(f))] for f ~ N(mean, var), computed with logsumexp (no underflow)."""
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + _sd(jnp.asarray(var, float))[..., None] * x
    return jax.scipy.special.logsumexp(log_fn(f) + jnp.log(w), axis=-1)


def adaptive_log_gauss_hermite(h, dh, lo, hi, n: int = 100):
    """log int exp(h(f)) df, elementwise, for h unimodal with its mode in [lo, hi] (dh
    positive at lo, negative at hi): the mode f* by 80 bisections of dh, then Gauss-Hermite
    (``n`` nodes, in log space) on N(f*, -1 / h''(f*)) (h'' by autodiff of dh) -- the
    adaptive Gauss-Hermite rule (Liu & Pierce 1994): its nodes follow the integrand, so a
    mode thousands of latent standard deviations from the latent mean does not underflow.
    ``h`` maps (..., n) node arrays, ``dh`` (...) arrays, elementwise."""
    def step(_, bracket):
        a, b = bracket
        mid = 0.5 * (a + b)
        up = dh(mid) > 0.0
        return jnp.where(up, mid, a), jnp.where(up, b, mid)

    a, b = lax.fori_loop(0, 80, step, (lo, hi))
    mode = 0.5 * (a + b)
    curv = jax.grad(lambda f: jnp.sum(dh(f)))(mode)
    s2 = jnp.where(curv < 0.0, -1.0 / jnp.where(curv < 0.0, curv, -1.0), 1.0)
    m, sd = mode[..., None], jnp.sqrt(s2)[..., None]
    return log_gauss_hermite(lambda f: h(f) - jax.scipy.stats.norm.logpdf(f, m, sd), mode, s2, n)


def panel_log_gauss_legendre(log_fn, breakpoints, n: int = 32):
    """log int exp(log_fn(x)) dx over [min, max] of ``breakpoints``, elementwise: Gauss-Legendre
    with ``n`` nodes on each panel between consecutive sorted breakpoints, in log space
    (empty panels weigh nothing). ``breakpoints`` (..., k); ``log_fn`` maps (..., m) node
    arrays. Breakpoints placed around each feature of the integrand (its bulk, a bump, a
    transition) give every feature panels of its own size."""
    x, w = np.polynomial.legendre.leggauss(n)
    bp = jnp.sort(jnp.asarray(breakpoints, float), axis=-1)
    lo, hi = bp[..., :-1, None], bp[..., 1:, None]  # (..., k-1, 1)
    half = 0.5 * (hi - lo)
    nodes = (0.5 * (lo + hi) + half * x).reshape(*bp.shape[:-1], -1)
    log_w = (jnp.log(jnp.where(half > 0.0, half, 1.0)) + np.log(w)
             + jnp.where(half > 0.0, 0.0, -jnp.inf)).reshape(nodes.shape)
    return jax.scipy.special.logsumexp(log_fn(nodes) + log_w, axis=-1)
