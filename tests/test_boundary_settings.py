"""Settings of the fitting and sampling entry points (issue 24): every bad value of
``agp.fit``, the variational inference settings, the step-size schedules, ``GibbsSampling``
and ``agp.sample`` fails at the boundary with a ValueError / TypeError naming the argument;
a fit whose objective or parameters become non-finite returns the last finite state."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import augmentedgp as agp
from augmentedgp import kernels as K
from augmentedgp import likelihoods as L
from augmentedgp.core.loop import minimize
from augmentedgp.core.params import real
from augmentedgp.variational.schedules import Adaptive, Constant, RobbinsMonro, Warmup

rng = np.random.default_rng(0)
X = rng.normal(size=(16, 2))
Y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=16)
Y01 = (Y > 0).astype(float)
Z = X[:4]

MODELS = {
    "GP": lambda: (agp.GP(K.RBF(), noise=0.1), Y),
    "SGPR": lambda: (agp.SGPR(K.RBF(), Z, noise=0.1), Y),
    "SVGP": lambda: (agp.SVGP(K.RBF(), L.Logistic(), Z), Y01),
}

# (setting, bad value, exception type, regex naming the argument)
FIT_CASES = [
    ("max_iter", float("nan"), ValueError, "max_iter"),
    ("max_iter", "5", ValueError, "max_iter"),
    ("max_iter", [3], ValueError, "max_iter"),
    ("max_iter", 2.5, ValueError, "max_iter"),
    ("max_iter", -1, ValueError, "max_iter"),
    ("max_iter", True, ValueError, "max_iter"),
    ("n_restarts", -1, ValueError, "n_restarts"),
    ("n_restarts", 1.5, ValueError, "n_restarts"),
    ("hyper_every", 0, ValueError, "hyper_every"),
    ("hyper_every", "2", ValueError, "hyper_every"),
    ("chunk_size", 0, ValueError, "chunk_size"),
    ("chunk_size", None, ValueError, "chunk_size"),
    ("window", 0, ValueError, "window"),
    ("patience", 2.5, ValueError, "patience"),
    ("tol", float("nan"), ValueError, "tol"),
    ("tol", float("inf"), ValueError, "tol"),
    ("tol", -1.0, ValueError, "tol"),
    ("tol", "1e-3", ValueError, "tol"),
    ("learning_rate", 0.0, ValueError, "learning_rate"),
    ("learning_rate", -1.0, ValueError, "learning_rate"),
    ("learning_rate", float("nan"), ValueError, "learning_rate"),
    ("learning_rate", "0.1", ValueError, "learning_rate"),
    ("optimizer", "sgd", ValueError, "optimizer"),
    ("optimizer", 3, TypeError, "optimizer"),
    ("optimizer", optax.adam, TypeError, "optimizer"),  # the factory, not a transformation
    ("callback", "print", TypeError, "callback"),
    ("verbose", "yes", TypeError, "verbose"),
    ("key", "key", TypeError, "key"),
    ("key", 3, TypeError, "key"),
]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(("setting", "value", "error", "pattern"), FIT_CASES)
def test_fit_rejects_bad_settings_for_every_model(name, setting, value, error, pattern):
    model, y = MODELS[name]()
    with pytest.raises(error, match=pattern):
        agp.fit(model, X, y, **{setting: value})


@pytest.mark.parametrize("optimizer", [None, "adam"])
@pytest.mark.parametrize("value", [float("nan"), "5", [3], 2.5])
def test_fit_max_iter_is_checked_before_any_path(optimizer, value):
    """max_iter is checked before any training runs: neither '<' not supported (L-BFGS) nor
    can't multiply sequence (Adam); None is each training's own default."""
    for model in (agp.GP(K.RBF(), noise=0.1), agp.SGPR(K.RBF(), Z, noise=0.1)):
        with pytest.raises(ValueError, match=r"max_iter must be an integer"):
            agp.fit(model, X, Y, max_iter=value, optimizer=optimizer)


INFERENCE_CASES = [
    (lambda: agp.QuadratureVI(n_points=[3]), ValueError, "n_points"),
    (lambda: agp.QuadratureVI(n_points=0), ValueError, "n_points"),
    (lambda: agp.QuadratureVI(n_points=2.5), ValueError, "n_points"),
    (lambda: agp.QuadratureVI(natural="yes"), TypeError, "natural"),
    (lambda: agp.QuadratureVI(step_size=0.0), ValueError, "step_size"),
    (lambda: agp.QuadratureSVI(batch_size=0), ValueError, "batch_size"),
    (lambda: agp.QuadratureSVI(batch_size="8"), ValueError, "batch_size"),
    (lambda: agp.AnalyticVI(step_size=-1.0), ValueError, "step_size"),
    (lambda: agp.AnalyticVI(step_size=1.5), ValueError, "step_size"),
    (lambda: agp.AnalyticVI(step_size=float("nan")), ValueError, "step_size"),
    (lambda: agp.AnalyticVI(step_size="0.5"), ValueError, "step_size"),
    (lambda: agp.AnalyticVI(step_size=[0.5]), ValueError, "step_size"),
    (lambda: agp.AnalyticSVI(8, step_size=0), ValueError, "step_size"),
    (lambda: Constant(2.0), ValueError, "value"),
    (lambda: Warmup(start=0.0), ValueError, "start"),
    (lambda: Warmup(end=2.0), ValueError, "end"),
    (lambda: Warmup(steps=0), ValueError, "steps"),
    (lambda: Warmup(steps=2.5), ValueError, "steps"),
    (lambda: RobbinsMonro(kappa=0.4), ValueError, "kappa"),
    (lambda: RobbinsMonro(kappa="0.6"), ValueError, "kappa"),
    (lambda: RobbinsMonro(tau=0.5), ValueError, "tau"),
    (lambda: RobbinsMonro(tau=float("inf")), ValueError, "tau"),
    (lambda: Adaptive(init_steps=0), ValueError, "init_steps"),
    (lambda: agp.GibbsSampling(overrelax=[0.1, 0.2]), ValueError, "overrelax"),
    (lambda: agp.GibbsSampling(overrelax=1.0), ValueError, "overrelax"),
    (lambda: agp.GibbsSampling(overrelax=float("nan")), ValueError, "overrelax"),
    (lambda: agp.GibbsSampling(overrelax="0.1"), ValueError, "overrelax"),
    (lambda: agp.GibbsSampling(overrelax=True), ValueError, "overrelax"),
    (lambda: agp.GibbsSampling(n_samples=10**30), ValueError, "n_samples"),
    (lambda: agp.GibbsSampling(n_samples=2**30, n_chains=4), ValueError, "n_samples"),
    (lambda: agp.GibbsSampling(n_samples=0), ValueError, "n_samples"),
    (lambda: agp.GibbsSampling(n_chains=0), ValueError, "n_chains"),
    (lambda: agp.GibbsSampling(burn_in=-1), ValueError, "burn_in"),
    (lambda: agp.GibbsSampling(burn_in=10**30), ValueError, "burn_in"),
    (lambda: agp.GibbsSampling(thin=0), ValueError, "thin"),
    (lambda: agp.GibbsSampling(thin="2"), ValueError, "thin"),
    (lambda: agp.GibbsSampling(hyper_every=-1), ValueError, "hyper_every"),
    (lambda: agp.GibbsSampling(hyper_step=0.0), ValueError, "hyper_step"),
    (lambda: agp.GibbsSampling(hyper_step=float("nan")), ValueError, "hyper_step"),
    (lambda: agp.GibbsSampling(hyper_step="0.1"), ValueError, "hyper_step"),
    (lambda: agp.GibbsSampling(store_aux="yes"), TypeError, "store_aux"),
]


@pytest.mark.parametrize(("build", "error", "pattern"), INFERENCE_CASES)
def test_inference_settings_are_checked(build, error, pattern):
    with pytest.raises(error, match=pattern):
        build()


def test_valid_settings_are_kept():
    """The checks accept what they should, converted to plain numbers."""
    assert agp.QuadratureVI(n_points=np.int64(7)).n_points == 7
    assert agp.GibbsSampling(n_samples=6.0, overrelax=np.float64(-0.5)).overrelax == -0.5
    assert agp.GibbsSampling(overrelax=np.asarray(0.25)).overrelax == 0.25
    assert float(agp.AnalyticVI(step_size=1).step_size(0)) == 1.0
    assert Warmup(1e-3, 0.5, 10.0).steps == 10
    assert RobbinsMonro(1, 2).kappa == 1.0


SAMPLE_CASES = [
    ({"key": "key"}, TypeError, "key"),
    ({"key": 3}, TypeError, "key"),
    ({"key": jax.random.split(jax.random.key(0), 2)}, ValueError, "key"),
    ({"key": np.zeros(2)}, TypeError, "key"),
    ({"verbose": "yes"}, TypeError, "verbose"),
    ({"inference": agp.GibbsSampling(n_samples=2**26, n_chains=4)}, ValueError, "n_samples"),
]


@pytest.mark.parametrize(("kwargs", "error", "pattern"), SAMPLE_CASES)
def test_sample_rejects_bad_arguments(kwargs, error, pattern):
    model = agp.MCGP(K.RBF(), L.Logistic())
    with pytest.raises(error, match=pattern):
        agp.sample(model, X, Y01, **kwargs)


# --- non-finite objectives: named at the start, never returned silently ---------------------


@pytest.mark.parametrize(("build", "y", "kwargs", "listed"), [
    (lambda: agp.SGPR(K.RBF(), Z, noise=1e-300), Y, {}, "likelihood.variance = 1e-300"),
    (lambda: agp.GP(K.RBF(1e-300, 1e-300), L.Probit()), Y01, {"inference": agp.Laplace()},
     "kernel.lengthscale = 1e-300, kernel.variance = 1e-300"),
])
def test_non_finite_start_names_the_model_and_its_hyperparameters(build, y, kwargs, listed):
    model = build()
    pattern = (rf"^model: the objective .*not finite at the initial hyperparameters of "
               rf"{type(model).__name__} \(.*{re.escape(listed)}")
    with pytest.raises(ValueError, match=pattern):
        agp.fit(model, X, y, max_iter=5, **kwargs)


def _finite_leaves(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf)))
               for leaf in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_inexact_array)))


def test_adam_never_returns_nan_parameters():
    """The issue's report: Adam on this Laplace GP returned a NaN lengthscale. The first
    update makes the parameters non-finite, so the initial state is the last finite one."""
    model = agp.GP(K.RBF(1e-300, 1e-300), L.Probit())
    with pytest.warns(RuntimeWarning, match=r"non-finite at iteration 1\b"):
        post = agp.fit(model, X, Y01, agp.Laplace(), optimizer="adam", max_iter=5)
    fitted = post.model
    assert _finite_leaves(fitted)
    np.testing.assert_array_equal(fitted.kernel.lengthscale.raw, model.kernel.lengthscale.raw)
    assert post.history.n_iter == 1 and np.all(np.isfinite(post.history.objective))
    assert "non-finite at iteration 1" in post.history.message and not post.history.converged


class _Line(eqx.Module):
    a: object


def _trap(model):
    """-a, finite everywhere, whose gradient is NaN for a > 2.5 (the untaken branch of the
    where has an infinite derivative): Adam at rate 1 moves a by ~1 per step, so the state
    after 3 updates (a ~ 3) is the last finite one and the 4th update makes a NaN."""
    a = model.a.value
    return -a + jnp.where(a > 2.5, 0.0, 0.0 * jnp.sqrt(2.5 - a))


@pytest.mark.parametrize(("max_iter", "chunk_size"), [(4, 4), (4, 2), (10, 50), (10, 3)])
def test_minimize_keeps_the_last_finite_state(max_iter, chunk_size):
    """Wherever the non-finite update falls (the last of a chunk, inside a chunk), the
    returned state is the one after 3 updates, as a run of exactly 3 updates returns."""
    start = _Line(real(0.0))
    opt = optax.adam(1.0)
    ref, ref_hist = minimize(_trap, start, optimizer=opt, max_iter=3, tol=0.0)
    assert np.isfinite(float(ref.a.value)) and ref_hist.message == "max_iter reached"
    with pytest.warns(RuntimeWarning, match=r"non-finite at iteration 4\b"):
        got, hist = minimize(_trap, start, optimizer=opt, max_iter=max_iter, tol=0.0,
                             chunk_size=chunk_size)
    assert float(got.a.value) == float(ref.a.value)
    assert hist.n_iter == 4 and np.all(np.isfinite(hist.objective))
    np.testing.assert_array_equal(hist.objective[:3], ref_hist.objective)
    assert hist.objective[-1] == pytest.approx(-float(ref.a.value))
    assert "non-finite at iteration 4" in hist.message
