"""Multi-class GP classification: the logistic-softmax likelihood and its augmentation
(thesis ch. 4 and 7.4; seed 000 part 1 section 4, part 2 section 3.4 and their errata), the
softmax and robust-max likelihoods, and the multi-latent SVGP / VGP plumbing, against
independent oracles: series and numerical integrals in numpy / scipy, brute-force Monte
Carlo, the thesis' own mean-field bound (the notes' reconstructed eqs. 12-14), dense numpy
CAVI (thesis Algorithm 5), an elliptical slice sampler, and quadrature SVI on real data.

The maths under test, per observation with C latent values f = (f_1..f_C):
p(y = k | f) = sigma(f_k) / sum_c sigma(f_c); 1 / sum_c sigma(f_c) = int_0^inf
e^{-lambda sum_c sigma(f_c)} d lambda; e^{-lambda sigma(f)} = sum_n Po(n | lambda)
sigma(-f)^n; integrating lambda out gives the weights w(n) = s! / (C^{s+1} prod_c n_c!),
s = sum_c n_c; and sigma(f)^y sigma(-f)^n = 2^{-b} e^{(y - n) f / 2} cosh(f/2)^{-b},
b = y + n, cosh(f/2)^{-b} = E_{PG(b, 0)} e^{-w f^2 / 2}. At the optimal q(n, w) the bound
is m_y / 2 - log(2 cosh(c_y / 2)) - log sum_c (1 - psi_c), psi_c = e^{-m_c/2} /
(2 cosh(c_c / 2)), c_c^2 = m_c^2 + v_c, with E[n_c] = psi_c / (C - sum_j psi_j).

Problems are one-dimensional with three classes drawn from the logistic-softmax model
(Matern-5/2, lengthscale 1, variance 4, all hyperparameters and inducing inputs frozen with
``fixed``): VGP on 30 grid inputs, SVGP on 60 random inputs with 12 inducing points on a
grid. As in test_analytic_vi.py, the CAVI iterations run in one jitted loop per model
structure (``_cavi_run``), cached and shared between tests. Longer MCMC runs and the larger
real-data fits run with AGP_FULL_SLOW=1.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FULL, load_shared
from jax import lax
from scipy import integrate
from scipy.special import digamma, expit, gammaln

import augmentedgp as agp
from augmentedgp.core.params import fixed, positive, real
from augmentedgp.inference import AnalyticVI
from augmentedgp.variational import CholeskyQ, NaturalQ, natgrad

LIK = agp.likelihoods
C = 3  # classes of the synthetic problems
LS, KVAR = 1.0, 4.0  # kernel hyperparameters of every synthetic problem
ZGRID = np.linspace(0.3, 9.7, 12)[:, None]  # M = 12 inducing inputs, spacing 0.85
XS = np.array([[-0.5], [2.0], [4.1], [6.6], [9.0], [10.5]])  # test inputs
T_MAX = 80  # CAVI steps (measured: the bound changes by < 1e-10 per step after 27 - 42)
# per-class kernels (lengthscale, variance) of the "kernels" SVGP
CLASS_KERNELS = [(0.8, 3.0), (1.0, 4.0), (1.3, 5.0)]


# --- numpy oracles ---------------------------------------------------------------------------


def logsumexp(a, axis=None, keepdims=False):
    """Stable log sum exp (scipy's is slow on the (rows, 10^6, C) Monte Carlo arrays)."""
    top = np.max(a, axis=axis, keepdims=True)
    out = top + np.log(np.sum(np.exp(a - top), axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def log_sig(x):
    return -np.logaddexp(0.0, -x)


def lsm_log_probs(F):
    """log p(y = k | F) of the logistic-softmax, (..., C) -> (..., C)."""
    ls = log_sig(F)
    return ls - logsumexp(ls, -1, keepdims=True)


def lsm_log_prob(y, F):
    return np.take_along_axis(lsm_log_probs(F), np.asarray(y)[..., None], -1)[..., 0]


def log_2cosh_half(c):
    """log(2 cosh(c / 2))."""
    return np.logaddexp(0.5 * c, -0.5 * c)


def tanh_ratio(c):
    return np.tanh(c / 2.0) / (2.0 * c)


def numpy_sites(y, m, v):
    """(beta, gamma, E n) of the collapsed augmentation at marginals (m, v), each (n, C):
    thesis Algorithm 5 (7.4) with sigma~ = e^{-m/2} / (2 cosh(c/2)) (the errata's reading),
    E n = psi / (C - sum psi), beta = (y' - E n) / 2, gamma = (y' + E n) tanh(c/2) / (2c)."""
    Y = np.eye(m.shape[1])[y]
    c = np.sqrt(m**2 + v)
    psi = np.exp(-0.5 * m - log_2cosh_half(c))
    En = psi / (m.shape[1] - psi.sum(1, keepdims=True))
    return 0.5 * (Y - En), (Y + En) * tanh_ratio(c), En


def collapsed_bound(y, m, v):
    """m_y / 2 - log(2 cosh(c_y / 2)) - log sum_c (1 - psi_c), in numpy."""
    c = np.sqrt(m**2 + v)
    psi = np.exp(-0.5 * m - log_2cosh_half(c))
    pick = lambda a: np.take_along_axis(a, y[:, None], 1)[:, 0]
    return 0.5 * pick(m) - log_2cosh_half(pick(c)) - np.log(np.sum(1.0 - psi, 1))


def matern52(A, B, ls=LS, var=KVAR):
    r = np.sqrt(5.0) * np.abs(np.asarray(A)[:, None, 0] - np.asarray(B)[None, :, 0]) / ls
    return var * (1.0 + r + r**2 / 3.0) * np.exp(-r)


def dense_kl(mu, S, K):
    """KL(N(mu, S) || N(0, K))."""
    Ki = np.linalg.inv(K)
    return 0.5 * (np.trace(Ki @ S) + mu @ Ki @ mu - len(mu) + np.linalg.slogdet(K)[1]
                  - np.linalg.slogdet(S)[1])


def mc_normal(m, v, n_draws, seed):
    """(rows, n_draws, C) draws of independent N(m, v) per row."""
    rng = np.random.default_rng(seed)
    return m[:, None, :] + np.sqrt(v)[:, None, :] * rng.standard_normal(
        (m.shape[0], n_draws, m.shape[1]))


def count_grid(C_, N):
    """All count vectors n in {0..N}^C_ (rows) and log w(n) = log s! - (s+1) log C - sum
    log n_c!, the lambda-integrated Poisson weights."""
    n = np.stack(np.meshgrid(*[np.arange(N + 1)] * C_, indexing="ij"), -1).reshape(-1, C_)
    s = n.sum(1)
    return n, gammaln(s + 1.0) - (s + 1.0) * math.log(C_) - gammaln(n + 1.0).sum(1)


def geometric_tail(z, N):
    """Union bound on the relative mass that {0..N}^C misses of sum_n w(n) prod z_c^{n_c}:
    normalised, the counts are negative multinomial (x0 = 1, p_c = z_c / C) whose marginal
    n_c is geometric with P(n_c > N) = (p_c / (p_0 + p_c))^{N+1}, p_0 = 1 - sum_c p_c."""
    p = np.asarray(z) / len(z)
    return float(np.sum((p / (1.0 - p.sum() + p)) ** (N + 1)))


# --- 1. the augmentation integrates back to the likelihood ------------------------------------


def test_lambda_and_poisson_augmentation_sum_back_to_the_likelihood():
    """w(n) = int_0^inf prod_c Po(n_c | lambda) d lambda = s! / (C^{s+1} prod n_c!) (scipy
    quad), and the series sigma(f_k) sum_n w(n) prod_c sigma(-f_c)^{n_c}, summed over the grid
    n_c <= 60 (a third of a million terms), is the logistic-softmax probability (the
    library's log_prob) to 1e-12 relative; the missing tail is bounded (geometric_tail) by
    < 1e-12 for every f here. With the thesis' sigma(f_c)^{n_c} (erratum 17 of the notes)
    the series is off by more than 10%."""
    from scipy.stats import poisson

    for n in [(0, 0, 0), (2, 0, 1), (3, 5, 1), (0, 7, 0)]:
        quad = integrate.quad(lambda lam, n=n: np.prod([poisson.pmf(k, lam) for k in n]), 0.0,
                              np.inf, epsabs=0.0, epsrel=1e-12)[0]
        s = sum(n)
        closed = math.factorial(s) / (3 ** (s + 1) * np.prod([math.factorial(k) for k in n]))
        np.testing.assert_allclose(quad, closed, rtol=1e-9)
    N = 60
    grid, logw = count_grid(3, N)
    rng = np.random.default_rng(0)
    F = np.vstack([rng.normal(0.3, 1.5, (5, 3)), [[-3.2, -0.03, -1.6]], [[4.0, -4.0, 0.0]]])
    lik = LIK.LogisticSoftmax(3)
    wrong = []
    for f in F:
        z = expit(-f)
        assert geometric_tail(z, N) < 1e-12
        series = np.exp(logsumexp(logw + grid @ np.log(z)))
        np.testing.assert_allclose(series * expit(f).sum(), 1.0, rtol=1e-12)
        for k in range(3):
            want = float(lik.log_prob(jnp.asarray(k), jnp.asarray(f)))
            np.testing.assert_allclose(np.log(expit(f[k]) * series), want, rtol=1e-12)
        erratum = np.exp(logsumexp(logw + grid @ np.log(expit(f))))  # sigma(f)^n
        wrong.append(abs(erratum * expit(f).sum() - 1.0))
    assert max(wrong) > 0.1  # (equal where sum_c sigma(f_c) = C / 2, as for f = (4, -4, 0))


def pg_density(w, b, n_terms=200):
    """Density of PG(b, 0) = J*(b) / 4 (Polson, Scott & Windle 2013, JASA 108:1339, section
    2.1: the density of J*(b), from Devroye's alternating series, rescaled by 4):
    2^{b-1} / Gamma(b) sum_k (-1)^k Gamma(k + b) / k! (2k + b) / sqrt(2 pi w^3)
    exp(-(2k + b)^2 / (8 w)); for b = 1 the series sum_k (-1)^k (2k + 1) / sqrt(2 pi w^3)
    exp(-(2k + 1)^2 / (8 w))."""
    w = np.atleast_1d(np.asarray(w, float))[:, None]
    k = np.arange(n_terms)[None, :]
    log_c = ((b - 1) * math.log(2.0) - gammaln(b) + gammaln(k + b) - gammaln(k + 1.0)
             + np.log(2.0 * k + b))
    terms = np.exp(log_c - 0.5 * np.log(2.0 * np.pi * w**3) - (2.0 * k + b) ** 2 / (8.0 * w))
    return np.sum(np.where(k % 2 == 0, 1.0, -1.0) * terms, 1)


def test_polya_gamma_augmentation_identity():
    """sigma(f)^y sigma(-f)^n = 2^{-b} e^{(y - n) f / 2} cosh(f/2)^{-b}, b = y + n (thesis
    ch. 4 eqs. 8-9); and for b = 1, 2 the Laplace transform of the PG(b, 0) density series
    (pg_density, integrated by scipy quad) is cosh(f/2)^{-b} to 1e-12, the density
    integrating to 1 with mean b / 4; the b = 2 series equals the convolution of two
    PG(1, 0) densities. A density with 2^b for 2^{b-1} integrates to 2."""
    for y in (0, 1):
        for n in (0, 1, 2, 5):
            f = np.linspace(-6.0, 6.0, 13)
            b = y + n
            lhs = y * log_sig(f) + n * log_sig(-f)
            rhs = -b * math.log(2.0) + 0.5 * (y - n) * f - b * (log_2cosh_half(f) - math.log(2.0))
            np.testing.assert_allclose(lhs, rhs, rtol=1e-13, atol=1e-13)
    quad = lambda g: integrate.quad(g, 0.0, 40.0, limit=200, epsabs=1e-13, epsrel=1e-12)[0]
    for b in (1, 2):
        np.testing.assert_allclose(quad(lambda w, b=b: pg_density(w, b)[0]), 1.0, atol=1e-12)
        np.testing.assert_allclose(quad(lambda w, b=b: w * pg_density(w, b)[0]), b / 4.0,
                                   atol=1e-11)
        for f in (0.7, -2.3, 5.0):
            lt = quad(lambda w, b=b, f=f: np.exp(-0.5 * w * f * f) * pg_density(w, b)[0])
            np.testing.assert_allclose(lt, np.cosh(0.5 * f) ** (-b), rtol=1e-12, atol=1e-14)
    for w in (0.1, 0.3, 0.8, 2.0):
        conv = integrate.quad(lambda s, w=w: pg_density(s, 1)[0] * pg_density(w - s, 1)[0], 0.0,
                              w, limit=200, epsabs=1e-14, epsrel=1e-12)[0]
        np.testing.assert_allclose(pg_density(w, 2)[0], conv, rtol=1e-9)
    np.testing.assert_allclose(2.0 * quad(lambda w: pg_density(w, 2)[0]), 2.0, rtol=1e-9)


# --- 2. the collapsed bound: a bound, tight at v = 0, above the thesis' mean-field bound -------


def thesis_elbo(y, m, v, alpha, gam):
    """The notes' IMPL augmented ELBO per point (seed 000 part 1 section 4.6) with
    q(lambda) = Ga(alpha, C) (shape, rate), q(n_c) = Po(gam_c), q(w_c | n_c) = PG(y'_c + n_c,
    b_c), b_c^2 = m_c^2 + v_c: data term - KL_PG - KL_Po - KL_Gamma. The flat prior on lambda
    has density 1, so KL_Gamma = E log q(lambda) = -entropy and the ELBO is a lower bound on
    E_q log p(y | f) (no additive constant)."""
    C_ = m.shape[1]
    Y = np.eye(C_)[y]
    b = np.sqrt(m**2 + v)
    theta = (Y + gam) * tanh_ratio(b)
    e_log_lam = (digamma(alpha) - math.log(C_))[:, None]
    data = np.sum(0.5 * (Y - gam) * m - 0.5 * theta * (m**2 + v) - (Y + gam) * math.log(2.0), 1)
    kl_pg = np.sum((Y + gam) * (log_2cosh_half(b) - math.log(2.0)) - 0.5 * b**2 * theta, 1)
    kl_po = np.sum((alpha / C_)[:, None] - gam + gam * np.log(gam) - gam * e_log_lam, 1)
    kl_gamma = -(alpha - math.log(C_) + gammaln(alpha) + (1.0 - alpha) * digamma(alpha))
    return data - kl_pg - kl_po - kl_gamma


def thesis_fixed_point(m, v, tol=1e-14):
    """Local updates (notes' eqs. 12-14): gam_c = exp(psi(alpha) - log C) e^{-m_c/2} /
    (2 cosh(b_c/2)), alpha = 1 + sum_c gam_c, iterated to convergence."""
    C_ = m.shape[1]
    b = np.sqrt(m**2 + v)
    alpha = np.ones(m.shape[0])
    for _ in range(1000):
        gam = np.exp((digamma(alpha) - math.log(C_))[:, None] - 0.5 * m - log_2cosh_half(b))
        new = 1.0 + gam.sum(1)
        if np.max(np.abs(new - alpha)) < tol:
            return new, np.exp((digamma(new) - math.log(C_))[:, None] - 0.5 * m
                               - log_2cosh_half(b))
        alpha = new
    raise AssertionError("the thesis' local updates did not converge")


@pytest.mark.parametrize("C_", [3, 4])
def test_collapsed_bound_is_a_bound_tight_at_zero_variance_and_above_the_thesis_bound(C_):
    """augmented_expectations (the bound at the optimal q(n, w), lambda integrated out):
    (i) equals log p(y | m) to 1e-12 when v = 0; (ii) is below E_q log p(y | f) estimated by
    2e5 Monte Carlo draws per point (within 4 standard errors); (iii) equals the numpy
    formula; (iv) is above the thesis' mean-field bound with q(lambda) q(n) q(w) at its
    local fixed point (thesis_elbo), which is itself below E_q log p (so the notes'
    reconstructed eqs. 12-14 give a valid bound: measured gaps ours - thesis 0.17 - 0.53,
    E log p - ours 0.08 - 0.31 nats per point; at v = 0 the thesis bound stays >= 0.19 below
    log p) and is a maximum of thesis_elbo in (alpha, gam) (the fixed point is the
    coordinate optimum, not just any point)."""
    rng = np.random.default_rng(C_)
    n = 6
    m = rng.normal(0.0, 1.5, (n, C_))
    v = rng.uniform(0.2, 2.0, (n, C_))
    y = rng.integers(0, C_, n)
    lik = LIK.LogisticSoftmax(C_)
    aug = lambda m, v: np.asarray(lik.augmented_expectations(jnp.asarray(y), jnp.asarray(m),
                                                             jnp.asarray(v)))
    ours = aug(m, v)
    np.testing.assert_allclose(aug(m, 0.0 * v), lsm_log_prob(y, m), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours, collapsed_bound(y, m, v), rtol=1e-12)
    F = mc_normal(m, v, 200_000, seed=10 + C_)
    lp = lsm_log_prob(np.broadcast_to(y[:, None], F.shape[:2]), F)
    mc, se = lp.mean(1), lp.std(1) / math.sqrt(lp.shape[1])
    assert np.all(ours <= mc + 4.0 * se), (ours - mc) / se
    alpha, gam = thesis_fixed_point(m, v)
    theirs = thesis_elbo(y, m, v, alpha, gam)
    assert np.all(theirs <= mc + 4.0 * se), (theirs - mc) / se
    assert np.all(theirs <= ours + 1e-12), theirs - ours
    assert np.all(ours - theirs > 0.05)  # strictly looser: q(n) Poisson, lambda mean-field
    # the thesis bound at v = 0 stays below log p(y | m): the mean-field gap
    a0, g0 = thesis_fixed_point(m, 0.0 * v)
    assert np.all(thesis_elbo(y, m, 0.0 * v, a0, g0) < lsm_log_prob(y, m) - 0.05)
    # the fixed point maximises thesis_elbo along random directions in (alpha, gam)
    for _ in range(4):
        da, dg = rng.normal(size=n), rng.normal(size=(n, C_)) * gam
        for eps in (1e-3, -1e-3):
            moved = thesis_elbo(y, m, v, alpha + eps * da, gam + eps * dg)
            assert np.all(moved < theirs), moved - theirs


# --- 3. sites are the gradient of the collapsed bound ----------------------------------------


def test_sites_are_the_gradient_of_the_collapsed_bound():
    """The closed-form sites (aux_sites at aux_posterior) are the derivatives of the bound:
    dL/dv = -gamma / 2 and dL/dm = beta - gamma m (jax.grad of sum augmented_expectations),
    so the CAVI step is a natural-gradient step of size 1 on this bound; they equal the
    numpy sites (thesis Algorithm 5), and AnalyticVI.sites shifts beta by -gamma m0."""
    rng = np.random.default_rng(4)
    n, C_ = 8, 4
    m = jnp.asarray(rng.normal(0.0, 2.0, (n, C_)))
    v = jnp.asarray(rng.uniform(0.05, 3.0, (n, C_)))
    y = jnp.asarray(rng.integers(0, C_, n))
    lik = LIK.LogisticSoftmax(C_)
    gm, gv = jax.jit(jax.grad(lambda a, b: jnp.sum(lik.augmented_expectations(y, a, b)),
                              (0, 1)))(m, v)
    beta, gamma = jax.jit(lambda a, b: lik.aux_sites(y, lik.aux_posterior(y, a, b)))(m, v)
    np.testing.assert_allclose(gv, -0.5 * gamma, rtol=1e-10)
    np.testing.assert_allclose(gm, beta - gamma * m, rtol=1e-10, atol=1e-13)
    nb, ng, En = numpy_sites(np.asarray(y), np.asarray(m), np.asarray(v))
    np.testing.assert_allclose(beta, nb, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gamma, ng, rtol=1e-12)
    np.testing.assert_allclose(lik.aux_posterior(y, m, v).n_mean, En, rtol=1e-12)
    m0 = jnp.asarray(rng.normal(size=(n, C_)))
    sb, sg = AnalyticVI().sites(lik, y, m, v, m0)
    np.testing.assert_allclose(sb, beta - gamma * m0, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sg, gamma, rtol=1e-12)


# --- 4. q(n) is the optimal negative multinomial ----------------------------------------------


def test_aux_posterior_is_the_optimal_negative_multinomial():
    """With q(w | n) optimal, the collapsed bound as a functional of q(n) is
    E_q[log w(n) + sum_c n_c log psi_c - log q(n)] + m_y / 2 - log(2 cosh(c_y / 2)), maximised
    by q(n) proportional to w(n) prod_c psi_c^{n_c}. On the grid n_c <= 70 (tail < 1e-13):
    the mean of that q(n) is aux_posterior's n_mean (1e-10), the functional there equals
    augmented_expectations (1e-10), and moving q(n) within the family (psi_c scaled by
    1 +- 5%) lowers it."""
    rng = np.random.default_rng(5)
    n, N = 4, 70
    m = rng.normal(0.0, 1.5, (n, 3))
    v = rng.uniform(0.2, 2.0, (n, 3))
    y = rng.integers(0, 3, n)
    lik = LIK.LogisticSoftmax(3)
    yj, mj, vj = jnp.asarray(y), jnp.asarray(m), jnp.asarray(v)
    En = np.asarray(lik.aux_posterior(yj, mj, vj).n_mean)
    bound = np.asarray(lik.augmented_expectations(yj, mj, vj))
    grid, logw = count_grid(3, N)
    c = np.sqrt(m**2 + v)
    psi = np.exp(-0.5 * m - log_2cosh_half(c))
    y_part = 0.5 * m[np.arange(n), y] - log_2cosh_half(c[np.arange(n), y])

    def functional(i, psi_q):
        assert geometric_tail(psi_q, N) < 1e-13
        log_q = logw + grid @ np.log(psi_q)
        log_q -= logsumexp(log_q)
        q = np.exp(log_q)
        return q @ (logw + grid @ np.log(psi[i]) - log_q) + y_part[i], q @ grid

    for i in range(n):
        best, mean_n = functional(i, psi[i])
        np.testing.assert_allclose(mean_n, En[i], rtol=1e-10)
        np.testing.assert_allclose(best, bound[i], rtol=1e-10)
        for j in range(3):
            for scale in (0.95, 1.05):
                other = psi[i].copy()
                other[j] *= scale
                assert functional(i, other)[0] < best - 1e-6


# --- 5. C = 2 ----------------------------------------------------------------------------------


def test_two_classes_reduce_to_the_logistic_only_when_f2_is_minus_f1():
    """Notes section 4.2 (erratum 22): sigma(f) / (sigma(f) + sigma(-f)) = sigma(f), so
    LogisticSoftmax(2) at (f, -f) is Logistic at f (class 0 <-> y = +1); for independent
    (f1, f2) it is not sigma(f1 - f2)."""
    rng = np.random.default_rng(6)
    f = rng.normal(0.0, 3.0, 50)
    codes = rng.integers(0, 2, 50)
    lsm = np.asarray(LIK.LogisticSoftmax(2).log_prob(jnp.asarray(codes),
                                                     jnp.asarray(np.stack([f, -f], 1))))
    logistic = np.asarray(LIK.Logistic().log_prob(jnp.asarray(np.where(codes == 0, 1.0, -1.0)),
                                                  jnp.asarray(f)))
    np.testing.assert_allclose(lsm, logistic, rtol=1e-12, atol=1e-14)
    F = rng.normal(0.0, 2.0, (50, 2))
    p0 = np.exp(np.asarray(LIK.LogisticSoftmax(2).log_prob(jnp.zeros(50, int), jnp.asarray(F))))
    np.testing.assert_allclose(p0, expit(F[:, 0]) / expit(F).sum(1), rtol=1e-12)
    assert np.max(np.abs(p0 - expit(F[:, 0] - F[:, 1]))) > 1e-3


# --- the synthetic problems and the CAVI loop -------------------------------------------------


def fp(value):
    return fixed(positive(value))


def kern(ls=LS, var=KVAR):
    return agp.kernels.Matern52(fp(ls), fp(var))


def true_latent(x):
    return 2.5 * np.stack([np.sin(x), np.sin(x + 2.1), np.sin(x + 4.2)], -1)


def draw_labels(X, seed):
    """Class codes drawn from the logistic-softmax at true_latent."""
    p = np.exp(lsm_log_probs(true_latent(X[:, 0])))
    u = np.random.default_rng(seed).uniform(size=len(X))
    return np.sum(u[:, None] > np.cumsum(p, 1), 1)


def vgp_data():
    X = np.linspace(0.0, 10.0, 30)[:, None]  # spacing 0.34: K well conditioned
    return X, draw_labels(X, 0)


def sparse_data():
    X = np.sort(np.random.default_rng(101).uniform(0.0, 10.0, 60))[:, None]
    return X, draw_labels(X, 1)


def make_model(kind):
    """(model, X, y codes): "vgp" (bound VGP), "svgp_x" (SVGP with Z = X fixed), and SVGPs
    with Z fixed on ZGRID: "whitened", "natural_whitened", "kernels" (one kernel per class,
    CLASS_KERNELS), "kernels_same" (a list of C copies of the shared kernel)."""
    lik = LIK.LogisticSoftmax(C)
    if kind in ("vgp", "svgp_x"):
        X, y = vgp_data()
        if kind == "vgp":
            return agp.VGP(kern(), lik).bind(X), X, y
        return agp.SVGP(kern(), lik, fixed(real(X))), X, y
    X, y = sparse_data()
    Z = fixed(real(ZGRID))
    if kind == "kernels":
        return agp.SVGP([kern(*lv) for lv in CLASS_KERNELS], lik, Z), X, y
    if kind == "kernels_same":
        return agp.SVGP([kern() for _ in range(C)], lik, Z), X, y
    return agp.SVGP(kern(), lik, Z, q=kind), X, y


def with_q(model, q):
    return eqx.tree_at(lambda m: m.q, model, q)


@eqx.filter_jit
def _cavi_run(model, X, y, n_steps):
    """n_steps CAVI steps (AnalyticVI sites, natgrad.natural_step with scale 1, rho 1,
    psd=True, multi=True) from ``model`` in one jitted loop. Returns the final model and,
    for t = 0..n_steps, the augmented ELBO after t steps and (t < n_steps) the step size
    taken (NaN-padded to T_MAX + 1). n_steps = 0 only evaluates the bound."""
    params, static = eqx.partition(model, eqx.is_array)
    nan = jnp.full(T_MAX + 1, jnp.nan)

    def body(state):
        params, t, aug_tr, rho_tr = state
        m = eqx.combine(params, static)
        lik = m.likelihood
        aug, p = m.elbo_projection(X, y, 1.0, lik.augmented_expectations)
        beta, gamma = AnalyticVI().sites(lik, y, p.mean, p.var, p.prior_mean)
        q, rho = natgrad.natural_step(m.q, p.Kmm, p.Lmm, p.Kmn, p.A, p.kdiag, beta, gamma,
                                      1.0, 1.0, psd=True, multi=True)
        active = t < n_steps
        q = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), q, m.q)
        aug_tr = aug_tr.at[t].set(aug)
        rho_tr = rho_tr.at[t].set(rho + jnp.where(active, 0.0, jnp.nan))
        return eqx.partition(with_q(m, q), eqx.is_array)[0], t + 1, aug_tr, rho_tr

    state = (params, jnp.asarray(0), nan, nan)
    params, _, aug_tr, rho_tr = lax.while_loop(lambda s: s[1] <= n_steps, body, state)
    return eqx.combine(params, static), aug_tr, rho_tr


def aug_elbo(model, X, y):
    return float(_cavi_run(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(0))[1][0])


_RUNS = {}


def cavi(kind, n_steps=T_MAX):
    """(model after n_steps CAVI steps from the prior, X, y, aug trace, rho trace), cached."""
    key = (kind, n_steps)
    if key not in _RUNS:
        model, X, y = make_model(kind)
        out, aug, rho = _cavi_run(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(n_steps))
        _RUNS[key] = (out, X, y, np.asarray(aug)[: n_steps + 1], np.asarray(rho)[:n_steps])
    return _RUNS[key]


def latent_q(model, c):
    """q(u^c) of latent c (the stacked q's leaves indexed at c)."""
    return jax.tree_util.tree_map(lambda x: x[c], model.q)


def q_moments(model, c, K):
    """(mean, covariance) of q(u^c) for the prior covariance K of latent c, in numpy."""
    Kj = jnp.asarray(K)
    return tuple(np.asarray(a) for a in latent_q(model, c).mean_cov(Kj, jnp.linalg.cholesky(Kj)))


# --- 6. CAVI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vgp", "whitened", "natural_whitened", "kernels"])
def test_cavi_is_monotone_and_converges_to_a_stationary_point(kind):
    """Full-batch CAVI on a 3-class problem (local step: optimal q(n, w); global step:
    optimal q(u^c) for every class at once, rho = 1): the augmented ELBO never decreases
    (1e-9 relative), moves by > 1 nat, and its last steps change it by < 1e-8. At the end
    the bound has a maximum in q: along a random direction d in each of q's (stacked) raw
    parameter arrays, L(+-eps d) - L(0) is second order (|odd part| < 1% of the even part).
    A 5% error in aux_sites' gamma fails this test (measured: CAVI then even lowers the
    bound)."""
    model, X, y, aug, rho = cavi(kind)
    assert np.all(rho == 1.0)
    scale = abs(aug[-1])
    steps = np.diff(aug)
    assert np.all(steps >= -1e-9 * scale), steps.min()
    assert aug[-1] > aug[0] + 1.0
    assert np.all(np.abs(steps[-5:]) < 1e-8), steps[-5:]
    leaves, tree = jax.tree_util.tree_flatten(model.q)
    rng = np.random.default_rng(0)
    eps = 1e-4
    for i in range(len(leaves)):
        d = jax.tree_util.tree_unflatten(tree, [
            jnp.asarray(rng.uniform(-1, 1, np.shape(x)) if j == i else np.zeros(np.shape(x)))
            for j, x in enumerate(leaves)])
        up, down = (aug_elbo(with_q(model, jax.tree_util.tree_map(lambda a, b, e=e: a + e * b,
                                                                   model.q, d)), X, y)
                    for e in (eps, -eps))
        odd, even = 0.5 * (up - down), aug[-1] - 0.5 * (up + down)
        assert even > 0, (up, down, aug[-1])
        assert abs(odd) < 0.01 * even, (odd, even)


def test_vgp_cavi_fixed_point_is_thesis_algorithm_5():
    """The VGP's q(f^c) = N(mu_c, Sigma_c) at the CAVI fixed point is the fixed point of
    thesis Algorithm 5 (7.4, over-parameterised link) iterated in dense numpy from the
    prior: Sigma_c = (K^-1 + diag theta_c)^-1, mu_c = Sigma_c (y'_c - E n_c) / 2, with
    theta, E n from the marginals (numpy_sites)."""
    model, X, y, _, _ = cavi("vgp")
    K = matern52(X, X)
    Ki = np.linalg.inv(K)
    mu, S = np.zeros((C, len(y))), np.stack([K] * C)
    for _ in range(500):
        m, v = mu.T, np.stack([np.diag(s) for s in S], 1)
        beta, gamma, _ = numpy_sites(y, m, v)
        S_new = np.stack([np.linalg.inv(Ki + np.diag(gamma[:, c])) for c in range(C)])
        mu_new = np.stack([S_new[c] @ beta[:, c] for c in range(C)])
        done = np.max(np.abs(mu_new - mu)) < 1e-13 and np.max(np.abs(S_new - S)) < 1e-13
        mu, S = mu_new, S_new
        if done:
            break
    else:
        raise AssertionError("numpy Algorithm 5 did not converge")
    for c in range(C):
        mq, Sq = q_moments(model, c, K)
        np.testing.assert_allclose(mq, mu[c], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(Sq, S[c], rtol=1e-8, atol=1e-10)
    mean, var = (np.asarray(a) for a in model.predict_f(X))
    np.testing.assert_allclose(mean, mu.T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var, np.stack([np.diag(s) for s in S], 1), rtol=1e-8)


# --- 7. AnalyticSVI: the full batch is CAVI; a minibatch interpolates natural parameters -------


def test_full_batch_svi_step_with_string_labels_is_the_cavi_step():
    """fit with AnalyticSVI(batch_size = n, step_size = 1) takes exactly one CAVI step of the
    direct building blocks (every class at once) and, with the augmented objective, reports
    the augmented bound before the step as its objective -- here with string labels and
    classes in a non-sorted order, so the fit on labels is the fit on their codes (a wrong
    label order permutes the classes and changes q). The posterior speaks labels:
    predict_class returns them (training accuracy 0.65 after this one step, measured, vs
    0.37 for the majority class);
    predict_log_density accepts them and is the log of predict_proba's column; an unseen
    label raises ValueError naming it."""
    classes = ["emu", "cat", "dog"]
    model, X, codes, _, _ = cavi("natural_whitened", 0)
    one, _, _, aug, _ = cavi("natural_whitened", 1)
    names = np.array(classes)[codes]
    model = eqx.tree_at(lambda m: m.likelihood, model, LIK.LogisticSoftmax(classes))
    post = agp.fit(model, X, names, agp.AnalyticSVI(batch_size=len(codes), step_size=1.0,
                                                    objective="augmented"),
                   max_iter=1, chunk_size=1)
    for field in ("theta1", "theta2"):
        got, want = (np.asarray(getattr(m.q, field).value) for m in (post.model, one))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.max(np.abs(want)))
    np.testing.assert_allclose(post.history.objective, [-aug[0]], rtol=1e-12)
    np.testing.assert_allclose(post.history.step_size, [1.0])
    pred = post.predict_class(X)
    assert pred.dtype.kind == "U" and set(pred) <= set(classes)
    assert np.mean(pred == names) > 0.6, np.mean(pred == names)
    P = np.asarray(post.predict_proba(X))
    np.testing.assert_array_equal(pred, np.array(classes)[np.argmax(P, 1)])
    ld = np.asarray(post.predict_log_density(X, names))
    np.testing.assert_allclose(ld, np.log(P[np.arange(len(codes)), codes]), rtol=1e-10)
    with pytest.raises(ValueError, match="fox"):
        post.predict_log_density(X, np.where(codes == 1, "fox", names))


def first_batch(key, n, s):
    """The first minibatch of fit's shuffled epochs (fit._batch at t = 0)."""
    _, sub = jax.random.split(key)
    return np.asarray(jax.random.permutation(sub, n))[:s]


def test_minibatch_step_interpolates_natural_parameters():
    """One AnalyticSVI step on a batch B of s points with step rho gives, per class c, in the
    unwhitened natural parameters of q(u^c) (q = "natural"),
        eta_c <- (1 - rho) eta_c + rho eta_hat_c,  eta1_hat = (n/s) kappa_B^T beta_B^c,
        eta2_hat = -1/2 (Kmm^-1 + (n/s) kappa_B^T diag(gamma_B^c) kappa_B),
    (notes section 4.6, eqs. 15-16 in natural parameters, errata 20), kappa = K_Bm Kmm^-1, the
    sites (coupled across classes through sum_c psi_c) at the marginals of the current q --
    all in numpy from the kernel matrices."""
    run, X, y, _, _ = cavi("whitened", 2)  # a q away from the prior and the optimum
    Kmm = matern52(ZGRID, ZGRID)
    Kinv = np.linalg.inv(Kmm)
    eta1, eta2 = [], []
    for c in range(C):
        mu, S = q_moments(run, c, Kmm)
        P = np.linalg.inv(S)
        eta1.append(P @ mu)
        eta2.append(-0.5 * P)
    eta1, eta2 = np.stack(eta1), np.stack(eta2)
    q = NaturalQ(real(jnp.asarray(eta1)), real(jnp.asarray(eta2)), whiten=False)
    start = with_q(run, q)
    n, s, rho = len(y), 15, 0.3
    key = jax.random.key(7)
    post = agp.fit(start, X, y, agp.AnalyticSVI(s, step_size=rho), max_iter=1, chunk_size=1,
                   key=key)
    np.testing.assert_allclose(post.history.step_size, [rho])
    B = first_batch(key, n, s)
    KmB = matern52(ZGRID, X[B])
    kappa = np.linalg.solve(Kmm, KmB).T
    S = np.linalg.inv(-2.0 * eta2)
    m = np.stack([kappa @ (S[c] @ eta1[c]) for c in range(C)], 1)
    v = np.stack([KVAR - np.sum(kappa * KmB.T, 1) + np.sum((kappa @ S[c]) * kappa, 1)
                  for c in range(C)], 1)
    beta, gamma, _ = numpy_sites(y[B], m, v)
    new1, new2 = (np.asarray(a.value) for a in (post.model.q.theta1, post.model.q.theta2))
    for c in range(C):
        hat1 = (n / s) * kappa.T @ beta[:, c]
        hat2 = -0.5 * (Kinv + (n / s) * kappa.T @ (gamma[:, c, None] * kappa))
        want1, want2 = (1 - rho) * eta1[c] + rho * hat1, (1 - rho) * eta2[c] + rho * hat2
        np.testing.assert_allclose(new1[c], want1, rtol=1e-9, atol=1e-9 * np.max(np.abs(want1)))
        np.testing.assert_allclose(0.5 * (new2[c] + new2[c].T), want2, rtol=1e-9,
                                   atol=1e-9 * np.max(np.abs(want2)))
    # the full-batch target differs: the step used the batch and its scale n / s
    assert np.max(np.abs((n / s) * kappa.T @ beta - kappa.T @ beta)) > 1.0


# --- 8. agreement with an elliptical slice sampler -------------------------------------------


def elliptical_slice(loglik, Lk, y_shape, n_chains, n_keep, n_burn, seed, collect):
    """Elliptical slice sampling (Murray, Adams & MacKay 2010) of p(F) ~ prod_c
    N(F[:, c] | 0, Lk Lk^T) L(F) for F of shape y_shape = (n, C) (block-diagonal prior),
    ``n_chains`` chains from prior draws advanced together in numpy; ``loglik`` maps
    (chains, n, C) to (chains,). Returns per-chain means of the kept F, of F^2 and of
    ``collect(F, rng)`` (any array per chain)."""
    rng = np.random.default_rng(seed)
    draw = lambda: np.einsum("ij,bjc->bic", Lk, rng.normal(size=(n_chains, *y_shape)))
    f = draw()
    ll = loglik(f)
    s1, s2, s3 = 0.0, 0.0, 0.0
    for it in range(n_burn + n_keep):
        nu = draw()
        log_y = ll + np.log(rng.uniform(size=n_chains))
        theta = rng.uniform(0.0, 2.0 * np.pi, n_chains)
        lo, hi = theta - 2.0 * np.pi, theta.copy()
        idx = np.arange(n_chains)
        while idx.size:  # shrink each chain's bracket until its proposal is on the slice
            t = theta[idx][:, None, None]
            prop = f[idx] * np.cos(t) + nu[idx] * np.sin(t)
            lp = loglik(prop)
            ok = lp > log_y[idx]
            f[idx[ok]], ll[idx[ok]] = prop[ok], lp[ok]
            rej = idx[~ok]
            neg = theta[rej] < 0.0
            lo[rej[neg]], hi[rej[~neg]] = theta[rej[neg]], theta[rej[~neg]]
            theta[rej] = rng.uniform(lo[rej], hi[rej])
            idx = rej
        if it >= n_burn:
            s1, s2, s3 = s1 + f, s2 + f * f, s3 + collect(f, rng)
    return s1 / n_keep, s2 / n_keep, s3 / n_keep


@pytest.mark.slow
def test_vgp_cavi_agrees_with_elliptical_slice_sampling():
    """The CAVI fixed point of the 3-class VGP (fixed hyperparameters) against the exact
    posterior from elliptical slice sampling on the 3n = 90-dimensional latent with the
    block-diagonal prior and the exact logistic-softmax log-likelihood (independent numpy
    code and kernel matrix, seeded; 40 chains x 600 samples after 250 burn-in here, 200 x
    5000 with AGP_FULL_SLOW=1). se: Monte Carlo standard error from the spread of the
    independent chains' means (the chains agree: se / sd_p < 0.06).

    Tolerances, from what the thesis reports for this augmentation (ch. 4 section 5.2, Wine,
    no inducing points, fixed hyperparameters: augmented VI "slightly overestimates mu and
    underestimates sigma^2", predictive p close to the truth, accuracy 0.96 vs Gibbs' 0.98),
    and what the long run measures here (200 x 5000 samples, se / sd_p = 0.006):
    - latent means |E_q f - E_p f| <= 0.3 sd_p + 4 se: the mean-field q(f) q(n, w) bias is a
      fraction of the posterior sd (measured max 0.13 sd, mean 0.08 sd, |E_q f| > |E_p f|
      for 57% of the latents: the thesis' slight overestimate; the logistic binary case in
      test_analytic_vi.py allows 0.2 at measured 0.06, this bound is looser: a Poisson
      count per class, lambda integrated out). The data move the posterior by more than the
      tolerance (asserted: max |E_p f| / sd_p > 0.8; measured 1.09), so q = prior fails;
    - sd_q / sd_p in [0.6, 1.0]: variances are underestimated, never over (measured 0.71 -
      0.83; sd ratio 0.6 is variance 0.36 of the truth);
    - class probabilities at 6 test inputs (two outside the data) |p_q - p_MCMC| <= 0.02 +
      4 se (measured max 0.0067): 0.02 is the accuracy scale of the thesis' 0.96 vs 0.98.
    """
    model, X, y, _, _ = cavi("vgp")
    n = len(y)
    n_chains, n_keep, n_burn = (200, 5000, 1000) if FULL else (40, 600, 250)
    K = matern52(X, X)
    Kxs = matern52(X, XS)
    W = np.linalg.solve(K, Kxs)  # E[f* | f] = W^T f
    sd_star = np.sqrt(KVAR - np.sum(Kxs * W, 0))[None, :, None]
    Y = np.eye(C, dtype=bool)[y]
    loglik = lambda F: np.sum(np.where(Y, lsm_log_probs(F), 0.0), axis=(-2, -1))

    def collect(F, rng):  # p(y* | f) by one draw of f* ~ p(f* | f) per sample
        fs = np.einsum("bic,ij->bjc", F, W) + sd_star * rng.normal(size=(len(F), len(XS), C))
        return np.exp(lsm_log_probs(fs))

    means, second, probs = elliptical_slice(loglik, np.linalg.cholesky(K), (n, C), n_chains,
                                            n_keep, n_burn, 13, collect)
    pm = means.mean(0)
    psd = np.sqrt(second.mean(0) - pm**2)
    se = means.std(0, ddof=1) / np.sqrt(n_chains)
    assert np.max(se / psd) < 0.06  # the chains agree
    m, v = (np.asarray(a) for a in model.predict_f(X))
    err = np.abs(m - pm)
    ratio = np.sqrt(v) / psd
    p_mc = probs.mean(0)
    p_se = probs.std(0, ddof=1) / np.sqrt(n_chains)
    p_vi = np.asarray(model.predict_proba(XS))
    bigger = np.mean(np.abs(m) > np.abs(pm))
    print(f"max se/sd {np.max(se / psd):.3f}; |mean error| / sd max {np.max(err / psd):.3f} "
          f"mean {np.mean(err / psd):.3f}; |E_q f| > |E_p f| for {bigger:.2f}"
          f"; sd ratio {ratio.min():.3f} - {ratio.max():.3f}; max |dp| "
          f"{np.max(np.abs(p_vi - p_mc)):.4f}; max |E_p f| / sd {np.max(np.abs(pm) / psd):.2f}")
    assert np.all(err <= 0.3 * psd + 4.0 * se), np.max((err - 4.0 * se) / psd)
    assert np.max(np.abs(pm) / psd) > 0.8
    assert 0.6 <= ratio.min() and ratio.max() <= 1.0, (ratio.min(), ratio.max())
    assert np.all(np.abs(p_vi - p_mc) <= 0.02 + 4.0 * p_se), np.max(np.abs(p_vi - p_mc))


# --- 9. class probabilities and expectations against brute-force Monte Carlo ------------------


MV_M = np.array([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0], [3.0, 2.5, -2.0], [-1.0, 1.5, 0.3]])
MV_V = np.array([[0.3, 1.0, 2.0], [1.0, 1.0, 1.0], [0.1, 3.0, 0.5], [2.0, 0.2, 1.2]])
MV_Y = np.array([2, 0, 1, 1])


_MC = {}


def mc_draws():
    """10^6 draws per row of f ~ N(MV_M_i, diag MV_V_i), (4, 10^6, 3), shared and cached."""
    if "F" not in _MC:
        _MC["F"] = mc_normal(MV_M, MV_V, 1_000_000, seed=21)
    return _MC["F"]


def test_predict_proba_against_monte_carlo():
    """LogisticSoftmax and Softmax predict_proba (2048 scrambled-Sobol points) against 10^6
    pseudo-random draws per row: rows sum to 1 and agree within 2e-3 (MC se <= 5e-4); the
    plug-in probabilities at the mean differ (the integral matters)."""
    F = mc_draws()
    mj, vj = jnp.asarray(MV_M), jnp.asarray(MV_V)
    for lik, probs in ((LIK.LogisticSoftmax(3), lambda F: np.exp(lsm_log_probs(F))),
                       (LIK.Softmax(3), lambda F: np.exp(F - logsumexp(F, -1, keepdims=True)))):
        got = np.asarray(lik.predict_proba(mj, vj))
        want = probs(F).mean(1)
        np.testing.assert_allclose(got.sum(1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(got, want, atol=2e-3)
        assert np.max(np.abs(probs(MV_M) - want)) > 0.02


def test_robustmax_against_monte_carlo():
    """RobustMax (epsilon 0.05, default 20-node Gauss-Hermite): predict_proba against the
    Monte Carlo frequency of the argmax (10^6 draws) mapped through the definition
    (1 - eps if argmax, eps / (C - 1) otherwise), variational_expectations against MC of
    log p(y | f), both within 4 MC se + 1e-4 (quadrature allowance, far below the MC
    resolution); rows sum to 1 within 1e-3."""
    F = mc_draws()
    mj, vj = jnp.asarray(MV_M), jnp.asarray(MV_V)
    eps = 0.05
    rm = LIK.RobustMax(3, eps)
    hit = (np.argmax(F, -1)[..., None] == np.arange(3)).astype(float)  # (rows, draws, C)
    P, P_se = hit.mean(1), hit.std(1) / 1e3
    got = np.asarray(rm.predict_proba(mj, vj))
    want = (1.0 - eps) * P + eps / 2.0 * (1.0 - P)
    se = (1.0 - eps - eps / 2.0) * P_se
    assert np.all(np.abs(got - want) <= 4.0 * se + 1e-4), (got, want)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-3)
    logp = np.where(np.argmax(F, -1) == MV_Y[:, None], math.log(1.0 - eps), math.log(eps / 2.0))
    ve = np.asarray(rm.variational_expectations(jnp.asarray(MV_Y), mj, vj))
    se = logp.std(1) / 1e3
    assert np.all(np.abs(ve - logp.mean(1)) <= 4.0 * se + 1e-4), (ve, logp.mean(1))


def sobol_rms_error(fun, m, v, n_points, n_rep=32):
    """RMS error of a randomly scrambled Sobol rule with n_points points (the rule the
    library uses, with other scrambling seeds) for E fun(f), f ~ N(m_i, diag v_i), per row,
    against the mean over all replicates (n_rep * n_points points)."""
    from scipy.stats import norm, qmc

    est = []
    for seed in range(1, n_rep + 1):
        u = qmc.Sobol(m.shape[1], scramble=True, seed=seed).random(n_points)
        eps = norm.ppf(np.clip(u, 1e-12, 1.0 - 1e-12))
        est.append(fun(m[:, None, :] + np.sqrt(v)[:, None, :] * eps[None]).mean(1))
    est = np.array(est)
    return np.sqrt(np.mean((est - est.mean(0)) ** 2, 0))


@pytest.mark.filterwarnings("ignore:The balance properties of Sobol")
def test_monte_carlo_variational_expectations():
    """Softmax.variational_expectations and LogisticSoftmax's (the non-augmented QuadratureVI
    data term) with num_samples = 100: without a key (the same 100 scrambled-Sobol points)
    within 4 x the rule's own RMS error (estimated over 32 other scramblings) + 4 MC se of
    the 10^6-draw truth; with a key (pseudo-random draws) unbiased: the average over 400
    keys within 4 standard errors of the truth."""
    F = mc_draws()
    y = jnp.asarray(MV_Y)
    mj, vj = jnp.asarray(MV_M), jnp.asarray(MV_V)
    labels = np.broadcast_to(MV_Y[:, None], F.shape[:2])
    cases = {  # likelihood, log p(y | F) on (rows, draws, C), the Monte Carlo part of E log p
        "Softmax": (LIK.Softmax(3),
                    lambda F: np.take_along_axis(F, labels[..., None], 2)[..., 0]
                    - logsumexp(F, -1),
                    lambda G: logsumexp(G, -1)),
        "LogisticSoftmax": (LIK.LogisticSoftmax(3), lambda F: lsm_log_prob(labels, F),
                            lambda G: logsumexp(log_sig(G), -1)),
    }
    for name, (lik, logp, mc_part) in cases.items():
        vals = logp(F)
        truth, truth_se = vals.mean(1), vals.std(1) / 1e3
        rms = sobol_rms_error(mc_part, MV_M, MV_V, 100)
        qmc_ve = np.asarray(lik.variational_expectations(y, mj, vj))
        assert np.all(np.abs(qmc_ve - truth) <= 4.0 * (rms + truth_se)), (name, qmc_ve - truth,
                                                                         rms)
        keys = jax.random.split(jax.random.key(5), 400)
        draws = np.asarray(jax.vmap(lambda k, lik=lik: lik.variational_expectations(
            y, mj, vj, key=k))(keys))
        se = draws.std(0, ddof=1) / np.sqrt(len(keys))
        assert np.all(np.abs(draws.mean(0) - truth) <= 4.0 * (se + truth_se)), (
            name, (draws.mean(0) - truth) / se)
        assert np.all(draws.std(0) > 1e-4)  # the keys matter


# --- 10. class labels ---------------------------------------------------------------------------
# Fits with labels: string labels in test_full_batch_svi_step_with_string_labels_is_the_cavi_step,
# non-contiguous integer labels and a declared class with no training point in
# test_analytic_svi_classifies_real_data_with_integer_labels (one compiled fit each).


def test_class_labels_are_validated():
    """classes: an int C >= 2 or a 1-D sequence of >= 2 distinct labels; targets are mapped to
    codes in the order of ``classes`` (not sorted order); a label outside ``classes``, a
    NaN, or y that is not 1-D raises ValueError naming the problem."""
    lik = LIK.LogisticSoftmax(["emu", "cat", "dog"])
    assert lik.classes == ("emu", "cat", "dog") and lik.num_latent == 3
    np.testing.assert_array_equal(lik.check_targets(["cat", "emu", "dog", "cat"]), [1, 0, 2, 1])
    ints = LIK.Softmax([11, 3, 7])
    np.testing.assert_array_equal(ints.check_targets(np.array([3, 7, 11, 3])), [1, 2, 0, 1])
    np.testing.assert_array_equal(LIK.RobustMax(4).check_targets([3, 0, 2]), [3, 0, 2])
    assert LIK.LogisticSoftmax(4).classes == (0, 1, 2, 3)
    for family in (LIK.LogisticSoftmax, LIK.Softmax, LIK.RobustMax):
        for bad in (1, 0, [4], ["a", "b", "a"], [[0, 1], [2, 3]]):
            with pytest.raises(ValueError):
                family(bad)
    with pytest.raises(ValueError, match="fox"):
        lik.check_targets(["cat", "fox"])
    with pytest.raises(ValueError, match="5"):
        LIK.LogisticSoftmax([3, 7, 11]).check_targets([3, 5])
    with pytest.raises(ValueError, match="NaN"):
        LIK.LogisticSoftmax(3).check_targets(np.array([0.0, np.nan]))
    X, codes = vgp_data()
    names = np.array(["emu", "cat", "dog"])[codes]
    model = agp.VGP(kern(), lik)
    with pytest.raises(ValueError, match="fox"):
        agp.fit(model, X, np.where(codes == 0, "fox", names), agp.AnalyticVI(), max_iter=1)
    with pytest.raises(ValueError, match="1-D"):
        agp.fit(model, X, np.stack([names, names], 1), agp.AnalyticVI(), max_iter=1)
    with pytest.raises(ValueError, match="rows"):
        agp.fit(model, X, names[:-1], agp.AnalyticVI(), max_iter=1)


# --- 11. multi-latent plumbing ------------------------------------------------------------------


def test_shared_kernel_equals_a_list_of_identical_kernels():
    """A kernel shared by the three latents and a list of three identical kernels (stacked
    and vmapped) give the same bound after every CAVI step (1e-10) and the same q(u^c); the
    per-class kernels of CLASS_KERNELS give a different fit (the list is used)."""
    steps = 5
    shared, _, _, a_shared, _ = cavi("whitened", steps)
    listed, _, _, a_list, _ = cavi("kernels_same", steps)
    _, _, _, a_other, _ = cavi("kernels", steps)
    np.testing.assert_allclose(a_list, a_shared, rtol=1e-10)
    assert abs(a_other[-1] - a_shared[-1]) > 0.1
    for got, want in zip(jax.tree_util.tree_leaves(listed.q), jax.tree_util.tree_leaves(shared.q),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_svgp_with_inducing_at_the_data_equals_vgp():
    """SVGP with Z = X (fixed) and VGP hold the same q(f^c(X)) for every class after the same
    CAVI steps: the bounds agree at every step (1e-9) and the predictions at new inputs
    agree (1e-6)."""
    steps = 3
    vgp, _, _, av, _ = cavi("vgp", steps)
    svgp, _, _, as_, _ = cavi("svgp_x", steps)
    np.testing.assert_allclose(as_, av, rtol=1e-9)
    assert av[steps] > av[steps - 1] + 1e-6  # not converged: a non-trivial q
    for got, want in zip(svgp.predict_f(XS), vgp.predict_f(XS), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_prior_kl_is_the_sum_of_per_latent_kls():
    """prior_kl() of the per-class-kernel SVGP at its CAVI optimum is sum_c KL(q(u^c) ||
    N(0, K_c(Z, Z))) with each class's own kernel matrix, in dense numpy from q's raw
    (whitened mean, Cholesky factor) arrays. The whitened KL does not depend on K_c, so the
    same distributions are also put in an unwhitened q (CholeskyQ(whiten=False)), where the
    KL does: prior_kl() must use every class's own kernel (a shared one is > 0.1 off)."""
    model = cavi("kernels")[0]
    mean, chol = np.asarray(model.q.mean.value), np.asarray(model.q.chol.value)
    mus, factors, kls, shared = [], [], [], []
    for c, (ls, var) in enumerate(CLASS_KERNELS):
        K = matern52(ZGRID, ZGRID, ls, var)
        Lk = np.linalg.cholesky(K)
        mus.append(Lk @ mean[c])
        factors.append(Lk @ np.tril(chol[c]))
        kls.append(dense_kl(mus[-1], factors[-1] @ factors[-1].T, K))
        shared.append(dense_kl(mus[-1], factors[-1] @ factors[-1].T, matern52(ZGRID, ZGRID)))
    prior_kl = eqx.filter_jit(lambda m: m.prior_kl())
    np.testing.assert_allclose(prior_kl(model), sum(kls), rtol=1e-9)
    assert min(kls) > 0.1 and abs(sum(shared) - sum(kls)) > 0.1
    q = CholeskyQ(real(jnp.asarray(np.stack(mus))), real(jnp.asarray(np.stack(factors))),
                  whiten=False)
    np.testing.assert_allclose(prior_kl(with_q(model, q)), sum(kls), rtol=1e-9)


def test_sample_f_and_full_covariance():
    """predict_f(full_cov=True) is (n*, C) and (C, n*, n*) with the diagonal of each block the
    marginal variance (1e-10); sample_f is (S, n*, C) with sample mean and covariance within
    Monte Carlo error of predict_f (4.5 se for means, 5 se for covariances), the latents
    uncorrelated across classes."""
    model = cavi("vgp")[0]
    mean, var = (np.asarray(a) for a in model.predict_f(XS))
    fm, cov = (np.asarray(a) for a in model.predict_f(XS, full_cov=True))
    assert fm.shape == (len(XS), C) and cov.shape == (C, len(XS), len(XS))
    np.testing.assert_allclose(fm, mean, rtol=1e-12)
    np.testing.assert_allclose(np.stack([np.diag(k) for k in cov], 1), var, rtol=1e-10)
    S = 4000
    F = np.asarray(model.sample_f(jax.random.key(3), XS, S))
    assert F.shape == (S, len(XS), C)
    assert np.all(np.abs(F.mean(0) - mean) <= 4.5 * np.sqrt(var / S))
    flat = F.reshape(S, -1)  # index i * C + c
    emp = np.cov(flat.T)
    want = np.zeros_like(emp)
    for c in range(C):
        want[c::C, c::C] = cov[c]
    sd = np.sqrt(np.diag(want))
    se = np.sqrt((np.outer(sd, sd) ** 2 + want**2) / S)
    assert np.all(np.abs(emp - want) <= 5.0 * se), np.max(np.abs(emp - want) / se)


# --- 12. real data ----------------------------------------------------------------------------


def _standardise_train_test(Xtr, Xte):
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    return (Xtr - mu) / sd, (Xte - mu) / sd


def real_problem(name, n_train, n_test, seed=0):
    """(Xtr, ytr, Xte, yte, C): letters A-E of UCI letter (shared data; 3864 rows, 16
    integer features) or scikit-learn's bundled digits (1797 8x8 images, 10 classes),
    random split, inputs standardised on the training set."""
    rng = np.random.default_rng(seed)
    if name == "letter":
        d = load_shared("letter")
        keep = d["y"] < 5
        X, y = d["X"][keep], d["y"][keep]
    else:
        datasets = pytest.importorskip("sklearn.datasets")
        d = datasets.load_digits()
        X, y = d.data, d.target
    idx = rng.permutation(len(y))
    i, j = idx[:n_train], idx[n_train:n_train + n_test]
    Xtr, Xte = _standardise_train_test(X[i], X[j])
    return Xtr, y[i], Xte, y[j], int(y.max()) + 1


def fit_real(Xtr, ytr, inference, lik, M, iters):
    Z = agp.inducing.kmeans(Xtr, M, jax.random.key(0))
    model = agp.SVGP(agp.kernels.RBF(float(np.sqrt(Xtr.shape[1])), 1.0), lik, fixed(real(Z)))
    return agp.fit(model, Xtr, ytr, inference, max_iter=iters, learning_rate=0.02, tol=0.0,
                   chunk_size=iters, key=jax.random.key(1))


def scores(post, Xte, yte):
    """Test accuracy and NLL, both from predict_proba (predict_class is its argmax and
    predict_log_density the log of its column: tested on the synthetic problems)."""
    P = np.asarray(post.predict_proba(Xte))
    return float(np.mean(np.argmax(P, 1) == yte)), -float(np.mean(np.log(P[np.arange(len(yte)),
                                                                             yte])))


REAL_ACC = {"letter": 0.85, "digits": 0.88}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["letter", pytest.param("digits", marks=pytest.mark.slow)])
def test_classifier_multiclass_default_is_within_five_percent_of_the_softmax(name, monkeypatch):
    """GPClassifier()'s two multi-class configurations on 600 rows, full batch: the default
    logistic-softmax (hyperparameters at the plain ELBO's optimum, ``objective="tight"``)
    and GPClassifier("softmax") (QuadratureVI, natural step 0.5 for several latents) are
    each within 5% of the better one's test NLL (measured 0.1454 against 0.1434 on letter,
    0.1948 against 0.1904 on digits; with step 1 the softmax's sites overshot: 0.397 on
    letter). Oracle for the objective: the same estimator with its hyperparameters on the
    augmented bound, whose test NLL must be at least 1.25x the default's (measured 0.2398
    on letter, 0.3663 on digits)."""
    if name == "digits" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds digits)")
    import augmentedgp.inference.plan as agp_plan
    import augmentedgp.sklearn as estimators

    Xtr, ytr, Xte, yte, _ = real_problem(name, 600, 400)

    def nll(estimator):
        P = estimator.fit(Xtr, ytr).predict_proba(Xte)
        return -float(np.mean(np.log(P[np.arange(len(yte)), yte])))

    default = nll(estimators.GPClassifier(random_state=0))
    softmax = nll(estimators.GPClassifier("softmax", random_state=0))
    assert max(default, softmax) <= 1.05 * min(default, softmax), (default, softmax)
    monkeypatch.setattr(agp_plan, "augmented_objective",
                        lambda likelihood, minibatch: "augmented")
    with pytest.warns(UserWarning, match="nats per point below the ELBO"):
        augmented = nll(estimators.GPClassifier(random_state=0))
    assert augmented >= 1.25 * default, (augmented, default)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["letter", pytest.param("digits", marks=pytest.mark.slow)])
def test_analytic_svi_classifies_real_data_with_integer_labels(name):
    """AnalyticSVI (LogisticSoftmax, batch 100, Robbins-Monro steps, hyperparameters by Adam
    from RBF(sqrt(d), 1), M k-means inducing inputs fixed) on real data whose classes carry
    the non-contiguous integer labels 10, 20, ..., 10 C, plus one more declared class
    10 (C + 1) with no training point. The fit works (finite bound at every step),
    predict_class returns integer labels and never the absent class, whose probability stays
    below 1 / (C + 1) at the training inputs (every point is evidence against it; measured
    max 8e-4 on letters; 0.087 < 1/11 on digits, whose least certain points spread their
    probability almost evenly over the 11 classes); predict_log_density accepts the labels
    and is the log of predict_proba's column; test accuracy is at least REAL_ACC and test
    NLL well below the constant (class-frequency) predictor's.

    Thresholds: chance is 0.2 (letters A-E, balanced) and 0.1 (digits); on the same splits a
    multinomial logistic regression scores 0.95 / 0.96 and QuadratureSVI with the softmax
    0.94 / 0.956, so a working GP classifier lands within ~0.1 of them: 0.85 / 0.88
    (measured 0.92 letter, n = 600, M = 30, 600 iterations; with AGP_FULL_SLOW=1, M = 50:
    0.93 letter, 0.927 digits, n = 1000). NLL: below 40% of the constant predictor's
    (measured 0.37 and 0.34 / 1.61 letter, 0.46 / 2.31 digits). Letters only by default;
    digits with AGP_FULL_SLOW=1."""
    if name != "letter" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds digits)")
    n_train, n_test = {"letter": (600, 300), "digits": (1000, 797)}[name]
    Xtr, ytr, Xte, yte, C_ = real_problem(name, n_train, n_test)
    labels = 10 * np.arange(1, C_ + 2)
    M = 50 if FULL else 30
    post = fit_real(Xtr, labels[ytr], agp.AnalyticSVI(100),
                    LIK.LogisticSoftmax(labels), M, 600)
    assert np.all(np.isfinite(post.history.objective))
    pred = post.predict_class(Xte)
    assert pred.dtype.kind in "iu" and set(pred.tolist()) <= set(labels[:C_].tolist())
    P = np.asarray(post.predict_proba(Xte))
    ld = np.asarray(post.predict_log_density(Xte, labels[yte]))
    np.testing.assert_allclose(ld, np.log(P[np.arange(len(yte)), yte]), rtol=1e-10)
    absent = np.asarray(post.predict_proba(Xtr[:n_test]))[:, C_]  # (same shape: no recompile)
    assert np.max(absent) < 1.0 / (C_ + 1), np.max(absent)
    acc, nll = float(np.mean(pred == labels[yte])), -float(np.mean(ld))
    freq = np.bincount(ytr, minlength=C_) / len(ytr)
    base = -float(np.mean(np.log(freq[yte])))
    print(f"{name}: AnalyticSVI accuracy {acc:.3f} NLL {nll:.4f} (constant predictor {base:.4f})"
          f"; absent class max p {np.max(absent):.2g}")
    assert acc >= REAL_ACC[name], acc
    assert nll < 0.4 * base, (nll, base)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["letter", "digits"])
def test_analytic_svi_nll_is_close_to_quadrature_svi_softmax(name):
    """Same data, inducing inputs, kernel start, minibatches (key) and iterations:
    AnalyticSVI (LogisticSoftmax) with the hyperparameters at the plain ELBO's optimum
    (``objective="tight"``: the augmented fit, then tight sites), at its default step 0.1,
    against QuadratureSVI (Softmax) at its better step here, Robbins-Monro: test NLL within
    5%, test accuracy at most 0.03 below.

    Measured (M = 50): NLL letter 0.1799 vs 0.1741, digits 0.2126 vs 0.2028 (QuadratureSVI
    at its default step 0.1: 0.1786, 0.2066); accuracy 0.953 vs 0.950, 0.956 vs 0.951.
    ``objective="exact"`` gives 0.1599 and 0.2227 (+9.8% on digits); the augmented
    objective fails by far (Robbins-Monro steps: NLL 0.339 and 0.460): its Jensen gap
    penalises latent variance, so the kernel variance learned on it stays at 6 (letter; 4
    digits) instead of 76 (39) -- the quadrature softmax learns 87 (52). At those small
    variances, full-batch CAVI from the prior also stalls near -n log C (psi_c ~ e^{-c_c/2}
    gives the classes not observed at a point almost no evidence against them). Run with
    AGP_FULL_SLOW=1."""
    if not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 runs the comparison)")
    n_train, n_test = {"letter": (600, 300), "digits": (1000, 797)}[name]
    Xtr, ytr, Xte, yte, C_ = real_problem(name, n_train, n_test)
    res = {}
    for inference, lik in ((agp.AnalyticSVI(100, objective="tight"), LIK.LogisticSoftmax(C_)),
                           (agp.QuadratureSVI(100, agp.schedules.RobbinsMonro()),
                            LIK.Softmax(C_))):
        res[type(inference).__name__] = scores(fit_real(Xtr, ytr, inference, lik, 50, 600),
                                               Xte, yte)
    (acc_a, nll_a), (acc_q, nll_q) = res["AnalyticSVI"], res["QuadratureSVI"]
    print(f"{name}: accuracy {acc_a:.3f} / {acc_q:.3f}, NLL {nll_a:.4f} / {nll_q:.4f}")
    assert acc_a >= acc_q - 0.03, (acc_a, acc_q)
    assert nll_a <= 1.05 * nll_q, (nll_a, nll_q)


# --- 13. errors ---------------------------------------------------------------------------------


def test_bad_use_raises_value_error():
    X, y = vgp_data()
    Z = fixed(real(ZGRID))
    for lik in (LIK.Softmax(3), LIK.RobustMax(3)):
        with pytest.raises(ValueError, match="QuadratureVI"):
            agp.fit(agp.VGP(kern(), lik), X, y, agp.AnalyticVI(), max_iter=1)
        with pytest.raises(ValueError, match="QuadratureVI"):
            agp.fit(agp.SVGP(kern(), lik, Z), X, y, agp.AnalyticSVI(10), max_iter=1)
    for lik in (LIK.LogisticSoftmax(3), LIK.Softmax(3)):
        with pytest.raises(ValueError, match="SVGP or VGP"):
            agp.GP(kern(), lik)
    for bad in ([kern(), kern()], [kern()] * 4):
        with pytest.raises(ValueError, match="one kernel per latent"):
            agp.SVGP(bad, LIK.LogisticSoftmax(3), Z)
        with pytest.raises(ValueError, match="one kernel per latent"):
            agp.VGP(bad, LIK.LogisticSoftmax(3))
    for bad in ([kern()], [kern(), kern()]):
        with pytest.raises(ValueError, match="several latent functions"):
            agp.SVGP(bad, LIK.Logistic(), Z)
        with pytest.raises(ValueError, match="several latent functions"):
            agp.VGP(bad, LIK.Logistic())
    with pytest.raises(ValueError, match="one mean per latent"):
        agp.SVGP(kern(), LIK.LogisticSoftmax(3), Z, mean=[agp.means.Zero()] * 2)
    with pytest.raises(ValueError, match="same type"):
        agp.SVGP([kern(), agp.kernels.RBF(fp(1.0), fp(1.0)), kern()], LIK.LogisticSoftmax(3), Z)
