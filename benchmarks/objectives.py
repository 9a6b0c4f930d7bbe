"""AnalyticVI's hyperparameter objectives against QuadratureVI (issue 22).

``small``: for each augmented likelihood, a 1-d problem (120 training, 80 held-out points,
f = 2 sin(1.5 x)); VGP with RBF(1, 1) fitted for 3,000 iterations (Adam 0.02) by
QuadratureVI(0.5) (the plain ELBO at its optimum), AnalyticVI() (the augmented bound) and
AnalyticVI(objective="exact") (closed-form q(u), hyperparameters on the plain ELBO) and
AnalyticVI(objective="tight") (the augmented fit, then tight sites: the plain ELBO's
optimum); prints the learned kernel and likelihood parameters, the held-out NLL, the
largest difference of the latent mean from QuadratureVI's and the mean ratio of latent sd
to QuadratureVI's.

``robust``: GPRegressor's robust likelihoods, see :func:`robust`.

``multiclass``: GPClassifier's multi-class configurations, see :func:`multiclass`.

    .venv/bin/python benchmarks/objectives.py small
    .venv/bin/python benchmarks/objectives.py multiclass --rows 3000 --batch 200 --max-iter 6000
    .venv/bin/python benchmarks/objectives.py robust --dataset protein --rows 2000
    .venv/bin/python benchmarks/objectives.py multiclass --dataset digits --rows 600
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from pathlib import Path

import numpy as np

import augmentedgp as agp
import augmentedgp.inference.plan as agp_plan
import augmentedgp.sklearn as agp_sklearn

L = agp.likelihoods
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def small_problems(rng, n=200):
    X = rng.uniform(-3, 3, (n, 1))
    f = 2.0 * np.sin(1.5 * X[:, 0])
    sig = 1 / (1 + np.exp(-f))
    return X, {
        "Logistic": (L.Logistic, (rng.uniform(size=n) < sig).astype(float)),
        "StudentT": (lambda: L.StudentT(4.0, 0.3), f + 0.3 * rng.standard_t(4, n)),
        "Laplace": (lambda: L.Laplace(0.3), f + rng.laplace(0, 0.3, n)),
        "Matern32": (lambda: L.Matern32(0.3), f + 0.3 * rng.standard_t(6, n)),
        "NegativeBinomial": (lambda: L.NegativeBinomial(2.0),
                             rng.negative_binomial(2.0, 1 / (1 + np.exp(f))).astype(float)),
        "LogisticPoisson": (lambda: L.LogisticPoisson(10.0),
                            rng.poisson(10 * sig).astype(float)),
    }


def small(args):
    X, cases = small_problems(np.random.default_rng(0))
    tr, te = slice(0, 120), slice(120, None)
    methods = [("QuadratureVI", agp.QuadratureVI(0.5)), ("augmented", agp.AnalyticVI()),
               ("exact", agp.AnalyticVI(objective="exact")),
               ("tight", agp.AnalyticVI(objective="tight"))]
    print("| likelihood | inference | kernel variance | lengthscale | likelihood parameter | "
          "held-out NLL | max abs mean diff | sd / QuadratureVI's sd |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (lik, y) in cases.items():
        ref = None
        for label, inference in methods:  # the reference: QuadratureVI's fit
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                post = agp.fit(agp.VGP(agp.kernels.RBF(1.0, 1.0), lik()), X[tr], y[tr],
                               inference, max_iter=args.max_iter or 3000, learning_rate=0.02,
                               tol=0.0)
            k, like = post.model.kernel, post.model.likelihood
            nll = -float(np.mean(post.predict_log_density(X[te], y[te])))
            m, v = (np.asarray(a) for a in post.predict_f(X[te]))
            ref = ref or (m, np.sqrt(v))
            param = " ".join(f"{p} {float(getattr(like, p).value):.3f}"
                             for p in ("scale", "r", "rate") if hasattr(like, p))
            print(f"| {name} | {label} | {float(k.variance.value):.3f} | "
                  f"{float(k.lengthscale.value):.3f} | {param or '—'} | {nll:.4f} | "
                  f"{np.max(np.abs(m - ref[0])):.3f} | {np.mean(np.sqrt(v) / ref[1]):.3f} |",
                  flush=True)


@contextlib.contextmanager
def estimator_objective(objective):
    """The estimators fit their augmented models with ``objective`` (None: the plan's own
    choice, ``inference.plan.augmented_objective``) inside the block."""
    default = agp_plan.augmented_objective
    if objective is not None:
        agp_plan.augmented_objective = lambda likelihood, minibatch: objective
    try:
        yield
    finally:
        agp_plan.augmented_objective = default


def robust(args):
    """GPRegressor (Student-t, Laplace) on ``--rows`` rows of kin40k or protein
    (``--dataset``), targets standardised, 5% of the training targets moved by 3-6 sd;
    2,000 held out: the default ("tight"), the augmented objective and
    inference="quadrature"."""
    with np.load(DATA / f"{args.dataset}.npz") as d:
        X, y = d["X"], d["y"].astype(float)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    i, j = idx[:args.rows], idx[args.rows:args.rows + 2000]
    mu, sd = y[i].mean(), y[i].std()
    ytr, yte = (y[i] - mu) / sd, (y[j] - mu) / sd
    out = rng.uniform(size=args.rows) < 0.05
    ytr[out] += rng.choice([-1.0, 1.0], out.sum()) * rng.uniform(3.0, 6.0, out.sum())
    for lik in ("laplace", "student_t"):
        cells = []
        for label in ("default", "augmented", "quadrature"):
            t = time.perf_counter()
            with warnings.catch_warnings(), estimator_objective(
                    "augmented" if label == "augmented" else None):
                warnings.simplefilter("ignore")
                est = agp_sklearn.GPRegressor(
                    lik, inference="quadrature" if label == "quadrature" else "auto",
                    random_state=0).fit(X[i], ytr)
            nll = -np.mean(est.log_predictive_density(X[j], yte))
            cells.append(f"{label} {nll:.4f} ({time.perf_counter() - t:.0f} s)")
        print(f"{args.dataset} {args.rows} rows {lik}: " + " | ".join(cells), flush=True)


def multiclass(args):
    """GPClassifier on ``--rows`` rows of letter's first 5 classes or scikit-learn's digits
    (10 classes; ``--dataset``), inputs as given (the estimator standardises them), up to
    1,000 other rows held out (letter has 3,864: 864 beside 3,000 training rows): the
    logistic-softmax with each of AnalyticVI's objectives and GPClassifier("softmax")
    (QuadratureVI / QuadratureSVI), at the estimator's ``--batch`` and ``--max-iter``."""
    if args.dataset == "digits":
        from sklearn.datasets import load_digits
        d = load_digits()
        X, y = d.data, d.target
    else:
        with np.load(DATA / "letter.npz") as d:
            keep = d["y"] < 5
            X, y = d["X"][keep], d["y"][keep]
    idx = np.random.default_rng(0).permutation(len(y))
    i, j = idx[:args.rows], idx[args.rows:args.rows + 1000]
    batch = {"auto": "auto", "none": None}.get(args.batch) or int(args.batch)
    cells = []
    for label in ("augmented", "exact", "tight", "softmax"):
        t = time.perf_counter()
        with warnings.catch_warnings(), estimator_objective(
                None if label == "softmax" else label):
            warnings.simplefilter("ignore")
            clf = agp_sklearn.GPClassifier("softmax" if label == "softmax" else "logistic",
                                           batch_size=batch, max_iter=args.max_iter,
                                           random_state=0).fit(X[i], y[i])
        P = clf.predict_proba(X[j])
        nll = -np.mean(np.log(P[np.arange(len(j)), y[j]]))
        cells.append(f"{label} {nll:.4f} ({time.perf_counter() - t:.0f} s)")
    print(f"{args.dataset} {args.rows} rows, batch {args.batch}: " + " | ".join(cells),
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("small", "robust", "multiclass"))
    p.add_argument("--batch", default="auto",
                   help="multiclass: the estimator's batch_size")
    p.add_argument("--max-iter", type=int, default=None)
    p.add_argument("--dataset", default=None,
                   choices=("kin40k", "protein", "letter", "digits"),
                   help="robust: kin40k (default) or protein; multiclass: letter (default) "
                        "or digits")
    p.add_argument("--rows", type=int, default=2000, help="robust: training rows")
    args = p.parse_args()
    args.dataset = args.dataset or {"multiclass": "letter"}.get(args.part, "kin40k")
    {"small": small, "robust": robust, "multiclass": multiclass}[args.part](args)


if __name__ == "__main__":
    main()
