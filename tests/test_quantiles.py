"""Predictive quantiles of y (``Likelihood.predictive_quantile`` and the posteriors'
``predict_quantiles``) against oracles: the closed form for Gaussian noise, the mixture CDF
integrated by adaptive quadrature (scipy.integrate.quad) at the returned quantile for
Student-t and Laplace noise, and the predictive CDF summed count by count for Poisson and
negative-binomial counts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
from scipy.integrate import quad
from scipy.special import expit

import augmentedgp as agp
from augmentedgp import likelihoods as lik

LEVELS = np.array([0.01, 0.1, 0.5, 0.9, 0.99])
# one latent sd narrower than the noise and one wider: both integration paths
MEAN, VAR = np.array([0.3, -1.0, 2.0]), np.array([0.01, 0.25, 9.0])


def _mixture_cdf(noise, t, m, v):
    """P(f + e <= t), f ~ N(m, v), by adaptive quadrature over f."""
    s = np.sqrt(v)
    return quad(lambda f: noise.cdf(t - f) * st.norm.pdf(f, m, s), m - 12 * s, m + 12 * s,
                epsabs=1e-12, epsrel=1e-12, limit=200)[0]


def _count_cdf(pmf, k, m, v):
    """P(y <= k), f ~ N(m, v): the conditional pmf summed over the counts 0..k, integrated
    over f by adaptive quadrature."""
    s, counts = np.sqrt(v), np.arange(int(k) + 1)
    return quad(lambda f: np.sum(pmf(counts, f)) * st.norm.pdf(f, m, s), m - 12 * s,
                m + 12 * s, epsabs=1e-13, epsrel=1e-12, limit=200)[0]


def test_gaussian_closed_form():
    g = lik.Gaussian(0.3)
    for level in LEVELS:
        np.testing.assert_allclose(g.predictive_quantile(MEAN, VAR, level),
                                   st.norm.ppf(level, MEAN, np.sqrt(VAR + 0.3)), rtol=1e-14)


@pytest.mark.parametrize("name", ["student_t", "laplace"])
def test_continuous_noise_mixture_cdf(name):
    """The mixture CDF at the returned quantile is the level: to 1e-6, and to 5e-5 for
    Laplace noise at sd(f) = 0.5 (just below the noise's robust scale 0.51: 40-node
    Gauss-Hermite over f of the Laplace CDF, kinked at 0, errs by up to 3e-5 there,
    measured; < 1e-8 for sd(f) <= 0.2 or >= 0.52)."""
    likelihood, noise = {"student_t": (lik.StudentT(4.0, 0.5), st.t(4.0, scale=0.5)),
                         "laplace": (lik.Laplace(0.5), st.laplace(scale=0.5))}[name]
    atol = np.where((name == "laplace") & (VAR == 0.25), 5e-5, 1e-6)
    for level in LEVELS:
        q = likelihood.predictive_quantile(MEAN, VAR, level)
        assert q.shape == MEAN.shape
        cdf = [_mixture_cdf(noise, t, m, v) for t, m, v in zip(q, MEAN, VAR, strict=True)]
        assert np.all(np.abs(np.array(cdf) - level) <= atol), np.array(cdf) - level


@pytest.mark.parametrize("name", ["poisson", "negative_binomial"])
def test_count_quantile_is_the_smallest_count_reaching_the_level(name):
    """CDF(q) >= level > CDF(q - 1), the CDF summed count by count (ties to 1e-6)."""
    likelihood, pmf = {
        "poisson": (lik.Poisson(binsize=2.0), lambda j, f: st.poisson.pmf(j, 2.0 * np.exp(f))),
        "negative_binomial": (lik.NegativeBinomial(3.0),
                              lambda j, f: st.nbinom.pmf(j, 3.0, expit(-f))),
    }[name]
    mean, var = np.array([0.3, -1.0, 1.0]), np.array([0.01, 0.25, 0.5])
    for level in LEVELS:
        q = likelihood.predictive_quantile(mean, var, level)
        assert np.all(q == np.round(q)) and np.all(q >= 0)
        for k, m, v in zip(q, mean, var, strict=True):
            assert _count_cdf(pmf, k, m, v) >= level - 1e-6
            assert k == 0 or _count_cdf(pmf, k - 1, m, v) < level + 1e-6


def test_unsupported_likelihoods_and_bad_levels():
    with pytest.raises(NotImplementedError, match="Logistic has no predictive quantiles"):
        lik.Logistic().predictive_quantile(MEAN, VAR, 0.5)
    with pytest.raises(TypeError, match="several latent functions"):
        lik.Softmax(3).predictive_quantile(np.zeros((2, 3)), np.ones((2, 3)), 0.5)
    for bad in (0.0, 1.0, np.nan, [0.5]):
        with pytest.raises(ValueError, match="level"):
            lik.StudentT().predictive_quantile(MEAN, VAR, bad)


def _data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (n, 1))
    return X, np.sin(X[:, 0]) + 0.3 * rng.standard_t(4.0, n)


XNEW = np.linspace(-6.0, 6.0, 7)[:, None]  # inside and beyond the data


def test_site_posterior_gaussian_closed_form():
    """An exact GP (SitePosterior): N(mean, var + s^2) quantiles of y."""
    X, y = _data()
    post = agp.GP(agp.kernels.RBF(1.0), noise=0.1).posterior(X, y)
    assert isinstance(post, agp.SitePosterior)
    mean, var = (np.asarray(a) for a in post.predict_f(XNEW))
    q = post.predict_quantiles(XNEW, LEVELS)
    assert q.shape == (len(XNEW), len(LEVELS))
    np.testing.assert_allclose(q, st.norm.ppf(LEVELS, mean[:, None],
                                              np.sqrt(var + 0.1)[:, None]), rtol=1e-12)
    np.testing.assert_allclose(post.predict_quantiles(XNEW, 0.5)[:, 0], mean, rtol=1e-12)
    with pytest.raises(ValueError, match="quantiles must lie strictly inside"):
        post.predict_quantiles(XNEW, [0.5, 1.0])


def test_sparse_posterior_student_t():
    """A VGP (SparsePosterior) with Student-t noise: the mixture CDF over its q(f) at each
    returned quantile is the level."""
    X, y = _data()
    post = agp.fit(agp.VGP(agp.kernels.RBF(1.0), lik.StudentT(4.0, 0.3)), X, y, max_iter=20)
    assert isinstance(post, agp.SparsePosterior)
    q = post.predict_quantiles(XNEW, LEVELS)
    mean, var = (np.asarray(a) for a in post.predict_f(XNEW))
    lk = post.likelihood
    noise = st.t(float(lk.df.value), scale=float(lk.scale.value))
    for i in range(len(XNEW)):
        cdf = [_mixture_cdf(noise, t, mean[i], var[i]) for t in q[i]]
        np.testing.assert_allclose(cdf, LEVELS, atol=1e-6)
