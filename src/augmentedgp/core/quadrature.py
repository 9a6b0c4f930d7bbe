"""Every quadrature rule of the package, in one place.

- Gauss-Hermite expectations under univariate Gaussians (:func:`hermite_nodes`, cached;
  :func:`gauss_hermite`, :func:`log_gauss_hermite`) and the adaptive rule around the mode
  of the integrand (:func:`adaptive_log_gauss_hermite`, Liu & Pierce 1994);
- Gauss-Legendre: the nodes (:func:`legendre_nodes`, cached), the rule on an interval
  (:func:`gauss_legendre`), on panels between breakpoints (:func:`panel_log_gauss_legendre`)
  and on panels of a Gaussian split at the kinks of the integrand
  (:func:`kinked_expectation`);
- Gauss-Laguerre nodes for int_0^inf e^{-x} g(x) dx (:func:`laguerre_nodes`, cached);
- the equispaced (trapezoid) rule (:func:`uniform_nodes`);
- the Euler algorithm's trapezoid rule on the Bromwich contour for the inverse Laplace
  transform (:func:`euler_inversion_rule`, [Abate2000]);
- Monte Carlo and quasi-Monte Carlo expectations under diagonal Gaussians
  (:func:`qmc_normal`, cached; :func:`mc_expectation`).

The node tables are numpy arrays computed once per size (``functools.lru_cache``): callers
must not modify them in place.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.stats
import numpy as np
from jax import lax

_LOG_2PI = math.log(2.0 * math.pi)


# --- Gauss-Hermite -----------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def hermite_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes x and weights w of the ``n``-point Gauss-Hermite rule for a standard normal:
    E_{N(0, 1)}[g] ~ sum_k w_k g(x_k) (``numpy.polynomial.hermite.hermgauss``, rescaled from
    the weight e^{-x^2}; exact for polynomials of degree < 2n). Cached per ``n``."""
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


def gauss_hermite(fn: Callable, mean, var, n: int = 32) -> jax.Array:
    """E[fn(f)] for f ~ N(mean, var), elementwise over broadcast mean/var (``n``-point
    Gauss-Hermite, :func:`hermite_nodes`).

    ``fn`` maps an array of latent values (..., n) to values of the same shape.
    """
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + _sd(jnp.asarray(var, float))[..., None] * x
    return jnp.sum(fn(f) * w, axis=-1)


def log_gauss_hermite(log_fn: Callable, mean, var, n: int = 100) -> jax.Array:
    """log E[exp(log_fn(f))] for f ~ N(mean, var), computed with logsumexp (no underflow)."""
    x, w = hermite_nodes(n)
    f = jnp.asarray(mean)[..., None] + _sd(jnp.asarray(var, float))[..., None] * x
    return jax.scipy.special.logsumexp(log_fn(f) + jnp.log(w), axis=-1)


def adaptive_log_gauss_hermite(h: Callable, dh: Callable, lo, hi, n: int = 100) -> jax.Array:
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


# --- Gauss-Legendre ----------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def legendre_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the ``n``-point Gauss-Legendre rule for int_{-1}^{1} g(x) dx
    (``numpy.polynomial.legendre.leggauss``; exact for polynomials of degree < 2n). Cached
    per ``n``."""
    return np.polynomial.legendre.leggauss(n)


def gauss_legendre(n: int, lo: float = -1.0, hi: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the ``n``-point Gauss-Legendre rule on [lo, hi] (scalars):
    int_lo^hi g(x) dx ~ sum_k w_k g(x_k), the weights summing to hi - lo. On [0, 1] it
    gives E[g(e)] = int_0^1 g(F^-1(p)) dp ~ sum_k w_k g(F^-1(p_k)) for any law F (its
    quantile function at the nodes). numpy arrays (n,)."""
    t, w = legendre_nodes(int(n))
    half = 0.5 * (hi - lo)
    return half * t + 0.5 * (hi + lo), half * w


def panel_log_gauss_legendre(log_fn: Callable, breakpoints, n: int = 32) -> jax.Array:
    """log int exp(log_fn(x)) dx over [min, max] of ``breakpoints``, elementwise: Gauss-Legendre
    with ``n`` nodes on each panel between consecutive sorted breakpoints, in log space
    (empty panels weigh nothing). ``breakpoints`` (..., k); ``log_fn`` maps (..., m) node
    arrays. Breakpoints placed around each feature of the integrand (its bulk, a bump, a
    transition) give every feature panels of its own size."""
    x, w = legendre_nodes(n)
    bp = jnp.sort(jnp.asarray(breakpoints, float), axis=-1)
    lo, hi = bp[..., :-1, None], bp[..., 1:, None]  # (..., k-1, 1)
    half = 0.5 * (hi - lo)
    nodes = (0.5 * (lo + hi) + half * x).reshape(*bp.shape[:-1], -1)
    log_w = (jnp.log(jnp.where(half > 0.0, half, 1.0)) + np.log(w)
             + jnp.where(half > 0.0, 0.0, -jnp.inf)).reshape(nodes.shape)
    return jax.scipy.special.logsumexp(log_fn(nodes) + log_w, axis=-1)


#: The fixed panel ends of :func:`kinked_expectation`, in standard deviations z.
PANEL_Z = (-12.0, -8.0, -5.0, -3.0, -1.5, 0.0, 1.5, 3.0, 5.0, 8.0, 12.0)


def kinked_expectation(fn: Callable, mean, var, kinks, n: int = 20,
                       log: bool = False) -> jax.Array:
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
    grid = jnp.broadcast_to(jnp.asarray(PANEL_Z), mean.shape + (len(PANEL_Z),))
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


# --- Gauss-Laguerre ----------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def laguerre_nodes(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the ``n``-point Gauss-Laguerre rule for
    int_0^inf e^{-x} g(x) dx (``numpy.polynomial.laguerre.laggauss``; exact for polynomials
    of degree < 2n). Cached (the last ``n``)."""
    return np.polynomial.laguerre.laggauss(n)


# --- equispaced (trapezoid) rule ---------------------------------------------------------


def uniform_nodes(lo, hi, n: int) -> tuple[jax.Array, jax.Array]:
    """n equispaced nodes on [lo, hi] (broadcast, nodes on a new last axis) and the step h:
    int_lo^hi g ~ h sum_k g(t_k). Full weights at the ends: the integrands using this are
    negligible there (the trapezoid rule then converges geometrically for integrands
    analytic in a strip, Trefethen & Weideman 2014)."""
    lo, hi = jnp.broadcast_arrays(jnp.asarray(lo, float), jnp.asarray(hi, float))
    h = (hi - lo) / (n - 1)
    return lo[..., None] + h[..., None] * jnp.arange(n), h


# --- inverse Laplace transform -----------------------------------------------------------


def euler_inversion_rule(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The Euler algorithm of [Abate2000] for the inverse Laplace transform, as a rule:
    f(x) ~ e^{A/2} / x sum_k w_k Re F((A + 2 i b_k) / (2x)) for the returned signed
    weights w (k = 0..n+m) and b_k = pi k. The trapezoid rule on the Bromwich contour
    Re s = A / (2x) (half weight on the real point), its alternating tail summed by Euler
    (binomial) averaging of the partial sums s_n..s_{n+m}: the weight of term k is
    P(Binomial(m, 1/2) >= k - n). numpy arrays (n + m + 1,)."""
    k = np.arange(n + m + 1)
    tail = np.array([sum(math.comb(m, i) for i in range(j, m + 1))  # no scipy on import
                     for j in range(m + 1)]) / 2.0**m
    w = np.where(k <= n, 1.0, tail[np.clip(k - n, 0, m)])
    w[0] *= 0.5  # the trapezoid's half weight on the real point
    signs = np.where(k % 2 == 0, 1.0, -1.0)
    return w * signs, math.pi * k


# --- Monte Carlo and quasi-Monte Carlo ---------------------------------------------------


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


def mc_expectation(fn: Callable, mean, var, n_samples: int, key=None) -> jax.Array:
    """E[fn(f_i)] for f_i ~ N(mean_i, diag var_i), per row i; ``fn`` maps (..., C) latent
    vectors to (...) or (..., K). With a key: independent pseudo-random draws for every row
    (unbiased stochastic gradients); without: the same quasi-Monte Carlo points
    (:func:`qmc_normal`) for every row, rows taken in batches to bound memory."""
    if key is not None:
        eps = jax.random.normal(key, (mean.shape[0], n_samples, mean.shape[-1]), mean.dtype)
        return jnp.mean(fn(mean[:, None, :] + jnp.sqrt(var)[:, None, :] * eps), axis=1)
    eps = jnp.asarray(qmc_normal(n_samples, mean.shape[-1]), mean.dtype)
    row = lambda mv: jnp.mean(fn(mv[0] + jnp.sqrt(mv[1]) * eps), axis=0)
    return lax.map(row, (mean, var), batch_size=32)
