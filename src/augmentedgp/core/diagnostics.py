"""MCMC convergence diagnostics: autocorrelation, rank-normalised split-R-hat, bulk and tail ESS.

Every function takes ``draws`` of shape ``(n_chains, n_draws, *event_shape)`` (numpy or JAX) and
works elementwise over the event dimensions, returning a numpy array of shape ``event_shape``
(0-d for scalar draws). The formulas are those of Vehtari, Gelman, Simpson, Carpenter & Buerkner
(2021), "Rank-normalization, folding, and localization: an improved R-hat for assessing convergence
of MCMC", Bayesian Analysis 16(2), as implemented in Stan, ``posterior`` and ArviZ; the results
agree with ``arviz.rhat(method="rank")``, ``arviz.ess(method="bulk" | "tail")`` and
``arviz.autocorr`` to rounding error, with these deliberate differences:

* an element whose draws are all equal gets ``nan`` for R-hat, both ESS and the autocorrelation
  (ArviZ returns ``nan`` R-hat but ESS = number of draws; like ``posterior`` we cannot tell a
  quantity that is constant by construction from a stuck sampler). No warnings are emitted.
  Chains stuck at *different* values are not constant: their R-hat is ``inf``.
* a single chain still gets a split-R-hat (its two halves are compared, as in Stan); ArviZ
  returns ``nan`` for fewer than two chains.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from augmentedgp.core.validation import check_int

__all__ = ["autocorrelation", "split_rhat", "ess_bulk", "ess_tail", "summary"]

# elements per block of event dimensions; bounds the FFT workspace for wide event shapes
_BLOCK = 1 << 21


def _as_draws(draws) -> tuple[np.ndarray, tuple[int, ...]]:
    """Validate ``draws`` and return them as float (n_chains, n_draws, K) with the event shape."""
    try:
        arr = np.asarray(draws)
    except (TypeError, ValueError) as err:
        raise ValueError(f"draws must be a numeric array: {err}") from None
    if np.iscomplexobj(arr) or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise ValueError(f"draws must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 2:
        raise ValueError(
            "draws must have shape (n_chains, n_draws, *event_shape), got shape "
            f"{arr.shape}" + (" (use draws[None] for a single chain)" if arr.ndim == 1 else "")
        )
    n_chains, n_draws = arr.shape[:2]
    if n_chains < 1:
        raise ValueError(f"draws must have at least one chain, got shape {arr.shape}")
    if n_draws < 4:
        raise ValueError(f"draws must have at least 4 draws per chain, got shape {arr.shape}")
    arr = arr.astype(float)
    if not np.all(np.isfinite(arr)):
        raise ValueError("draws contains NaN or inf")
    event_shape = arr.shape[2:]
    return arr.reshape(n_chains, n_draws, math.prod(event_shape)), event_shape


def _blockwise(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Apply ``fn`` ((C, N, k) -> (..., k)) to blocks of the last axis of ``x`` and concatenate."""
    if x.shape[-1] == 0:  # empty event shape: the output shape of a one-element call
        return fn(np.ones(x.shape[:-1] + (1,)))[..., :0]
    step = max(1, _BLOCK // max(1, x.shape[0] * x.shape[1]))
    if x.shape[-1] <= step:
        return fn(x)
    return np.concatenate([fn(x[..., i : i + step]) for i in range(0, x.shape[-1], step)], axis=-1)


def _constant(x: np.ndarray) -> np.ndarray:
    """(K,) mask of elements whose draws (over all chains) are all equal."""
    return np.max(x, axis=(0, 1)) == np.min(x, axis=(0, 1))


def _autocov(x: np.ndarray) -> np.ndarray:
    """Biased per-chain autocovariance along axis 1 by FFT (Geyer 1992; Stan):
    ``c_t = (1/n) sum_{s=1}^{n-t} (x_s - xbar)(x_{s+t} - xbar)``, zero-padded to avoid wrap-around.
    """
    n = x.shape[1]
    xc = x - x.mean(axis=1, keepdims=True)
    from scipy.fft import next_fast_len  # scipy loads on first use, not on import

    m = next_fast_len(2 * n)
    f = np.fft.rfft(xc, n=m, axis=1)
    return np.fft.irfft(f * np.conj(f), n=m, axis=1)[:, :n] / n


def _split(x: np.ndarray) -> np.ndarray:
    """Split each chain into its first and last halves, (C, N, K) -> (2C, N // 2, K); for odd N the
    middle draw is dropped (Vehtari et al. 2021, Sec. 3.1)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Rank normalisation (Vehtari et al. 2021, Sec. 4.1): pooled average ranks ``r`` of all ``S``
    draws, ``z = Phi^{-1}((r - 3/8) / (S + 1/4))`` (Blom 1958 offsets)."""
    from scipy import special, stats  # ~1 s of `import augmentedgp` if imported at the top

    c, n, k = x.shape
    size = c * n
    r = stats.rankdata(np.ascontiguousarray(x.reshape(size, k).T), method="average", axis=-1)
    return special.ndtri((r.T - 0.375) / (size + 0.25)).reshape(c, n, k)


def _rhat(x: np.ndarray) -> np.ndarray:
    """Potential scale reduction of (C, n, K) chains (Vehtari et al. 2021, Sec. 3.1):
    ``B = n var_m(mean_m)``, ``W = mean_m var_m``, ``R = sqrt(((n - 1)/n W + B/n) / W)``."""
    n = x.shape[1]
    b = n * np.var(x.mean(axis=1), axis=0, ddof=1)
    w = np.mean(np.var(x, axis=1, ddof=1), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((b / w + n - 1.0) / n)


def _rhat_bulk_tail(
    chains: np.ndarray, z: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Bulk R-hat (rank-normalised chains ``z``) and tail R-hat (rank-normalised folded chains
    ``|x - median(x)|``, Vehtari et al. 2021, Sec. 4.2) of (C, n, K) chains, split or not."""
    if z is None:
        z = _z_scale(chains)
    folded = np.abs(chains - np.median(chains, axis=(0, 1)))
    return _rhat(z), _rhat(_z_scale(folded))


def _ess(x: np.ndarray) -> np.ndarray:
    """Multi-chain ESS of (C, n, K) chains (Vehtari et al. 2021, Sec. 3.2; Stan/ArviZ).

    ``rho_t = 1 - (W - mean_m c_{t,m}) / var_plus`` with ``W`` the mean within-chain variance and
    ``var_plus = (n-1)/n W + B/n``; Geyer's (1992) initial positive sequence truncates the sums
    ``P_k = rho_{2k} + rho_{2k+1}`` at the first ``P_k <= 0`` and his initial monotone sequence
    replaces them by their running minimum; ``tau = -1 + 2 sum_k P_k + rho_{2k_stop}`` (the last
    even lag kept when positive, as in Stan), bounded below by ``1/log10(S)``, ``ESS = S / tau``.
    Elements whose values span less than float resolution get ``S = C n`` (as ArviZ)."""
    c, n, _ = x.shape
    size = c * n
    acov = _autocov(x).mean(axis=0)  # (n, K): chain-averaged autocovariance
    mean_var = acov[0] * n / (n - 1.0)  # W
    var_plus = mean_var * (n - 1.0) / n
    if c > 1:
        var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
    k_max = max(0, (n - 3) // 2)  # last pair of lags (2k, 2k+1) Stan's loop may reach
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov[: 2 * k_max + 2]) / var_plus
    rho[0] = 1.0
    even = rho[0::2]
    pairs = even + rho[1::2]  # (k_max + 1, K)
    nonpos = pairs <= 0.0
    k_stop = np.where(nonpos.any(axis=0), np.argmax(nonpos, axis=0), k_max)
    kept = np.arange(k_max + 1)[:, None] < k_stop
    monotone = np.minimum.accumulate(pairs, axis=0)
    sum_pairs = np.where(kept, monotone, 0.0).sum(axis=0)
    even_stop = np.take_along_axis(even, k_stop[None], axis=0)[0]
    pair_stop = np.take_along_axis(pairs, k_stop[None], axis=0)[0]
    extra = np.where((pair_stop >= 0.0) | (even_stop > 0.0), even_stop, 0.0)
    tau = np.maximum(-1.0 + 2.0 * sum_pairs + extra, 1.0 / np.log10(size))
    ess = np.where(np.isnan(rho).any(axis=0), np.nan, size / tau)
    flat = (np.max(x, axis=(0, 1)) - np.min(x, axis=(0, 1))) < np.finfo(float).resolution
    return np.where(flat, float(size), ess)


def _acf(x: np.ndarray, max_lag: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        acov = _autocov(x)[:, : max_lag + 1]
        return (acov / acov[:, :1]).mean(axis=0)


def _split_rhat(x: np.ndarray, z_split: np.ndarray | None = None) -> np.ndarray:
    bulk, tail = _rhat_bulk_tail(_split(x), z_split)
    return np.where(_constant(x), np.nan, np.fmax(bulk, tail))


def _ess_bulk(x: np.ndarray, z_split: np.ndarray | None = None) -> np.ndarray:
    if z_split is None:
        z_split = _z_scale(_split(x))
    return np.where(_constant(x), np.nan, _ess(z_split))


def _ess_tail(x: np.ndarray, probs: tuple[float, float]) -> np.ndarray:
    c, n, k = x.shape
    q = np.quantile(x.reshape(c * n, k), probs, axis=0)  # type 7, as ArviZ / R
    ess = np.minimum(_ess(_split(x <= q[0]).astype(float)), _ess(_split(x <= q[1]).astype(float)))
    return np.where(_constant(x), np.nan, ess)


def _check_probs(prob) -> tuple[float, float]:
    p = np.asarray(prob, dtype=float)
    if p.ndim == 0:
        p = np.array([p, 1.0 - p])
    if p.shape != (2,) or not np.all((p > 0.0) & (p < 1.0)):
        raise ValueError(f"prob must be one or two probabilities in (0, 1), got {prob!r}")
    return float(p[0]), float(p[1])


def autocorrelation(draws, max_lag: int | None = None) -> np.ndarray:
    """Per-chain FFT autocorrelation averaged over chains, shape (max_lag + 1, *event_shape).

    ``rho_t = c_t / c_0`` with the biased autocovariance ``c_t = (1/N) sum_{s=1}^{N-t}
    (x_s - xbar)(x_{s+t} - xbar)`` of each chain (Geyer 1992; Stan), so ``rho_0 = 1``; identical
    to ``arviz.autocorr`` of each chain. ``max_lag`` defaults to ``n_draws - 1``. A chain whose
    draws are all equal has an undefined autocorrelation and makes the result ``nan``.
    """
    x, event_shape = _as_draws(draws)
    n = x.shape[1]
    if max_lag is None:
        max_lag = n - 1
    max_lag = check_int(max_lag, "max_lag", 0)
    if not max_lag < n:
        raise ValueError(f"max_lag must be in [0, n_draws - 1] = [0, {n - 1}], got {max_lag}")
    out = _blockwise(lambda b: _acf(b, int(max_lag)), x)
    return out.reshape((int(max_lag) + 1, *event_shape))


def split_rhat(draws) -> np.ndarray:
    """Rank-normalised split-R-hat (Vehtari et al. 2021, Sec. 4; ``arviz.rhat(method="rank")``).

    Each chain is split in half; R-hat (``sqrt(var_plus / W)``, Sec. 3.1) is computed on the pooled
    rank-normalised split chains (bulk R-hat) and on the rank-normalised folded draws
    ``|x - median|`` (tail R-hat, Sec. 4.2); the result is their maximum. Values above 1.01
    indicate chains that have not mixed (Vehtari et al. recommend 1.01).
    """
    x, event_shape = _as_draws(draws)
    return _blockwise(_split_rhat, x).reshape(event_shape)


def ess_bulk(draws) -> np.ndarray:
    """Bulk effective sample size (Vehtari et al. 2021, Sec. 3.2 and 4.1; ``arviz.ess``).

    The multi-chain ESS of the rank-normalised split chains; see :func:`_ess` for the estimator
    (Geyer's initial positive and monotone sequences; at most ``S log10(S)`` for ``S`` draws).
    """
    x, event_shape = _as_draws(draws)
    return _blockwise(_ess_bulk, x).reshape(event_shape)


def ess_tail(draws, prob=(0.05, 0.95)) -> np.ndarray:
    """Tail effective sample size (Vehtari et al. 2021, Sec. 4.3; ``arviz.ess(method="tail")``).

    The smaller of the split-chain ESS of the indicators ``I(x <= q_p)`` for the two quantiles
    ``q_p`` (type-7 quantiles of the pooled draws) at ``prob`` (a scalar ``p`` means
    ``(p, 1 - p)``).
    """
    probs = _check_probs(prob)
    x, event_shape = _as_draws(draws)
    return _blockwise(lambda b: _ess_tail(b, probs), x).reshape(event_shape)


def summary(draws) -> dict[str, np.ndarray]:
    """Posterior mean, sd (ddof=1, pooled over chains), rank-normalised split-R-hat, bulk and
    tail ESS and the chain-averaged lag-1 autocorrelation ``acf1``, each of shape event_shape."""
    x, event_shape = _as_draws(draws)

    def block(b: np.ndarray) -> np.ndarray:
        z_split = _z_scale(_split(b))  # shared by the bulk R-hat and the bulk ESS
        return np.stack(
            [
                b.mean(axis=(0, 1)),
                b.reshape(b.shape[0] * b.shape[1], b.shape[2]).std(axis=0, ddof=1),
                _split_rhat(b, z_split),
                _ess_bulk(b, z_split),
                _ess_tail(b, (0.05, 0.95)),
                _acf(b, 1)[1],
            ]
        )

    out = _blockwise(block, x)
    names = ("mean", "sd", "rhat", "ess_bulk", "ess_tail", "acf1")
    return {name: out[i].reshape(event_shape) for i, name in enumerate(names)}
