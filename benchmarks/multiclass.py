"""Multi-class benchmark (thesis ch. 4): augmented logistic-softmax SVI against GPflow and
GPyTorch.

letter (20,000 x 16, 26 classes), shuttle (58,000 x 9, 7 very imbalanced classes) and
scikit-learn's digits (1,797 x 64, 10 classes); M = 200 inducing inputs from k-means++ kept
fixed, batch 200, one ARD RBF kernel shared by all classes (variance 1, lengthscales the
median pairwise distance), kernel hyperparameters learned by Adam(0.01), float64, all in
one process:

- augmentedgp ``AnalyticSVI(200)`` with the ``LogisticSoftmax`` likelihood (thesis ch. 4:
  Gamma / Poisson / Polya-Gamma augmentation, closed-form local and natural-parameter steps,
  Robbins-Monro step by default; q(u) stored as natural parameters) and, for reference,
  ``QuadratureSVI(200, 0.1)`` with the (Monte Carlo) ``Softmax`` likelihood;
- GPflow SVGP (whitened, ``num_latent_gps=C``) with ``MultiClass`` (robust-max inverse
  link) and with ``Softmax`` (Monte Carlo), each with Adam(0.01) on everything and with
  ``NaturalGradient(gamma=0.1)`` on q(u) + Adam(0.01) on the hyperparameters;
- GPyTorch ``SoftmaxLikelihood`` (no mixing weights) with an
  ``IndependentMultitaskVariationalStrategy`` over a batched ``VariationalStrategy``:
  ``CholeskyVariationalDistribution`` + Adam(0.01), and ``NaturalVariationalDistribution``
  + ``NGD(lr=0.1)`` + Adam(0.01).

Measured per (dataset, configuration): iterations per second after compilation
(interleaved rounds), the test NLL / error curve against training wall time up to a fixed
budget (evaluation excluded from the clock), the time to a common target NLL (the best peer's
final test NLL + margin), the final test error and NLL. Every library's latent predictive
N(mean, var) (n, C) is scored by the same code: augmentedgp's class probabilities for that
library's likelihood (quasi-Monte Carlo over the C latents for the softmaxes, Gauss-Hermite
for the robust max), error = argmax, NLL = -mean log p(y* | x*).

Run from the repository root, with the peers' virtualenv (see benchmarks/README.md):

    /work/peers-venv/bin/python benchmarks/multiclass.py            # full run, writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/multiclass.py --quick    # small subsets, short budgets

or with the library's own environment (peers that are not installed are skipped).
augmentedgp is imported from the checkout (src/), never from an installed copy.
"""

from __future__ import annotations

# isort: off
import os  # noqa: I001
import sys

# One thread for XLA too. jaxlib 0.10's batched LAPACK kernels (e.g. the Cholesky factors of
# the C stacked q(u)) split the batch over XLA's intra-op thread pool from inside a pool thread
# and block until it is done (ParallelBatchMap); with C x M^3 large enough (M = 200) two such
# calls starve a 2-thread pool and the process hangs for ever (seen here with and without
# svgp.py's XLA_FLAGS, which do not shrink that pool). A pool of one thread runs every batch
# inline. The pool is sized from the CPU affinity when JAX creates its CPU client, so the
# client is created with the affinity narrowed to one CPU, which is then given back to every
# thread (the threads of every library may run on any CPU).
# Not with --threads 0 (every library at its defaults; the hang may then come back).
_DEFAULT_THREADS = any(a in ("--threads=0", "--threads 0") for a in
                       [" ".join(sys.argv[i:i + 2]) for i in range(len(sys.argv))] + sys.argv)
_ALL_CPUS = (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
             and not _DEFAULT_THREADS else None)
if _ALL_CPUS and len(_ALL_CPUS) > 1:
    os.sched_setaffinity(0, {min(_ALL_CPUS)})

# svgp.py pins the threads of every library (--threads, read from sys.argv) before JAX,
# TensorFlow and torch are imported, and imports the peers it finds: import it first.
import svgp as base  # noqa: E402
from svgp import SKIPPED, Diverged, describe  # noqa: E402
# isort: on

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _report import fmt, markdown_table, ratio  # noqa: E402
from _report import write_results as _write_section  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp import likelihoods as _multilatent  # noqa: E402


def _pool_of_one_thread():
    """Create JAX's CPU client under the narrowed affinity, then restore every thread's."""
    jax.numpy.zeros(1).block_until_ready()
    if not (_ALL_CPUS and len(_ALL_CPUS) > 1):
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), _ALL_CPUS)
        except OSError:  # a thread that has exited meanwhile
            pass


_pool_of_one_thread()

gpflow, tf, torch, gpytorch = base.gpflow, base.tf, base.torch, base.gpytorch
if gpflow is not None:
    tf.get_logger().setLevel("ERROR")  # natural-gradient steps warn about persistent tapes
    from gpflow.keras import tf_keras
    from gpflow.optimizers.natgrad import XiNat, XiSqrtMeanVar

REPO, DATA_DIR, RESULTS_MD = base.REPO, base.DATA_DIR, base.RESULTS_MD
SECTION_BEGIN = "<!-- BEGIN multiclass.py (generated, overwritten on each run) -->"
SECTION_END = "<!-- END multiclass.py -->"
TITLE = "## Multi-class: augmented logistic-softmax SVI vs GPflow / GPyTorch (thesis ch. 4)"

DATASETS = ("letter", "shuttle", "digits")
PEERS = ("gpflow", "gpytorch")
OURS = ("augmentedgp", "logistic-softmax", "AnalyticSVI")
CHUNK = 10  # augmentedgp's scan chunk: the curves are evaluated between chunks


def _lik_class(name):
    """agp.likelihoods.<name>; augmentedgp.multilatent.<name> in checkouts whose likelihoods
    module does not re-export the multi-latent likelihoods yet."""
    return getattr(agp.likelihoods, name, None) or getattr(_multilatent, name)


# --- data -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
    name: str
    X: np.ndarray
    y: np.ndarray  # int64 class codes 0..C-1
    X_test: np.ndarray
    y_test: np.ndarray
    C: int
    split: str

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]


def load_data(name: str, n_train: int | None, n_test: int | None, seed: int = 0) -> Data:
    """A random 90/10 split (seeded), optionally subsampled (random rows, seed 0); X
    standardised with the training statistics (zero sd -> 1)."""
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        C = 10
    else:
        with np.load(DATA_DIR / f"{name}.npz") as f:
            X, y = f["X"], f["y"]
        C = {"letter": 26, "shuttle": 7}[name]
    X, y = np.asarray(X, float), np.asarray(y, np.int64)
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    cut = int(round(0.1 * X.shape[0]))
    X, y, Xt, yt = X[perm[cut:]], y[perm[cut:]], X[perm[:cut]], y[perm[:cut]]
    split = f"random 90/10 split (seed {seed})"
    rng = np.random.default_rng(seed)
    if n_train and n_train < X.shape[0]:
        idx = rng.choice(X.shape[0], n_train, replace=False)
        X, y = X[idx], y[idx]
        split += f", {n_train} training rows drawn from the 90%"
    if n_test and n_test < Xt.shape[0]:
        idx = rng.choice(Xt.shape[0], n_test, replace=False)
        Xt, yt = Xt[idx], yt[idx]
        split += f", {n_test} test rows drawn from the 10%"
    mx, sx = X.mean(0), X.std(0)
    sx[sx == 0] = 1.0
    return Data(name, (X - mx) / sx, y, (Xt - mx) / sx, yt, C, split)


@dataclasses.dataclass
class Setup:
    """What every library starts from."""

    Z: np.ndarray  # (M, d) inducing inputs, kept fixed
    lengthscale: np.ndarray  # (d,), all equal to the median pairwise distance
    variance: float = 1.0
    batch: int = 200
    lr: float = 0.01  # Adam
    ngd: float = 0.1  # natural-gradient step size (QuadratureSVI, GPflow, GPyTorch)


def median_distance(X: np.ndarray, seed: int = 0, rows: int = 2000) -> float:
    """Median pairwise Euclidean distance between (up to ``rows`` random) training inputs."""
    from scipy.spatial.distance import pdist

    rng = np.random.default_rng(seed)
    sub = X[rng.choice(X.shape[0], min(rows, X.shape[0]), replace=False)]
    return float(np.median(pdist(sub)))


def make_setup(data: Data, M: int, batch: int, seed: int = 0) -> Setup:
    Z = np.asarray(agp.inducing.kmeans(data.X, M, jax.random.key(seed)))
    return Setup(Z=Z, lengthscale=np.full(data.d, median_distance(data.X, seed)), batch=batch)


# --- scoring: one function for every library ---------------------------------------------


@eqx.filter_jit
def _proba(lik, mean, var):
    return lik.predict_proba(mean, var)


@eqx.filter_jit
def _robustmax_p_true(lik, y, mean, var):
    """P(f_y is the largest) from RobustMax.variational_expectations = P log(1 - eps) +
    (1 - P) log(eps / (C - 1)), solved for P (the same Gauss-Hermite integral, one class)."""
    hit, miss = jax.numpy.log1p(-lik.epsilon.value), jax.numpy.log(
        lik.epsilon.value / (lik.num_latent - 1))
    return (lik.variational_expectations(y, mean, var) - miss) / (hit - miss)


def scorers(C: int, samples: int, robust_points: int = 100) -> dict:
    """score(mean, var, y) -> (NLL, error) per likelihood, all through augmentedgp's
    multi-class likelihoods. Softmaxes: class probabilities by ``samples`` quasi-Monte Carlo
    points. Robust max (GPflow's epsilon 1e-3): the true class's probability by
    ``robust_points``-node Gauss-Hermite (the NLL), the predicted class from all classes'
    probabilities by 20 nodes (GPflow's count; enough for an argmax, and C x cheaper)."""
    ls = _lik_class("LogisticSoftmax")(C, predict_samples=samples)
    sm = _lik_class("Softmax")(C, predict_samples=samples)
    RM = _lik_class("RobustMax")
    rm_nll, rm_argmax = RM(C, 1e-3, n_points=robust_points), RM(C, 1e-3, n_points=20)

    def by_proba(lik):
        def f(mean, var, y):
            p = np.asarray(_proba(lik, mean, var))
            py = p[np.arange(len(y)), y]
            return (-float(np.mean(np.log(np.clip(py, 1e-300, None)))),
                    float(np.mean(np.argmax(p, 1) != y)))
        return f

    def robust(mean, var, y):
        P = np.clip(np.asarray(_robustmax_p_true(rm_nll, y, mean, var)), 0.0, 1.0)
        eps = 1e-3
        py = (1.0 - eps) * P + eps / (C - 1) * (1.0 - P)
        p = np.asarray(_proba(rm_argmax, mean, var))
        return -float(np.mean(np.log(py))), float(np.mean(np.argmax(p, 1) != y))

    return {"logistic-softmax": by_proba(ls), "softmax": by_proba(sm), "robust-max": robust}


def score(scorer, mean, var, y) -> tuple[float, float]:
    """(test NLL, test error) from the latent predictive N(mean, var) (n, C)."""
    mean = np.asarray(mean, float)
    var = np.maximum(np.asarray(var, float), 0.0)
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        return math.nan, math.nan
    return scorer(mean, var, y)


# --- runners ------------------------------------------------------------------------------
#
# warmup() compiles/traces and leaves the initial state; time_steps(n) trains n iterations
# and returns the seconds; train(grid, on_eval) trains from the initial state until the
# training clock passes grid[-1] (the budget), calling on_eval(iteration, train_seconds)
# (not counted; returns True to stop) at the first iteration past each grid time, and
# returns None or why it stopped early; predict() gives the latent test mean and variance
# (n*, C); native_nll() the library's own test NLL at the current state (a cross-check).


class AgpRunner:
    lib = "augmentedgp"

    def __init__(self, data: Data, setup: Setup, lik: str, method: str, chunk=CHUNK):
        self.data, self.setup, self.method, self.chunk = data, setup, method, chunk
        likelihood = {"logistic-softmax": lambda: _lik_class("LogisticSoftmax")(data.C),
                      "softmax": lambda: _lik_class("Softmax")(data.C),
                      "robust-max": lambda: _lik_class("RobustMax")(data.C)}[lik]()
        kernel = agp.kernels.RBF(lengthscale=setup.lengthscale, variance=setup.variance)
        Z = agp.params.fixed(agp.params.real(setup.Z, "inducing"))
        q = "natural_whitened" if method == "AnalyticSVI" else "whitened"
        self.model0 = self.model = agp.SVGP(kernel, likelihood, Z, q=q)
        self.inference = (agp.AnalyticSVI(setup.batch) if method == "AnalyticSVI"
                          else agp.QuadratureSVI(setup.batch, setup.ngd))
        self.calls = 0

    def _fit(self, model, n, callback=None):
        self.calls += 1  # a new minibatch key per call
        return agp.fit(model, self.data.X, self.data.y, self.inference, max_iter=n,
                       learning_rate=self.setup.lr, tol=0.0, chunk_size=self.chunk,
                       callback=callback, key=jax.random.key(self.calls))

    def warmup(self):
        n = self.chunk
        post = self._fit(self.model0, n)  # compiles the scan chunk
        if post.history.n_iter < n:
            raise Diverged(post.history.message)
        self.model = post.model
        self.predict()  # compiles the prediction

    def time_steps(self, n):
        post = self._fit(self.model0, n)  # always from the initial state: same work per round
        if post.history.n_iter < n:  # fit stops at a non-finite objective
            raise Diverged(post.history.message)
        return float(post.history.wall_time[-1])  # the training loop; not fit's setup

    def train(self, grid, on_eval):
        self.model = self.model0
        if on_eval(0, 0.0):
            return "non-finite test NLL at the start"
        state = {"start": time.perf_counter(), "paused": 0.0, "k": 0, "stop": None}

        def callback(it, objective, model):
            t = time.perf_counter()
            clock = t - state["start"] - state["paused"]
            if clock < grid[state["k"]]:
                return False
            self.model = model
            stop = on_eval(it, clock)
            while state["k"] < len(grid) and grid[state["k"]] <= clock:
                state["k"] += 1
            state["paused"] += time.perf_counter() - t
            if stop:
                state["stop"] = f"non-finite test NLL at iteration {it}"
            return bool(stop) or state["k"] == len(grid)

        post = self._fit(self.model0, 10**9, callback)
        if state["stop"]:
            return state["stop"]
        if post.history.message != "stopped by callback":
            self.model = post.model
            on_eval(post.history.n_iter, time.perf_counter() - state["start"] - state["paused"])
            return post.history.message
        return None

    def predict(self):
        mean, var = self.model.predict_f(self.data.X_test)
        return np.asarray(mean), np.asarray(var)

    def hyper(self):
        k = self.model.kernel
        return float(k.variance.value), float(np.mean(np.asarray(k.lengthscale.value)))

    def native_nll(self):
        """augmentedgp's own predict_log_density (its likelihood's default QMC points)."""
        return -float(np.mean(np.asarray(
            self.model.predict_log_density(self.data.X_test, self.data.y_test))))


class StepRunner:
    """Peers: a Python loop over one compiled / eager step per iteration."""

    lib = ""

    def warmup(self, n=3):
        try:
            for _ in range(n):
                self.step()
            mean, var = self.predict()
            if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
                raise Diverged(f"non-finite predictions after {n} warm-up steps")
        finally:
            self.restore(self.initial)

    def time_steps(self, n):
        t0 = time.perf_counter()
        try:
            for _ in range(n):
                self.step()
        except Exception as err:
            self.restore(self.initial)
            raise Diverged(describe(err)) from err
        return time.perf_counter() - t0

    def train(self, grid, on_eval):
        self.restore(self.initial)
        if on_eval(0, 0.0):
            return "non-finite test NLL at the start"
        clock, it, k = 0.0, 0, 0
        t0 = time.perf_counter()
        while True:
            try:
                self.step()
            except Exception as err:
                clock += time.perf_counter() - t0
                on_eval(it, clock)  # the state before the failing step (variables unchanged)
                return f"failed at iteration {it + 1}: {describe(err)}"
            it += 1
            now = time.perf_counter()
            if clock + (now - t0) >= grid[k]:
                clock += now - t0
                if on_eval(it, clock):
                    return f"non-finite test NLL at iteration {it}"
                while k < len(grid) and grid[k] <= clock:
                    k += 1
                if k == len(grid):
                    return None
                t0 = time.perf_counter()


class GpflowRunner(base.GpflowState, StepRunner):
    lib = "gpflow"

    def __init__(self, data: Data, setup: Setup, lik: str, scheme: str, ngd=None):
        """ngd: (gamma, "XiNat" | "XiSqrtMeanVar") for the NGD scheme."""
        self.data, self.setup, self.scheme = data, setup, scheme
        kernel = gpflow.kernels.SquaredExponential(variance=setup.variance,
                                                   lengthscales=setup.lengthscale.copy())
        likelihood = (gpflow.likelihoods.MultiClass(data.C) if lik == "robust-max"
                      else gpflow.likelihoods.Softmax(data.C))
        self.model = m = gpflow.models.SVGP(kernel, likelihood, inducing_variable=setup.Z.copy(),
                                            num_latent_gps=data.C, num_data=data.n,
                                            whiten=True)
        gpflow.set_trainable(m.inducing_variable, False)
        # integer labels: Softmax's log density is sparse_softmax_cross_entropy (int labels);
        # MultiClass casts them itself
        ds = tf.data.Dataset.from_tensor_slices((data.X, data.y[:, None]))
        self.batches = iter(ds.repeat().shuffle(data.n, seed=0).batch(setup.batch))
        self.adam = tf_keras.optimizers.Adam(setup.lr)
        self.ngd = ngd
        if scheme == "NGD+Adam":  # GPflow's natural-gradient notebook
            gamma, xi = ngd
            gpflow.set_trainable(m.q_mu, False)
            gpflow.set_trainable(m.q_sqrt, False)
            natgrad = gpflow.optimizers.NaturalGradient(gamma=gamma)
            xi_t = XiNat() if xi == "XiNat" else XiSqrtMeanVar()

            @tf.function
            def step():
                batch = next(self.batches)
                loss = lambda: m.training_loss(batch)
                natgrad.minimize(loss, [(m.q_mu, m.q_sqrt, xi_t)])
                self.adam.minimize(loss, m.trainable_variables)
        else:
            @tf.function
            def step():
                batch = next(self.batches)
                self.adam.minimize(lambda: m.training_loss(batch), m.trainable_variables)

        self.step = step
        self.adam.build(m.trainable_variables)
        self.initial = self.snapshot()

    def predict(self):
        mean, var = self.model.predict_f(self.data.X_test)
        return mean.numpy(), var.numpy()

    def hyper(self):
        k = self.model.kernel
        return float(k.variance.numpy()), float(np.mean(k.lengthscales.numpy()))

    def native_nll(self):
        """GPflow's predict_log_density (robust max: Gauss-Hermite; softmax: 100 MC draws)."""
        ld = self.model.predict_log_density((self.data.X_test, self.data.y_test[:, None]))
        return -float(np.mean(ld.numpy()))


class GpytorchRunner(StepRunner):
    lib = "gpytorch"

    def __init__(self, data: Data, setup: Setup, lik: str, scheme: str):
        self.data, self.setup, self.scheme = data, setup, scheme
        torch.manual_seed(0)
        M, d = setup.Z.shape
        C = data.C
        V = gpytorch.variational
        natural = scheme == "NGD+Adam"
        q = (V.NaturalVariationalDistribution if natural else
             V.CholeskyVariationalDistribution)(M, batch_shape=torch.Size([C]))

        class MulticlassGP(gpytorch.models.ApproximateGP):
            """GPyTorch's multitask SVGP recipe: one q(u^c) per class (batch [C]), the
            kernel (no batch shape) shared by all classes, Z fixed and shared."""

            def __init__(self):
                strategy = V.VariationalStrategy(self, torch.tensor(setup.Z), q,
                                                 learn_inducing_locations=False)
                super().__init__(V.IndependentMultitaskVariationalStrategy(strategy,
                                                                           num_tasks=C))
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.RBFKernel(ard_num_dims=d))

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                                 self.covar_module(x))

        self.model = model = MulticlassGP()
        model.covar_module.outputscale = setup.variance
        model.covar_module.base_kernel.lengthscale = torch.tensor(setup.lengthscale[None, :])
        self.likelihood = gpytorch.likelihoods.SoftmaxLikelihood(
            num_features=C, num_classes=C, mixing_weights=False)
        self.mll = gpytorch.mlls.VariationalELBO(self.likelihood, model, num_data=data.n)
        if natural:  # GPyTorch's natural-gradient example
            self.optimizers = [
                gpytorch.optim.NGD(model.variational_parameters(), num_data=data.n,
                                   lr=setup.ngd),
                torch.optim.Adam([{"params": model.hyperparameters()},
                                  {"params": self.likelihood.parameters()}], lr=setup.lr)]
        else:
            self.optimizers = [torch.optim.Adam([{"params": model.parameters()},
                                                 {"params": self.likelihood.parameters()}],
                                                lr=setup.lr)]
        self.loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.tensor(data.X), torch.tensor(data.y)),
            batch_size=setup.batch, shuffle=True, drop_last=True,
            generator=torch.Generator().manual_seed(0))
        self.batches = iter(self.loader)
        self.model.train()
        self.likelihood.train()
        self.initial = self.snapshot()

    def next_batch(self):
        try:
            return next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            return next(self.batches)

    def step(self):
        xb, yb = self.next_batch()
        for opt in self.optimizers:
            opt.zero_grad()
        loss = -self.mll(self.model(xb), yb)
        loss.backward()
        for opt in self.optimizers:
            opt.step()

    snapshot = base.GpytorchRunner.snapshot
    restore = base.GpytorchRunner.restore

    def predict(self):
        self.model.eval()
        means, variances = [], []
        with torch.no_grad():
            for Xb in np.array_split(self.data.X_test, max(1, len(self.data.X_test) // 2048)):
                f = self.model(torch.tensor(Xb))
                means.append(f.mean.numpy())
                variances.append(f.variance.numpy())
        self.model.train()
        return np.concatenate(means), np.concatenate(variances)

    def hyper(self):
        k = self.model.covar_module
        return (float(k.outputscale.detach()),
                float(k.base_kernel.lengthscale.detach().mean()))

    def native_nll(self):
        """GPyTorch's likelihood.log_marginal (Monte Carlo, 512 draws)."""
        self.model.eval()
        self.likelihood.eval()
        with torch.no_grad(), gpytorch.settings.num_likelihood_samples(512):
            lp = self.likelihood.log_marginal(torch.tensor(self.data.y_test),
                                              self.model(torch.tensor(self.data.X_test)))
        self.model.train()
        self.likelihood.train()
        return -float(lp.mean())


# --- the benchmark --------------------------------------------------------------------------


def configurations(libraries=None, robustmax_ours=False) -> list[tuple[str, str, str]]:
    """(library, likelihood, scheme) rows, augmentedgp's first."""
    out = [OURS, ("augmentedgp", "softmax", "QuadratureSVI")]
    if robustmax_ours:
        out.append(("augmentedgp", "robust-max", "QuadratureSVI"))
    if "gpflow" not in SKIPPED:
        out += [("gpflow", lik, scheme) for lik in ("robust-max", "softmax")
                for scheme in ("NGD+Adam", "Adam")]
    if "gpytorch" not in SKIPPED:
        out += [("gpytorch", "softmax", "NGD+Adam"), ("gpytorch", "softmax", "Adam")]
    return [k for k in out if libraries is None or k[0] in libraries or label(k) in libraries]


def time_grid(budget: float, points: int) -> np.ndarray:
    """Evaluation times: geometric from budget / 500 to the budget."""
    return np.geomspace(budget / 500, budget, points)


GPFLOW_NGD = ((0.1, "XiNat"), (0.01, "XiSqrtMeanVar"), (0.01, "XiNat"))


def build(key, data, setup, args, notes):
    """The runner, warmed up. GPflow's NGD: gamma 0.1 (its notebook's choice for
    minibatches and non-conjugate likelihoods); if that fails within its first
    ``--ngd-check`` steps, the notebook's other non-conjugate setting (gamma 0.01 with
    XiSqrtMeanVar), then gamma 0.01 with the default XiNat."""
    lib, lik, scheme = key
    if lib == "augmentedgp":
        r = AgpRunner(data, setup, lik, scheme, args.chunk)
        r.warmup()
        return r
    if lib == "gpytorch":
        r = GpytorchRunner(data, setup, lik, scheme)
        r.warmup()
        return r
    if scheme != "NGD+Adam":
        r = GpflowRunner(data, setup, lik, scheme)
        r.warmup()
        return r
    failures = []
    for gamma, xi in GPFLOW_NGD:
        r = GpflowRunner(data, setup, lik, scheme, ngd=(gamma, xi))
        try:
            r.warmup(args.ngd_check)
        except Exception as err:
            failures.append(f"gamma {gamma} with {xi} failed within {args.ngd_check} steps "
                            f"({describe(err)})")
            continue
        if failures:
            notes[key] = "; ".join(failures) + f"; using gamma {gamma} with {xi}"
        return r
    raise Diverged("; ".join(failures))


def bench_dataset(data: Data, budget: float, args) -> dict:
    t_start = time.perf_counter()
    setup = make_setup(data, args.M, args.batch)
    score_lik = scorers(data.C, args.predict_samples)
    print(f"== {data.name}: n={data.n} test={len(data.y_test)} d={data.d} C={data.C} "
          f"M={args.M} lengthscale {setup.lengthscale[0]:.3f} budget {budget:g} s "
          f"({time.perf_counter() - t_start:.1f} s for k-means)", flush=True)
    runners, notes, build_s = {}, {}, {}
    for key in configurations(args.libraries and args.libraries.split(","), args.robustmax):
        t0 = time.perf_counter()
        try:
            runners[key] = build(key, data, setup, args, notes)
        except Exception as err:
            why = err if isinstance(err, Diverged) else describe(err)
            notes[key] = f"build / warm-up failed: {why}"
        build_s[key] = time.perf_counter() - t0
        print(f"  {label(key):42s} build + warm-up {build_s[key]:6.1f} s "
              f"{notes.get(key, '')}", flush=True)

    # 1. iterations per second: per runner a round of ~round_seconds, interleaved rounds
    steps = {}
    for key, r in list(runners.items()):
        unit = args.chunk if key[0] == "augmentedgp" else 2
        try:
            rate = 2 * unit / r.time_steps(2 * unit)
        except Diverged as err:
            notes[key] = f"no it/s: {err}"
            continue
        steps[key] = max(unit, int(rate * args.round_seconds) // unit * unit)
    times = {k: [] for k in steps}
    for _ in range(args.rounds):
        for k in list(times):
            try:
                times[k].append(runners[k].time_steps(steps[k]))
            except Diverged as err:
                notes[k] = f"no it/s: a step failed in the timing rounds ({err})"
                del times[k]
    rates = {k: {"median": steps[k] / float(np.median(v)), "best": steps[k] / float(np.min(v)),
                 "steps": steps[k]} for k, v in times.items()}
    for k, v in rates.items():
        print(f"  {label(k):42s} {v['median']:8.2f} it/s (median of {args.rounds} "
              f"rounds of {v['steps']}; best {v['best']:.2f})", flush=True)

    # 2. test NLL against training time, from the common initial state, to the budget
    grid = time_grid(budget, args.eval_points)
    curves, failed, native, eval_s, hyper = {}, set(), {}, {}, {}
    for k, r in runners.items():
        curve, spent = [], [0.0]

        def on_eval(it, seconds, r=r, curve=curve, spent=spent, lik=score_lik[k[1]]):
            t = time.perf_counter()
            mean, var = r.predict()
            nll, err = score(lik, mean, var, data.y_test)
            curve.append((it, seconds, nll, err))
            spent[0] += time.perf_counter() - t
            return not np.isfinite(nll)

        t0 = time.perf_counter()
        why = r.train(grid, on_eval)
        if why is not None:
            failed.add(k)
            notes[k] = f"{notes[k]}; curve: {why}" if k in notes else f"curve: {why}"
        curves[k] = np.array(curve)
        eval_s[k] = spent[0]
        try:
            native[k] = r.native_nll()
        except Exception as err:  # a cross-check only
            native[k] = None
            print(f"  {label(k)}: native NLL failed: {describe(err)}", flush=True)
        hyper[k] = r.hyper()
        it, sec, nll, err = curve[-1]
        print(f"  {label(k):42s} {int(it):6d} it in {sec:6.1f} s: test NLL {nll:.4f}, error "
              f"{err:.4f}, native NLL {fmt(native[k], '.4f')}, kernel variance {hyper[k][0]:.3g}, "
              f"mean lengthscale {hyper[k][1]:.3g} ({time.perf_counter() - t0:.0f} s "
              f"with {len(curve)} evaluations) {why or ''}", flush=True)
    return {"data": data, "setup": setup, "rates": rates, "curves": curves, "failed": failed,
            "notes": notes, "native": native, "hyper": hyper, "build_s": build_s, "eval_s": eval_s,
            "budget": budget, "seconds": time.perf_counter() - t_start}


def time_to_target(curve: np.ndarray, target: float) -> float | None:
    """The training seconds of the first evaluation after iteration 0 at or below target."""
    hit = np.flatnonzero((curve[:, 2] <= target) & (curve[:, 0] > 0))
    return float(curve[hit[0], 1]) if hit.size else None


def final(res, key, col=2) -> float | None:
    c = res["curves"].get(key)
    if c is None or not len(c) or not np.isfinite(c[-1, col]):
        return None
    return float(c[-1, col])


def summarise(res: dict, margin: float) -> dict:
    """The target (best peer's final NLL + margin), the times to it and AnalyticSVI's
    speed-ups."""
    curves = res["curves"]
    peers = [k for k in curves if k[0] in PEERS and final(res, k) is not None]
    if not peers:
        return {"reference": None}
    best = min(peers, key=lambda k: final(res, k))
    target = final(res, best) + margin
    ttt = {k: time_to_target(c, target) for k, c in curves.items() if len(c)}
    ours = ttt.get(OURS)
    reached = [k for k in peers if ttt.get(k) is not None]
    fastest = min(reached, key=lambda k: ttt[k]) if reached else None
    return {"reference": "peers", "best": best, "target": target, "ttt": ttt,
            "fastest": fastest, "ours": ours,
            "speedup_fastest": ratio(ttt[fastest], ours) if fastest else None,
            "speedup_best": ratio(ttt.get(best), ours)}


# --- reporting ----------------------------------------------------------------------------


def label(key) -> str:
    return " ".join(key)


def results_table(all_res, margin) -> tuple[str, list[str]]:
    header = ["dataset", "configuration", "it/s (median)", "it/s (best)",
              "AnalyticSVI it/s / this", "iterations", "final error", "final NLL",
              "native NLL", "kernel variance / mean lengthscale (final)", "target NLL",
              "time to target (s)", "time to target / AnalyticSVI's"]
    rows, notes = [], []
    for res in all_res:
        name, s = res["data"].name, summarise(res, margin)
        ours_rate = res["rates"].get(OURS, {}).get("median")
        for key, c in res["curves"].items():
            mark = ""
            if key in res["notes"]:
                notes.append(f"{name} {label(key)}: {res['notes'][key]}")
                mark = f" [{len(notes)}]"
            rate = res["rates"].get(key, {})
            t = s.get("ttt", {}).get(key)
            ours = s.get("ours")
            rel = ("" if key == OURS else
                   fmt(ratio(t, ours), ".1f", "AnalyticSVI never reached" if t is not None
                       else "—"))
            tag = " (best)" if key == s.get("best") else ""
            rows.append([name, label(key) + tag + mark, fmt(rate.get("median"), ".2f"),
                         fmt(rate.get("best"), ".2f"),
                         "" if key == OURS else fmt(ratio(ours_rate, rate.get("median")), ".2f"),
                         int(c[-1, 0]) if len(c) else "—",
                         fmt(c[-1, 3] if len(c) else None, ".4f"),
                         fmt(c[-1, 2] if len(c) else None, ".4f")
                         + (" (failed)" if key in res["failed"] else ""),
                         fmt(res["native"].get(key), ".4f"),
                         "{:.3g} / {:.3g}".format(*res["hyper"][key]) if key in res["hyper"]
                         else "—",
                         fmt(s.get("target"), ".4f"), fmt(t, ".2f", "not reached"), rel])
        for key in res["notes"]:
            if key not in res["curves"]:
                notes.append(f"{name} {label(key)}: {res['notes'][key]}")
                rows.append([name, f"{label(key)} [{len(notes)}]"] + ["—"] * 11)
    return markdown_table(header, rows), notes


def curves_table(res: dict) -> str:
    """Test NLL / error at a few training times: the last evaluation at or before each; the
    budget row shows the final evaluation (taken at the first check past the budget)."""
    budget = res["budget"]
    marks = [t for t in (0.3, 1, 3, 10, 30, 100, 300) if t < budget] + [budget]
    keys = list(res["curves"])
    header = ["training s"] + [label(k) for k in keys]
    rows = []
    for t in marks:
        row = [f"{t:g}" + (" (final)" if t == budget else "")]
        for k in keys:
            c = res["curves"][k]
            i = (np.arange(len(c)) if t == budget else np.flatnonzero(c[:, 1] <= t * (1 + 1e-9))
                 ) if len(c) else np.array([])
            row.append("—" if not i.size else f"{c[i[-1], 2]:.4f} / {c[i[-1], 3]:.4f} "
                       f"({int(c[i[-1], 0])} it)")
        rows.append(row)
    return markdown_table(header, rows)


def claims(all_res, margin) -> list[str]:
    lines = ["**Target: >= 10x faster to the target NLL than the peers, at equal or better "
             f"NLL** (target = best peer final NLL + {margin}; 'faster' against the peer "
             "configuration that reached it first; 'equal or better NLL' = AnalyticSVI's final "
             "NLL <= the best peer's final NLL + margin):"]
    for res in all_res:
        s, name = summarise(res, margin), res["data"].name
        if s.get("reference") != "peers":
            lines.append(f"- {name}: no peer result; not assessed.")
            continue
        ours_final = final(res, OURS)
        best_final = final(res, s["best"])
        sp = s["speedup_fastest"]
        equal = ours_final is not None and ours_final <= best_final + margin
        holds = sp is not None and sp >= 10 and equal
        if s["ours"] is None:
            verdict = "AnalyticSVI never reached the target"
        elif s["fastest"] is None:
            verdict = (f"AnalyticSVI reached it in {s['ours']:.2f} s; no peer configuration "
                       "reached it within the budget (only the best peer's final state is "
                       "within the margin), so the speed-up is > budget / "
                       f"{s['ours']:.2f} s = {res['budget'] / s['ours']:.1f}x at least")
        else:
            verdict = (f"time to target {s['ours']:.2f} s vs {s['ttt'][s['fastest']]:.2f} s "
                       f"({label(s['fastest'])}) -> speed-up {sp:.1f}x (against the best-NLL "
                       f"peer {label(s['best'])}: {fmt(s['speedup_best'], '.1f', 'n/a')}x)")
        if s["ours"] is not None and s["fastest"] is None:
            holds = equal and res["budget"] / s["ours"] >= 10
        lines.append(
            f"- {name}: best peer {label(s['best'])} (final NLL {best_final:.4f}); AnalyticSVI "
            f"final NLL {fmt(ours_final, '.4f')} "
            f"({'equal or better' if equal else 'worse'}); {verdict} -> **"
            + ("met" if holds else "not met") + "**.")
    lines += ["", "**Iteration rate** (median it/s; AnalyticSVI's divided by each peer "
              "configuration's):"]
    for res in all_res:
        ours = res["rates"].get(OURS, {}).get("median")
        parts = [f"{label(k)} {v['median']:.2f} ({fmt(ratio(ours, v['median']), '.2f')}x)"
                 for k, v in res["rates"].items() if k[0] in PEERS]
        lines.append(f"- {res['data'].name}: AnalyticSVI {fmt(ours, '.2f')} it/s; "
                     + ("; ".join(parts) if parts else "no peer rate") + ".")
    return lines


def machine() -> str:
    if not _ALL_CPUS:
        return base.machine()
    return (base.machine() + "; JAX's CPU client created under a one-CPU affinity so that its "
            "intra-op pool has one thread (svgp.py's XLA_FLAGS leave it at the core count, and "
            "jaxlib 0.10's batched LAPACK kernels can deadlock a small pool), every thread's "
            "affinity then restored to all CPUs")


def report(args, all_res, total_s, load, vers) -> str:
    cmd = " ".join([Path(sys.executable).as_posix(), "benchmarks/multiclass.py", *sys.argv[1:]])
    table, notes = results_table(all_res, args.margin)
    datasets = "; ".join(
        f"{d.name}: n={d.n}, test {len(d.y_test)}, d={d.d}, C={d.C}, training class counts "
        f"{np.bincount(d.y, minlength=d.C).tolist()} ({d.split}; lengthscale init "
        f"{r['setup'].lengthscale[0]:.3f}; budget {r['budget']:g} s)"
        for r in all_res for d in [r["data"]])
    lines = [
        TITLE + " (`benchmarks/multiclass.py`)",
        "",
        f"Run {datetime.datetime.now().isoformat(timespec='seconds')} from the repository root:",
        "",
        f"    {cmd}",
        "",
        f"Total run time {total_s / 60:.1f} min. Data: {datasets}. Inputs standardised with "
        "the training statistics (zero sd -> 1). letter and shuttle from `../shared/data` "
        "(no official split), digits from `sklearn.datasets.load_digits`.",
        "",
        "**Model** (every library; thesis ch. 4 setup): C latent GPs with **one** variance x "
        "ARD RBF kernel shared by all classes, initial variance 1 and every lengthscale the "
        "median pairwise distance of (2000 random) training inputs; zero mean; "
        f"M = {args.M} inducing inputs from augmentedgp's k-means (k-means++ seeding, seed 0) "
        "on the training inputs, shared by all classes and libraries and **kept fixed** "
        "(augmentedgp `params.fixed`, GPflow `set_trainable(inducing_variable, False)`, "
        "GPyTorch `learn_inducing_locations=False`); kernel hyperparameters learned with "
        f"Adam(0.01); batch {args.batch} (shuffled "
        "epochs); float64. Likelihoods: augmentedgp `LogisticSoftmax` p(y=k|f) = "
        "sigmoid(f_k) / sum_c sigmoid(f_c) (the augmented one) and `Softmax` (Monte Carlo "
        "expectations, 100 draws); GPflow `MultiClass` (robust max, epsilon 1e-3, "
        "Gauss-Hermite) and `Softmax` (100 MC draws); GPyTorch `SoftmaxLikelihood("
        "num_features=C, num_classes=C, mixing_weights=False)` (MC, its default 10 draws).",
        "",
        "**Configurations.** augmentedgp `fit(SVGP(..., q=\"natural_whitened\"), "
        f"AnalyticSVI({args.batch}))` (Robbins-Monro natural step (t + 1)^-0.51, its default; "
        f"jitted `lax.scan` chunks of {args.chunk}) and, for reference, `QuadratureSVI("
        f"{args.batch}, 0.1)` with the softmax (q whitened; natural step 0.1 from the MC "
        "sites); GPflow SVGP (whitened, `num_latent_gps=C`): *NGD+Adam* = "
        "`NaturalGradient(gamma=0.1)` on (q_mu, q_sqrt) + Adam on the kernel in one "
        "`tf.function` step (the natural-gradient notebook's recipe; if gamma 0.1 fails in "
        f"its first {args.ngd_check} steps, gamma 0.01 with `XiSqrtMeanVar`, then gamma 0.01 "
        "with `XiNat`; fallbacks are noted below), *Adam* = Adam on everything, step compiled "
        "with `tf.function`; GPyTorch: *NGD+Adam* = `NaturalVariationalDistribution` + "
        "`NGD(lr=0.1)` + Adam on the kernel, *Adam* = `CholeskyVariationalDistribution` + "
        "Adam on everything, both batch_shape [C] under `IndependentMultitaskVariational"
        "Strategy`, `VariationalELBO(num_data=n)`.",
        "",
        "**Measures.** *it/s*: after compilation / tracing, "
        f"{args.rounds} interleaved rounds of about {args.round_seconds:g} s per configuration "
        "(the iteration count per round fixed per configuration from a first timed run); "
        "median and best round (augmentedgp: the wall time of `fit`'s training loop from the "
        "initial state; peers: their Python loop). *Curves*: from the common initial state "
        "until the training clock passes the dataset's budget, with the test NLL and error "
        f"evaluated at the first iteration past each of {args.eval_points} geometrically "
        "spaced times (budget / 500 to the budget; augmentedgp: checked between scan "
        "chunks); evaluation time is excluded from the clock. *Scoring* (one function for "
        "all): each library's latent test mean and variance (n*, C) go through augmentedgp's "
        "multi-class likelihood of the kind that library trained (logistic-softmax / softmax: "
        f"`predict_proba` by {args.predict_samples} scrambled-Sobol QMC points over the C "
        "latents; robust max, epsilon 1e-3: the true class's probability by 100-node "
        "Gauss-Hermite, the predicted class from `predict_proba` with 20 nodes, GPflow's "
        "count); error = argmax of the probabilities, NLL = -mean log p(y* | x*). *Native "
        "NLL*: the library's own predictive at the final state, as a cross-check "
        "(augmentedgp `predict_log_density`, 2048 QMC points; GPflow `predict_log_density`, "
        "robust max by 20-node quadrature, softmax by 100 MC draws; GPyTorch "
        "`likelihood.log_marginal` with 512 MC draws). *Target* = the final test NLL of the "
        f"best peer configuration (lowest final NLL) + {args.margin}; *time to target* = "
        "the training time of the first evaluation after iteration 0 at or below it "
        "(resolution: the evaluation grid, a factor "
        f"{500 ** (1 / (args.eval_points - 1)):.2f}, and augmentedgp's chunks).",
        "",
        "**Differences from the thesis' ch. 4 experiments.** One random split per dataset "
        "(no cross-validation), a fixed training-time budget per configuration and the time "
        "to a common target NLL instead of each method's convergence; an ARD kernel shared "
        "by the classes; GPflow 2 / GPyTorch instead of the thesis' GPflow 1 SVGP; no EPGPC "
        "or Laplace multi-class baselines.",
        "",
        f"**Machine.** {machine()}; load average (1 min) at start / end: "
        f"{load[0]:.2f} / {load[1]:.2f} (the VM is shared with other jobs: timings are noisy).",
        "",
        "**Versions** (checkout as imported at the start). "
        + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
    ]
    if SKIPPED:
        lines += ["**Skipped.** " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()), ""]
    lines += ["### Claims", "", *claims(all_res, args.margin), "",
              "### Results", "", table, "",
              "`(best)`: the peer configuration whose final NLL sets the target. `time to "
              "target / AnalyticSVI's` > 1 means augmentedgp's AnalyticSVI is faster; "
              "`AnalyticSVI it/s / this` > 1 means it takes more iterations per second. A "
              "failed run keeps its evaluations before the failure.", "",
              *(f"- [{i}] {n}" for i, n in enumerate(notes, 1)), "",
              "### Test NLL / error at training times (iterations in brackets)", ""]
    for res in all_res:
        lines += [f"**{res['data'].name}** ({res['seconds']:.0f} s for this dataset, of which "
                  f"{sum(res['build_s'].values()):.0f} s build + warm-up and "
                  f"{sum(res['eval_s'].values()):.0f} s evaluations)", "",
                  curves_table(res), ""]
    return "\n".join(lines)


def dump_json(path, all_res, args):
    out = []
    for res in all_res:
        s = summarise(res, args.margin)
        out.append({"dataset": res["data"].name, "budget": res["budget"],
                    "rates": {label(k): v for k, v in res["rates"].items()},
                    "notes": {label(k): v for k, v in res["notes"].items()},
                    "native_nll": {label(k): v for k, v in res["native"].items()},
                    "kernel_variance_mean_lengthscale": {label(k): v
                                                         for k, v in res["hyper"].items()},
                    "curves": {label(k): c.tolist() for k, c in res["curves"].items()},
                    "summary": {k: ({label(kk): vv for kk, vv in v.items()} if k == "ttt"
                                    else label(v) if isinstance(v, tuple) else v)
                                for k, v in s.items()}})
    Path(path).write_text(json.dumps(out, indent=1))


def parse_budgets(text: str, names) -> dict[str, float]:
    """'30' (all) or 'letter=60,shuttle=40,digits=15'."""
    if "=" not in text:
        return {n: float(text) for n in names}
    out = dict(part.split("=") for part in text.split(","))
    missing = set(names) - set(out)
    if missing:
        raise SystemExit(f"--budgets has no value for {sorted(missing)}")
    return {n: float(out[n]) for n in names}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2000 training / 500 test rows (digits whole), budget 6 s, no "
                        "RESULTS.md unless --write")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated subset of " + ",".join(DATASETS))
    parser.add_argument("--n-train", type=int, default=None, help="subsample the training rows")
    parser.add_argument("--n-test", type=int, default=None, help="subsample the test rows")
    parser.add_argument("--M", type=int, default=200, help="inducing points")
    parser.add_argument("--batch", type=int, default=200, help="minibatch size")
    parser.add_argument("--budgets", default=None,
                        help="training seconds per configuration: one number or "
                        "'letter=..,shuttle=..,digits=..'")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds")
    parser.add_argument("--round-seconds", type=float, default=None,
                        help="approximate seconds per timing round and configuration")
    parser.add_argument("--eval-points", type=int, default=None,
                        help="evaluations per curve (geometric in time)")
    parser.add_argument("--predict-samples", type=int, default=512,
                        help="QMC points of the softmax class probabilities in the scoring")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="target = best peer's final NLL + this")
    parser.add_argument("--chunk", type=int, default=CHUNK,
                        help="augmentedgp's scan chunk (fit's chunk_size)")
    parser.add_argument("--ngd-check", type=int, default=20,
                        help="GPflow NGD: warm-up steps that decide the gamma fallback")
    parser.add_argument("--robustmax", action="store_true",
                        help="also run augmentedgp QuadratureSVI with the robust max")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for every library (0: their defaults); read at import")
    parser.add_argument("--write", action="store_true", help="with --quick: write RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS_MD}")
    parser.add_argument("--libraries", default=None,
                        help="comma-separated subset of configurations to run: library names "
                        "or 'library likelihood scheme' labels (the claims need all)")
    parser.add_argument("--json", default=None, help="also write the raw curves to this file")
    args = parser.parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    unknown = set(names) - set(DATASETS)
    if unknown:
        raise SystemExit(f"unknown datasets: {sorted(unknown)}")
    defaults = ({"n_train": 2000, "n_test": 500, "budgets": "6", "rounds": 2,
                 "round_seconds": 0.5, "eval_points": 12} if args.quick else
                {"budgets": "letter=40,shuttle=30,digits=15", "rounds": 3,
                 "round_seconds": 1.0, "eval_points": 14})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    budgets = parse_budgets(args.budgets, names)
    write = (args.write or not args.quick) and not args.no_write

    for lib, why in SKIPPED.items():
        print(f"note: skipping {lib}: {why}")
    start, load0, vers = time.perf_counter(), os.getloadavg()[0], base.versions()
    all_res = []
    for name in names:
        data = load_data(name, args.n_train, args.n_test)
        all_res.append(bench_dataset(data, budgets[name], args))
        print(f"   ({(time.perf_counter() - start) / 60:.1f} min so far)", flush=True)
    total = time.perf_counter() - start
    text = report(args, all_res, total, (load0, os.getloadavg()[0]), vers)
    print()
    print(text)
    if args.json:
        dump_json(args.json, all_res, args)
    if write:
        _write_section(text, SECTION_BEGIN, SECTION_END)
        print(f"\n(wrote {RESULTS_MD.relative_to(REPO)})")
    print(f"\nTotal wall time {total:.0f} s ({total / 60:.1f} min)")


if __name__ == "__main__":
    main()
