"""The scikit-learn estimators (augmentedgp.sklearn): scikit-learn's own estimator checks,
Pipeline / GridSearchCV / cross_val_score, and oracles that can fail -- scikit-learn's
GaussianProcessRegressor (log marginal likelihood, hyperparameters, predictions), Monte
Carlo predictive quantiles of every likelihood, the coverage of the predictive interval on
data from the model, predict_proba against the fitted posterior, D^2 by hand, augmented
against quadrature VI, the sparse switch and random_state.

Cost. JAX compiles a model anew for each training-set shape and every scikit-learn check
builds its own data, so the full check list costs 2-10 s a check, ~4-5 min for the three
estimators (measured: 285 s of CPU, 150 s of it GPClassifier's). The reduced run (the
default) runs, for every estimator, the checks that fit nothing (API, tags, errors raised
before fitting: ~0 s), the training check (check_classifiers_train / check_regressors_train)
and the six checks that train on one (20, 3) set (subset and sample-order invariance, 1-d
predict, parameter immutability, ...: one compilation); for GPRegressor, the cheapest to
compile, also those on one (30, 3) set (pickling, pipeline consistency, 2-d y) and NaN/inf,
idempotence and n_features_in_. What the reduced run skips for the other two is tested
below on this module's few shapes (pickling, pipelines, 2-d y, wrong n_features, NaN,
random_state), with fitted estimators shared through module-scoped fixtures; the (20, 3)
three-class fit is shared with the checks. AGP_FULL_SLOW=1 runs every check on every
estimator.
"""

from __future__ import annotations

import pickle
import types
import warnings

import numpy as np
import pytest
import scipy.stats as st
from conftest import FULL, load_shared
from scipy.special import expit
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning, NotFittedError
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
from sklearn.metrics import d2_tweedie_score, r2_score
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import augmentedgp as agp
import augmentedgp.inference.plan as agp_plan
import augmentedgp.training.planned as agp_planned
from augmentedgp import likelihoods as lik
from augmentedgp.core.loop import History
from augmentedgp.inference import AnalyticSVI, AnalyticVI, QuadratureSVI, QuadratureVI
from augmentedgp.sklearn import GPClassifier, GPCountRegressor, GPRegressor
from augmentedgp.variational import CholeskyQ, NaturalQ

# --- scikit-learn's estimator checks ----------------------------------------------------

# checks that fit nothing: the API, the tags, and errors raised before fitting (~0 s each)
NO_FIT = {
    "check_estimator_cloneable", "check_estimator_tags_renamed", "check_valid_tag_types",
    "check_estimator_repr", "check_no_attributes_set_in_init", "check_estimators_unfitted",
    "check_do_not_raise_errors_in_init_or_set_params", "check_mixin_order",
    "check_complex_data", "check_estimators_empty_data_messages", "check_estimator_sparse_tag",
    "check_estimator_sparse_array", "check_estimator_sparse_matrix", "check_array_api_input",
    "check_classifiers_one_label", "check_classifiers_one_label_sample_weights",
    "check_estimators_partial_fit_n_features", "check_classifiers_regression_target",
    "check_supervised_y_no_nan", "check_decision_proba_consistency",
    "check_parameters_default_constructible", "check_fit2d_1sample",
    "check_get_params_invariance", "check_set_params", "check_fit1d", "check_requires_y_none",
}
# checks that all train on one (20, 3) set (the classifier's has 3 classes): one compilation
SHAPE_20x3 = {
    "check_dont_overwrite_parameters", "check_f_contiguous_array_estimator",
    "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_dict_unchanged", "check_fit2d_predict1d",
}
# checks that train on one (30, 3) set
SHAPE_30x3 = {
    "check_estimators_pickle", "check_estimators_pickle(readonly_memmap=True)",
    "check_pipeline_consistency",
}
REDUCED = {
    "GPRegressor": SHAPE_20x3 | SHAPE_30x3 | {
        "check_regressors_train", "check_regressors_train(readonly_memmap=True)",
        "check_regressors_train(readonly_memmap=True,X_dtype=float32)",
        "check_fit_score_takes_y", "check_supervised_y_2d",  # (30, 3) too
        "check_estimators_nan_inf", "check_fit_idempotent", "check_n_features_in_after_fitting",
    },
    "GPClassifier": SHAPE_20x3 | {"check_classifiers_train"},
    "GPCountRegressor": SHAPE_20x3 | {"check_regressors_train"},
}
REDUCED_REASON = ("reduced run: compilation makes the full list ~5 min (AGP_FULL_SLOW=1 runs "
                  "every scikit-learn check on every estimator)")


def _check_id(check):
    """A check's name with its keyword arguments, as in its pytest id."""
    func = getattr(check, "func", check)
    kw = getattr(check, "keywords", None) or {}
    return func.__name__ + ("(" + ",".join(f"{k}={v}" for k, v in kw.items()) + ")" if kw else "")


@parametrize_with_checks([GPRegressor(), GPClassifier(), GPCountRegressor()])
def test_sklearn_estimator_checks(estimator, check):
    name = _check_id(check)
    if not (FULL or name.split("(")[0] in NO_FIT or name in REDUCED[type(estimator).__name__]):
        pytest.skip(REDUCED_REASON)
    check(estimator)


def test_reduced_check_names_exist():
    """The reduced lists name real checks (a renamed check would silently drop out)."""
    from sklearn.utils.estimator_checks import estimator_checks_generator

    for est in (GPRegressor(), GPClassifier(), GPCountRegressor()):
        names = {_check_id(c) for _, c in estimator_checks_generator(est, mark="skip")}
        assert REDUCED[type(est).__name__] <= names
        assert len(NO_FIT & {n.split("(")[0] for n in names}) >= 20


# --- data and module-scoped fitted estimators --------------------------------------------

N_REG = 80  # regression and count training sets: one compiled shape (80, 1) per likelihood
N_CLF = 60  # classification training sets, 30 per class: 3-fold CV trains on 40
XQ = np.array([[-2.0], [0.3], [2.9], [6.0]])  # query points; 6.0 is far outside the data
# test inputs of the shapes of the cross-validation folds' test sets (one compiled
# prediction per shape): 40 regression points, 20 classification points
XT = np.linspace(-4.0, 6.0, 40)[:, None]
INSIDE = np.abs(XT[:, 0]) <= 3.0  # the test points within the training inputs' range
XC = np.random.default_rng(5).normal(size=(20, 2))
LEVELS = np.array([0.025, 0.1, 0.5, 0.9, 0.975])
N_MC = 1_000_000


def _gp_draw(x, rng, lengthscale=0.8):
    """A draw of f ~ GP(0, RBF(lengthscale)) at the points x (n,)."""
    K = np.exp(-0.5 * np.subtract.outer(x, x) ** 2 / lengthscale**2) + 1e-9 * np.eye(len(x))
    return np.linalg.cholesky(K) @ rng.normal(size=len(x))


def _gauss_y(f, rng):
    return 2.0 + 1.5 * f + 0.3 * rng.normal(size=f.shape)


@pytest.fixture(scope="module")
def reg_data():
    """X (80, 1) uniform on [-3, 3] and f drawn from a GP at X and XT; Gaussian y,
    Student-t y, Poisson counts, negative binomial counts at X (and *_test at XT)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3.0, 3.0, (N_REG, 1))
    f_all = _gp_draw(np.concatenate([X[:, 0], XT[:, 0]]), rng)
    f, f_test = f_all[:N_REG], f_all[N_REG:]
    return types.SimpleNamespace(
        X=X, f=f, f_test=f_test, y=_gauss_y(f, rng), y_test=_gauss_y(f_test, rng),
        y_t=2.0 + 1.5 * f + 0.3 * rng.standard_t(3.0, N_REG),
        counts=rng.poisson(np.exp(0.5 + f)).astype(float),
        counts_test=rng.poisson(np.exp(0.5 + f_test)).astype(float),
        nb_counts=rng.negative_binomial(2.0, expit(-(0.5 + f))).astype(float))


@pytest.fixture(scope="module")
def gauss(reg_data):
    return GPRegressor(random_state=0).fit(reg_data.X, reg_data.y)


@pytest.fixture(scope="module")
def student(reg_data):
    return GPRegressor("student_t", random_state=0).fit(reg_data.X, reg_data.y_t)


@pytest.fixture(scope="module")
def laplace(reg_data):
    return GPRegressor("laplace", random_state=0).fit(reg_data.X, reg_data.y_t)


@pytest.fixture(scope="module")
def poisson(reg_data):
    return GPCountRegressor(random_state=0).fit(reg_data.X, reg_data.counts)


@pytest.fixture(scope="module")
def negbin(reg_data):
    return GPCountRegressor("negative_binomial", random_state=0).fit(reg_data.X,
                                                                     reg_data.nb_counts)


def _clf_labels(X, rng=None):
    """Class 1 above a nonlinear boundary (with label noise when rng is given)."""
    score = np.sin(2.0 * X[:, 0]) + X[:, 1]
    if rng is None:
        return (score > 0.0).astype(int)
    score = score + 0.5 * rng.normal(size=len(X))
    return (score > np.median(score)).astype(int)  # 30 / 30


@pytest.fixture(scope="module")
def clf_data():
    """Two classes of 30 on a noisy nonlinear boundary in 2-D."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_CLF, 2))
    return X, _clf_labels(X, rng)


@pytest.fixture(scope="module")
def clf(clf_data):
    return GPClassifier(random_state=0).fit(*clf_data)


@pytest.fixture(scope="module")
def clf_quadrature(clf_data):
    return GPClassifier(inference="quadrature", random_state=0).fit(*clf_data)


@pytest.fixture(scope="module")
def clf3():
    """Three classes on a (20, 3) set -- the shape of scikit-learn's checks that train
    on (20, 3), whose compiled model this fit shares."""
    rng = np.random.default_rng(9)
    centres = np.array([[2.0, 0.0, 0.0], [-1.0, 2.0, 0.0], [-1.0, -2.0, 0.0]])
    y = np.arange(20) % 3
    X = centres[y] + 0.7 * rng.normal(size=(20, 3))
    labels = np.array(["setosa", "versicolor", "virginica"])
    return types.SimpleNamespace(X=X, y=labels[y],
                                 est=GPClassifier(random_state=0).fit(X, labels[y]))


@pytest.fixture(scope="module")
def shuttle():
    """An easy real binary slice: shuttle states 0 and 3, raw (unscaled) inputs, 30 + 30
    to train on and 10 + 10 to test."""
    data = load_shared("shuttle")
    X, y = data["X"], data["y"]
    rng = np.random.default_rng(0)
    idx = [rng.choice(np.flatnonzero(y == c), 40, replace=False) for c in (0, 3)]
    train = rng.permutation(np.concatenate([i[:30] for i in idx]))
    test = np.concatenate([i[30:] for i in idx])
    est = GPClassifier(random_state=0).fit(X[train], y[train])
    return types.SimpleNamespace(est=est, X=X[train], y=y[train], X_test=X[test],
                                 y_test=y[test])


def _latent_draws(est, X, n, rng):
    """n draws of the latent f at each row of X from the fitted q(f): (n, len(X))."""
    mean, var = est.posterior_.predict_f(est._scaler.transform(X))
    mean, var = np.asarray(mean), np.asarray(var)
    return mean + np.sqrt(var) * rng.standard_normal((n, len(mean)))


# --- regression: scikit-learn's GaussianProcessRegressor, quantiles, coverage ------------


def test_gaussian_matches_sklearn_gpr(gauss, reg_data):
    """Type-II ML with an ARD RBF kernel and Gaussian noise on standardised X and y is
    sklearn's ConstantKernel * RBF + WhiteKernel with normalize_y: the same optimum."""
    X, y = reg_data.X, reg_data.y
    assert not gauss.sparse_ and type(gauss.posterior_.model) is agp.GP
    Xs = gauss._scaler.transform(X)
    np.testing.assert_allclose(Xs, (X - X.mean(0)) / X.std(0), rtol=1e-12)
    kernel = ConstantKernel(1.0) * RBF(np.ones(1)) + WhiteKernel(0.1)
    ref = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=2,
                                   random_state=0).fit(Xs, y)
    lml, lml_ref = gauss.posterior_.log_marginal_likelihood(), ref.log_marginal_likelihood_value_
    assert lml >= lml_ref - 1e-6  # both are local optima of the same function
    assert lml - lml_ref < 1e-4
    post = gauss.posterior_
    ours = [float(post.kernel.variance.value), float(np.ravel(post.kernel.lengthscale.value)[0]),
            float(post.likelihood.variance.value)]
    theirs = [ref.kernel_.k1.k1.constant_value, float(np.ravel(ref.kernel_.k1.k2.length_scale)[0]),
              ref.kernel_.k2.noise_level]
    np.testing.assert_allclose(ours, theirs, rtol=1e-2)
    mean, sd = gauss.predict(XT, return_std=True)  # of y: latent + noise, like sklearn's
    mean_ref, sd_ref = ref.predict(gauss._scaler.transform(XT), return_std=True)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-3, atol=1e-3 * np.std(y))
    np.testing.assert_allclose(sd, sd_ref, rtol=1e-3)
    y_test = reg_data.y_test
    assert gauss.score(XT, y_test) == pytest.approx(r2_score(y_test, mean), rel=1e-12)
    assert r2_score(2.0 + 1.5 * reg_data.f_test[INSIDE], mean[INSIDE]) > 0.95


def test_gaussian_predictive_closed_form(gauss):
    """predict's sd is sqrt(var f + s^2) unscaled; the interval is mean -+ z sd; the log
    predictive density is the normal log density."""
    mean_f, var_f = gauss.posterior_.predict_f(gauss._scaler.transform(XQ))
    noise = float(gauss.posterior_.likelihood.variance.value)
    mean, sd = gauss.predict(XQ, return_std=True)
    np.testing.assert_allclose(mean, np.asarray(mean_f) * gauss._y_scale_ + gauss._y_shift,
                               rtol=1e-12)
    np.testing.assert_allclose(sd, np.sqrt(np.asarray(var_f) + noise) * gauss._y_scale_,
                               rtol=1e-12)
    lo, hi = gauss.predict_interval(XQ, 0.95)
    z = st.norm.ppf(0.975)
    assert np.all(np.abs(lo - (mean - z * sd)) <= 1e-6 * sd)
    assert np.all(np.abs(hi - (mean + z * sd)) <= 1e-6 * sd)
    lo90, hi90 = gauss.predict_interval(XQ, 0.9)
    assert np.all((lo < lo90) & (hi90 < hi))
    q = gauss.predict_quantiles(XQ, [0.1, 0.5, 0.975])
    np.testing.assert_allclose(q[:, 1], mean, rtol=1e-9)
    np.testing.assert_allclose(q[:, 2], hi, rtol=1e-9)
    y = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(gauss.log_predictive_density(XQ, y),
                               st.norm.logpdf(y, mean, sd), rtol=1e-9)


@pytest.mark.parametrize("name", ["gaussian", "student_t", "laplace"])
def test_quantiles_match_monte_carlo(name, request):
    """predict_quantiles against 1e6 draws of y = f + noise, f ~ q(f) and the fitted noise:
    the Monte Carlo CDF at each predicted quantile is its level (to 5 binomial standard
    errors) and the quantiles agree with the empirical ones to 1e-2 of the 95% range. XQ
    has points where q(f) is narrower and wider than the noise (both integration paths)."""
    est = request.getfixturevalue({"gaussian": "gauss", "student_t": "student",
                                   "laplace": "laplace"}[name])
    rng = np.random.default_rng(1)
    f = _latent_draws(est, XQ, N_MC, rng)
    lk = est.posterior_.likelihood
    if name == "gaussian":
        e = np.sqrt(float(lk.variance.value)) * rng.standard_normal(f.shape)
    elif name == "student_t":
        assert float(lk.df.value) == 4.0  # the estimator's df, fixed
        e = float(lk.scale.value) * rng.standard_t(float(lk.df.value), f.shape)
    else:
        e = rng.laplace(0.0, float(lk.scale.value), f.shape)
    y = (f + e) * est._y_scale_ + est._y_shift
    _, var_f = est.posterior_.predict_f(est._scaler.transform(XQ))
    assert np.sqrt(float(np.min(var_f))) < 0.5 * float(np.std(e))  # a noise-dominated point
    assert np.sqrt(float(np.max(var_f))) > float(np.std(e))  # and a latent-dominated one
    q = est.predict_quantiles(XQ, LEVELS)
    assert q.shape == (len(XQ), len(LEVELS)) and np.all(np.diff(q, axis=1) > 0)
    cdf = np.stack([np.mean(y <= q[:, j], axis=0) for j in range(len(LEVELS))], axis=1)
    se = np.sqrt(LEVELS * (1.0 - LEVELS) / N_MC)
    assert np.all(np.abs(cdf - LEVELS) < 5.0 * se), cdf - LEVELS
    q_mc = np.quantile(y, LEVELS, axis=0).T
    width = q_mc[:, -1] - q_mc[:, 0]
    assert np.all(np.abs(q - q_mc) < 1e-2 * width[:, None])
    lo, hi = est.predict_interval(XQ, 0.95)
    np.testing.assert_allclose(np.stack([lo, hi], 1), q[:, [0, -1]], rtol=1e-12)
    # predict: E[y] and sd(y) = sqrt(var f + var noise), unscaled
    mean, sd = est.predict(XQ, return_std=True)
    np.testing.assert_allclose(mean, y.mean(0), atol=5.0 * float(np.max(y.std(0))) / 1e3)
    noise_var = {"gaussian": lambda: float(lk.variance.value),
                 "student_t": lambda: float(lk.scale.value) ** 2 * 4.0 / (4.0 - 2.0),
                 "laplace": lambda: 2.0 * float(lk.scale.value) ** 2}[name]()
    np.testing.assert_allclose(sd, np.sqrt(np.asarray(var_f) + noise_var) * est._y_scale_,
                               rtol=1e-6)


def test_gaussian_interval_coverage():
    """On data drawn from the model (a GP with known noise), the 95% interval covers 95%
    of held-out targets: 40 independent draws, 80 training and 40 test points each (the
    plug-in hyperparameters under-cover by ~0.5% at n = 80, measured)."""
    rng = np.random.default_rng(2)
    hits = []
    for _ in range(40):
        X = rng.uniform(-3.0, 3.0, (N_REG + len(XT), 1))
        y = _gauss_y(_gp_draw(X[:, 0], rng), rng)
        lo, hi = GPRegressor().fit(X[:N_REG], y[:N_REG]).predict_interval(X[N_REG:])
        hits.append(np.mean((lo <= y[N_REG:]) & (y[N_REG:] <= hi)))
    se = np.sqrt(0.95 * 0.05 / (40 * len(XT)))
    assert abs(np.mean(hits) - 0.95) < 4.0 * se, np.mean(hits)


def test_student_t_and_laplace_robust(reg_data, student, laplace, gauss):
    """The robust likelihoods use augmented VI on the full model and track f as well as
    the Gaussian model does on heavy-tailed (Student-t) noise."""
    truth = 2.0 + 1.5 * reg_data.f_test[INSIDE]
    for est in (student, laplace):
        assert not est.sparse_ and type(est.posterior_.model) is agp.VGP
        assert isinstance(est.posterior_.model.q, NaturalQ)  # augmented (natural) updates
        assert r2_score(truth, est.predict(XT)[INSIDE]) > 0.9
    assert isinstance(student.posterior_.likelihood, lik.StudentT)
    assert isinstance(laplace.posterior_.likelihood, lik.Laplace)


# --- counts ------------------------------------------------------------------------------


def _count_dist(est, f):
    lk = est.posterior_.likelihood
    if isinstance(lk, lik.Poisson):
        return st.poisson(np.exp(f))
    return st.nbinom(float(lk.r.value), expit(-f))  # mean r e^f


@pytest.mark.parametrize("name", ["poisson", "negative_binomial"])
def test_count_quantiles(name, request, reg_data):
    """The predicted quantile at level p is the smallest count k with P(y <= k) >= p:
    against the Monte Carlo CDF of 1e6 draws (to 5 binomial standard errors) and against
    the CDF integrated over q(f) by 200-node Gauss-Hermite (to 1e-6, ties allowed)."""
    est = request.getfixturevalue({"poisson": "poisson", "negative_binomial": "negbin"}[name])
    rng = np.random.default_rng(4)
    f = _latent_draws(est, XQ, N_MC, rng)
    lk = est.posterior_.likelihood
    if name == "poisson":
        assert isinstance(lk, lik.Poisson) and lk.binsize == 1.0
        y = rng.poisson(np.exp(f))
    else:
        assert isinstance(lk, lik.NegativeBinomial)
        y = rng.negative_binomial(float(lk.r.value), expit(-f))
    q = est.predict_quantiles(XQ, LEVELS)
    assert np.all(q == np.round(q)) and np.all(q >= 0) and np.all(np.diff(q, axis=1) >= 0)
    se = np.sqrt(LEVELS * (1.0 - LEVELS) / N_MC)
    for j, level in enumerate(LEVELS):
        assert np.all(np.mean(y <= q[:, j], axis=0) >= level - 5.0 * se[j])
        assert np.all(np.mean(y <= q[:, j] - 1, axis=0) < level + 5.0 * se[j])
    x, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / np.sqrt(2.0 * np.pi)
    mean, var = est.posterior_.predict_f(est._scaler.transform(XQ))
    nodes = np.asarray(mean)[:, None] + np.sqrt(np.asarray(var))[:, None] * x
    dist = _count_dist(est, nodes)
    for j, level in enumerate(LEVELS):
        assert np.all(np.sum(w * dist.cdf(q[:, j : j + 1]), axis=1) >= level - 1e-6)
        assert np.all(np.sum(w * dist.cdf(q[:, j : j + 1] - 1), axis=1) < level + 1e-6)
    # predict is the predictive mean E[y] of the same distribution
    np.testing.assert_allclose(est.predict(XQ), y.mean(0), atol=5.0 * float(y.std(0).max())
                               / np.sqrt(N_MC), rtol=1e-3)
    assert not est.sparse_ and type(est.posterior_.model) is agp.VGP


def test_count_score_is_poisson_d2(poisson, reg_data):
    """score is D^2, the fraction of Poisson deviance explained (here of held-out counts
    at XT; those beyond the data are poorly predicted)."""
    X, y = XT, reg_data.counts_test
    mu = poisson.predict(X)

    def deviance(m):
        return 2.0 * np.sum(np.where(y > 0, y * np.log(np.where(y > 0, y, 1.0) / m), 0.0)
                            - (y - m))

    d2 = 1.0 - deviance(mu) / deviance(np.full_like(y, y.mean()))
    assert poisson.score(X, y) == pytest.approx(d2, rel=1e-9)
    assert poisson.score(X, y) == pytest.approx(d2_tweedie_score(y, mu, power=1), rel=1e-12)
    assert d2_tweedie_score(y[INSIDE], mu[INSIDE], power=1) > 0.5  # within the data
    # and the fitted rate tracks the true one there
    assert np.corrcoef(np.log(mu[INSIDE]), 0.5 + reg_data.f_test[INSIDE])[0, 1] > 0.9


def test_count_targets(poisson, reg_data):
    """Negative targets are refused; non-integer non-negative ones accepted (like
    PoissonRegressor), giving a nearby fit."""
    X, y = reg_data.X, reg_data.counts
    with pytest.raises(ValueError, match="non-negative"):
        GPCountRegressor().fit(X, y - 1.0)
    est = GPCountRegressor(random_state=0).fit(X, y + 0.25)
    assert np.all(np.isfinite(est.predict(XQ)))
    np.testing.assert_allclose(est.predict(XT), poisson.predict(XT) + 0.25, rtol=0.3,
                               atol=0.3)


# --- classification ----------------------------------------------------------------------


def test_classifier_binary(clf):
    Xt = XC
    p = clf.predict_proba(Xt)
    assert p.shape == (len(Xt), 2) and np.all((p > 0) & (p < 1))
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(clf.classes_, [0, 1])
    np.testing.assert_array_equal(clf.predict(Xt), clf.classes_[np.argmax(p, axis=1)])
    np.testing.assert_allclose(clf.predict_log_proba(Xt), np.log(p), rtol=1e-12)
    post = clf.posterior_
    p1 = np.asarray(post.likelihood.predict_proba(*post.predict_f(clf._scaler.transform(Xt))))
    np.testing.assert_allclose(p[:, 1], p1, rtol=1e-12)
    assert clf.score(Xt, _clf_labels(Xt)) >= 0.8  # held out, against the noise-free boundary
    assert not clf.sparse_ and type(post.model) is agp.VGP
    assert clf.n_iter_ == len(clf.history_.objective) <= 500


def test_classifier_augmented_against_quadrature(clf, clf_quadrature):
    """The default binary fit is Polya-Gamma augmented VI; its ELBO is above its augmented
    bound and close to (not above) the ELBO of quadrature VI on the same data, and the two
    fits predict alike (the augmented fit tunes the hyperparameters on the augmented bound,
    which ends 0.7 nat lower on these 60 points, measured)."""
    aug, quad = clf.posterior_, clf_quadrature.posterior_
    assert isinstance(aug.likelihood, lik.Logistic)
    assert isinstance(aug.model.q, NaturalQ) and isinstance(quad.model.q, CholeskyQ)
    elbo, bound, elbo_quad = aug.elbo(), aug.elbo(augmented=True), quad.elbo()
    assert bound <= elbo
    assert elbo <= elbo_quad + 0.1
    assert elbo >= elbo_quad - 2.0
    # the training objective of the augmented fit was the augmented bound
    assert -clf.history_.objective[-1] == pytest.approx(bound, abs=0.05)
    pa, pq = clf.predict_proba(XC)[:, 1], clf_quadrature.predict_proba(XC)[:, 1]
    assert np.max(np.abs(pa - pq)) < 0.2 and np.mean(np.abs(pa - pq)) < 0.05
    assert np.mean((pa > 0.5) == (pq > 0.5)) >= 0.9


def test_classifier_labels(clf, clf_data):
    """Any label set: the fit depends only on the label order (the same probabilities for
    strings, [3, 7] and [-1, 1]); swapping the two labels mirrors the posterior. A column
    y warns and gives the same fit."""
    X, y = clf_data
    Xt = XC
    p = clf.predict_proba(Xt)
    for labels in (np.array(["no", "yes"]), np.array([3, 7]), np.array([-1, 1])):
        est = GPClassifier(random_state=0).fit(X, labels[y])
        np.testing.assert_array_equal(est.classes_, labels)
        np.testing.assert_allclose(est.predict_proba(Xt), p, rtol=1e-8, atol=1e-10)
        np.testing.assert_array_equal(est.predict(Xt), labels[clf.predict(Xt)])
        assert est.predict(Xt).dtype == labels.dtype
    flipped = GPClassifier(random_state=0).fit(X, np.array([7, 3])[y])  # class 1 is now 3
    np.testing.assert_array_equal(flipped.classes_, [3, 7])
    np.testing.assert_allclose(flipped.predict_proba(Xt), p[:, ::-1], rtol=1e-6, atol=1e-8)
    with pytest.warns(DataConversionWarning):
        column = GPClassifier(random_state=0).fit(X, y[:, None])
    np.testing.assert_allclose(column.predict_proba(Xt), p, rtol=1e-8, atol=1e-10)


def test_classifier_multiclass(clf3):
    """3 classes (string labels): the logistic-softmax likelihood with augmented VI on the
    full model; probabilities from the posterior, rows summing to 1, predict their argmax."""
    est = clf3.est
    np.testing.assert_array_equal(est.classes_, ["setosa", "versicolor", "virginica"])
    post = est.posterior_
    assert isinstance(post.likelihood, lik.LogisticSoftmax) and not est.sparse_
    assert post.likelihood.num_latent == 3 and isinstance(post.model.q, NaturalQ)
    p = est.predict_proba(clf3.X)
    assert p.shape == (20, 3) and np.all((p > 0) & (p < 1))
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    ref = np.asarray(post.likelihood.predict_proba(*post.predict_f(est._scaler.transform(
        clf3.X))))
    np.testing.assert_allclose(p, ref / ref.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(ref.sum(1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(est.predict(clf3.X), est.classes_[np.argmax(p, axis=1)])
    assert est.score(clf3.X, clf3.y) >= 0.9  # well-separated clusters


def test_classifier_real_slice_pipeline_grid_search_cross_val(shuttle):
    """An easy real slice (raw inputs): high held-out accuracy; in a Pipeline behind a
    StandardScaler (which changes nothing: the estimator standardises X itself), in
    GridSearchCV and in cross_val_score."""
    est, X, y = shuttle.est, shuttle.X, shuttle.y
    assert not est.sparse_ and isinstance(est.posterior_.model.q, NaturalQ)
    assert est.score(shuttle.X_test, shuttle.y_test) >= 0.9
    pipe = make_pipeline(StandardScaler(), GPClassifier(random_state=0)).fit(X, y)
    np.testing.assert_allclose(pipe.predict_proba(shuttle.X_test),
                               est.predict_proba(shuttle.X_test), atol=1e-6)
    cv = StratifiedKFold(3, shuffle=True, random_state=0)  # three folds of 40 + 20
    grid = GridSearchCV(pipe, {"gpclassifier__max_iter": [50, 300]}, cv=cv).fit(X, y)
    assert grid.best_params_["gpclassifier__max_iter"] in (50, 300)
    assert grid.best_score_ >= 0.85
    best = grid.best_estimator_[-1]
    assert best.max_iter == grid.best_params_["gpclassifier__max_iter"]
    assert best.n_iter_ <= best.max_iter and best.classes_.tolist() == [0, 3]
    scores = cross_val_score(pipe, X, y, cv=cv)
    assert scores.shape == (3,) and scores.mean() >= 0.85


# --- sparse switch, minibatches, random_state --------------------------------------------


@pytest.fixture
def fake_fit(monkeypatch):
    """The library's fit replaced by a recorder, and k-means by the first M rows: the
    estimators' model choice, without training."""
    calls = []

    def fake(model, X, y, inference, settings):
        calls.append(types.SimpleNamespace(model=model, inference=inference,
                                           max_iter=settings.max_iter, y=np.asarray(y),
                                           stopping=_stopping(settings)))
        history = History(np.zeros(3), np.arange(3.0), "converged", "converged",
                          step_size=np.ones(3))
        return types.SimpleNamespace(model=model, history=history, X=X, y=y)

    monkeypatch.setattr(agp_planned, "train", fake)
    monkeypatch.setattr(agp.inducing, "kmeans", lambda X, M, key, **kw: np.asarray(X)[:M])
    return calls


def _stopping(settings):
    """The stopping rule's settings that a plan set (tol and window), as a dict."""
    return {} if settings.tol is None else {"tol": settings.tol, "window": settings.window}


def _fake_data(n, kind, d=1):
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, d))
    if kind == "classes":
        return X, np.arange(n) % 2
    if kind == "3classes":
        return X, np.arange(n) % 3
    return X, rng.poisson(2.0, n).astype(float)


@pytest.mark.parametrize("est, n, kind, model, M, inference, iters", [
    (GPRegressor(), 2000, "real", agp.GP, None, type(None), 200),
    (GPRegressor(), 2001, "real", agp.SGPR, 500, type(None), 200),
    (GPRegressor(n_inducing=None), 2001, "real", agp.GP, None, type(None), 200),
    (GPRegressor(n_inducing=30), 30, "real", agp.GP, None, type(None), 200),
    (GPRegressor(n_inducing=30, max_iter=7), 31, "real", agp.SGPR, 30, type(None), 7),
    (GPRegressor("student_t"), 100, "real", agp.VGP, None, AnalyticVI, 500),
    (GPRegressor("laplace"), 101, "real", agp.SVGP, 100, AnalyticVI, 500),
    (GPRegressor("student_t", inference="quadrature"), 50, "real", agp.VGP, None, QuadratureVI,
     500),
    (GPRegressor("laplace", batch_size=10), 101, "real", agp.SVGP, 100, AnalyticSVI, 2000),
    (GPRegressor("laplace", batch_size=200), 101, "real", agp.SVGP, 100, AnalyticVI, 500),
    (GPCountRegressor(), 100, "counts", agp.VGP, None, QuadratureVI, 500),
    (GPCountRegressor(batch_size=10), 101, "counts", agp.SVGP, 100, QuadratureSVI, 2000),
    (GPCountRegressor("negative_binomial", n_inducing=None), 300, "counts", agp.VGP, None,
     AnalyticVI, 500),
    (GPClassifier(), 100, "classes", agp.VGP, None, AnalyticVI, 500),
    (GPClassifier(max_iter=50), 101, "classes", agp.SVGP, 100, AnalyticVI, 50),
    (GPClassifier(inference="quadrature"), 30, "classes", agp.VGP, None, QuadratureVI, 500),
    (GPClassifier("probit"), 30, "classes", agp.VGP, None, QuadratureVI, 500),
    (GPClassifier(), 30, "3classes", agp.VGP, None, AnalyticVI, 500),
    (GPClassifier("softmax", n_inducing=10), 30, "3classes", agp.SVGP, 10, QuadratureVI, 500),
    (GPClassifier("robustmax"), 30, "3classes", agp.VGP, None, QuadratureVI, 500),
])
def test_model_choice(fake_fit, est, n, kind, model, M, inference, iters):
    """The sparse switch ("auto": the exact GP up to 2000 points for a Gaussian likelihood,
    500 inducing points above; 100 for the variational models; None: never sparse), the
    inference (augmented where the likelihood allows it, minibatches with batch_size < n)
    and the default iterations."""
    X, y = _fake_data(n, kind)
    est = clone(est).fit(X, y)
    (call,) = fake_fit
    assert type(call.model) is model and est.sparse_ == (M is not None)
    if M is not None:
        assert call.model.inducing.value.shape == (M, X.shape[1])
    assert type(call.inference) is inference and call.max_iter == iters
    assert est.n_iter_ == 3
    likelihood = call.model.likelihood
    if kind == "3classes":
        assert likelihood.num_latent == 3 and call.y.dtype.kind == "i"
    if isinstance(call.inference, AnalyticVI):
        assert isinstance(likelihood, agp.augmentation.Augmented)
    if type(est) is GPClassifier and est.likelihood == "logistic" and kind == "classes":
        assert isinstance(likelihood, lik.Logistic)


@pytest.mark.parametrize("est, kind, objective", [
    (GPClassifier(), "classes", "augmented"),
    (GPClassifier(batch_size=10), "classes", "augmented"),
    (GPClassifier(), "3classes", "tight"),
    (GPClassifier(batch_size=10), "3classes", "exact"),
    (GPRegressor("student_t"), "real", "tight"),
    (GPRegressor("laplace", batch_size=10), "real", "tight"),
    (GPCountRegressor("negative_binomial"), "counts", "tight"),
])
def test_augmented_objective_by_likelihood_and_batches(fake_fit, est, kind, objective):
    """The augmented fits' hyperparameter objective, the one that predicted best at the
    estimators' budgets (``plan.augmented_objective``; measurements in docs/performance.md): the
    augmented bound for binary labels, the plain ELBO's optimum ("tight") for robust
    regression, negative-binomial counts and full-batch multi-class fits, the plain ELBO at
    the augmented q(u) ("exact") for multi-class minibatches."""
    X, y = _fake_data(101, kind)
    clone(est).fit(X, y)
    (call,) = fake_fit
    assert isinstance(call.inference, AnalyticVI) and call.inference.objective == objective


@pytest.mark.parametrize("est, n, kind, batch, iters, finish", [
    (GPClassifier(), 2001, "classes", 1000, 600, AnalyticVI),  # 3 batches an epoch: 600
    (GPClassifier(), 40_000, "classes", 1000, 1200, AnalyticVI),  # 40 an epoch: 30 epochs
    (GPClassifier(), 200_000, "classes", 1000, 5000, AnalyticVI),  # capped
    (GPClassifier(max_iter=50), 2001, "classes", 1000, 50, AnalyticVI),
    (GPClassifier("softmax"), 2001, "3classes", 1000, 600, QuadratureVI),
    # objective="tight": the finish continues with its last stage, the tight sites
    (GPRegressor("student_t"), 2001, "real", 1000, 600, QuadratureVI),
    (GPCountRegressor(), 2001, "counts", 1000, 600, QuadratureVI),
    (GPClassifier(batch_size=100), 2001, "classes", 100, 2000, None),  # the user's batches
    (GPClassifier(batch_size=None), 2001, "classes", None, 500, None),  # full batch
    (GPClassifier(n_inducing=None), 2001, "classes", None, 500, None),  # VGP: full batch
    (GPClassifier(n_inducing=3000), 2001, "classes", None, 500, None),  # not sparse
])
def test_defaults_by_size(fake_fit, est, n, kind, batch, iters, finish):
    """batch_size="auto": full batch up to FULL_BATCH_MAX points; above it (sparse models)
    minibatches of AUTO_BATCH for 30 epochs (600 to 5000 iterations, or max_iter) that stop
    when the epoch-averaged objective settles, then FINISH_ITER full-batch iterations from
    that solution (by the fit's last stage); an explicit batch_size (or None) or
    n_inducing=None is used as given."""
    assert n == agp_plan.FULL_BATCH_MAX + 1 or n > agp_plan.FULL_BATCH_MAX
    X, y = _fake_data(n, kind)
    est = clone(est).fit(X, y)
    first = fake_fit[0]
    assert first.inference.batch_size == batch and first.max_iter == iters
    if batch == agp_plan.AUTO_BATCH and finish is not None:
        epoch = -(-n // batch)
        assert first.stopping == {"tol": agp_plan.SVI_TOL, "window": max(epoch, 20)}
        assert len(fake_fit) == 2
        second = fake_fit[1]
        assert type(second.inference) is finish and second.inference.batch_size is None
        if type(est) is GPRegressor:  # robust regression: the ELBO's optimum
            assert first.inference.objective == "tight"
        assert second.max_iter == agp_plan.FINISH_ITER
        assert second.model is first.model  # starts from the minibatch solution
        assert est.n_iter_ == 6 and est.history_.converged  # both stages' iterations
        np.testing.assert_array_equal(est.history_.wall_time, [0, 1, 2, 2, 3, 4])
    else:
        assert len(fake_fit) == 1 and first.stopping == {} and est.n_iter_ == 3


@pytest.mark.parametrize("finish_objective, max_iter, status", [
    ([1000.0, 999.5, 999.2], None, "converged"),  # the full-batch steps barely move
    ([1000.0, 990.0, 985.0], None, "budget"),  # they still gain 1.5%: the default budget
    ([1000.0, 990.0, 985.0], 5, "max_iter"),  # the user's max_iter: ConvergenceWarning
])
def test_auto_minibatch_convergence(monkeypatch, finish_objective, max_iter, status):
    """The default minibatch path has converged when its minibatch stage did, or when the
    full-batch iterations after it change the full objective by less than FINISH_TOL;
    otherwise it ran out of the plan's budget (no warning) or of the max_iter the user set
    (scikit-learn's ConvergenceWarning)."""
    calls = []

    def fake(model, X, y, inference, settings):
        calls.append(inference)
        obj = np.full(5, 1e3) if len(calls) == 1 else np.array(finish_objective)
        return types.SimpleNamespace(model=model, X=X, y=y, history=History(
            obj, np.arange(obj.size, dtype=float), "max_iter", "max_iter reached",
            step_size=np.ones(obj.size)))

    monkeypatch.setattr(agp_planned, "train", fake)
    monkeypatch.setattr(agp.inducing, "kmeans", lambda X, M, key, **kw: np.asarray(X)[:M])
    X, y = _fake_data(agp_plan.FULL_BATCH_MAX + 1, "classes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = GPClassifier(max_iter=max_iter).fit(X, y)
    assert [type(c) for c in calls] == [AnalyticSVI, AnalyticVI]
    assert est.history_.status == status and est.n_iter_ == 8
    warned = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(warned) == (1 if status == "max_iter" else 0)
    assert ("below" if status == "converged" else "above") in est.history_.message


def test_auto_minibatch_path_trains(monkeypatch, clf_data, clf):
    """The default path above FULL_BATCH_MAX, run for real on a small problem (the size
    thresholds lowered): minibatches with Robbins-Monro steps, then full-batch CAVI steps
    (step 1); its predictions agree with the full-batch default's."""
    monkeypatch.setattr(agp_plan, "FULL_BATCH_MAX", 40)
    monkeypatch.setattr(agp_plan, "AUTO_BATCH", 20)
    monkeypatch.setattr(agp_plan, "SVI_MIN_ITER", 300)
    X, y = clf_data
    est = GPClassifier(n_inducing=20, random_state=0).fit(X, y)
    hist = est.history_
    finish = agp_plan.FINISH_ITER
    assert type(est.posterior_.model) is agp.SVGP and est.n_iter_ == len(hist.objective)
    assert 40 < est.n_iter_ <= 300 + finish
    steps = hist.step_size
    assert np.all(np.diff(steps[:-finish]) < 0) and steps[-finish - 1] < 0.2  # Robbins-Monro
    np.testing.assert_array_equal(steps[-finish:], 1.0)  # the CAVI update
    assert np.all(np.diff(hist.wall_time) >= 0)
    assert np.mean(np.abs(est.predict_proba(XC) - clf.predict_proba(XC))) < 0.1


def test_sparse_minibatch_classifier(clf_data, clf):
    """n > n_inducing: SVGP with n_inducing k-means inducing inputs; batch_size: stochastic
    augmented VI for max_iter iterations; random_state fixes the inducing inputs and the
    minibatches (the same fit twice), another random_state changes them."""
    X, y = clf_data
    make = lambda seed: GPClassifier(n_inducing=20, batch_size=20, max_iter=100,
                                     random_state=seed).fit(X, y)
    est = make(0)
    assert est.sparse_ and type(est.posterior_.model) is agp.SVGP
    Z = np.asarray(est.posterior_.inducing)
    assert Z.shape == (20, 2)
    assert est.n_iter_ == 100 and len(est.history_.objective) == 100
    assert np.all(np.isfinite(est.history_.step_size))  # natural steps (Robbins-Monro)
    assert np.all(np.diff(est.history_.step_size) < 0)
    p = est.predict_proba(XC)
    assert est.score(XC, _clf_labels(XC)) >= 0.8
    assert np.mean(np.abs(p - clf.predict_proba(XC))) < 0.15  # 0.08 measured
    again = make(0)
    np.testing.assert_array_equal(np.asarray(again.posterior_.inducing), Z)
    np.testing.assert_array_equal(again.predict_proba(XC), p)
    other = make(1)
    assert not np.allclose(np.asarray(other.posterior_.inducing), Z)


def test_sparse_regressor(gauss, reg_data):
    """n > n_inducing with a Gaussian likelihood: SGPR (k-means inducing inputs,
    deterministic given random_state), as good as the exact GP on this smooth 1-D problem."""
    X, y = reg_data.X, reg_data.y
    est = GPRegressor(n_inducing=20, random_state=0).fit(X, y)
    assert est.sparse_ and type(est.posterior_.model) is agp.SVGP  # SGPR's optimal q(u)
    Z = np.asarray(est.posterior_.inducing)
    assert Z.shape == (20, 1)
    mean, sd = est.predict(XT, return_std=True)
    mean_exact, sd_exact = gauss.predict(XT, return_std=True)
    mean, sd, mean_exact, sd_exact = (a[INSIDE] for a in (mean, sd, mean_exact, sd_exact))
    assert np.max(np.abs(mean - mean_exact)) < 1e-2 * np.mean(sd_exact)  # 1e-6 measured
    np.testing.assert_allclose(sd, sd_exact, rtol=1e-2)
    again = GPRegressor(n_inducing=20, random_state=0).fit(X, y)
    np.testing.assert_array_equal(np.asarray(again.posterior_.inducing), Z)
    np.testing.assert_array_equal(again.predict(XT), est.predict(XT))


# --- meta-estimators ---------------------------------------------------------------------


def test_regressor_pipeline_grid_search_cross_val(gauss, reg_data):
    X, y = reg_data.X, reg_data.y
    pipe = make_pipeline(StandardScaler(), GPRegressor(random_state=0)).fit(X, y)
    np.testing.assert_allclose(pipe.predict(XQ), gauss.predict(XQ), rtol=1e-6)
    cv = KFold(2, shuffle=True, random_state=0)  # two folds of 40 + 40
    grid = GridSearchCV(pipe, {"gpregressor__kernel": ["rbf", "matern52"]}, cv=cv).fit(X, y)
    assert grid.best_params_["gpregressor__kernel"] in ("rbf", "matern52")
    assert grid.best_score_ > 0.8
    assert grid.best_estimator_[-1].kernel == grid.best_params_["gpregressor__kernel"]
    scores = cross_val_score(pipe, X, y, cv=cv)
    assert scores.shape == (2,) and scores.min() > 0.8
    np.testing.assert_allclose(scores.mean(), grid.cv_results_["mean_test_score"][
        list(grid.cv_results_["param_gpregressor__kernel"]).index("rbf")], rtol=1e-9)


# --- parameters, pickling, errors --------------------------------------------------------


def test_get_set_params_and_clone(gauss):
    params = dict(likelihood="student_t", kernel="matern32", ard=False, n_inducing=50,
                  batch_size=16, df=5.0, inference="quadrature", normalize_y=False,
                  max_iter=100, random_state=3, verbose=False)
    est = GPRegressor(**params)
    assert est.get_params() == params
    other = GPRegressor().set_params(**params)
    assert other.get_params() == params
    twin = clone(est)
    assert twin is not est and twin.get_params() == params
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(lengthscale=1.0)
    assert set(GPClassifier().get_params()) == {
        "likelihood", "kernel", "ard", "n_inducing", "batch_size", "inference", "max_iter",
        "random_state", "verbose"}
    assert GPCountRegressor(r=3.0).set_params(likelihood="negative_binomial").get_params()[
        "r"] == 3.0
    # fitting changes no parameter; a clone of a fitted estimator is unfitted
    assert gauss.get_params() == GPRegressor(random_state=0).get_params()
    fresh = clone(gauss)
    assert not hasattr(fresh, "posterior_")
    with pytest.raises(NotFittedError):
        fresh.predict(XQ)


def test_kernel_instance(gauss, reg_data):
    """An augmentedgp kernel works as the kernel parameter (clonable); the default is an ARD
    RBF with lengthscale sqrt(d) and variance 1 on the standardised inputs."""
    kernel = agp.kernels.RBF(lengthscale=np.ones(1), variance=1.0)
    est = GPRegressor(kernel=kernel, random_state=0)
    assert clone(est).kernel is not kernel
    est.fit(reg_data.X, reg_data.y)
    np.testing.assert_allclose(est.predict(XQ), gauss.predict(XQ), rtol=1e-9)
    assert est.kernel is kernel  # the parameter itself is not changed by fitting


@pytest.mark.parametrize("fixture", ["gauss", "student", "poisson", "clf", "clf3"])
def test_pickle_round_trip(fixture, request):
    obj = request.getfixturevalue(fixture)
    if fixture == "clf3":
        est, X = obj.est, obj.X
    else:
        est, X = obj, (XC if fixture == "clf" else XQ)
    clone_ = pickle.loads(pickle.dumps(est))
    if isinstance(est, GPClassifier):
        np.testing.assert_array_equal(clone_.predict_proba(X), est.predict_proba(X))
    else:
        np.testing.assert_array_equal(clone_.predict(X), est.predict(X))
        np.testing.assert_array_equal(clone_.predict_quantiles(X), est.predict_quantiles(X))


def _data_for(est):
    X = np.random.default_rng(8).normal(size=(12, 2))
    if isinstance(est, GPClassifier):
        return X, np.arange(12) % 3
    return X, np.arange(12.0)


@pytest.mark.parametrize("est, match", [
    (GPRegressor(likelihood="cauchy"), "likelihood must be one of"),
    (GPCountRegressor(likelihood="gaussian"), "likelihood must be one of"),
    (GPClassifier(likelihood="cauchy"), "likelihood must be one of"),
    (GPRegressor(kernel="periodic"), "kernel must be one of"),
    (GPClassifier(kernel=object()), "kernel must be one of"),
    (GPClassifier(likelihood="probit"), "probit.*3 classes"),
    (GPRegressor(n_inducing=0), "n_inducing must be a positive integer"),
    (GPRegressor(n_inducing="many"), "n_inducing must be a positive integer"),
    (GPCountRegressor(n_inducing=2.5), "n_inducing must be a positive integer"),
    (GPRegressor(max_iter=-1), "max_iter must be a positive integer"),
    (GPClassifier(max_iter=0), "max_iter must be a positive integer"),
    (GPRegressor("laplace", batch_size=0), "batch_size must be a positive integer"),
    (GPRegressor("student_t", df=0.0), "df must be finite and > 0"),
    (GPRegressor("student_t", df=np.inf), "df must be finite and > 0"),
    (GPRegressor(inference="mcmc"), "inference must be one of"),
    (GPClassifier(inference="mcmc"), "inference must be one of"),
    (GPClassifier(likelihood="softmax", inference="mcmc"), "inference must be one of"),
    (GPCountRegressor(inference="mcmc"), "inference must be one of"),
])
def test_invalid_parameters(fake_fit, est, match):
    """Raised at fit (scikit-learn's convention), before any training."""
    with pytest.raises(ValueError, match=match):
        est.fit(*_data_for(est))
    assert not fake_fit


def test_invalid_data(fake_fit, gauss, clf):
    X, y = _data_for(GPClassifier())
    with pytest.raises(ValueError, match="at least 2 classes"):
        GPClassifier().fit(X, np.full(12, "a"))
    with pytest.raises(ValueError, match="Unknown label type"):
        GPClassifier().fit(X, np.linspace(0.0, 1.0, 12))
    Xnan = X.copy()
    Xnan[3, 1] = np.nan
    for est in (GPRegressor(), GPClassifier(), GPCountRegressor()):
        with pytest.raises(ValueError, match="Input X contains NaN"):
            est.fit(Xnan, y)
        with pytest.raises(NotFittedError):
            est.predict(X)
    with pytest.raises(NotFittedError):
        GPClassifier().predict_proba(X)
    with pytest.raises(NotFittedError):
        GPRegressor().predict_interval(X)
    with pytest.raises(ValueError, match="y contains NaN"):
        GPRegressor().fit(X, np.where(y == 0, np.nan, 1.0))
    assert not fake_fit
    with pytest.raises(ValueError, match="X has 2 features, but GPRegressor is expecting 1"):
        gauss.predict(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="X has 3 features, but GPClassifier is expecting 2"):
        clf.predict_proba(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="Input X contains NaN"):
        gauss.predict(np.array([[np.nan]]))
    for bad in ([0.0, 0.5], [0.5, 1.0], [[0.1, 0.2]]):
        with pytest.raises(ValueError, match="quantiles must lie strictly inside"):
            gauss.predict_quantiles(XQ, bad)
    with pytest.raises(ValueError, match="level must lie strictly inside"):
        gauss.predict_interval(XQ, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gauss.predict(XQ[:1]).shape == (1,)
