"""The quadrature rules of ``augmentedgp.core.quadrature`` against independent oracles:
closed forms where they exist, ``scipy.integrate.quad`` (adaptive Gauss-Kronrod) otherwise."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

import augmentedgp  # noqa: F401 -- enables float64
from augmentedgp.core import quadrature as q


def quad(fn, lo, hi):
    value, _ = scipy.integrate.quad(fn, lo, hi, epsabs=1e-13, epsrel=1e-12, limit=500)
    return value


# --- Gauss-Hermite -----------------------------------------------------------------------


def test_hermite_nodes_are_exact_for_normal_moments():
    x, w = q.hermite_nodes(10)
    assert np.sum(w) == pytest.approx(1.0, abs=1e-14)
    for k, moment in enumerate([1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 15.0, 0.0, 105.0]):
        assert np.sum(w * x**k) == pytest.approx(moment, abs=1e-11)
    assert q.hermite_nodes(10) is q.hermite_nodes(10)  # cached


@pytest.mark.parametrize("mean, var", [(0.3, 0.5), (-2.0, 4.0)])
def test_gauss_hermite_against_scipy_quad(mean, var):
    fn = lambda f: np.log1p(np.exp(-f))  # smooth: log(1 + e^-f)
    sd = math.sqrt(var)
    ref = quad(lambda f: fn(f) * scipy.stats.norm.pdf(f, mean, sd), mean - 14 * sd,
               mean + 14 * sd)
    got = q.gauss_hermite(lambda f: jnp.log1p(jnp.exp(-f)), mean, var, 64)
    assert float(got) == pytest.approx(ref, rel=1e-9)
    log_ref = math.log(quad(lambda f: scipy.special.expit(f) * scipy.stats.norm.pdf(f, mean, sd),
                            mean - 14 * sd, mean + 14 * sd))
    assert float(q.log_gauss_hermite(jax.nn.log_sigmoid, mean, var)) == pytest.approx(log_ref,
                                                                                      rel=1e-9)


def test_gauss_hermite_gradient_is_zero_at_zero_variance():
    g = jax.grad(lambda v: q.gauss_hermite(jnp.sin, 0.2, v))(0.0)
    assert float(g) == 0.0


def test_adaptive_log_gauss_hermite_against_scipy_quad():
    # h(f) = a f - b e^f (a Poisson-like log integrand), mode log(a / b)
    a, b = 7.0, 0.002
    h = lambda f: a * f - b * jnp.exp(f)
    dh = lambda f: a - b * jnp.exp(f)
    mode = math.log(a / b)
    ref = math.log(quad(lambda f: math.exp(a * f - b * math.exp(f) - (a * mode - a)),
                        mode - 20, mode + 8)) + a * mode - a
    got = q.adaptive_log_gauss_hermite(h, dh, jnp.asarray(-50.0), jnp.asarray(50.0))
    assert float(got) == pytest.approx(ref, rel=1e-10)


# --- Gauss-Legendre ----------------------------------------------------------------------


@pytest.mark.parametrize("lo, hi", [(-1.0, 1.0), (-0.5, 2.0), (3.0, 3.25)])
def test_gauss_legendre_on_an_interval_against_scipy_quad(lo, hi):
    fn = lambda x: np.exp(x) * np.cos(3.0 * x)
    x, w = q.gauss_legendre(24, lo, hi)
    assert np.sum(w) == pytest.approx(hi - lo, rel=1e-14)
    assert np.all((x > lo) & (x < hi))
    assert np.sum(w * fn(x)) == pytest.approx(quad(fn, lo, hi), rel=1e-12, abs=1e-14)


def test_gauss_legendre_on_the_unit_interval_is_the_quantile_rule():
    """On [0, 1]: E[g(e)] = int_0^1 g(F^-1(p)) dp, as ``sklearn``'s predictive quantiles
    use it (200 nodes), and its nodes and weights equal leggauss's mapped by hand."""
    p, wp = q.gauss_legendre(200, 0.0, 1.0)
    u, wu = np.polynomial.legendre.leggauss(200)
    np.testing.assert_array_equal(p, 0.5 * (u + 1.0))
    np.testing.assert_array_equal(wp, 0.5 * wu)
    noise = scipy.stats.logistic(scale=0.7)
    g = lambda e: scipy.stats.norm.cdf(0.4 - e)
    ref = quad(lambda e: g(e) * noise.pdf(e), -60.0, 60.0)
    assert np.sum(wp * g(noise.ppf(p))) == pytest.approx(ref, rel=1e-8)


def test_panel_log_gauss_legendre_against_scipy_quad():
    """A wide bulk and a narrow bump far from it, each with panels of its own size."""
    log_fn = lambda x: jnp.logaddexp(-0.5 * x**2, -0.5 * ((x - 30.0) / 0.01) ** 2 - 3.0)
    f = lambda x: math.exp(-0.5 * x**2) + math.exp(-0.5 * ((x - 30.0) / 0.01) ** 2 - 3.0)
    ref = quad(f, -12.0, 12.0) + quad(f, 29.8, 30.2)  # the rest is < 1e-30
    bp = jnp.array([-12.0, -3.0, 0.0, 3.0, 12.0, 29.8, 29.95, 30.0, 30.05, 30.2])
    got = q.panel_log_gauss_legendre(log_fn, bp, 32)
    assert float(got) == pytest.approx(math.log(ref), rel=1e-12)
    # duplicated breakpoints (empty panels) change nothing
    got2 = q.panel_log_gauss_legendre(log_fn, jnp.concatenate([bp, bp[:3]]), 32)
    assert float(got2) == pytest.approx(float(got), rel=1e-14)


@pytest.mark.parametrize("mean, var", [(0.0, 1.0), (0.8, 0.3), (-1.0, 25.0)])
def test_kinked_expectation_against_closed_form_and_scipy_quad(mean, var):
    """E|f - c| has a kink at c: the closed form sd (2 phi(z) + z (2 Phi(z) - 1)) with
    z = (mean - c) / sd, and the log form against scipy.integrate.quad split at the kink."""
    c, sd = 0.3, math.sqrt(var)
    z = (mean - c) / sd
    exact = sd * (2.0 * scipy.stats.norm.pdf(z) + z * (2.0 * scipy.stats.norm.cdf(z) - 1.0))
    got = q.kinked_expectation(lambda f: jnp.abs(f - c), mean, var, jnp.array([c]))
    assert float(got) == pytest.approx(exact, rel=1e-11)
    log_p = lambda f: -jnp.maximum(0.0, 1.0 - f)  # a hinge, kink at f = 1
    dens = lambda f: math.exp(-max(0.0, 1.0 - f)) * scipy.stats.norm.pdf(f, mean, sd)
    ref = quad(dens, mean - 14 * sd, 1.0) + quad(dens, 1.0, mean + 14 * sd)
    got = q.kinked_expectation(log_p, mean, var, jnp.array([1.0]), log=True)
    assert float(got) == pytest.approx(math.log(ref), rel=1e-11)


def test_kinked_expectation_at_zero_variance_is_the_value_at_the_mean():
    got = q.kinked_expectation(lambda f: jnp.abs(f - 0.3), 1.1, 0.0, jnp.array([0.3]))
    assert float(got) == pytest.approx(0.8, rel=1e-12)


# --- Gauss-Laguerre ----------------------------------------------------------------------


def test_laguerre_nodes_against_closed_forms_and_scipy_quad():
    x, w = q.laguerre_nodes()
    assert x.shape == w.shape == (64,)
    assert np.sum(w * np.sin(x)) == pytest.approx(0.5, rel=1e-12)  # int e^-x sin x = 1/2
    assert np.sum(w * x**5) == pytest.approx(120.0, rel=1e-12)  # 5!
    g = lambda t: scipy.special.expit(t) * np.exp(-0.5 * (t - 1.0) ** 2 / 9.0)
    ref = quad(lambda t: math.exp(-t) * g(t), 0.0, np.inf)
    assert np.sum(w * g(x)) == pytest.approx(ref, rel=1e-10)
    x8, w8 = q.laguerre_nodes(8)
    assert np.sum(w8 * x8**15) == pytest.approx(math.factorial(15), rel=1e-10)  # degree 2n-1


# --- equispaced rule, Laplace inversion, (quasi-)Monte Carlo ------------------------------


def test_uniform_nodes_trapezoid_converges_geometrically():
    t, h = q.uniform_nodes(jnp.array([-12.0, -15.0]), 12.0, 61)
    assert t.shape == (2, 61)
    got = h * jnp.sum(jnp.exp(-0.5 * t**2), axis=-1)
    np.testing.assert_allclose(got, math.sqrt(2.0 * math.pi), rtol=1e-13)


@pytest.mark.parametrize("x", [0.2, 1.0, 4.0])
def test_euler_inversion_rule_inverts_known_transforms(x):
    """f(x) = e^-x from F(s) = 1 / (1 + s), and the CDF 1 - e^-x from F(s) / s, to the
    discretisation error ~e^-A = 1e-8 (times the function near 2x..3x: < 6e-8 for the CDF,
    as augmentation/inversion.py states) of [Abate2000] with A = 18.4, n = 27, m = 11."""
    A = 18.4
    w, b = q.euler_inversion_rule(27, 11)
    assert w.shape == b.shape == (39,)
    s = (A + 2j * b) / (2.0 * x)
    scale = math.exp(0.5 * A) / x
    assert scale * np.sum(w * np.real(1.0 / (1.0 + s))) == pytest.approx(math.exp(-x), abs=1e-8)
    assert scale * np.sum(w * np.real(1.0 / ((1.0 + s) * s))) == pytest.approx(
        -math.expm1(-x), abs=6e-8)


def test_mc_expectation_quasi_and_pseudo_random():
    mean = jnp.array([[0.0, 1.0], [2.0, -1.0]])
    var = jnp.array([[1.0, 0.5], [0.2, 3.0]])
    fn = lambda F: jnp.sum(F**2, axis=-1)
    exact = jnp.sum(mean**2 + var, axis=-1)
    np.testing.assert_allclose(q.mc_expectation(fn, mean, var, 4096), exact, rtol=2e-3)
    np.testing.assert_allclose(q.mc_expectation(fn, mean, var, 20000, jax.random.key(0)),
                               exact, rtol=5e-2)
    assert q.qmc_normal(64, 2) is q.qmc_normal(64, 2)  # cached, fixed seed


def test_moved_names_still_import_from_likelihoods_base():
    import augmentedgp.likelihoods.base as base
    from augmentedgp.core.validation import check_counts

    with pytest.warns(DeprecationWarning, match="core.quadrature"):
        assert base.kinked_expectation is q.kinked_expectation
    with pytest.warns(DeprecationWarning):
        assert base.count_targets is check_counts
    with pytest.raises(AttributeError):
        base.no_such_name  # noqa: B018
