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

    python benchmarks/sklearn_estimators.py            # ~10 min, writes RESULTS.md
    python benchmarks/sklearn_estimators.py --quick    # smaller, no write
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


def main():
    p = H.parser(__doc__)
    p.add_argument("--n-train", type=int, default=None, help="ijcnn1 training rows")
    p.add_argument("--n-train-multi", type=int, default=None, help="letter training rows")
    p.add_argument("--n-test", type=int, default=None, help="test rows (classification)")
    p.add_argument("--seed", type=int, default=0)
    args = H.parse(p, {"n_train": 150, "n_train_multi": 150, "n_test": 500},
                   {"n_train": 1000, "n_train_multi": 500, "n_test": 2000})
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
    text = H.report("scikit-learn estimators: augmentedgp.sklearn vs scikit-learn's GP "
                    "estimators", intro, body)
    H.finish(args, text, rows)


if __name__ == "__main__":
    main()
