"""The scikit-learn estimators against scikit-learn's own Gaussian-process estimators.

augmentedgp.sklearn's GPRegressor / GPClassifier (default settings) and scikit-learn's
GaussianProcessRegressor / GaussianProcessClassifier as their users configure them: a
StandardScaler pipeline, ConstantKernel * RBF(ARD) (+ WhiteKernel for regression),
``normalize_y=True``, L-BFGS-B from one start, float64; the classifier is Laplace's
approximation, one-vs-rest for several classes. Problems (the published split 0 or the
official split where there is one): ``yacht`` regression; ``yacht`` with 10% of the training
targets replaced by gross outliers (+-5 sd), the robust Student-t GPRegressor against both
Gaussian models; ``ijcnn1`` binary and ``letter`` 26-class classification.
Reported: the first fit (a new data shape compiles) and a second fit on the same shapes, the
ratio of fit times, test RMSE / accuracy and test NLL (log loss for classifiers).

A second section, "defaults at 20,000 rows", fits the estimators with their defaults once
each in this process (compilation included, as a user meets it) on 20,000 training rows:
``GPClassifier()`` on ijcnn1 and electricity (target <= 10 s on an idle machine),
``GPRegressor()`` on kin40k and protein (target <= 20 s), and ``GPClassifier()`` on letter
(26 classes, its 16,000 training rows); test NLL and accuracy / RMSE on held-out rows.
``--baseline`` also fits the classifiers' previous defaults (full-batch VI for 500
iterations, ``batch_size=None``), slow (minutes each); GPRegressor's defaults are unchanged
(SGPR with M = 500, L-BFGS on all rows).

    python benchmarks/sklearn_estimators.py            # ~15 min, writes RESULTS.md
    python benchmarks/sklearn_estimators.py --quick    # smaller (3,000 rows), no write
    python benchmarks/sklearn_estimators.py --only-defaults --threads 0 --no-write
"""

from __future__ import annotations

import time

import harness as H

H.start("sklearn_estimators.py", pin="process", peers=("sklearn",))

import numpy as np  # noqa: E402
from harness import fmt, markdown_table, ratio  # noqa: E402

from augmentedgp.sklearn import GPClassifier, GPRegressor  # noqa: E402


def sk_regressor(d):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    kernel = ConstantKernel() * RBF(np.ones(d)) + WhiteKernel(0.1)
    return make_pipeline(StandardScaler(), GaussianProcessRegressor(kernel, normalize_y=True))


def sk_classifier(d):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), GaussianProcessClassifier(
        ConstantKernel() * RBF(np.ones(d))))


def metrics(est, task, X, y):
    from sklearn.metrics import log_loss

    if task == "regression":
        mean = est.predict(X)
        if isinstance(est, GPRegressor):
            nll = float(-np.mean(est.log_predictive_density(X, y)))
        else:  # scikit-learn: sd of y (WhiteKernel included)
            _, sd = est.predict(X, return_std=True)
            nll = float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + 0.5 * ((y - mean) / sd) ** 2))
        return {"RMSE": float(np.sqrt(np.mean((mean - y) ** 2))), "NLL": nll}
    proba, classes = est.predict_proba(X), list(est.classes_)
    seen = np.isin(y, classes)  # the NLL over test rows of classes seen in training
    return {"accuracy": float(np.mean(np.asarray(classes)[proba.argmax(1)] == y)),
            "NLL": float(log_loss([classes.index(v) for v in y[seen]], proba[seen],
                                  labels=range(len(classes))))}


def run_problem(name, task, data, methods):
    rows = []
    for label, make in methods:
        times = []
        for _ in range(2):  # the first fit compiles (augmentedgp); the second does not
            est, t0 = make(), time.perf_counter()
            est.fit(data.X, data.y)
            times.append(time.perf_counter() - t0)
        rows.append({"problem": name, "method": label, "first": times[0], "fit": times[1],
                     **metrics(est, task, data.X_test, data.y_test)})
        print(f"{name:18s} {label:46s} first {times[0]:7.2f}s  fit {times[1]:7.2f}s  "
              + "  ".join(f"{k} {v:.4f}" for k, v in rows[-1].items() if k in
                          ("RMSE", "accuracy", "NLL")), flush=True)
    return rows


DEFAULT_PROBLEMS = (("ijcnn1", "classification", 10.0), ("electricity", "classification", 10.0),
                    ("kin40k", "regression", 20.0), ("protein", "regression", 20.0),
                    ("letter", "classification", None))


def previous_defaults():
    """GPClassifier's defaults before the size-dependent policy (for ``--baseline``)."""
    return GPClassifier(batch_size=None, random_state=0)


def defaults_section(args):
    """Each problem fitted once with the estimator's defaults (compilation included)."""
    import os
    import resource
    import warnings

    cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    rows, splits = [], []
    for name, task, target in DEFAULT_PROBLEMS:
        if args.problems and name not in args.problems.split(","):
            continue
        data = H.dataset(name, "auto", args.n_defaults, args.n_test_defaults, seed=args.seed,
                         test_fraction=0.2, scale_x=False, y_dtype=None)
        splits.append(f"{name}: {data.split}")
        makers = [("defaults", lambda t=task: (GPClassifier if t == "classification"
                                                else GPRegressor)(random_state=0))]
        if args.baseline and task == "classification":
            makers.append(("previous defaults", previous_defaults))
        for label, make in makers:
            est, load = make(), os.getloadavg()[0]
            c0, t0 = cpu(), time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                est.fit(data.X, data.y)
            secs, cpu_secs = time.perf_counter() - t0, cpu() - c0
            m = metrics(est, task, data.X_test, data.y_test)
            warned = any("stopped before converging" in str(w.message) for w in caught)
            rows.append({"problem": f"{name} ({data.n} train, {len(data.y_test)} test)",
                         "estimator": f"{type(est).__name__} {label}", "seconds": secs,
                         "cpu_seconds": cpu_secs, "target": target, "load": load,
                         "n_iter": est.n_iter_, "warned": warned, **m})
            print(f"{name:12s} {label:18s} {secs:7.2f}s (cpu {cpu_secs:7.2f}s, load {load:.1f})"
                  f"  NLL {m['NLL']:.4f}  " + "  ".join(f"{k} {v:.4f}" for k, v in m.items()
                                                     if k != "NLL") + f"  n_iter {est.n_iter_}"
                  + ("  (ConvergenceWarning)" if warned else ""), flush=True)
    table = [[r["problem"], r["estimator"], fmt(r["seconds"], ".1f"), fmt(r["cpu_seconds"], ".1f"),
              "—" if r["target"] is None else f"<= {r['target']:g}",
              fmt(r.get("RMSE", r.get("accuracy")), ".4f"), fmt(r["NLL"], ".4f"), r["n_iter"],
              "yes" if r["warned"] else "no", fmt(r["load"], ".1f")] for r in rows]
    intro = ("### Defaults at 20,000 rows\n\nOne fit per estimator in this process, as a user "
             "meets it: the time includes compilation and the k-means inducing inputs; CPU "
             "seconds are the process's user + system time (a bound on the wall time on an idle "
             "machine with one core, whatever the load). Targets (wall, idle machine): "
             "GPClassifier() <= 10 s, GPRegressor() <= 20 s. NLL: test mean negative log "
             "predictive density (log loss for the classifiers). Splits: " + "; ".join(splits)
             + ".")
    body = markdown_table(["problem", "estimator", "fit (s)", "CPU (s)", "target (s)",
                           "RMSE or accuracy", "test NLL", "iterations", "ConvergenceWarning",
                           "load"], table)
    return rows, intro + "\n\n" + body


def main():
    p = H.parser(__doc__)
    p.add_argument("--n-train", type=int, default=None, help="ijcnn1 training rows")
    p.add_argument("--n-train-multi", type=int, default=None, help="letter training rows")
    p.add_argument("--n-test", type=int, default=None, help="test rows (classification)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-defaults", type=int, default=None,
                   help="training rows of the 'defaults' section")
    p.add_argument("--n-test-defaults", type=int, default=None,
                   help="test rows of the 'defaults' section")
    p.add_argument("--baseline", action="store_true",
                   help="'defaults' section: also the previous defaults (slow)")
    p.add_argument("--only-defaults", action="store_true", help="only the 'defaults' section")
    p.add_argument("--problems", default=None,
                   help="'defaults' section: a comma-separated subset of "
                   + ",".join(name for name, _, _ in DEFAULT_PROBLEMS))
    p.add_argument("--skip-defaults", action="store_true", help="no 'defaults' section")
    args = H.parse(p, {"n_train": 150, "n_train_multi": 150, "n_test": 500,
                       "n_defaults": 3000, "n_test_defaults": 1000},
                   {"n_train": 1000, "n_train_multi": 500, "n_test": 2000,
                    "n_defaults": 20000, "n_test_defaults": 5000})
    defaults = None if args.skip_defaults else defaults_section(args)
    if args.only_defaults:
        text = H.report("scikit-learn estimators: defaults at 20,000 rows", [defaults[1]], [])
        H.finish(args, text, defaults[0], section="defaults")
        return
    load = lambda name, n, n_test: H.dataset(name, "auto", n, n_test, seed=args.seed,
                                             test_fraction=0.2, scale_x=False,
                                             y_dtype=None)
    yacht = load("yacht", None, None)
    d, svgp = yacht.d, "augmentedgp GPClassifier() (SVGP, M = 100)"
    rows = run_problem("yacht", "regression", yacht, [
        ("augmentedgp GPRegressor()", lambda: GPRegressor(random_state=0)),
        ("scikit-learn GaussianProcessRegressor", lambda: sk_regressor(d))])
    rng = np.random.default_rng(args.seed)
    bad = rng.permutation(yacht.n)[: yacht.n // 10]
    outliers = H.Data("yacht + 10% outliers", yacht.X, yacht.y.copy(), yacht.X_test,
                      yacht.y_test, yacht.split)
    outliers.y[bad] += rng.choice([-5.0, 5.0], len(bad)) * yacht.y.std()
    rows += run_problem(outliers.name, "regression", outliers, [
        ("augmentedgp GPRegressor('student_t')", lambda: GPRegressor("student_t",
                                                                     random_state=0)),
        ("augmentedgp GPRegressor()", lambda: GPRegressor(random_state=0)),
        ("scikit-learn GaussianProcessRegressor", lambda: sk_regressor(d))])
    ij = load("ijcnn1", args.n_train, args.n_test)
    rows += run_problem(f"ijcnn1 ({ij.n} train)", "classification", ij, [
        (svgp, lambda: GPClassifier(random_state=0)),
        ("augmentedgp GPClassifier(n_inducing=None) (VGP)",
         lambda: GPClassifier(n_inducing=None, random_state=0)),
        ("scikit-learn GaussianProcessClassifier", lambda: sk_classifier(ij.d))])
    le = load("letter", args.n_train_multi, args.n_test)
    rows += run_problem(f"letter ({le.n} train)", "classification", le, [
        (svgp, lambda: GPClassifier(random_state=0)),
        ("scikit-learn GaussianProcessClassifier (OvR)", lambda: sk_classifier(le.d))])
    table = []
    for r in rows:
        ref = next(q for q in rows if q["problem"] == r["problem"]
                   and q["method"].startswith("scikit-learn"))
        table.append([r["problem"], r["method"], fmt(r["first"], ".2f"), fmt(r["fit"], ".2f"),
                      fmt(ratio(r["fit"], ref["fit"]), ".2f"),
                      fmt(r.get("RMSE", r.get("accuracy")), ".4f"), fmt(r["NLL"], ".4f")])
    intro = ["'first fit' includes JAX compilation (a new data shape compiles); 'fit' is a "
             "second fit on the same shapes; the ratio is 'fit' over scikit-learn's 'fit'. RMSE "
             "for regression, accuracy for classification; NLL is the test mean negative log "
             "predictive density (log loss for classifiers). Splits: "
             + "; ".join(f"{x.name}: {x.split}" for x in (yacht, ij, le)) + "."]
    body = [markdown_table(["problem", "method", "first fit (s)", "fit (s)", "fit / sklearn",
                            "RMSE or accuracy", "test NLL"], table)]
    if defaults is not None:
        body.append(defaults[1])
        rows = rows + defaults[0]
    text = H.report("scikit-learn estimators: augmentedgp.sklearn vs scikit-learn's GP "
                    "estimators", intro, body)
    H.finish(args, text, rows)


if __name__ == "__main__":
    main()
