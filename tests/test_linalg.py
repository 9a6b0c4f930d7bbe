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


def _sym_grad_K(r, K_used, level=0.0):
    """R&W eq. 5.9 in numpy: the symmetric d log N(r | 0, K) / dK, evaluated at the matrix
    actually factorised, K_used = K + level mean(diag K) I, plus the adjoint of the jitter
    moving with mean(diag K) (level tr(G) / n on the diagonal)."""
    alpha = np.linalg.solve(K_used, r)
    G = 0.5 * (np.outer(alpha, alpha) - np.linalg.inv(K_used))
    G = 0.5 * (G + G.T)
    return G + level * np.trace(G) / len(r) * np.eye(len(r))


def _rel(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b)))


def test_mvn_logpdf_gradient_at_moderate_size_matches_three_oracles():
    """n = 600, cond 1e3, so that K^{-1} is swept over several column panels, the last one
    ragged: the K-cotangent against R&W eq. 5.9 in numpy, autodiff through
    jax.scipy.stats.multivariate_normal.logpdf, and central differences of the value."""
    n = 600
    rng = np.random.default_rng(50)
    r, K = rng.normal(size=n), _spd(n, seed=51, cond=1e3)
    value, (gr, GK) = jax.jit(jax.value_and_grad(la.mvn_logpdf, argnums=(0, 1)))(r, K)
    GK = np.asarray(GK)
    np.testing.assert_allclose(GK, GK.T, rtol=0, atol=1e-15 * np.max(np.abs(GK)))
    assert _rel(GK, _sym_grad_K(r, K)) < 1e-10
    assert _rel(gr, -np.linalg.solve(K, r)) < 1e-10
    jref = jax.scipy.stats.multivariate_normal.logpdf
    assert float(value) == pytest.approx(float(jref(r, np.zeros(n), K)), rel=1e-12)
    gr_ref, GK_ref = jax.jit(jax.grad(lambda r, K: jref(r, jnp.zeros(n), K), argnums=(0, 1)))(r, K)
    assert _rel(gr, gr_ref) < 1e-10
    assert _rel(GK, 0.5 * (GK_ref + GK_ref.T)) < 1e-10
    f = jax.jit(la.mvn_logpdf)
    h = 1e-4
    fd_rounding = 20 * np.finfo(float).eps * abs(float(value)) / h  # |log N| ~ 1e3 here
    for i, j in [(7, 590), (300, 3), (599, 599)]:  # across and within panels
        E = np.zeros((n, n))
        E[i, j] = E[j, i] = 1.0
        fd = _fd(lambda t, E=E: f(r, K + t * E), 0.0, h=h)
        assert np.sum(GK * E) == pytest.approx(fd, rel=1e-6, abs=fd_rounding)


def test_mvn_logpdf_gradient_matrix_when_jitter_kicks_in():
    """Duplicated inputs make K singular: the value and the gradient are those of the
    jittered K_J = K + J mean(diag K) I, the gradient with the jitter's own share. J = 1e-3
    keeps K_J well conditioned, so numpy's inverse is an exact-enough oracle."""
    J = 1e-3
    la.set_jitter_levels([J])
    rng = np.random.default_rng(52)
    X = rng.normal(size=(30, 2))
    X = np.concatenate([X, X[:10]])  # 40 points, rank 30
    K = 1.7 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, -1))
    assert not np.all(np.isfinite(np.asarray(jnp.linalg.cholesky(K))))  # the plain one fails
    r = rng.normal(size=40)
    value, (gr, GK) = jax.jit(jax.value_and_grad(la.mvn_logpdf, argnums=(0, 1)))(r, K)
    KJ = K + J * np.mean(np.diag(K)) * np.eye(40)
    expected = scipy.stats.multivariate_normal(np.zeros(40), KJ).logpdf(r)
    assert float(value) == pytest.approx(expected, rel=1e-11)
    assert _rel(GK, _sym_grad_K(r, KJ, J)) < 1e-10
    assert _rel(gr, -np.linalg.solve(KJ, r)) < 1e-10
    # the jitter's share is what makes the gradient consistent with the value
    f = jax.jit(la.mvn_logpdf)
    fd = _fd(lambda t: f(r, K * (1 + t)), 0.0, h=1e-6)
    assert float(np.sum(GK * K)) == pytest.approx(fd, rel=1e-6)


def test_mvn_logpdf_gradient_under_vmap():
    """A batch holding a well-conditioned K, a singular one (jitter) and an indefinite one
    (NaN, its factorisation fails at every level): each entry equals the unbatched call."""
    rng = np.random.default_rng(53)
    r = rng.normal(size=(3, N))
    K = np.stack([_spd(N, seed=54, cond=100.0), _rank_one(N), -np.eye(N)])
    vg = jax.value_and_grad(la.mvn_logpdf, argnums=(0, 1))
    values, (gr, GK) = jax.jit(jax.vmap(vg))(r, K)
    for b in range(2):
        v1, (gr1, GK1) = jax.jit(vg)(r[b], K[b])
        assert float(values[b]) == pytest.approx(float(v1), rel=1e-13)
        np.testing.assert_allclose(gr[b], gr1, rtol=1e-12, atol=0)
        assert _rel(GK[b], GK1) < 1e-12
    assert _rel(GK[0], _sym_grad_K(r[0], K[0])) < 1e-10
    assert np.isnan(float(values[2])) and np.all(np.isnan(np.asarray(GK[2])))
    # two n = 300 problems (two column panels each), vmapped as a user would: with jaxlib
    # 0.10's batched LAPACK kernels this deadlocked XLA's 2-thread intra-op pool (every pool
    # thread idle, the result never ready); linalg makes one matrix per LAPACK call instead
    r = rng.normal(size=(2, 300))
    K = np.stack([_spd(300, seed=57, cond=100.0), _spd(300, seed=58, cond=1e3)])
    GK = np.asarray(jax.jit(jax.vmap(jax.grad(la.mvn_logpdf, argnums=1)))(r, K))
    for b in range(2):
        assert _rel(GK[b], _sym_grad_K(r[b], K[b])) < 1e-10


def test_mvn_logpdf_forward_mode_and_second_order_in_K():
    """jax.jvp runs the custom rule directly; jax.hessian (forward over reverse) and
    reverse over reverse differentiate its K^{-1} too. Oracle: plain autodiff through a
    bare Cholesky (_ref_logpdf) for K(theta) = theta0 A + theta1 B + I."""
    r, _ = _case(n=8, seed=55)
    A, B = _spd(8, seed=56), np.outer(np.arange(1.0, 9.0), np.arange(1.0, 9.0)) / 20

    def K_of(theta):
        return theta[0] * A + theta[1] * B + jnp.eye(8)

    theta = jnp.array([0.7, 1.9])
    ours = lambda th: la.mvn_logpdf(jnp.asarray(r), K_of(th))
    ref = lambda th: _ref_logpdf(jnp.asarray(r), K_of(th))
    u = jnp.array([0.3, -1.1])
    _, t_ours = jax.jit(lambda th: jax.jvp(ours, (th,), (u,)))(theta)
    _, t_ref = jax.jit(lambda th: jax.jvp(ref, (th,), (u,)))(theta)
    assert float(t_ours) == pytest.approx(float(t_ref), rel=1e-10)
    H_ref = np.asarray(jax.jit(jax.hessian(ref))(theta))
    H_fwd = np.asarray(jax.jit(jax.hessian(ours))(theta))
    H_rev = np.asarray(jax.jit(jax.jacrev(jax.grad(ours)))(theta))
    assert _rel(H_fwd, H_ref) < 1e-10
    assert _rel(H_rev, H_ref) < 1e-10


# --- vmap: one matrix per LAPACK call, derivatives of any order ---------------------------


def _batched_lapack_calls(fn, *args):
    """The LAPACK custom calls of jit(fn) that take a batch of matrices (jaxlib 0.10 runs
    those over XLA's intra-op pool, which they can deadlock on a few cores)."""
    calls = [line for line in jax.jit(fn).lower(*args).as_text().splitlines()
             if "custom_call @lapack_" in line]
    assert calls and all("num_batch_dims" in line for line in calls)
    return [line for line in calls if 'num_batch_dims = "0"' not in line]


def _batch(n=N, seed=60):
    """Three (r, K): well conditioned, ill conditioned, and singular (rank 3 of 5: the plain
    factorisation fails and the first jitter level is used)."""
    rng = np.random.default_rng(seed)
    K = np.stack([_spd(n, seed=seed + 1, cond=10.0), _spd(n, seed=seed + 2, cond=1e4),
                  _rank_one(n) + np.diag(np.arange(n) < 2)])
    assert not np.all(np.isfinite(np.asarray(jnp.linalg.cholesky(K[2]))))
    return rng.normal(size=(3, n)), K


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="batched kernels are kept off CPU only")
def test_vmapped_linalg_makes_no_batched_lapack_call():
    """Under vmap (also nested, and of derivatives of any order) every factorisation and
    triangular solve is a single-matrix LAPACK call. The detector is checked on a plain
    vmapped solve_triangular, which does make a batched one."""
    r, K = _batch()
    L = CHOL(K[0])
    plain = jax.vmap(lambda K, r: solve_triangular(K, r, lower=True))
    assert _batched_lapack_calls(plain, K, r)
    mvn, grad = la.mvn_logpdf, jax.grad(la.mvn_logpdf, argnums=(0, 1))
    cases = {
        "cholesky": (jax.vmap(la.cholesky), K),
        "grad cholesky": (jax.vmap(jax.grad(lambda K: jnp.sum(la.cholesky(K) ** 2))), K),
        "vmap grad": (jax.vmap(grad), r, K),
        "grad vmap": (jax.grad(lambda r, K: jnp.sum(jax.vmap(mvn)(r, K)), (0, 1)), r, K),
        "hessian": (jax.vmap(jax.hessian(mvn, (0, 1))), r, K),
        "jacrev grad": (jax.vmap(jax.jacrev(grad, (0, 1))), r, K),
        "nested": (jax.vmap(jax.vmap(la.cho_solve)), np.stack([K, K]), np.stack([r, r])),
        "shared L": (jax.vmap(la.solve_upper_t, (None, 0)), L, r),
        "shared B": (jax.vmap(la.solve_lower, (0, None)), K, r[0]),
        "cholesky_project": (jax.vmap(jax.grad(
            lambda K, B: jnp.sum(la.cholesky_project(K, B)[1] ** 2), (0, 1))), K, r[..., None]),
        "site_factors": (jax.vmap(la.site_factors), K, np.abs(r), r),
        "woodbury": (jax.vmap(la.woodbury_solve), 1.0 + np.abs(r), K[..., :2], r),
    }
    for name, (fn, *args) in cases.items():
        assert not _batched_lapack_calls(fn, *args), name


def _assert_vmap_equals_per_item(fn, *args, tol=1e-10):
    """jit(vmap(fn)) against jit(fn) on each batch item (fn returns a pytree)."""
    batched, one = jax.jit(jax.vmap(fn)), jax.jit(fn)
    out = batched(*args)
    for b in range(len(args[0])):
        item = one(*(a[b] for a in args))
        for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(item), strict=True):
            assert _rel(np.asarray(x)[b], y) < tol
    return out


def test_mvn_logpdf_derivatives_under_vmap_equal_the_unbatched_ones():
    """vmap of grad, jacfwd, hessian (forward over reverse) and reverse over reverse, and
    grad of vmap: per item, the unbatched derivative; the Hessian in r is -K^-1."""
    r, K = _batch()
    f = la.mvn_logpdf
    grad = jax.grad(f, argnums=(0, 1))

    def derivatives(r, K):
        return (grad(r, K), jax.jacfwd(f, (0, 1))(r, K), jax.hessian(f, (0, 1))(r, K),
                jax.jacrev(grad, (0, 1))(r, K))

    out = _assert_vmap_equals_per_item(derivatives, r, K)
    summed = jax.grad(lambda r, K: jnp.sum(jax.vmap(f)(r, K)), argnums=(0, 1))
    for x, y in zip(jax.jit(summed)(r, K), out[0], strict=True):
        assert _rel(x, y) < 1e-10
    for b in range(2):
        assert _rel(out[2][0][0][b], -np.linalg.inv(K[b])) < 1e-9


def test_cholesky_and_its_derivatives_under_vmap_equal_the_unbatched_ones():
    _, K = _batch()
    W = np.tril(np.random.default_rng(61).normal(size=(N, N)))
    loss = lambda K: jnp.sum(W * la.cholesky(K))
    L, _, _ = _assert_vmap_equals_per_item(
        lambda K: (la.cholesky(K), jax.grad(loss)(K), jax.hessian(loss)(K)), K)
    np.testing.assert_allclose(L[0], np.linalg.cholesky(K[0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["solve_lower", "solve_upper_t", "cho_solve"])
def test_triangular_solves_under_vmap_and_batched_leading_dimensions(name):
    """Batched L and B, a shared L (the batch folded into the columns of one solve), a
    shared B, and leading batch dimensions: against numpy; gradients against unbatched."""
    fn = getattr(la, name)
    rng = np.random.default_rng(62)
    K = np.stack([_spd(N, seed=63 + b, cond=100.0) for b in range(3)])
    L = np.linalg.cholesky(K)
    A = {"solve_lower": L, "solve_upper_t": np.swapaxes(L, 1, 2), "cho_solve": K}[name]
    B = rng.normal(size=(3, N, 2))
    expected = np.linalg.solve(A, B)
    np.testing.assert_allclose(fn(L, B), expected, rtol=1e-10)  # leading dimension
    np.testing.assert_allclose(fn(L, B[..., 0]), expected[..., 0], rtol=1e-10)

    @jax.jit
    def vmapped(L, B):
        return (jax.vmap(fn)(L, B), jax.vmap(fn, (None, 0))(L[0], B),
                jax.vmap(fn, (0, None))(L, B[0]))

    both, shared_L, shared_B = vmapped(L, B)
    np.testing.assert_allclose(both, expected, rtol=1e-10)
    np.testing.assert_allclose(shared_L, np.linalg.solve(A[0], B), rtol=1e-10)
    np.testing.assert_allclose(shared_B, np.linalg.solve(A, B[0]), rtol=1e-10)
    _assert_vmap_equals_per_item(
        jax.grad(lambda L, B: jnp.sum(jnp.sin(fn(L, B))), argnums=(0, 1)), L, B)


@pytest.mark.parametrize("fn", [la.solve_lower, la.solve_upper_t, la.cho_solve])
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((3, 2), (3,)), ((3, 3), (4,)),
                                    ((3, 3), ())], ids=["L1d", "Lrect", "rows", "B0d"])
def test_triangular_solves_reject_bad_shapes(fn, shapes):
    with pytest.raises(ValueError, match="L .* B"):
        fn(np.ones(shapes[0]), np.ones(shapes[1]))


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
