"""Issue 24: likelihood predictive quantities at large but finite latent moments. A
quantity whose true value is a float64 number must come out finite and accurate; one
whose true value exceeds float64 must raise a ValueError saying so (under jit: no raise).
Oracles: closed forms (scipy's log_ndtr, lognormal moments, exponential tilts) and
numerical integration in log space (scipy.integrate.quad around the integrand's mode)."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from augmentedgp import likelihoods as L

jax.config.update("jax_enable_x64", True)


def log_integral(h, lo, hi, points=(), sd=0.0):
    """log int exp(h(f)) df for a unimodal h whose mode lies in [lo, hi]: the mode by
    bounded scalar search, the width from a finite-difference curvature (at least ``sd``,
    the latent sd: a narrow step at the mode does not make the integrand narrow), then
    quad of exp(h - h*) over the mode +- 40 widths, split at the mode and ``points``
    (h* restored in log space: no underflow)."""
    res = optimize.minimize_scalar(lambda f: -h(f), bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-10 * max(1.0, abs(lo), abs(hi))})
    mode, hmax = res.x, h(res.x)
    d = 1e-3 * max(1.0, abs(mode)) ** 0.5
    curv = -(h(mode + d) - 2 * hmax + h(mode - d)) / d**2
    width = max(1.0 / math.sqrt(max(curv, 1e-12)), sd)
    a, b = mode - 40 * width, mode + 40 * width
    cuts = sorted({a, b, *(p for p in (mode, mode - width, mode + width, *points) if a < p < b)})
    hmax = max(hmax, *(h(p) for p in cuts))
    val = sum(integrate.quad(lambda f: math.exp(h(f) - hmax), lo_, hi_, limit=500, epsabs=0.0,
                             epsrel=1e-13)[0] for lo_, hi_ in zip(cuts[:-1], cuts[1:], strict=True))
    return hmax + math.log(val)


def log_normal(f, m, v):
    return -0.5 * (math.log(2 * math.pi * v) + (f - m) ** 2 / v)


def plp(lik, y, mean, var):
    out = lik.predictive_log_prob(jnp.asarray([y]), jnp.asarray([mean]), jnp.asarray([var]))
    return float(np.asarray(out)[0])


# --- binary --------------------------------------------------------------------------------

def test_probit_log_predictive_far_tail():
    """Probit(-1 | mean 30, var 0.5): log Phi(-30 / sqrt(1.5)) ~ -305, was -inf."""
    got = plp(L.Probit(), -1.0, 30.0, 0.5)
    # jax's log_ndtr asymptotic series: ~3e-12 relative from scipy's at -24.5
    assert got == pytest.approx(special.log_ndtr(-30.0 / math.sqrt(1.5)), rel=1e-11)
    h = lambda f: special.log_ndtr(-f) + log_normal(f, 30.0, 0.5)
    # the quadrature oracle itself is good to ~3e-12 relative here
    assert got == pytest.approx(log_integral(h, -5.0, 30.0), rel=1e-11)


LOGISTIC_CASES = [  # (y, mean, var): each branch of Logistic.predictive_log_prob
    (-1.0, 1e3, 0.5),      # small variance, far tail (was -inf)
    (1.0, -1e3, 10.0),     # tilt: a + v <= 0
    (1.0, -50.0, 100.0),   # split: a <= 0 < a + v
    (-1.0, 1e3, 1e6),      # split, huge variance
    (1.0, -5e3, 1e4),
    (1.0, 3.0, 10.0),      # a > 0
    (-1.0, 0.3, 2.0),      # ordinary
]


@pytest.mark.parametrize("y,mean,var", LOGISTIC_CASES)
def test_logistic_log_predictive_matches_quadrature(y, mean, var):
    got = plp(L.Logistic(), y, mean, var)
    h = lambda f: -np.logaddexp(0.0, -y * f) + log_normal(f, mean, var)
    want = log_integral(h, min(mean - var, -60.0), max(mean + var, 60.0), points=(0.0,),
                        sd=math.sqrt(var))
    assert np.isfinite(got)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_logistic_log_predictive_consistent_with_proba():
    """Where p does not underflow, the log-space value is the log of predict_proba."""
    rng = np.random.default_rng(0)
    mean, var = rng.normal(size=40) * 5, rng.uniform(0.01, 30.0, size=40)
    y = rng.choice([-1.0, 1.0], size=40)
    lik = L.Logistic()
    p = np.asarray(lik.predict_proba(mean, var))
    want = np.log(np.where(y > 0, p, 1 - p))
    np.testing.assert_allclose(np.asarray(lik.predictive_log_prob(y, mean, var)), want,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("y,mean,var", [(-1.0, 1e8, 0.5), (1.0, -1e3, 2.0), (-1.0, 40.0, 4.0)])
def test_bayesian_svm_log_predictive_far_tail(y, mean, var):
    lik = L.BayesianSVM()
    got = plp(lik, y, mean, var)
    logp = lambda f: -np.logaddexp(0.0, -y * (-2 * max(1 - f, 0.0) + 2 * max(1 + f, 0.0)))
    want = log_integral(lambda f: logp(f) + log_normal(f, mean, var),
                        min(mean, 0.0) - 10 * var - 10, max(mean, 0.0) + 10 * var + 10,
                        points=(-1.0, 0.0, 1.0), sd=math.sqrt(var))
    assert got == pytest.approx(want, rel=1e-9)


def test_binary_log_predictive_finite_under_jit():
    y = jnp.asarray([-1.0, 1.0, -1.0])
    mean, var = jnp.asarray([1e3, -1e8, 1e8]), jnp.asarray([0.5, 1e6, 3.0])
    for lik in (L.Logistic(), L.Probit(), L.BayesianSVM()):
        out = jax.jit(lik.predictive_log_prob)(y, mean, var)
        assert np.all(np.isfinite(np.asarray(out))), type(lik).__name__
        assert np.all(np.asarray(out) <= 0.0)


# --- multi-class ---------------------------------------------------------------------------

def test_softmax_log_predictive_wrong_class_closed_form():
    """Class 1 dominates by 1e3: p(y = 0) = E[e^{f_0 - f_1}] (other terms e^{-1000} smaller)
    = exp(m_0 - m_1 + (v_0 + v_1) / 2), about e^{-1000}: was log(0) = -inf. The 2048
    quasi-Monte Carlo points of predict_proba estimate this lognormal mean (log-sd
    sqrt(0.5)) to ~1e-3 relative (log-sd sqrt(2): 1.5e-2)."""
    mean, var = np.array([[0.0, 1e3, -1e3]]), np.array([[0.25, 0.25, 0.25]])
    got = float(L.Softmax(3).predictive_log_prob(jnp.asarray([0]), mean, var)[0])
    assert got == pytest.approx(-1e3 + 0.25, abs=5e-3)


def test_logistic_softmax_log_predictive_wrong_class_closed_form():
    """m = (-1e3, 1e3, 1e3): sum_c sigmoid(f_c) = 2 up to e^{-1000}, so p(y = 0) =
    E[sigmoid(f_0)] / 2 = exp(m_0 + v_0 / 2) / 2."""
    mean, var = np.array([[-1e3, 1e3, 1e3]]), np.array([[0.5, 1.0, 1.0]])
    got = float(L.LogisticSoftmax(3).predictive_log_prob(jnp.asarray([0]), mean, var)[0])
    assert got == pytest.approx(-1e3 + 0.25 - math.log(2.0), abs=5e-3)


@pytest.mark.parametrize("cls", [L.Softmax, L.LogisticSoftmax])
def test_multiclass_log_predictive_is_log_of_proba(cls):
    """Where nothing underflows, the log-space value is the log of predict_proba."""
    rng = np.random.default_rng(1)
    mean, var = rng.normal(size=(6, 3)), rng.uniform(0.1, 2.0, size=(6, 3))
    y = jnp.asarray([0, 1, 2, 0, 1, 2])
    lik = cls(3)
    p = np.asarray(lik.predict_proba(mean, var))
    np.testing.assert_allclose(np.asarray(lik.predictive_log_prob(y, mean, var)),
                               np.log(p[np.arange(6), np.asarray(y)]), rtol=1e-12)


@pytest.mark.parametrize("classes", [10**30, 10**6, 1, 0, -3, True, 2.5, "abc"])
def test_class_count_refused_with_value_error(classes):
    with pytest.raises(ValueError, match="classes"):
        L.Softmax(classes)


@pytest.mark.parametrize("y", [[], np.zeros((0,)), [[0, 1], [1, 2]], 1])
def test_multiclass_targets_refuse_empty_and_non_vector(y):
    for lik in (L.RobustMax(3), L.Softmax(3), L.LogisticSoftmax(3)):
        with pytest.raises(ValueError, match="y"):
            lik.check_targets(y)


# --- positive ------------------------------------------------------------------------------

def beta_logpdf(y, f, phi):
    """log Beta(y | phi sigmoid(f), phi sigmoid(-f)); for |f| > 30 the small parameter's
    log Gamma(b) = -log b - euler_gamma b + O(b^2), log b = log phi - log(1 + e^{|f|})."""
    a, b = phi * special.expit(f), phi * special.expit(-f)
    if abs(f) <= 30:
        return stats.beta.logpdf(y, a, b)
    log_small = math.log(phi) - np.logaddexp(0.0, abs(f))
    small = math.exp(log_small)
    big = phi - small
    lg_small = -log_small - np.euler_gamma * small
    lg = special.gammaln(phi) - special.gammaln(big) - lg_small
    ya, yb = (y, 1 - y) if f > 0 else (1 - y, y)  # (big's variable, small's variable)
    return lg + (big - 1) * math.log(ya) + (small - 1) * math.log(yb)


def test_beta_log_prob_finite_where_a_parameter_underflows():
    lik = L.Beta(precision=3.0)
    for f in (-800.0, -40.0, 0.5, 40.0, 800.0, 1e8):
        got = float(lik.log_prob(jnp.asarray(0.3), jnp.asarray(f)))
        assert got == pytest.approx(beta_logpdf(0.3, f, 3.0), rel=1e-12), f


def test_beta_variational_expectation_huge_variance():
    """E[log p(y | f)], f ~ N(0, 1e6): was -inf; the true value ~ -E|f| / 2 is finite.
    The default 64-node Gauss-Hermite rule on the kink-like |f| behaviour is only good to
    ~6e-3 relative at this variance (measured; ~1e-13 up to var 2): finite, not precise."""
    lik = L.Beta()
    y, v = 0.3, 1e6
    got = float(lik.variational_expectations(jnp.asarray([y]), jnp.asarray([0.0]),
                                             jnp.asarray([v]))[0])
    s = math.sqrt(v)
    g = lambda f: beta_logpdf(y, f, 10.0) * stats.norm.pdf(f, 0.0, s)
    cuts = [-40 * s, -30.0, 0.0, 30.0, 40 * s]
    want = sum(integrate.quad(g, a, b, limit=500, epsabs=0.0, epsrel=1e-12)[0]
               for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    assert np.isfinite(got)
    assert got == pytest.approx(want, rel=1e-2)


@pytest.mark.parametrize("mean,var", [(1e3, 0.5), (-1e3, 0.5), (0.0, 1e6), (1e3, 1e4)])
def test_gamma_log_predictive_matches_quadrature(mean, var):
    k, y = 0.7, 2.0
    lik = L.Gamma(shape=k)
    got = plp(lik, y, mean, var)
    logp = lambda f: stats.gamma.logpdf(y, k, scale=math.exp(f) / k) if f < 700 else (
        k * (math.log(k) - f) - special.gammaln(k) + (k - 1) * math.log(y) - k * y * math.exp(-f))
    h = lambda f: logp(f) + log_normal(f, mean, var)
    want = log_integral(h, min(mean, math.log(y)) - 1, max(mean, math.log(y)) + 1)
    assert got == pytest.approx(want, rel=1e-9)


def test_beta_log_predictive_finite_far_out():
    lik = L.Beta()
    got = plp(lik, 0.3, 1e3, 0.5)
    h = lambda f: beta_logpdf(0.3, f, 10.0) + log_normal(f, 1e3, 0.5)
    assert got == pytest.approx(log_integral(h, 900.0, 1100.0, sd=math.sqrt(0.5)), rel=1e-9)


def test_gamma_moments_in_log_space_and_overflow_raises():
    lik = L.Gamma(shape=2.0)
    # Var[y] = e^{2m + 2v} (1 + 1/k - e^{-v}) ~ e^{640}: finite, where e^{v} alone overflows
    m, v = np.array([-400.0]), np.array([720.0])
    ey, vy = lik.predict_y(m, v)
    assert float(ey[0]) == pytest.approx(math.exp(-40.0), rel=1e-13)
    assert float(vy[0]) == pytest.approx(math.exp(640.0) * 1.5, rel=1e-12)
    with pytest.raises(ValueError, match="exceeds float64"):
        lik.predict_y(np.array([1e3]), np.array([1.0]))
    with pytest.raises(ValueError, match="exceeds float64"):
        lik.variational_expectations(jnp.asarray([1.0]), jnp.asarray([0.0]), jnp.asarray([1e6]))
    jitted = jax.jit(lambda m, v: lik.predict_y(m, v))
    ey, vy = jitted(jnp.asarray([1e3]), jnp.asarray([1.0]))  # no raise under jit
    assert not np.isfinite(float(ey[0]))


@pytest.mark.parametrize("make", [lambda: L.Gamma(shape=[0.1, 0.2]),
                                  lambda: L.Beta(precision=np.ones(3)),
                                  lambda: L.HeteroscedasticGaussian(precision=[1.0, 2.0])])
def test_scalar_parameters_must_be_scalars(make):
    with pytest.raises(ValueError, match="shape|precision"):
        make()


# --- heteroscedastic -----------------------------------------------------------------------

def hetero_log_predictive(y, mf, vf, mg, vg, lam):
    def h(g):
        log_v = np.logaddexp(math.log(vf), np.logaddexp(0.0, -g) - math.log(lam))
        return -0.5 * (math.log(2 * math.pi) + log_v + (y - mf) ** 2 * math.exp(-log_v)) \
            + log_normal(g, mg, vg)
    return log_integral(h, mg - 50 * math.sqrt(vg) - 10, mg + 50 * math.sqrt(vg) + 10,
                        sd=math.sqrt(vg))


@pytest.mark.parametrize("mf,mg", [(0.3, 1e3), (0.3, -1e3), (1e8, 0.2), (1e3, -1e8)])
def test_heteroscedastic_log_predictive_matches_quadrature(mf, mg):
    lik = L.HeteroscedasticGaussian(precision=2.0)
    y, vf, vg = 0.5, 0.4, 0.6
    got = float(lik.predictive_log_prob(jnp.asarray([y]), jnp.asarray([[mf, mg]]),
                                        jnp.asarray([[vf, vg]]))[0])
    assert got == pytest.approx(hetero_log_predictive(y, mf, vf, mg, vg, 2.0), rel=1e-9)


def test_heteroscedastic_predictive_variance_finite_or_raises():
    lik = L.HeteroscedasticGaussian(precision=10.0)
    # (1 + e^{710}) / 10 ~ 2.2e307: finite although e^{710} alone overflows
    _, vy = lik.predict_y(jnp.asarray([[0.0, -710.0]]), jnp.asarray([[1.0, 0.0]]))
    assert float(vy[0]) == pytest.approx(1.0 + math.exp(710.0 - math.log(10.0)), rel=1e-12)
    with pytest.raises(ValueError, match="predictive variance .* exceeds float64"):
        lik.predict_y(jnp.asarray([[0.0, 0.0]]), jnp.asarray([[1.0, 1e6]]))
    jitted = jax.jit(lambda m, v: lik.predict_y(m, v))
    _, vy = jitted(jnp.asarray([[0.0, 0.0]]), jnp.asarray([[1.0, 1e6]]))
    assert not np.isfinite(float(vy[0]))  # under jit: inf, for the models' check_moments


@pytest.mark.parametrize("cls", [L.Logistic, L.Probit, L.BayesianSVM])
def test_binary_log_predictive_accepts_01_labels_as_the_default(cls):
    """{0, 1} labels passed straight to predictive_log_prob mean {-1, +1}, as in the
    default log p / log(1 - p) of Bernoulli."""
    mean, var = np.array([0.3, -2.0, 5.0]), np.array([0.5, 4.0, 20.0])
    lik = cls()
    p = np.asarray(lik.predict_proba(mean, var))
    want = np.log(np.where(np.array([1, 0, 1]) > 0, p, 1 - p))
    for y in ([1.0, 0.0, 1.0], [1.0, -1.0, 1.0]):
        np.testing.assert_allclose(np.asarray(lik.predictive_log_prob(np.array(y), mean, var)),
                                   want, rtol=1e-12)


def test_gaussian_log_densities_beyond_float64_raise():
    """-0.5 (y - mean)^2 / v below -1.8e308: its true value, not representable, is a
    ValueError (not -inf); under jit (traced) it is -inf."""
    lik = L.Gaussian(1e-300)
    y, m, v = jnp.asarray([1e300]), jnp.asarray([0.0]), jnp.asarray([1e-8])
    with pytest.raises(ValueError, match="Gaussian predictive_log_prob.*exceeds float64"):
        lik.predictive_log_prob(y, m, v)
    with pytest.raises(ValueError, match="Gaussian variational_expectations.*exceeds float64"):
        lik.variational_expectations(y, m, v)
    traced = eqx.filter_jit(lambda lik: lik.predictive_log_prob(y, m, v))(lik)
    assert float(traced[0]) == -np.inf
    ok = L.Gaussian(0.5).predictive_log_prob(jnp.asarray([1.0]), m, jnp.asarray([0.5]))
    assert float(ok[0]) == pytest.approx(-0.5 * (np.log(2 * np.pi) + 1.0), rel=1e-14)
