"""Property-based tests of the public boundary (issue 24): every public call on generated
input -- valid, malformed, extreme -- ends in a finite result or a typed error
(``tests/property_cases.py`` defines both and classifies each call).

Default suite: a reduced, derandomised run (a few cases per entry point, the shapes fixed
so that each model compiles once). ``AGP_PROPERTY_FULL=1`` (or ``AGP_FULL_SLOW=1``) adds
the ``*_full`` variants, marked slow: >= 10,000 random cases in all;
``benchmarks/adversarial.py`` runs those and tabulates the outcomes.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import augmentedgp as agp
from augmentedgp import kernels as K
from augmentedgp import likelihoods as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
from property_cases import (  # noqa: E402
    RECORD,
    RECORDER,
    ArrayRecipe,
    TargetRecipe,
    arrays,
    build_X,
    build_y,
    float_setting,
    int_setting,
    targets,
)

FULL = os.environ.get("AGP_PROPERTY_FULL", os.environ.get("AGP_FULL_SLOW", "0")) == "1"
STOP_AT = float(os.environ.get("AGP_PROPERTY_STOP_AT", "0"))  # set by the benchmark
N, D, M = 16, 2, 4  # the fixed training shape (one compilation per model), inducing points
NAMES = ("X", "Xnew", "y", "ynew", "Z", "inducing", "max_iter", "learning_rate", "tol",
         "n_restarts", "key", "inference", "kernel", "likelihood", "noise", "variance",
         "lengthscale", "period", "offset", "degree", "df", "scale", "r", "rate",
         "precision", "binsize", "classes", "epsilon", "n_samples", "n_chains", "burn_in",
         "thin", "batch_size", "step_size", "n_points", "max_sweeps", "n_inducing",
         "quantiles", "level", "full_cov", "method", "q", "ard", "normalize_y", "model",
         "mean", "num_samples", "predict_samples", "integer", "noise precision", "overrelax",
         "Gamma shape",
         "hyper_every", "hyper_step", "store_aux", "alpha", "optimizer", "callback", "patience",
         "chunk_size", "window", "validation_data", "natural")

warnings.filterwarnings("ignore")  # convergence and numpy warnings are not outcomes


def check(entry: str, case, call, names=NAMES, typed=()):
    """Classify one call; outside the benchmark a failure fails the example at once (so
    hypothesis shrinks it to a minimal case)."""
    outcome = RECORDER.run(entry, case, call, names, typed)
    if not RECORD:
        assert outcome.ok, f"{entry}: {outcome.kind} {outcome.detail}: {outcome.message} " \
                           f"[{outcome.where}] for {case}"
    return outcome


def property_test(entry, strategy, ci_examples, full_examples):
    """Two tests of the same property: ``test_<entry>`` (reduced, derandomised, on
    ``strategy(ci=True)``: the adversarial inputs of every kind but the cheapest models, so
    that each compiles once) and ``test_<entry>_full`` (slow, only with AGP_PROPERTY_FULL=1:
    ``strategy(ci=False)``, every model)."""

    def decorate(body):
        def make(examples, derandomize, cases):
            phases = (Phase.explicit, Phase.generate) if RECORD else tuple(Phase)

            @settings(max_examples=examples, deadline=None, derandomize=derandomize,
                      database=None, phases=phases, print_blob=True,
                      suppress_health_check=list(HealthCheck))
            @given(cases)
            def run(case):
                if STOP_AT and time.time() > STOP_AT:  # the benchmark's time cap: skip
                    return
                body(case)

            def test():
                run()
                failures = [(o, c) for o, c in RECORDER.outcomes.get(entry, []) if not o.ok]
                assert not failures, f"{len(failures)} failures in {entry}: {failures[:3]}"

            return test

        ci = make(ci_examples, True, strategy(ci=True))
        full = pytest.mark.slow(pytest.mark.skipif(not FULL, reason="AGP_PROPERTY_FULL=1")(
            make(full_examples, False, strategy(ci=False))))
        ci.__name__, full.__name__ = f"test_{entry}", f"test_{entry}_full"
        ci.__doc__ = full.__doc__ = body.__doc__
        return ci, full

    return decorate


def pick(options, ci_options, ci):
    """``sampled_from(options)``, or of ``ci_options`` in the reduced run."""
    return st.sampled_from(ci_options if ci else options)


def Xfix(seed=0, n=N, d=D):
    return build_X(ArrayRecipe(n=n, d=d, seed=seed))


# --- kernels -----------------------------------------------------------------------------

KERNELS = {"RBF": ("lengthscale", "variance"), "Matern12": ("lengthscale", "variance"),
           "Matern32": ("lengthscale", "variance"), "Matern52": ("lengthscale", "variance"),
           "RationalQuadratic": ("lengthscale", "variance", "alpha"),
           "Periodic": ("lengthscale", "variance", "period"), "Linear": ("variance",),
           "Polynomial": ("degree", "variance", "offset"), "Constant": ("variance",),
           "White": ("variance",)}


@st.composite
def kernel_cases(draw, ci=False):
    name = draw(st.sampled_from(sorted(KERNELS)))
    params = {}
    for p in KERNELS[name]:
        if draw(st.booleans()):
            params[p] = draw(int_setting([1, 2, 3]) if p == "degree"
                             else float_setting([0.5, 1.0, 2.0]))
    return {"kernel": name, "params": params, "X": draw(arrays(8, 2)),
            "Z": draw(st.none() | arrays(5, 2)), "combine": draw(st.sampled_from(
                ["none", "none", "sum", "product", "scaled"]))}


def kernel_call(case):
    k = getattr(K, case["kernel"])(**case["params"])
    if case["combine"] == "sum":
        k = k + K.RBF()
    elif case["combine"] == "product":
        k = k * K.Matern32()
    elif case["combine"] == "scaled":
        k = 2.5 * k
    X = build_X(case["X"])
    Z = None if case["Z"] is None else build_X(case["Z"])
    return k(X, Z), k.diag(X)


test_kernels, test_kernels_full = property_test("kernels", kernel_cases, 12, 1500)(
    lambda case: check("kernels", case, lambda: kernel_call(case)))


# --- likelihoods --------------------------------------------------------------------------

LIKELIHOODS = {  # name: (constructor argument, the targets it takes)
    "Gaussian": ("variance", "real"), "StudentT": ("df", "real"), "Laplace": ("scale", "real"),
    "Matern32": ("scale", "real"), "Logistic": (None, "binary01"),
    "Probit": (None, "binarypm"), "BayesianSVM": (None, "binarypm"),
    "Poisson": ("binsize", "counts"), "LogisticPoisson": ("rate", "counts"),
    "NegativeBinomial": ("r", "counts"), "Gamma": ("shape", "fraction"),
    "Beta": ("precision", "fraction"), "LogisticSoftmax": ("classes", "classes3"),
    "Softmax": ("classes", "classes3"), "RobustMax": ("classes", "classes3"),
    "HeteroscedasticGaussian": ("precision", "real"),
    "HeteroscedasticStudentT": ("precision", "real")}


@st.composite
def likelihood_cases(draw, ci=False):
    name = draw(pick(sorted(LIKELIHOODS), ["Gaussian", "Logistic", "Poisson"], ci))
    arg, kind = LIKELIHOODS[name]
    value = None
    if arg == "classes":
        value = draw(int_setting([3]))
    elif arg is not None and draw(st.booleans()):
        value = draw(float_setting([0.5, 1.0, 3.0]))
    return {"likelihood": name, "arg": arg, "value": value, "y": draw(targets(kind)),
            "mean_scale": draw(st.sampled_from([0, 0, 1, 3, 8])),
            "var_scale": draw(st.sampled_from([0, 0, -8, 2, 6])), "seed": draw(st.integers(0, 99))}


def likelihood_call(case):
    cls = getattr(L, case["likelihood"])
    lik = cls() if case["value"] is None and case["arg"] != "classes" else \
        cls(case["value"]) if case["arg"] in ("classes",) else cls(**{case["arg"]: case["value"]})
    n = 8
    y = lik.check_targets(build_y(case["y"], n))
    rng = np.random.default_rng(case["seed"])
    C = lik.num_latent
    shape = np.shape(y)[:1] if C == 1 else (*np.shape(y)[:1], C)  # y may be 0-d
    mean = rng.normal(size=shape) * 10.0 ** case["mean_scale"]
    var = rng.uniform(0.1, 1.0, size=shape) * 10.0 ** case["var_scale"]
    return (y, lik.predictive_log_prob(y, mean, var), lik.predict_y(mean, var),
            lik.variational_expectations(y, mean, var, key=jax.random.PRNGKey(0)))


test_likelihoods, test_likelihoods_full = property_test(
    "likelihoods", likelihood_cases, 12, 1500)(
    lambda case: check("likelihoods", case, lambda: likelihood_call(case)))


# --- agp.fit with GP: Exact, Laplace, EP ---------------------------------------------------

@st.composite
def gp_cases(draw, ci=False):
    inference = draw(pick(["Exact", "Laplace", "EP"], ["Exact"], ci))
    kind = {"Exact": "real", "Laplace": "binary01", "EP": "binarypm"}[inference]
    case = {"inference": inference, "X": draw(arrays(N, D)), "y": draw(targets(kind)),
            "lengthscale": draw(float_setting([1.0])), "variance": draw(float_setting([1.0])),
            "max_iter": draw(int_setting([5, 10]))}
    if inference == "Exact":
        case["noise"] = draw(float_setting([0.1]))
    else:
        case["inner"] = draw(int_setting([20]))
        case["likelihood"] = draw(st.sampled_from(["Logistic", "Probit"]) if inference ==
                                  "Laplace" else st.just("Probit"))
    case["optimizer"] = draw(st.sampled_from([None, None, None, "adam", "sgd"]))
    case["tol"] = draw(st.sampled_from([None, None, 1e-6, 0.0, -1.0, float("nan")]))
    return case


def gp_call(case):
    X, Xtest = build_X(case["X"]), Xfix(7, 5)
    y = build_y(case["y"], len(X) if np.ndim(X) else 1)
    kernel = K.RBF(case["lengthscale"], case["variance"])
    if case["inference"] == "Exact":
        model, inference = agp.GP(kernel, noise=case["noise"]), agp.Exact()
    else:
        model = agp.GP(kernel, getattr(L, case["likelihood"])())
        inference = agp.Laplace(max_iter=case["inner"]) if case["inference"] == "Laplace" \
            else agp.EP(max_sweeps=case["inner"])
    post = agp.fit(model, X, y, inference, max_iter=case["max_iter"], tol=case["tol"],
                   optimizer=case["optimizer"])
    return post, post.predict_f(Xtest), post.predict_y(Xtest), post.log_marginal_likelihood()


test_fit_gp, test_fit_gp_full = property_test("fit_gp", gp_cases, 10, 1000)(
    lambda case: check("fit_gp", case, lambda: gp_call(case)))


# --- agp.fit with SVGP: AnalyticVI, AnalyticSVI, QuadratureVI ------------------------------

SVGP_LIKELIHOODS = {"Gaussian": "real", "StudentT": "real", "Laplace": "real",
                    "Logistic": "binary01", "BayesianSVM": "binarypm", "Poisson": "counts",
                    "NegativeBinomial": "counts", "LogisticSoftmax": "classes3",
                    "HeteroscedasticGaussian": "real", "HeteroscedasticStudentT": "real"}
AUGMENTABLE = {"Gaussian", "StudentT", "Laplace", "Logistic", "BayesianSVM",
               "NegativeBinomial", "LogisticSoftmax", "HeteroscedasticGaussian",
               "HeteroscedasticStudentT"}


@st.composite
def svgp_cases(draw, ci=False):
    lik = draw(pick(sorted(SVGP_LIKELIHOODS), ["Logistic"], ci))
    vi = draw(pick(["AnalyticVI", "AnalyticSVI", "QuadratureVI"] if lik in AUGMENTABLE
                   else ["QuadratureVI"] * 3 + ["AnalyticVI"], ["AnalyticVI"], ci))
    setting = {"AnalyticVI": float_setting([1.0, 0.5]), "AnalyticSVI": int_setting([8]),
               "QuadratureVI": int_setting([20, 10])}[vi]
    return {"likelihood": lik, "inference": vi, "setting": draw(setting),
            "q": draw(pick(["natural_whitened"] * 3 + ["whitened", "natural", "cholesky",
                                                       "site", "bogus"],
                           ["natural_whitened"] * 3 + ["bogus"], ci)),
            "X": draw(arrays(N, D)), "Z": draw(arrays(M, D)),
            "y": draw(targets(SVGP_LIKELIHOODS[lik])), "max_iter": draw(int_setting([5])),
            "learning_rate": draw(st.sampled_from([None, None, 0.01, 0.0, -1.0, 1e300]))}


def make_likelihood(name):
    return getattr(L, name)(3) if name == "LogisticSoftmax" else getattr(L, name)()


def svgp_call(case):
    X, Z, Xtest = build_X(case["X"]), build_X(case["Z"]), Xfix(7, 5)
    y = build_y(case["y"], len(X) if np.ndim(X) else 1)
    vi = {"AnalyticVI": lambda s: agp.AnalyticVI(step_size=s),
          "AnalyticSVI": lambda s: agp.AnalyticSVI(batch_size=s),
          "QuadratureVI": lambda s: agp.QuadratureVI(n_points=s)}[case["inference"]]
    model = agp.SVGP(K.RBF(), make_likelihood(case["likelihood"]), Z, q=case["q"])
    post = agp.fit(model, X, y, vi(case["setting"]), max_iter=case["max_iter"],
                   learning_rate=case["learning_rate"], key=jax.random.PRNGKey(0))
    return post, post.predict_f(Xtest), post.predict_y(Xtest), post.elbo()


test_fit_svgp, test_fit_svgp_full = property_test("fit_svgp", svgp_cases, 8, 1000)(
    lambda case: check("fit_svgp", case, lambda: svgp_call(case)))


# --- agp.fit with SGPR ---------------------------------------------------------------------

@st.composite
def sgpr_cases(draw, ci=False):
    lik = draw(pick(["Gaussian", "Gaussian", "StudentT", "Logistic"], ["Gaussian"], ci))
    return {"likelihood": lik, "X": draw(arrays(N, D)), "Z": draw(arrays(M, D)),
            "y": draw(targets(SVGP_LIKELIHOODS[lik])), "noise": draw(float_setting([0.1])),
            "model": draw(pick(["SGPR", "SGPR", "DTC", "FITC", "TaylorSGPR"],
                               ["SGPR", "TaylorSGPR"], ci)),
            # the removed method argument (None: not passed): a TypeError naming it
            "method": draw(pick([None, None, None, "vfe", "VFE", "bogus"], [None, "bogus"], ci)),
            "max_iter": draw(int_setting([5]))}


def sgpr_call(case):
    X, Z, Xtest = build_X(case["X"]), build_X(case["Z"]), Xfix(7, 5)
    y = build_y(case["y"], len(X) if np.ndim(X) else 1)
    cls = getattr(agp, case["model"])
    removed = {} if case["method"] is None else {"method": case["method"]}
    if case["likelihood"] == "Gaussian":
        model = cls(K.RBF(), Z, noise=case["noise"], **removed)
    else:
        model = cls(K.RBF(), Z, likelihood=make_likelihood(case["likelihood"]), **removed)
    post = agp.fit(model, X, y, max_iter=case["max_iter"])
    return post, post.predict_f(Xtest), post.predict_y(Xtest), post.elbo()


test_fit_sgpr, test_fit_sgpr_full = property_test("fit_sgpr", sgpr_cases, 8, 800)(
    lambda case: check("fit_sgpr", case, lambda: sgpr_call(case)))


# --- agp.sample (Gibbs) with MCGP ----------------------------------------------------------

@st.composite
def gibbs_cases(draw, ci=False):
    lik = draw(pick(["Logistic", "StudentT", "Gaussian", "NegativeBinomial", "LogisticSoftmax",
                     "BayesianSVM", "Laplace"], ["Logistic"], ci))
    return {"likelihood": lik, "X": draw(arrays(N, D)), "y": draw(targets(SVGP_LIKELIHOODS[lik])),
            "sparse": draw(pick([False, True], [False], ci)), "Z": draw(arrays(M, D)),
            "n_samples": draw(int_setting([5])), "n_chains": draw(int_setting([2])),
            "burn_in": draw(int_setting([2, 0])), "thin": draw(int_setting([1])),
            "overrelax": draw(float_setting([0.0, -0.5])),
            "key": draw(st.sampled_from(["PRNGKey(0)"] * 4 + ["None", "int 3", "str"]))}


def gibbs_call(case):
    X, Xtest = build_X(case["X"]), Xfix(7, 5)
    y = build_y(case["y"], len(X) if np.ndim(X) else 1)
    key = {"PRNGKey(0)": jax.random.PRNGKey(0), "None": None, "int 3": 3, "str": "key"}[
        case["key"]]
    model = agp.MCGP(K.RBF(), make_likelihood(case["likelihood"]),
                     inducing=build_X(case["Z"]) if case["sparse"] else None)
    run = agp.GibbsSampling(n_samples=case["n_samples"], n_chains=case["n_chains"],
                            burn_in=case["burn_in"], thin=case["thin"],
                            overrelax=case["overrelax"])
    post = agp.sample(model, X, y, run, key=key)
    return post.f, post.predict_f(Xtest), post.predict_y(Xtest)


test_sample_gibbs, test_sample_gibbs_full = property_test("sample_gibbs", gibbs_cases, 6, 800)(
    lambda case: check("sample_gibbs", case, lambda: gibbs_call(case)))


# --- predictive methods of fitted posteriors -----------------------------------------------

_FITTED: dict = {}


def fitted(name):
    """A posterior of each model on the fixed training shape (fitted once per process)."""
    if name not in _FITTED:
        X = Xfix(0)
        yr, yb = np.sin(X[:, 0]) + 0.1 * X[:, 1], (X[:, 0] > 0).astype(float)
        yc = np.digitize(X[:, 0], [-0.5, 0.5]).astype(float)
        Z = Xfix(1, M)
        build = {
            "exact": lambda: agp.fit(agp.GP(K.RBF(), noise=0.1), X, yr, max_iter=5),
            "laplace": lambda: agp.fit(agp.GP(K.RBF(), L.Logistic()), X, yb, max_iter=5),
            "ep": lambda: agp.fit(agp.GP(K.RBF(), L.Probit()), X, yb, agp.EP(), max_iter=5),
            "svgp": lambda: agp.fit(agp.SVGP(K.RBF(), L.Logistic(), Z, q="natural_whitened"),
                                    X, yb, agp.AnalyticVI(), max_iter=5),
            "svgp3": lambda: agp.fit(agp.SVGP(K.RBF(), L.LogisticSoftmax(3), Z,
                                              q="natural_whitened"), X, yc, agp.AnalyticVI(),
                                     max_iter=5),
            "sgpr": lambda: agp.fit(agp.SGPR(K.RBF(), Z, noise=0.1), X, yr, max_iter=5),
            "mcgp": lambda: agp.sample(agp.MCGP(K.RBF(), L.Logistic()), X, yb,
                                       agp.GibbsSampling(n_samples=5, n_chains=2, burn_in=2)),
        }
        _FITTED[name] = (build[name](), {"exact": yr, "sgpr": yr, "svgp3": yc}.get(name, yb))
    return _FITTED[name]


@st.composite
def predict_cases(draw, ci=False):
    model = draw(pick(["exact", "laplace", "ep", "svgp", "svgp3", "sgpr", "mcgp"],
                      ["exact", "svgp"], ci))
    method = draw(st.sampled_from(["predict_f", "predict_f", "predict_y", "predict_proba",
                                   "predict_log_density", "sample_f", "predict_class"]))
    return {"model": model, "method": method, "Xnew": draw(arrays(5, D)),
            "full_cov": draw(st.sampled_from([False, False, True, "yes", None])),
            "n_samples": draw(int_setting([1, 3])),
            "key": draw(st.sampled_from(["PRNGKey(0)"] * 4 + ["None", "int 3"])),
            "ynew": draw(st.sampled_from(["same", "same", "real", "classes3", "strings",
                                          "nan", "short"]))}


def predict_call(case):
    post, ytrain = fitted(case["model"])
    Xnew = build_X(case["Xnew"])
    method = case["method"]
    if method == "predict_f":
        return post.predict_f(Xnew, full_cov=case["full_cov"])
    if method == "sample_f":
        key = {"PRNGKey(0)": jax.random.PRNGKey(0), "None": None, "int 3": 3}[case["key"]]
        return post.sample_f(key, Xnew, n_samples=case["n_samples"])
    if method == "predict_log_density":
        n = len(Xnew) if np.ndim(Xnew) else 1
        kind = case["ynew"]
        ynew = (np.resize(ytrain, n) if kind == "same" else np.resize(ytrain, n + 1)
                if kind == "short" else np.full(n, np.nan) if kind == "nan"
                else build_y(TargetRecipe(kind=kind), n))
        return post.predict_log_density(Xnew, ynew)
    return getattr(post, method)(Xnew)


test_predict, test_predict_full = property_test("predict", predict_cases, 14, 1200)(
    lambda case: check("predict", case, lambda: predict_call(case)))


# --- scikit-learn estimators ---------------------------------------------------------------

SK = {"GPRegressor": (("gaussian", "student_t", "laplace"), "real"),
      "GPClassifier": (("logistic", "probit", "softmax", "robustmax"), "binary01"),
      "GPCountRegressor": (("poisson", "negative_binomial"), "counts")}


@st.composite
def sklearn_fit_cases(draw, ci=False):
    est = draw(pick(sorted(SK), ["GPRegressor"], ci))
    liks, kind = SK[est]
    params = {"likelihood": draw(st.sampled_from(liks + liks + ("bogus", None))),
              "max_iter": draw(int_setting([5]))}
    for p, strat in (("kernel", st.sampled_from(["rbf", "matern32", "rq", "bogus", None, 3])),
                     ("n_inducing", st.sampled_from(["auto", None, 4, 0, -1, 2.5, "x", True])),
                     ("batch_size", st.sampled_from(["auto", None, 8, 0, -3, 1.5, "x"])),
                     ("inference", st.sampled_from(["auto", "analytic", "quadrature", "x"])),
                     ("ard", st.sampled_from([True, False, "no"])),
                     ("random_state", st.sampled_from([0, None, -1, "seed"]))):
        if draw(st.integers(0, 3)) == 0:
            params[p] = draw(strat)
    if est == "GPRegressor" and draw(st.booleans()):
        params["df"] = draw(float_setting([4.0]))
    if est == "GPCountRegressor" and draw(st.booleans()):
        params["r"] = draw(float_setting([1.0]))
    if est == "GPClassifier":
        kind = draw(st.sampled_from(["binary01", "binary01", "classes3", "strings"]))
    return {"estimator": est, "params": params, "X": draw(arrays(N, D)), "y": draw(targets(kind))}


def sklearn_fit_call(case):
    from augmentedgp import sklearn as agsk

    X = build_X(case["X"])
    y = build_y(case["y"], len(X) if np.ndim(X) else 1)
    est = getattr(agsk, case["estimator"])(**case["params"]).fit(X, y)
    Xt = Xfix(7, 5)
    out = [est.predict(Xt), est.score(Xfix(0), y if len(y) == N else np.resize(y, N))]
    if case["estimator"] == "GPClassifier":
        out.append(est.predict_proba(Xt))
    else:
        out.append(est.predict(Xt, return_std=True))
    return out


test_sklearn_fit, test_sklearn_fit_full = property_test(
    "sklearn_fit", sklearn_fit_cases, 8, 800)(
    lambda case: check("sklearn_fit", case, lambda: sklearn_fit_call(case)))

_ESTIMATORS: dict = {}


def fitted_estimator(name):
    from augmentedgp import sklearn as agsk

    if name not in _ESTIMATORS:
        X = Xfix(0)
        y = {"regressor": np.sin(X[:, 0]), "counts": np.floor(np.exp(X[:, 0])),
             "binary": np.where(X[:, 0] > 0, "yes", "no"),
             "classes3": np.digitize(X[:, 0], [-0.5, 0.5])}[name]
        est = {"regressor": agsk.GPRegressor, "counts": agsk.GPCountRegressor,
               "binary": agsk.GPClassifier, "classes3": agsk.GPClassifier}[name](max_iter=5)
        _ESTIMATORS[name] = (est.fit(X, y), y)
    return _ESTIMATORS[name]


@st.composite
def sklearn_predict_cases(draw, ci=False):
    name = draw(pick(["regressor", "counts", "binary", "classes3", "unfitted"],
                     ["regressor", "unfitted"], ci))
    return {"estimator": name, "method": draw(st.sampled_from(
        ["predict", "predict_std", "predict_proba", "predict_log_proba", "score",
         "log_predictive_density", "predict_interval", "predict_quantiles"])),
        "X": draw(arrays(5, D)), "y": draw(st.sampled_from(["same", "same", "nan", "short",
                                                            "strings", "negative"])),
        "level": draw(float_setting([0.9, 0.5]))}


def sklearn_predict_call(case):
    from augmentedgp import sklearn as agsk

    if case["estimator"] == "unfitted":
        est, ytrain = agsk.GPRegressor(), np.zeros(N)
    else:
        est, ytrain = fitted_estimator(case["estimator"])
    X = build_X(case["X"])
    n = len(X) if np.ndim(X) else 1
    kind = case["y"]
    y = (np.resize(ytrain, n) if kind == "same" else np.resize(ytrain, n + 1) if kind == "short"
         else np.full(n, np.nan) if kind == "nan" else np.array(["a"] * n) if kind == "strings"
         else -np.ones(n))
    method = case["method"]
    if not hasattr(est, method.replace("_std", "")) or (
            method == "predict_std" and not hasattr(est, "predict_interval")):
        method = "predict"  # not a verb of this estimator: its prediction instead
    if method == "predict_std":
        return est.predict(X, return_std=True)
    if method in ("score", "log_predictive_density"):
        return getattr(est, method)(X, y)
    if method == "predict_interval":
        return est.predict_interval(X, case["level"])
    if method == "predict_quantiles":
        return est.predict_quantiles(X, (0.1, case["level"]))
    return getattr(est, method)(X)


test_sklearn_predict, test_sklearn_predict_full = property_test(
    "sklearn_predict", sklearn_predict_cases, 12, 1000)(
    lambda case: check("sklearn_predict", case, lambda: sklearn_predict_call(case)))


# --- persistence: corrupted model directories ----------------------------------------------

_OPENED: list = []
_WATCH: list = []


def _audit(event, args):
    if _WATCH and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)
_TEMPLATES: dict = {}


def template(name):
    """A saved model directory of each kind (written once per process)."""
    if name not in _TEMPLATES:
        base = Path(tempfile.mkdtemp(prefix="agp-prop-"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        obj = fitted(name)[0] if name != "estimator" else fitted_estimator("binary")[0]
        agp.save(obj, base / name)
        _TEMPLATES[name] = base / name
    return _TEMPLATES[name]


JSON_VALUES = (None, 0, -1, 1e308, "x", "", [], {}, True, "../secret.npz",
               "/etc/passwd", "os:system", "builtins:eval", "augmentedgp.core.linalg:cholesky",
               "augmentedgp.models.gp:GP", {"__array__": "a0"}, {"__array__": "zz"},
               {"__float__": "nan"}, {"__object__": "augmentedgp.sklearn:GPRegressor"},
               {"__objects__": [1], "shape": [-1]}, {"__tuple__": 3},
               {"__randomstate__": [1]}, "augmentedgp-model", "0.0.1", "99.0.0")


@st.composite
def persistence_cases(draw, ci=False):
    mutation = draw(st.sampled_from(["manifest bytes", "arrays bytes", "arrays bytes + sha",
                                     "manifest field", "manifest field", "array content",
                                     "path injection", "delete file"]))
    return {"model": draw(pick(["exact", "svgp", "estimator", "sgpr"], ["exact"], ci)),
            "mutation": mutation, "seed": draw(st.integers(0, 2**20)),
            "value": draw(st.sampled_from(range(len(JSON_VALUES)))),
            "flips": draw(st.integers(1, 4))}


def _paths(node, prefix=()):
    """Every key path of a JSON tree."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def write_manifest(file: Path, manifest: dict):
    """Write an edited manifest, re-signed as an attacker could: its ``manifest_sha256``
    (when the format has one) recomputed over the canonical JSON without that field."""
    if "manifest_sha256" in manifest:
        body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
        try:
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                              allow_nan=False)
            manifest["manifest_sha256"] = hashlib.sha256(text.encode("ascii")).hexdigest()
        except ValueError:
            pass
    file.write_text(json.dumps(manifest))


def corrupt(src: Path, case) -> tuple[Path, Path]:
    """A corrupted copy of the model directory ``src``; returns (its path, a secret file
    outside it that must never be read)."""
    rng = np.random.default_rng(case["seed"])
    work = Path(tempfile.mkdtemp(prefix="agp-case-"))
    model = work / "model"
    shutil.copytree(src, model)
    secret = work / "secret.npz"
    np.savez(secret, a0=np.ones(3))
    man, arr = model / "manifest.json", model / "arrays.npz"
    manifest = json.loads(man.read_text())
    mutation = case["mutation"]
    if mutation == "manifest bytes" or mutation.startswith("arrays bytes"):
        file = man if mutation == "manifest bytes" else arr
        data = bytearray(file.read_bytes())
        for _ in range(case["flips"]):
            data[rng.integers(len(data))] ^= 1 << int(rng.integers(8))
        file.write_bytes(bytes(data))
        if mutation == "arrays bytes + sha":
            manifest["arrays"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
            write_manifest(man, manifest)
    elif mutation == "manifest field":
        paths = _paths(manifest)
        for _ in range(case["flips"]):
            path = paths[rng.integers(len(paths))]
            value = JSON_VALUES[(case["value"] + int(rng.integers(3))) % len(JSON_VALUES)]
            try:  # an earlier edit may have replaced a node on this path
                node = manifest
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = value
            except (KeyError, IndexError, TypeError):
                pass
        write_manifest(man, manifest)
    elif mutation == "array content":
        with np.load(arr) as npz:
            arrays_ = {k: npz[k] for k in npz.files}
        key = sorted(arrays_)[rng.integers(len(arrays_))]
        a = arrays_[key]
        choice = int(rng.integers(5))
        arrays_[key] = (np.full(a.shape, np.nan) if choice == 0 and a.dtype.kind == "f" else
                        a.ravel()[:-1] if choice == 1 and a.size else
                        a.astype(np.complex128) if choice == 2 and a.dtype.kind in "biuf" else
                        np.array(["s"] * max(a.size, 1)) if choice == 3 else
                        np.full(a.shape, 1e308) if a.dtype.kind == "f" else a[None])
        buf = io.BytesIO()
        np.savez(buf, **arrays_)
        arr.write_bytes(buf.getvalue())
        manifest["arrays"]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
        write_manifest(man, manifest)
    elif mutation == "path injection":
        target = ["../secret.npz", str(secret), "/etc/passwd", "../../../../etc/hostname",
                  "arrays.npz/../../secret.npz"][int(rng.integers(5))]
        manifest["arrays"]["file"] = target
        manifest["arrays"]["sha256"] = hashlib.sha256(secret.read_bytes()).hexdigest()
        write_manifest(man, manifest)
    else:
        (man if rng.integers(2) else arr).unlink()
    return model, secret


def persistence_call(case):
    model, secret = corrupt(template(case["model"]), case)
    try:
        _OPENED.clear()
        _WATCH.append(1)
        try:
            obj = agp.load(model)
        finally:
            _WATCH.clear()
        code = (sys.prefix, sys.base_prefix, str(Path(agp.__file__).parent))  # imports
        outside = [p for p in _OPENED if Path(p).resolve().parent != model.resolve()
                   and not p.startswith(code) and "site-packages" not in p]
        if outside:
            raise PermissionError(f"load read outside the model directory: {outside}")
        Xt = Xfix(7, 5)
        if hasattr(obj, "predict_f"):
            return obj.predict_f(Xt)
        return obj.predict_proba(Xt) if hasattr(obj, "predict_proba") else obj.predict(Xt)
    finally:
        shutil.rmtree(model.parent, ignore_errors=True)


test_persistence, test_persistence_full = property_test(
    "persistence", persistence_cases, 16, 1000)(
    lambda case: check("persistence", case, lambda: persistence_call(case),
                       NAMES + ("path", "file", "manifest")))


# --- command line --------------------------------------------------------------------------

@st.composite
def cli_cases(draw, ci=False):
    lik = draw(pick(["gaussian", "logistic", "poisson", "student_t", "softmax", "bogus"],
                    ["gaussian", "bogus"], ci))
    kind = {"logistic": "binary01", "softmax": "classes3", "poisson": "counts"}.get(lik, "real")
    return {"likelihood": lik, "X": draw(arrays(N, D)), "y": draw(targets(kind)),
            "target": draw(st.sampled_from(["y", "y", "y", "x0", "missing", ""])),
            "options": draw(st.lists(st.sampled_from(
                [("--max-iter", "5"), ("--max-iter", "0"), ("--max-iter", "-2"),
                 ("--inducing", "4"), ("--inducing", "0"), ("--batch-size", "8"),
                 ("--batch-size", "-1"), ("--kernel", "matern52"), ("--kernel", "bogus"),
                 ("--seed", "-5")]), max_size=3)),
            "level": draw(st.sampled_from(["0.9", "0.9", "1.5", "nan", "0"])),
            "test": draw(arrays(5, D))}


def _frame(X, y=None):
    import pandas as pd

    X = np.asarray(X)
    X = X.reshape(len(X), -1) if X.ndim and X.size else X.reshape(1, 1) if X.size \
        else np.zeros((0, 1))
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
    if y is not None:
        y = np.asarray(y).ravel()
        frame["y"] = np.resize(y, len(frame)) if len(y) else np.nan
    return frame


def cli_call(case):
    from typer.testing import CliRunner

    from augmentedgp.cli import app

    runner = CliRunner()
    work = Path(tempfile.mkdtemp(prefix="agp-cli-"))
    try:
        X = build_X(case["X"])
        train, test = work / "train.csv", work / "test.csv"
        _frame(X, build_y(case["y"], len(X) if np.ndim(X) else 1)).to_csv(train, index=False)
        _frame(build_X(case["test"]), np.zeros(5)).to_csv(test, index=False)
        opts = [a for pair in case["options"] for a in pair]
        runs = [["fit", str(train), "--target", case["target"], "--out", str(work / "m"),
                 "--likelihood", case["likelihood"], "--quiet", *opts],
                ["predict", str(work / "m"), str(test), "--level", case["level"]],
                ["evaluate", str(work / "m"), str(test), "--no-plot", "--level", case["level"]]]
        outputs = []
        for args in runs:
            result = runner.invoke(app, args)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            if result.exit_code != 0:
                if "Error" not in result.output and not result.output.strip():
                    raise RuntimeError(f"exit {result.exit_code} without a message")
                raise CLIRefused(result.output.strip().splitlines()[-1][:200])
            outputs.append(result.output)
        import pandas as pd

        pred = pd.read_csv(io.StringIO(outputs[1]))
        numeric = pred.select_dtypes("number").to_numpy()
        metrics_nan = re.search(r"(?<![\w.])-?(nan|inf)(?!\w)", outputs[2].lower())
        return numeric, np.nan if metrics_nan else 0.0  # predictions and metrics: finite
    finally:
        shutil.rmtree(work, ignore_errors=True)


class CLIRefused(ValueError):
    """The CLI exited with an error message (a typed refusal)."""


def _cli_check(case):
    return check("cli", case, lambda: cli_call(case), typed=(CLIRefused,))


test_cli, test_cli_full = property_test("cli", cli_cases, 3, 100)(_cli_check)
