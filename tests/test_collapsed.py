"""Collapsed augmented VI: SGPR with an augmentable likelihood (``SGPR.collapsed``,
``training.collapsed.fit_collapsed``) against its oracles:

1. given q(w), the collapsed bound is the SVGP augmented ELBO at the optimal q(u) for the
   same q(w) (1e-10), and that q(u) is a maximum;
2. with a Gaussian likelihood (w = 1, any q(w) state) it is Titsias' bound, and with Z = X
   the exact log marginal likelihood;
3. with frozen hyperparameters the alternation reaches the AnalyticVI (CAVI) fixed point;
   with trained hyperparameters its bound is no lower than the AnalyticVI fit's ELBO and
   the predictions agree;
4. its gradient in the hyperparameters and inducing inputs matches finite differences.

Problems are small and well conditioned (Matern-5/2, inducing points on a grid of
spacing 0.85), as in test_sparse.py and test_analytic_vi.py.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import augmentedgp as agp
from augmentedgp.core.params import fixed, partition_trainable, positive, real
from augmentedgp.training.collapsed import CollapsedHistory, fit_collapsed

LIK = agp.likelihoods
ZGRID = np.linspace(0.3, 9.7, 12)[:, None]  # M = 12, spacing 0.85


def kern(trainable=False, lengthscale=0.8, variance=1.3):
    wrap = (lambda p: p) if trainable else fixed
    return agp.kernels.Matern52(wrap(positive(lengthscale)), wrap(positive(variance)))


@eqx.filter_jit  # one program per shape, not one per primitive (an eager kernel call)
def kmat(kernel, X, Z):
    return kernel(X, Z)


def frozen(Z):
    return fixed(real(np.asarray(Z, dtype=float)))


def data(name, n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 10.0, n))[:, None]
    f = np.sin(X[:, 0])
    if name in ("Logistic", "BayesianSVM"):
        y = np.where(rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-3.0 * f)), 1.0, -1.0)
    elif name == "LogisticPoisson":
        y = rng.poisson(4.0 / (1.0 + np.exp(-2.0 * f))).astype(float)
    else:
        y = f + 0.3 * rng.standard_t(3.0, n)
    return X, y


LIKELIHOODS = {
    "Logistic": LIK.Logistic,
    "StudentT": lambda: LIK.StudentT(3.0, 0.4),
    "Laplace": lambda: LIK.Laplace(0.3),
    "LogisticPoisson": lambda: LIK.LogisticPoisson(4.0),
}


def perturbed(q_aux, seed):
    """An arbitrary q(w) state of the same type: every field scaled by U(0.5, 2)."""
    keys = iter(jax.random.split(jax.random.key(seed), len(q_aux)))
    return type(q_aux)(*(a * jax.random.uniform(next(keys), a.shape, minval=0.5, maxval=2.0)
                         for a in q_aux))


# --- 1. the collapsed bound is the SVGP augmented ELBO at the optimal q(u) -------------------


@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_collapsed_bound_is_the_augmented_elbo_at_the_optimal_q(name):
    X, y = data(name)
    lik = LIKELIHOODS[name]()
    mean = agp.means.Constant(fixed(real(0.3)))  # the sites' shift by the prior mean
    model = agp.SGPR(kern(), frozen(ZGRID), likelihood=lik, mean=mean)
    Xa, ya = model.validate_data(X, y)
    q_aux = perturbed(model.update_aux(X, y, model.initial_aux(X, y)), 1)
    F = model.elbo(X, y, q_aux)

    @eqx.filter_jit  # one program, not one per primitive
    def projection(svgp):
        expectations = lambda yy, m, v: lik.augmented_expectations(yy, m, v, q_aux)
        return svgp.elbo_projection(Xa, ya, 1.0, expectations)[0]

    def augmented(svgp):  # the SVGP data term at this q(w), not at the optimal one
        return float(projection(svgp))

    svgp = model.to_svgp(X, y, q_aux)
    np.testing.assert_allclose(augmented(svgp), F, rtol=0, atol=1e-10)
    # the closed-form q(u) is the maximum: moving its natural parameters lowers the bound
    q = svgp.q
    for eps in (1e-3, -1e-3):
        moved = agp.variational.NaturalQ(real(q.theta1.value + eps), real(q.theta2.value),
                                         whiten=True)
        assert augmented(agp.SVGP(model.kernel, lik, model.inducing, mean=mean, q=moved)) < F
    # the closed-form q(w) update never lowers it (the AnalyticVI fixed point it converges
    # to: test_frozen_hyperparameters_reach_the_cavi_fixed_point)
    assert model.elbo(X, y, model.update_aux(X, y, q_aux)) > F


def test_logistic_collapsed_bound_is_the_collapsed_jaakkola_jordan_bound():
    """With q(w) = PG(1, xi) / 2 the logistic bound is the Jaakkola-Jordan bound with
    variational parameters xi, and collapsed it is (dense n x n formula, zero mean)
    sum_i [log sigmoid(xi_i) - xi_i / 2 + lam_i xi_i^2] + y^T Kmn^T B^-1 Kmn y / 8
    + log|Kmm| / 2 - log|B| / 2 - tr(Lam (K - Q)),  B = Kmm + 2 Kmn Lam Kmn^T,
    lam = tanh(xi / 2) / (4 xi)."""
    X, y = data("Logistic")
    model = agp.SGPR(kern(), frozen(ZGRID), likelihood=LIK.Logistic())
    xi = np.random.default_rng(4).uniform(0.2, 3.0, len(y))
    q_aux = type(model.initial_aux(X, y))(jnp.asarray(xi**2))
    K, Kmn, Kmm = (np.asarray(kmat(kern(), a, b)) for a, b in ((X, X), (ZGRID, X), (ZGRID, ZGRID)))
    lam = np.tanh(xi / 2) / (4 * xi)
    B = Kmm + 2 * (Kmn * lam) @ Kmn.T
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    kty = Kmn @ y
    J = (np.sum(-np.log1p(np.exp(-xi)) - xi / 2 + lam * xi**2) + kty @ np.linalg.solve(B, kty) / 8
         + 0.5 * np.linalg.slogdet(Kmm)[1] - 0.5 * np.linalg.slogdet(B)[1]
         - np.sum(lam * np.diag(K - Q)))
    np.testing.assert_allclose(model.elbo(X, y, q_aux), J, rtol=1e-10)


# --- 2. Gaussian likelihood: Titsias' bound, the exact lml at Z = X -------------------------


def test_gaussian_is_the_collapsed_bound_with_constant_w():
    rng = np.random.default_rng(0)
    X = np.linspace(0.0, 10.0, 30)[:, None]
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=30)
    gauss = LIK.Gaussian(fixed(positive(0.09)))
    lml = agp.GP(kern(), gauss).log_marginal_likelihood(X, y)
    exact = agp.SGPR(kern(), frozen(X), likelihood=gauss)
    np.testing.assert_allclose(exact.elbo(X, y), lml, rtol=1e-10)
    # any q(w) state gives the same bound (w = 1), on sparse Z too
    sparse = agp.SGPR(kern(), frozen(ZGRID), likelihood=gauss)
    q_aux = perturbed(sparse.initial_aux(X, y), 2)
    F = sparse.elbo(X, y)
    np.testing.assert_allclose(sparse.elbo(X, y, q_aux), F, rtol=1e-13)
    assert F < lml - 0.1
    # and it is the dense formula log N(y | 0, Q + s2 I) - tr(K - Q) / (2 s2)
    K, Kmn, Kmm = (np.asarray(kmat(kern(), a, b)) for a, b in ((X, X), (ZGRID, X), (ZGRID, ZGRID)))
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    C = Q + 0.09 * np.eye(30)
    dense = (-0.5 * (30 * np.log(2 * np.pi) + np.linalg.slogdet(C)[1] + y @ np.linalg.solve(C, y))
             - 0.5 * np.trace(K - Q) / 0.09)
    np.testing.assert_allclose(F, dense, rtol=1e-10)


# --- 3. fits ----------------------------------------------------------------------------------


def test_frozen_hyperparameters_reach_the_cavi_fixed_point():
    X, y = data("Logistic")
    model = agp.SGPR(kern(), frozen(ZGRID), likelihood=LIK.Logistic())
    post = fit_collapsed(model, X, y, sweeps=5, tol=1e-13)
    assert isinstance(post.history, CollapsedHistory) and post.history.converged
    assert np.all(np.diff(post.history.bounds) >= -1e-12)  # coordinate ascent: monotone
    cavi = agp.fit(agp.SVGP(kern(), LIK.Logistic(), frozen(ZGRID)), X, y, agp.AnalyticVI(),
                   max_iter=300, tol=0.0)
    np.testing.assert_allclose(post.elbo(augmented=True), cavi.elbo(augmented=True),
                               rtol=1e-10)
    np.testing.assert_allclose(post.history.bounds[-1], cavi.elbo(augmented=True), rtol=1e-10)
    Xs = np.linspace(-1.0, 11.0, 25)[:, None]
    for a, b in zip(post.predict_f(Xs), cavi.predict_f(Xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)


def test_fit_reaches_the_analytic_vi_optimum_with_trained_hyperparameters():
    X, y = data("Logistic", n=100, seed=3)
    model = agp.SGPR(kern(True, 2.0, 1.0), frozen(ZGRID), likelihood=LIK.Logistic())
    post = fit_collapsed(model, X, y)
    assert post.history.converged
    # the collapsed bound is the augmented one: its optimum is AnalyticVI's on that objective
    svi = agp.fit(agp.SVGP(kern(True, 2.0, 1.0), LIK.Logistic(), frozen(ZGRID)), X, y,
                  agp.AnalyticVI(objective="augmented"), learning_rate=0.05, max_iter=3000,
                  tol=1e-10)
    F, G = post.elbo(augmented=True), svi.elbo(augmented=True)
    assert F >= G - 1e-4 * abs(G), (F, G)
    ls = lambda p: float(p.model.kernel.lengthscale.value)
    np.testing.assert_allclose(ls(post), ls(svi), rtol=2e-2)
    Xs = np.linspace(0.0, 10.0, 25)[:, None]
    np.testing.assert_allclose(post.predict_proba(Xs), svi.predict_proba(Xs), atol=5e-3)


# --- 4. gradients -----------------------------------------------------------------------------


def test_gradient_matches_finite_differences():
    """In the kernel, likelihood (df, scale) and inducing parameters, q(w) fixed."""
    X, y = data("StudentT", n=40)
    lik = LIK.StudentT(positive(3.0), positive(0.4))
    Z = ZGRID[::2] + 0.05
    model = agp.SGPR(kern(True), real(Z), likelihood=lik)
    Xa, ya = model.validate_data(X, y)
    q_aux = model.update_aux(X, y, model.initial_aux(X, y))
    params, static = partition_trainable(model)
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def bound(x):
        return eqx.combine(unravel(x), static).training_objective(Xa, ya, q_aux=q_aux)

    grad = np.asarray(jax.jit(jax.grad(bound))(flat))
    h = 1e-5
    fd = np.array([(bound(flat.at[i].add(h)) - bound(flat.at[i].add(-h))) / (2 * h)
                   for i in range(flat.shape[0])])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(grad)) > 1e-2  # the check is not vacuous


# --- errors -------------------------------------------------------------------------------


def test_bad_use_raises_value_error():
    X, y = data("Logistic", n=20)
    with pytest.raises(ValueError, match="SVGP"):
        agp.SGPR(kern(), ZGRID, likelihood=LIK.Probit())  # not augmentable
    with pytest.raises(ValueError, match="SVGP"):
        agp.FITC(kern(), ZGRID, likelihood=LIK.Logistic())
    with pytest.raises(ValueError, match="SVGP"):
        agp.SGPR(kern(), ZGRID, likelihood=LIK.LogisticSoftmax(3))  # several latents
    model = agp.SGPR(kern(), ZGRID, likelihood=LIK.Logistic())
    with pytest.raises(ValueError, match="q_aux"):
        model.elbo(X, y)
    with pytest.raises(ValueError, match="q_aux"):
        model.elbo(X, y, (jnp.ones(20),))
    with pytest.raises(ValueError, match="Tilt"):
        model.elbo(X, y, type(model.initial_aux(X, y))(jnp.ones(19)))
    with pytest.raises(ValueError, match="Gaussian"):
        model.upper_bound(X, y)
    with pytest.raises(ValueError):
        fit_collapsed(model, X, y, sweeps=-1)
    with pytest.raises(ValueError):
        fit_collapsed(agp.DTC(kern(), ZGRID, noise=0.1), X, y)
