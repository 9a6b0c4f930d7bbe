"""SVGP benchmark: augmentedgp against GPflow and GPyTorch, minibatch training at M = 100.

Regression (kin40k, protein; Gaussian likelihood) and classification (electricity, a9a;
probit Bernoulli likelihood), two training schemes per library, all in one process:

- "NGD": natural-gradient steps (size 0.1) on q(u) and Adam(0.01) on the hyperparameters
  and inducing inputs (augmentedgp `QuadratureSVI(100, 0.1)`; GPflow `NaturalGradient(0.1)`
  + Adam; GPyTorch `NaturalVariationalDistribution` + `NGD(lr=0.1)` + Adam);
- "Adam": Adam(0.01) on everything, q(u) = N(m, L L^T) whitened (augmentedgp
  `QuadratureSVI(100, natural=False)`; GPflow `SVGP(whiten=True)`; GPyTorch
  `CholeskyVariationalDistribution`).

Every library gets the same kernel (variance x ARD RBF, zero mean), the same k-means inducing
inputs Z, the same initial hyperparameters, batch size 100 and float64. Measured per
(dataset, library, scheme): iterations per second after compilation (interleaved rounds),
the test NLL curve against training wall time (evaluation excluded from the clock), the time
to reach a common target NLL, and the final test NLL and RMSE / error rate. All predictions
are scored by the same numpy code from each library's latent mean and variance.

Run from the repository root, with the peers' virtualenv (see benchmarks/README.md):

    /work/peers-venv/bin/python benchmarks/svgp.py            # full run, writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/svgp.py --quick    # 5000 training rows, short runs

or with the library's own environment (peers that are not installed are skipped).
augmentedgp is imported from the checkout (src/), never from an installed copy.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"

# Threads, the same for every library, set before the imports: --threads N (default 1)
# pins OpenBLAS/OpenMP, XLA's CPU pool, torch and TensorFlow to N threads (N = 0: each
# library's defaults, all cores). At M = 100 and batch 100 the work per step is too small to
# share between cores, and on a VM shared with other jobs multi-threaded pools lose badly
# to oversubscription.
def _threads_arg(argv) -> int:
    for i, a in enumerate(argv):
        if a.startswith("--threads"):
            return int(a.split("=", 1)[1] if "=" in a else argv[i + 1])
    return 1


THREADS = _threads_arg(sys.argv[1:]) or (os.cpu_count() or 1)
if _threads_arg(sys.argv[1:]):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(THREADS)
    if THREADS == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread"
                                   "_eigen=false intra_op_parallelism_threads=1").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # must precede the TensorFlow import
SECTION_BEGIN = "<!-- BEGIN svgp.py (generated, overwritten on each run) -->"
SECTION_END = "<!-- END svgp.py -->"

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from _report import checkout, cpu_model, fmt, markdown_table, ratio  # noqa: E402
from _report import write_results as _write_section  # noqa: E402
from scipy.special import log_ndtr, ndtr  # noqa: E402

import augmentedgp as agp  # noqa: E402  (enables float64 in JAX)

jax.config.update("jax_enable_x64", True)

SKIPPED: dict[str, str] = {}  # library -> why it was skipped
try:
    import gpytorch
    import torch

    torch.set_num_threads(THREADS)
    torch.set_default_dtype(torch.float64)
except ImportError as err:  # pragma: no cover - depends on the environment
    torch = gpytorch = None
    SKIPPED["gpytorch"] = f"not installed ({err.name})"
try:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(THREADS)
    import gpflow
    from gpflow.keras import tf_keras

    gpflow.config.set_default_float(np.float64)
except ImportError as err:  # pragma: no cover
    tf = gpflow = None
    SKIPPED["gpflow"] = f"not installed ({err.name})"

LIBRARIES = ("augmentedgp", "gpflow", "gpytorch")
SCHEMES = ("NGD", "Adam")
DATASETS = ("kin40k", "protein", "electricity", "a9a")
REGRESSION = ("kin40k", "protein")
CHUNK = 50  # augmentedgp's scan chunk (fit's default); eval_every must be a multiple


# --- data and the common setup -------------------------------------------------------------


@dataclasses.dataclass
class Data:
    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    split: str

    @property
    def regression(self) -> bool:
        return self.name in REGRESSION

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]


def load_data(name: str, n_train: int | None, n_test: int | None, seed: int = 0) -> Data:
    """The split of the benchmark brief, optionally subsampled (random rows, seed 0);
    X standardised with training statistics (zero sd -> 1), regression y too."""
    with np.load(DATA_DIR / f"{name}.npz") as f:
        if name == "a9a":
            X, y = f["X_train"], f["y_train"]
            Xt, yt = f["X_test"], f["y_test"]
            split = "official train/test split"
        elif name == "electricity":  # time ordered: train on the past, test on the future
            X, y = f["X"], f["y"]
            cut = int(0.9 * X.shape[0])
            X, y, Xt, yt = X[:cut], y[:cut], X[cut:], y[cut:]
            split = "time-ordered: first 90% of rows train, last 10% test"
        else:
            test = f["split_test_mask"][0]
            X, y, Xt, yt = f["X"][~test], f["y"][~test], f["X"][test], f["y"][test]
            split = "published split 0 (90/10)"
    rng = np.random.default_rng(seed)
    if n_train and n_train < X.shape[0]:
        idx = rng.choice(X.shape[0], n_train, replace=False)
        X, y = X[idx], y[idx]
    if n_test and n_test < Xt.shape[0]:
        idx = rng.choice(Xt.shape[0], n_test, replace=False)
        Xt, yt = Xt[idx], yt[idx]
    X, Xt = np.asarray(X, float), np.asarray(Xt, float)
    mx, sx = X.mean(0), X.std(0)
    sx[sx == 0] = 1.0
    X, Xt = (X - mx) / sx, (Xt - mx) / sx
    if name in REGRESSION:
        my, sy = y.mean(), y.std()
        y, yt = (y - my) / sy, (yt - my) / sy
    else:
        y, yt = y.astype(float), yt.astype(float)  # {0, 1}
    return Data(name, X, np.asarray(y, float), Xt, np.asarray(yt, float), split)


@dataclasses.dataclass
class Setup:
    """What every library starts from."""

    Z: np.ndarray  # (M, d) inducing inputs (trained from here)
    lengthscale: np.ndarray
    variance: float = 1.0
    noise: float = 0.1  # regression only
    batch: int = 100
    lr: float = 0.01  # Adam
    ngd: float = 0.1  # natural-gradient step size
    seed: int = 0


def make_setup(data: Data, M: int, seed: int = 0) -> Setup:
    Z = agp.inducing.kmeans(data.X, M, jax.random.key(seed))
    return Setup(Z=Z, lengthscale=np.full(data.d, math.sqrt(data.d)), seed=seed)


def score(data: Data, mean, var, noise) -> tuple[float, float]:
    """(test NLL, RMSE or error rate) from the latent predictive N(mean, var)."""
    mean, var, y = np.asarray(mean).ravel(), np.asarray(var).ravel(), data.y_test
    if data.regression:
        v = var + noise
        nll = 0.5 * np.mean(np.log(2 * np.pi * v) + (y - mean) ** 2 / v)
        return float(nll), float(np.sqrt(np.mean((y - mean) ** 2)))
    z = mean / np.sqrt(1.0 + var)  # int Phi(f) N(f | m, v) df = Phi(m / sqrt(1 + v))
    nll = -np.mean(np.where(y > 0.5, log_ndtr(z), log_ndtr(-z)))
    return float(nll), float(np.mean((ndtr(z) > 0.5) != (y > 0.5)))


# --- runners: one per (library, scheme) -----------------------------------------------------
#
# warmup() compiles/traces and leaves the initial state; time_steps(n) trains n iterations
# from wherever it is and returns the seconds; train(total, every, on_eval) trains from the
# initial state, calling on_eval(iteration, train_seconds) every `every` iterations (its
# time is not counted), and returns None or why it stopped early; predict() gives the
# latent test mean, variance and noise variance. A step that fails (NaN, a Cholesky error)
# raises Diverged.


class Diverged(Exception):
    pass


def describe(err: Exception) -> str:
    """The exception's type and its most telling line (TensorFlow's first line is generic)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [""]
    line = next((ln for ln in lines if any(w in ln.lower() for w in ("nan", "inf", "positive"))),
                lines[0])
    return f"{type(err).__name__}: {line if len(line) <= 110 else line[:110] + '...'}"


class Runner:
    lib = ""

    def __init__(self, data: Data, setup: Setup, scheme: str):
        self.data, self.setup, self.scheme, self.natural = data, setup, scheme, scheme == "NGD"


class AgpRunner(Runner):
    lib = "augmentedgp"

    def __init__(self, data, setup, scheme):
        super().__init__(data, setup, scheme)
        lik = agp.likelihoods.Gaussian(setup.noise) if data.regression else \
            agp.likelihoods.Probit()
        kernel = agp.kernels.RBF(lengthscale=setup.lengthscale, variance=setup.variance)
        self.model0 = self.model = agp.SVGP(kernel, lik, setup.Z, q="whitened")
        self.inference = agp.QuadratureSVI(setup.batch, setup.ngd, natural=self.natural)
        self.calls = 0

    def _fit(self, model, n, callback=None):
        self.calls += 1  # a new minibatch key per call
        return agp.fit(model, self.data.X, self.data.y, self.inference, max_iter=n,
                       learning_rate=self.setup.lr, tol=0.0, chunk_size=CHUNK, callback=callback,
                       key=jax.random.key(self.setup.seed + self.calls))

    def warmup(self):
        self.predict(self._fit(self.model0, CHUNK).model)  # compiles the scan chunk

    def time_steps(self, n):
        post = self._fit(self.model, n)
        if post.history.n_iter < n:  # fit stops at a non-finite objective
            raise Diverged(post.history.message)
        self.model = post.model
        return float(post.history.wall_time[-1])  # the training loop; not fit's setup

    def train(self, total, every, on_eval):
        self.model = self.model0
        on_eval(0, 0.0)
        state = {"start": time.perf_counter(), "paused": 0.0}

        def callback(it, objective, model):
            if it % every == 0:
                t = time.perf_counter()
                self.model = model
                on_eval(it, t - state["start"] - state["paused"])
                state["paused"] += time.perf_counter() - t

        post = self._fit(self.model0, total, callback)
        self.model = post.model
        return None if post.history.n_iter == total else post.history.message

    def predict(self, model=None):
        model = self.model if model is None else model
        mean, var = model.predict_f(self.data.X_test)
        noise = float(model.likelihood.variance.value) if self.data.regression else 0.0
        return np.asarray(mean), np.asarray(var), noise


class StepRunner(Runner):
    """Peers: a Python loop over one compiled / eager step per iteration."""

    def warmup(self):
        try:
            for _ in range(5):
                self.step()
            self.predict()
        finally:
            self.restore(self.initial)

    def time_steps(self, n):
        t0 = time.perf_counter()
        try:
            for _ in range(n):
                self.step()
            self.sync()
        except Exception as err:
            self.restore(self.initial)
            raise Diverged(describe(err)) from err
        return time.perf_counter() - t0

    def train(self, total, every, on_eval):
        self.restore(self.initial)
        on_eval(0, 0.0)
        clock, t0 = 0.0, time.perf_counter()
        for it in range(1, total + 1):
            try:
                self.step()
            except Exception as err:
                return f"failed at iteration {it}: {describe(err)}"
            if it % every == 0:
                self.sync()
                clock += time.perf_counter() - t0
                on_eval(it, clock)
                t0 = time.perf_counter()
        return None

    def sync(self):  # every step here returns when its work is done
        pass


class GpflowState:
    """Snapshot / restore of a GPflow model's and its Adam's variables (``self.model``,
    ``self.adam``); shared with xgpc.py."""

    def _variables(self):
        return list(self.model.variables) + list(self.adam.variables)

    def snapshot(self):
        return [v.numpy() for v in self._variables()]

    def restore(self, state):
        for v, value in zip(self._variables(), state, strict=True):
            v.assign(value)


class GpflowRunner(GpflowState, StepRunner):
    lib = "gpflow"

    def __init__(self, data, setup, scheme):
        super().__init__(data, setup, scheme)
        kernel = gpflow.kernels.SquaredExponential(variance=setup.variance,
                                                   lengthscales=setup.lengthscale.copy())
        lik = gpflow.likelihoods.Gaussian(variance=setup.noise) if data.regression else \
            gpflow.likelihoods.Bernoulli()  # probit inverse link (GPflow's default)
        self.model = m = gpflow.models.SVGP(kernel, lik, inducing_variable=setup.Z.copy(),
                                            num_data=data.n, whiten=True)
        ds = tf.data.Dataset.from_tensor_slices((data.X, data.y[:, None]))
        self.batches = iter(ds.repeat().shuffle(data.n, seed=setup.seed).batch(setup.batch))
        self.adam = tf_keras.optimizers.Adam(setup.lr)
        if self.natural:  # GPflow's natural-gradient notebook
            gpflow.set_trainable(m.q_mu, False)
            gpflow.set_trainable(m.q_sqrt, False)
            natgrad = gpflow.optimizers.NaturalGradient(gamma=setup.ngd)

            @tf.function
            def step():
                batch = next(self.batches)
                loss = lambda: m.training_loss(batch)
                natgrad.minimize(loss, [(m.q_mu, m.q_sqrt)])
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
        noise = float(self.model.likelihood.variance.numpy()) if self.data.regression else 0.0
        return mean.numpy(), var.numpy(), noise


class GpytorchRunner(StepRunner):
    lib = "gpytorch"

    def __init__(self, data, setup, scheme):
        super().__init__(data, setup, scheme)
        torch.manual_seed(setup.seed)
        M, d = setup.Z.shape
        V = gpytorch.variational
        q = (V.NaturalVariationalDistribution if self.natural else
             V.CholeskyVariationalDistribution)(M)

        class SVGPModel(gpytorch.models.ApproximateGP):
            def __init__(self):
                super().__init__(V.VariationalStrategy(self, torch.tensor(setup.Z), q,
                                                       learn_inducing_locations=True))
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.RBFKernel(ard_num_dims=d))

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                                 self.covar_module(x))

        self.model = model = SVGPModel()
        model.covar_module.outputscale = setup.variance
        model.covar_module.base_kernel.lengthscale = torch.tensor(setup.lengthscale[None, :])
        if data.regression:
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
            self.likelihood.noise = setup.noise
        else:
            self.likelihood = gpytorch.likelihoods.BernoulliLikelihood()  # probit
        self.mll = gpytorch.mlls.VariationalELBO(self.likelihood, model, num_data=data.n)
        if self.natural:  # GPyTorch's natural-gradient example
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
            generator=torch.Generator().manual_seed(setup.seed))
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

    def snapshot(self):
        return copy.deepcopy((self.model.state_dict(), self.likelihood.state_dict(),
                              [o.state_dict() for o in self.optimizers]))

    def restore(self, state):
        model, lik, opts = copy.deepcopy(state)
        self.model.load_state_dict(model)
        self.likelihood.load_state_dict(lik)
        for o, s in zip(self.optimizers, opts, strict=True):
            o.load_state_dict(s)

    def predict(self):
        self.model.eval()
        means, variances = [], []
        with torch.no_grad():
            for Xb in np.array_split(self.data.X_test, max(1, len(self.data.X_test) // 2048)):
                f = self.model(torch.tensor(Xb))
                means.append(f.mean.numpy())
                variances.append(f.variance.numpy())
        self.model.train()
        noise = float(self.likelihood.noise.item()) if self.data.regression else 0.0
        return np.concatenate(means), np.concatenate(variances), noise


RUNNERS = {"augmentedgp": AgpRunner, "gpflow": GpflowRunner, "gpytorch": GpytorchRunner}


# --- the benchmark --------------------------------------------------------------------------


def bench_dataset(name: str, args) -> dict:
    t_start = time.perf_counter()
    data = load_data(name, args.n_train, args.n_test)
    setup = make_setup(data, args.M)
    print(f"== {name}: n={data.n} test={len(data.y_test)} d={data.d} M={args.M} "
          f"({time.perf_counter() - t_start:.1f} s for data + k-means)", flush=True)
    runners, notes = {}, {}  # notes: (lib, scheme) -> what went wrong
    for lib in LIBRARIES:
        if lib in SKIPPED:
            continue
        for scheme in SCHEMES:
            t0 = time.perf_counter()
            runners[lib, scheme] = r = RUNNERS[lib](data, setup, scheme)
            try:
                r.warmup()
            except Exception as err:  # a peer's step that fails within its first 5 steps
                notes[lib, scheme] = f"warm-up failed: {describe(err)}"
            print(f"  {lib:12s} {scheme:4s} build + warm-up {time.perf_counter() - t0:6.1f} s "
                  f"{notes.get((lib, scheme), '')}", flush=True)

    # 1. iterations per second: interleaved rounds of time_steps iterations
    times = {k: [] for k in runners if k not in notes}
    for _ in range(args.rounds):
        for k in list(times):
            try:
                times[k].append(runners[k].time_steps(args.time_steps))
            except Diverged:  # its timing is lost; its curve still runs below
                notes[k] = "no it/s: a step failed during the timing rounds"
                del times[k]
    rates = {k: {"median": args.time_steps / float(np.median(v)),
                 "best": args.time_steps / float(np.min(v))} for k, v in times.items()}
    for k, v in rates.items():
        print(f"  {k[0]:12s} {k[1]:4s} {v['median']:8.1f} it/s (median of {args.rounds}; best "
              f"{v['best']:.1f})", flush=True)

    # 2. test NLL against training time, from the common initial state
    curves, failed = {}, set()
    for k, r in runners.items():
        curve = []

        def on_eval(it, seconds, r=r, curve=curve):
            nll, err = score(data, *r.predict())
            curve.append((it, seconds, nll, err))

        why = r.train(args.iters, args.eval_every, on_eval)
        if why is not None:
            failed.add(k)
            notes[k] = f"{notes[k]}; curve: {why}" if k in notes else f"curve: {why}"
        curves[k] = np.array(curve)
        it, sec, nll, err = curve[-1]
        print(f"  {k[0]:12s} {k[1]:4s} {int(it)} it in {sec:6.1f} s: test NLL {nll:.4f}, "
              f"{'RMSE' if data.regression else 'error'} {err:.4f} {why or ''}", flush=True)
    return {"data": data, "rates": rates, "curves": curves, "failed": failed, "notes": notes,
            "seconds": time.perf_counter() - t_start}


def time_to_target(curve: np.ndarray, target: float) -> float | None:
    hit = np.flatnonzero(curve[:, 2] <= target)
    return float(curve[hit[0], 1]) if hit.size else None


def targets(res: dict, margin: float) -> dict[str, float]:
    """Per scheme: the worst final test NLL of the libraries that completed the run (and
    have a finite NLL) plus margin."""
    out = {}
    for scheme in SCHEMES:
        finals = [c[-1, 2] for (lib, s), c in res["curves"].items()
                  if s == scheme and (lib, s) not in res["failed"]]
        finals = [f for f in finals if np.isfinite(f)]
        if finals:
            out[scheme] = max(finals) + margin
    return out


# --- reporting ----------------------------------------------------------------------------








def results_table(all_res: list[dict], margin: float) -> tuple[str, list[str], list[str]]:
    """The main table, the verdict lines and the footnotes (failures)."""
    header = ["dataset", "scheme", "library", "it/s (median)", "it/s (best)",
              "time to target (s)", "target NLL", "final NLL", "final RMSE / error",
              "it/s ours / lib", "time to target lib / ours"]
    rows, verdict, notes = [], [], []
    for res in all_res:
        name, tg = res["data"].name, targets(res, margin)
        for scheme in SCHEMES:
            if scheme not in tg:
                continue
            rate = {lib: res["rates"].get((lib, scheme), {}).get("median") for lib in LIBRARIES}
            ttt = {lib: time_to_target(res["curves"][lib, scheme], tg[scheme])
                   for lib in LIBRARIES if (lib, scheme) in res["curves"]}
            for lib in ttt:
                key, c = (lib, scheme), res["curves"][lib, scheme]
                mark = ""
                if key in res["notes"]:
                    notes.append(f"{name} {scheme} {lib}: {res['notes'][key]}")
                    mark = f" [{len(notes)}]"
                peer = lib != "augmentedgp"
                rows.append([name, scheme, lib + mark,
                             fmt(rate[lib], ".0f", "failed"),
                             fmt(res["rates"].get(key, {}).get("best"), ".0f", "failed"),
                             fmt(ttt[lib], ".1f", "not reached"), fmt(tg[scheme], ".4f"),
                             fmt(c[-1, 2], ".4f") + (" (failed)" if key in res["failed"] else ""),
                             fmt(c[-1, 3], ".4f"),
                             fmt(ratio(rate["augmentedgp"], rate[lib]), ".2f") if peer else "",
                             fmt(ratio(ttt[lib], ttt.get("augmentedgp")), ".2f",
                                 "—" if ttt[lib] is not None else "peer never reached")
                             if peer else ""])
            q = ratio(rate["augmentedgp"], rate.get("gpflow"))
            ours_t = ttt.get("augmentedgp")
            slower = [lib for lib, t in ttt.items() if lib != "augmentedgp" and t is not None
                      and (ours_t is None or t < ours_t)]
            times = ", ".join(f"{lib} {fmt(t, '.1f', 'not reached')}" for lib, t in ttt.items())
            verdict.append(
                f"- {name} {scheme}: it/s ours / GPflow = {fmt(q, '.2f')} -> '>= 3x' "
                + ("n/a (no GPflow timing)" if q is None else "**met**" if q >= 3 else
                   "**not met**") + "; time to target "
                f"(s): {times} -> 'never slower' "
                + ("**met**." if not slower else f"**not met** (slower than {', '.join(slower)})."))
    return markdown_table(header, rows), verdict, notes


def curves_table(res: dict) -> str:
    """Test NLL at each evaluation, with the training seconds so far."""
    keys = list(res["curves"])
    longest = max(res["curves"].values(), key=len)
    header = ["iteration"] + [f"{lib} {s}" for lib, s in keys]
    rows = []
    for i, it in enumerate(longest[:, 0]):
        rows.append([int(it)] + [f"{c[i, 2]:.4f} ({c[i, 1]:.1f} s)" if i < len(c) else "—"
                                 for c in (res["curves"][k] for k in keys)])
    return markdown_table(header, rows)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "augmentedgp": agp.__version__,
           "jax": jax.__version__, "jaxlib": jaxlib.__version__, "equinox": eqx.__version__,
           "numpy": np.__version__}
    for name, mod in (("torch", torch), ("gpytorch", gpytorch), ("tensorflow", tf),
                      ("gpflow", gpflow)):
        out[name] = mod.__version__ if mod is not None else "not installed"
    out["augmentedgp"] += checkout()
    return out


def machine() -> str:
    cpu = cpu_model()
    pinned = _threads_arg(sys.argv[1:])
    xla = ("XLA CPU single-threaded (`--xla_cpu_multi_thread_eigen=false "
           "intra_op_parallelism_threads=1`)" if THREADS == 1 else "XLA CPU at its default")
    blas = f"OMP/OPENBLAS/MKL_NUM_THREADS={THREADS}" if pinned else "OpenBLAS at its default"
    return (f"nproc: {os.cpu_count()}; CPU: {cpu}; platform: {platform.platform()}; threads "
            f"(--threads {pinned}): torch.set_num_threads({THREADS}), TensorFlow intra/inter-op "
            f"{THREADS}, {xla}, {blas}")




def report(args, all_res, total_s, load, vers) -> str:
    cmd = " ".join([Path(sys.executable).as_posix(), "benchmarks/svgp.py", *sys.argv[1:]])
    table, verdict, notes = results_table(all_res, args.margin)
    sizes = "; ".join(f"{r['data'].name}: n={r['data'].n}, test {len(r['data'].y_test)}, "
                      f"d={r['data'].d} ({r['data'].split})" for r in all_res)
    lines = [
        "## SVGP: minibatch training against GPflow and GPyTorch (`benchmarks/svgp.py`)",
        "",
        f"Run {datetime.datetime.now().isoformat(timespec='seconds')} from the repository root:",
        "",
        f"    {cmd}",
        "",
        f"Total run time {total_s / 60:.1f} min. Data: {sizes}. Inputs standardised with the "
        "training statistics (zero sd -> 1), regression targets too (NLL in standardised "
        "units). Model in every library: variance x ARD RBF, zero mean, M = "
        f"{args.M} inducing inputs from augmentedgp's k-means (seed 0; the same Z for all, "
        "trained), whitened q(u) starting at the prior, initial variance 1, lengthscales "
        "sqrt(d) (ones would make k(x, z) ~ exp(-d) at standardised inputs: ~e^-123 on a9a), "
        "Gaussian noise variance 0.1 (regression) or a **probit** Bernoulli likelihood "
        "(GPflow's and GPyTorch's default link; augmentedgp `Probit()`), 20-point "
        "Gauss-Hermite expectations, batch size 100 with shuffled epochs (GPflow: "
        "`tf.data` shuffle + batch; GPyTorch: `DataLoader(shuffle=True)`), Adam lr 0.01, "
        "natural-gradient step 0.1, float64. Positive parameters: exp in augmentedgp, "
        "softplus in GPflow and GPyTorch (so Adam's paths differ slightly).",
        "",
        "**Schemes.** *NGD*: augmentedgp `fit(SVGP, QuadratureSVI(100, step_size=0.1))` (per "
        "iteration an Adam step on hyperparameters + Z and a natural-gradient step on q(u), "
        "both from one projection of the batch at the current state; jitted `lax.scan` chunks "
        "of 50); GPflow `NaturalGradient(gamma=0.1)` on "
        "(q_mu, q_sqrt) and Adam on the rest, both in one `tf.function` step on the same "
        "batch (the natural-gradient notebook); GPyTorch `NaturalVariationalDistribution` + "
        "`NGD(lr=0.1)` and Adam on the hyperparameters from one backward pass (its NGD "
        "example). *Adam*: Adam on everything, q(u) = N(m, LL^T) (augmentedgp "
        "`natural=False`, GPflow SVGP, GPyTorch `CholeskyVariationalDistribution`).",
        "",
        f"**Measures.** *it/s*: {args.rounds} interleaved rounds per dataset of "
        f"{args.time_steps} iterations per (library, scheme) after compilation / tracing; "
        "median and best round (augmentedgp: the wall time of `fit`'s training loop, "
        "i.e. scan chunks of 50 plus the Python work between them; peers: their Python "
        f"loop). *Curves*: {args.iters} iterations from the common initial state, test "
        f"NLL (mean negative log predictive density) every {args.eval_every} iterations, "
        "against training wall time with the evaluations excluded. *Time to target*: "
        "the first evaluation at which the test NLL <= target, where target (per dataset and "
        f"scheme) = the worst final test NLL of the three libraries + {args.margin}. "
        "Predictions of every library are scored by the same numpy code from its latent "
        "mean and variance (regression: + its noise variance; probit: "
        "Phi(m / sqrt(1 + v))).",
        "",
        f"**Machine.** {machine()}; load average (1 min) at start / end: {load[0]:.2f} / "
        f"{load[1]:.2f} (the VM is shared with other jobs: timings are noisy).",
        "",
        "**Versions** (checkout as imported at the start). "
        + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
    ]
    if SKIPPED:
        lines += ["**Skipped.** " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()), ""]
    lines += ["### Results", "", table, "",
              "Ratios: `it/s ours / lib` > 1 and `time to target lib / ours` > 1 mean "
              "augmentedgp is faster. A failed run keeps the evaluations before its failure "
              "and does not set the target.", "",
              *(f"- [{i}] {n}" for i, n in enumerate(notes, 1)), "",
              "### Verdict (targets: >= 3x GPflow's it/s; never slower to target)", "",
              *verdict, ""]
    lines += ["### Test NLL curves (training seconds in brackets)", ""]
    for res in all_res:
        lines += [f"**{res['data'].name}** ({res['seconds']:.0f} s for this dataset)", "",
                  curves_table(res), ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="5000 training / 2000 test rows, 1000 iterations, 2 timing rounds")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--n-train", type=int, default=None, help="subsample the training rows")
    parser.add_argument("--n-test", type=int, default=None, help="subsample the test rows")
    parser.add_argument("--M", type=int, default=100, help="inducing points")
    parser.add_argument("--iters", type=int, default=None, help="iterations per training curve")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--time-steps", type=int, default=None, help="iterations per timing round")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds")
    parser.add_argument("--margin", type=float, default=0.01, help="target = worst final + this")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for every library (0: their defaults); read at import")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS_MD}")
    args = parser.parse_args(argv)
    defaults = ({"n_train": 5000, "n_test": 2000, "iters": 1000, "eval_every": 100,
                 "time_steps": 200, "rounds": 2} if args.quick else
                {"iters": 4000, "eval_every": 200, "time_steps": 500, "rounds": 3})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.eval_every % CHUNK or args.iters % args.eval_every or args.time_steps % CHUNK:
        parser.error(f"--eval-every and --time-steps must be multiples of {CHUNK}, and --iters "
                     "of --eval-every")

    for lib, why in SKIPPED.items():
        print(f"note: skipping {lib}: {why}")
    start, load0, vers = time.perf_counter(), os.getloadavg()[0], versions()
    all_res = [bench_dataset(name, args) for name in args.datasets.split(",")]
    text = report(args, all_res, time.perf_counter() - start, (load0, os.getloadavg()[0]), vers)
    print()
    print(text)
    if not args.no_write:
        _write_section(text, SECTION_BEGIN, SECTION_END)
        print(f"\n(wrote {RESULTS_MD.relative_to(REPO)})")


if __name__ == "__main__":
    main()
