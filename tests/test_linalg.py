"""Robust Cholesky, the Gaussian log density and its derivatives, Woodbury identities."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from jax.scipy.linalg import solve_triangular

import augmentedgp as agp

la = agp.linalg
DEFAULT_JITTER = (1e-10, 1e-8, 1e-6, 1e-4)


@pytest.fixture(autouse=True)
def _restore_jitter_levels():
    saved = la.jitter_levels()
    yield
    la.set_jitter_levels(saved)


# Jitted once and shared (the eager cholesky re-traces its lax.cond chain on every call).
# They bake in the jitter levels at trace time: tests that change the levels use fresh jits.
CHOL = jax.jit(la.cholesky)
MVN = jax.jit(la.mvn_logpdf)
MVN_GRAD = jax.jit(jax.grad(la.mvn_logpdf, argnums=(0, 1)))
N = 5


def _spd(n, seed, cond=10.0):
    """A random SPD matrix with eigenvalues spread over [1, cond]."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (Q * np.geomspace(1.0, cond, n)) @ Q.T


def _rank_one(n=5, c=1.3):
    return c * np.ones((n, n))  # PSD, rank 1: the plain Cholesky meets an exact zero pivot


# --- cholesky ---------------------------------------------------------------------------


def test_default_jitter_levels():
    assert la.jitter_levels() == DEFAULT_JITTER


def test_cholesky_of_pd_matrix_equals_numpy():
    A = _spd(N, seed=0, cond=1e3)
    L = np.asarray(CHOL(A))
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=0, atol=1e-12)
    assert np.all(np.triu(L, 1) == 0.0)


def test_cholesky_of_singular_psd_uses_smallest_sufficient_jitter():
    A = _rank_one()
    assert not np.all(np.isfinite(np.asarray(jnp.linalg.cholesky(A))))  # plain one fails
    L = np.asarray(CHOL(A))
    assert np.all(np.isfinite(L))
    assert np.all(np.triu(L, 1) == 0.0)
    # the first level (1e-10 x mean diagonal) suffices, so L L^T = A + 1e-10 * 1.3 * I
    np.testing.assert_allclose(L @ L.T - A, 1e-10 * 1.3 * np.eye(5), rtol=0, atol=1e-14)


def test_cholesky_of_kernel_matrix_with_duplicated_inputs():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 2))
    X = np.concatenate([X, X[:2]])  # rank-deficient K
    A = np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, -1) / 9.0)  # RBF, lengthscale 3
    assert np.linalg.matrix_rank(A, tol=1e-12) == 3
    L = np.asarray(CHOL(A))
    assert np.all(np.isfinite(L))
    mean_diag = np.mean(np.diag(A))
    gap = L @ L.T - A
    # L L^T = A + j mean(diag A) I for one of the jitter levels j (the largest at most)
    j = np.mean(np.diag(gap)) / mean_diag
    assert j <= DEFAULT_JITTER[-1] * (1 + 1e-9)
    np.testing.assert_allclose(gap, j * mean_diag * np.eye(N), rtol=0, atol=1e-12)
    assert any(abs(j - level) <= 1e-6 * level for level in DEFAULT_JITTER)


@pytest.mark.parametrize(
    "A",
    [
        np.diag([1.0, -1.0]),
        np.diag([1.0, -1.0, 1.0, 1.0, 1.0]),
        np.eye(N) + np.diag([2.0, 0.0, 0.0, 0.0], k=1) + np.diag([2.0, 0.0, 0.0, 0.0], k=-1),
        -np.eye(N),
    ],
    ids=["diag2", "diag5", "offdiag", "negdef"],
)
def test_cholesky_of_indefinite_matrix_is_nan_and_check_raises(A):
    L = CHOL(A)
    assert np.any(np.isnan(np.asarray(L)))
    with pytest.raises(agp.NotPositiveDefiniteError) as info:
        la.check_cholesky(L, "prior covariance")
    msg = str(info.value)
    assert "prior covariance" in msg and "not positive definite" in msg
    assert "jitter" in msg and "set_jitter_levels" in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, agp.AugmentedGPError)


def test_check_cholesky_passes_finite_factor_through():
    L = CHOL(_spd(N, seed=2))
    assert la.check_cholesky(L) is L


def test_cholesky_under_jit_and_vmap():
    A = np.stack([_spd(N, seed=3), _rank_one(N), np.diag([1.0, -1.0, 1.0, 1.0, 1.0])])
    L = np.asarray(jax.jit(jax.vmap(la.cholesky))(jnp.asarray(A)))
    np.testing.assert_allclose(L[0], np.linalg.cholesky(A[0]), atol=1e-12)
    assert np.all(np.isfinite(L[1]))
    assert np.any(np.isnan(L[2]))


def test_set_jitter_levels_changes_the_jitter():
    la.set_jitter_levels([1e-3])
    assert la.jitter_levels() == (1e-3,)
    L = np.asarray(jax.jit(lambda A: la.cholesky(A))(_rank_one()))
    np.testing.assert_allclose(L @ L.T - _rank_one(), 1e-3 * 1.3 * np.eye(5), atol=1e-12)


@pytest.mark.parametrize("levels", [[0.0], [1e-6, -1e-4], [], [float("nan")]],
                         ids=["zero", "negative", "empty", "nan"])
def test_set_jitter_levels_rejects_bad_levels(levels):
    with pytest.raises(ValueError):
        la.set_jitter_levels(levels)
    assert la.jitter_levels() == DEFAULT_JITTER  # unchanged


def _fd(f, x, h=1e-6):
    return (float(f(x + h)) - float(f(x - h))) / (2 * h)


def test_gradient_through_cholesky_of_pd_matrix():
    A0, B = _spd(N, seed=4), _spd(N, seed=5)
    W = np.random.default_rng(6).normal(size=(N, N))
    vg = jax.jit(jax.value_and_grad(lambda t: jnp.sum(W * la.cholesky(A0 + t * B))))
    g = float(vg(0.3)[1])
    assert np.isfinite(g)
    assert g == pytest.approx(_fd(lambda t: vg(t)[0], 0.3), rel=1e-7)


def test_gradient_through_cholesky_is_finite_when_jitter_is_needed():
    """A rank-deficient K (a constant kernel, or duplicated inputs with no noise) makes the
    first factorisation fail; the jittered factor is finite, so must its gradient be.

    Oracle: the jitter is proportional to mean(diag K), so cholesky(t 11^T) =
    sqrt(t) cholesky(11^T) and d/dt sum(W * L(t)) = sum(W * L(t)) / (2 t)."""
    W = np.tril(np.random.default_rng(7).normal(size=(5, 5)))
    vg = jax.jit(jax.value_and_grad(lambda t: jnp.sum(W * la.cholesky(t * jnp.ones((5, 5))))))
    value, g = map(float, vg(1.3))
    assert np.isfinite(value)
    assert np.isfinite(g)
    assert g == pytest.approx(value / (2 * 1.3), rel=1e-6)


# --- mvn_logpdf ---------------------------------------------------------------------------


def _ref_logpdf(r, K):
    """log N(r | 0, K) by autodiff-able plain Cholesky (no jitter, no custom rule)."""
    L = jnp.linalg.cholesky(K)
    v = solve_triangular(L, r, lower=True)
    return (-0.5 * jnp.sum(v**2) - jnp.sum(jnp.log(jnp.diagonal(L)))
            - 0.5 * r.shape[0] * math.log(2 * math.pi))


REF_GRAD = jax.jit(jax.grad(_ref_logpdf, argnums=(0, 1)))


def _case(n=N, seed=8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=n), _spd(n, seed=seed + 1, cond=50.0)


def test_mvn_logpdf_matches_scipy():
    for seed in range(3):
        r, K = _case(seed=10 + seed)
        expected = scipy.stats.multivariate_normal(np.zeros(5), K).logpdf(r)
        assert float(MVN(r, K)) == pytest.approx(expected, abs=1e-10)


def test_mvn_logpdf_gradient_wrt_r():
    r, K = _case()
    g = np.asarray(MVN_GRAD(r, K)[0])
    np.testing.assert_allclose(g, -np.linalg.solve(K, r), rtol=1e-10, atol=1e-12)
    g_ref = np.asarray(REF_GRAD(r, K)[0])
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)
    for i in range(N):
        e = np.eye(N)[i]
        fd = _fd(lambda t, e=e: MVN(r + t * e, K), 0.0)
        assert g[i] == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_mvn_logpdf_gradient_wrt_K():
    r, K = _case()
    G = np.asarray(MVN_GRAD(r, K)[1])
    Gs = 0.5 * (G + G.T)
    # R&W eq. 5.9: d/dK log N = 1/2 (alpha alpha^T - K^{-1}), alpha = K^{-1} r
    alpha, Kinv = np.linalg.solve(K, r), np.linalg.inv(K)
    np.testing.assert_allclose(Gs, 0.5 * (np.outer(alpha, alpha) - Kinv), rtol=1e-9, atol=1e-12)
    G_ref = np.asarray(REF_GRAD(r, K)[1])
    np.testing.assert_allclose(Gs, 0.5 * (G_ref + G_ref.T), rtol=1e-9, atol=1e-12)
    # finite differences along symmetric directions E_ij + E_ji
    for i, j in [(0, 0), (1, 3), (4, 2), (4, 4)]:
        E = np.zeros((N, N))
        E[i, j] = E[j, i] = 1.0
        expected = np.sum(Gs * E)
        assert expected == pytest.approx(_fd(lambda t, E=E: MVN(r, K + t * E), 0.0),
                                         rel=1e-6, abs=1e-8)


def test_mvn_logpdf_gradient_through_parameterised_covariance():
    # K(theta) = theta0 * A + theta1 * B + I: the full chain rule, against the reference
    r, _ = _case()
    A, B = _spd(5, seed=20), np.outer(np.arange(1.0, 6.0), np.arange(1.0, 6.0)) / 10

    def K_of(theta):
        return theta[0] * A + theta[1] * B + jnp.eye(5)

    theta = jnp.array([0.7, 1.9])
    vg = jax.jit(jax.value_and_grad(lambda th: la.mvn_logpdf(r, K_of(th))))
    g = np.asarray(vg(theta)[1])
    g_ref = np.asarray(jax.jit(jax.grad(lambda th: _ref_logpdf(jnp.asarray(r), K_of(th))))(theta))
    np.testing.assert_allclose(g, g_ref, rtol=1e-10)
    for i in range(2):
        e = np.eye(2)[i]
        fd = _fd(lambda t, e=e: vg(theta + t * e)[0], 0.0)
        assert g[i] == pytest.approx(fd, rel=1e-6)


def test_mvn_logpdf_hessian_wrt_r():
    r, K = _case()
    # jax.hessian is forward-over-reverse: JVPs of the custom rule's reverse pass
    H = np.asarray(jax.jit(jax.hessian(la.mvn_logpdf))(r, K))
    np.testing.assert_allclose(H, -np.linalg.inv(K), rtol=1e-9, atol=1e-12)


def test_mvn_logpdf_gradient_consistent_with_value_when_jitter_is_needed():
    """K(t) = t 11^T (n = 4) is singular, so the value comes from the jittered matrix
    K_J = t (11^T + J I) (jitter J x mean(diag K)). With r = c 1 in the range of K:

        log N = -1/2 [log(t (4 + J)) + 3 log(t J)] - 2 c^2 / (t (4 + J)) - 2 log(2 pi)
        d/dt  = -2 / t + 2 c^2 / (t^2 (4 + J))

    A single jitter level J = 1e-3 keeps the tiny pivots free of cancellation, so central
    differences of the value agree with this derivative; the gradient must as well."""
    J, c, t = 1e-3, 0.8, 1.5
    la.set_jitter_levels([J])
    vg = jax.jit(jax.value_and_grad(lambda t: la.mvn_logpdf(jnp.full(4, c), t * jnp.ones((4, 4)))))
    f = lambda t: vg(t)[0]
    value = -0.5 * (math.log(t * (4 + J)) + 3 * math.log(t * J)) - 2 * c**2 / (t * (4 + J))
    value -= 2 * math.log(2 * math.pi)
    assert float(f(t)) == pytest.approx(value, rel=1e-10)
    expected = -2 / t + 2 * c**2 / (t**2 * (4 + J))
    assert _fd(f, t) == pytest.approx(expected, rel=1e-6)  # the oracle is right
    g = float(vg(t)[1])
    assert np.isfinite(g)
    assert g == pytest.approx(expected, rel=1e-6)


# --- low rank plus diagonal --------------------------------------------------------------


LOWRANK_CHOL = jax.jit(la.lowrank_cholesky)


def _lowrank(n=8, m=3, seed=30):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.2, 2.0, size=n), rng.normal(size=(n, m))


@jax.jit
def _woodbury_both_ways(d, U, b, B):
    Lc = la.lowrank_cholesky(d, U)
    return (la.woodbury_solve(d, U, b), la.woodbury_solve(d, U, B),
            la.woodbury_solve(d, U, b, Lc), la.woodbury_solve(d, U, B, Lc=Lc))


def test_woodbury_solve_matches_dense():
    d, U = _lowrank()
    rng = np.random.default_rng(31)
    b, B = rng.normal(size=8), rng.normal(size=(8, 4))
    dense = np.diag(d) + U @ U.T
    outs = [np.asarray(o) for o in _woodbury_both_ways(d, U, b, B)]
    for out, rhs in zip(outs, [b, B, b, B], strict=True):
        assert out.shape == rhs.shape
        np.testing.assert_allclose(out, np.linalg.solve(dense, rhs), rtol=1e-10, atol=1e-12)


def test_lowrank_cholesky_is_capacitance_factor():
    d, U = _lowrank()
    Lc = np.asarray(LOWRANK_CHOL(d, U))
    np.testing.assert_allclose(Lc @ Lc.T, np.eye(3) + U.T @ (U / d[:, None]), rtol=1e-12)


def test_lowrank_logdet_matches_slogdet():
    d, U = _lowrank()
    sign, expected = np.linalg.slogdet(np.diag(d) + U @ U.T)
    assert sign == 1.0
    logdet = jax.jit(la.lowrank_logdet)
    assert float(logdet(d, U)) == pytest.approx(expected, abs=1e-10)
    assert float(logdet(d, U, LOWRANK_CHOL(d, U))) == pytest.approx(expected, abs=1e-10)


def test_triangular_helpers_and_logdet():
    A = _spd(N, seed=40)
    B = np.random.default_rng(41).normal(size=(N, 2))
    L = CHOL(A)
    Ln = np.linalg.cholesky(A)
    np.testing.assert_allclose(np.asarray(la.solve_lower(L, B)), np.linalg.solve(Ln, B),
                               rtol=1e-10)
    np.testing.assert_allclose(np.asarray(la.solve_upper_t(L, B)), np.linalg.solve(Ln.T, B),
                               rtol=1e-10)
    np.testing.assert_allclose(np.asarray(la.cho_solve(L, B)), np.linalg.solve(A, B),
                               rtol=1e-10)
    assert float(la.logdet_chol(L)) == pytest.approx(np.linalg.slogdet(A)[1], abs=1e-12)
