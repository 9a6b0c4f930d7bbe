"""The augmentation protocol (augmentedgp.augmentation) against independent oracles.

Every augmented likelihood is p(y | f) = C e^{g f} phi(h^2) = int C e^{g f - w h^2} p(w) dw.
The oracles here never re-type the library's formulas: the mixing densities p(w) are the
known distributions (scipy.stats, or the Polya-Gamma series of Polson, Scott & Windle 2013),
integrals over w are done numerically on a log-grid, integrals over f with scipy quad, and
C, g, h come from the reconciled table of the reference (seed000_part2 section 1.10).
"""

import functools
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.integrate import quad
from scipy.special import expit, gammaln

import augmentedgp as agp  # noqa: F401  (enables float64)
from augmentedgp import augmentation
from augmentedgp import likelihoods as L
from augmentedgp.core.params import Exp, Parameter

LOG2 = math.log(2.0)


def call(obj, method, *args):
    """obj.method(*args), eagerly: nearly every call here is a one-off (compiling would cost
    more than it saves)."""
    return getattr(obj, method)(*args)


def arr(*x):
    return jnp.asarray(np.array(x, dtype=float))


# --- mixing densities --------------------------------------------------------------------


def pg_logpdf(x, b, nmax=200):
    """log density of PG(b, 0) (Polson, Scott & Windle 2013, sec. 2.1, the alternating series
    2^{b-1}/Gamma(b) sum_n (-1)^n Gamma(n+b)/n! (2n+b)/sqrt(2 pi x^3) e^{-(2n+b)^2/(8x)}).
    The series cancels catastrophically for large x, where the density is < e^{-70} of its
    peak for b <= 4: it is set to zero above x = 60."""
    n = np.arange(nmax)
    logc = ((b - 1.0) * LOG2 - gammaln(b) + gammaln(n + b) - gammaln(n + 1.0)
            + np.log(2.0 * n + b) - 0.5 * math.log(2.0 * math.pi))
    x = np.asarray(x, float)[..., None]
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        terms = (-1.0) ** n * np.exp(logc - (2.0 * n + b) ** 2 / (8.0 * x) - 1.5 * np.log(x))
        dens = np.where(x[..., 0] <= 60.0, terms.sum(-1), 0.0)
        return np.log(np.maximum(dens, 0.0))


def pg_series(b, c, K=200_000):
    """(E[PG(b, c)], log E_{PG(b, 0)}[e^{-c^2 w / 2}]) from the sum-of-gammas representation
    PG(b, c) = 1/(2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2/(4 pi^2)), g_k ~ Gamma(b, 1) iid
    (Polson et al. 2013, eq. 1): E g_k = b and log E e^{-t g_k} = -b log(1 + t). Truncated at
    K terms; the tails, ~ 1/K and e/K, are added (remaining error ~ 1/K^3)."""
    k = np.arange(1, K + 1) - 0.5
    e = np.asarray(c, float)[..., None] ** 2 / (4.0 * math.pi**2)
    mean1 = (np.sum(1.0 / (k**2 + e), -1) + 1.0 / K) / (2.0 * math.pi**2)
    log_lt1 = -(np.sum(np.log1p(e / k**2), -1) + e[..., 0] / K)
    return np.asarray(b) * mean1, np.asarray(b) * log_lt1


# Integrals over w in s = log w by the trapezoid rule: the integrands here are analytic in a
# strip around the real s-axis and decay (double-)exponentially at both ends, so the rule
# converges geometrically; at step 0.02 its error is far below the 1e-10 tolerances used.
S = np.linspace(-35.0, 85.0, 6001)
W = np.exp(S)
TRAP = np.full(S.size, S[1] - S[0])
TRAP[[0, -1]] *= 0.5


# --- the cases ---------------------------------------------------------------------------

NU, SCALE_T = 3.5, 0.8  # Student-t
B_LAP = 0.6  # Laplace scale
RHO = 0.9  # Matern-3/2 scale
A_M = math.sqrt(3.0) / RHO
R_NB = 1.5  # negative-binomial dispersion: b = y + r in {1.5, 2.5, 3.5}
VAR_G = 0.7  # Gaussian noise variance
RATE = 3.0  # LogisticPoisson maximum rate


class Case(NamedTuple):
    lik: object
    loglik: object  # log p(y | f), numpy oracle
    log_c: object  # log C(y), g(y), h(y, f): the reference's reconciled table
    g: object
    h: object
    log_prior: object  # y -> (w -> log p(w)); None: w = 1 (Gaussian)
    tilted: object  # (c2) -> scipy distribution of the tilted prior, or None
    ys: tuple  # targets for the grid checks
    points: tuple  # (y, mean, var) for the expectation checks


def _matern_logpdf(y, f):
    r = np.abs(y - f)
    return np.log(A_M / 4.0) + np.log1p(A_M * r) - A_M * r


def _pg_half(b):
    return lambda w: LOG2 + pg_logpdf(2.0 * w, b)  # w = PG(b, 0) / 2


REG = ((0.4, 0.1, 0.5), (-1.2, 0.3, 2.0), (2.0, 2.1, 0.05))
CLS = ((1.0, 0.3, 0.5), (-1.0, 1.2, 2.0), (1.0, -2.0, 0.1))
CASES = {
    "Gaussian": Case(
        L.Gaussian(variance=VAR_G), lambda y, f: stats.norm.logpdf(y, f, math.sqrt(VAR_G)),
        lambda y: -0.5 * math.log(2 * math.pi * VAR_G), lambda y: 0.0,
        lambda y, f: (f - y) / math.sqrt(2 * VAR_G), None, None, (0.4, -1.3), REG),
    "Logistic": Case(
        L.Logistic(), lambda y, f: np.log(expit(y * f)),
        lambda y: -LOG2, lambda y: y / 2.0, lambda y, f: f,
        lambda y: _pg_half(1.0), None, (1.0, -1.0), CLS),
    "BayesianSVM": Case(
        L.BayesianSVM(), lambda y, f: -2.0 * np.maximum(1.0 - y * f, 0.0),
        lambda y: -1.0, lambda y: y, lambda y, f: 1.0 - y * f,
        lambda y: stats.invgamma(0.5, scale=0.25).logpdf,
        lambda c2: stats.invgauss(1.0 / math.sqrt(c2), scale=0.5),  # IG(1/(2c), 1/2)
        (1.0, -1.0), CLS),
    "StudentT": Case(
        L.StudentT(df=NU, scale=SCALE_T),
        lambda y, f: stats.t.logpdf(y, NU, loc=f, scale=SCALE_T),
        lambda y: (gammaln((NU + 1) / 2) - gammaln(NU / 2) - 0.5 * math.log(math.pi * NU)
                   - math.log(SCALE_T)),
        lambda y: 0.0, lambda y, f: (f - y) / SCALE_T,
        lambda y: stats.gamma((NU + 1) / 2, scale=1.0 / NU).logpdf,  # rate nu
        lambda c2: stats.gamma((NU + 1) / 2, scale=1.0 / (NU + c2)), (0.4, -1.3), REG),
    "Laplace": Case(
        L.Laplace(scale=B_LAP), lambda y, f: stats.laplace.logpdf(y, f, B_LAP),
        lambda y: -math.log(2 * B_LAP), lambda y: 0.0, lambda y, f: f - y,
        lambda y: stats.invgamma(0.5, scale=1.0 / (4 * B_LAP**2)).logpdf,  # Levy
        # IG(mean 1/(2 beta c), shape 1/(2 beta^2)) = invgauss(mean / shape, scale=shape)
        lambda c2: stats.invgauss(B_LAP / math.sqrt(c2), scale=0.5 / B_LAP**2),
        (0.4, -1.3), REG),
    "Matern32": Case(
        L.Matern32(scale=RHO), _matern_logpdf,
        lambda y: math.log(A_M / 4.0), lambda y: 0.0, lambda y, f: f - y,
        lambda y: stats.invgamma(1.5, scale=A_M**2 / 4).logpdf,
        # GIG(p = -3/2, a' = 2 c^2, b' = a^2/2): scipy b = sqrt(a' b'), scale sqrt(b'/a')
        lambda c2: stats.geninvgauss(-1.5, A_M * math.sqrt(c2), scale=A_M / (2 * math.sqrt(c2))),
        (0.4, -1.3), REG),
    "NegativeBinomial": Case(
        L.NegativeBinomial(r=R_NB),
        # scipy: pmf = C(y + r - 1, y) p^r (1 - p)^y, so p = 1 - sigmoid(f)
        lambda y, f: stats.nbinom.logpmf(y, R_NB, 1.0 - expit(f)),
        lambda y: gammaln(y + R_NB) - gammaln(R_NB) - gammaln(y + 1) - (y + R_NB) * LOG2,
        lambda y: (y - R_NB) / 2.0, lambda y, f: f,
        lambda y: _pg_half(y + R_NB), None, (0.0, 1.0, 2.0),
        ((0.0, 0.2, 0.5), (1.0, -0.7, 1.5), (2.0, 1.0, 2.0))),
}
AUG = list(CASES)
LP = L.LogisticPoisson(rate=RATE)
LP_POINTS = ((0.0, 0.2, 0.5), (2.0, -0.7, 1.5), (5.0, 1.3, 0.3))
ALL = AUG + ["LogisticPoisson"]


def lik_of(name):
    return LP if name == "LogisticPoisson" else CASES[name].lik


def loglik_of(name):
    if name == "LogisticPoisson":
        return lambda y, f: stats.poisson.logpmf(y, RATE * expit(f))
    return CASES[name].loglik


def points_of(name):
    return LP_POINTS if name == "LogisticPoisson" else CASES[name].points


@functools.cache
def _prior_on_grid(name, y):
    log_prior = CASES[name].log_prior
    if log_prior is None:
        return None
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        logp = log_prior(y)(W)
        return logp, np.exp(logp + S) * TRAP  # p(w) dw as weights on the s-grid


def w_integral(name, y, fn):
    """int fn(w) p(w) dw; fn maps the w-grid (last axis) to values."""
    grid = _prior_on_grid(name, float(y))
    if grid is None:  # Gaussian: w = 1
        return fn(np.ones(1))[..., 0]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.sum(np.nan_to_num(fn(W) * grid[1]), -1)


def expect(fn, m, v, kinks=()):
    """E[fn(f)], f ~ N(m, v), by adaptive quadrature over m +- 12 sd (tail mass < 1e-32)."""
    s = math.sqrt(v)
    lo, hi = m - 12.0 * s, m + 12.0 * s
    pts = [k for k in kinks if lo < k < hi] or None
    norm = 1.0 / (s * math.sqrt(2.0 * math.pi))
    return quad(lambda f: fn(f) * norm * math.exp(-0.5 * ((f - m) / s) ** 2), lo, hi,
                points=pts, epsabs=1e-14, epsrel=1e-13, limit=400)[0]


def kinks_of(name, y):
    """Where log p(y | f) (through |h|) has a kink in f (quad is told about it)."""
    if name == "BayesianSVM":
        return (1.0 / y,)
    return (y,) if name in ("Laplace", "Matern32") else ()


# --- 1. each augmentation integrates back to its likelihood ------------------------------


@pytest.mark.parametrize("name", AUG)
def test_augmentation_integrates_back_to_the_likelihood(name):
    # int C e^{g f - w (a + b f)^2} p(w) dw with the library's (log C, g, a, b) and the known
    # mixing density must give the likelihood. Tolerance: the w-quadrature is ~1e-13.
    case = CASES[name]
    f = np.concatenate([np.linspace(-3.0, 3.0, 13), [0.4, -1.3, 1.0, -1.0, 0.0]])
    for y in case.ys:
        sg = call(case.lik, "super_gaussian", jnp.asarray(y))
        log_c, g, a, b = (float(np.asarray(v)) for v in sg)
        aug = w_integral(name, y, lambda w, log_c=log_c, g=g, a=a, b=b: np.exp(
            log_c + g * f[:, None] - w * (a + b * f[:, None]) ** 2))
        np.testing.assert_allclose(aug, np.exp(case.loglik(y, f)), rtol=1e-10)
        np.testing.assert_allclose(
            aug, np.exp(call(case.lik, "log_prob", jnp.full(f.shape, y), jnp.asarray(f))),
            rtol=1e-10)


@pytest.mark.parametrize("name", AUG)
def test_super_gaussian_pieces_match_the_reference_table(name):
    case = CASES[name]
    f = np.linspace(-3.0, 3.0, 9)
    for y in case.ys:
        log_c, g, a, b = (np.asarray(v, float) for v in call(case.lik, "super_gaussian",
                                                              jnp.asarray(y)))
        assert float(log_c) == pytest.approx(case.log_c(y), rel=1e-13, abs=1e-14)
        assert float(g) == pytest.approx(case.g(y), rel=1e-13, abs=1e-14)
        np.testing.assert_allclose((a + b * f) ** 2, case.h(y, f) ** 2, rtol=1e-13, atol=1e-14)


def test_logistic_poisson_augmentation_sums_back_to_the_poisson_pmf():
    # e^{-rate s(f)} = e^{-rate} sum_n (rate s(-f))^n / n!  and  s(f)^y s(-f)^n =
    # 2^{-(y+n)} e^{(y-n) f/2} E_{PG(y+n, 0)}[e^{-f^2 w/2}]; the PG Laplace transform from the
    # sum-of-gammas series (not cosh). n | f ~ Po(rate s(-f)), rate = 3: truncated at 200
    # (tail < 1e-100).
    f = np.linspace(-4.0, 4.0, 9)
    n = np.arange(200.0)
    log_lt1 = pg_series(1.0, np.abs(f))[1]  # log E_{PG(1, 0)} e^{-f^2 w / 2}, per f
    for y in (0.0, 1.0, 4.0, 9.0):
        b = y + n[:, None]
        log_terms = ((y + n[:, None]) * math.log(RATE) - RATE - gammaln(y + 1.0)
                     - gammaln(n[:, None] + 1.0) - b * LOG2 + (y - n[:, None]) * f / 2.0
                     + b * log_lt1)
        total = np.exp(log_terms).sum(0)
        np.testing.assert_allclose(total, stats.poisson.pmf(y, RATE * expit(f)), rtol=1e-12)
        np.testing.assert_allclose(total, np.exp(call(LP, "log_prob", jnp.full(f.shape, y),
                                                      jnp.asarray(f))), rtol=1e-12)


# --- 2. q(w): normaliser, mean, family -------------------------------------------------------

C2 = (0.0, 1e-6, 0.04, 0.7, 5.0, 30.0)


@pytest.mark.parametrize("name", AUG)
def test_tilted_prior_normaliser_and_mean_equal_numerical_integration(name):
    case = CASES[name]
    heavy = name in ("Laplace", "BayesianSVM")  # InvGamma(1/2) prior: E[w] = inf at c = 0
    for y in case.ys:
        # the prior is a probability density (also checks the w-quadrature): 1e-12
        assert w_integral(name, y, np.ones_like) == pytest.approx(1.0, abs=1e-12)
        t = jnp.asarray(C2)
        yy = jnp.full(t.shape, y)
        log_phi = np.asarray(call(case.lik, "log_phi", yy, t))
        omega = np.asarray(call(case.lik, "omega_mean", yy, t))
        for i, c2 in enumerate(C2):
            z = w_integral(name, y, lambda w, c2=c2: np.exp(-c2 * w))
            assert math.exp(log_phi[i]) == pytest.approx(z, rel=1e-10)
            if heavy and c2 == 0.0:
                assert omega[i] > 1e100
                continue
            ew = w_integral(name, y, lambda w, c2=c2: w * np.exp(-c2 * w)) / z
            assert omega[i] == pytest.approx(ew, rel=1e-9)


@pytest.mark.parametrize("name", ["BayesianSVM", "StudentT", "Laplace", "Matern32"])
def test_tilted_prior_is_the_reference_family(name):
    # e^{-c^2 w} p(w) / phi(c^2) is the table's Gamma / inverse-Gaussian / GIG, whose scipy mean
    # is E[w] (= -d log phi / dt); densities compared where they exceed 1e-8 (quadrature 1e-10)
    case = CASES[name]
    y = case.ys[0]
    logp, _ = _prior_on_grid(name, y)
    for c2 in (0.04, 0.7, 5.0):
        z = w_integral(name, y, lambda w, c2=c2: np.exp(-c2 * w))
        dist = case.tilted(c2)
        pdf = dist.pdf(W)
        keep = pdf > 1e-8
        np.testing.assert_allclose(np.exp(-c2 * W[keep] + logp[keep]) / z, pdf[keep], rtol=1e-9)
        assert float(call(case.lik, "omega_mean", arr(y), arr(c2))[0]) == pytest.approx(
            dist.mean(), rel=1e-10)


def test_tilted_means_match_the_reference_table():
    c = np.array([1e-3, 0.2, 0.84, 2.2, 7.0, 30.0])
    t, y1 = jnp.asarray(c**2), jnp.ones(c.size)
    table = {"Logistic": np.tanh(c / 2) / (4 * c),
             "NegativeBinomial": (1.0 + R_NB) * np.tanh(c / 2) / (4 * c),  # y = 1
             "StudentT": (NU + 1) / (2 * (NU + c**2)),
             "Laplace": 1.0 / (2 * B_LAP * c),
             "BayesianSVM": 1.0 / (2 * c),
             "Matern32": A_M**2 / (2 * (1 + A_M * c)),
             "Gaussian": np.ones_like(c)}
    for name, want in table.items():
        np.testing.assert_allclose(call(CASES[name].lik, "omega_mean", y1, t), want, rtol=1e-12)


@pytest.mark.parametrize("name", AUG)
def test_overridden_tilted_mean_equals_minus_the_derivative_of_log_phi(name):
    # the protocol's default E[w] = -d log phi / dt (autodiff) against each override
    lik = CASES[name].lik
    t = jnp.asarray([1e-3, 0.04, 0.7, 5.0, 30.0, 200.0])
    y = jnp.full(t.shape, CASES[name].ys[-1])
    generic = eqx.filter_jit(augmentation.ScaleMixture.omega_mean)(lik, y, t)
    np.testing.assert_allclose(call(lik, "omega_mean", y, t), generic, rtol=1e-12)


@pytest.mark.parametrize("b", [1.0, 2.5, 3.5, 17.0])
def test_polya_gamma_moments_equal_the_sum_of_gammas_series(b):
    # E[PG(b, c)] and log E_{PG(b,0)} e^{-c^2 w/2} (Polson et al. eq. 1) against the PolyaGamma
    # mixin (w = PG / 2, phi(t) = cosh(sqrt(t)/2)^-b); series error ~1e-15
    c = np.array([0.0, 1e-5, 1e-3, 0.3, 4.0, 15.0])
    mean, log_lt = pg_series(b, c)
    lik = L.NegativeBinomial(r=b - 1.0) if b > 1.0 else L.Logistic()
    y, t = jnp.ones(c.size), jnp.asarray(c**2)
    np.testing.assert_allclose(call(lik, "omega_mean", y, t), mean / 2.0, rtol=1e-12)
    # log_cosh is accurate to ~1e-16 absolute (not relative) near 0: atol 1e-14
    np.testing.assert_allclose(call(lik, "log_phi", y, t), log_lt, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b * jax.jit(augmentation.tanh_ratio)(jnp.asarray(c)), mean,
                               rtol=1e-12)


def test_tanh_ratio_has_the_limit_one_quarter_and_a_finite_gradient_at_zero():
    tr = jax.jit(augmentation.tanh_ratio)
    assert float(tr(jnp.asarray(0.0))) == 0.25
    g0 = jax.jit(jax.grad(augmentation.tanh_ratio))(0.0)
    assert np.isfinite(g0) and float(g0) == 0.0  # even function
    # both sides of the series switch (c = 1e-4) against the mpmath-free reference
    # tanh(c/2)/(2c) in numpy (exact enough there: relative error ~1e-12 at c = 1e-4)
    c = np.array([5e-5, 9.9999e-5, 1e-4, 1.0001e-4, 2e-4, 0.5, 3.0, 40.0])
    np.testing.assert_allclose(tr(jnp.asarray(c)), np.tanh(c / 2) / (2 * c), rtol=1e-11)
    # gradient: d/dc tanh(c/2)/(2c) = (c/2 sech^2(c/2) - tanh(c/2)) / (2 c^2) ~ -c/24
    d = jax.jit(jax.vmap(jax.grad(augmentation.tanh_ratio)))(jnp.asarray(c[3:]))
    cc = c[3:]
    want = (0.5 * cc / np.cosh(cc / 2) ** 2 - np.tanh(cc / 2)) / (2 * cc**2)
    np.testing.assert_allclose(d[2:], want[2:], rtol=1e-8)  # cancellation-free region
    np.testing.assert_allclose(d[:2], -cc[:2] / 24.0, rtol=1e-3)  # near 0: the c^3 term


def test_tanh_ratio_is_even():
    c = np.array([-3.0, -0.5, -1e-5])
    np.testing.assert_allclose(jax.jit(augmentation.tanh_ratio)(jnp.asarray(c)),
                               np.tanh(c / 2) / (2 * c), rtol=1e-11)


def test_log_cosh_is_accurate_and_does_not_overflow():
    x = np.array([-800.0, -30.0, -1.0, -1e-3, 0.0, 2e-8, 0.7, 20.0, 800.0])
    # log cosh x = log1p(2 sinh^2(x/2)) without cancellation near 0 (np.log(np.cosh(x)) is
    # itself ~1.4e-16 off at x = 1e-3), = |x| - log 2 + O(e^{-2|x|}) beyond 30
    want = np.where(np.abs(x) < 30, np.log1p(2.0 * np.sinh(np.minimum(np.abs(x), 30) / 2) ** 2),
                    np.abs(x) - LOG2)
    # near 0 log_cosh is accurate to ~1e-16 absolute, not relative (irrelevant in a log-density)
    np.testing.assert_allclose(jax.jit(augmentation.log_cosh)(jnp.asarray(x)), want, rtol=1e-13,
                               atol=2e-16)


# --- 3. the bound at a given q(w): expected joint minus KL ---------------------------------


def _expected_joint_minus_kl(name, y, e_f, e_h2, c2):
    """E_{q(f)} E_{q(w)}[log C + g f - w h^2] - KL(q(w) || p(w)) from E_q[f] and E_q[h^2],
    q(w) the prior tilted by e^{-c2 w}; the w-integrals numerical, the KL against the scipy
    tilted density where the table names one."""
    case = CASES[name]
    z = w_integral(name, y, lambda w: np.exp(-c2 * w))
    ew = w_integral(name, y, lambda w: w * np.exp(-c2 * w)) / z
    if case.tilted is not None:
        logq = case.tilted(c2).logpdf(W)
        logp, _ = _prior_on_grid(name, y)
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            integrand = np.where(np.isfinite(logq), np.exp(logq + S) * (logq - logp), 0.0)
        kl = float(np.sum(integrand * TRAP))
    else:  # log(q / p) = -c2 w - log Z exactly (tilting), integrated numerically
        kl = w_integral(name, y, lambda w: np.exp(-c2 * w) * (-c2 * w - math.log(z))) / z
    return case.log_c(y) + case.g(y) * e_f - ew * e_h2 - kl, kl, ew


@pytest.mark.parametrize("name", AUG)
def test_bound_at_a_given_q_is_the_expected_joint_minus_kl(name):
    # tolerance 1e-9: quad (1e-13) and the w-quadrature (1e-12) are far tighter
    case = CASES[name]
    for y, m, v in case.points:
        e_f = expect(lambda f: f, m, v)
        e_h2 = expect(lambda f, y=y: case.h(y, f) ** 2, m, v, kinks_of(name, y))
        for factor in (0.2, 3.0):
            c2 = factor * e_h2
            ours = float(call(case.lik, "augmented_expectations", arr(y), arr(m), arr(v),
                              augmentation.Tilt(arr(c2)))[0])
            want, kl, ew = _expected_joint_minus_kl(name, y, e_f, e_h2, c2)
            assert ours == pytest.approx(want, rel=1e-9, abs=1e-10)
            if name in ("Logistic", "NegativeBinomial"):
                # Polya-Gamma: KL(PG(b,c) || PG(b,0)) = b log cosh(c/2) - c^2 E[PG(b,c)] / 2
                b = y + R_NB if name == "NegativeBinomial" else 1.0
                cc = math.sqrt(c2)
                assert kl == pytest.approx(b * math.log(math.cosh(cc / 2)) - c2 * ew, rel=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_the_optimal_q_maximises_the_bound(name):
    lik = lik_of(name)
    rng = np.random.default_rng(11)
    for y, m, v in points_of(name):
        args = arr(y), arr(m), arr(v)
        q_opt = call(lik, "aux_posterior", *args)
        best = float(call(lik, "augmented_expectations", *args)[0])
        assert float(call(lik, "augmented_expectations", *args, q_opt)[0]) == pytest.approx(
            best, rel=1e-13, abs=1e-14)
        for _ in range(8):
            scale = np.exp(rng.uniform(-2.0, 2.0, size=2))
            q = (L.PoissonTilt(q_opt.c2 * scale[0], q_opt.n_mean * scale[1])
                 if name == "LogisticPoisson" else augmentation.Tilt(q_opt.c2 * scale[0]))
            assert float(call(lik, "augmented_expectations", *args, q)[0]) <= best + 1e-12


def test_logistic_poisson_bound_is_stationary_at_the_optimal_q():
    for y, m, v in LP_POINTS:
        args = arr(y), arr(m), arr(v)
        q = call(LP, "aux_posterior", *args)
        g = jax.grad(lambda q, args=args: jnp.sum(LP.augmented_expectations(*args, q)))(q)
        np.testing.assert_allclose([float(g.c2[0]), float(g.n_mean[0])], 0.0, atol=1e-12)


def test_logistic_poisson_bound_at_a_given_q_is_the_expected_joint_minus_entropy():
    # q(n, w) = Po(n | mu) PG(w | y + n, c) with w the PG variable / 2; log p(y, n, w | f) =
    # (y + n) log rate - rate - log y! - log n! - (y + n) log 2 + (y - n) f/2 - w f^2
    # + log p_{y+n}(w). E[w | n] and KL(q(w | n) || p_{y+n}(w)) from the sum-of-gammas series,
    # n summed up to 200 (mu <= 10 here), f by quad; tolerance 1e-9
    n = np.arange(200.0)
    for y, m, v in LP_POINTS:
        e_f, e_f2 = expect(lambda f: f, m, v), expect(lambda f: f * f, m, v)
        for c2, mu in ((0.3, 0.5), (4.0, 2.0), (e_f2, 9.0)):
            mean1, log_lt1 = pg_series(1.0, math.sqrt(c2))
            b = y + n
            ew = b * mean1 / 2.0
            kl = -c2 * ew - b * log_lt1  # -c^2 E[w] - log phi_b(c^2)
            log_joint = ((y + n) * math.log(RATE) - RATE - gammaln(y + 1.0) - gammaln(n + 1.0)
                         - b * LOG2 + (y - n) * e_f / 2.0 - ew * e_f2)
            qn = stats.poisson.pmf(n, mu)
            want = np.sum(qn * (log_joint - kl - stats.poisson.logpmf(n, mu)))
            ours = float(call(LP, "augmented_expectations", arr(y), arr(m), arr(v),
                              L.PoissonTilt(arr(c2), arr(mu)))[0])
            assert ours == pytest.approx(want, rel=1e-9, abs=1e-10)


def test_logistic_poisson_bound_accepts_a_point_mass_q_of_n():
    args = arr(2.0), arr(0.1), arr(0.5)
    at0 = float(call(LP, "augmented_expectations", *args, L.PoissonTilt(arr(0.3), arr(0.0)))[0])
    near0 = float(call(LP, "augmented_expectations", *args,
                       L.PoissonTilt(arr(0.3), arr(1e-300)))[0])
    assert np.isfinite(at0) and at0 == pytest.approx(near0, rel=1e-12)


# --- 4. Jensen: the augmented bound never exceeds E_q[log p(y | f)] ------------------------


def _random_points(name, rng, k=6):
    m, v = rng.normal(scale=1.5, size=k), rng.uniform(0.01, 3.0, size=k)
    if name in ("Logistic", "BayesianSVM"):
        y = rng.choice([-1.0, 1.0], size=k)
    elif name in ("NegativeBinomial", "LogisticPoisson"):
        y = rng.poisson(2.0, size=k).astype(float)
    else:
        y = m + rng.normal(scale=2.0, size=k)
    return y, m, v


@pytest.mark.parametrize("name", ALL)
def test_the_augmented_bound_lies_below_the_expected_log_likelihood(name):
    lik, loglik = lik_of(name), loglik_of(name)
    y, m, v = _random_points(name, np.random.default_rng(7))
    aug = np.asarray(call(lik, "augmented_expectations", *map(jnp.asarray, (y, m, v))))
    ve = np.array([expect(lambda f, yi=yi: loglik(yi, f), mi, vi,
                          kinks_of(name, yi) if name != "LogisticPoisson" else ())
                   for yi, mi, vi in zip(y, m, v, strict=True)])
    assert np.all(aug <= ve + 1e-10)
    if name != "Gaussian":  # Gaussian: w = 1, no gap at all
        assert np.all(ve - aug > 1e-6)  # a real gap, not a tie
    else:
        np.testing.assert_allclose(aug, ve, rtol=1e-10)


def test_the_logistic_gap_is_the_jensen_gap_of_log_cosh():
    # gap = log cosh(c/2) - E_q[log cosh(f/2)], c^2 = m^2 + v (reference A.4.3)
    lik = CASES["Logistic"].lik
    y, m, v = _random_points("Logistic", np.random.default_rng(8))
    aug = np.asarray(call(lik, "augmented_expectations", *map(jnp.asarray, (y, m, v))))
    lc = lambda x: np.logaddexp(x, -x) - LOG2
    for yi, mi, vi, ai in zip(y, m, v, aug, strict=True):
        ve = expect(lambda f, yi=yi: np.log(expit(yi * f)), mi, vi)
        gap = lc(math.sqrt(mi**2 + vi) / 2) - expect(lambda f: lc(f / 2), mi, vi)
        assert ve - ai == pytest.approx(gap, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_the_augmented_term_tends_to_the_log_density_as_the_variance_vanishes(name):
    lik = lik_of(name)
    y = {"Logistic": arr(1.0, -1.0, 1.0), "BayesianSVM": arr(1.0, -1.0, 1.0),
         "NegativeBinomial": arr(0.0, 3.0, 7.0), "LogisticPoisson": arr(0.0, 3.0, 7.0)}.get(
        name, arr(0.4, -1.3, 2.0))
    m = arr(1.0, 0.7, 2.0)  # includes the kinks: f = y (Laplace, Matern) and y f = 1 (SVM)
    for v in (0.0, 1e-300):
        vv = jnp.full(3, v)
        np.testing.assert_allclose(call(lik, "augmented_expectations", y, m, vv),
                                   call(lik, "log_prob", y, m), rtol=1e-12, atol=1e-12)


# --- 5. sites = gradient of the collapsed bound -------------------------------------------


def _collapsed_grads(lik, y, m, s):
    """d/dm at fixed s = m^2 + v, and d/ds, of the collapsed bound."""
    fn = lambda m, s: jnp.sum(lik.augmented_expectations(y, m, s - m**2))
    return jax.grad(fn, (0, 1))(m, s)


def _sites(lik, y, m, v):
    return call(lik, "aux_sites", y, call(lik, "aux_posterior", y, m, v))


@pytest.mark.parametrize("name", ALL)
def test_sites_are_the_gradient_of_the_collapsed_bound(name):
    # beta = d/dE[f], gamma = -2 d/dE[f^2]; central differences with h = 1e-5 (error ~1e-10)
    lik = lik_of(name)
    y, m, v = (jnp.asarray(c) for c in zip(*points_of(name), strict=True))
    s = m**2 + v
    beta, gamma = _sites(lik, y, m, v)
    fn = lambda m, s: np.asarray(call(lik, "augmented_expectations", y, m, s - m**2))
    h = 1e-5
    np.testing.assert_allclose(beta, (fn(m + h, s) - fn(m - h, s)) / (2 * h), rtol=1e-7)
    np.testing.assert_allclose(gamma, -2 * (fn(m, s + h) - fn(m, s - h)) / (2 * h), rtol=1e-7)
    gm, gs = _collapsed_grads(lik, y, m, s)
    np.testing.assert_allclose(beta, gm, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gamma, -2 * gs, rtol=1e-11)


def _table_sites(name, y, m, v):
    if name == "Gaussian":
        return y / VAR_G, np.full_like(y, 1.0 / VAR_G)
    if name in ("Logistic", "NegativeBinomial", "LogisticPoisson"):
        c = np.sqrt(m**2 + v)
        th = np.tanh(c / 2) / (2 * c)
        if name == "Logistic":
            return y / 2, th
        if name == "NegativeBinomial":
            return (y - R_NB) / 2, (y + R_NB) * th
        mu = RATE * np.exp(-m / 2) / (2 * np.cosh(c / 2))
        return (y - mu) / 2, (y + mu) * th
    if name == "BayesianSVM":
        c = np.sqrt((1 - y * m) ** 2 + v)
        return y * (1 + 1 / c), 1 / c
    e = (y - m) ** 2 + v
    gamma = {"StudentT": (NU + 1) / (NU * SCALE_T**2 + e),
             "Laplace": 1 / (B_LAP * np.sqrt(e)),
             "Matern32": A_M**2 / (1 + A_M * np.sqrt(e))}[name]
    return y * gamma, gamma


@pytest.mark.parametrize("name", ALL)
def test_sites_match_the_reference_table(name):
    lik = lik_of(name)
    y, m, v = _random_points(name, np.random.default_rng(9))
    beta, gamma = _sites(lik, *map(jnp.asarray, (y, m, v)))
    want_beta, want_gamma = _table_sites(name, y, m, v)
    np.testing.assert_allclose(beta, want_beta, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gamma, want_gamma, rtol=1e-12)
    if name == "LogisticPoisson":
        c = np.sqrt(m**2 + v)
        q = call(lik, "aux_posterior", *map(jnp.asarray, (y, m, v)))
        np.testing.assert_allclose(q.n_mean, RATE * np.exp(-m / 2) / (2 * np.cosh(c / 2)),
                                   rtol=1e-12)
        np.testing.assert_allclose(q.c2, m**2 + v, rtol=1e-14)


@pytest.mark.parametrize("name", ["Logistic", "NegativeBinomial", "Matern32", "LogisticPoisson"])
def test_sites_are_the_gradient_where_the_expected_h2_vanishes(name):
    y = {"Logistic": 1.0, "NegativeBinomial": 1.0, "Matern32": 0.0, "LogisticPoisson": 2.0}[name]
    y, m, v = arr(y), arr(0.0), arr(0.0)
    beta, gamma = _sites(lik_of(name), y, m, v)
    gm, gs = _collapsed_grads(lik_of(name), y, m, m**2 + v)
    np.testing.assert_allclose(beta, gm, rtol=1e-10)
    np.testing.assert_allclose(gamma, -2 * gs, rtol=1e-10)


# --- 6. the other methods of the new likelihoods ------------------------------------------


def test_matern32_density_is_normalised_with_variance_four_scale_squared_over_three():
    lik = CASES["Matern32"].lik
    density = jax.jit(lambda y, f: jnp.exp(lik.log_prob(y, f)))  # many scalar calls from quad
    for f in (0.0, 1.7):
        mom = [sum(quad(lambda y, k=k, f=f: (y - f) ** k * float(density(y, f)), lo, hi,
                        epsabs=1e-13, epsrel=1e-12, limit=200)[0]
                   for lo, hi in ((-np.inf, f), (f, np.inf)))
               for k in (0, 1, 2)]
        assert mom[0] == pytest.approx(1.0, abs=1e-10)
        assert mom[1] == pytest.approx(0.0, abs=1e-10)
        assert mom[2] == pytest.approx(4.0 * RHO**2 / 3.0, rel=1e-10)
        assert float(call(lik, "conditional_variance", arr(f))[0]) == pytest.approx(mom[2],
                                                                                   rel=1e-10)
        assert float(call(lik, "conditional_mean", arr(f))[0]) == f


def test_matern32_predict_y_equals_numerical_integration():
    # law of total variance with the noise variance from numerical integration of the density
    lik = CASES["Matern32"].lik
    noise = 2 * quad(lambda r: r * r * math.exp(_matern_logpdf(0.0, r)), 0, np.inf,
                     epsabs=1e-13, epsrel=1e-12)[0]
    m, v = np.array([0.3, -0.8, 2.0]), np.array([0.4, 1.2, 0.05])
    ey = [expect(lambda f: f, mi, vi) for mi, vi in zip(m, v, strict=True)]
    vy = [expect(lambda f: f * f, mi, vi) - e**2 + noise for mi, vi, e in zip(m, v, ey,
                                                                              strict=True)]
    mean_y, var_y = call(lik, "predict_y", jnp.asarray(m), jnp.asarray(v))
    np.testing.assert_allclose(mean_y, ey, rtol=1e-10)
    np.testing.assert_allclose(var_y, vy, rtol=1e-10)


def test_logistic_poisson_pmf_is_normalised_with_the_stated_moments():
    f = np.array([-3.0, 0.0, 0.8, 5.0])
    y = np.arange(120.0)
    p = np.exp(np.asarray(call(LP, "log_prob", jnp.asarray(y)[:, None], jnp.asarray(f))))
    np.testing.assert_allclose(p.sum(0), 1.0, rtol=1e-13)
    mean, var = (y @ p), ((y**2) @ p) - (y @ p) ** 2
    np.testing.assert_allclose(mean, RATE * expit(f), rtol=1e-12)
    np.testing.assert_allclose(call(LP, "conditional_mean", jnp.asarray(f)), mean, rtol=1e-12)
    np.testing.assert_allclose(call(LP, "conditional_variance", jnp.asarray(f)), var, rtol=1e-11)


def test_logistic_poisson_predict_y_equals_numerical_integration():
    # the generic 32-node Gauss-Hermite rule: ~1e-15 for var <= 0.5, ~1e-8 at var = 2 (the
    # sigmoid's poles at +-i pi limit its convergence: the variance is 3e-4 off at var = 10)
    m, v = np.array([0.3, -0.8, 1.5, 0.0]), np.array([0.5, 2.0, 0.1, 1.0])
    mean_y, var_y = call(LP, "predict_y", jnp.asarray(m), jnp.asarray(v))
    for i, (mi, vi) in enumerate(zip(m, v, strict=True)):
        ey = expect(lambda f: RATE * expit(f), mi, vi)
        ey2 = expect(lambda f: RATE * expit(f) + (RATE * expit(f)) ** 2, mi, vi)
        assert float(mean_y[i]) == pytest.approx(ey, rel=1e-8)
        assert float(var_y[i]) == pytest.approx(ey2 - ey**2, rel=1e-7)


def test_bayesian_svm_class_probability_equals_numerical_integration():
    # p(+1) = E_q[L(+1|f) / (L(+1|f) + L(-1|f))]. The library uses 100-node Gauss-Hermite on an
    # integrand with kinks in its derivative at f = +-1, which converges slowly: measured
    # errors up to 1.4e-4 on these points, so the tolerance is 3e-4 (absolute, a probability)
    lik = CASES["BayesianSVM"].lik
    lp = lambda y, f: -2.0 * max(1.0 - y * f, 0.0)
    cls = lambda f: math.exp(lp(1, f)) / (math.exp(lp(1, f)) + math.exp(lp(-1, f)))
    m, v = np.array([0.3, -0.8, 1.5, 0.0, 0.95, -3.0]), np.array([0.5, 2.0, 0.1, 10.0, 1e-3, 4.0])
    p = np.asarray(call(lik, "predict_proba", jnp.asarray(m), jnp.asarray(v)))
    want = np.array([expect(cls, mi, vi, (-1.0, 1.0)) for mi, vi in zip(m, v, strict=True)])
    np.testing.assert_allclose(p, want, atol=3e-4)
    np.testing.assert_allclose(call(lik, "conditional_mean", jnp.asarray([-2.0, 0.2, 1.5])),
                               [cls(-2.0), cls(0.2), cls(1.5)], rtol=1e-13)
    mean_y, var_y = call(lik, "predict_y", jnp.asarray(m), jnp.asarray(v))
    np.testing.assert_allclose(mean_y, p, rtol=1e-14)
    np.testing.assert_allclose(var_y, p * (1 - p), rtol=1e-14)


@pytest.mark.parametrize("name", ["Logistic", "BayesianSVM"])
def test_zero_one_labels_are_mapped_to_plus_minus_one(name):
    # the augmentations assume y in {-1, +1} (g = y/2, h = 1 - y f)
    lik = CASES[name].lik
    for y in (np.array([0, 1, 1, 0]), np.array([False, True, True, False]),
              np.array([-1.0, 1.0, 1.0, -1.0])):
        np.testing.assert_array_equal(lik.check_targets(y), [-1.0, 1.0, 1.0, -1.0])


@pytest.mark.parametrize("lik, bad, msg", [
    (L.BayesianSVM(), [0.0, 1.0, 2.0], "binary labels"),
    (L.BayesianSVM(), [-1.0, 0.0, 1.0], "binary labels"),
    (L.LogisticPoisson(), [1.0, -2.0], "non-negative"),
    (L.LogisticPoisson(), [1.0, 2.5], "integer"),
    (L.LogisticPoisson(), [1.0, np.nan], "NaN or inf"),
    (L.Matern32(), [0.3, np.inf], "NaN or inf"),
    (L.Matern32(), ["a", 0.3], "numeric"),
], ids=["svm-012", "svm-three-values", "poisson-negative", "poisson-fraction", "poisson-nan",
        "matern-inf", "matern-string"])
def test_invalid_targets_are_rejected_with_a_clear_message(lik, bad, msg):
    with pytest.raises(ValueError, match=msg):
        lik.check_targets(np.array(bad, dtype=object) if msg == "numeric" else np.array(bad))


@pytest.mark.parametrize("make, what", [
    (lambda: L.Matern32(scale=0.0), "Matern-3/2 noise scale must be > 0"),
    (lambda: L.Matern32(scale=np.nan), "Matern-3/2 noise scale must be finite"),
    (lambda: L.LogisticPoisson(rate=-1.0), "Poisson maximum rate must be > 0"),
    (lambda: L.StudentT(df=0.0), "degrees of freedom df must be > 0"),
    (lambda: L.StudentT(scale=-0.5), "Student-t scale must be > 0"),
    (lambda: L.Laplace(scale=0.0), "Laplace scale must be > 0"),
    (lambda: L.NegativeBinomial(r=-2.0), "dispersion r must be > 0"),
    (lambda: L.Gaussian(variance=0.0), "noise variance must be > 0"),
], ids=["matern-0", "matern-nan", "rate-neg", "df-0", "t-scale-neg", "laplace-0", "nb-neg",
        "gauss-0"])
def test_constructors_reject_invalid_parameters(make, what):
    with pytest.raises(ValueError, match=what):
        make()


# --- 7. gradients w.r.t. likelihood parameters ---------------------------------------------

PARAMS = {
    "StudentT.df": (lambda p: L.StudentT(df=p, scale=SCALE_T), NU, "StudentT"),
    "StudentT.scale": (lambda p: L.StudentT(df=NU, scale=p), SCALE_T, "StudentT"),
    "Laplace.scale": (lambda p: L.Laplace(scale=p), B_LAP, "Laplace"),
    "Matern32.scale": (lambda p: L.Matern32(scale=p), RHO, "Matern32"),
    "LogisticPoisson.rate": (lambda p: L.LogisticPoisson(rate=p), RATE, "LogisticPoisson"),
    "NegativeBinomial.r": (lambda p: L.NegativeBinomial(r=p), R_NB, "NegativeBinomial"),
    "Gaussian.variance": (lambda p: L.Gaussian(variance=p), VAR_G, "Gaussian"),
}


@pytest.mark.parametrize("optimal_q", [True, False], ids=["q-optimal", "q-fixed"])
@pytest.mark.parametrize("key", list(PARAMS))
def test_parameter_gradients_of_the_bound_match_finite_differences(key, optimal_q):
    build, x0, name = PARAMS[key]
    y, m, v = map(jnp.asarray, _random_points(name, np.random.default_rng(10)))
    q = None if optimal_q else call(build(x0), "aux_posterior", y, m, v)  # held fixed

    def total(lik):
        return jnp.sum(lik.augmented_expectations(y, m, v, q))

    # the likelihood built from a traced value (a Parameter is passed through as it is)
    grad = jax.grad(lambda x: total(build(Parameter(jnp.log(x), Exp()))))(x0)
    value = total
    h = 1e-6 * x0
    fd = (value(build(x0 + h)) - value(build(x0 - h))) / (2 * h)
    assert np.isfinite(grad)
    assert float(grad) == pytest.approx(float(fd), rel=1e-6, abs=1e-8)  # FD error ~1e-9
