"""TaylorSGPR: the collapsed second-order Taylor approximation, against its oracles:

1. given the expansion points xi, the objective is J_2 = sum_i E_q[second-order expansion of
   log p(y_i | f_i) at xi_i] - KL(q(u) || p(u)) at the closed-form q(u), both from the
   dense formulas Sigma = (2 K^-1 Kmn Psi Knm K^-1 + K^-1)^-1,
   mu = Sigma K^-1 Kmn (phi + 2 Psi xi) (logistic: phi = y sigmoid(-y xi),
   Psi = sigmoid(xi) sigmoid(-xi) / 2), and that q(u) is the maximum of J_2;
2. with Z = X its fixed point xi = E_q[f] is the Laplace approximation: the same posterior
   and the objective equals the Laplace log marginal likelihood;
3. with a Gaussian likelihood (an exact expansion) it is Titsias' bound at any xi;
4. it is not a bound: a Poisson count of 0 gives an objective above log p(y) (quadrature);
5. a fit stops at a fixed point (xi = E_q[f], zero gradient in the hyperparameters) and
   predicts close to the collapsed augmented bound's fit.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy import integrate, stats
from test_collapsed import ZGRID, data, frozen, kern, kmat

import augmentedgp as agp
from augmentedgp.core.params import fixed, partition_trainable, positive
from augmentedgp.models import TaylorPoint
from augmentedgp.training.collapsed import fit_collapsed

LIK = agp.likelihoods


def fixed_point(model, X, y, tol=1e-13):
    """Iterate xi <- E_q[f] until it moves by less than ``tol``."""
    q = model.initial_aux(X, y)
    for _ in range(200):
        new = model.update_aux(X, y, q)
        if np.max(np.abs(new.xi - q.xi)) < tol:
            return new
        q = new
    raise AssertionError("xi = E_q[f] did not converge")


# --- 1. the dense formulas ----------------------------------------------------------------


def test_objective_and_q_are_the_dense_taylor_formulas():
    X, y = data("Logistic")
    model = agp.TaylorSGPR(kern(), frozen(ZGRID), likelihood=LIK.Logistic())
    xi = np.random.default_rng(5).normal(0.0, 1.5, len(y))
    K, Kmn, Kmm = (np.asarray(kmat(kern(), a, b)) for a, b in ((X, X), (ZGRID, X), (ZGRID, ZGRID)))
    sig = 1.0 / (1.0 + np.exp(-y * xi))  # sigmoid(y xi)
    phi, psi = y * (1.0 - sig), 0.5 * sig * (1.0 - sig)
    Ki = np.linalg.inv(Kmm)
    Sigma = np.linalg.inv(2.0 * Ki @ (Kmn * psi) @ Kmn.T @ Ki + Ki)
    mu = Sigma @ Ki @ Kmn @ (phi + 2.0 * psi * xi)

    @jax.jit  # one program, not one per primitive
    def J2(mu, Sigma):  # the expansion's expectation minus the KL, term by term
        A = jnp.linalg.solve(Kmm, Kmn)  # K^-1 Kmn
        m = A.T @ mu
        S = np.diag(K) - jnp.sum(Kmn * A, 0) + jnp.sum(A * (Sigma @ A), 0)
        data_term = jnp.sum(-jnp.log1p(jnp.exp(-y * xi)) + phi * (m - xi)
                            - psi * (S + (m - xi) ** 2))
        kl = 0.5 * (jnp.trace(jnp.linalg.solve(Kmm, Sigma)) + mu @ jnp.linalg.solve(Kmm, mu)
                    - len(mu) + jnp.linalg.slogdet(Kmm)[1] - jnp.linalg.slogdet(Sigma)[1])
        return data_term - kl

    q = TaylorPoint(jnp.asarray(xi))
    np.testing.assert_allclose(model.objective(X, y, q), J2(mu, Sigma), rtol=1e-10)
    Xs = np.linspace(-1.0, 11.0, 17)[:, None]
    Ks, Kss = np.asarray(kmat(kern(), ZGRID, Xs)), np.asarray(kern().diag(Xs))
    B = np.linalg.solve(Kmm, Ks)
    mean, var = model.to_svgp(X, y, q).predict_f(Xs)
    np.testing.assert_allclose(mean, B.T @ mu, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(var, Kss - np.sum(Ks * B, 0) + np.sum(B * (Sigma @ B), 0),
                               rtol=1e-9, atol=1e-10)
    # the closed form is the maximum of J_2 at this xi: zero gradient, lower when moved
    g_mu, g_S = jax.jit(jax.grad(J2, (0, 1)))(jnp.asarray(mu), jnp.asarray(Sigma))
    assert max(np.max(np.abs(g_mu)), np.max(np.abs(g_S))) < 1e-8
    assert J2(mu + 0.01, Sigma) < J2(mu, Sigma) and J2(mu, 1.01 * Sigma) < J2(mu, Sigma)
    assert np.max(np.abs(mu)) > 0.1  # not vacuous


# --- 2. Z = X: the Laplace approximation ----------------------------------------------------


@pytest.mark.parametrize("name", ["Logistic", "Probit", "Poisson", "NegativeBinomial",
                                  "Gamma"])
def test_full_rank_fixed_point_is_the_laplace_approximation(name):
    X, y = data("Logistic" if name in ("Logistic", "Probit") else "LogisticPoisson", n=40)
    if name == "Gamma":
        y = y + 0.5
    lik = getattr(LIK, name)()
    model = agp.TaylorSGPR(kern(), frozen(X), likelihood=lik)
    q = fixed_point(model, X, y)
    gp = agp.GP(kern(), lik)
    np.testing.assert_allclose(model.objective(X, y, q), gp.log_marginal_likelihood(X, y),
                               rtol=1e-10)
    Xs = np.linspace(-1.0, 11.0, 17)[:, None]
    laplace = gp.posterior(X, y).predict_f(Xs)
    for a, b in zip(model.to_svgp(X, y, q).predict_f(Xs), laplace, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


# --- 3. a Gaussian likelihood: Titsias' bound -------------------------------------------------


def test_gaussian_taylor_objective_is_titsias_bound_at_any_xi():
    X, y = data("StudentT")
    gauss = LIK.Gaussian(fixed(positive(0.2)))
    taylor = agp.TaylorSGPR(kern(), frozen(ZGRID), likelihood=gauss)
    vfe = agp.SGPR(kern(), frozen(ZGRID), likelihood=gauss)
    xi = TaylorPoint(jnp.asarray(np.random.default_rng(1).normal(0.0, 3.0, len(y))))
    np.testing.assert_allclose(taylor.objective(X, y, xi), vfe.objective(X, y), rtol=1e-12)
    Xs = np.linspace(0.0, 10.0, 9)[:, None]
    for a, b in zip(taylor.to_svgp(X, y, xi).predict_f(Xs), vfe.to_svgp(X, y).predict_f(Xs),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# --- 4. not a bound ---------------------------------------------------------------------------


def test_taylor_objective_can_exceed_log_evidence():
    """One Poisson count y = 0 with f ~ N(0, 1): log p(y) = log int e^{-e^f} N(f | 0, 1) df;
    the Taylor objective at its fixed point lies 0.0104 above it, the ELBO of its q below."""
    X, y = np.zeros((1, 1)), np.zeros(1)
    model = agp.TaylorSGPR(agp.kernels.RBF(1.0, 1.0), X, likelihood=LIK.Poisson())
    q = fixed_point(model, X, y)
    evidence = np.log(integrate.quad(lambda f: np.exp(-np.exp(f)) * stats.norm.pdf(f),
                                     -40.0, 40.0, epsabs=0.0, epsrel=1e-13, limit=200)[0])
    assert model.objective(X, y, q) > evidence + 0.01
    assert model.elbo(X, y, q) < evidence


def test_elbo_is_the_svgp_elbo_of_the_closed_form_q():
    """TaylorSGPR.elbo (traceable, the KL in closed form) is the uncollapsed SVGP ELBO of
    the model's q(u) (to_svgp)."""
    X, y = data("Logistic")
    model = agp.TaylorSGPR(kern(), frozen(ZGRID), likelihood=LIK.Logistic())
    q = model.update_aux(X, y, model.initial_aux(X, y))
    np.testing.assert_allclose(model.elbo(X, y, q), model.to_svgp(X, y, q).elbo(X, y),
                               rtol=1e-12)


# --- 5. fits ----------------------------------------------------------------------------------


def test_fit_stops_at_a_fixed_point_and_predicts_as_the_augmented_bound():
    X, y = data("Logistic", n=100, seed=3)
    model = agp.TaylorSGPR(kern(True, 2.0, 1.0), frozen(ZGRID), likelihood=LIK.Logistic())
    post = fit_collapsed(model, X, y, tol=1e-10)
    assert post.history.converged and isinstance(post.history.q_aux, TaylorPoint)
    # the model in the posterior is an SVGP: rebuild the fitted TaylorSGPR from its parameters
    fitted = agp.TaylorSGPR(post.model.kernel, frozen(ZGRID), likelihood=LIK.Logistic())
    q = post.history.q_aux
    np.testing.assert_allclose(fitted.update_aux(X, y, q).xi, q.xi, atol=1e-6)
    Xa, ya = fitted.validate_data(X, y)
    params, static = partition_trainable(fitted)
    flat, unravel = ravel_pytree(params)
    grad = jax.jit(jax.grad(lambda x: eqx.combine(unravel(x), static).training_objective(
        Xa, ya, q_aux=q)))(flat)
    assert np.max(np.abs(grad)) < 1e-4
    assert fitted.objective(X, y, q) == pytest.approx(post.history.bounds[-1], rel=1e-10)
    augmented = agp.fit(agp.SGPR(kern(True, 2.0, 1.0), frozen(ZGRID),
                                 likelihood=LIK.Logistic()), X, y)
    # a different objective, so agreement rather than identity (measured: 0.049 apart)
    Xs = np.linspace(0.0, 10.0, 25)[:, None]
    np.testing.assert_allclose(post.predict_proba(Xs), augmented.predict_proba(Xs), atol=0.1)


# --- errors -------------------------------------------------------------------------------


def test_bad_use_raises_value_error():
    X, y = data("Logistic", n=20)
    for lik in (LIK.Laplace(0.3), LIK.StudentT(3.0, 0.4), LIK.BayesianSVM(),
                LIK.LogisticSoftmax(3)):
        with pytest.raises(ValueError, match="log-concave"):
            agp.TaylorSGPR(kern(), ZGRID, likelihood=lik)
    model = agp.TaylorSGPR(kern(), ZGRID, likelihood=LIK.Probit())
    with pytest.raises(ValueError, match="TaylorPoint"):
        model.objective(X, y)
    with pytest.raises(ValueError, match="TaylorPoint"):
        model.elbo(X, y, TaylorPoint(jnp.zeros(19)))
    with pytest.raises(ValueError, match="TaylorPoint"):
        model.elbo(X, y, agp.SGPR(kern(), ZGRID, likelihood=LIK.Logistic()).initial_aux(
            X, y))
    with pytest.raises(ValueError, match="TaylorSGPR is not trained by QuadratureVI; it is by "
                                         "CollapsedVI"):
        agp.fit(model, X, y, agp.QuadratureVI())
    with pytest.raises(ValueError, match="rounds"):  # CollapsedVI's settings
        agp.fit(model, X, y, optimizer="adam")
