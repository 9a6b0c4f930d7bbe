"""Determinantal point processes (``augmentedgp.dpp``): probabilities sum to one over all
subsets; the spectral sampler's inclusion probabilities match the marginal kernel
L (L + I)^-1; the inducing-point bound lies below the exact log-likelihood, grows with
nested Z and is exact at Z = X, and equals twice the SGPR bound at y = 0, noise 1 (plus
n log 2 pi); the continuous bound's Psi against Gauss-Legendre quadrature and the bound
against Nystrom quadrature (the reference's numbers); parameter recovery; error cases."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import augmentedgp as agp
from augmentedgp.contrib import dpp
from augmentedgp.core.params import fixed, positive, real


def items(n, seed=0, d=2):
    return np.random.default_rng(seed).uniform(0, 1, (n, d))


def test_probabilities_sum_to_one():
    """sum_Y det L_Y = det(L + I): numpy determinants over all 2^8 subsets against the
    library's normaliser; the library's log-probabilities of a few subsets against numpy."""
    X = items(8)
    k = agp.kernels.RBF(lengthscale=0.3, variance=2.0)
    L = np.asarray(k(jnp.asarray(X)))
    subsets = [list(s) for r in range(9) for s in itertools.combinations(range(8), r)]
    dets = [np.linalg.det(L[np.ix_(s, s)]) if s else 1.0 for s in subsets]
    log_norm = float(dpp.log_normaliser(k, jnp.asarray(X)))
    assert abs(np.sum(dets) / np.exp(log_norm) - 1.0) < 1e-12
    some = [subsets[0], subsets[3], subsets[40], subsets[200], subsets[-1]]
    ref = sum(np.log(dets[subsets.index(s)]) for s in some) - len(some) * log_norm
    assert abs(dpp.log_likelihood(k, X, some) - ref) < 1e-9


def test_sampler_inclusion_probabilities():
    """P(i in Y) = K_ii with K = L (L + I)^-1, and E|Y| = sum lambda / (1 + lambda)."""
    X = items(10, 1)
    L = np.asarray(agp.kernels.RBF(lengthscale=0.3, variance=3.0)(jnp.asarray(X)))
    rng = np.random.default_rng(0)
    draws = [dpp.sample(L, rng) for _ in range(4000)]
    freq = np.zeros(10)
    for s in draws:
        freq[s] += 1
    freq /= len(draws)
    K = L @ np.linalg.inv(L + np.eye(10))
    se = np.sqrt(np.diag(K) * (1 - np.diag(K)) / len(draws))
    assert np.all(np.abs(freq - np.diag(K)) < 5 * se)
    pair = np.mean([(0 in s) and (1 in s) for s in draws])  # P(0, 1 in Y) = det K_{01}
    assert abs(pair - np.linalg.det(K[:2, :2])) < 5 * np.sqrt(pair * (1 - pair) / len(draws))
    assert all(len(set(s.tolist())) == len(s) for s in draws)


def test_bound_below_exact_monotone_and_tight():
    X = items(60, 2)
    k = agp.kernels.RBF(lengthscale=0.2, variance=2.0)
    L = np.asarray(k(jnp.asarray(X)))
    rng = np.random.default_rng(3)
    subs = [dpp.sample(L, rng) for _ in range(4)]
    exact = dpp.log_likelihood(k, X, subs)
    perm = rng.permutation(60)
    bounds = [dpp.elbo(k, X, subs, X[perm[:m]]) for m in (5, 10, 20, 40, 60)]
    assert all(b <= exact + 1e-8 for b in bounds)
    assert np.all(np.diff(bounds) >= -1e-8)  # nested Z: the bound never decreases
    assert abs(bounds[-1] - exact) < 1e-7 * abs(exact)
    # the normaliser bound is the SGPR bound at y = 0 with unit noise
    Z = X[perm[:10]]
    sgpr = agp.SGPR(k, Z, noise=fixed(positive(1.0)))
    lhs = float(dpp.log_normaliser_bound(k, jnp.asarray(X), jnp.asarray(Z)))
    assert abs(lhs - (2 * sgpr.elbo(X, np.zeros(60)) + 60 * np.log(2 * np.pi))) < 1e-9


def test_psi_against_quadrature():
    k = agp.kernels.RBF(lengthscale=np.array([0.2, 0.4]), variance=1.7)
    Z = jnp.asarray(items(4, 4))
    lo, hi = jnp.array([0.0, -0.5]), jnp.array([1.0, 1.5])
    t, w = np.polynomial.legendre.leggauss(120)
    g = [0.5 * (h - a) * t + 0.5 * (h + a) for a, h in zip(lo.tolist(), hi.tolist(),
                                                         strict=True)]
    ww = [0.5 * (h - a) * w for a, h in zip(lo.tolist(), hi.tolist(), strict=True)]
    grid = np.stack(np.meshgrid(*g, indexing="ij"), -1).reshape(-1, 2)
    wts = np.outer(*ww).ravel()
    Kzx = np.asarray(k(Z, jnp.asarray(grid)))
    ref = (Kzx * wts) @ Kzx.T
    np.testing.assert_allclose(np.asarray(dpp.psi(k, Z, lo, hi)), ref, rtol=1e-10, atol=1e-13)


def test_continuous_bound_reference_numbers():
    """[0, 1], v = 1.5, l = 0.1 (reference B.6.3): exact -1.34178; m = 3, 6, 12, 25 evenly
    spaced inducing inputs give -1.4536, -1.3655, -1.34183, -1.341785."""
    k = agp.kernels.RBF(lengthscale=0.1, variance=1.5)
    exact = dpp.continuous_log_normaliser(k, [0.0], [1.0], n_nodes=200)
    assert abs(exact - (-1.34178)) < 1e-5
    got = [float(dpp.continuous_log_normaliser_bound(k, jnp.linspace(0, 1, m)[:, None],
                                                     jnp.array([0.0]), jnp.array([1.0])))
           for m in (3, 6, 12, 25)]
    np.testing.assert_allclose(got, [-1.4536, -1.3655, -1.34183, -1.341785], atol=6e-5)
    assert all(b <= exact + 1e-9 for b in got) and np.all(np.diff(got) > 0)
    pts = [np.array([[0.1], [0.5], [0.9]]), np.array([[0.3]])]
    value = dpp.continuous_elbo(k, pts, jnp.linspace(0, 1, 25)[:, None], [0.0], [1.0])
    logdets = sum(np.linalg.slogdet(np.asarray(k(jnp.asarray(p))))[1] for p in pts)
    assert abs(value - (logdets + 2 * got[-1])) < 1e-4


def test_fit_recovers_the_kernel():
    """Subsets drawn from a DPP with l = 0.15, v = 3 on 80 items: maximising the bound with
    Z = X (exact) recovers them (measured on 150 items, 40 subsets: 0.153, 3.38)."""
    rng = np.random.default_rng(1)
    X = items(80, 5)
    true = agp.kernels.RBF(lengthscale=0.15, variance=3.0)
    L = np.asarray(true(jnp.asarray(X)))
    subs = [dpp.sample(L, rng) for _ in range(30)]
    k0 = agp.kernels.RBF(lengthscale=0.5, variance=1.0)
    kern, Z, hist = dpp.fit(k0, X, subs, fixed(real(X, "Z")), max_iter=100)
    assert abs(kern.lengthscale.value - 0.15) < 0.02
    assert abs(kern.variance.value - 3.0) < 0.75
    assert dpp.log_likelihood(kern, X, subs) >= dpp.log_likelihood(true, X, subs) - 1e-6
    np.testing.assert_array_equal(np.asarray(Z), X)


def test_errors():
    X = items(5)
    k = agp.kernels.RBF(0.3)
    with pytest.raises(ValueError, match="distinct item indices"):
        dpp.log_likelihood(k, X, [[0, 7]])
    with pytest.raises(ValueError, match="distinct item indices"):
        dpp.log_likelihood(k, X, [[1, 1]])
    with pytest.raises(ValueError, match="lower < upper"):
        dpp.continuous_elbo(k, [X[:2]], X[:2], [0.0, 1.0], [1.0, 1.0])
    with pytest.raises(TypeError, match="RBF"):
        dpp.psi(agp.kernels.Matern32(0.3), jnp.asarray(X), jnp.zeros(2), jnp.ones(2))
    with pytest.raises(ValueError, match="at least one"):
        dpp.fit(k, X, [], X[:2])
    with pytest.raises(ValueError, match="at least one"):
        dpp.log_likelihood(k, X, [])


def test_fit_continuous_recovers_the_kernel():
    """Point sets from a continuous DPP on [0, 1] (l = 0.05, v = 20), drawn through a
    400-cell grid (L_grid = L / 400, the Nystrom discretisation): maximising the continuous
    bound with 30 pseudo-inputs recovers l and v (measured: 0.056, 21.7)."""
    true = agp.kernels.RBF(lengthscale=0.05, variance=20.0)
    g = (np.arange(400) + 0.5) / 400
    Lg = np.asarray(true(jnp.asarray(g[:, None]))) / 400
    rng = np.random.default_rng(0)
    sets = [g[dpp.sample(Lg, rng)][:, None] for _ in range(30)]
    k, Z, hist = dpp.fit_continuous(agp.kernels.RBF(0.2, 5.0), sets,
                                    np.linspace(0, 1, 30)[:, None], [0.0], [1.0], max_iter=200)
    assert abs(k.lengthscale.value - 0.05) < 0.01
    assert abs(k.variance.value - 20.0) < 4.0
    assert hist.objective[-1] < hist.objective[0]
    with pytest.raises(ValueError, match="in the box"):
        dpp.fit_continuous(k, [np.array([[1.5]])], Z, [0.0], [1.0])
