"""Automated augmentation: a likelihood declared by its super-Gaussian pieces
(``likelihoods.SuperGaussian``) and the generic sampler of the tilted mixing law
(``augmentation.inversion``).

Oracles: closed-form CDFs of the tilted laws of the built-in likelihoods (gamma, inverse
Gaussian, Levy, GIG); the exact samplers of every built-in (two-sample Kolmogorov-Smirnov on
10^5 draws with AGP_FULL_SLOW=1, 2 * 10^4 here, at c = 0, 1 and 30); the built-ins' VI fixed
points and learned hyperparameters; quadrature VI for a likelihood the library lacks (the
generalised Gaussian). The Gibbs posteriors of declared likelihoods are checked against grid
integration and elliptical slice sampling in tests/test_gibbs.py.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FULL, declared
from scipy import stats

import augmentedgp as agp
from augmentedgp.augmentation import inversion
from augmentedgp.core.params import fixed, positive

L = agp.likelihoods


def fp(value):
    return fixed(positive(value))


# --- the numerical inversion ----------------------------------------------------------


# (log phi, c^2, exact CDF of the tilted law, points)
CLOSED_FORMS = {
    "gamma (Student-t, df 3)": (lambda t: -2.0 * jnp.log1p(t / 3.0), 2.0,
                                stats.gamma(2.0, scale=1.0 / 5.0).cdf, np.geomspace(1e-3, 5, 60)),
    "Levy (Laplace, c = 0)": (lambda t: -jnp.sqrt(t), 0.0, stats.levy(scale=0.5).cdf,
                              np.geomspace(1e-3, 1e4, 60)),
    "inverse Gaussian (Laplace, c = 30)": (lambda t: -jnp.sqrt(t), 900.0,
                                           stats.invgauss(1.0 / 30.0, scale=0.5).cdf,
                                           np.geomspace(1e-4, 0.1, 60)),
    "GIG (Matern-3/2, c = 2)": (lambda t: jnp.log1p(jnp.sqrt(3.0 * t)) - jnp.sqrt(3.0 * t),
                                4.0, stats.geninvgauss(-1.5, math.sqrt(12.0),
                                                       scale=math.sqrt(1.5 / 8.0)).cdf,
                                np.geomspace(1e-2, 20, 60)),
    "exponential, 1 / (1 + t)": (lambda t: -jnp.log1p(t), 0.0, stats.expon.cdf,
                                 np.geomspace(1e-3, 30, 60)),
}


@pytest.mark.parametrize("name", list(CLOSED_FORMS))
def test_inversion_cdf_matches_closed_forms(name):
    """The Euler inversion's CDF is within 6e-8 of the exact one on 60 points spanning the
    law (the discretisation error is e^-18.4 = 1.0e-8), and its density integrates back to
    the CDF."""
    log_phi, c2, cdf, x = CLOSED_FORMS[name]
    F, f = inversion.tilted_cdf(log_phi, c2, jnp.asarray(x))
    err = np.max(np.abs(np.asarray(F) - cdf(x)))
    assert err < 6e-8, err
    assert np.all(np.diff(np.asarray(F)) > -1e-7)  # monotone to the inversion's accuracy
    fine = np.geomspace(x[0], x[-1], 4001)
    _, dens = inversion.tilted_cdf(log_phi, c2, jnp.asarray(fine))
    mass = np.sum(0.5 * np.diff(fine) * (np.asarray(dens)[1:] + np.asarray(dens)[:-1]))
    np.testing.assert_allclose(mass, cdf(x[-1]) - cdf(x[0]), atol=1e-5)


def test_log_mixing_density_is_relative_in_the_left_tail():
    """p(w) of the Student-t's Gamma(2, rate 3) and the Laplace's Levy law: left of the
    mean, through the tilted law whose mean is w, relative error below 1e-6 down to
    densities of e^-40; right of it, absolute error below 2e-8 (the inversion's)."""
    for log_phi, law, w in (
            (lambda t: -2.0 * jnp.log1p(t / 3.0), stats.gamma(2.0, scale=1 / 3),
             np.geomspace(1e-20, 30, 50)),
            (lambda t: -jnp.sqrt(t), stats.levy(scale=0.5), np.geomspace(3e-3, 1e6, 50))):
        got = np.asarray(jax.vmap(lambda x, lp=log_phi: inversion.log_mixing_density(lp, x))(
            jnp.asarray(w)))
        left = w < law.mean()
        assert np.min(law.logpdf(w[left])) < -40.0
        np.testing.assert_allclose(got[left], law.logpdf(w[left]), rtol=0, atol=1e-6)
        np.testing.assert_allclose(np.exp(got), law.pdf(w), rtol=0, atol=2e-8)


# the built-ins' exact samplers against the generic one, each with its log phi written
# analytically (complex-safe), for the y whose phi depends on it (negative binomial)
DRAWS = 100_000 if FULL else 20_000
GENERIC = {
    "StudentT": (L.StudentT(df=3.0, scale=1.0), lambda t: -2.0 * jnp.log1p(t / 3.0), 0.0),
    "Laplace": (L.Laplace(scale=0.7), lambda t: -jnp.sqrt(t) / 0.7, 0.0),
    "Matern32": (L.Matern32(scale=1.0),
                 lambda t: jnp.log1p(jnp.sqrt(3.0 * t)) - jnp.sqrt(3.0 * t), 0.0),
    "Logistic": (L.Logistic(), lambda t: -jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))), 1.0),
    "BayesianSVM": (L.BayesianSVM(), lambda t: -jnp.sqrt(t), 1.0),
    "NegativeBinomial": (L.NegativeBinomial(r=2.0),
                         lambda t: -5.0 * jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))), 3.0),
    "Gaussian": (L.Gaussian(variance=0.5), lambda t: -t, 0.0),
}


@pytest.mark.parametrize("name", list(GENERIC))
def test_generic_sampler_reproduces_the_exact_samplers(name):
    """At c = 0, 1 and 30, DRAWS draws of the generic sampler and of the built-in's exact
    one (Gamma, inverse Gaussian, GIG, Polya-Gamma; a point mass for the Gaussian) pass a
    two-sample Kolmogorov-Smirnov test (p > 1e-3), and their means agree with E[w] =
    -d log phi / dt to 4 standard errors. A wrong tilt (c^2 off by 20% at c = 30) fails the
    same test (the test can fail)."""
    lik, log_phi, y = GENERIC[name]
    k_exact, k_generic = jax.random.split(jax.random.PRNGKey(3))
    yy = jnp.full(DRAWS, y)
    generic = jax.jit(lambda key, c2: inversion.sample(key, lambda t: log_phi(t), c2))
    for c in (0.0, 1.0, 30.0):
        c2 = jnp.full(DRAWS, c * c)
        exact = np.asarray(lik.sample_omega(k_exact, yy, c2))
        mine = np.asarray(generic(k_generic, c2))
        assert np.all(np.isfinite(mine)) and np.all(mine > 0)
        if name == "Gaussian":
            np.testing.assert_allclose(mine, exact, rtol=1e-12)
            continue
        p = stats.ks_2samp(exact, mine).pvalue
        assert p > 1e-3, (c, p)
        if c > 0:  # E[w] is infinite for the Levy laws at c = 0
            ew = float(lik.omega_mean(jnp.asarray(y), jnp.asarray(c * c)))
            assert abs(mine.mean() - ew) < 4.0 * mine.std() / math.sqrt(DRAWS), (c, ew)
        if c == 30.0:
            wrong = np.asarray(generic(k_generic, 1.2 * c2))
            assert stats.ks_2samp(exact, wrong).pvalue < 1e-6


def test_generic_sampler_follows_the_exact_cdf():
    """One-sample KS against the closed-form CDFs (Gamma, inverse Gaussian, GIG): the
    draws are inverse-CDF transforms of uniforms, so their KS p-value is the uniforms'."""
    key = jax.random.PRNGKey(5)
    for name in ("gamma (Student-t, df 3)", "inverse Gaussian (Laplace, c = 30)",
                 "GIG (Matern-3/2, c = 2)"):
        log_phi, c2, cdf, _ = CLOSED_FORMS[name]
        w = np.asarray(inversion.sample(key, log_phi, jnp.full(DRAWS, c2)))
        assert stats.kstest(w, cdf).pvalue > 1e-3, name


def test_generic_sampler_is_jit_and_vmap_able_with_per_entry_parameters():
    """``sample(key, log_phi, c2, *args)``: per-entry parameters broadcast against c2, under
    jit and vmap; a point mass returns its mean; the Levy law at c = 0 has no mean and is
    still drawn (median 1 / (2 * 0.4549...) for scale 1/2)."""
    log_phi = lambda t, b: -b * jnp.log(jnp.cosh(0.5 * jnp.sqrt(t)))
    b = jnp.asarray([1.0, 4.0, 20.0])
    draws = jax.vmap(lambda k: inversion.sample(k, log_phi, jnp.zeros((2, 3)), b))(
        jax.random.split(jax.random.PRNGKey(0), 4000))
    assert draws.shape == (4000, 2, 3)
    np.testing.assert_allclose(np.asarray(draws).mean((0, 1)), np.asarray(b) / 8.0, rtol=0.03)
    assert float(inversion.sample(jax.random.PRNGKey(1), lambda t: -2.5 * t, 3.0)) == 2.5
    levy = np.asarray(inversion.sample(jax.random.PRNGKey(2), lambda t: -jnp.sqrt(t),
                                       jnp.zeros(DRAWS)))
    np.testing.assert_allclose(np.median(levy), stats.levy(scale=0.5).median(), rtol=0.05)


# --- the admissibility check ------------------------------------------------------------


@pytest.mark.parametrize("log_phi, match", [
    (lambda t: -t + 0.1, "phi\\(0\\) must be 1"),
    (lambda t: -jnp.power(t, 1.5), "not completely monotone.*d\\^2phi"),  # shape-3 power law
    (lambda t: -t**2, "not completely monotone"),
    (lambda t: -jnp.sqrt(jnp.abs(t)), "not analytic"),
    (lambda t: -jnp.sqrt(jnp.real(t)), "not analytic"),
    (lambda t: -jnp.floor(t) + jnp.floor(t) - t, "must accept complex t"),
])
def test_an_inadmissible_phi_is_refused(log_phi, match):
    with pytest.raises(ValueError, match=match):
        L.SuperGaussian(log_phi, a=lambda y: -y)


def test_constructor_errors_name_the_argument():
    with pytest.raises(TypeError, match="log_phi must be a function"):
        L.SuperGaussian(0.5)
    with pytest.raises(ValueError, match="support"):
        L.SuperGaussian(lambda t: -t, support="classes")
    with pytest.raises(TypeError, match="g must be a number or a function"):
        L.SuperGaussian(lambda t: -t, g="zero")
    with pytest.raises(ValueError, match="must be > 0"):
        L.SuperGaussian(lambda t, scale: -t / scale, params={"scale": -1.0})
    lik = L.SuperGaussian(lambda t: -jnp.sqrt(t), a=lambda y: -y)
    with pytest.raises(ValueError, match="pass mean="):
        lik.predict_y(jnp.zeros(2), jnp.ones(2))
    # an exact sampler given: log phi need not be analytic at complex t
    L.SuperGaussian(lambda t: -jnp.sqrt(jnp.abs(t)), a=lambda y: -y,
                    sample_omega=lambda key, t: agp.augmentation.samplers.inverse_gaussian(
                        key, 0.5 / jnp.sqrt(t), 0.5))


def test_a_declared_likelihood_cannot_be_saved_but_says_why(tmp_path):
    X = np.linspace(0, 1, 8)[:, None]
    post = agp.fit(agp.VGP(agp.kernels.RBF(), declared("Laplace", scale=0.5)), X, np.sin(X[:, 0]),
                   agp.AnalyticVI(), max_iter=5)
    with pytest.raises(Exception, match="not an augmentedgp class|holds"):
        agp.save(post, tmp_path / "m")


# --- variational inference: the built-ins' fixed points ---------------------------------


RNG = np.random.default_rng(0)
X = np.linspace(0.0, 5.0, 40)[:, None]
Y = np.sin(X[:, 0]) + 0.3 * RNG.standard_t(3, 40)
DECLARED = {
    "StudentT": (lambda s: L.StudentT(fp(3.0), s), lambda s: declared("StudentT", df=fp(3.0),
                                                                      scale=s)),
    "Laplace": (L.Laplace, lambda s: declared("Laplace", scale=s)),
    "Matern32": (L.Matern32, lambda s: declared("Matern32", scale=s)),
}


def kernel():
    return agp.kernels.Matern52(lengthscale=fp(1.0), variance=fp(1.0))


@pytest.mark.parametrize("name", list(DECLARED))
def test_declared_builtins_reach_the_builtin_vi_fixed_point(name):
    """A Student-t, Laplace and Matern-3/2 likelihood declared by their pieces: AnalyticVI
    with fixed hyperparameters reaches the built-in's fixed point to 1e-8 (q(f) at the
    data), and with the noise scale trained (Adam on the collapsed bound) learns the same
    scale to 1e-8: the pieces, autodiff's E[w] and the gradients agree."""
    built, mine = DECLARED[name]
    runs = []
    for make in (built, mine):
        post = agp.fit(agp.VGP(kernel(), make(fp(0.4))), X, Y, agp.AnalyticVI(), max_iter=300,
                       tol=0.0)
        runs.append(np.concatenate([np.ravel(a) for a in post.predict_f(X)]))
    np.testing.assert_allclose(runs[0], runs[1], rtol=0, atol=1e-8)
    scales = []
    for make in (built, mine):
        post = agp.fit(agp.VGP(kernel(), make(positive(1.0))), X, Y, agp.AnalyticVI(),
                       max_iter=200, tol=0.0)
        lik = post.likelihood
        scales.append(float((lik.scale if hasattr(lik, "scale") else lik.params["scale"]).value))
    assert abs(scales[0] - 1.0) > 0.05  # the scale moved
    np.testing.assert_allclose(scales[0], scales[1], rtol=1e-8)


def test_declared_logistic_matches_the_builtin_classifier():
    """The logistic likelihood declared by its Polya-Gamma pieces (support "binary"): the
    same AnalyticVI fixed point as ``Logistic`` and the same class probabilities."""
    yb = np.where(np.sin(2.0 * X[:, 0]) + 0.3 * RNG.normal(size=40) > 0, 1.0, 0.0)
    out = []
    for lik in (L.Logistic(), declared("Logistic")):
        post = agp.fit(agp.VGP(kernel(), lik), X, yb, agp.AnalyticVI(), max_iter=300, tol=0.0)
        out.append((np.asarray(post.predict_f(X)[0]), np.asarray(post.predict_y(X)[0])))
    np.testing.assert_allclose(out[0][0], out[1][0], atol=1e-8)
    np.testing.assert_allclose(out[0][1], out[1][1], atol=1e-7)


def test_generalised_gaussian_augmented_vi_matches_quadrature_vi():
    """A likelihood the library lacks, the generalised Gaussian (shape 1.5, no closed-form
    mixing law: phi(t) = exp(-t^0.75) is the Laplace transform of a positive 0.75-stable
    law): AnalyticVI with the plain ELBO as objective ("tight") reaches QuadratureVI's
    optimum (q(f) within 1e-5, the same ELBO to 1e-6 relative), and the default augmented
    bound lies below that ELBO (the augmentation gap, >= 0)."""
    lik = declared("GeneralisedGaussian", scale=fp(0.5), shape=fp(1.5))
    quad = agp.fit(agp.VGP(kernel(), lik), X, Y, agp.QuadratureVI(), max_iter=3000, tol=0.0)
    tight = agp.fit(agp.VGP(kernel(), lik), X, Y, agp.AnalyticVI(objective="tight"),
                    max_iter=300, tol=0.0)
    for a, b in zip(quad.predict_f(X), tight.predict_f(X), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    np.testing.assert_allclose(float(tight.elbo()), float(quad.elbo()), rtol=1e-6)
    aug = agp.fit(agp.VGP(kernel(), lik), X, Y, agp.AnalyticVI(), max_iter=300, tol=0.0)
    assert float(aug.augmentation_gap()) >= 0.0
