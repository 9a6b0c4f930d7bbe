"""Sparse GPs (SGPR, SVGP, VGP), the q(u) parameterisations and natural gradients, against
exact GP regression, dense numpy formulas and the identities of seed 001 / 004 (PART D).

All problems are well conditioned on purpose (Matern-5/2, lengthscale 0.8, inducing
points -- and the inputs where Z = X -- at least 0.3 apart, so cond(Kmm) < 1e3): the 1e-8
identities below then hold with margin in every parameterisation. Hyperparameters and
inducing inputs are frozen (``fixed``) wherever a variational fixed point is the oracle.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import multivariate_normal

import augmentedgp as agp
from augmentedgp.core.params import fixed, positive, real
from augmentedgp.core.quadrature import gauss_hermite
from augmentedgp.variational import CholeskyQ, NaturalQ, SiteQ, make_q, natgrad

S2 = 0.09
FULL_KINDS = ["whitened", "cholesky", "natural", "natural_whitened"]
ZGRID = np.linspace(0.3, 9.7, 12)[:, None]  # M = 12, spacing 0.85


# --- problems and dense oracles ------------------------------------------------------------


def kern(lengthscale=0.8, variance=1.3):
    return agp.kernels.Matern52(fixed(positive(lengthscale)), fixed(positive(variance)))


def gauss(s2=S2):
    return agp.likelihoods.Gaussian(fixed(positive(s2)))


def frozen(Z):
    return fixed(real(np.asarray(Z, dtype=float)))


def const_mean(c):
    return agp.means.Constant(fixed(real(c)))


def exact_data(n=30, seed=0):
    """n points on a grid (spacing 0.34; cond K ~ 7e2), so Z = X is well conditioned."""
    rng = np.random.default_rng(seed)
    X = np.linspace(0.0, 10.0, n)[:, None]
    return X, np.sin(X[:, 0]) + 0.3 * rng.normal(size=n)


def sparse_data(n=100, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 10.0, (n, 1))
    return X, np.sin(X[:, 0]) + 0.3 * rng.normal(size=n)


def binary_data(n=40, seed=2):
    rng = np.random.default_rng(seed)
    X = np.linspace(0.0, 10.0, n)[:, None]
    p = 1.0 / (1.0 + np.exp(-2.0 * np.sin(X[:, 0])))
    return X, np.where(rng.uniform(size=n) < p, 1.0, -1.0)


def dense(kernel, A, B=None):
    A = jnp.asarray(A)
    return np.asarray(kernel(A) if B is None else kernel(A, jnp.asarray(B)))


def chol(kernel, Z):
    """The factor of Kmm the models use (cond(Kmm) < 1e3: no jitter is added)."""
    return jnp.asarray(np.linalg.cholesky(dense(kernel, Z)))


def random_whitened_natural(M, seed):
    """(theta1, P) of a random, far-from-prior q(v)."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(M, M))
    P = B @ B.T / M + 0.3 * np.eye(M)
    return jnp.asarray(rng.normal(size=M) * 2.0), jnp.asarray(P)


def q_of(kind, theta1, P, Lmm):
    return make_q(kind, Lmm).from_whitened_natural(theta1, P, Lmm)


def with_q(model, q):
    return eqx.tree_at(lambda m: m.q, model, q)


def gauss_kl(m, S, K):
    """KL(N(m, S) || N(0, K)), dense."""
    cK = cho_factor(K, lower=True)
    M = K.shape[0]
    return 0.5 * (np.trace(cho_solve(cK, S)) + m @ cho_solve(cK, m) - M
                  + np.linalg.slogdet(K)[1] - np.linalg.slogdet(S)[1])


@eqx.filter_jit
def _q_grad(model, X, y):
    return jax.grad(lambda q: with_q(model, q)._elbo(X, y))(model.q)


def q_grad_max(model, X, y):
    """max |d ELBO / d raw q parameters| (autodiff, full batch)."""
    grad = _q_grad(model, jnp.asarray(X), jnp.asarray(y))
    return max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grad))


@eqx.filter_jit
def _ngd(model, X, y, rho, scale):
    p = model.project(X)
    beta, gamma = natgrad.quadrature_sites(model.likelihood, y, p.mean, p.var, p.prior_mean)
    q, r = natgrad.natural_step(model.q, p.Kmm, p.Lmm, p.Kmn, p.A, p.kdiag, beta, gamma, scale,
                                rho)
    return q, r, beta, gamma


def ngd(model, X, y, rho, scale=1.0):
    """One natgrad.natural_step of model.q on (X, y) with quadrature sites:
    (new q, rho taken, beta, gamma)."""
    return _ngd(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(rho, float),
                jnp.asarray(scale, float))


def ngd_step(model, X, y, rho, scale=1.0):
    """The model after one natural step, and the step size taken."""
    q, r, _, _ = ngd(model, X, y, rho, scale)
    return with_q(model, q), float(r)


# --- 1. Z = X: SGPR, DTC and FITC are exact GP regression -----------------------------------


@pytest.mark.parametrize("model", ["SGPR", "DTC", "FITC"])
def test_sgpr_with_Z_equal_X_is_exact_gp(model):
    X, y = exact_data()
    gp = agp.GP(kern(), gauss())
    lml = gp.log_marginal_likelihood(X, y)
    sgpr = getattr(agp, model)(kern(), frozen(X), likelihood=gauss())
    np.testing.assert_allclose(sgpr.objective(X, y), lml, rtol=1e-8)
    if model == "SGPR":
        np.testing.assert_allclose(sgpr.elbo(X, y), lml, rtol=1e-8)
        np.testing.assert_allclose(sgpr.upper_bound(X, y), lml, rtol=1e-8)  # tr(K - Q) = 0

    Xs = np.linspace(-1.0, 11.0, 17)[:, None]
    ref_mean, ref_cov = gp.posterior(X, y).predict_f(Xs, full_cov=True)
    svgp = sgpr.to_svgp(X, y)
    mu, var = svgp.predict_f(Xs)
    np.testing.assert_allclose(mu, ref_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var, np.diag(ref_cov), rtol=1e-6, atol=1e-8)
    mu_full, cov = svgp.predict_f(Xs, full_cov=True)
    np.testing.assert_allclose(mu_full, ref_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-6, atol=1e-8)
    # the uncollapsed bound at the model's closed-form q(u) is the exact lml too
    np.testing.assert_allclose(svgp.elbo(X, y), lml, rtol=1e-8)


# --- 2. random Z: the sandwich, the dense formulas and the eigenvalue limit ---------------


def dense_sgpr(kernel, X, y, Z, s2):
    """(vfe, dtc, fitc, upper, trace) from dense n x n formulas (seed 001 eq. 2.17,
    seed 004 B.3-B.4 with the errata K_uu^-1 and c I)."""
    K, Kmn, Kmm = dense(kernel, X), dense(kernel, Z, X), dense(kernel, Z)
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    n = len(y)
    trace = np.trace(K - Q)
    eye = np.eye(n)
    dtc = multivariate_normal(np.zeros(n), Q + s2 * eye).logpdf(y)
    fitc = multivariate_normal(np.zeros(n), Q + np.diag(np.diag(K - Q)) + s2 * eye).logpdf(y)
    upper = (-0.5 * n * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(Q + s2 * eye)[1]
             - 0.5 * y @ np.linalg.solve(Q + (trace + s2) * eye, y))
    return dtc - 0.5 * trace / s2, dtc, fitc, upper, trace


def random_Z(M, seed):
    """M points of a grid of spacing 0.5 on [0, 10], each moved by up to 0.1 (>= 0.3 apart)."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 10.0, 21)
    return np.sort(rng.choice(grid, M, replace=False) + rng.uniform(-0.1, 0.1, M))[:, None]


@pytest.mark.parametrize("seed,M", [(0, 4), (2, 7)])
def test_collapsed_bounds_random_Z(seed, M):
    X, y = sparse_data(n=60)
    Z = random_Z(M, seed)
    k = kern()
    lml = agp.GP(k, gauss()).log_marginal_likelihood(X, y)
    vfe, dtc, fitc, upper, trace = dense_sgpr(k, X, y, Z, S2)
    sgpr = agp.SGPR(k, frozen(Z), likelihood=gauss())
    np.testing.assert_allclose(sgpr.elbo(X, y), vfe, rtol=1e-8)
    np.testing.assert_allclose(sgpr.upper_bound(X, y), upper, rtol=1e-8)
    # (the upper bound of FITC: test_fitc_model_upper_bound_is_titsias_upper_bound)
    if M == 4:
        for cls, ref in ((agp.DTC, dtc), (agp.FITC, fitc)):
            model = cls(k, frozen(Z), likelihood=gauss())
            np.testing.assert_allclose(model.objective(X, y), ref, rtol=1e-8)
            np.testing.assert_allclose(model.elbo(X, y), vfe, rtol=1e-8)  # whatever the model
    assert vfe < lml < upper
    assert vfe < dtc  # the trace term is a penalty
    assert trace > 0
    eig = np.linalg.eigvalsh(dense(k, X))  # ascending
    assert trace >= np.sum(eig[: len(y) - M])  # seed 004 B.4
    if M == 7:  # a constant prior mean c: the bound of y - c under a zero mean
        with_mean = agp.SGPR(k, frozen(Z), likelihood=gauss(), mean=const_mean(-1.5))
        np.testing.assert_allclose(with_mean.elbo(X, y - 1.5), vfe, rtol=1e-8)


def test_fitc_model_upper_bound_is_titsias_upper_bound():
    X, y = sparse_data(n=60)
    Z = random_Z(4, 0)
    k = kern()
    lml = agp.GP(k, gauss()).log_marginal_likelihood(X, y)
    upper = dense_sgpr(k, X, y, Z, S2)[3]
    value = agp.FITC(k, frozen(Z), likelihood=gauss()).upper_bound(X, y)
    assert value >= lml
    np.testing.assert_allclose(value, upper, rtol=1e-8)


def test_adding_inducing_points_never_decreases_the_bound():
    X, y = sparse_data(n=60)
    grid = np.linspace(0.0, 10.0, 21)
    k = kern()
    lml = agp.GP(k, gauss()).log_marginal_likelihood(X, y)
    rng = np.random.default_rng(5)
    for _ in range(4):  # 4 random points, then 3 random additions
        order = rng.permutation(len(grid))
        values = [agp.SGPR(k, frozen(np.sort(grid[order[:m]])[:, None]),
                           likelihood=gauss()).elbo(X, y) for m in range(4, 8)]
        steps = np.diff(values)
        assert np.all(steps >= -1e-10 * abs(lml)), steps  # seed 004 Theorem 2
        assert values[-1] <= lml
        assert values[-1] > values[0]


# --- 4. SVGP at the closed-form q(u) is the collapsed bound ----------------------------------


@pytest.mark.parametrize("kind", FULL_KINDS)
def test_svgp_at_optimal_q_equals_collapsed_bound(kind):
    X, y = sparse_data()
    k = kern()
    sgpr = agp.SGPR(k, frozen(ZGRID), likelihood=gauss())
    F = sgpr.elbo(X, y)
    Lmm = chol(k, ZGRID)
    t1, P = sgpr.optimal_q(X, y).whitened_natural(Lmm)
    model = agp.SVGP(k, gauss(), frozen(ZGRID), q=q_of(kind, t1, P, Lmm))
    np.testing.assert_allclose(model.elbo(X, y), F, rtol=1e-8)
    np.testing.assert_allclose(sgpr.to_svgp(X, y).elbo(X, y), F, rtol=1e-8)
    # a stationary point of the uncollapsed bound in q (seed 001 eqs. 2.26-2.27)
    g_opt = q_grad_max(model, X, y)
    rand = with_q(model, q_of(kind, *random_whitened_natural(12, 7), Lmm))
    g_rand = q_grad_max(rand, X, y)
    assert g_opt < 1e-8 * max(g_rand, 1.0), (g_opt, g_rand)
    assert rand.elbo(X, y) < F - 1e-3  # strictly smaller away from the optimum
    # a small perturbation of the optimum also lowers it (a maximum, not a saddle)
    near = with_q(model, q_of(kind, t1 + 1e-2, P + 1e-2 * jnp.eye(12), Lmm))
    assert near.elbo(X, y) < F


# --- 5. natural gradients with a Gaussian likelihood -----------------------------------------


@pytest.mark.parametrize("kind", FULL_KINDS)
def test_unit_natural_step_in_fit_reaches_collapsed_bound(kind):
    """One step of size 1 from a random q(u) (seed 001 D.9)."""
    X, y = sparse_data()
    k = kern()
    sgpr = agp.SGPR(k, frozen(ZGRID), likelihood=gauss())
    F = sgpr.elbo(X, y)
    Lmm = chol(k, ZGRID)
    start = agp.SVGP(k, gauss(), frozen(ZGRID), q=q_of(kind, *random_whitened_natural(12, 3), Lmm))
    assert start.elbo(X, y) < F - 1.0

    post = agp.fit(start, X, y, agp.QuadratureVI(1.0), max_iter=1, chunk_size=1)
    np.testing.assert_allclose(post.elbo(), F, rtol=1e-8)
    np.testing.assert_allclose(post.history.objective, [-start.elbo(X, y)], rtol=1e-12)
    np.testing.assert_allclose(post.history.step_size, [1.0])
    Kmm = jnp.asarray(dense(k, ZGRID))
    m_opt, S_opt = sgpr.optimal_q(X, y).mean_cov(Kmm, Lmm)
    m_fit, S_fit = post.model.q.mean_cov(Kmm, Lmm)
    np.testing.assert_allclose(m_fit, m_opt, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(S_fit, S_opt, rtol=1e-8, atol=1e-10)
    # the low-level step: its sites are the closed form for N(y | f, s2)
    q, rho, beta, gamma = ngd(start, X, y, 1.0)
    np.testing.assert_allclose(beta, y / S2, rtol=1e-10)
    np.testing.assert_allclose(gamma, np.full(len(y), 1.0 / S2), rtol=1e-10)
    assert float(rho) == 1.0
    np.testing.assert_allclose(with_q(start, q).elbo(X, y), F, rtol=1e-8)


def test_natural_steps_low_level():
    """natgrad.natural_step with rho < 1:
    theta_t - theta* = (1 - rho)^t (theta_0 - theta*) in natural parameters and the ELBO
    never decreases (seed 001 D.9-D.12); every parameterisation holds the same q(u)."""
    X, y = sparse_data()
    k = kern()
    sgpr = agp.SGPR(k, frozen(ZGRID), likelihood=gauss())
    F = sgpr.elbo(X, y)
    Lmm = chol(k, ZGRID)
    Kmm = jnp.asarray(dense(k, ZGRID))
    star1, starP = sgpr.optimal_q(X, y).whitened_natural(Lmm)
    t1, P = random_whitened_natural(12, 11)
    rho, T = 0.3, 8
    models = {kind: agp.SVGP(k, gauss(), frozen(ZGRID), q=q_of(kind, t1, P, Lmm))
              for kind in FULL_KINDS}
    previous = {kind: m.elbo(X, y) for kind, m in models.items()}
    for t in range(1, T + 1):
        for kind in FULL_KINDS:
            models[kind], r = ngd_step(models[kind], X, y, rho)
            assert r == rho
            n1, nP = models[kind].q.whitened_natural(Lmm)
            factor = (1.0 - rho) ** t
            np.testing.assert_allclose(n1 - star1, factor * (t1 - star1), rtol=1e-9,
                                       atol=1e-12 * float(jnp.max(jnp.abs(t1 - star1))))
            np.testing.assert_allclose(nP - starP, factor * (P - starP), rtol=1e-9,
                                       atol=1e-12 * float(jnp.max(jnp.abs(P - starP))))
            value = models[kind].elbo(X, y)
            assert previous[kind] <= value <= F + 1e-9 * abs(F)
            previous[kind] = value
        ref_m, ref_S = models["whitened"].q.mean_cov(Kmm, Lmm)
        for kind in FULL_KINDS[1:]:
            m, S = models[kind].q.mean_cov(Kmm, Lmm)
            np.testing.assert_allclose(m, ref_m, rtol=1e-8, atol=1e-9)
            np.testing.assert_allclose(S, ref_S, rtol=1e-8, atol=1e-10)


# --- 6. the O(M) site parameterisation -------------------------------------------------------


def test_site_unit_step_with_Z_equal_X_is_exact_gp():
    X, y = exact_data()
    gp = agp.GP(kern(), gauss())
    lml = gp.log_marginal_likelihood(X, y)
    model = agp.SVGP(kern(), gauss(), frozen(X), q="site")
    assert model.q.num_params == 2 * len(y)
    post = agp.fit(model, X, y, agp.QuadratureVI(1.0), max_iter=1, chunk_size=1)
    q = post.model.q
    np.testing.assert_allclose(q.lam.value, y / S2, rtol=1e-8, atol=1e-8)  # seed 001 D.18
    np.testing.assert_allclose(q.g.value, np.full(len(y), 1.0 / S2), rtol=1e-8)
    np.testing.assert_allclose(post.elbo(), lml, rtol=1e-8)
    Xs = np.linspace(-1.0, 11.0, 17)[:, None]
    ref_mean, ref_cov = gp.posterior(X, y).predict_f(Xs, full_cov=True)
    mu, var = post.predict_f(Xs)
    np.testing.assert_allclose(mu, ref_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var, np.diag(ref_cov), rtol=1e-6, atol=1e-8)


@eqx.filter_jit
def _site_grad(model, X, y):
    """Euclidean gradient of the ELBO w.r.t. the site values (lam, g)."""
    q = model.q

    def elbo(lam, g):
        qq = dataclasses.replace(q, lam=dataclasses.replace(q.lam, raw=lam),
                                 g=dataclasses.replace(q.g, raw=q.g.transform.inverse(g)))
        return with_q(model, qq)._elbo(X, y)

    return jnp.concatenate(jax.grad(elbo, (0, 1))(q.lam.value, q.g.value))


@pytest.mark.slow
def test_site_damped_steps_reach_a_stationary_point_below_the_collapsed_bound():
    X, y = sparse_data()
    k = kern()
    F = agp.SGPR(k, frozen(ZGRID), likelihood=gauss()).elbo(X, y)
    model = agp.SVGP(k, gauss(), frozen(ZGRID), q="site")
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    g0 = float(jnp.max(jnp.abs(_site_grad(model, Xj, yj))))
    post = agp.fit(model, X, y, agp.QuadratureVI(0.1), max_iter=300, chunk_size=100, tol=0.0)
    g_end = float(jnp.max(jnp.abs(_site_grad(post.model, Xj, yj))))
    assert g_end < 1e-8 * g0, (g_end, g0)
    assert np.all(post.model.q.g.value > 1.0)  # an interior point of g > 0
    assert post.elbo() < F  # the diagonal family is strictly smaller (seed 001 A.7.2)
    assert post.elbo() > -post.history.objective[0]


def test_site_kl_and_moments_match_dense_formulas():
    rng = np.random.default_rng(4)
    k = kern()
    Kmm_np = dense(k, ZGRID)
    Kmm, Lmm = jnp.asarray(Kmm_np), chol(k, ZGRID)
    lam, g = rng.normal(size=12) * 3.0, rng.uniform(0.5, 5.0, size=12)
    q = SiteQ(real(lam), positive(g))
    S = np.linalg.inv(np.linalg.inv(Kmm_np) + np.diag(g))  # seed 001 eq. 3.5
    m = S @ lam
    m_q, S_q = q.mean_cov(Kmm, Lmm)
    np.testing.assert_allclose(m_q, m, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(S_q, S, rtol=1e-9, atol=1e-11)
    m_gen, S_gen = agp.variational.QPosterior.mean_cov(q, Kmm, Lmm)  # via whitened_natural
    np.testing.assert_allclose(m_gen, m, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(S_gen, S, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(q.kl(Kmm, Lmm), gauss_kl(m, S, Kmm_np), rtol=1e-10)  # eq. 3.7


def test_parameter_counts():
    Lmm = jnp.eye(50)
    assert make_q("site", Lmm).num_params == 100  # 2M vs M + M(M + 1) / 2 (seed 001 D.22)
    for kind in FULL_KINDS:
        assert make_q(kind, Lmm).num_params == 1325


# --- 7. conversions between parameterisations ------------------------------------------------


def test_parameterisations_describe_the_same_distribution():
    k = kern()
    Kmm_np = dense(k, ZGRID)
    Kmm, Lmm = jnp.asarray(Kmm_np), chol(k, ZGRID)
    t1, P = random_whitened_natural(12, 21)
    Pinv = np.linalg.inv(np.asarray(P))
    L = np.asarray(Lmm)
    m = L @ Pinv @ np.asarray(t1)
    S = L @ Pinv @ L.T
    Xs = np.linspace(-0.5, 10.5, 9)[:, None]
    Kxm, Kxx = dense(k, Xs, ZGRID), dense(k, Xs)
    W = Kxm @ np.linalg.inv(Kmm_np)
    f_mean, f_cov = W @ m, Kxx - W @ Kmm_np @ W.T + W @ S @ W.T  # seed 001 A.4 marginals
    Kmn = jnp.asarray(Kxm.T)
    A = agp.linalg.solve_lower(Lmm, Kmn)
    kl = gauss_kl(m, S, Kmm_np)
    for kind, cls in zip(FULL_KINDS, [CholeskyQ, CholeskyQ, NaturalQ, NaturalQ], strict=True):
        q = q_of(kind, t1, P, Lmm)
        assert isinstance(q, cls)
        mq, Sq = q.mean_cov(Kmm, Lmm)
        np.testing.assert_allclose(mq, m, rtol=1e-9, atol=1e-10, err_msg=kind)
        np.testing.assert_allclose(Sq, S, rtol=1e-9, atol=1e-11, err_msg=kind)
        b1, bP = q.whitened_natural(Lmm)
        np.testing.assert_allclose(b1, t1, rtol=1e-9, atol=1e-10, err_msg=kind)
        np.testing.assert_allclose(bP, P, rtol=1e-9, atol=1e-10, err_msg=kind)
        np.testing.assert_allclose(q.kl(Kmm, Lmm), kl, rtol=1e-10, err_msg=kind)
        mu, cov = q.conditional(Kmm, Lmm, Kmn, A, jnp.diag(jnp.asarray(Kxx)), jnp.asarray(Kxx),
                                full_cov=True)
        np.testing.assert_allclose(mu, f_mean, rtol=1e-9, atol=1e-10, err_msg=kind)
        np.testing.assert_allclose(cov, f_cov, rtol=1e-8, atol=1e-10, err_msg=kind)
        mu, var = q.conditional(Kmm, Lmm, Kmn, A, jnp.diag(jnp.asarray(Kxx)))
        np.testing.assert_allclose(var, np.diag(f_cov), rtol=1e-8, atol=1e-10, err_msg=kind)
    # the site family: its marginals against the same dense formula
    rng = np.random.default_rng(22)
    g = rng.uniform(0.5, 5.0, 12)
    site = SiteQ(real(rng.normal(size=12)), positive(g))
    ms, Ss = (np.asarray(a) for a in site.mean_cov(Kmm, Lmm))
    mu, cov = site.conditional(Kmm, Lmm, Kmn, A, jnp.diag(jnp.asarray(Kxx)), jnp.asarray(Kxx),
                               full_cov=True)
    np.testing.assert_allclose(mu, W @ ms, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(cov, Kxx - W @ Kmm_np @ W.T + W @ Ss @ W.T, rtol=1e-8, atol=1e-10)


# --- 8. minibatches --------------------------------------------------------------------------


def test_minibatch_estimates_average_to_the_full_batch():
    """Averaged over a partition into equal batches, the minibatch ELBO estimate and the
    natural-gradient target equal their full-batch values (seed 001 D.13); a non-Gaussian
    likelihood, so that the sites depend on q."""
    X, y = sparse_data()
    y = np.where(y > 0, 1.0, -1.0)
    k = kern()
    Lmm = chol(k, ZGRID)
    t1, P = random_whitened_natural(12, 9)
    model = agp.SVGP(k, agp.likelihoods.Logistic(), frozen(ZGRID),
                     q=q_of("whitened", 0.1 * t1, P, Lmm))
    n, nb = len(y), 4
    batches = np.random.default_rng(0).permutation(n).reshape(nb, n // nb)
    estimates = [model.elbo(X[b], y[b], num_data=n) for b in batches]
    full = model.elbo(X, y)
    np.testing.assert_allclose(np.mean(estimates), full, rtol=1e-10)
    assert np.std(estimates) > 1e-3  # the batches really differ
    targets = [ngd_step(model, X[b], y[b], 1.0, scale=n / (n // nb))[0].q.whitened_natural(Lmm)
               for b in batches]
    full1, fullP = ngd_step(model, X, y, 1.0)[0].q.whitened_natural(Lmm)
    np.testing.assert_allclose(np.mean([t[0] for t in targets], 0), full1, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.mean([t[1] for t in targets], 0), fullP, rtol=1e-9, atol=1e-9)


# --- 9. quadrature VI with non-Gaussian likelihoods ------------------------------------------


@pytest.mark.slow
def test_vgp_logistic_fixed_point_is_stationary_and_equals_svgp_with_Z_equal_X():
    X, y = binary_data()
    k = kern(1.0, 2.0)
    vgp = agp.fit(agp.VGP(k, agp.likelihoods.Logistic()), X, y, agp.QuadratureVI(0.5),
                  max_iter=100, chunk_size=50, tol=0.0)
    assert np.asarray(vgp.model.inducing.value).shape == X.shape
    g0 = q_grad_max(agp.VGP(k, agp.likelihoods.Logistic()).bind(X), X, y)
    assert q_grad_max(vgp.model, X, y) < 1e-8 * g0
    svgp = agp.fit(agp.SVGP(k, agp.likelihoods.Logistic(), frozen(X), q="natural"), X, y,
                   agp.QuadratureVI(0.5), max_iter=100, chunk_size=50, tol=0.0)
    np.testing.assert_allclose(svgp.elbo(), vgp.elbo(), rtol=1e-8)
    np.testing.assert_allclose(vgp.model.elbo(X, y), vgp.elbo(), rtol=1e-12)


def test_poisson_closed_form_expectation_equals_gauss_hermite():
    if not hasattr(agp.likelihoods, "Poisson"):
        pytest.skip("no Poisson likelihood")
    lik = agp.likelihoods.Poisson()
    y = jnp.asarray([0.0, 1.0, 3.0, 7.0, 12.0])
    mean = jnp.asarray([-1.0, 0.0, 0.5, 2.0, 2.4])
    var = jnp.asarray([0.1, 1.0, 0.3, 0.05, 0.5])
    closed = lik.variational_expectations(y, mean, var)
    quad = gauss_hermite(lambda f: lik.log_prob(y[:, None], f), mean, var, 60)
    np.testing.assert_allclose(closed, quad, rtol=1e-10)


# --- 10. stochastic VI ----------------------------------------------------------------------


@pytest.mark.slow
def test_svi_gaussian_ends_near_the_collapsed_bound():
    """With fixed hyperparameters the gap F - ELBO is KL(q || q*) >= 0 (the sites of a
    Gaussian likelihood do not depend on q, so each minibatch step moves theta towards
    that batch's target). With a constant rho the iterate keeps fluctuating by O(sqrt(rho))
    and the gap is O(rho): 4e-5..9e-5 |F| for rho = 0.1 over 4 seeds. With the decaying
    RobbinsMonro(0.6, 10) schedule it was 8e-7..2e-6 |F| after 400 steps (4 seeds);
    the tolerance 1e-4 |F| (0.014 nats) leaves a margin of 50."""
    X, y = sparse_data(n=200, seed=3)
    F = agp.SGPR(kern(), frozen(ZGRID), likelihood=gauss()).elbo(X, y)
    model = agp.SVGP(kern(), gauss(), frozen(ZGRID))
    schedule = agp.schedules.RobbinsMonro(0.6, 10.0)
    post = agp.fit(model, X, y, agp.QuadratureSVI(50, schedule), max_iter=400, chunk_size=200,
                   tol=0.0, key=jax.random.key(0))
    gap = F - post.elbo()
    assert -1e-9 * abs(F) <= gap < 1e-4 * abs(F), gap / abs(F)
    assert post.history.n_iter == 400
    np.testing.assert_allclose(post.history.step_size, [float(schedule(t)) for t in range(400)],
                               rtol=1e-12)


# --- 11. schedules ---------------------------------------------------------------------------


def test_schedules():
    s = agp.schedules
    assert float(s.Constant(0.3)(17)) == pytest.approx(0.3)
    w = s.Warmup(1e-4, 1e-1, 40)
    np.testing.assert_allclose([float(w(t)) for t in (0, 13, 26, 39, 40, 100)],
                               [1e-4, 1e-3, 1e-2, 1e-1, 1e-1, 1e-1], rtol=1e-12)
    assert all(float(w(t + 1)) >= float(w(t)) for t in range(60))
    rm = s.RobbinsMonro(0.75, 2.0)
    np.testing.assert_allclose([float(rm(t)) for t in (0, 1, 14)],
                               [2.0**-0.75, 3.0**-0.75, 16.0**-0.75], rtol=1e-12)
    assert isinstance(s.as_schedule(0.5), s.Constant)
    assert s.as_schedule(rm) is rm
    bad = [lambda: s.Constant(0.0), lambda: s.Constant(1.5), lambda: s.Constant(-0.1),
           lambda: s.Warmup(0.0, 0.1, 40), lambda: s.Warmup(1e-4, 2.0, 40),
           lambda: s.Warmup(1e-4, 0.1, 0), lambda: s.RobbinsMonro(0.5),
           lambda: s.RobbinsMonro(1.1), lambda: s.RobbinsMonro(0.7, 0.5),
           lambda: agp.QuadratureVI(0.0), lambda: agp.QuadratureSVI(10, 2.0),
           lambda: agp.QuadratureSVI(0), lambda: agp.QuadratureSVI(2.5)]
    for make in bad:
        with pytest.raises(ValueError):
            make()


def test_adaptive_schedule():
    """Ranganath et al. (2013): rho = |E g|^2 / E|g|^2 of the averaged natural gradients.
    Identical gradients (no minibatch noise) give rho = 1 once the averages start; gradients
    that cancel give rho near 0; during the first init_steps the step is 0."""
    ad = agp.schedules.Adaptive(init_steps=5)
    d = jnp.asarray(np.random.default_rng(0).normal(size=7))
    state, rhos = ad.init(7), []
    for t in range(20):
        rho, state = ad.rate(state, t, d)
        rhos.append(float(rho))
    assert rhos[:5] == [0.0] * 5
    np.testing.assert_allclose(rhos[5:], 1.0, rtol=1e-12)
    state, rhos = ad.init(7), []
    for t in range(200):  # alternating signs: the running mean of g shrinks towards 0
        rho, state = ad.rate(state, t, d * (-1.0) ** t)
        rhos.append(float(rho))
    assert 0.0 <= min(rhos) and max(rhos[5:]) <= 1.0 and rhos[-1] < 0.05
    with pytest.raises(TypeError, match="rate"):
        ad(3)
    for bad in (0, 2.5, -1):
        with pytest.raises(ValueError):
            agp.schedules.Adaptive(bad)


# --- 12. bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("method,cls", [("vfe", "SGPR"), ("dtc", "DTC"), ("fitc", "FITC"),
                                        ("taylor", "TaylorSGPR")])
def test_the_removed_method_argument_names_the_class_to_use(method, cls):
    for model in (agp.SGPR, agp.DTC):
        with pytest.raises(TypeError, match=f"method={method!r}.*{cls}"):
            model(kern(), ZGRID, noise=S2, method=method)
    with pytest.raises(TypeError, match="base class"):
        agp.CollapsedSparseGP(kern(), ZGRID, noise=S2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nois'"):
        agp.SGPR(kern(), ZGRID, nois=S2)
    assert issubclass(getattr(agp, cls), agp.CollapsedSparseGP)


def test_bad_input_raises_value_error():
    X, y = sparse_data(n=20)
    k = kern()
    Z = np.array([[1.0], [2.0], [1.0]])
    with pytest.raises(ValueError, match="repeated"):
        agp.SVGP(k, gauss(), Z)
    with pytest.raises(ValueError, match="repeated"):
        agp.SGPR(k, Z, noise=S2)
    with pytest.raises(ValueError):
        agp.SVGP(k, gauss(), np.linspace(0, 1, 3))  # 1-D inducing
    model = agp.SVGP(k, gauss(), ZGRID)
    X2 = np.hstack([X, X])
    with pytest.raises(ValueError, match="columns"):
        model.elbo(X2, y)
    with pytest.raises(ValueError, match="columns"):
        model.predict_f(X2)
    with pytest.raises(ValueError, match="columns"):
        agp.SGPR(k, ZGRID, noise=S2).elbo(X2, y)
    with pytest.raises(ValueError):
        model.elbo(X, y[:-1])
    with pytest.raises(ValueError, match="batch_size"):
        agp.fit(model, X, y, agp.QuadratureSVI(21), max_iter=1)
    with pytest.raises(ValueError):
        agp.fit(agp.VGP(k, gauss()), X, y, agp.QuadratureSVI(5), max_iter=1)
    with pytest.raises(ValueError):
        agp.fit(model, X, y, agp.QuadratureVI(), max_iter=0)
    with pytest.raises(ValueError, match="SVGP"):  # no augmentation: not collapsible
        agp.SGPR(k, ZGRID, likelihood=agp.likelihoods.Probit())
    with pytest.raises(ValueError):
        agp.SGPR(k, ZGRID, noise=S2, likelihood=gauss())
    with pytest.raises(TypeError, match="method"):  # one class per model: no method argument
        agp.SGPR(k, ZGRID, noise=S2, method="sor")
    with pytest.raises(ValueError):
        agp.SVGP(k, gauss(), ZGRID, q="diagonal")
    with pytest.raises(ValueError):
        agp.VGP(k, gauss(), q="diagonal")
    with pytest.raises(ValueError):
        agp.SVGP(k, "gaussian", ZGRID)
    with pytest.raises(ValueError, match="not bound"):
        agp.VGP(k, gauss()).prior_kl()


@pytest.mark.parametrize("call", ["predict_f", "predict_y", "elbo"])
def test_unbound_vgp_raises_value_error(call):
    vgp = agp.VGP(kern(), gauss())
    X, y = exact_data(n=5)
    with pytest.raises(ValueError, match="not bound"):
        if call == "elbo":
            vgp.elbo(X, y)
        else:
            getattr(vgp, call)(X)


# --- 13. history -----------------------------------------------------------------------------


def test_history_step_sizes_and_validation():
    """Also a fit with a constant prior mean: the warm-up ends with rho = 1 steps, which
    reach the collapsed bound."""
    c = 0.5
    X, y = sparse_data()
    Xv, yv = sparse_data(n=30, seed=8)
    y, yv = y + c, yv + c
    schedule = agp.schedules.Warmup(1e-3, 1.0, 10)
    model = agp.SVGP(kern(), gauss(), frozen(ZGRID), mean=const_mean(c))
    post = agp.fit(model, X, y, agp.QuadratureVI(schedule), max_iter=30, chunk_size=10,
                   tol=0.0, validation_data=(Xv, yv), patience=100)
    h = post.history
    assert h.n_iter == 30
    assert h.step_size.shape == h.objective.shape == h.wall_time.shape == (30,)
    np.testing.assert_allclose(h.step_size, [float(schedule(t)) for t in range(30)], rtol=1e-12)
    assert h.validation.shape == (3,)  # one held-out value per chunk
    nlpd = -np.mean(np.asarray(post.predict_log_density(Xv, yv)))
    np.testing.assert_allclose(h.validation[-1], nlpd, rtol=1e-10)
    # Gaussian likelihood, fixed hyperparameters: natural steps with rho <= 1 never lower
    # the ELBO, and the objective is -ELBO before each step
    assert np.all(np.diff(h.objective) <= 1e-9 * abs(h.objective[0]))
    np.testing.assert_allclose(h.objective[0], -model.elbo(X, y), rtol=1e-12)
    F = agp.SGPR(kern(), frozen(ZGRID), likelihood=gauss(), mean=const_mean(c)).elbo(X, y)
    np.testing.assert_allclose(post.elbo(), F, rtol=1e-8)

    plain = agp.fit(model, X, y, agp.QuadratureVI(schedule), max_iter=30, chunk_size=10, tol=0.0)
    assert plain.history.validation is None
    np.testing.assert_allclose(plain.history.objective, h.objective, rtol=1e-12)
