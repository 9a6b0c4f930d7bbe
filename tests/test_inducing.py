"""Inducing-point initialisation: random subsets, k-means, greedy variance, OIPS."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest
from sklearn.cluster import KMeans

import augmentedgp as agp
from augmentedgp.models import inducing

K = agp.kernels


def _uniform(n, d=2, seed=0):
    return np.random.default_rng(seed).uniform(-3.0, 3.0, size=(n, d))


def _inertia(X, C):
    return float(np.sum(np.min(np.sum((X[:, None, :] - C[None]) ** 2, -1), 1)))


def _rows_in(Z, X):
    """Index in X of each row of Z (exact matches; X has distinct rows)."""
    idx = [np.flatnonzero(np.all(X == z, 1)) for z in Z]
    assert all(len(i) == 1 for i in idx), "a returned row is not a row of X"
    return np.array([i[0] for i in idx])


@eqx.filter_jit
def _gram(kernel, X):
    """k(X, X), jitted: one compile per kernel type and shape instead of one per eager op."""
    return kernel(X)


def _corr(kernel, X):
    Kx = np.asarray(_gram(kernel, X))
    sd = np.sqrt(np.diag(Kx))
    return Kx / np.outer(sd, sd)


# --- random subsets and k-means -------------------------------------------------------------


@pytest.mark.parametrize("method", [inducing.random_subset, inducing.kmeans])
def test_key_determinism_and_shape(method):
    X = np.random.default_rng(1).normal(size=(200, 3))
    Z0 = method(X, 10, jax.random.key(0))
    assert Z0.shape == (10, 3) and Z0.dtype == np.float64
    np.testing.assert_array_equal(Z0, method(X, 10, jax.random.key(0)))
    assert not np.array_equal(Z0, method(X, 10, jax.random.key(1)))


def test_random_subset_rows_distinct_and_from_X():
    X = np.repeat(_uniform(30, seed=2), 3, axis=0)  # each value three times
    Z = inducing.random_subset(X, 30, jax.random.key(3))
    assert len(np.unique(Z, axis=0)) == 30
    _rows_in(Z, X[::3])
    Z = inducing.random_subset(X, 7, jax.random.key(4))
    assert len(np.unique(Z, axis=0)) == 7


def test_random_subset_is_uniform():
    # each of the 6 rows is picked with probability M / n = 1/3
    X = np.arange(6.0)[:, None]
    keys = [jax.random.key(i) for i in range(300)]  # (iterating a split array is slow)
    counts = np.bincount(
        np.concatenate([inducing.random_subset(X, 2, k)[:, 0].astype(int) for k in keys]),
        minlength=6)
    # binomial(300, 1/3): sd = 8.2, so 4.5 sd
    assert np.all(np.abs(counts - 100) < 37), counts


def test_kmeans_recovers_separated_blob_centres():
    rng = np.random.default_rng(6)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0], [5.0, -8.0]])
    labels = np.repeat(np.arange(5), 40)
    X = centres[labels] + 0.3 * rng.normal(size=(200, 2))
    means = np.stack([X[labels == c].mean(0) for c in range(5)])
    for seed in range(4):
        Z = inducing.kmeans(X, 5, jax.random.key(seed))
        order = np.argmin(np.sum((Z[:, None] - centres[None]) ** 2, -1), 1)
        assert sorted(order) == list(range(5))
        # converged Lloyd: exactly the empirical blob means (within 0.1 of the true centres)
        np.testing.assert_allclose(Z, means[order], rtol=0, atol=1e-10)
        np.testing.assert_allclose(Z, centres[order], rtol=0, atol=0.1)


def test_kmeans_inertia_matches_sklearn():
    rng = np.random.default_rng(7)
    centres = rng.uniform(-4.0, 4.0, size=(6, 3))  # overlapping blobs
    X = centres[rng.integers(0, 6, 400)] + rng.normal(size=(400, 3))
    ref = KMeans(6, n_init=10, random_state=0).fit(X).inertia_
    ours = _inertia(X, inducing.kmeans(X, 6, jax.random.key(8), n_init=10))
    assert abs(ours / ref - 1.0) < 0.01, (ours, ref)


def test_lloyd_reseeds_empty_cluster_at_farthest_point():
    X = np.concatenate([np.zeros((5, 1)), np.ones((5, 1)), [[10.0]]])
    C0 = np.array([[0.0], [1.0], [1e3]])  # the last centre attracts no point
    C = inducing._lloyd(X, C0, 10)
    np.testing.assert_allclose(np.sort(C[:, 0]), [0.0, 1.0, 10.0])


# --- greedy conditional variance ----------------------------------------------------------


def _naive_greedy(X, M, kernel):
    """Greedy selection with the full K: pick argmax diag(K - Q) given the picks so far."""
    Kx = np.asarray(_gram(kernel, X))
    S = []
    for _ in range(M):
        var = np.diag(Kx).copy()
        if S:
            var -= np.sum(Kx[:, S] * np.linalg.solve(Kx[np.ix_(S, S)], Kx[S, :]).T, 1)
        var[S] = -np.inf
        S.append(int(np.argmax(var)))
    return np.array(S)


def _conditional_variances(Kx, idx):
    """diag(K - K[:, S] K[S, S]^-1 K[S, :]) from the full matrix (one kernel evaluation: the
    eager kernel compiles anew for every shape)."""
    Kxz = Kx[:, idx]
    return np.diag(Kx) - np.sum(Kxz * np.linalg.solve(Kx[np.ix_(idx, idx)], Kxz.T).T, 1)


@pytest.mark.parametrize("kernel", [K.RBF(0.7, 1.5) + K.Linear(0.3), K.RBF(1.2)])
def test_greedy_variance_matches_naive_selection(kernel):
    X = _uniform(80, seed=9)
    Z, idx = inducing.greedy_variance(X, 15, kernel, return_indices=True)
    np.testing.assert_array_equal(idx, _naive_greedy(X, 15, kernel))
    np.testing.assert_array_equal(Z, X[idx])


def test_greedy_variance_trace_identity_and_monotone():
    kernel = K.RBF(0.8, 2.0)
    X = _uniform(80, seed=10)
    Kx = np.asarray(_gram(kernel, X))
    traces = []
    for M in range(1, 16):
        idx, L, d = inducing._pivoted_cholesky(X, M, kernel, 0.0)
        assert len(idx) == M
        Kxz = Kx[:, idx]
        np.testing.assert_allclose(L @ L.T, Kxz @ np.linalg.solve(Kx[np.ix_(idx, idx)], Kxz.T),
                                   atol=1e-9)
        var = _conditional_variances(Kx, idx)
        np.testing.assert_allclose(d, np.maximum(var, 0.0), atol=1e-9)
        traces.append(var.sum())  # trace(K - Q)
        np.testing.assert_allclose(d.sum(), traces[-1], rtol=1e-8, atol=1e-10)
    assert np.all(np.diff(traces) <= 1e-12)
    assert traces[-1] < 0.5 * traces[0]


def test_greedy_variance_threshold_stops_early():
    kernel = K.RBF(1.0)
    X = _uniform(80, seed=11)
    Z, idx = inducing.greedy_variance(X, 80, kernel, threshold=0.05, return_indices=True)
    assert 1 < len(Z) < 80
    Kx = np.asarray(_gram(kernel, X))
    assert np.max(_conditional_variances(Kx, idx)) <= 0.05
    assert np.max(_conditional_variances(Kx, idx[:-1])) > 0.05


def test_greedy_variance_never_picks_duplicates():
    base = _uniform(12, seed=12)
    X = np.random.default_rng(13).permutation(np.concatenate([base] * 3))
    Z = inducing.greedy_variance(X, 12, K.RBF(1.0))
    assert Z.shape == (12, 2) and len(np.unique(Z, axis=0)) == 12


# --- online inducing point selection --------------------------------------------------------


def test_oips_acceptance_rule_against_correlations():
    kernel = K.RBF(0.8, 2.5)  # correlations, not covariances: the variance must not matter
    X = _uniform(250, seed=14)
    rho = 0.6
    Z = inducing.oips(X, kernel, rho)
    idx = _rows_in(Z, X)
    assert idx[0] == 0 and np.all(np.diff(idx) > 0)  # first row accepted, order kept
    C = _corr(kernel, X)
    for i in range(1, len(X)):
        before = idx[idx < i]
        assert (C[i, before].max() < rho) == (i in idx), i
    Cz = C[np.ix_(idx, idx)]
    assert np.all(Cz[np.triu_indices(len(Z), 1)] < rho)
    np.testing.assert_array_equal(Z, inducing.oips(X, K.RBF(0.8), rho))


def test_oips_streaming_and_max_points():
    kernel = K.RBF(0.6)
    X = _uniform(600, seed=15)  # more than one internal block of 256 rows
    Z = inducing.oips(X, kernel, 0.5)
    Z1 = inducing.oips(X[:130], kernel, 0.5)
    np.testing.assert_array_equal(inducing.oips(X[130:], kernel, 0.5, Z=Z1), Z)
    np.testing.assert_array_equal(inducing.oips(X, kernel, 0.5, max_points=7), Z[:7])
    assert len(inducing.oips(X[::-1], kernel, 0.9)) > len(Z)  # higher rho: more points


@pytest.mark.parametrize("rho", [0.0, 1.0, -0.2, 1.5, float("nan")])
def test_oips_rejects_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        inducing.oips(_uniform(10), K.RBF(), rho)


def test_oips_rejects_bad_Z_and_max_points():
    X = _uniform(10)
    with pytest.raises(ValueError, match="Z"):
        inducing.oips(X, K.RBF(), 0.5, Z=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="max_points"):
        inducing.oips(X, K.RBF(), 0.5, max_points=0)


# --- validation ------------------------------------------------------------------------


def _call(method, X, M):
    if method == "greedy":
        return inducing.greedy_variance(X, M, K.RBF())
    return getattr(inducing, method)(X, M, jax.random.key(0))


@pytest.mark.parametrize("method", ["random_subset", "kmeans", "greedy"])
def test_M_larger_than_distinct_rows_raises(method):
    X = np.tile(_uniform(5, seed=16), (4, 1))  # 20 rows, 5 distinct
    with pytest.raises(ValueError, match="only 5 distinct"):
        _call(method, X, 6)
    Z = _call(method, X, 5)
    assert Z.shape == (5, 2) and len(np.unique(Z, axis=0)) == 5


@pytest.mark.parametrize("method", ["random_subset", "kmeans", "greedy"])
def test_bad_X_and_M_raise(method):
    X = _uniform(10)
    for M in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="M must"):
            _call(method, X, M)
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _call(method, X, 2)
    with pytest.raises(ValueError, match="2-D"):
        _call(method, np.zeros(5), 2)
