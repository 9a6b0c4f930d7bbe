"""Non-Gaussian likelihoods for variational inference against scipy.stats, numerical
integration (scipy quad) and Monte Carlo."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.integrate import quad
from scipy.special import expit

import augmentedgp as agp
from augmentedgp.likelihoods import Likelihood

L = agp.likelihoods


@eqx.filter_jit
def call(lik, method, *args, generic=False):
    """lik.method(*args) compiled once per likelihood type and shapes (eager dispatch of the
    many small ops is what would make this file slow); ``generic``: the base-class method."""
    return getattr(Likelihood, method)(lik, *args) if generic else getattr(lik, method)(*args)


@eqx.filter_jit
def ve_grads(lik, y, m, v):
    """d/dmean and d/dvar of the (elementwise) variational expectations."""
    return jax.grad(lambda m, v: jnp.sum(lik.variational_expectations(y, m, v)), (0, 1))(m, v)


def arr(*x):
    return jnp.asarray(np.array(x, dtype=float))


# Each case: the likelihood, a scipy oracle for log p(y | f), a sampler of valid targets,
# (y, mean, var) points at which expectations are checked, whether log p has a kink at f = y,
# and the conditional mean and variance of y given f from the textbook formulas.
CASES = {
    "Poisson": (L.Poisson(binsize=1.7),
                lambda y, f: stats.poisson.logpmf(y, 1.7 * np.exp(f)),
                lambda rng, n: rng.poisson(3.0, size=n).astype(float),
                [(0.0, 0.2, 0.5), (3.0, -0.7, 1.5), (11.0, 1.0, 0.1)], False,
                lambda f: 1.7 * np.exp(f), lambda f: 1.7 * np.exp(f)),
    "StudentT": (L.StudentT(df=4.0, scale=0.7),
                 lambda y, f: stats.t.logpdf(y, 4.0, loc=f, scale=0.7),
                 lambda rng, n: 2.0 * rng.normal(size=n),
                 [(0.4, 0.2, 0.5), (-1.0, -0.7, 1.5), (2.5, 1.0, 2.0)], True,
                 lambda f: f, lambda f: 0.49 * 4.0 / 2.0),
    "Laplace": (L.Laplace(scale=0.8),
                lambda y, f: stats.laplace.logpdf(y, loc=f, scale=0.8),
                lambda rng, n: 2.0 * rng.normal(size=n),
                [(0.3, 0.2, 0.5), (-1.0, -0.7, 1.5), (2.5, 1.0, 0.1)], True,
                lambda f: f, lambda f: 2.0 * 0.64),
    "NegativeBinomial": (L.NegativeBinomial(r=2.5),
                         # scipy: pmf = C(y + r - 1, y) p^r (1 - p)^y, so p = 1 - sigmoid(f)
                         lambda y, f: stats.nbinom.logpmf(y, 2.5, 1.0 - expit(f)),
                         lambda rng, n: rng.poisson(4.0, size=n).astype(float),
                         [(0.0, 0.2, 0.5), (4.0, -0.7, 1.5), (15.0, 1.0, 2.0)], False,
                         lambda f: 2.5 * np.exp(f), lambda f: 2.5 * np.exp(f) * (1 + np.exp(f))),
    "Gamma": (L.Gamma(shape=2.3),
              lambda y, f: stats.gamma.logpdf(y, 2.3, scale=np.exp(f) / 2.3),
              lambda rng, n: rng.gamma(2.0, size=n),
              [(1.3, 0.2, 0.5), (0.05, -0.7, 1.5), (4.0, 1.0, 0.1)], False,
              lambda f: np.exp(f), lambda f: np.exp(2 * f) / 2.3),
    "Beta": (L.Beta(precision=7.0),
             lambda y, f: stats.beta.logpdf(y, 7.0 * expit(f), 7.0 * expit(-f)),
             lambda rng, n: rng.beta(2.0, 3.0, size=n),
             [(0.3, 0.2, 0.5), (0.05, -0.7, 1.5), (0.9, 1.0, 2.0)], False,
             lambda f: expit(f), lambda f: expit(f) * expit(-f) / 8.0),
}
NAMES = list(CASES)
COUNTS = ["Poisson", "NegativeBinomial"]


def points(name):
    return tuple(arr(*c) for c in zip(*CASES[name][3], strict=True))


def expect(fn, m, v, kink=None):
    """E[fn(f)], f ~ N(m, v), by adaptive quadrature over m +- 12 sd (tail mass < 1e-32)."""
    s = np.sqrt(v)
    lo, hi = m - 12.0 * s, m + 12.0 * s
    pts = [kink] if kink is not None and lo < kink < hi else None
    return quad(lambda f: fn(f) * stats.norm.pdf(f, m, s), lo, hi, points=pts,
                epsabs=1e-14, epsrel=1e-13, limit=400)[0]


@pytest.mark.parametrize("name", NAMES)
def test_log_prob_equals_scipy(name):
    lik, oracle, sample, *_ = CASES[name]
    rng = np.random.default_rng(1)
    y, f = sample(rng, 200), rng.normal(scale=2.0, size=200)
    np.testing.assert_allclose(call(lik, "log_prob", jnp.asarray(y), jnp.asarray(f)),
                               oracle(y, f), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_variational_expectations_equal_numerical_integration(name):
    lik, oracle, _, pts, kinked, *_ = CASES[name]
    ours = call(lik, "variational_expectations", *points(name))  # closed form / default rule
    ref = [expect(lambda f, yi=yi: oracle(yi, f), mi, vi, yi if kinked else None)
           for yi, mi, vi in pts]
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_variational_expectations_agree_with_monte_carlo(name):
    lik, oracle, _, pts, *_ = CASES[name]
    yi, mi, vi = pts[1]
    draws = oracle(yi, mi + np.sqrt(vi) * np.random.default_rng(2).normal(size=10**6))
    ours = float(call(lik, "variational_expectations", *points(name))[1])
    assert abs(ours - draws.mean()) < 5.0 * draws.std() / np.sqrt(draws.size)


@pytest.mark.parametrize("name", ["Poisson", "Gamma"])
def test_closed_form_variational_expectations_equal_gauss_hermite(name):
    lik, _, sample, *_ = CASES[name]
    rng = np.random.default_rng(3)
    y = jnp.asarray(sample(rng, 30))
    m, v = jnp.asarray(rng.normal(size=30)), jnp.asarray(rng.uniform(0.01, 3.0, size=30))
    np.testing.assert_allclose(call(lik, "variational_expectations", y, m, v),
                               call(lik, "variational_expectations", y, m, v, 100, generic=True),
                               rtol=1e-10, atol=1e-10)


def test_laplace_closed_form_is_what_gauss_hermite_converges_to():
    # |y - f| has a kink, so Gauss-Hermite converges slowly (~1e-3 at 100 nodes) and the
    # tight oracle is quad above; here: GH approaches the closed form, and is within 1e-2.
    lik = CASES["Laplace"][0]
    args = points("Laplace")
    closed = call(lik, "variational_expectations", *args)
    err = [np.max(np.abs(call(lik, "variational_expectations", *args, n, generic=True) - closed))
           for n in (20, 50, 150)]
    assert err[2] < err[0] and err[2] < 1e-2


def test_laplace_expectations_tend_to_the_log_density_as_the_variance_vanishes():
    lik = CASES["Laplace"][0]
    y, m = arr(0.3, -1.0, 2.5, 0.4), arr(0.2, -0.7, 2.5, 0.4)
    v = arr(0.0, 1e-300, 1e-20, 0.0)
    lp = call(lik, "log_prob", y, m)
    np.testing.assert_allclose(call(lik, "variational_expectations", y, m, v), lp, rtol=1e-9)
    np.testing.assert_allclose(call(lik, "predictive_log_prob", y, m, v), lp, rtol=1e-9)
    gm, gv = ve_grads(lik, y, m, v)
    assert np.all(np.isfinite(gm)) and np.all(np.isfinite(gv))
    np.testing.assert_allclose(gm[:3], np.sign(y - m)[:3] / 0.8)  # d/dm of -|y - m|/b


def test_matern32_sites_are_the_curvature_as_the_variance_vanishes():
    """The split-panel quadrature (``kinked_expectation``) of the Matern-3/2 likelihood has
    finite derivatives where a kink falls on a panel end (the mean at y) or outside the
    panels (small variance), and at var = 0; as var -> 0, -2 dE/dvar tends to the curvature
    -d^2 log p / df^2 = a^2 / (1 + a |y - f|)^2, a = sqrt(3) / scale, and dE/dmean to the
    slope a^2 (y - f) / (1 + a |y - f|) (closed forms; the cubic term of log p at the kink
    adds O(sqrt(var)): 1e-4 relative at var = 1e-10). (The
    gradient was NaN there, so QuadratureVI's first steps went non-finite.)"""
    lik = agp.likelihoods.Matern32(0.3)
    a = np.sqrt(3.0) / 0.3
    y, m = arr(0.5, 2.0, 1.0, -1.0), arr(0.5, 2.0, 1.3, -1.0)
    gm, gv = ve_grads(lik, y, m, arr(1e-10, 1e-11, 1e-10, 1e-10))
    r = np.abs(np.asarray(y) - np.asarray(m))
    np.testing.assert_allclose(-2.0 * gv, a**2 / (1.0 + a * r) ** 2, rtol=3e-4)
    np.testing.assert_allclose(gm, a**2 * (np.asarray(y) - np.asarray(m)) / (1.0 + a * r),
                               rtol=1e-5, atol=1e-6)
    gm0, gv0 = ve_grads(lik, y, m, arr(0.0, 0.0, 0.0, 0.0))
    assert np.all(np.isfinite(gm0)) and np.all(np.isfinite(gv0))


@pytest.mark.parametrize("name", NAMES)
def test_predict_y_equals_numerical_integration(name):
    lik, *_, cm, cv = CASES[name]
    m, v = arr(0.3, -0.8, 1.0), arr(0.4, 1.2, 0.05)
    ey = np.array([expect(cm, mi, vi) for mi, vi in zip(m, v, strict=True)])
    ey2 = [expect(lambda f: cv(f) + cm(f) ** 2, mi, vi) for mi, vi in zip(m, v, strict=True)]
    vy = ey2 - ey**2  # law of total variance
    for mean_y, var_y in (call(lik, "predict_y", m, v), call(lik, "predict_y", m, v, 64,
                                                             generic=True)):
        np.testing.assert_allclose(mean_y, ey, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(var_y, vy, rtol=1e-9, atol=1e-12)


@eqx.filter_jit
def _moments(lik, f):
    return lik.conditional_mean(f), lik.conditional_variance(f)


@pytest.mark.parametrize("name", NAMES)
def test_conditional_moments_equal_scipy(name):
    lik, *_ = CASES[name]
    f = np.linspace(-2.0, 2.0, 7)
    dist = {"Poisson": lambda: stats.poisson(1.7 * np.exp(f)),
            "StudentT": lambda: stats.t(4.0, loc=f, scale=0.7),
            "Laplace": lambda: stats.laplace(loc=f, scale=0.8),
            "NegativeBinomial": lambda: stats.nbinom(2.5, 1.0 - expit(f)),
            "Gamma": lambda: stats.gamma(2.3, scale=np.exp(f) / 2.3),
            "Beta": lambda: stats.beta(7.0 * expit(f), 7.0 * expit(-f))}[name]()
    mean, var = _moments(lik, jnp.asarray(f))
    np.testing.assert_allclose(mean, dist.mean(), rtol=1e-12)
    np.testing.assert_allclose(var, dist.var(), rtol=1e-12)


def test_student_t_variance_is_infinite_for_two_or_fewer_degrees_of_freedom():
    f = arr(0.0, 1.0)
    assert np.all(np.isinf(call(L.StudentT(df=2.0), "conditional_variance", f)))
    predict_y = eqx.filter_jit(lambda lik: lik.predict_y(f, arr(0.1, 0.2)))  # df traced
    assert np.all(np.isinf(predict_y(L.StudentT(df=1.5))[1]))
    np.testing.assert_allclose(call(L.StudentT(df=2.5, scale=0.5), "conditional_variance", f),
                               1.25)


@pytest.mark.parametrize("name", NAMES)
def test_predictive_log_prob_equals_numerical_integration(name):
    lik, oracle, _, pts, kinked, *_ = CASES[name]
    ours = call(lik, "predictive_log_prob", *points(name))
    ref = [np.log(expect(lambda f, yi=yi: np.exp(oracle(yi, f)), mi, vi,
                         yi if kinked else None)) for yi, mi, vi in pts]
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("bad, why", [([1.0, -1.0, 2.0], "non-negative"),
                                      ([1.0, 2.5, 0.0], "integer")])
def test_count_targets_reject_negative_or_fractional_counts(name, bad, why):
    with pytest.raises(ValueError, match=f"y must hold {why}"):
        CASES[name][0].check_targets(np.array(bad))


@pytest.mark.parametrize("name, bad", [("Gamma", [1.0, 0.0]), ("Gamma", [2.0, -0.5]),
                                       ("Beta", [0.5, 0.0]), ("Beta", [0.5, 1.0]),
                                       ("Beta", [1.2, 0.5]), ("Poisson", [1.0, np.nan]),
                                       ("StudentT", [np.inf, 0.0]), ("Laplace", ["a", 1.0])])
def test_targets_outside_the_support_are_rejected(name, bad):
    with pytest.raises(ValueError, match="^y "):
        CASES[name][0].check_targets(np.array(bad, dtype=object))


@pytest.mark.parametrize("name", NAMES)
def test_valid_targets_are_accepted_as_floats(name):
    lik, _, sample, *_ = CASES[name]
    y = sample(np.random.default_rng(4), 20)
    out = lik.check_targets(y.astype(int) if name in COUNTS else y)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("name", ["Poisson", "StudentT", "Laplace", "NegativeBinomial", "Gamma"])
def test_analytic_derivatives_equal_autodiff(name):
    lik, _, sample, *_ = CASES[name]
    rng = np.random.default_rng(5)
    y, f = jnp.asarray(sample(rng, 50)), jnp.asarray(rng.normal(scale=2.0, size=50))
    for method in ("grad_log_prob", "hess_log_prob"):
        np.testing.assert_allclose(call(lik, method, y, f), call(lik, method, y, f, generic=True),
                                   rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_variational_expectation_gradients_match_finite_differences(name):
    lik = CASES[name][0]
    y, m, v = points(name)
    ve = lambda m, v: call(lik, "variational_expectations", y, m, v)  # elementwise
    gm, gv = ve_grads(lik, y, m, v)
    assert np.all(np.isfinite(gm)) and np.all(np.isfinite(gv))
    h = 1e-5
    np.testing.assert_allclose(gm, (ve(m + h, v) - ve(m - h, v)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gv, (ve(m, v + h) - ve(m, v - h)) / (2 * h), rtol=1e-6, atol=1e-8)


@eqx.filter_jit
@eqx.filter_value_and_grad
def _ve_sum(lik, y, m, v):
    return jnp.sum(lik.variational_expectations(y, m, v))


@pytest.mark.parametrize("name", ["StudentT", "Laplace", "NegativeBinomial", "Gamma", "Beta"])
def test_hyperparameters_are_trainable_with_correct_gradients(name):
    lik = CASES[name][0]
    params = agp.params.parameters(lik)
    assert params and all(p.trainable for p in params)
    args = points(name)
    grads = agp.params.parameters(_ve_sum(lik, *args)[1])
    h = 1e-6
    for i, g in enumerate(grads):
        shift = lambda d, i=i: eqx.tree_at(lambda lk: agp.params.parameters(lk)[i].raw, lik,
                                           params[i].raw + d)
        fd = (_ve_sum(shift(h), *args)[0] - _ve_sum(shift(-h), *args)[0]) / (2 * h)
        assert float(g.raw) == pytest.approx(float(fd), rel=1e-6, abs=1e-9)


def test_negative_binomial_tends_to_poisson_for_large_dispersion():
    # NB(r, f - log r) has mean e^f and log-pmf Poisson(e^f) + O((y^2 + e^{2f}) / r)
    r, y, f = 1e7, arr(0.0, 3.0, 9.0), arr(-0.5, 1.0, 2.0)
    np.testing.assert_allclose(call(L.NegativeBinomial(r=r), "log_prob", y, f - np.log(r)),
                               call(L.Poisson(), "log_prob", y, f), atol=1e-5)


def test_log_probs_stay_finite_for_extreme_latents():
    f = arr(-40.0, 40.0)
    for lik, y in [(L.NegativeBinomial(2.0), arr(3.0, 0.0)), (L.Beta(5.0), arr(0.2, 0.8)),
                   (L.StudentT(), arr(0.0, 0.0)), (L.Gamma(2.0), arr(1.0, 1.0))]:
        assert np.all(np.isfinite(call(lik, "log_prob", y, f)))


STUDENT_WIDE = [(0.0, 0.0, 25.0, 4.0, 0.3), (3.0, -1.0, 9.0, 1.0, 0.5), (-2.0, 1.0, 4.0, 30.0, 0.1),
                (0.5, 0.0, 1e-8, 4.0, 0.7), (10.0, 0.0, 1.0, 0.5, 0.2)]  # y, m, v, df, scale


@pytest.mark.parametrize("y, m, v, df, scale", STUDENT_WIDE)
def test_student_t_expectations_stay_accurate_when_the_latent_is_wider_than_the_noise(
        y, m, v, df, scale):
    lik = L.StudentT(df=df, scale=scale)
    s = np.sqrt(v)
    lo, hi = m - 12 * s, m + 12 * s
    pts = [p for p in [y + k * scale for k in (-3, -1, 0, 1, 3)] + [m] if lo < p < hi]
    q = lambda g: quad(lambda f: g(f) * stats.norm.pdf(f, m, s), lo, hi, points=pts,
                       epsabs=0.0, epsrel=1e-13, limit=1000)[0]
    ve_ref = q(lambda f: stats.t.logpdf(y, df, loc=f, scale=scale))
    pred_ref = np.log(q(lambda f: stats.t.pdf(y, df, loc=f, scale=scale)))
    args = arr(y), arr(m), arr(v)
    assert float(call(lik, "variational_expectations", *args)[0]) == pytest.approx(
        ve_ref, rel=1e-9, abs=1e-9)
    assert float(call(lik, "predictive_log_prob", *args)[0]) == pytest.approx(
        pred_ref, rel=1e-9, abs=1e-9)


def test_generic_gauss_hermite_is_inaccurate_where_the_student_t_forms_are_needed():
    # why StudentT overrides both expectations: the generic 20/100-node rules miss by > 1e-4
    y, m, v, df, scale = STUDENT_WIDE[0]
    lik = L.StudentT(df=df, scale=scale)
    args = arr(y), arr(m), arr(v)
    for method in ("variational_expectations", "predictive_log_prob"):
        gap = call(lik, method, *args, generic=True) - call(lik, method, *args)
        assert abs(float(gap[0])) > 1e-4
