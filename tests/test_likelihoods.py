"""Likelihood derivatives and predictive densities against closed forms and autodiff."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

import augmentedgp as agp
from augmentedgp.likelihoods import Likelihood

LIKELIHOODS = [agp.likelihoods.Gaussian(0.3), agp.likelihoods.Logistic(), agp.likelihoods.Probit()]
rng = np.random.default_rng(0)
F = jnp.asarray(rng.normal(scale=3.0, size=40))
Y_BIN = jnp.asarray(np.where(rng.uniform(size=40) > 0.5, 1.0, -1.0))
Y_REAL = jnp.asarray(rng.normal(size=40))


def targets(lik):
    return Y_REAL if isinstance(lik, agp.likelihoods.Gaussian) else Y_BIN


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=lambda l: type(l).__name__)
def test_analytic_derivatives_equal_the_generic_autodiff_ones(lik):
    y = targets(lik)
    np.testing.assert_allclose(lik.grad_log_prob(y, F), Likelihood.grad_log_prob(lik, y, F),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lik.hess_log_prob(y, F), Likelihood.hess_log_prob(lik, y, F),
                               rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("lik", LIKELIHOODS, ids=lambda l: type(l).__name__)
def test_closed_form_predictive_density_equals_generic_quadrature(lik):
    y = targets(lik)[:8]
    mean, var = F[:8] / 3.0, jnp.linspace(0.05, 2.0, 8)
    np.testing.assert_allclose(lik.predictive_log_prob(y, mean, var),
                               Likelihood.predictive_log_prob(lik, y, mean, var), rtol=1e-7)


def test_probit_predictive_probability_equals_numerical_integration():
    lik = agp.likelihoods.Probit()
    for m, v in [(0.3, 0.5), (-2.0, 4.0), (1.0, 50.0)]:
        ref = quad(lambda f, m=m, v=v: norm.cdf(f) * norm.pdf(f, m, np.sqrt(v)),
                   -np.inf, np.inf)[0]
        ours = float(lik.predict_proba(jnp.asarray(m), jnp.asarray(v)))
        assert ours == pytest.approx(ref, rel=1e-8)


def test_probit_derivatives_stay_finite_far_in_the_tail():
    lik = agp.likelihoods.Probit()
    f = jnp.asarray([-40.0, -10.0, 10.0, 40.0])
    y = jnp.ones(4)
    assert np.all(np.isfinite(lik.grad_log_prob(y, f)))
    assert np.all(np.isfinite(lik.hess_log_prob(y, f)))
    np.testing.assert_allclose(lik.grad_log_prob(y, f)[0], 40.0, rtol=1e-2)  # ~ -z for z << 0
