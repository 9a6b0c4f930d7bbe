"""The second-order Taylor approximation for GP classification against the collapsed
augmented bound and quadrature VI, on the same data.

Logistic classification on a9a, ijcnn1, electricity and bank (``--n-train`` random training
rows, M fixed k-means inducing inputs, an RBF kernel fitted by each method):

- ``taylor``: ``TaylorSGPR`` by ``agp.fit`` (rounds of xi = E_q[f] and L-BFGS on
  the Taylor objective -- an approximation of log p(y), not a bound);
- ``augmented``: ``SGPR`` with the Polya-Gamma augmented (Jaakkola-Jordan) bound collapsed,
  by ``agp.fit`` (rounds of closed-form q(w) and L-BFGS);
- ``QuadratureVI``: ``SVGP`` on the plain ELBO (natural steps on q(u), Adam on the
  hyperparameters), full batch, by ``agp.fit``.

For each: wall time (compilation included), the method's own final objective, the plain
ELBO of its final q(u) and hyperparameters (by quadrature: the one bound all three can be
compared on), test NLL and error, and the learned kernel.

    .venv/bin/python benchmarks/taylor.py            # 4 data sets, 2000 rows (~4 min)
    .venv/bin/python benchmarks/taylor.py --quick    # a9a, 500 rows, no write
"""

from __future__ import annotations

import time

import harness as H

H.start("taylor.py", threads=0)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp.core.params import fixed, real  # noqa: E402

METHODS = ("taylor", "augmented", "QuadratureVI")


def model(name, Z, d):
    kernel = agp.kernels.RBF(lengthscale=float(np.sqrt(d)), variance=1.0)
    Zp = fixed(real(Z))
    if name == "QuadratureVI":
        return agp.SVGP(kernel, agp.likelihoods.Logistic(), Zp)
    cls = agp.TaylorSGPR if name == "taylor" else agp.SGPR
    return cls(kernel, Zp, likelihood=agp.likelihoods.Logistic())


def run(name, data, Z, args):
    start = time.perf_counter()
    if name == "QuadratureVI":
        post = agp.fit(model(name, Z, data.d), data.X, data.y, agp.QuadratureVI(),
                       max_iter=args.max_iter, learning_rate=0.05, tol=1e-7)
        objective, steps = -float(post.history.objective[-1]), f"{post.history.n_iter} it"
    else:
        post = agp.fit(model(name, Z, data.d), data.X, data.y)
        objective = float(post.history.bounds[-1])
        steps = f"{post.history.n_rounds} rounds"
    seconds = time.perf_counter() - start
    yt = data.y_test
    nll = -float(np.mean(np.asarray(post.predict_log_density(data.X_test, yt))))
    err = float(np.mean(np.where(np.asarray(post.predict_proba(data.X_test)) > 0.5, 1.0, -1.0)
                        != yt))
    k = post.model.kernel
    return {"seconds": seconds, "steps": steps, "converged": bool(post.history.converged),
            "objective": objective / data.n, "elbo": post.elbo() / data.n, "nll": nll,
            "error": err, "lengthscale": float(k.lengthscale.value),
            "variance": float(k.variance.value)}


def main():
    p = H.parser(__doc__)
    H.race_options(p, "datasets", "n-train", "n-test", "M")
    p.add_argument("--max-iter", type=int, default=None, help="QuadratureVI's iterations")
    args = H.parse(p, quick=dict(datasets="a9a", n_train=500, n_test=2000, M=30,
                                 max_iter=1000),
                   full=dict(datasets="a9a,ijcnn1,electricity,bank", n_train=2000,
                             n_test=5000, M=50, max_iter=3000))
    rows, raw = [], {}
    for name in H.csv(args.datasets):
        data = H.dataset(name, "time" if name == "electricity" else "auto", args.n_train,
                         args.n_test)
        labels = np.unique(data.y)
        data.y, data.y_test = (np.where(v == labels[-1], 1.0, -1.0) for v in (data.y,
                                                                               data.y_test))
        Z = np.asarray(agp.inducing.kmeans(data.X, args.M, jax.random.key(0)))
        for method in METHODS:
            r = run(method, data, Z, args)
            raw[f"{name}/{method}"] = r
            print(name, method, r, flush=True)
            rows.append(f"| {name} | {method} | {r['seconds']:.1f} | {r['steps']}"
                        f"{'' if r['converged'] else ' (not converged)'} | "
                        f"{r['objective']:.4f} | {r['elbo']:.4f} | {r['nll']:.4f} | "
                        f"{r['error']:.4f} | {r['lengthscale']:.3g} | {r['variance']:.3g} |")
    body = ["| data | method | seconds | steps | own objective / n | ELBO / n | test NLL | "
            "test error | lengthscale | variance |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
            "Own objective: taylor's is the Taylor approximation (not a bound); augmented's the "
            "collapsed augmented bound; QuadratureVI's the ELBO. ELBO: the plain ELBO of the "
            "final q(u) and hyperparameters, by Gauss-Hermite quadrature (a lower bound on "
            "log p(y) for all three)."]
    intro = [f"Logistic classification, {args.n_train} random training rows and {args.n_test} "
             f"test rows per data set, M = {args.M} fixed k-means inducing inputs, RBF kernel "
             "(lengthscale sqrt(d), variance 1 at the start). agp.fit defaults for TaylorSGPR "
             f"and SGPR; QuadratureVI full batch, Adam 0.05, at most {args.max_iter} "
             "iterations, tol 1e-7."]
    H.finish(args, H.report("Second-order Taylor approximation vs the collapsed augmented "
                            "bound and quadrature VI", intro, body), raw)


if __name__ == "__main__":
    main()
