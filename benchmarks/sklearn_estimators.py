"""The scikit-learn estimators against scikit-learn's own Gaussian-process estimators.

augmentedgp.sklearn's GPRegressor / GPClassifier (default settings) and scikit-learn's
GaussianProcessRegressor / GaussianProcessClassifier configured as their users would: a
StandardScaler pipeline, ConstantKernel * RBF(ARD) (+ WhiteKernel for regression),
``normalize_y=True``, L-BFGS-B from one start (``n_restarts_optimizer=0``), float64. The
classifier is Laplace's approximation with one-vs-rest for several classes (scikit-learn's
only choice). Problems (../shared/data, the published split 0 where there is one):

- ``yacht`` regression (all 246 / 62 rows of split 0);
- ``yacht`` with 10% of the training targets replaced by gross outliers (+-5 sd): the
  robust Student-t GPRegressor against both Gaussian models;
- ``ijcnn1`` binary classification (``--n-train`` random training rows, 2000 test rows);
- ``letter`` 26-class classification (``--n-train-multi`` training rows, 2000 test rows).

Reported per problem: fit seconds (wall, one process, after a warm-up fit of each library
on a tiny slice so JAX compilation of the shapes is NOT excluded -- a first fit compiles --
reported both ways), the ratio of the fit times, test RMSE / accuracy and test NLL (mean
negative log predictive density; for classifiers the log loss).

    python benchmarks/sklearn_estimators.py            # ~10 min, writes RESULTS.md
    python benchmarks/sklearn_estimators.py --quick    # smaller, no write
"""

from __future__ import annotations

import sys

from _threads import single_thread

THREADS, PINNED = single_thread(sys.argv[1:])

import argparse  # noqa: E402
import datetime  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _report import REPO, checkout, cpu_model, fmt, markdown_table, ratio, write_results  # noqa: E402
from sklearn.gaussian_process import GaussianProcessClassifier, GaussianProcessRegressor  # noqa: E402
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel  # noqa: E402
from sklearn.metrics import log_loss  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

sys.path.insert(0, str(REPO / "src"))
from augmentedgp.sklearn import GPClassifier, GPRegressor  # noqa: E402

DATA = REPO.parent / "shared" / "data"
BEGIN = "<!-- BEGIN sklearn_estimators.py (generated, overwritten on each run) -->"
END = "<!-- END sklearn_estimators.py -->"


def load(name):
    with np.load(DATA / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def split(d, n_train, n_test, seed):
    if "X_train" in d:
        Xtr, ytr, Xte, yte = d["X_train"], d["y_train"], d["X_test"], d["y_test"]
    elif "split_test_mask" in d:  # the published split `seed`
        test = d["split_test_mask"][seed]
        Xtr, ytr, Xte, yte = d["X"][~test], d["y"][~test], d["X"][test], d["y"][test]
    else:
        idx = np.random.default_rng(seed).permutation(len(d["y"]))
        cut = int(0.8 * len(idx))
        Xtr, ytr, Xte, yte = (d["X"][idx[:cut]], d["y"][idx[:cut]], d["X"][idx[cut:]],
                              d["y"][idx[cut:]])
    rng = np.random.default_rng(seed)
    tr = rng.permutation(len(ytr))[:n_train]
    te = rng.permutation(len(yte))[:n_test]
    return Xtr[tr], ytr[tr], Xte[te], yte[te]


def sk_regressor(d):
    kernel = ConstantKernel() * RBF(np.ones(d)) + WhiteKernel(0.1)
    return make_pipeline(StandardScaler(), GaussianProcessRegressor(kernel, normalize_y=True))


def sk_classifier(d):
    return make_pipeline(StandardScaler(), GaussianProcessClassifier(
        ConstantKernel() * RBF(np.ones(d))))


def regression_nlpd(est, X, y):
    if isinstance(est, GPRegressor):
        return float(-np.mean(est.log_predictive_density(X, y)))
    mean, sd = est.predict(X, return_std=True)  # scikit-learn: sd of y (WhiteKernel included)
    return float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + 0.5 * ((y - mean) / sd) ** 2))


def timed_fit(make, X, y):
    est = make()
    t0 = time.perf_counter()
    est.fit(X, y)
    return est, time.perf_counter() - t0


def run_problem(name, task, X, y, Xte, yte, methods):
    rows = []
    for label, make in methods:
        est, first = timed_fit(make, X, y)  # includes JAX compilation for augmentedgp
        _, second = timed_fit(make, X, y)   # same shapes: compiled already
        if task == "regression":
            mean = est.predict(Xte)
            metrics = {"RMSE": float(np.sqrt(np.mean((mean - yte) ** 2))),
                       "NLL": regression_nlpd(est, Xte, yte)}
        else:
            proba = est.predict_proba(Xte)
            classes = list(est.classes_)
            codes = np.array([classes.index(v) for v in yte])
            metrics = {"accuracy": float(np.mean(np.asarray(classes)[proba.argmax(1)] == yte)),
                       "NLL": float(log_loss(codes, proba, labels=range(len(classes))))}
        rows.append({"problem": name, "method": label, "first": first, "fit": second, **metrics})
        print(f"{name:18s} {label:42s} first {first:7.2f}s  fit {second:7.2f}s  "
              + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-train-multi", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument("--write", action="store_true", help="write RESULTS.md even if --quick")
    args = parser.parse_args(argv)
    n_bin, n_multi = (300, 200) if args.quick else (args.n_train, args.n_train_multi)
    rows = []

    Xtr, ytr, Xte, yte = split(load("yacht"), 10**6, 10**6, args.seed)
    d = Xtr.shape[1]
    rows += run_problem("yacht", "regression", Xtr, ytr, Xte, yte, [
        ("augmentedgp GPRegressor()", lambda: GPRegressor(random_state=0)),
        ("scikit-learn GaussianProcessRegressor", lambda: sk_regressor(d))])
    rng = np.random.default_rng(args.seed)
    bad = rng.permutation(len(ytr))[: len(ytr) // 10]
    y_out = ytr.copy()
    y_out[bad] += rng.choice([-5.0, 5.0], len(bad)) * ytr.std()
    rows += run_problem("yacht + 10% outliers", "regression", Xtr, y_out, Xte, yte, [
        ("augmentedgp GPRegressor('student_t')",
         lambda: GPRegressor("student_t", random_state=0)),
        ("augmentedgp GPRegressor()", lambda: GPRegressor(random_state=0)),
        ("scikit-learn GaussianProcessRegressor", lambda: sk_regressor(d))])

    Xtr, ytr, Xte, yte = split(load("ijcnn1"), n_bin, 2000, args.seed)
    d = Xtr.shape[1]
    rows += run_problem(f"ijcnn1 ({len(ytr)} train)", "classification", Xtr, ytr, Xte, yte, [
        ("augmentedgp GPClassifier() (SVGP, M = 100)", lambda: GPClassifier(random_state=0)),
        ("augmentedgp GPClassifier(n_inducing=None) (VGP)",
         lambda: GPClassifier(n_inducing=None, random_state=0)),
        ("scikit-learn GaussianProcessClassifier", lambda: sk_classifier(d))])

    Xtr, ytr, Xte, yte = split(load("letter"), n_multi, 2000, args.seed)
    d = Xtr.shape[1]
    rows += run_problem(f"letter ({len(ytr)} train)", "classification", Xtr, ytr, Xte, yte, [
        ("augmentedgp GPClassifier() (SVGP, M = 100)", lambda: GPClassifier(random_state=0)),
        ("scikit-learn GaussianProcessClassifier (OvR)", lambda: sk_classifier(d))])

    table = []
    for r in rows:
        ref = next(q for q in rows if q["problem"] == r["problem"]
                   and q["method"].startswith("scikit-learn"))
        table.append([r["problem"], r["method"], fmt(r["first"], ".2f"), fmt(r["fit"], ".2f"),
                      fmt(ratio(r["fit"], ref["fit"]), ".2f"),
                      fmt(r.get("RMSE", r.get("accuracy")), ".4f"), fmt(r["NLL"], ".4f")])
    text = "\n".join([
        "## scikit-learn estimators: augmentedgp.sklearn vs scikit-learn's GP estimators",
        "",
        f"`python benchmarks/sklearn_estimators.py{' --quick' if args.quick else ''}` on "
        f"{datetime.date.today()}{checkout()}, {cpu_model()}, "
        f"{'one pinned CPU, single-threaded' if THREADS == 1 else 'default threads'}. "
        "'first fit' includes JAX compilation (a new data shape compiles); 'fit' is a second "
        "fit on the same shapes; the ratio is 'fit' over scikit-learn's 'fit'. RMSE for "
        "regression, accuracy for classification; NLL is the test mean negative log "
        "predictive density (log loss for classifiers).",
        "",
        markdown_table(["problem", "method", "first fit (s)", "fit (s)", "fit / sklearn",
                        "RMSE or accuracy", "test NLL"], table)])
    print(text)
    if not args.quick or args.write:
        write_results(text, BEGIN, END)


if __name__ == "__main__":
    main()
