"""Gaussian flows on models: ``fit(VGP(...), X, y, ParticleFlow | GaussianFlow)`` for GP
models (``flow_gp.GPTarget``, ``flow_gp.fit_flow``; SVGP models in test_flow_svgp.py), the
``LowRankQ`` they return, and the parametric targets of ``augmentedgp.bayesian`` with
``fit_gaussian`` (thesis ch. 6 sections 2.x, 4.5 BLR and 4.6 BNN; seed 000 part 2 section 2
and its errata), against oracles that share no code with the flows:

- GP regression (Gaussian likelihood, 12 points): GPF with N = n + 1 particles is the
  exact posterior (Theorem 1: exact for Gaussian targets), ELBO = log marginal likelihood.
- GP classification (12 points, 1-D, logistic, fixed RBF): the optimal Gaussian VI from
  ``QuadratureVI`` (Gauss-Hermite, natural gradients, q = "cholesky"). Full-rank Gaussian
  flow (GF) matches it; the Gaussian particle flow (GPF) is biased on a non-Gaussian
  target and its bias falls with the number of particles N (n + 1 vs 20 n); every flow's q,
  a ``LowRankQ`` (of low rank for N < n), is a valid bound: ELBO <= the optimum's. GF's
  ``history.objective`` (a Monte Carlo free energy) averages to -ELBO, GPF's (the particle
  free energy) lies below it.
- ELBOs and latent marginals are computed in numpy from each fitted q (q(v) in the
  whitened space: S_v = W W^T + I - P_W by SVD for a LowRankQ) with a 60-node Gauss-Hermite
  rule; they are checked once against the library's ``elbo()`` and ``predict_f``.
- Student-t regression with an outlier against ``QuadratureVI``; multi-class softmax:
  independent per-latent particle blocks (cross-latent factor entries exactly 0),
  normalised predictions, accuracy on a separable toy.
- Hyperparameters (Poisson counts, Matern-5/2 on a grid): GPF with a trainable kernel
  against the maximiser of the optimal-VGA bound over the hyperparameters (Nelder-Mead over
  fixed-hyperparameter ``QuadratureVI`` fits), beyond the best bound at the initial
  hyperparameters; at the learnt ones its q matches ``QuadratureVI`` (the count-likelihood
  check).
- ``LowRankQ`` against numpy: equal to ``CholeskyQ(whiten=True)`` for a full-rank factor;
  for rank-deficient (zero-padded) particle factors, KL, ``conditional`` and ``mean_cov`` of
  N(m, W W^T + I - P_W).
- Bayesian logistic regression (200 x 6, synthetic, correlated features): the optimal
  full-rank VGA by scipy L-BFGS on a Gauss-Hermite ELBO with analytic gradients (checked
  against its fixed-point conditions); GPF (N = 20 D), GF, ADVI and minibatch GPF match its
  mean, covariance and free energy (computed exactly for each q); SVGD with the centred
  linear kernel *is* GPF (same particles); predictions and ``free_energy`` of the oracle's
  Gaussian match Gauss-Hermite values within Monte Carlo error.
- Bayesian MLP on XOR (linear classifiers: ~50%): GPF "Layers" (per-layer blocks) classifies
  held-out points, its covariance is exactly block diagonal, probabilities sum to 1.
- Error cases of the targets and of ``fit`` with flows.

Tolerances are 2-5 times the measured discrepancies (quoted at each check; all runs are
seeded). XLA compilation (about 1-3 s per distinct method, likelihood and shape, plus the
library's eager set-up operations, compiled per shape) dominates the cost (about 60 s on 2
cores), so problems and shapes are shared between checks, fits are cached in module
fixtures and every flow runs in one compiled chunk. The sweep over N (``slow``) runs with
AGP_FULL_SLOW=1 only.
"""

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FULL
from scipy import linalg as sla
from scipy import optimize, special

import augmentedgp as agp
from augmentedgp.core.params import fixed, positive, real
from augmentedgp.variational import CholeskyQ, LowRankQ

LIK = agp.likelihoods
KEY = jax.random.key(1)
GH_T, GH_W = np.polynomial.hermite.hermgauss(60)
GH_W = GH_W / math.sqrt(math.pi)  # E[h(a)], a ~ N(mu, v): sum_k w_k h(mu + sqrt(2 v) t_k)


def fp(value):
    return fixed(positive(value))


def flow_fit(model, X, y, method, max_iter, **kw):
    """A flow fit in one compiled chunk (``chunk_size=max_iter``)."""
    return agp.fit(model, X, y, method, max_iter=max_iter, key=KEY, chunk_size=max_iter, **kw)


# --- numpy GP oracles: q(f(X)) from a fitted q, its ELBO and its predictions -------------------


def rbf(A, B, ls, var):
    d = np.asarray(A)[:, None, 0] - np.asarray(B)[None, :, 0]
    return var * np.exp(-0.5 * (d / ls) ** 2)


def matern52(A, B, ls, var):
    r = math.sqrt(5.0) * np.abs(np.asarray(A)[:, None, 0] - np.asarray(B)[None, :, 0]) / ls
    return var * (1.0 + r + r**2 / 3.0) * np.exp(-r)


class GPProblem(NamedTuple):
    """A 1-D GP problem: kernel ``kern(A, B)``, a constant prior mean and ``loglik(y, F)``,
    the log-likelihood in numpy (broadcast over the trailing quadrature axis of F)."""

    X: np.ndarray
    y: np.ndarray
    kern: object
    mean0: float
    loglik: object

    def chol(self):
        return np.linalg.cholesky(self.kern(self.X, self.X))


def whitened(post, prob):
    """(m_v, S_v) of q(v), f(X) = mean0 + L v with K = L L^T, from a fitted model's q: a
    LowRankQ (whitened; S_v = W W^T + I - P_W with P_W from an SVD of W) or an unwhitened
    CholeskyQ (QuadratureVI's reference)."""
    q = post.model.q
    if isinstance(q, LowRankQ):
        W = np.asarray(q.factor.value)
        U, s, _ = np.linalg.svd(W, full_matrices=False)
        U = U[:, s > 1e-8 * s.max()]
        return np.asarray(q.mean.value), W @ W.T + np.eye(W.shape[0]) - U @ U.T
    assert isinstance(q, CholeskyQ)
    m, R = np.asarray(q.mean.value), np.tril(np.asarray(q.chol.value))
    if not q.whiten:
        L = prob.chol()
        m, R = (sla.solve_triangular(L, a, lower=True) for a in (m, R))
    return m, R @ R.T


def np_elbo(prob, mv, Sv):
    """sum_i E_q[log p(y_i | f_i)] (60-node Gauss-Hermite) - KL(q(v) || N(0, I))."""
    L = prob.chol()
    mean = prob.mean0 + L @ mv
    var = np.einsum("ij,jk,ik->i", L, Sv, L)
    F = mean[:, None] + np.sqrt(2.0 * var)[:, None] * GH_T
    ell = np.sum(prob.loglik(prob.y[:, None], F) @ GH_W)
    kl = 0.5 * (np.trace(Sv) + mv @ mv - len(mv) - np.linalg.slogdet(Sv)[1])
    return ell - kl


def np_predict(prob, mv, Sv, Xs):
    """Mean and variance of f(Xs) under q: A = L^-1 K(X, Xs), mean0 + A^T m_v and
    k(x, x) - |A|^2 + A^T S_v A."""
    A = sla.solve_triangular(prob.chol(), prob.kern(prob.X, Xs), lower=True)
    kss = np.diag(prob.kern(Xs, Xs))
    var = kss - np.sum(A**2, 0) + np.einsum("ji,jk,ki->i", A, Sv, A)
    return prob.mean0 + A.T @ mv, var


def compare(prob, post, ref, Xs):
    """(ELBO(ref) - ELBO(post), max |mean difference|, max |sd ratio - 1|) of f(Xs)."""
    a, b = whitened(post, prob), whitened(ref, prob)
    m, v = np_predict(prob, *a, Xs)
    mr, vr = np_predict(prob, *b, Xs)
    return (np_elbo(prob, *b) - np_elbo(prob, *a), np.abs(m - mr).max(),
            np.abs(np.sqrt(v / vr) - 1).max())


def log_sigmoid(t):
    return -np.logaddexp(0.0, -t)


def student_t_loglik(df, scale):
    c = special.gammaln((df + 1) / 2) - special.gammaln(df / 2) - 0.5 * math.log(
        df * math.pi * scale**2)
    return lambda y, F: c - 0.5 * (df + 1) * np.log1p(((y - F) / scale) ** 2 / df)


def poisson_loglik(y, F):
    return y * F - np.exp(F) - special.gammaln(y + 1.0)


# --- GP classification: the optimal VGA from QuadratureVI ------------------------------------

N_C = 12
XC = np.linspace(-3.0, 3.0, N_C)[:, None]
YC = (np.sin(1.2 * XC[:, 0]) + 0.4 * np.random.default_rng(0).normal(size=N_C) > 0).astype(int)
XS = np.linspace(-4.0, 4.0, 9)[:, None]  # inside and beyond the data
LOGIT = GPProblem(XC, 2.0 * YC - 1.0, lambda A, B: rbf(A, B, 1.0, 2.0), 0.0,
                  lambda y, F: log_sigmoid(y * F))


def logit_model(q="whitened"):
    return agp.VGP(agp.kernels.RBF(fp(1.0), fp(2.0)), LIK.Logistic(), q=q)


@pytest.fixture(scope="module")
def logit_ref():
    """The optimal Gaussian VI (its bound is constant to 1e-8 after ~10 natural steps)."""
    ref = agp.fit(logit_model("cholesky"), XC, YC, agp.QuadratureVI(), max_iter=30,
                  chunk_size=30)
    assert np.ptp(ref.history.objective[-10:]) < 1e-8
    return ref


@pytest.fixture(scope="module")
def gpf_logit():
    """GPF fits of the classifier by particle number (cached: shared between tests)."""
    cache = {}

    def get(N):
        if N not in cache:
            cache[N] = flow_fit(logit_model(), XC, YC,
                                agp.ParticleFlow(n_particles=N, learning_rate=0.1), 2000)
        return cache[N]

    return get


def test_numpy_gp_oracles_match_library(logit_ref, gpf_logit):
    """The numpy ELBO and predictions used below equal the library's elbo() and predict_f
    for GPF's LowRankQ, and the bound QuadratureVI reports (its 20-node objective) for its
    CholeskyQ; the numpy log-likelihoods equal log_prob."""
    post = gpf_logit(20 * N_C)
    mv, Sv = whitened(post, LOGIT)
    np.testing.assert_allclose(np_elbo(LOGIT, mv, Sv), post.elbo(), rtol=1e-7)
    mean, var = post.predict_f(XS)
    m, v = np_predict(LOGIT, mv, Sv, XS)
    np.testing.assert_allclose(mean, m, atol=1e-8)
    np.testing.assert_allclose(var, v, atol=1e-8)
    np.testing.assert_allclose(np_elbo(LOGIT, *whitened(logit_ref, LOGIT)),
                               -logit_ref.history.objective[-1], rtol=1e-6)
    f = np.linspace(-3.0, 3.0, 7)
    cases = [(LIK.Logistic(), LOGIT.loglik, np.array([-1.0, 1.0] * 3 + [1.0])),
             (LIK.StudentT(3.0, 0.5), student_t_loglik(3.0, 0.5), f[::-1] * 0.7),
             (LIK.Poisson(), poisson_loglik, np.arange(7.0))]
    values = jax.jit(lambda: [lik.log_prob(jnp.asarray(y), jnp.asarray(f))
                              for lik, _, y in cases])()
    for (_, loglik, y), value in zip(cases, values, strict=True):
        np.testing.assert_allclose(loglik(y, f), value, rtol=1e-12)


def test_gp_regression_particle_flow_is_exact():
    """Gaussian likelihood (noise 0.1; the same inputs and kernel): the target is Gaussian,
    so GPF with N = n + 1 particles (the default D + 1) converges to the exact posterior
    (Theorem 1): mean and covariance of f(X) equal the numpy GP posterior, the ELBO equals
    the log marginal likelihood and so does the particle free energy (exact for quadratic
    potentials) -- all measured to 1e-12."""
    noise = 0.1
    y = np.sin(1.2 * XC[:, 0]) + math.sqrt(noise) * np.random.default_rng(5).normal(size=N_C)
    model = agp.VGP(agp.kernels.RBF(fp(1.0), fp(2.0)), LIK.Gaussian(fp(noise)))
    post = flow_fit(model, XC, y, agp.ParticleFlow(learning_rate=0.01), 2000)
    assert post.model.q.factor.value.shape == (N_C, N_C + 1)
    K = LOGIT.kern(XC, XC)
    G = K + noise * np.eye(N_C)
    lml = -0.5 * (y @ np.linalg.solve(G, y) + np.linalg.slogdet(G)[1]
                  + N_C * math.log(2 * math.pi))
    prob = GPProblem(XC, y, LOGIT.kern, 0.0,
                     lambda y, F: -0.5 * ((y - F) ** 2 / noise + math.log(2 * math.pi * noise)))
    mv, Sv = whitened(post, prob)
    L = prob.chol()
    np.testing.assert_allclose(L @ mv, K @ np.linalg.solve(G, y), atol=1e-8)
    np.testing.assert_allclose(L @ Sv @ L.T, K - K @ np.linalg.solve(G, K), atol=1e-8)
    np.testing.assert_allclose(np_elbo(prob, mv, Sv), lml, atol=1e-8)
    np.testing.assert_allclose(post.history.objective[-1], -lml, atol=1e-8)


def test_gp_classifier_gaussian_flow_matches_quadrature_vi(logit_ref):
    """Full-rank GF (100 fresh samples a step, eta = 0.003, 3000 steps) is unbiased: measured
    ELBO gap 0.0015, |dm| 0.014, sd 1.0% (200 samples and 6000 steps: 7e-4, 0.007, 0.4%);
    its q is a bound (gap >= 0), and its history (the Monte Carlo free energy before each
    step) averages to -ELBO over the last 1000 steps (measured 7.6775 vs 7.6748, se 0.034)."""
    post = flow_fit(logit_model(), XC, YC,
                    agp.GaussianFlow(n_samples=100, learning_rate=0.003), 3000)
    assert isinstance(post.model.q, LowRankQ)
    assert post.model.q.factor.value.shape == (N_C, N_C)
    gap, dm, dsd = compare(LOGIT, post, logit_ref, XS)
    assert -1e-7 <= gap < 0.006, gap
    assert dm < 0.04 and dsd < 0.04, (dm, dsd)
    tail = post.history.objective[-1000:]
    se = tail.std() / math.sqrt(len(tail) / 20)  # ~20-step autocorrelation, generously
    elbo = np_elbo(LOGIT, *whitened(post, LOGIT))
    assert abs(tail.mean() + elbo) < 4 * se + 0.005, (tail.mean(), elbo, se)


def test_gp_classifier_particle_flow_bias_falls_with_n(logit_ref, gpf_logit):
    """GPF with N = 20 n = 240 particles is close to the optimal VGA (measured gap 0.0018,
    |dm| 0.006, sd 2.6%); with N = n + 1 (the minimum for full rank, Theorem 1) it is 27
    times further in ELBO (gap 0.049, sd 12%): the particle bias falls with N (thesis 2.4).
    Both q's are bounds; the particle free energy (the history) is optimistic, below
    -ELBO."""
    few, many = gpf_logit(N_C + 1), gpf_logit(20 * N_C)
    g_few, dm_few, dsd_few = compare(LOGIT, few, logit_ref, XS)
    g_many, dm_many, dsd_many = compare(LOGIT, many, logit_ref, XS)
    assert g_few >= -1e-7 and g_many >= -1e-7
    assert g_many < 0.01 and dm_many < 0.03 and dsd_many < 0.07, (g_many, dm_many, dsd_many)
    assert g_many < g_few / 5, (g_many, g_few)
    assert dsd_many < dsd_few / 2, (dsd_many, dsd_few)
    for post in (few, many):
        assert post.history.objective[-1] < -np_elbo(LOGIT, *whitened(post, LOGIT))


def test_gp_classifier_low_rank_particle_flow_is_a_bound(logit_ref, gpf_logit):
    """N = 5 < n particles: q(v) = N(m, W W^T + I - P_W) with W of rank 4; elbo() (the
    library's, on the LowRankQ) is a valid but looser bound (measured gap 0.64 vs 0.0018 at
    N = 240), although its particle free energy (2.1) is far below -elbo() (8.3): the
    regularised particle entropy is no bound."""
    post = flow_fit(logit_model(), XC, YC, agp.ParticleFlow(n_particles=5, learning_rate=0.05),
                    2000)
    W = np.asarray(post.model.q.factor.value)
    assert W.shape == (N_C, 5)
    assert np.linalg.matrix_rank(W, tol=1e-8) == 4
    elbo = post.elbo()
    np.testing.assert_allclose(elbo, np_elbo(LOGIT, *whitened(post, LOGIT)), rtol=1e-7)
    gap = -logit_ref.history.objective[-1] - elbo  # QuadratureVI's converged bound
    gap_many, _, _ = compare(LOGIT, gpf_logit(20 * N_C), logit_ref, XS)
    assert gap > 10 * gap_many and gap >= 0.0, (gap, gap_many)
    assert post.history.objective[-1] < -elbo - 1.0


@pytest.mark.slow
def test_gp_classifier_particle_bias_monotone_in_n(logit_ref, gpf_logit):
    """The ELBO gap and the sd error decrease along N = n + 1, 4 n, 20 n, 50 n (measured gaps
    0.049, 0.013, 0.0018; AGP_FULL_SLOW=1 only: the default run compares n + 1 and 20 n
    above)."""
    if not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds the sweep over N)")
    Ns = [N_C + 1, 4 * N_C, 20 * N_C, 50 * N_C]
    res = [compare(LOGIT, gpf_logit(N), logit_ref, XS) for N in Ns]
    gaps = [r[0] for r in res]
    assert all(a > b for a, b in zip(gaps, gaps[1:], strict=False)), gaps
    sds = [r[2] for r in res]
    assert all(a > b for a, b in zip(sds, sds[1:], strict=False)), sds


# --- other likelihoods: Student-t, multi-class -------------------------------------------------

_rng = np.random.default_rng(0)
Y_T = np.sin(1.2 * XC[:, 0]) + 0.3 * _rng.standard_t(3, size=N_C)
Y_T[3] += 4.0  # an outlier: a non-Gaussian posterior
STUDENT_T = GPProblem(XC, Y_T, LOGIT.kern, 0.0, student_t_loglik(3.0, 0.5))


def student_t_model(q="whitened"):
    return agp.VGP(agp.kernels.RBF(fp(1.0), fp(2.0)), LIK.StudentT(fp(3.0), fp(0.5)), q=q)


def test_particle_flow_student_t_matches_quadrature_vi():
    """Student-t regression with an outlier: GPF with N = 20 n particles against the optimal
    VGA (QuadratureVI): a bound, with measured gap 0.012, |dm| 0.035, sd 11.5% (at the
    outlier; N = 50 n: gap 0.0018; N = n + 1: gap 2.3). (Counts: the Poisson model is
    compared with QuadratureVI in the hyperparameter test below.)"""
    ref = agp.fit(student_t_model("cholesky"), XC, Y_T, agp.QuadratureVI(), max_iter=30,
                  chunk_size=30)
    assert np.ptp(ref.history.objective[-10:]) < 1e-7
    post = flow_fit(student_t_model(), XC, Y_T,
                    agp.ParticleFlow(n_particles=20 * N_C, learning_rate=0.02), 2000)
    gap, dm, dsd = compare(STUDENT_T, post, ref, XS)
    assert -1e-7 <= gap < 0.05, gap
    assert dm < 0.1 and dsd < 0.25, (dm, dsd)


XM = np.linspace(-3.0, 3.0, 15)[:, None]
YM = np.digitize(XM[:, 0], [-1.0, 1.0])


def softmax_model():
    return agp.VGP(agp.kernels.RBF(fp(1.0), fp(4.0)), LIK.Softmax(3))


def test_particle_flow_multiclass_blocks_and_predictions():
    """Softmax, 3 classes on a line (15 points, separable): one particle block per latent
    function, so q keeps each latent's own (n, N) block of the factor, of full rank n;
    probabilities are normalised and classify test points away from the class boundaries
    (measured: all right; 95% including the boundaries). ADVI (no blocks: one full-rank
    Gaussian over all latents) keeps each latent's marginal, the rows of its Cholesky
    factor."""
    n, C = len(XM), 3
    post = flow_fit(softmax_model(), XM, YM, agp.ParticleFlow(learning_rate=0.05), 1000)
    q = post.model.q
    N = n * C + 1  # default D + 1 particles
    assert q.mean.value.shape == (C, n)
    W = np.asarray(q.factor.value)
    assert W.shape == (C, n, N)
    for c in range(C):
        assert np.linalg.matrix_rank(W[c], tol=1e-8) == n
    Xs = np.linspace(-3.0, 3.0, 49)[:, None]
    Xs = Xs[np.min(np.abs(Xs - np.array([-1.0, 1.0])), axis=1) > 0.3]
    P = np.asarray(post.predict_proba(Xs))
    assert P.shape == (len(Xs), C)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-10)
    assert (P.argmax(1) == np.digitize(Xs[:, 0], [-1.0, 1.0])).mean() == 1.0
    advi = agp.ADVI(learning_rate=0.01, n_samples=4)
    post = agp.fit(softmax_model(), XM, YM, advi, max_iter=50, chunk_size=50,
                   key=jax.random.key(0))
    m0 = softmax_model().bind(XM)
    target = agp.inference.flow_gp.GPTarget(data=(jnp.arange(n), post.y), X=post.X,
                                            model=eqx.tree_at(lambda m: m.q, m0, None))
    qa = agp.inference.flow.fit_gaussian_target(target, jnp.zeros(n * C), advi,
                                                key=jax.random.key(0), max_iter=50,
                                                chunk_size=50, learning_rate=0.01)[0]
    W = np.asarray(post.model.q.factor.value)
    assert W.shape == (C, n, n * C)
    for c in range(C):  # each latent's marginal covariance is that of the joint fit
        np.testing.assert_allclose(W[c] @ W[c].T, np.asarray(qa.cov())[c * n:(c + 1) * n,
                                                                      c * n:(c + 1) * n],
                                   atol=1e-10)


# --- hyperparameter learning -------------------------------------------------------------------


N_P = 30  # a grid and a Matern kernel: K stays well conditioned (RBF: cond ~1e14)
XP = np.linspace(-4.0, 4.0, N_P)[:, None]
YP = np.random.default_rng(2).poisson(np.exp(2.0 + np.sin(1.5 * XP[:, 0]))).astype(float)
XSP = np.linspace(-4.5, 4.5, 10)[:, None]
POISSON_MEAN = agp.means.Constant(fixed(real(2.0)))


def poisson_model(kernel, q="whitened"):
    return agp.VGP(kernel, LIK.Poisson(), q=q, mean=POISSON_MEAN)


def fixed_poisson_vga(ls, var, max_iter=30):
    """The optimal VGA of the Poisson problem at fixed Matern-5/2 hyperparameters
    (QuadratureVI; the fixed values are traced, so refits reuse one compilation)."""
    return agp.fit(poisson_model(agp.kernels.Matern52(fp(ls), fp(var)), "cholesky"), XP, YP,
                   agp.QuadratureVI(), max_iter=max_iter, chunk_size=max_iter)


def test_particle_flow_learns_hyperparameters():
    """Poisson counts (30 points), Matern-5/2 starting at lengthscale 0.3, variance 2 (far
    off). The oracle maximises the optimal-VGA bound over the hyperparameters: Nelder-Mead
    on the bound of fixed-hyperparameter QuadratureVI fits (measured optimum 0.920, 0.546,
    ELBO -85.382; QuadratureVI with Adam on them agrees). GPF (N = 10 n) with Adam on the
    hyperparameters of the particle free energy ends with an ELBO far above the best bound
    at the initial hyperparameters (-97.23), within 0.05 of the optimum (measured 0.007;
    0.003 with N = 20 n), and with lengthscale and variance within 15% of it (measured
    0.928, 0.558). At the learnt hyperparameters the flow's q is compared with the optimal
    VGA (QuadratureVI): the count-likelihood check."""
    def neg_bound(theta):
        return fixed_poisson_vga(*np.exp(theta)).history.objective[-1]

    best_at_start = -neg_bound(np.log([0.3, 2.0]))
    opt = optimize.minimize(neg_bound, np.log([0.8, 0.6]), method="Nelder-Mead",
                            options=dict(xatol=3e-3, fatol=1e-5))
    oracle, best = np.exp(opt.x), -opt.fun
    post = flow_fit(poisson_model(agp.kernels.Matern52(positive(0.3), positive(2.0))), XP, YP,
                    agp.ParticleFlow(n_particles=10 * N_P, learning_rate=0.01), 1500,
                    learning_rate=0.05)
    ls, var = float(post.kernel.lengthscale.value), float(post.kernel.variance.value)
    prob = GPProblem(XP, YP, lambda A, B: matern52(A, B, ls, var), 2.0, poisson_loglik)
    elbo = np_elbo(prob, *whitened(post, prob))
    assert best_at_start + 5.0 < elbo < best + 1e-3, (elbo, best, best_at_start)
    assert best - elbo < 0.05, (elbo, best)
    assert np.all(np.abs(np.log(np.array([ls, var]) / oracle)) < math.log(1.15)), (ls, var,
                                                                                  oracle)
    h = post.history.objective
    assert h[-1] < h[0] - 50.0
    # the flow's q against the optimal VGA at the learnt hyperparameters: measured gap
    # 0.0063, |dm| 0.0007, sd 1.6%
    gap, dm, dsd = compare(prob, post, fixed_poisson_vga(ls, var), XSP)
    assert -1e-7 <= gap < 0.02, gap
    assert dm < 0.01 and dsd < 0.05, (dm, dsd)


# --- LowRankQ -------------------------------------------------------------------------------


def _kernel_parts(M=6, n=5, seed=0):
    """(Kmm, Lmm, Kmn, A, kdiag, Kxx) of a numpy RBF kernel (M inducing, n test inputs)."""
    rng = np.random.default_rng(seed)
    Z, X = rng.uniform(-2.0, 2.0, (M, 1)), rng.uniform(-2.5, 2.5, (n, 1))
    Kmm, Kmn, Kxx = rbf(Z, Z, 0.9, 1.7), rbf(Z, X, 0.9, 1.7), rbf(X, X, 0.9, 1.7)
    Lmm = np.linalg.cholesky(Kmm)
    A = sla.solve_triangular(Lmm, Kmn, lower=True)
    return Kmm, Lmm, Kmn, A, np.diag(Kxx).copy(), Kxx


@jax.jit
def _q_outputs(q, Kmm, Lmm, Kmn, A, kdiag, Kxx):
    """Everything a q(u) gives, in one compiled call: (KL, marginal mean, marginal
    variance, full covariance, mean_cov)."""
    mean, var = q.conditional(Kmm, Lmm, Kmn, A, kdiag)
    _, cov = q.conditional(Kmm, Lmm, Kmn, A, kdiag, Kxx, full_cov=True)
    return q.kl(Kmm, Lmm), mean, var, cov, q.mean_cov(Kmm, Lmm)


def test_lowrank_q_full_rank_equals_whitened_cholesky():
    """A full-rank W (M x K, K >= M) is N(m, W W^T): conditional (marginal and full
    covariance), KL and mean_cov equal those of CholeskyQ(whiten=True) with chol(W W^T)."""
    parts = _kernel_parts()
    rng = np.random.default_rng(1)
    m, W = rng.normal(size=6), 0.6 * rng.normal(size=(6, 9))
    low = _q_outputs(LowRankQ(real(m), real(W)), *parts)
    chol = _q_outputs(CholeskyQ(real(m), real(np.linalg.cholesky(W @ W.T)), whiten=True),
                      *parts)
    np.testing.assert_allclose(low[0], chol[0], rtol=1e-10)
    for a, b in zip(jax.tree_util.tree_leaves(low[1:]), jax.tree_util.tree_leaves(chol[1:]),
                    strict=True):
        np.testing.assert_allclose(a, b, atol=1e-10)
    Lmm = parts[1]
    np.testing.assert_allclose(low[4][1], Lmm @ (W @ W.T) @ Lmm.T, atol=1e-10)


@pytest.mark.parametrize("n_particles", [2, 4, 6])
def test_lowrank_q_rank_deficient_matches_numpy(n_particles):
    """W = centred particles / sqrt(N) (M = 6, N = 2, 4, 6: rank N - 1 < M, W^T W singular),
    padded with zero columns to 6 as multi-latent flows pad theirs: q(v) = N(m, S),
    S = W W^T + I - P_W with P_W the projector onto span(W) from an SVD; KL(q || N(0, I))
    by numpy's slogdet, the marginals of f (A^T m, Kxx - A^T A + A^T S A) and mean_cov
    (Lmm m, Lmm S Lmm^T) all agree."""
    Kmm, Lmm, Kmn, A, kdiag, Kxx = parts = _kernel_parts()
    rng = np.random.default_rng(n_particles)
    P = rng.normal(size=(n_particles, 6)) * 0.7 + 0.3
    W = np.zeros((6, 6))
    W[:, :n_particles] = (P - P.mean(0)).T / math.sqrt(n_particles)
    m = rng.normal(size=6)
    U, s, _ = np.linalg.svd(W)
    U = U[:, s > 1e-10 * s.max()]
    assert U.shape[1] == n_particles - 1
    S = W @ W.T + np.eye(6) - U @ U.T
    q = LowRankQ(real(m), real(W))
    kl, mean, var, full, (mu, Su) = _q_outputs(q, *parts)
    np.testing.assert_allclose(kl, 0.5 * (np.trace(S) + m @ m - 6 - np.linalg.slogdet(S)[1]),
                               rtol=1e-10)
    cov = Kxx - A.T @ A + A.T @ S @ A
    np.testing.assert_allclose(mean, A.T @ m, atol=1e-12)
    np.testing.assert_allclose(full, cov, atol=1e-10)
    np.testing.assert_allclose(var, np.diag(cov), atol=1e-10)
    np.testing.assert_allclose(mu, Lmm @ m, atol=1e-12)
    np.testing.assert_allclose(Su, Lmm @ S @ Lmm.T, atol=1e-10)
    with pytest.raises(TypeError, match="natural"):
        q.whitened_natural(Lmm)


# --- Bayesian logistic regression: the optimal full-rank VGA ----------------------------------

PRIOR_VAR = 10.0


def _blr_data(n=200, D=6, seed=0):
    rng = np.random.default_rng(seed)
    mix = 0.5 * rng.normal(size=(D, D)) + np.eye(D)
    X = rng.normal(size=(n, D)) @ mix
    X = (X - X.mean(0)) / X.std(0)
    w = rng.normal(size=D)
    y = np.where(rng.uniform(size=n) < special.expit(X @ w), 1, -1)
    return X, y


def blr_neg_elbo(params, X, y, s2):
    """-ELBO(m, L) of Bayesian logistic regression, q = N(m, L L^T), and its gradient:
    E[log sigma(a_i)] for a_i = y_i w^T x_i ~ N(mu_i, v_i) by 60-node Gauss-Hermite, with
    dE/dmu = E[sigma(-a)], dE/dv = -E[sigma(a) sigma(-a)] / 2 (Opper & Archambeau)."""
    D = X.shape[1]
    m = params[:D]
    L = np.zeros((D, D))
    L[np.tril_indices(D)] = params[D:]
    C = L @ L.T
    Xy = X * y[:, None]
    mu, v = Xy @ m, np.einsum("ij,jk,ik->i", X, C, X)
    a = mu[:, None] + np.sqrt(2.0 * v)[:, None] * GH_T
    sig = special.expit(a)
    elbo = (np.sum(special.log_expit(a) @ GH_W) - 0.5 * D * math.log(2 * math.pi * s2)
            - 0.5 * (m @ m + np.trace(C)) / s2 + 0.5 * D * math.log(2 * math.pi * math.e)
            + np.sum(np.log(np.abs(np.diag(L)))))
    gm = Xy.T @ ((1.0 - sig) @ GH_W) - m / s2
    gC = -0.5 * (X * ((sig * (1.0 - sig)) @ GH_W)[:, None]).T @ X - 0.5 * np.eye(D) / s2
    gL = 2.0 * gC @ L + np.diag(1.0 / np.diag(L))
    return -elbo, -np.concatenate([gm, gL[np.tril_indices(D)]])


@pytest.fixture(scope="module")
def blr():
    """(target, X, y, m*, C*, ELBO*): the optimal VGA by L-BFGS, checked against its
    fixed-point conditions E_q[grad phi] = 0 and C^-1 = E_q[hess phi] (thesis eq. 9)."""
    X, y = _blr_data()
    D = X.shape[1]
    x0 = np.concatenate([np.zeros(D), (0.1 * np.eye(D))[np.tril_indices(D)]])
    assert optimize.check_grad(lambda p: blr_neg_elbo(p, X, y, PRIOR_VAR)[0],
                               lambda p: blr_neg_elbo(p, X, y, PRIOR_VAR)[1], x0 + 0.01) < 1e-4
    res = optimize.minimize(blr_neg_elbo, x0, args=(X, y, PRIOR_VAR), jac=True,
                            method="L-BFGS-B", options=dict(maxiter=5000, gtol=1e-10,
                                                            ftol=1e-15))
    m = res.x[:D]
    L = np.zeros((D, D))
    L[np.tril_indices(D)] = res.x[D:]
    C = L @ L.T
    Xy = X * y[:, None]
    a = (Xy @ m)[:, None] + np.sqrt(2.0 * np.einsum("ij,jk,ik->i", X, C, X))[:, None] * GH_T
    sig = special.expit(a)
    assert np.abs(Xy.T @ ((1.0 - sig) @ GH_W) - m / PRIOR_VAR).max() < 1e-5
    prec = (X * ((sig * (1.0 - sig)) @ GH_W)[:, None]).T @ X + np.eye(D) / PRIOR_VAR
    np.testing.assert_allclose(np.linalg.inv(prec), C, rtol=1e-4, atol=1e-6)
    target = agp.contrib.bayesian.LogisticRegression(X, y, prior_var=PRIOR_VAR)
    return target, X, y, m, C, -res.fun


def fit_blr(blr, method, max_iter):
    target = blr[0]
    return agp.fit_gaussian(target, target.init(), method, key=KEY, max_iter=max_iter,
                            chunk_size=max_iter)


@pytest.fixture(scope="module")
def blr_fits(blr):
    """Cached BLR fits by name (BLR_METHODS), shared between tests."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = fit_blr(blr, *BLR_METHODS[name][:2])
        return cache[name]

    return get


def blr_errors(blr, q):
    """(max |m - m*| / sd*, ||C - C*||_F / ||C*||_F, max |sd / sd* - 1|, F(q) - F*), with
    F = -ELBO computed exactly (Gauss-Hermite) for q's mean and covariance."""
    _, X, y, m, C, elbo = blr
    sd = np.sqrt(np.diag(C))
    mq, Cq = np.asarray(q.mean), np.asarray(q.cov())
    Lq = np.linalg.cholesky(Cq)
    F = blr_neg_elbo(np.concatenate([mq, Lq[np.tril_indices(len(mq))]]), X, y, PRIOR_VAR)[0]
    return (np.abs((mq - m) / sd).max(), np.linalg.norm(Cq - C) / np.linalg.norm(C),
            np.abs(np.sqrt(np.diag(Cq)) / sd - 1).max(), F + elbo)


D_BLR = 6
BLR_METHODS = {  # name: (method, iterations, bounds on the four errors of blr_errors)
    # measured 0.0023, 0.014, 0.014, 0.001 (N = D + 1: 0.006, 0.052, 0.080, 0.017)
    "gpf": (agp.ParticleFlow(n_particles=20 * D_BLR, learning_rate=0.01), 2000,
            (0.02, 0.05, 0.05, 0.005)),
    # measured 0.042, 0.012, 0.012, 0.0025 (Monte Carlo noise of the last steps)
    "gf": (agp.GaussianFlow(n_samples=100, learning_rate=0.005, init_scale=0.2), 2000,
           (0.15, 0.05, 0.05, 0.015)),
    # measured 0.042, 0.040, 0.039, 0.026
    "advi": (agp.ADVI(n_samples=20, learning_rate=0.003, init_scale=0.2), 4000,
             (0.2, 0.12, 0.12, 0.08)),
}


@pytest.mark.parametrize("name", list(BLR_METHODS))
def test_blr_flows_match_optimal_vga(blr, blr_fits, name):
    """GPF (N = 20 D), full-rank GF and full-rank ADVI reach the optimal VGA's mean (in
    units of the smallest posterior sd) and covariance, and their exact free energy is
    above the optimum's and close to it."""
    errors = blr_errors(blr, blr_fits(name))
    assert errors[3] > -1e-9, errors
    assert all(e < t for e, t in zip(errors, BLR_METHODS[name][2], strict=True)), errors


def test_blr_minibatch_particle_flow(blr):
    """Minibatches of 50 of the 200 rows (gradient scaled by 4): with eta = 0.001 the
    particles' Gaussian ends within the posterior (measured |dm| 0.08 sd, covariance 1.5%,
    free energy 0.023 above the optimum; the stationary noise of a constant step is ~0.15
    posterior sd)."""
    q = fit_blr(blr, agp.ParticleFlow(n_particles=20 * D_BLR, learning_rate=0.001,
                                      batch_size=50), 4000)
    dm, dc, dsd, dF = blr_errors(blr, q)
    assert dm < 0.4 and dc < 0.1 and dsd < 0.1 and -1e-9 < dF < 0.1, (dm, dc, dsd, dF)


def test_svgd_centred_kernel_is_particle_flow(blr, blr_fits):
    """SVGD with the centred linear kernel k(x, x') = (x - m)^T (x' - m) + 1 moves the
    particles exactly as GPF with eta1 = eta2 (section 2.9): the same 120 particles to
    rounding after 2000 steps from the same initial particles."""
    a = blr_fits("gpf")
    b = fit_blr(blr, agp.SVGD(n_particles=20 * D_BLR, kernel="centred", learning_rate=0.01),
                2000)
    assert b.particles.shape == a.particles.shape == (20 * D_BLR, D_BLR)
    np.testing.assert_allclose(b.particles, a.particles, atol=1e-9)


def test_blr_predictions_free_energy_and_labels(blr):
    """With q the oracle's Gaussian (as a VariationalGaussian): predict_proba, the average
    of sigma(w^T x*) over 20000 draws w ~ q, matches E[sigma(a)], a ~ N(m^T x*, x*^T C x*)
    (Gauss-Hermite), and free_energy (20000 draws) matches -ELBO*, each within 4 Monte
    Carlo standard errors; the targets' potentials equal -(log prior + sum log lik); labels
    {0, 1} and {-1, 1} give the same target; intercept=True appends a constant feature."""
    target, X, y, m, C, elbo = blr
    q = agp.VariationalGaussian(jnp.asarray(m), jnp.asarray(np.linalg.cholesky(C)))
    Xs = np.random.default_rng(3).normal(size=(7, X.shape[1]))
    S = 20000
    p = np.asarray(target.predict_proba(q, Xs, jax.random.key(0), S))
    mu, v = Xs @ m, np.einsum("ij,jk,ik->i", Xs, C, Xs)
    a = mu[:, None] + np.sqrt(2.0 * v)[:, None] * GH_T
    exact = special.expit(a) @ GH_W
    sd = np.sqrt((special.expit(a) ** 2 @ GH_W - exact**2) / S)
    assert np.all(np.abs(p - exact) < 4 * sd + 1e-12), (p, exact, sd)
    W = np.asarray(q.sample(jax.random.key(5), S))
    phi = np.asarray(target.potentials(jnp.asarray(W), target.data, 1.0))
    phi_np = -(np.sum(log_sigmoid(y * (W @ X.T)), 1) - 0.5 * np.sum(W**2, 1) / PRIOR_VAR
               - 0.5 * X.shape[1] * math.log(2 * math.pi * PRIOR_VAR))
    np.testing.assert_allclose(phi, phi_np, rtol=1e-10)
    F = q.free_energy(target, jax.random.key(5), S)  # the same draws
    assert abs(F + elbo) < 4 * phi.std() / math.sqrt(S), (F, -elbo)
    t01 = agp.contrib.bayesian.LogisticRegression(X, (y + 1) // 2, prior_var=PRIOR_VAR)
    np.testing.assert_array_equal(np.asarray(t01.data[1]), np.asarray(target.data[1]))
    ti = agp.contrib.bayesian.LogisticRegression(X, y, intercept=True)
    assert ti.dim == X.shape[1] + 1 and np.all(np.asarray(ti.data[0])[:, -1] == 1.0)


# --- Bayesian MLP: GPF "Layers" ----------------------------------------------------------------


def _xor(n, rng):
    X = rng.uniform(-2.0, 2.0, size=(n, 2))
    return X, (X[:, 0] * X[:, 1] > 0).astype(int)


def test_bayesian_mlp_layers_particle_flow():
    """XOR (200 training points; a linear classifier gets ~50%), a 2-8-2 tanh network,
    GPF with one block per layer (D = 42, N = D + 1, plain flow eta = 0.004 for 500 steps,
    particles started at 0.1 around Glorot weights): held-out accuracy > 0.9 (measured
    0.954, and 0.94-0.97 over seeds and step counts; the labels are deterministic, so a
    good classifier approaches 1). The covariance is exactly block diagonal across layers
    (zero cross-layer entries in the factor and in cov()), the factor is (D, 2 N), and
    predict_proba rows sum to 1. (Caveat measured here: with N = D + 1 the particle free
    energy keeps falling after ~1500 steps while the Monte Carlo one rises -- the particle
    bias overfits -- and Adam steps make that fast, so the plain flow is used.)"""
    rng = np.random.default_rng(0)
    X, y = _xor(200, rng)
    Xt, yt = _xor(500, rng)
    mlp = agp.contrib.bayesian.BayesianMLP(X, y, hidden=(8,))
    blocks = mlp.layer_blocks()
    assert blocks == (2 * 8 + 8, 8 * 2 + 2) and mlp.dim == sum(blocks) == 42
    init = mlp.init(jax.random.key(0))
    assert [(W.shape, b.shape) for W, b in init] == [((2, 8), (8,)), ((8, 2), (2,))]
    q = agp.fit_gaussian(mlp, init, agp.ParticleFlow(learning_rate=0.004, init_scale=0.1,
                                                     blocks=blocks),
                         key=KEY, max_iter=500, chunk_size=500)
    N = mlp.dim + 1
    F = np.asarray(q.factor)
    assert F.shape == (mlp.dim, 2 * N)
    b0 = blocks[0]
    assert np.all(F[:b0, N:] == 0.0) and np.all(F[b0:, :N] == 0.0)
    C = np.asarray(q.cov())
    assert np.all(C[:b0, b0:] == 0.0) and np.abs(C[:b0, :b0]).max() > 0
    P = np.asarray(mlp.predict_proba(q, Xt, jax.random.key(2), 100))
    assert P.shape == (500, 2)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-12)
    acc = (P.argmax(1) == yt).mean()
    assert acc > 0.9, acc
    assert q.history.objective[-1] < q.history.objective[0] / 2


# --- errors ------------------------------------------------------------------------------------


def test_flow_model_errors():
    """Targets: labels outside {-1, 1} / {0, 1}, a y of the wrong shape or length,
    prior_var <= 0 or NaN; MLP labels that are floats or negative, fewer than 2 classes.
    fit: a flow on a model other than VGP / SVGP (TypeError), n_restarts with a flow, block
    sizes with several latent functions, a batch larger than the data (ValueError)."""
    X = np.random.default_rng(0).normal(size=(10, 2))
    y = np.array([0, 1] * 5)
    LR = agp.contrib.bayesian.LogisticRegression
    with pytest.raises(ValueError, match="labels"):
        LR(X, np.array([0, 2] * 5))
    with pytest.raises(ValueError, match=r"y must be 1-D of shape \(n,\)"):
        LR(X, np.c_[y, y])
    with pytest.raises(ValueError, match="y has 9 entries but X has 10 rows"):
        LR(X, y[:9])
    np.testing.assert_array_equal(LR(X, y[:, None]).data[1], LR(X, y).data[1])  # a column
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="prior_var"):
            LR(X, y, prior_var=bad)
    with pytest.raises(ValueError, match="integer"):
        agp.contrib.bayesian.BayesianMLP(X, y.astype(float))
    with pytest.raises(ValueError, match="integer"):
        agp.contrib.bayesian.BayesianMLP(X, y - 1)
    with pytest.raises(ValueError, match="num_classes"):
        agp.contrib.bayesian.BayesianMLP(X, y, num_classes=1)
    with pytest.raises(ValueError, match="prior_var"):
        agp.contrib.bayesian.BayesianMLP(X, y, prior_var=0.0)
    # the shapes of the problems above (eager operations are compiled per shape)
    gp = agp.GP(agp.kernels.RBF(fp(1.0), fp(2.0)), LIK.Logistic())
    for method in (agp.ParticleFlow(), agp.GaussianFlow(), agp.ADVI(), agp.SVGD()):
        with pytest.raises(TypeError, match="VGP and SVGP"):
            agp.inference.flow_gp.fit_flow(gp, XC, YC, method, max_iter=5)
    with pytest.raises(ValueError, match="n_restarts"):
        agp.fit(logit_model(), XC, YC, agp.ParticleFlow(), max_iter=5, n_restarts=1)
    with pytest.raises(ValueError, match="blocks"):
        agp.fit(softmax_model(), XM, YM, agp.ParticleFlow(blocks=(15, 15, 15)), max_iter=5)
    Xb, yb = _blr_data()
    with pytest.raises(ValueError, match="batch_size"):
        agp.fit_gaussian(LR(Xb, yb), jnp.zeros(D_BLR), agp.ParticleFlow(batch_size=201),
                         max_iter=5)
