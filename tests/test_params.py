"""Parameters (transforms, validation, fixing, priors), restarts (perturb) and mean functions."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import augmentedgp as agp
from augmentedgp.core import params as P
from augmentedgp.training import perturb

POSITIVE_TRANSFORMS = [P.Softplus()] + ([P.Exp()] if hasattr(P, "Exp") else [])
TRANSFORM_IDS = [type(t).__name__ for t in POSITIVE_TRANSFORMS]


def _positive(value, name="parameter", transform=None, **kw):
    if transform is None:
        return P.positive(value, name, **kw)
    return P.positive(value, name, transform=transform, **kw)


# --- positive / real ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [1.0, 1e-8, 1e4, 0.3, 25.0, np.array([1e-8, 0.5, 3.0, 1e4]), np.array([[0.2, 7.0]])],
    ids=["one", "tiny", "large", "small", "medium", "array", "2d"],
)
@pytest.mark.parametrize("transform", POSITIVE_TRANSFORMS, ids=TRANSFORM_IDS)
def test_positive_round_trips(value, transform):
    p = _positive(value, "x", transform=transform)
    assert isinstance(p, P.Parameter)
    assert p.transform == transform
    assert p.value.dtype == jnp.float64 and p.value.shape == np.shape(value)
    np.testing.assert_allclose(np.asarray(p.value), value, rtol=1e-12, atol=0)
    assert np.all(np.isfinite(np.asarray(p.raw)))


@pytest.mark.parametrize("transform", POSITIVE_TRANSFORMS, ids=TRANSFORM_IDS)
def test_positive_transform_is_a_bijection_onto_positive_reals(transform):
    raw = jnp.linspace(-30.0, 30.0, 61)
    value = np.asarray(transform.forward(raw))
    assert np.all(value > 0) and np.all(np.diff(value) > 0)  # positive, increasing
    np.testing.assert_allclose(np.asarray(transform.inverse(value)), raw, rtol=1e-9, atol=1e-9)


def test_softplus_forward_is_log1p_exp():
    raw = np.linspace(-20.0, 20.0, 41)
    np.testing.assert_allclose(np.asarray(P.Softplus().forward(jnp.asarray(raw))),
                               np.logaddexp(0.0, raw), rtol=1e-14)


def test_default_positive_transform_is_positive_transform():
    p = P.positive(2.5, "x")
    assert any(p.transform == t for t in POSITIVE_TRANSFORMS)


@pytest.mark.parametrize(
    "bad",
    [0.0, -0.0, -1.0, -1e-300, float("nan"), float("inf"), -float("inf"), [1.0, 0.0],
     np.array([0.5, np.nan])],
    ids=["zero", "negzero", "neg", "tinyneg", "nan", "inf", "neginf", "array_zero", "array_nan"],
)
def test_positive_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="my_param"):
        P.positive(bad, "my_param")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_real_rejects_non_finite(bad):
    with pytest.raises(ValueError, match="offset_c"):
        P.real(bad, "offset_c")


def test_real_is_identity_and_accepts_negative():
    p = P.real([-2.0, 0.0, 3.5], "w")
    np.testing.assert_array_equal(np.asarray(p.value), [-2.0, 0.0, 3.5])
    np.testing.assert_array_equal(np.asarray(p.raw), [-2.0, 0.0, 3.5])


def test_positive_passes_parameters_through():
    p = P.positive(2.0, "x")
    assert P.positive(p, "y") is p
    k = agp.kernels.RBF(lengthscale=P.fixed(P.positive(2.0, "lengthscale")))
    assert not k.lengthscale.trainable
    assert float(k.lengthscale.value) == pytest.approx(2.0, rel=1e-12)


# --- fixed / partition_trainable ------------------------------------------------------------


def _model():
    kernel = agp.kernels.RBF(lengthscale=P.fixed(P.positive(np.array([0.5, 2.0]), "lengthscale")),
                             variance=1.5)
    return kernel, agp.means.Constant(0.3)


def test_fixed_excludes_parameter_from_partition_trainable():
    model = _model()
    p = model[0].lengthscale
    assert not p.trainable and eqx.tree_equal(P.fixed(p), p)
    trainable, static = P.partition_trainable(model)
    assert trainable[0].lengthscale.raw is None
    assert static[0].lengthscale.raw is not None
    assert trainable[0].variance.raw is not None and static[0].variance.raw is None
    assert trainable[1].c.raw is not None
    leaves = jax.tree_util.tree_leaves(trainable)
    assert sum(np.size(x) for x in leaves) == 2  # variance and c, not the 2 lengthscales
    # combine restores the model exactly
    back = eqx.combine(trainable, static)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(model),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert eqx.tree_equal(back, model)


def test_fixed_parameter_gets_no_gradient_and_is_not_optimised():
    from augmentedgp.core.loop import minimize

    model = _model()

    def loss(m):
        k, mean = m
        return (jnp.sum((k.lengthscale.value - 3.0) ** 2) + (k.variance.value - 0.7) ** 2
                + (mean.c.value + 1.0) ** 2)

    trainable, static = P.partition_trainable(model)
    grads = jax.grad(lambda t: loss(eqx.combine(t, static)))(trainable)
    assert grads[0].lengthscale.raw is None
    fitted, _ = minimize(loss, model, optimizer="lbfgs", max_iter=200)
    np.testing.assert_array_equal(np.asarray(fitted[0].lengthscale.raw),
                                  np.asarray(model[0].lengthscale.raw))
    assert float(fitted[0].variance.value) == pytest.approx(0.7, abs=1e-5)
    assert float(fitted[1].c.value) == pytest.approx(-1.0, abs=1e-5)


def test_parameters_lists_all_nodes():
    model = _model()
    ps = P.parameters(model)
    assert len(ps) == 3
    assert sum(p.trainable for p in ps) == 2


# --- priors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("x", [0.05, 0.7, 2.0, 9.0])
def test_log_prior_matches_scipy(x):
    cases = [
        (P.Normal(0.5, 1.5), scipy.stats.norm(0.5, 1.5)),
        (P.LogNormal(-0.3, 0.8), scipy.stats.lognorm(s=0.8, scale=np.exp(-0.3))),
        (P.Gamma(2.5, 4.0), scipy.stats.gamma(a=2.5, scale=1 / 4.0)),
        (P.Gamma(1.0, 0.5), scipy.stats.expon(scale=2.0)),
    ]
    for prior, ref in cases:
        p = P.positive(x, "x", prior=prior)
        assert float(P.log_prior(p)) == pytest.approx(ref.logpdf(x), rel=1e-12, abs=1e-12)
        assert float(prior.log_prob(jnp.asarray(x))) == pytest.approx(ref.logpdf(x), rel=1e-12)


def test_log_prior_sums_over_parameters_and_array_entries():
    ell = np.array([0.4, 1.7, 3.0])
    kernel = agp.kernels.Matern52(
        lengthscale=P.positive(ell, "lengthscale", prior=P.Gamma(2.0, 1.5)),
        variance=P.positive(0.8, "variance", prior=P.LogNormal(0.0, 1.0)),
    )
    mean = agp.means.Linear(P.real([0.3, -1.2, 0.0], "weights", prior=P.Normal(0.0, 2.0)))
    expected = (
        scipy.stats.gamma(a=2.0, scale=1 / 1.5).logpdf(ell).sum()
        + scipy.stats.lognorm(s=1.0).logpdf(0.8)
        + scipy.stats.norm(0.0, 2.0).logpdf([0.3, -1.2, 0.0]).sum()
    )
    assert float(P.log_prior((kernel, mean))) == pytest.approx(expected, rel=1e-12)
    # no priors at all -> 0; with_prior attaches one
    assert float(P.log_prior(agp.kernels.RBF())) == 0.0
    p = P.with_prior(P.positive(1.3, "v"), P.Normal(1.0, 0.1))
    assert float(P.log_prior(p)) == pytest.approx(scipy.stats.norm(1.0, 0.1).logpdf(1.3))


def test_log_prior_gradient_is_finite_and_correct():
    # d/dx log Gamma(x | a, b) = (a - 1)/x - b, chained through d value / d raw
    p = P.positive(1.7, "x", prior=P.Gamma(3.0, 2.0))
    g = jax.grad(lambda raw: P.log_prior(P.Parameter(raw, p.transform, p.prior)))(p.raw)
    dvalue_draw = jax.grad(p.transform.forward)(p.raw)
    assert float(g) == pytest.approx(float(((3.0 - 1) / 1.7 - 2.0) * dvalue_draw), rel=1e-10)


# --- perturb --------------------------------------------------------------------------------


def _perturb_model():
    kernel = (
        agp.kernels.RBF(lengthscale=np.array([1e-3, 0.5, 40.0]), variance=1.5)
        + agp.kernels.White(P.fixed(P.positive(0.05, "variance")))
    )
    return kernel, agp.means.Linear([0.3, -2.0, 1.0], bias=0.5)


def test_perturb_is_deterministic_given_the_key():
    model = _perturb_model()
    a = perturb(model, jax.random.PRNGKey(3))
    b = perturb(model, jax.random.PRNGKey(3))
    c = perturb(model, jax.random.PRNGKey(4))
    leaves = lambda m: [np.asarray(x) for x in jax.tree_util.tree_leaves(m)]
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(leaves(a), leaves(c), strict=True))


def test_perturb_keeps_positive_positive_and_fixed_unchanged():
    model = _perturb_model()
    for i, key in enumerate(jax.random.split(jax.random.PRNGKey(0), 20)):
        new = perturb(model, key, scale=3.0)
        k, mean = new
        ell = np.asarray(k.k1.lengthscale.value)
        assert np.all(np.isfinite(ell)) and np.all(ell > 0), (i, ell)
        assert float(k.k1.variance.value) > 0
        # fixed: bitwise unchanged
        np.testing.assert_array_equal(np.asarray(k.k2.variance.raw),
                                      np.asarray(model[0].k2.variance.raw))
        # trainable ones moved, and structure/static fields are preserved
        assert not np.array_equal(np.asarray(k.k1.lengthscale.raw),
                                  np.asarray(model[0].k1.lengthscale.raw))
        assert not np.array_equal(np.asarray(mean.weights.raw), np.asarray(model[1].weights.raw))
        assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(model)


def test_perturb_distribution():
    """Positive parameters are multiplied by exp(N(0, s^2)), real ones shifted by N(0, s^2),
    independently per entry (400-entry arrays: one call gives 400 draws)."""
    n, scale = 400, 0.7
    ell0 = np.geomspace(1e-3, 1e3, n)
    w0 = np.linspace(-5.0, 5.0, n)
    model = (agp.kernels.RBF(lengthscale=ell0), agp.means.Linear(w0))
    out = perturb(model, jax.random.PRNGKey(1), scale=scale)
    log_ratio = np.log(np.asarray(out[0].lengthscale.value) / ell0)
    shift = np.asarray(out[1].weights.value) - w0
    for sample in [log_ratio, shift]:
        # mean within 4 standard errors of 0, std within ~4 standard errors of `scale`
        assert abs(sample.mean()) < 4 * scale / np.sqrt(n)
        assert abs(sample.std() - scale) < 4 * scale / np.sqrt(2 * n)
        assert abs(np.corrcoef(sample[:-1], sample[1:])[0, 1]) < 4 / np.sqrt(n)
        assert scipy.stats.kstest(sample / scale, "norm").pvalue > 1e-3
    assert abs(np.corrcoef(log_ratio, shift)[0, 1]) < 4 / np.sqrt(n)  # distinct keys


# --- means ----------------------------------------------------------------------------------


def _X():
    return np.random.default_rng(0).normal(size=(6, 3))


def test_zero_mean():
    out = agp.means.Zero()(jnp.asarray(_X()))
    assert out.shape == (6,) and out.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(out), np.zeros(6))


def test_constant_mean():
    out = agp.means.Constant(-1.25)(_X())
    assert out.shape == (6,)
    np.testing.assert_array_equal(np.asarray(out), np.full(6, -1.25))
    np.testing.assert_array_equal(np.asarray(agp.means.Constant()(_X())), np.zeros(6))


def test_linear_mean():
    X = _X()
    w, b = np.array([0.5, -1.0, 2.0]), 0.7
    out = agp.means.Linear(w, bias=b)(X)
    np.testing.assert_allclose(np.asarray(out), X @ w + b, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.asarray(agp.means.Linear(w)(X)), X @ w, rtol=1e-14)


def test_linear_mean_rejects_mismatched_weights():
    with pytest.raises(ValueError, match="weights"):
        agp.means.Linear([1.0, 2.0])(_X())
    with pytest.raises(ValueError, match="weights"):
        agp.means.Linear(np.ones((3, 1)))
    with pytest.raises(ValueError, match="weights"):
        agp.means.Linear(1.0)


def test_mean_parameters_are_trainable_reals():
    m = agp.means.Linear([0.5, 1.0], bias=0.2)
    ps = P.parameters(m)
    assert len(ps) == 2 and all(p.trainable for p in ps)
    assert all(isinstance(p.transform, P.Identity) for p in ps)
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones((4, 2)))))(m)
    np.testing.assert_allclose(np.asarray(grads.weights.raw), [4.0, 4.0])
    assert float(grads.bias.raw) == 4.0
