"""MCMC diagnostics against AR(1) theory, a plain-loop transcription of Stan's estimator, R-hat's
known failure modes and (when installed) ArviZ."""

import warnings

import numpy as np
import pytest
from scipy import stats

from augmentedgp.core import diagnostics as dg


def ar1(rho, n_chains, n_draws, event_shape=(), seed=0):
    """Stationary AR(1) chains x_t = rho x_{t-1} + sqrt(1 - rho^2) e_t, marginally N(0, 1)."""
    e = np.random.default_rng(seed).normal(size=(n_chains, n_draws, *event_shape))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    s = np.sqrt(1.0 - rho**2)
    for t in range(1, n_draws):
        x[:, t] = rho * x[:, t - 1] + s * e[:, t]
    return x


def ref_autocov(c):
    """Direct O(n^2) biased autocovariance of one chain."""
    n, d = c.size, c - c.mean()
    return np.array([np.sum(d[: n - t] * d[t:]) / n for t in range(n)])


def ref_ess(chains):
    """Stan's multi-chain ESS (Vehtari et al. 2021, Sec. 3.2), transcribed loop for loop from Stan's
    compute_effective_sample_size, with a direct autocovariance; chains is (M, n)."""
    m, n = chains.shape
    if np.ptp(chains) < np.finfo(float).resolution:
        return float(chains.size)
    acov = np.array([ref_autocov(c) for c in chains])
    mean_var = acov[:, 0].mean() * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n + (chains.mean(1).var(ddof=1) if m > 1 else 0.0)
    rho = np.zeros(n)
    rho_even, rho_odd = 1.0, 1.0 - (mean_var - acov[:, 1].mean()) / var_plus
    rho[0], rho[1] = rho_even, rho_odd
    t = 1
    while t < n - 3 and rho_even + rho_odd > 0.0:
        rho_even = 1.0 - (mean_var - acov[:, t + 1].mean()) / var_plus
        rho_odd = 1.0 - (mean_var - acov[:, t + 2].mean()) / var_plus
        if rho_even + rho_odd >= 0.0:
            rho[t + 1], rho[t + 2] = rho_even, rho_odd
        t += 2
    max_t = t - 2
    if rho_even > 0.0:
        rho[max_t + 1] = rho_even
    t = 1
    while t <= max_t - 2:
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = (rho[t - 1] + rho[t]) / 2.0
        t += 2
    tau = -1.0 + 2.0 * rho[: max_t + 1].sum() + rho[max_t + 1 : max_t + 2].sum()
    return chains.size / max(tau, 1.0 / np.log10(chains.size))


def ref_split(x):
    half = x.shape[1] // 2
    return np.vstack([x[:, :half], x[:, x.shape[1] - half :]])


def ref_z(x):
    r = stats.rankdata(x, method="average").reshape(x.shape)
    return stats.norm.ppf((r - 0.375) / (x.size + 0.25))


def unsplit_rhat(x):
    """Rank-normalised R-hat without splitting the chains (scalar event), for contrast."""
    bulk, tail = dg._rhat_bulk_tail(np.asarray(x, float)[..., None])
    return max(bulk[0], tail[0])


# ----------------------------------------------------------------------------- autocorrelation


def test_autocorrelation_matches_direct_definition():
    x = np.random.default_rng(1).normal(size=(3, 37, 2))
    acf = dg.autocorrelation(x)
    assert acf.shape == (37, 2)
    ref = np.stack(
        [
            np.mean([ref_autocov(x[m, :, j]) / ref_autocov(x[m, :, j])[0] for m in range(3)], 0)
            for j in range(2)
        ],
        axis=-1,
    )
    np.testing.assert_allclose(acf, ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(acf[0], 1.0)
    np.testing.assert_allclose(dg.autocorrelation(x, max_lag=5), ref[:6], atol=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9, -0.3])
def test_ar1_autocorrelation_is_rho_to_the_k(rho):
    m, n, lags = 4, 4000, np.arange(1, 6)
    acf = dg.autocorrelation(ar1(rho, m, n, seed=10), max_lag=5)
    # Bartlett's large-sample variance of the lag-k sample autocorrelation of an AR(1) process,
    # averaged over m chains, plus the O(1/n) bias of the mean-corrected biased estimator
    r2k = rho ** (2 * lags)
    var = ((1 + rho**2) * (1 - r2k) / (1 - rho**2) - 2 * lags * r2k) / n
    tol = 4 * np.sqrt(var / m) + (1 + abs(rho)) / ((1 - abs(rho)) * n) + lags / n
    np.testing.assert_array_less(np.abs(acf[1:] - rho**lags), tol)


# ----------------------------------------------------------------------------- ESS


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9, -0.3])
def test_ar1_bulk_ess_matches_theory(rho):
    m, n = 4, 4000
    ratio = dg.ess_bulk(ar1(rho, m, n, seed=20)) / (m * n)
    assert ratio.shape == ()
    assert ratio == pytest.approx((1 - rho) / (1 + rho), rel=0.12)
    if rho < 0:
        assert ratio > 1.0  # antithetic chains beat independent draws


def test_antithetic_ess_is_capped_at_s_log10_s():
    x = ar1(-0.95, 4, 4000, seed=21)
    s = 4 * 4000
    assert dg.ess_bulk(x) == pytest.approx(s * np.log10(s), rel=1e-12)


def test_iid_tail_ess_near_number_of_draws():
    x = np.random.default_rng(22).standard_t(df=3, size=(4, 4000))
    assert dg.ess_tail(x) / x.size == pytest.approx(1.0, rel=0.15)
    assert dg.ess_tail(ar1(0.9, 4, 4000, seed=23)) / 16000 < 0.25


def test_ess_matches_loop_transcription_of_stan():
    # short chains, odd lengths, strong positive and negative correlation, ties: every branch of
    # Geyer's truncation (stop at k = 0, mid-sequence, or at the last available pair)
    checked = 0
    for m, n in [(1, 4), (2, 5), (3, 7), (2, 9), (4, 10), (1, 11), (2, 40)]:
        for rho in (-0.9, -0.5, 0.0, 0.5, 0.95):
            for seed in range(4):
                x = ar1(rho, m, n, seed=seed)
                if seed == 3:
                    x = np.round(x)  # ties, and tail indicators that can be constant
                if np.ptp(x) == 0:
                    continue
                split = ref_split(x)
                bulk = ref_ess(ref_z(split))
                q = np.quantile(x, [0.05, 0.95])
                tail = min(
                    ref_ess((split <= q[0]).astype(float)), ref_ess((split <= q[1]).astype(float))
                )
                assert dg.ess_bulk(x) == pytest.approx(bulk, rel=1e-10), (m, n, rho, seed)
                assert dg.ess_tail(x) == pytest.approx(tail, rel=1e-10), (m, n, rho, seed)
                checked += 1
    assert checked > 120


def test_ess_tail_prob_argument():
    x = ar1(0.3, 4, 500, seed=24)
    np.testing.assert_allclose(dg.ess_tail(x, prob=0.1), dg.ess_tail(x, prob=(0.1, 0.9)))
    assert dg.ess_tail(x, prob=(0.25, 0.75)) != dg.ess_tail(x)


# ----------------------------------------------------------------------------- R-hat


def test_rhat_near_one_for_iid_chains():
    r = dg.split_rhat(np.random.default_rng(30).normal(size=(4, 4000, 3)))
    assert r.shape == (3,)
    assert np.all((r >= 0.99) & (r <= 1.01))


def test_rhat_flags_a_shifted_chain():
    x = np.random.default_rng(31).normal(size=(4, 1000))
    assert dg.split_rhat(x) < 1.01
    x[2] += 2.0
    assert dg.split_rhat(x) > 1.1


def test_tail_rhat_flags_different_variances_that_bulk_misses():
    x = np.random.default_rng(32).normal(size=(4, 2000)) * np.array([1.0, 1.0, 1.0, 3.0])[:, None]
    bulk, tail = dg._rhat_bulk_tail(ref_split(x)[..., None])
    assert bulk[0] < 1.01
    assert tail[0] > 1.05
    assert dg.split_rhat(x) == pytest.approx(tail[0])


def test_splitting_flags_a_trend_in_the_first_half():
    n = 2000
    trend = np.where(np.arange(n) < n // 2, 3.0 * (1.0 - np.arange(n) / (n // 2)), 0.0)
    x = np.random.default_rng(33).normal(size=(4, n)) + trend  # every chain drifts the same way
    assert unsplit_rhat(x) < 1.02  # the chains agree with each other ...
    assert dg.split_rhat(x) > 1.1  # ... but not with themselves
    assert dg.split_rhat(x[:1]) > 1.1  # a single chain is split too


def test_rhat_matches_direct_formula():
    x = ar1(0.6, 3, 101, seed=34)
    split = ref_split(x)

    def rhat(c):
        n = c.shape[1]
        b, w = n * c.mean(1).var(ddof=1), c.var(1, ddof=1).mean()
        return np.sqrt(((n - 1) / n * w + b / n) / w)

    expected = max(rhat(ref_z(split)), rhat(ref_z(np.abs(split - np.median(split)))))
    assert dg.split_rhat(x) == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- ArviZ


def test_agrees_with_arviz():
    az = pytest.importorskip("arviz")
    worst = {}
    for seed, (m, n, rho) in enumerate([(4, 1000, 0.7), (3, 257, -0.4), (2, 64, 0.95)]):
        x = ar1(rho, m, n, (3, 2), seed=40 + seed)
        for data in (x, np.round(2 * x)):  # continuous, and with ties
            ds = az.convert_to_dataset({"x": data})
            pairs = {
                "rhat": (dg.split_rhat(data), az.rhat(ds, method="rank")["x"].values),
                "ess_bulk": (dg.ess_bulk(data), az.ess(ds, method="bulk")["x"].values),
                "ess_tail": (dg.ess_tail(data), az.ess(ds, method="tail")["x"].values),
                "acf": (
                    dg.autocorrelation(data[:1])[:, 1, 0],
                    az.autocorr(data[0, :, 1, 0]),
                ),
            }
            for name, (ours, theirs) in pairs.items():
                assert ours.shape == theirs.shape, name
                np.testing.assert_allclose(ours, theirs, rtol=1e-8, atol=1e-12, err_msg=name)
                rel = np.max(np.abs(ours - theirs) / np.abs(theirs))
                worst[name] = max(worst.get(name, 0.0), rel)
    assert max(worst.values()) < 1e-8


# ----------------------------------------------------------------------------- summary, input


def test_summary_keys_shapes_and_values():
    x = ar1(0.5, 4, 400, (2, 3), seed=50)
    s = dg.summary(x)
    assert set(s) == {"mean", "sd", "rhat", "ess_bulk", "ess_tail", "acf1"}
    assert all(v.shape == (2, 3) for v in s.values())
    np.testing.assert_allclose(s["mean"], x.mean((0, 1)))
    np.testing.assert_allclose(s["sd"], x.reshape(-1, 2, 3).std(0, ddof=1))
    np.testing.assert_allclose(s["rhat"], dg.split_rhat(x))
    np.testing.assert_allclose(s["ess_bulk"], dg.ess_bulk(x))
    np.testing.assert_allclose(s["ess_tail"], dg.ess_tail(x))
    np.testing.assert_allclose(s["acf1"], dg.autocorrelation(x, max_lag=1)[1])
    assert np.all(np.abs(s["acf1"] - 0.5) < 0.1)
    scalar = dg.summary(x[..., 0, 0])
    assert all(np.ndim(v) == 0 for v in scalar.values())
    empty = dg.summary(np.zeros((2, 10, 0, 3)))
    assert all(v.shape == (0, 3) for v in empty.values())


def test_blocking_over_event_elements(monkeypatch):
    x = ar1(0.3, 3, 50, (7,), seed=51)
    full = dg.summary(x)
    monkeypatch.setattr(dg, "_BLOCK", 1)  # one event element per block
    blocked = dg.summary(x)
    for k in full:
        np.testing.assert_allclose(blocked[k], full[k], rtol=1e-12, err_msg=k)
    np.testing.assert_allclose(dg.autocorrelation(x), dg._acf(x, 49), rtol=1e-12)


def test_accepts_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")
    xj = jnp.asarray(ar1(0.3, 3, 50, (7,), seed=51))
    x = np.asarray(xj)  # float32 unless x64 is enabled
    for fn in (dg.split_rhat, dg.ess_bulk, dg.ess_tail, dg.autocorrelation):
        np.testing.assert_array_equal(fn(xj), fn(x))
    assert dg.summary(xj)["rhat"].shape == (7,)


def test_constant_draws_give_nan_without_warnings():
    x = ar1(0.3, 4, 100, (3,), seed=52)
    x[..., 1] = 2.5  # constant everywhere
    x[:, :, 2] = np.arange(4.0)[:, None]  # each chain stuck, at different values
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = dg.summary(x)
        acf = dg.autocorrelation(x)
    for key in ("rhat", "ess_bulk", "ess_tail", "acf1"):
        assert np.isfinite(s[key][0]) and np.isnan(s[key][1]), key
    assert np.isnan(acf[:, 1]).all()
    assert s["rhat"][2] > 1e6  # zero within-chain variance (up to rounding)
    assert s["sd"][1] == 0.0


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros(10), "shape"),
        (np.float64(1.0), "shape"),
        (np.zeros((2, 3)), "at least 4 draws"),
        (np.zeros((0, 10)), "at least one chain"),
        (np.where(np.arange(40).reshape(4, 10) == 7, np.nan, 1.0), "NaN or inf"),
        (np.where(np.arange(40).reshape(4, 10) == 7, np.inf, 1.0), "NaN or inf"),
        (np.ones((2, 10), dtype=complex), "real numeric"),
        (np.full((2, 10), "a"), "real numeric"),
    ],
)
def test_invalid_draws_raise(bad, match):
    for fn in (dg.split_rhat, dg.ess_bulk, dg.ess_tail, dg.summary, dg.autocorrelation):
        with pytest.raises(ValueError, match=match):
            fn(bad)


def test_invalid_arguments_raise():
    x = np.random.default_rng(53).normal(size=(2, 10))
    for lag in (-1, 10, 2.5, True):
        with pytest.raises(ValueError, match="max_lag"):
            dg.autocorrelation(x, max_lag=lag)
    for prob in (0.0, 1.0, (0.1, 0.5, 0.9), (0.1, 1.2)):
        with pytest.raises(ValueError, match="prob"):
            dg.ess_tail(x, prob=prob)
