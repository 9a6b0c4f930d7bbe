"""Command-line interface: ``augmentedgp demo``, ``augmentedgp info``."""

from __future__ import annotations

import time

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Gaussian processes with non-Gaussian likelihoods (augmentedgp).")
console = Console()


def _regression_demo(seed: int):
    import augmentedgp as agp
    from augmentedgp.datasets import Standardizer, load, train_test_split

    data = load("yacht")
    Xtr, ytr, Xte, yte = train_test_split(data["X"], data["y"], 0.2, seed)
    sx, sy = Standardizer(Xtr), Standardizer(ytr)
    model = agp.GP(agp.kernels.RBF(lengthscale=np.ones(Xtr.shape[1])), noise=0.1)
    t0 = time.perf_counter()
    post = agp.fit(model, sx.transform(Xtr), sy.transform(ytr))
    secs = time.perf_counter() - t0
    mean, var = post.predict_y(sx.transform(Xte))
    mean = sy.inverse(np.asarray(mean))
    rmse = float(np.sqrt(np.mean((mean - yte) ** 2)))
    nll = float(-np.mean(post.predict_log_density(sx.transform(Xte), sy.transform(yte)))
                + np.log(sy.scale))
    return ("Exact GP regression", "yacht (308 x 6)", "ARD RBF, type-II ML (L-BFGS)",
            {"test RMSE": rmse, "test NLL": nll, "train LML": post.log_marginal_likelihood(),
             "fit seconds": secs})


def _classification_demo(seed: int):
    import augmentedgp as agp
    from augmentedgp.datasets import load

    data = load("a9a_small")
    model = agp.GP(agp.kernels.RBF(lengthscale=4.0, variance=2.0), agp.likelihoods.Logistic())
    t0 = time.perf_counter()
    post = agp.fit(model, data["X_train"], data["y_train"], agp.Laplace())
    secs = time.perf_counter() - t0
    p = np.asarray(post.predict_proba(data["X_test"]))
    yte = data["y_test"]
    acc = float(np.mean((p > 0.5) == (yte == 1)))
    nll = float(-np.mean(post.predict_log_density(data["X_test"], yte)))
    return ("Laplace GP classification", "a9a (1000 train / 1000 test, 123 features)",
            "RBF + logistic, type-II ML (L-BFGS)",
            {"test accuracy": acc, "test NLL": nll, "train LML": post.log_marginal_likelihood(),
             "fit seconds": secs})


def _augmented_demo(seed: int):
    import jax

    import augmentedgp as agp
    from augmentedgp.datasets import load

    data = load("a9a_small")
    X, y = data["X_train"], data["y_train"]
    key = jax.random.key(seed)
    Z = agp.params.fixed(agp.params.real(agp.inducing.kmeans(X, 50, key), "inducing"))
    model = agp.SVGP(agp.kernels.RBF(lengthscale=4.0, variance=2.0), agp.likelihoods.Logistic(),
                     Z, q="natural_whitened")
    t0 = time.perf_counter()
    post = agp.fit(model, X, y, agp.AnalyticSVI(batch_size=100), max_iter=1000, key=key)
    secs = time.perf_counter() - t0
    p = np.asarray(post.predict_proba(data["X_test"]))
    yte = data["y_test"]
    return ("Augmented SVGP classification (Polya-Gamma, AnalyticSVI)",
            "a9a (1000 train / 1000 test, 123 features)",
            "RBF + logistic, M = 50 k-means inducing points, batch 100, 1000 iterations",
            {"test accuracy": float(np.mean((p > 0.5) == (yte == 1))),
             "test NLL": float(-np.mean(post.predict_log_density(data["X_test"], yte))),
             "train ELBO": post.elbo(), "augmented ELBO": post.elbo(augmented=True),
             "fit seconds": secs})


def _gibbs_demo(seed: int):
    import jax

    import augmentedgp as agp
    from augmentedgp.datasets import Standardizer, load, train_test_split

    data = load("yacht")
    Xtr, ytr, Xte, yte = train_test_split(data["X"], data["y"], 0.2, seed)
    sx, sy = Standardizer(Xtr), Standardizer(ytr)
    Xtr, Xte, ytr = sx.transform(Xtr), sx.transform(Xte), sy.transform(ytr)
    t0 = time.perf_counter()
    gp = agp.fit(agp.GP(agp.kernels.RBF(lengthscale=np.ones(Xtr.shape[1])), noise=0.1), Xtr, ytr)
    noise_sd = float(np.sqrt(gp.likelihood.variance.value))
    model = agp.MCGP(gp.kernel, agp.likelihoods.StudentT(df=4.0, scale=noise_sd))
    settings = agp.inference.GibbsSampling(n_samples=500, n_chains=4, burn_in=100)
    chain = agp.sample(model, Xtr, ytr, settings, key=jax.random.key(seed))
    secs = time.perf_counter() - t0
    mean = sy.inverse(np.asarray(chain.predict_y(Xte)[0]))
    nll = float(-np.mean(chain.predict_log_density(Xte, sy.transform(yte))) + np.log(sy.scale))
    summary = chain.summary()
    return ("Augmented Gibbs sampling, Student-t GP regression", "yacht (308 x 6)",
            "kernel from the exact GP's type-II ML; 4 chains x 500 samples after 100 burn-in",
            {"test RMSE": float(np.sqrt(np.mean((mean - yte) ** 2))), "test NLL": nll,
             "max split R-hat": float(np.max(summary["rhat"])),
             "min bulk ESS": float(np.min(summary["ess_bulk"])), "seconds": secs})


def _flow_demo(seed: int):
    import jax

    import augmentedgp as agp
    from augmentedgp.datasets import load

    data = load("a9a_small")
    target = agp.bayesian.LogisticRegression(data["X_train"], data["y_train"], prior_var=10.0,
                                             intercept=True)
    method = agp.ParticleFlow(n_particles=20, learning_rate=1e-3, optimizer="rmsprop",
                              batch_size=100)
    key = jax.random.key(seed)
    t0 = time.perf_counter()
    q = agp.fit_gaussian(target, target.init(), method, key=key, max_iter=2000)
    secs = time.perf_counter() - t0
    p = np.asarray(target.predict_proba(q, data["X_test"], key))
    yte = data["y_test"] == 1
    return ("Gaussian particle flow, Bayesian logistic regression",
            "a9a (1000 train / 1000 test, 123 features + intercept)",
            "20 particles (rank 19 of 124), dimension-wise RMSProp, batch 100, 2000 steps",
            {"test accuracy": float(np.mean((p > 0.5) == yte)),
             "test NLL": float(-np.mean(np.log(np.where(yte, p, 1 - p)))),
             "free energy": float(q.free_energy(target, key, 500)), "fit seconds": secs})


@app.command()
def demo(seed: int = typer.Option(0, help="seed of the train/test split")):
    """Fit the built-in examples and print test metrics."""
    for run in (_regression_demo, _classification_demo, _augmented_demo, _gibbs_demo,
                _flow_demo):
        title, data, method, metrics = run(seed)
        table = Table(title=f"{title}\n{data}", caption=method, min_width=64)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name, value in metrics.items():
            table.add_row(name, f"{value:.4f}")
        console.print(table)


@app.command()
def info():
    """Versions, JAX backend and dtype."""
    import jax

    import augmentedgp as agp

    console.print(f"augmentedgp {agp.__version__}, jax {jax.__version__}, "
                  f"backend {jax.default_backend()}, x64 {jax.config.jax_enable_x64}")


def main():
    app()


if __name__ == "__main__":
    main()
