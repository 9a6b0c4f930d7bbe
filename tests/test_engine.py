"""The training engine's shortcuts are exact: shape-bucket padding, the natural-parameter
form of q(u) during natural steps, and the symbolic-zero reverse rule of the projection."""

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import augmentedgp as agp
from augmentedgp.core import linalg
from augmentedgp.core.loop import bucket_size, optax_optimizer, pad_rows
from augmentedgp.training.step import init_state, model_at, step_form, user_form, vi_step
from augmentedgp.variational.families import CholeskyQ, NaturalQ


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=n) > 0).astype(float)
    return X, y


def model(X, q="whitened"):
    return agp.SVGP(agp.kernels.RBF(lengthscale=np.ones(2)), agp.likelihoods.Logistic(),
                    X[:12], q=q)


def test_bucket_sizes_bound_the_padding():
    assert bucket_size(1) == 64 and bucket_size(64) == 64
    for n in range(65, 5000, 37):
        b = bucket_size(n)
        assert n <= b <= 1.125 * n
        assert b % (1 << (n.bit_length() - 4)) == 0
    sizes = {bucket_size(n) for n in range(1025, 2049)}
    assert len(sizes) == 8  # 8 programs per octave


def test_padding_has_weight_zero_and_repeats_a_data_row():
    X, y = data(100)
    Xp, yp, w = pad_rows(X, y)
    assert Xp.shape == (104, 2) and float(w.sum()) == 100
    np.testing.assert_array_equal(Xp[:100], X)
    np.testing.assert_array_equal(Xp[100:], np.repeat(X[:1], 4, 0))
    np.testing.assert_array_equal(yp[100:], y[0])


def unpadded_run(m, X, y, inference, iters, hyper_every=1):
    """The reference: the same steps on the unpadded data, w = None."""
    state, setup = init_state(m, inference, optax_optimizer("adam", 0.01), hyper_every,
                              jax.random.key(0), X.shape[0])
    Xa, ya = m.validate_data(X, y)
    for _ in range(iters):
        state, _ = vi_step(state, (setup, Xa, ya, None))
    return user_form(model_at(state.hyper, state.q, setup.static), m.q)


def fixed_model(X, q="whitened"):
    """Fixed hyperparameters and inducing inputs: the fit is CAVI on q(u) alone (Adam on
    hyperparameters turns rounding in near-zero gradients into steps)."""
    kernel = agp.kernels.RBF(lengthscale=agp.params.fixed(agp.params.positive(1.0)),
                             variance=agp.params.fixed(agp.params.positive(1.0)))
    Z = agp.params.fixed(agp.params.real(jnp.asarray(X[:10])))
    return agp.SVGP(kernel, agp.likelihoods.Logistic(), Z, q=q)


def test_padded_full_batch_fit_equals_the_unpadded_steps():
    X, y = data(100)  # padded to 104 rows inside fit
    m = fixed_model(X)
    post = agp.fit(m, X, y, agp.AnalyticVI(), max_iter=15, tol=0.0)
    ref = unpadded_run(m, X, y, agp.AnalyticVI(), 15)
    got = jax.tree_util.tree_leaves(eqx.filter(post.model, eqx.is_inexact_array))
    want = jax.tree_util.tree_leaves(eqx.filter(ref, eqx.is_inexact_array))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_a_new_data_set_in_the_same_bucket_is_not_recompiled(caplog):
    X1, y1 = data(300, seed=1)
    X2, y2 = data(310, seed=2)  # both padded to 320
    fit = lambda X, y, m=None: agp.fit(model(X) if m is None else m, X, y, agp.AnalyticVI(),
                                       max_iter=10, tol=0.0)
    fit(X1, y1)
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        caplog.clear()
        fit(X2, y2)
        # nor is a new hyperparameter value (Python floats become traced parameters)
        fit(X2, y2, agp.SVGP(agp.kernels.RBF(lengthscale=[0.3, 2.0], variance=4.0),
                             agp.likelihoods.Logistic(), X2[:12]))
    chunks = [r.getMessage() for r in caplog.records if "_run_chunk" in r.getMessage()]
    assert chunks == []
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):  # the check can fail
        caplog.clear()
        X3, y3 = data(400, seed=3)  # another bucket
        fit(X3, y3)
    assert any("_run_chunk" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("C", [1, 3])
def test_step_form_is_the_same_distribution_and_round_trips(C):
    X, _ = data(60)
    lik = agp.likelihoods.Logistic() if C == 1 else agp.likelihoods.LogisticSoftmax(C)
    m = agp.SVGP(agp.kernels.RBF(), lik, X[:8])
    rng = np.random.default_rng(3)
    M = 8

    def random_q(q):
        R = np.tril(rng.normal(size=(M, M)), -1) + np.diag(rng.uniform(0.5, 1.5, M))
        return eqx.tree_at(lambda q: (q.mean.raw, q.chol.raw), q, (jnp.asarray(
            rng.normal(size=M)), jnp.asarray(R)))

    if C == 1:
        q = random_q(m.q)
    else:  # stacked latents: one random q per latent
        qs = [random_q(jax.tree_util.tree_map(lambda a, c=c: a[c], m.q)) for c in range(C)]
        q = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *qs)
    m = eqx.tree_at(lambda m: m.q, m, q)
    nat = step_form(m, natural=True)
    assert isinstance(nat.q, NaturalQ) and nat.q.whiten
    assert step_form(m, natural=False) is m
    p_nat, p = nat.project(jnp.asarray(X)), m.project(jnp.asarray(X))
    np.testing.assert_allclose(p_nat.mean, p.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p_nat.var, p.var, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(nat.prior_kl(), m.prior_kl(), rtol=1e-10)
    back = user_form(nat, m.q)
    assert isinstance(back.q, CholeskyQ)
    np.testing.assert_allclose(back.q.mean.value, m.q.mean.value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(jnp.tril(back.q.chol.value), jnp.tril(m.q.chol.value),
                               rtol=1e-9, atol=1e-12)


def test_fit_returns_the_users_q_family_and_the_natural_fit():
    X, y = data(80)
    fits = {q: agp.fit(fixed_model(X, q), X, y, agp.AnalyticVI(), max_iter=30, tol=0.0)
            for q in ("whitened", "natural_whitened")}
    assert isinstance(fits["whitened"].model.q, CholeskyQ)
    a, b = (fits[q].predict_f(X[:20]) for q in ("whitened", "natural_whitened"))
    np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("use_L", [False, True])
def test_projection_reverse_rule_with_and_without_the_factors_cotangent(use_L):
    rng = np.random.default_rng(0)
    G = rng.normal(size=(6, 6))
    K = jnp.asarray(G @ G.T + 6 * np.eye(6))
    B = jnp.asarray(rng.normal(size=(6, 4)))
    W = jnp.asarray(rng.normal(size=(6, 4)))

    def loss(project, K, B):
        L, A = project(K, B)
        return jnp.sum(jnp.sin(A) * W) + (jnp.sum(jnp.tril(L) ** 3) if use_L else 0.0)

    plain = lambda K, B: (jnp.linalg.cholesky(K),
                          jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(K), B,
                                                            lower=True))
    got = jax.grad(lambda K, B: loss(linalg.cholesky_project, K, B), (0, 1))(K, B)
    want = jax.grad(lambda K, B: loss(plain, 0.5 * (K + K.T), B), (0, 1))(K, B)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
