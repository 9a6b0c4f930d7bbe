"""Quantiles of the predictive distribution of y when f ~ N(mean, var): the host-side
(numpy and scipy) numerics behind ``Likelihood.predictive_quantile``.

- :func:`noise_quantile`: y = f + e with continuous noise e. The predictive CDF
  P(f + e <= t) is integrated over whichever of q(f) and the noise is the wider
  (Gauss-Hermite over f of the noise CDF, or Gauss-Legendre over the noise's quantiles of
  the normal CDF), then inverted by bisection.
- :func:`count_quantile`: counts; the smallest count whose predictive CDF (Gauss-Hermite
  over f) reaches the level, by bisection over the integers.

scipy.stats is imported inside the functions (it is slow to import).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from augmentedgp.core.quadrature import gauss_legendre, hermite_nodes
from augmentedgp.core.validation import check_finite

HERMITE_NODES = 40  # Gauss-Hermite nodes over f
LEGENDRE_NODES = 200  # Gauss-Legendre nodes over the noise's quantile levels
BISECTIONS = 80  # halvings of the bracket of a continuous quantile


def check_levels(quantiles, name: str = "quantiles") -> np.ndarray:
    """``quantiles`` as a 1-d float array of levels strictly inside (0, 1) (a ValueError
    naming ``name`` otherwise)."""
    q = np.atleast_1d(check_finite(quantiles, name))
    if q.ndim != 1 or not np.all((q > 0) & (q < 1)):
        raise ValueError(f"{name} must lie strictly inside (0, 1), got {quantiles!r}")
    return q


def check_level(level) -> float:
    """One level strictly inside (0, 1), as a float (a ValueError otherwise)."""
    if np.ndim(level) != 0:
        raise ValueError(f"level must be one number strictly inside (0, 1), got {level!r}")
    return float(check_levels(level, "level")[0])


def _moments(mean, var):
    return np.asarray(mean, np.float64), np.maximum(np.asarray(var, np.float64), 0.0)


def noise_quantile(noise, mean, var, level: float) -> np.ndarray:
    """The ``level`` quantile of y = f + e, f ~ N(mean, var) elementwise, e ~ ``noise`` (a
    frozen scipy.stats continuous distribution, independent of f).

    Where the noise's robust scale (interquartile range / 1.349) is at least sd(f), the CDF
    is sum_k w_k F_e(t - f_k) over :data:`HERMITE_NODES` Gauss-Hermite nodes f_k; elsewhere
    it is int_0^1 Phi((t - F_e^-1(p) - mean) / sd) dp by :data:`LEGENDRE_NODES`-point
    Gauss-Legendre. Each node's own quantile brackets the mixture's; :data:`BISECTIONS`
    halvings of that bracket give the returned midpoint."""
    import scipy.stats

    level = check_level(level)
    mean, var = _moments(mean, var)
    sd = np.sqrt(var)
    x, w = hermite_nodes(HERMITE_NODES)
    f = mean[:, None] + sd[:, None] * x  # E_{N(m, v)}[g(f)] = sum_k w_k g(m + sd x_k)
    p, wp = gauss_legendre(LEGENDRE_NODES, 0.0, 1.0)
    e = noise.ppf(p)  # E[g(e)] = int_0^1 g(F^-1(p)) dp
    wide_noise = (noise.ppf(0.75) - noise.ppf(0.25)) / 1.349 >= sd  # robust scales
    scale = np.where(wide_noise, 1.0, sd)[:, None]

    def cdf(t):
        return np.where(wide_noise, np.sum(w * noise.cdf(t[:, None] - f), axis=1),
                        np.sum(wp * scipy.stats.norm.cdf((t[:, None] - e - mean[:, None])
                                                         / scale), axis=1))

    lo, hi = f.min(1) + noise.ppf(level), f.max(1) + noise.ppf(level)
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < level
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def count_quantile(conditional: Callable, mean, var, level: float) -> np.ndarray:
    """The ``level`` quantile of counts y, f ~ N(mean, var) elementwise: the smallest
    count k with sum_j w_j P(y <= k | f_j) >= level over :data:`HERMITE_NODES`
    Gauss-Hermite nodes f_j. ``conditional(f)``: the frozen scipy.stats discrete
    distribution of y given f, for an (n, nodes) array f. The nodes' own quantiles bracket
    the mixture's; bisection over the integers narrows the bracket to one count."""
    level = check_level(level)
    mean, var = _moments(mean, var)
    x, w = hermite_nodes(HERMITE_NODES)
    dist = conditional(mean[:, None] + np.sqrt(var)[:, None] * x)
    node_q = dist.ppf(level)  # the smallest count whose CDF reaches the level, per node
    lo, hi = node_q.min(1) - 1, node_q.max(1)  # CDF(lo) < level <= CDF(hi)
    while np.any(hi - lo > 1):
        mid = np.floor(0.5 * (lo + hi))
        below = np.sum(w * dist.cdf(mid[:, None]), axis=1) < level
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return hi
