"""Heteroscedastic regression benchmark: augmentedgp's augmented two-latent model against
GPflow's heteroskedastic SVGP.

Two problems, all in one process:

- *synthetic*: x ~ U[-3, 3], y = sin(2x) + s(x) eps with a known noise sd
  s(x) = 0.1 + 0.45 (1 - cos x) (0.1 at x = 0, ~1 at the ends: 10x across the range);
- a real dataset (default ``protein``, the published split 0, 8000 random training rows,
  standardised with the training statistics): in development runs (augmentedgp only, 8000
  rows, 30 s) modelling the noise gained 0.045 nats per test point on protein, and nothing
  on power_plant (the heteroscedastic model was 0.02 worse); kin40k and naval gained no
  accuracy either.

Configurations (M fixed k-means inducing inputs, the same Z, batch size, initial values and
float64 for every library):

- augmentedgp ``SVGP([RBF, RBF], HeteroscedasticGaussian(precision), Z)``: y ~ N(f,
  1 / (precision sigmoid(g))), fitted by ``AnalyticSVI(batch)`` (the augmented closed-form
  natural-parameter steps; q(u) ``natural_whitened``) and, for reference, by
  ``QuadratureSVI(batch, 0.1)`` (Gauss-Hermite in g, exact in f); the initial precision
  is ``--headroom`` (10) / the initial noise variance, with the g mean at logit(1 / 10), and
  ``AnalyticSVI, g mean 0`` repeats AnalyticSVI from precision 2 / noise variance, g mean 0
  (the start matters: the sigmoid link has a noise floor 1 / precision);
- augmentedgp homoscedastic baseline: ``SVGP(RBF, Gaussian(noise), Z)`` with
  ``AnalyticSVI(batch)`` (the gain from modelling the noise);
- GPflow ``SVGP`` with ``HeteroskedasticTFPConditional(Normal, scale_transform=Exp())``, a
  ``SeparateIndependent([k_f, k_g])`` kernel and ``SharedIndependentInducingVariables``:
  ``NaturalGradient(gamma=0.1)`` on (q_mu, q_sqrt) + Adam(0.01) on the rest (GPflow's
  heteroskedastic notebook), and Adam(0.01) on everything.

The two models differ in their noise link (augmentedgp: variance 1 / (precision sigmoid(g));
GPflow: sd exp(g)), so they are compared on predictive quality: test NLL (one scoring
function for every library: exact in f, 40-point Gauss-Hermite in g), RMSE and, on the
synthetic problem, the recovery of the true noise sd on a grid -- and on time (iterations
per second after compilation, test NLL against training wall time up to a budget, time to
a common target NLL = GPflow's best final NLL + margin).

Run from the repository root, with the peers' virtualenv (see benchmarks/README.md):

    /work/peers-venv/bin/python benchmarks/heteroscedastic.py            # full, ~13 min
    /work/peers-venv/bin/python benchmarks/heteroscedastic.py --quick    # ~4 min, no write
    /work/peers-venv/bin/python benchmarks/heteroscedastic.py --quick --datasets synthetic \
        --libraries augmentedgp --json /tmp/hetero.json                 # one problem, ours only

or with the library's own environment (GPflow is skipped if not installed). augmentedgp is
imported from the checkout (src/), never from an installed copy.
"""

from __future__ import annotations

import os
import sys

from _threads import arg as _arg

# One core for the whole process (--threads 1, the default): jaxlib 0.10.2's batched LAPACK
# kernels (the Cholesky of the two latents' (2, M, M) matrices, vmapped) split the batch
# over XLA's intra-op pool and block waiting for it; with M >= 67 and two such calls running
# concurrently on a 2-thread pool (this 2-core VM) every pool thread waits and the process
# hangs for ever. With one allowed CPU the pool has one thread and the kernels run inline.
# Set before JAX (imported by svgp.py) creates its CPU client.
PINNED_CPU = None
if int(_arg(sys.argv[1:], "--threads", "1")) == 1 and hasattr(os, "sched_setaffinity"):
    _allowed = sorted(os.sched_getaffinity(0))
    PINNED_CPU = int(_arg(sys.argv[1:], "--cpu", str(_allowed[-1])))
    os.sched_setaffinity(0, {PINNED_CPU})

# isort: off
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

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _report import fmt, markdown_table, ratio  # noqa: E402
from _report import write_results as _write_section  # noqa: E402

import augmentedgp as agp  # noqa: E402

try:  # re-exported from augmentedgp.likelihoods since fba474a; multilatent before that
    HeteroscedasticGaussian = agp.likelihoods.HeteroscedasticGaussian
except AttributeError:
    from augmentedgp.likelihoods import HeteroscedasticGaussian

gpflow, tf = base.gpflow, base.tf
tfp = None
if gpflow is not None:
    tf.get_logger().setLevel("ERROR")  # natural-gradient steps warn about persistent tapes
    from gpflow.keras import tf_keras
    try:
        import tensorflow_probability as tfp
    except ImportError as err:  # pragma: no cover - depends on the environment
        gpflow = None
        SKIPPED["gpflow"] = f"not installed ({err.name})"

REPO, DATA_DIR, RESULTS_MD = base.REPO, base.DATA_DIR, base.RESULTS_MD
SECTION_BEGIN = "<!-- BEGIN heteroscedastic.py (generated, overwritten on each run) -->"
SECTION_END = "<!-- END heteroscedastic.py -->"
TITLE = "## Heteroscedastic regression: augmentedgp vs GPflow"

REAL = ("power_plant", "protein", "kin40k", "naval", "concrete", "energy", "yacht", "boston")
CHUNK = 50  # augmentedgp's scan chunk (fit's default)
GH_POINTS = 40  # Gauss-Hermite nodes in g for the common test NLL
AGP = ("AnalyticSVI", "QuadratureSVI", "homoscedastic AnalyticSVI")
G0 = "AnalyticSVI, g mean 0"  # sensitivity: the initial precision 2 / noise0 (headroom 2)
GPFLOW = ("NGD+Adam", "Adam")
GPFLOW_NGD = (0.1, 0.01)  # the notebook's gamma; a smaller one if it fails in 100 steps


def noise_sd_true(x):
    """The synthetic problem's noise sd: 0.1 at x = 0, 0.1 + 0.9 (1 - cos 3) / 2 ~ 0.995
    at x = +-3."""
    return 0.1 + 0.45 * (1.0 - np.cos(x))


def f_true(x):
    return np.sin(2.0 * x)


# --- data -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    split: str
    X_grid: np.ndarray | None = None  # synthetic: where the noise recovery is measured

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def synthetic(self) -> bool:
        return self.X_grid is not None


def synthetic_data(n_train: int, n_test: int, seed: int = 0) -> Data:
    rng = np.random.default_rng(seed)

    def draw(n):
        x = rng.uniform(-3.0, 3.0, n)
        return x[:, None], f_true(x) + noise_sd_true(x) * rng.standard_normal(n)

    X, y = draw(n_train)
    Xt, yt = draw(n_test)
    return Data("synthetic", X, y, Xt, yt, f"x ~ U[-3, 3], seed {seed}; raw scale",
                X_grid=np.linspace(-3.0, 3.0, 201)[:, None])


def real_data(name: str, n_train: int | None, n_test: int | None, seed: int = 0) -> Data:
    """The published split 0 (90/10), optionally subsampled (random rows, seed 0); X and y
    standardised with the training statistics (zero sd -> 1)."""
    with np.load(DATA_DIR / f"{name}.npz") as f:
        test = f["split_test_mask"][0]
        X, y, Xt, yt = f["X"][~test], f["y"][~test], f["X"][test], f["y"][test]
    split = "published split 0 (90/10)"
    rng = np.random.default_rng(seed)
    if n_train and n_train < X.shape[0]:
        idx = rng.choice(X.shape[0], n_train, replace=False)
        X, y = X[idx], y[idx]
        split += f", {n_train} training rows drawn at random"
    if n_test and n_test < Xt.shape[0]:
        idx = rng.choice(Xt.shape[0], n_test, replace=False)
        Xt, yt = Xt[idx], yt[idx]
    X, Xt = np.asarray(X, float), np.asarray(Xt, float)
    mx, sx = X.mean(0), X.std(0)
    sx[sx == 0] = 1.0
    my, sy = float(np.mean(y)), float(np.std(y))
    return Data(name, (X - mx) / sx, (np.asarray(y, float) - my) / sy, (Xt - mx) / sx,
                (np.asarray(yt, float) - my) / sy, split)


@dataclasses.dataclass
class Setup:
    """What every library starts from."""

    Z: np.ndarray  # (M, d) inducing inputs, kept fixed
    lengthscale: np.ndarray
    variance: float = 1.0  # both kernels
    mean_y: float = 0.0  # constant prior mean of f (trained)
    noise0: float = 0.1  # initial (plug-in) noise variance
    batch: int = 200
    lr: float = 0.01  # Adam
    ngd: float = 0.1  # natural-gradient step (QuadratureSVI; GPflow's notebook)
    headroom: float = 2.0  # augmentedgp: initial precision = headroom / noise0


def make_setup(data: Data, M: int, batch: int, headroom: float = 2.0) -> Setup:
    Z = np.asarray(agp.inducing.kmeans(data.X, M, jax.random.key(0)))
    ell = 1.0 if data.synthetic else math.sqrt(data.d)
    return Setup(Z=Z, lengthscale=np.full(data.d, ell), mean_y=float(np.mean(data.y)),
                 noise0=0.1 * float(np.var(data.y)), batch=batch, headroom=headroom)


# --- scoring: one function for every library ---------------------------------------------


@dataclasses.dataclass
class Prediction:
    """Latent marginals at the test points (and the grid): f ~ N(mf, vf), g ~ N(mg, vg),
    and the noise variance as a function of g: ``link`` "sigmoid" (1 / (lam sigmoid(g))),
    "exp" (exp(2 g)) or "const" (lam is the variance; no g)."""

    mf: np.ndarray
    vf: np.ndarray
    mg: np.ndarray | None
    vg: np.ndarray | None
    link: str
    lam: float = 1.0

    def noise_var(self, g):
        if self.link == "sigmoid":
            return (1.0 + np.exp(np.minimum(-g, 700.0))) / self.lam
        if self.link == "exp":
            return np.exp(np.minimum(2.0 * g, 1400.0))
        raise ValueError(self.link)

    def expected_noise_var(self):
        """E_q(g)[noise variance] in closed form."""
        if self.link == "const":
            return np.full_like(self.mf, self.lam)
        if self.link == "sigmoid":  # E[1 + e^-g] = 1 + e^(-m + v/2)
            return (1.0 + np.exp(-self.mg + 0.5 * self.vg)) / self.lam
        return np.exp(2.0 * self.mg + 2.0 * self.vg)  # E[e^2g]

    def take(self, sl):
        pick = lambda a: None if a is None else a[sl]
        return Prediction(self.mf[sl], self.vf[sl], pick(self.mg), pick(self.vg), self.link,
                          self.lam)


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(GH_POINTS)
_GH_LOGW = np.log(_GH_W / math.sqrt(2.0 * math.pi))


def log_density(pred: Prediction, y) -> np.ndarray:
    """log p(y_i | data) = log int N(y | mf, vf + noise(g)) N(g | mg, vg) dg."""
    if pred.link == "const":
        v = pred.vf + pred.lam
        return -0.5 * (np.log(2 * np.pi * v) + (y - pred.mf) ** 2 / v)
    g = pred.mg[:, None] + np.sqrt(np.maximum(pred.vg, 0.0))[:, None] * _GH_X
    v = pred.vf[:, None] + pred.noise_var(g)
    lp = -0.5 * (np.log(2 * np.pi * v) + (y - pred.mf)[:, None] ** 2 / v) + _GH_LOGW
    top = np.max(lp, axis=1, keepdims=True)
    return top[:, 0] + np.log(np.sum(np.exp(lp - top), axis=1))


METRICS = ("nll", "rmse", "sd_rmse", "sd_corr", "sd_logrmse", "f_rmse")


def score(data: Data, pred: Prediction) -> dict[str, float]:
    """Test NLL and RMSE; synthetic: also the noise recovery on the grid -- RMS error and
    correlation of the fitted noise sd sqrt(E[noise variance]) against the true s(x), the
    RMS of log(fitted / true) -- and the RMS error of the mean against the true f."""
    nt = len(data.y_test)
    out = dict.fromkeys(METRICS, math.nan)
    arrays = [pred.mf, pred.vf] + ([] if pred.mg is None else [pred.mg, pred.vg])
    if not all(np.all(np.isfinite(a)) for a in arrays):
        return out
    test = pred.take(slice(0, nt))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out["nll"] = -float(np.mean(log_density(test, data.y_test)))
    out["rmse"] = float(np.sqrt(np.mean((data.y_test - test.mf) ** 2)))
    if data.synthetic:
        grid = pred.take(slice(nt, None))
        x = data.X_grid[:, 0]
        sd, true = np.sqrt(grid.expected_noise_var()), noise_sd_true(x)
        out["sd_rmse"] = float(np.sqrt(np.mean((sd - true) ** 2)))
        out["sd_corr"] = float(np.corrcoef(sd, true)[0, 1]) if np.std(sd) > 0 else math.nan
        out["sd_logrmse"] = float(np.sqrt(np.mean(np.log(sd / true) ** 2)))
        out["f_rmse"] = float(np.sqrt(np.mean((grid.mf - f_true(x)) ** 2)))
    return out


def eval_inputs(data: Data) -> np.ndarray:
    return data.X_test if data.X_grid is None else np.concatenate([data.X_test, data.X_grid])


# --- runners ------------------------------------------------------------------------------
#
# warmup() compiles/traces and leaves the initial state; time_steps(n) trains n iterations
# from the initial state and returns the seconds; train(grid, on_eval) trains from the
# initial state until the training clock passes grid[-1] (the budget), calling
# on_eval(iteration, train_seconds) (not counted; returns True to stop) at the first
# iteration past each grid time, and returns None or why it stopped early; predict() gives
# a Prediction at eval_inputs(data); native_nll() the library's own test NLL.


class AgpRunner:
    lib = "augmentedgp"

    def __init__(self, data: Data, setup: Setup, scheme: str, step=None):
        self.data, self.setup, self.scheme = data, setup, scheme
        self.hetero = scheme != "homoscedastic AnalyticSVI"
        Z = agp.params.fixed(agp.params.real(setup.Z, "inducing"))
        rbf = lambda: agp.kernels.RBF(lengthscale=setup.lengthscale.copy(),
                                      variance=setup.variance)
        if self.hetero:
            # plug-in noise variance 1 / (lam sigmoid(g0)) = noise0 at the g prior mean g0,
            # with the noise floor 1 / lam = noise0 / headroom (headroom 2: g0 = 0)
            h = 2.0 if scheme == G0 else setup.headroom
            lik = HeteroscedasticGaussian(precision=h / setup.noise0)
            kernel = [rbf(), rbf()]
            mean = [agp.means.Constant(setup.mean_y),
                    agp.means.Constant(-math.log(h - 1.0))]  # logit(1 / h)
        else:
            lik = agp.likelihoods.Gaussian(setup.noise0)
            kernel, mean = rbf(), agp.means.Constant(setup.mean_y)
        q = "whitened" if scheme == "QuadratureSVI" else "natural_whitened"
        self.model0 = self.model = agp.SVGP(kernel, lik, Z, mean=mean, q=q)
        self.inference = (agp.QuadratureSVI(setup.batch, setup.ngd)
                          if scheme == "QuadratureSVI" else agp.AnalyticSVI(setup.batch, step))
        self.calls = 0

    def _fit(self, model, n, callback=None):
        self.calls += 1  # a new minibatch key per call
        return agp.fit(model, self.data.X, self.data.y, self.inference, max_iter=n,
                       learning_rate=self.setup.lr, tol=0.0, chunk_size=CHUNK,
                       callback=callback, key=jax.random.key(self.calls))

    def warmup(self):
        post = self._fit(self.model0, CHUNK)  # compiles the scan chunk
        if post.history.n_iter < CHUNK:
            raise Diverged(post.history.message)
        score(self.data, self.predict(post.model))  # compiles the prediction

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

    def predict(self, model=None):
        model = self.model if model is None else model
        mean, var = model.predict_f(eval_inputs(self.data))
        mean, var = np.asarray(mean), np.asarray(var)
        if not self.hetero:
            return Prediction(mean.ravel(), var.ravel(), None, None, "const",
                              float(model.likelihood.variance.value))
        return Prediction(mean[:, 0], var[:, 0], mean[:, 1], var[:, 1], "sigmoid",
                          float(model.likelihood.precision.value))

    def native_nll(self):
        lp = self.model.predict_log_density(self.data.X_test, self.data.y_test)
        return -float(np.mean(np.asarray(lp)))

    def fitted(self) -> str:
        lik = self.model.likelihood
        if not self.hetero:
            return f"noise variance {float(lik.variance.value):.4g}"
        c = np.asarray(self.model.mean.c.value)
        return (f"precision {float(lik.precision.value):.4g}, g mean {c[1]:.3g}, kernel "
                f"variances {np.round(np.asarray(self.model.kernel.variance.value), 3).tolist()}")


class GpflowRunner(base.GpflowState):
    """A Python loop over one tf.function step per iteration (as svgp.py / xgpc.py)."""

    lib = "gpflow"

    def __init__(self, data: Data, setup: Setup, scheme: str, gamma=0.1):
        self.data, self.setup, self.scheme, self.gamma = data, setup, scheme, gamma
        lik = gpflow.likelihoods.HeteroskedasticTFPConditional(
            distribution_class=tfp.distributions.Normal, scale_transform=tfp.bijectors.Exp())
        kernel = gpflow.kernels.SeparateIndependent(
            [gpflow.kernels.SquaredExponential(variance=setup.variance,
                                               lengthscales=setup.lengthscale.copy())
             for _ in range(lik.latent_dim)])
        inducing = gpflow.inducing_variables.SharedIndependentInducingVariables(
            gpflow.inducing_variables.InducingPoints(setup.Z.copy()))
        # plug-in noise variance exp(2 c_g) = noise0 at g = c_g
        mean = gpflow.mean_functions.Constant(np.array([setup.mean_y,
                                                        0.5 * math.log(setup.noise0)]))
        self.model = m = gpflow.models.SVGP(kernel, lik, inducing, mean_function=mean,
                                            num_latent_gps=lik.latent_dim, num_data=data.n,
                                            whiten=True)
        gpflow.set_trainable(m.inducing_variable, False)
        ds = tf.data.Dataset.from_tensor_slices((data.X, data.y[:, None]))
        self.batches = iter(ds.repeat().shuffle(data.n, seed=0).batch(setup.batch))
        self.adam = tf_keras.optimizers.Adam(setup.lr)
        if scheme == "NGD+Adam":  # GPflow's heteroskedastic notebook
            gpflow.set_trainable(m.q_mu, False)
            gpflow.set_trainable(m.q_sqrt, False)
            natgrad = gpflow.optimizers.NaturalGradient(gamma=gamma)

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

    def warmup(self, n=5):
        try:
            for _ in range(n):
                self.step()
            if not np.isfinite(score(self.data, self.predict())["nll"]):
                raise Diverged(f"non-finite test NLL after {n} warm-up steps")
        finally:
            self.restore(self.initial)

    def time_steps(self, n):
        self.restore(self.initial)
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

    def predict(self):
        mean, var = self.model.predict_f(eval_inputs(self.data))
        mean, var = mean.numpy(), var.numpy()
        return Prediction(mean[:, 0], var[:, 0], mean[:, 1], var[:, 1], "exp")

    def native_nll(self):
        lp = self.model.predict_log_density((self.data.X_test, self.data.y_test[:, None]))
        return -float(np.mean(lp.numpy()))

    def fitted(self) -> str:
        c = self.model.mean_function.c.numpy()
        v = [float(k.variance.numpy()) for k in self.model.kernel.kernels]
        return f"g mean {c[1]:.3g}, kernel variances {np.round(v, 3).tolist()}"


# --- the benchmark --------------------------------------------------------------------------


def configurations(args) -> list[tuple[str, str]]:
    libraries = args.libraries and args.libraries.split(",")
    out = [("augmentedgp", s) for s in AGP]
    if args.headroom != 2.0:
        out.insert(2, ("augmentedgp", G0))
    if "gpflow" not in SKIPPED:
        out += [("gpflow", s) for s in GPFLOW]
    return [k for k in out if libraries is None or k[0] in libraries or label(k) in libraries]


def label(key) -> str:
    return f"{key[0]} {key[1]}"


def time_grid(budget: float, points: int) -> np.ndarray:
    """Evaluation times: geometric from budget / 1000 to the budget."""
    return np.geomspace(budget / 1000, budget, points)


def build(lib, scheme, data, setup, args, notes):
    key = (lib, scheme)
    if lib == "augmentedgp":
        r = AgpRunner(data, setup, scheme, args.agp_step_schedule)
        r.warmup()
        return r
    if scheme != "NGD+Adam":
        r = GpflowRunner(data, setup, scheme)
        r.warmup()
        return r
    failures = []
    for gamma in GPFLOW_NGD:
        r = GpflowRunner(data, setup, scheme, gamma=gamma)
        try:
            r.warmup(100)
        except Exception as err:
            failures.append(f"gamma {gamma} failed within 100 steps ({describe(err)})")
            continue
        if failures:
            notes[key] = "; ".join(failures) + f"; using gamma {gamma}"
        return r
    raise Diverged("; ".join(failures))


def bench_problem(data: Data, args, budget: float, M: int) -> dict:
    t_start = time.perf_counter()
    setup = make_setup(data, M, args.batch, args.headroom)
    print(f"== {data.name}: n={data.n} test={len(data.y_test)} d={data.d} M={M} "
          f"batch {setup.batch} budget {budget:g} s ({time.perf_counter() - t_start:.1f} s "
          "for k-means)", flush=True)
    runners, notes = {}, {}
    for key in configurations(args):
        t0 = time.perf_counter()
        try:
            runners[key] = build(*key, data, setup, args, notes)
        except Exception as err:
            why = err if isinstance(err, Diverged) else describe(err)
            notes[key] = f"build / warm-up failed: {why}"
        print(f"  {key[0]:12s} {key[1]:26s} build + warm-up {time.perf_counter() - t0:6.1f} s "
              f"{notes.get(key, '')}", flush=True)

    # 1. iterations per second: per runner rounds of ~round_seconds, interleaved
    steps = {}
    for key, r in list(runners.items()):
        unit = CHUNK if key[0] == "augmentedgp" else 10
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
        print(f"  {k[0]:12s} {k[1]:26s} {v['median']:8.1f} it/s (median of {args.rounds} "
              f"rounds of {v['steps']}; best {v['best']:.1f})", flush=True)

    # 2. test metrics against training time, from the common initial state, to the budget
    grid = time_grid(budget, args.eval_points)
    curves, failed, native, fitted = {}, set(), {}, {}
    for k, r in runners.items():
        curve = []

        def on_eval(it, seconds, r=r, curve=curve):
            s = score(data, r.predict())
            curve.append([it, seconds] + [s[m] for m in METRICS])
            return not np.isfinite(s["nll"])

        t0 = time.perf_counter()
        why = r.train(grid, on_eval)
        if why is not None:
            failed.add(k)
            notes[k] = f"{notes[k]}; curve: {why}" if k in notes else f"curve: {why}"
        curves[k] = np.array(curve)
        try:
            native[k] = r.native_nll()
        except Exception as err:  # only a cross-check of the common scorer
            native[k] = math.nan
            print(f"    native NLL failed: {describe(err)}")
        fitted[k] = r.fitted()
        last = dict(zip(("it", "s", *METRICS), curve[-1], strict=True))
        extra = (f", noise sd RMSE {last['sd_rmse']:.4f} (corr {last['sd_corr']:.4f})"
                 if data.synthetic else "")
        print(f"  {k[0]:12s} {k[1]:26s} {int(last['it']):7d} it in {last['s']:6.1f} s: test NLL "
              f"{last['nll']:.4f} (library's own {native[k]:.4f}), RMSE {last['rmse']:.4f}"
              f"{extra} ({time.perf_counter() - t0:.0f} s with evaluations) {why or ''}; "
              f"{fitted[k]}", flush=True)
    return {"data": data, "M": M, "setup": setup, "rates": rates, "curves": curves,
            "failed": failed, "notes": notes, "native": native, "fitted": fitted,
            "budget": budget, "seconds": time.perf_counter() - t_start}


def time_to_target(curve: np.ndarray, target: float) -> float | None:
    """The training seconds of the first evaluation after iteration 0 at or below target."""
    hit = np.flatnonzero((curve[:, 2] <= target) & (curve[:, 0] > 0))
    return float(curve[hit[0], 1]) if hit.size else None


def final(res, key, metric="nll") -> float | None:
    c = res["curves"].get(key)
    if c is None or not len(c):
        return None
    v = float(c[-1, 2 + METRICS.index(metric)])
    return v if np.isfinite(v) else None


def summarise(res: dict, margin: float) -> dict:
    """Target = best GPflow final NLL + margin (augmentedgp QuadratureSVI's if GPflow did
    not run); times to it; speed-ups of AnalyticSVI (and QuadratureSVI)."""
    curves = res["curves"]
    peers = [k for k in curves if k[0] == "gpflow" and final(res, k) is not None]
    ref = peers or [k for k in curves if k == ("augmentedgp", "QuadratureSVI")
                    and final(res, k) is not None]
    out = {"reference": "gpflow" if peers else "augmentedgp QuadratureSVI" if ref else None}
    if not ref:
        return out
    best = min(ref, key=lambda k: final(res, k))
    target = final(res, best) + margin
    ttt = {k: time_to_target(c, target) for k, c in curves.items() if len(c)}
    ours = ttt.get(("augmentedgp", "AnalyticSVI"))
    reached = [k for k in ref if ttt.get(k) is not None]
    fastest = min(reached, key=lambda k: ttt[k]) if reached else None
    out.update(best=best, target=target, ttt=ttt, fastest=fastest, ours=ours,
               speedup_fastest=ratio(ttt[fastest], ours) if fastest else None)
    return out


# --- reporting ----------------------------------------------------------------------------


def results_table(all_res, margin) -> tuple[str, list[str]]:
    header = ["problem", "configuration", "it/s (median)", "it/s (best)", "iterations",
              "final test NLL", "final RMSE", "noise sd RMSE", "noise sd corr",
              "noise RMS log ratio", "f RMSE (grid)", "time to target (s)",
              "time to target / AnalyticSVI's", "it/s AnalyticSVI / this"]
    rows, notes = [], []
    for res in all_res:
        name, s = res["data"].name, summarise(res, margin)
        ours_rate = res["rates"].get(("augmentedgp", "AnalyticSVI"), {}).get("median")
        for key, c in res["curves"].items():
            mark = ""
            if key in res["notes"]:
                notes.append(f"{name} {label(key)}: {res['notes'][key]}")
                mark = f" [{len(notes)}]"
            rate = res["rates"].get(key, {})
            t = s.get("ttt", {}).get(key)
            is_ours = key == ("augmentedgp", "AnalyticSVI")
            rel = "" if is_ours else fmt(ratio(t, s.get("ours")), ".1f",
                                        "AnalyticSVI never reached" if t is not None else "—")
            last = c[-1] if len(c) else None

            def get(m, spec=".4f", last=last):
                return fmt(None if last is None else float(last[2 + METRICS.index(m)]), spec)

            tag = " (best)" if key == s.get("best") else ""
            rows.append([name, label(key) + tag + mark, fmt(rate.get("median"), ".0f"),
                         fmt(rate.get("best"), ".0f"), int(last[0]) if last is not None else "—",
                         get("nll") + (" (failed)" if key in res["failed"] else ""),
                         get("rmse"), get("sd_rmse"), get("sd_corr"), get("sd_logrmse"),
                         get("f_rmse"), fmt(t, ".2f", "not reached"), rel,
                         "" if is_ours else fmt(ratio(ours_rate, rate.get("median")), ".1f")])
        for key in res["notes"]:
            if key not in res["curves"]:
                notes.append(f"{name} {label(key)}: {res['notes'][key]}")
                rows.append([name, f"{label(key)} [{len(notes)}]"] + ["—"] * 12)
    return markdown_table(header, rows), notes


def curves_table(res: dict) -> str:
    """Test NLL / RMSE at a few training times: the last evaluation at or before each."""
    budget = res["budget"]
    marks = [t for t in (0.1, 0.3, 1, 3, 10, 30, 100, 300) if t < budget] + [budget]
    keys = list(res["curves"])
    rows = []
    for t in marks:
        row = [f"{t:g}"]
        for k in keys:
            c = res["curves"][k]
            i = np.flatnonzero(c[:, 1] <= t * (1 + 1e-9))
            row.append("—" if not i.size else f"{c[i[-1], 2]:.4f} / {c[i[-1], 3]:.4f} "
                       f"({int(c[i[-1], 0])} it)")
        rows.append(row)
    return markdown_table(["training s"] + [label(k) for k in keys], rows)


def findings(all_res, margin) -> list[str]:
    lines = []
    for res in all_res:
        name, s = res["data"].name, summarise(res, margin)
        ours = ("augmentedgp", "AnalyticSVI")
        homo = ("augmentedgp", "homoscedastic AnalyticSVI")
        f_ours, f_homo = final(res, ours), final(res, homo)
        parts = []
        if f_ours is not None and f_homo is not None:
            parts.append(f"modelling the noise: test NLL {f_homo:.4f} (homoscedastic) -> "
                         f"{f_ours:.4f} (AnalyticSVI), {f_homo - f_ours:+.4f} nats per point")
        if s.get("reference") == "gpflow":
            best = s["best"]
            f_best = final(res, best)
            parts.append(f"AnalyticSVI final NLL {fmt(f_ours, '.4f')} vs best GPflow "
                         f"({best[1]}) {f_best:.4f} ("
                         + ("better" if f_ours is not None and f_ours < f_best else "worse")
                         + f" by {fmt(None if f_ours is None else abs(f_ours - f_best), '.4f')})")
            if res["data"].synthetic:
                parts.append(f"noise sd RMSE {fmt(final(res, ours, 'sd_rmse'), '.4f')} vs "
                             f"{fmt(final(res, best, 'sd_rmse'), '.4f')}")
            r_ours = res["rates"].get(ours, {}).get("median")
            r_peer = {k: res["rates"].get(k, {}).get("median") for k in res["curves"]
                      if k[0] == "gpflow"}
            parts.append("it/s AnalyticSVI / GPflow: " + ", ".join(
                f"{fmt(ratio(r_ours, v), '.1f')}x ({k[1]})" for k, v in r_peer.items()))
            fastest = s["fastest"]
            parts.append(
                f"time to target NLL {s['target']:.4f}: AnalyticSVI "
                f"{fmt(s['ours'], '.2f', 'not reached')} s vs "
                + (f"{s['ttt'][fastest]:.2f} s ({label(fastest)}) -> speed-up "
                   f"{fmt(s['speedup_fastest'], '.1f', 'n/a')}"
                   + ("x" if s["speedup_fastest"] is not None else "")
                   if fastest else "GPflow never reached it"))
            g0 = ("augmentedgp", G0)
            if g0 in res["curves"]:
                parts.append(f"started at g mean 0 (precision 2 / noise0), AnalyticSVI ends at "
                             f"NLL {fmt(final(res, g0), '.4f')} and reaches the target in "
                             f"{fmt(s['ttt'].get(g0), '.2f', 'never')} s")
        lines.append(f"- **{name}**: " + "; ".join(parts) + ".")
    return lines


def report(args, all_res, total_s, load, vers) -> str:
    cmd = " ".join([Path(sys.executable).as_posix(), "benchmarks/heteroscedastic.py",
                    *sys.argv[1:]])
    table, notes = results_table(all_res, args.margin)
    datasets = "; ".join(
        f"{r['data'].name}: n={r['data'].n}, test {len(r['data'].y_test)}, d={r['data'].d}, "
        f"M={r['M']}, budget {r['budget']:g} s ({r['data'].split})" for r in all_res)
    step = ("Robbins-Monro (t + 1)^-0.51 (AnalyticSVI's default)" if args.agp_step == "rm"
            else f"constant {args.agp_step}")
    lines = [
        TITLE + " (`benchmarks/heteroscedastic.py`)",
        "",
        f"Run {datetime.datetime.now().isoformat(timespec='seconds')} from the repository root:",
        "",
        f"    {cmd}",
        "",
        f"Total run time {total_s / 60:.1f} min. Problems: {datasets}.",
        "",
        "**Data.** *synthetic*: x ~ U[-3, 3], y = sin(2x) + s(x) eps, eps ~ N(0, 1), with the "
        "known noise sd s(x) = 0.1 + 0.45 (1 - cos x) (0.1 at x = 0, 0.995 at x = +-3), on "
        "the raw scale (no standardisation); noise recovery measured on 201 grid points in "
        "[-3, 3]. *Real*: inputs and target standardised with the training statistics (NLL "
        "in standardised units).",
        "",
        "**Models.** augmentedgp: `SVGP([RBF, RBF], HeteroscedasticGaussian(precision), Z, "
        "mean=[Constant(mean y), Constant(logit(1 / h))])`, y ~ N(f, 1 / (precision sigmoid(g))) "
        "(thesis 7.2); GPflow: `SVGP(SeparateIndependent([SE, SE]), "
        "HeteroskedasticTFPConditional(Normal, scale_transform=Exp()), "
        "SharedIndependentInducingVariables(InducingPoints(Z)), mean_function=Constant([mean "
        "y, c_g]), num_latent_gps=2, whiten=True)`, y ~ N(f, exp(g)^2) (GPflow's "
        "heteroskedastic notebook; it uses `SeparateIndependentInducingVariables` with two "
        "copies of Z, the same model here since Z is fixed); the homoscedastic baseline: "
        "augmentedgp `SVGP(RBF, Gaussian(noise), Z, mean=Constant(mean y))`. The links "
        "differ (sigmoid precision vs exp scale): different models of the noise, compared by "
        "their predictions. Common start: both kernels variance 1 and ARD lengthscales 1 "
        "(synthetic) or sqrt(d) (real); the same plug-in noise variance "
        "noise0 = 0.1 var(y_train) at the g prior mean (augmentedgp: precision = "
        f"h / noise0 with h = {args.headroom:g}, i.e. a noise-variance floor 1 / precision = "
        "noise0 / h, and g mean logit(1 / h); GPflow: g mean c_g = log(noise0) / 2, no floor; "
        "homoscedastic: noise0). "
        + ("*AnalyticSVI, g mean 0* is the same augmentedgp fit started at h = 2 (precision "
           "2 / noise0, g mean 0), to show how much the start matters: the sigmoid link "
           "cannot go below the noise floor until Adam has raised the precision. "
           if args.headroom != 2.0 else "")
        + "Constant means, "
        "kernel and likelihood parameters trained by Adam(0.01); the same M k-means "
        "(k-means++ seeding, seed 0) inducing inputs for every library, **kept fixed**; "
        f"q(u) starting at the prior; batch {args.batch} (shuffled epochs); float64.",
        "",
        "**Configurations.** augmentedgp `fit(model, AnalyticSVI(batch))` (augmented "
        f"closed-form local and natural-parameter steps, step {step}; q(u) "
        "`natural_whitened`; jitted `lax.scan` chunks of 50) and `QuadratureSVI(batch, 0.1)` "
        "(natural step 0.1 from Gauss-Hermite sites; q(u) `whitened`); the homoscedastic "
        "baseline with `AnalyticSVI(batch)`. GPflow *NGD+Adam*: `NaturalGradient(gamma=0.1)` "
        "on (q_mu, q_sqrt) + Adam(0.01) on the rest in one `tf.function` step, as GPflow's "
        "heteroskedastic notebook (`doc/sphinx/notebooks/advanced/heteroskedastic.pct.py`: "
        "`NaturalGradient(gamma=0.1)`, `tf.optimizers.Adam(0.01)`; full batch there, "
        "minibatches here; gamma 0.01 if 0.1 fails within 100 steps); *Adam*: Adam(0.01) "
        "on everything. GPflow's variational expectations use its default 2-D Gauss-Hermite "
        "(20 x 20 points).",
        "",
        "**Measures.** *it/s*: after compilation / tracing, "
        f"{args.rounds} interleaved rounds of about {args.round_seconds:g} s per configuration "
        "from the initial state; median and best round (augmentedgp: the wall time of `fit`'s "
        "training loop; GPflow: its Python loop). *Curves*: from the common initial state "
        "until the training clock passes the budget, evaluated at the first iteration past "
        f"each of {args.eval_points} geometrically spaced times (budget / 1000 to the "
        "budget; augmentedgp: between scan chunks); evaluation time excluded. *Test NLL*: "
        "one numpy function for every library, -mean log int N(y | m_f, v_f + noise(g)) "
        f"q(g) dg with {GH_POINTS}-point Gauss-Hermite in g (exact in f) from each "
        "library's latent marginals and fitted link parameters (the libraries' own "
        "`predict_log_density` are printed as a cross-check in the log). *Noise sd* = "
        "sqrt(E_q[noise variance]): augmentedgp sqrt((1 + exp(-m_g + v_g / 2)) / precision), "
        "GPflow exp(m_g + v_g); its RMS error and correlation against the true s(x) and the "
        "RMS of log(fitted / true) on the grid; *f RMSE*: the predictive mean against "
        f"sin(2x) on the grid. *Target* = the best GPflow final test NLL + {args.margin}; "
        "*time to target* = the training time of the first evaluation after iteration 0 "
        "at or below it (resolution: the evaluation grid, a factor "
        f"{1000 ** (1 / (args.eval_points - 1)):.2f}).",
        "",
        f"**Machine.** {base.machine()}; "
        + (f"the whole process pinned to CPU {PINNED_CPU} (`os.sched_setaffinity`, before "
           "JAX starts: with 2 cores jaxlib 0.10.2's batched Cholesky of the two latents "
           "deadlocks XLA's 2-thread intra-op pool at M >= 67; with one CPU the pool has one "
           "thread), so every library, its data pipeline included, runs on one core"
           if PINNED_CPU is not None else "no CPU pinning")
        + "; load average (1 min) at start / end: "
        f"{load[0]:.2f} / {load[1]:.2f} (the VM is shared with other jobs: timings are noisy).",
        "",
        "**Versions** (checkout as imported at the start). "
        + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
    ]
    if SKIPPED:
        lines += ["**Skipped.** " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()), ""]
    lines += ["### Findings", "", *findings(all_res, args.margin), "",
              "### Results", "", table, "",
              "`(best)`: the GPflow configuration whose final NLL sets the target. `time to "
              "target / AnalyticSVI's` > 1 and `it/s AnalyticSVI / this` > 1 mean augmentedgp's "
              "AnalyticSVI is faster. Noise columns: synthetic problem only. A failed run keeps "
              "its evaluations before the failure.", "",
              *(f"- [{i}] {n}" for i, n in enumerate(notes, 1)), "",
              "Fitted noise parameters at the end of each curve: "]
    for res in all_res:
        lines += [f"- {res['data'].name}: " + "; ".join(
            f"{label(k)}: {v}" for k, v in res["fitted"].items())]
    lines += ["", "### Test NLL / RMSE at training times (iterations in brackets)", ""]
    for res in all_res:
        lines += [f"**{res['data'].name}** ({res['seconds']:.0f} s for this problem)", "",
                  curves_table(res), ""]
    return "\n".join(lines)


def dump_json(path, all_res, args):
    out = []
    for res in all_res:
        s = summarise(res, args.margin)
        out.append({"problem": res["data"].name, "budget": res["budget"], "M": res["M"],
                    "columns": ["iteration", "seconds", *METRICS],
                    "rates": {label(k): v for k, v in res["rates"].items()},
                    "notes": {label(k): v for k, v in res["notes"].items()},
                    "native_nll": {label(k): v for k, v in res["native"].items()},
                    "fitted": {label(k): v for k, v in res["fitted"].items()},
                    "curves": {label(k): c.tolist() for k, c in res["curves"].items()},
                    "summary": {k: (label(v) if isinstance(v, tuple) else v)
                                for k, v in s.items() if k != "ttt"},
                    "time_to_target": {label(k): v for k, v in s.get("ttt", {}).items()}})
    Path(path).write_text(json.dumps(out, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2000 synthetic / 3000 real training rows, budgets 6 s / 8 s, "
                        "no RESULTS.md unless --write")
    parser.add_argument("--datasets", default=None,
                        help="comma-separated: synthetic and / or one of " + ",".join(REAL)
                        + " (default synthetic,protein)")
    parser.add_argument("--n-synthetic", type=int, default=None, help="synthetic training rows")
    parser.add_argument("--n-train", type=int, default=None,
                        help="real data: subsample the training rows")
    parser.add_argument("--n-test", type=int, default=None, help="test rows (both problems)")
    parser.add_argument("--M", type=int, default=100, help="inducing points, real data")
    parser.add_argument("--M-synthetic", type=int, default=50, help="inducing points, synthetic")
    parser.add_argument("--batch", type=int, default=200, help="minibatch size")
    parser.add_argument("--budget", type=float, default=None,
                        help="training seconds per configuration, synthetic")
    parser.add_argument("--budget-real", type=float, default=None,
                        help="training seconds per configuration, real data")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds")
    parser.add_argument("--round-seconds", type=float, default=None,
                        help="approximate seconds per timing round and configuration")
    parser.add_argument("--eval-points", type=int, default=None,
                        help="evaluations per curve (geometric in time)")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="target = best GPflow final NLL + this")
    parser.add_argument("--agp-step", default="rm",
                        help="AnalyticSVI's natural-parameter step: 'rm' (its default, "
                        "Robbins-Monro (t + 1)^-0.51) or a constant in (0, 1]")
    parser.add_argument("--headroom", type=float, default=10.0,
                        help="augmentedgp's initial precision = headroom / initial noise "
                        "variance (its noise floor), the g mean starting at logit(1 / headroom) "
                        "so that the initial plug-in noise is the same (2: g mean 0)")
    parser.add_argument("--libraries", default=None,
                        help="comma-separated subset: library names or 'library scheme' labels")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for every library (0: their defaults); read at import. "
                        "1 also pins the process to one CPU (see --cpu)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="with --threads 1: the CPU to pin to (default: the last allowed)")
    parser.add_argument("--json", default=None, help="also write the raw curves to this file")
    parser.add_argument("--write", action="store_true", help="with --quick: write RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS_MD}")
    args = parser.parse_args(argv)
    defaults = ({"n_synthetic": 2000, "n_train": 3000, "n_test": 1000, "budget": 6.0,
                 "budget_real": 8.0, "rounds": 2, "round_seconds": 0.3, "eval_points": 20}
                if args.quick else
                {"n_synthetic": 4000, "n_train": 8000, "n_test": 1000, "budget": 30.0,
                 "budget_real": 45.0, "rounds": 3, "round_seconds": 1.0, "eval_points": 30})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.agp_step_schedule = None if args.agp_step == "rm" else float(args.agp_step)
    names = (args.datasets or "synthetic,protein").split(",")
    unknown = set(names) - {"synthetic", *REAL}
    if unknown:
        parser.error(f"unknown datasets: {sorted(unknown)}")
    write = (args.write or not args.quick) and not args.no_write

    for lib, why in SKIPPED.items():
        print(f"note: skipping {lib}: {why}")
    start, load0, vers = time.perf_counter(), os.getloadavg()[0], base.versions()
    all_res = []
    for name in names:
        if name == "synthetic":
            data = synthetic_data(args.n_synthetic, args.n_test)
            all_res.append(bench_problem(data, args, args.budget, args.M_synthetic))
        else:
            data = real_data(name, args.n_train, args.n_test)
            all_res.append(bench_problem(data, args, args.budget_real, args.M))
    text = report(args, all_res, time.perf_counter() - start, (load0, os.getloadavg()[0]), vers)
    print()
    print(text)
    if args.json:
        dump_json(args.json, all_res, args)
    if write:
        _write_section(text, SECTION_BEGIN, SECTION_END)
        print(f"\n(wrote {RESULTS_MD.relative_to(REPO)})")


if __name__ == "__main__":
    main()
