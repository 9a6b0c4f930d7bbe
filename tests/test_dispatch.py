"""``fit`` dispatches on (model type, inference type): a pair defined outside the package
plugs in without editing it; ``Plan`` reproduces what the estimators fit; every history
says how its fit ended."""

from __future__ import annotations

import ast
import inspect

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import augmentedgp as agp
import augmentedgp.training.fit as fit_module
from augmentedgp.sklearn import GPClassifier, GPRegressor
from augmentedgp.training import FitSettings, register, register_default


class ToyModel(eqx.Module):
    """A model of one number: y_i ~ N(c, 1)."""

    c: float = 0.0


class ToyMean(eqx.Module):
    """Its inference: the sample mean (the maximum-likelihood estimate of c)."""

    shrink: float = 1.0


class ToyPosterior(eqx.Module):
    c: jnp.ndarray
    history: object = eqx.field(static=True, default=None)


@register(ToyModel, ToyMean)
def _train_toy(model, X, y, inference, settings):
    settings.reject("n_restarts", why="is not used by ToyMean")
    c = inference.shrink * jnp.mean(jnp.asarray(y))
    return ToyPosterior(c, agp.History(np.array([0.0]), np.zeros(1), "converged", "closed form"))


@register_default(ToyModel)
def _toy_default(model):
    return ToyMean(0.5)


def test_a_model_and_inference_from_outside_plug_in():
    """The toy pair registered above (this file is outside the package): fit finds its
    training, its default inference, and hands it the checked settings."""
    X, y = np.zeros((4, 1)), np.array([1.0, 2.0, 3.0, 6.0])
    post = agp.fit(ToyModel(), X, y, ToyMean())
    assert float(post.c) == 3.0 and post.history.status == "converged"
    assert float(agp.fit(ToyModel(), X, y).c) == 1.5  # the registered default: ToyMean(0.5)
    with pytest.raises(ValueError, match="n_restarts is not used by ToyMean"):
        agp.fit(ToyModel(), X, y, n_restarts=2)
    with pytest.raises(ValueError, match="max_iter"):  # checked once, before dispatch
        agp.fit(ToyModel(), X, y, max_iter=-1)


class ToySubclass(ToyMean):
    pass


def test_lookup_follows_subclasses_and_names_what_exists():
    """A subclass of a registered inference uses its base's training; an unregistered pair
    is a ValueError naming the inferences the model has; an unknown model a TypeError."""
    X, y = np.zeros((2, 1)), np.array([1.0, 3.0])
    assert float(agp.fit(ToyModel(), X, y, ToySubclass()).c) == 2.0
    with pytest.raises(ValueError, match="ToyModel is not trained by QuadratureVI; it is by "
                                         "ToyMean"):
        agp.fit(ToyModel(), X, y, agp.QuadratureVI())
    with pytest.raises(TypeError, match="fit supports .*GP.*got ToyPosterior"):
        agp.fit(ToyPosterior(jnp.zeros(())), X, y)
    with pytest.raises(ValueError, match="SVGP is not trained by Exact"):
        agp.fit(agp.SVGP(agp.kernels.RBF(), agp.likelihoods.Logistic(), np.eye(2)[:, :1]),
                X, np.array([0.0, 1.0]), agp.Exact())


def test_fit_switches_on_no_type():
    """fit.py hands over to the registry: no isinstance over model or inference types."""
    tree = ast.parse(inspect.getsource(fit_module))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) in ("isinstance", "issubclass", "type")]
    assert calls == []


def test_settings_reject_only_what_was_given():
    s = FitSettings.check(max_iter=10, hyper_every=2)
    s.reject("n_restarts", "validation_data", why="unused")  # at their defaults: fine
    with pytest.raises(ValueError, match="^hyper_every unused$"):
        s.reject("n_restarts", "hyper_every", why="unused")


def _nll(est, X, y):
    return -float(np.mean(est.log_predictive_density(X, y)))


@pytest.mark.parametrize("kind, n_inducing, minibatch", [
    ("classifier", "auto", False), ("classifier", 20, True),
    ("regressor", "auto", False), ("regressor", 30, False)])
def test_plan_reproduces_the_estimators(monkeypatch, kind, n_inducing, minibatch):
    """agp.fit(VGP(kernel, likelihood), X, y, Plan()) on standardised data is the
    estimator's fit: the same model type and test NLL to 1e-6. Classifier: SVGP (150 > 100
    points) on the full batch, and minibatches then the full-batch finish (the size
    thresholds lowered); regressor: the exact GP and SGPR."""
    if minibatch:
        monkeypatch.setattr(agp.inference.plan, "FULL_BATCH_MAX", 100)
        monkeypatch.setattr(agp.inference.plan, "AUTO_BATCH", 50)
    n = 150
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n + 100, 2))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    if kind == "classifier":
        y = (f + 0.3 * rng.normal(size=n + 100) > 0).astype(float)
        est = GPClassifier(n_inducing=n_inducing, random_state=0, max_iter=40)
        lik = agp.likelihoods.Logistic()
    else:
        y = f + 0.2 * rng.normal(size=n + 100)
        y = (y - y[:n].mean()) / y[:n].std()
        est = GPRegressor(n_inducing=n_inducing, random_state=0, normalize_y=False,
                          max_iter=30)
        lik = agp.likelihoods.Gaussian(0.1)
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    est.fit(Xtr, ytr)
    s = agp.datasets.Standardizer(Xtr)
    kernel = agp.kernels.RBF(lengthscale=np.full(2, np.sqrt(2.0)), variance=1.0)
    post = agp.fit(agp.VGP(kernel, lik), s.transform(Xtr), ytr,
                   agp.Plan(n_inducing=n_inducing), key=est_key(est), max_iter=est.max_iter)
    assert type(post.model) is type(est.posterior_.model)
    assert est.sparse_ == (kind == "classifier" or n_inducing == 30)
    assert post.history.status == est.history_.status
    assert ("full-batch iterations" in post.history.message) == minibatch  # the finish ran
    ref = _nll(est, Xte, yte) if kind == "regressor" else -np.mean(np.log(
        est.predict_proba(Xte)[np.arange(100), yte.astype(int)]))
    got = -float(np.mean(post.predict_log_density(s.transform(Xte), yte)))
    assert abs(got - ref) < 1e-6, (got, ref)


def est_key(est):
    """The key the estimator draws from its random_state."""
    import jax
    from sklearn.utils import check_random_state

    return jax.random.key(int(check_random_state(est.random_state).randint(2**31 - 1)))
