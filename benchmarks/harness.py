"""The benchmark harness: what the scripts in benchmarks/ share (see README.md there).

A script declares its problems and configurations; this module does the rest: ``start``
(threads, imports, peers), ``parser`` / ``parse`` (the command line), ``dataset`` (data),
``time_call`` / ``timed`` / ``race`` (timing, training curves, time to target) and
``report`` / ``finish`` (the script's section of RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_DIR = REPO.parent / "shared" / "data"
RESULTS_MD = HERE / "RESULTS.md"
sys.path.insert(0, str(REPO / "src"))  # augmentedgp from the checkout, never an installed copy

# set by start(): numpy, JAX, augmentedgp and the peers (None where skipped)
np = jax = agp = None
sklearn = torch = gpytorch = tf = tf_keras = gpflow = tfp = numpyro = None
SKIPPED: dict[str, str] = {}
PEERS: tuple[str, ...] = ()
SCRIPT, THREADS, PIN, PINNED = "", 1, "none", None
_T0, _LOAD0 = 0.0, 0.0
PEER_MODULES = {"sklearn": ("scikit-learn",), "gpytorch": ("torch", "gpytorch"),
                "gpflow": ("tensorflow", "gpflow", "tensorflow_probability"),
                "numpyro": ("numpyro",)}


# --- start: threads, imports, peers -------------------------------------------------------


def _arg(name, default):
    """``name value`` or ``name=value`` from sys.argv, read before argparse runs."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def start(script: str, *, threads: int = 1, pin: str = "none", peers=(),
          sync_dispatch: bool = False):
    """Call first, before numpy / JAX are imported. ``--threads N`` (default ``threads``;
    0: every library at its defaults) sets OpenBLAS / OpenMP / MKL, torch and TensorFlow to N
    threads and, for N = 1, XLA's CPU to single-threaded Eigen. ``pin`` (with N = 1):
    ``"process"`` pins the process to one CPU (``--cpu``, default the last allowed);
    ``"jax-client"`` creates JAX's CPU client under a one-CPU affinity (its intra-op pool
    then has one thread: jaxlib 0.10's batched LAPACK kernels can deadlock a 2-thread pool)
    and gives every thread all CPUs back. ``sync_dispatch``: JAX's CPU dispatch synchronous,
    so that compilation never overlaps execution."""
    global SCRIPT, THREADS, PIN, PINNED, PEERS, _T0, _LOAD0, np, jax, agp
    SCRIPT, PIN, PEERS = script, pin, tuple(peers)
    THREADS = int(_arg("--threads", str(threads)))
    if THREADS:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(THREADS)
    if THREADS == 1:  # only ``--`` flags: XLA stops reading XLA_FLAGS at a bare token
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    narrow = THREADS == 1 and pin != "none" and len(cpus) > 1
    if narrow:
        PINNED = int(_arg("--cpu", str(cpus[-1])))
        os.sched_setaffinity(0, {PINNED})
    import jax as _jax
    import numpy as _np

    np, jax = _np, _jax
    if sync_dispatch:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    import augmentedgp as _agp

    agp = _agp
    jax.config.update("jax_enable_x64", True)
    if narrow and pin == "jax-client":
        jax.numpy.zeros(1).block_until_ready()
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that has exited meanwhile
                os.sched_setaffinity(int(tid), set(cpus))
    for name in peers:
        _peer(name)
    for name, why in SKIPPED.items():
        print(f"note: skipping {name}: {why}", flush=True)
    _T0, _LOAD0 = time.perf_counter(), os.getloadavg()[0]


def _peer(name: str):
    """Import a peer configured as its users would (float64; the thread count above)."""
    n = THREADS or os.cpu_count() or 1
    try:
        if name == "sklearn":
            import sklearn as m

            globals()["sklearn"] = m
        elif name == "gpytorch":
            import gpytorch as g
            import torch as t

            t.set_num_threads(n)
            t.set_default_dtype(t.float64)
            globals().update(torch=t, gpytorch=g)
        elif name == "gpflow":
            import tensorflow as t

            t.config.threading.set_intra_op_parallelism_threads(n)
            t.config.threading.set_inter_op_parallelism_threads(n)
            t.get_logger().setLevel("ERROR")  # natural-gradient steps warn about their tapes
            import gpflow as g
            import tensorflow_probability as p
            from gpflow.keras import tf_keras as k

            g.config.set_default_float(np.float64)
            globals().update(tf=t, gpflow=g, tfp=p, tf_keras=k)
        elif name == "numpyro":
            import numpyro as m

            m.enable_x64()
            globals()["numpyro"] = m
        else:
            raise ValueError(f"unknown peer {name!r}")
    except ImportError as err:
        SKIPPED[name] = (f"not installed ({err.name}); the peers live in their own virtualenv, "
                         "see benchmarks/README.md")


# --- command line -------------------------------------------------------------------------


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every script has; the script adds its own."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test of about 2 minutes; RESULTS.md only with --write")
    p.add_argument("--write", action="store_true", help="with --quick: write RESULTS.md")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument("--results", default=str(RESULTS_MD),
                   help="the markdown file whose generated section is rewritten")
    p.add_argument("--out", default=None, help="also write the markdown report here")
    p.add_argument("--json", default=None, help="also write the raw numbers here")
    p.add_argument("--threads", type=int, default=THREADS,
                   help="threads for every library (0: their defaults); read at start")
    p.add_argument("--cpu", type=int, default=None, help="with --threads 1: the CPU to pin to")
    return p


def parse(p: argparse.ArgumentParser, quick: dict, full: dict, argv=None):
    """Parse, then fill the options left at None from ``quick`` or ``full``."""
    args = p.parse_args(argv)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    args.write_results = (args.write or not args.quick) and not args.no_write
    if hasattr(args, "agp_step"):
        args.agp_step_schedule = (agp.schedules.RobbinsMonro() if args.agp_step == "rm"
                                  else float(args.agp_step))
    return args


def csv(text, cast=str) -> list:
    return [cast(x) for x in str(text).split(",") if x]


RACE_OPTIONS = {
    "datasets": (str, None, "comma-separated data sets"),
    "n-train": (int, None, "subsample the training rows"),
    "n-test": (int, None, "subsample the test rows"),
    "M": (int, None, "inducing points"), "batch": (int, None, "minibatch size"),
    "rounds": (int, None, "it/s: interleaved timing rounds"),
    "round-seconds": (float, None, "it/s: seconds per round and configuration"),
    "eval-points": (int, None, "evaluations per curve (geometric in time)"),
    "margin": (float, 0.01, "target NLL = the reference's final NLL + this"),
    "libraries": (str, None, "only these library names or configuration labels"),
    "agp-step": (str, "0.1", "AnalyticSVI's natural step: a constant in (0, 1] (0.1: its "
                 "default) or 'rm' (Robbins-Monro (t + 1)^-0.51)"),
    "chunk": (int, 50, "augmentedgp's scan chunk (its curves are evaluated between chunks)")}


def race_options(p, *names, **defaults):
    """Add the options that the ``race`` scripts share (``RACE_OPTIONS``)."""
    for name in names:
        kind, default, helptext = RACE_OPTIONS[name]
        p.add_argument(f"--{name}", type=kind, default=defaults.get(name, default),
                       help=helptext)


def select(configs, args):
    """The configurations that ``--libraries`` names (all without it)."""
    wanted = csv(getattr(args, "libraries", None) or "")
    return {k: v for k, v in configs.items() if not wanted or k[0] in wanted
            or label(k) in wanted}


# --- data ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
    name: str
    X: object
    y: object
    X_test: object
    y_test: object
    split: str
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]


def arrays(name: str) -> dict:
    """A data set's arrays: ../shared/data/<name>.npz, the library's built-in ones
    (``augmentedgp.datasets``), or scikit-learn's ``digits``."""
    path = DATA_DIR / f"{name}.npz"
    if path.exists():
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    if name in agp.datasets.NAMES:
        return agp.datasets.load(name)
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        return {"X": X, "y": y}
    raise SystemExit(f"unknown data set {name!r} (not in {DATA_DIR})")


def dataset(name, split="auto", n_train=None, n_test=None, *, seed=0, test_fraction=0.1,
            scale_x=True, scale_y=False, y_dtype=float) -> Data:
    """Train / test arrays. ``split``: ``official`` (the source's X_train / X_test),
    ``published`` (split_test_mask[seed]), ``time`` (the last ``test_fraction`` of the
    rows), ``random`` (a seeded permutation), ``slice`` (a seeded permutation's first
    n_train rows and next n_test), ``auto`` (the first of official, published, random that
    the file has). Then n_train / n_test random rows (seeded), X standardised with the
    training statistics (zero sd -> 1) and, with ``scale_y``, y too."""
    f = arrays(name)
    if split == "auto":
        split = ("official" if "X_train" in f else "published" if "split_test_mask" in f
                 else "random")
    rng = np.random.default_rng(seed)
    if split == "official":
        X, y, Xt, yt = f["X_train"], f["y_train"], f["X_test"], f["y_test"]
        desc = "official train/test split"
    elif split == "published":
        test = f["split_test_mask"][seed]
        X, y, Xt, yt = f["X"][~test], f["y"][~test], f["X"][test], f["y"][test]
        desc = f"published split {seed} (90/10)"
    elif split == "time":
        cut = int(round((1 - test_fraction) * len(f["y"])))
        X, y, Xt, yt = f["X"][:cut], f["y"][:cut], f["X"][cut:], f["y"][cut:]
        desc = f"time-ordered: first {1 - test_fraction:.0%} of rows train, the rest test"
    elif split in ("random", "slice"):
        if "X" not in f:  # an official split: draw from its training rows
            f = {"X": f["X_train"], "y": f["y_train"]}
        perm = rng.permutation(len(f["y"]))
        if split == "slice":
            te, tr = perm[n_train:n_train + (n_test or 0)], perm[:n_train]
            desc = f"a random slice (seed {seed})"
        else:
            cut = int(round(test_fraction * len(perm)))
            te, tr = perm[:cut], perm[cut:]
            desc = f"random {1 - test_fraction:.0%}/{test_fraction:.0%} split (seed {seed})"
        X, y, Xt, yt = f["X"][tr], f["y"][tr], f["X"][te], f["y"][te]
    else:
        raise ValueError(split)
    if n_train and n_train < X.shape[0]:
        idx = rng.choice(X.shape[0], n_train, replace=False)
        X, y = X[idx], y[idx]
        desc += f", {n_train} training rows drawn at random"
    if n_test and n_test < Xt.shape[0]:
        idx = rng.choice(Xt.shape[0], n_test, replace=False)
        Xt, yt = Xt[idx], yt[idx]
    X, Xt = np.asarray(X, float), np.asarray(Xt, float)
    y, yt = np.asarray(y, y_dtype), np.asarray(yt, y_dtype)
    if scale_x:
        mx, sx = X.mean(0), X.std(0)
        sx[sx == 0] = 1.0
        X, Xt = (X - mx) / sx, (Xt - mx) / sx
    if scale_y:
        my, sy = y.mean(), y.std()
        y, yt = (y - my) / sy, (yt - my) / sy
    return Data(name, X, y, Xt, yt, desc)


# --- timing -------------------------------------------------------------------------------


def time_call(run, repeats: int, budget_s: float) -> dict:
    """The first call (tracing / compilation included), then up to ``repeats`` timed calls
    (fewer when they pass ``budget_s`` in all, but at least 2): their median and minimum."""
    t0 = time.perf_counter()
    value = run()
    first = time.perf_counter() - t0
    times = []
    while len(times) < repeats and (len(times) < 2 or sum(times) < budget_s):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"first": first, "median": float(np.median(times)), "min": float(np.min(times)),
            "value": value, "repeats": len(times)}


class CompileClock:
    """Wall seconds JAX spends tracing, lowering and compiling, from its monitoring events
    (the union of their spans: nested traces count once), and the programs compiled."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")
    _clock = None

    def __init__(self):
        self.spans, self.compiled = [], []
        jax.monitoring.register_event_time_span_listener(self._record)

    @classmethod
    def get(cls) -> CompileClock:
        if cls._clock is None:
            cls._clock = cls()
        return cls._clock

    def _record(self, event, start_time, end_time, **kwargs):
        if event in self.EVENTS:
            self.spans.append((start_time, end_time))
        if event == self.EVENTS[-1]:
            self.compiled.append((end_time, end_time - start_time, str(kwargs.get("fun_name"))))

    def programs_since(self, t0: float, min_seconds: float = 0.5) -> list[str]:
        return [name for end, secs, name in self.compiled if end >= t0 and secs >= min_seconds]

    def seconds_since(self, t0: float) -> float:
        total, end = 0.0, -math.inf
        for a, b in sorted(s for s in self.spans if s[1] >= t0):
            a = max(a, t0, end)
            if b > a:
                total, end = total + b - a, b
        return total


@contextlib.contextmanager
def timed():
    """Wall (``wall``) and process (``cpu``) seconds of the block, the wall seconds JAX
    spent compiling in it (``compile``) and the programs it compiled (``programs``)."""
    clock, rec = CompileClock.get(), {}
    t0, w0, c0 = time.time(), time.perf_counter(), time.process_time()
    yield rec
    rec.update(wall=time.perf_counter() - w0, cpu=time.process_time() - c0,
               compile=clock.seconds_since(t0), programs=clock.programs_since(t0))


# --- race: training curves against a common target ---------------------------------------
#
# A runner trains one configuration. warmup(score, n) compiles / traces, keeps the scoring
# function, leaves the initial state and returns the runner; time_steps(n) trains n
# iterations from the initial state and returns the seconds; train(schedule, on_eval) trains
# from the initial state, calling on_eval(iteration, training seconds) -- not counted; True
# stops -- when the schedule says so, and returns None or why it stopped early;
# prediction() is the script's predict(runner) at the current state.


class Diverged(Exception):
    pass


def describe(err: Exception) -> str:
    """The exception's type and its most telling line (TensorFlow's first line is generic)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [""]
    line = next((ln for ln in lines if any(w in ln.lower() for w in ("nan", "inf", "positive"))),
                lines[0])
    return f"{type(err).__name__}: {line if len(line) <= 110 else line[:110] + '...'}"


class Schedule:
    """When a curve is evaluated: at the first iteration past each of ``times`` (training
    seconds; the last one is the budget), or every ``every`` iterations up to ``total``."""

    def __init__(self, times=None, every=None, total=10**9):
        self.times, self.every, self.max_iter = times, every, total

    def start(self):
        self.k = 0

    def due(self, it, clock):
        return it % self.every == 0 if self.every else clock >= self.times[self.k]

    def done(self, it, clock):
        if self.every:
            return it >= self.max_iter
        while self.k < len(self.times) and self.times[self.k] <= clock:
            self.k += 1
        return self.k == len(self.times)


def geometric(budget, points, ratio=1000.0) -> Schedule:
    """Evaluations at ``points`` times from budget / ratio to the budget, geometrically."""
    return Schedule(list(np.geomspace(budget / ratio, budget, points)))


class Runner:
    lib = ""

    def prediction(self):
        return self.predict(self)

    def check(self, score, n):
        if not np.isfinite(score(self.prediction())[0]):
            raise Diverged(f"non-finite test NLL after {n} warm-up iterations")


class AgpRunner(Runner):
    """augmentedgp: ``agp.fit`` from the initial model, its callback between scan chunks."""

    lib = "augmentedgp"

    def __init__(self, data, model, inference, *, predict, lr=0.01, chunk=50):
        self.data, self.model0, self.model, self.inference = data, model, model, inference
        self.predict, self.lr, self.chunk, self.calls = predict, lr, chunk, 0
        # objective="tight" splits max_iter between its stages: a time budget is given to it
        # as the iterations that fit in it at the measured rate, as a user would set max_iter
        self.staged = getattr(inference, "objective", None) == "tight"

    def _fit(self, n, callback=None):
        self.calls += 1  # a new minibatch key per call
        return agp.fit(self.model0, self.data.X, self.data.y, self.inference, max_iter=n,
                       learning_rate=self.lr, tol=0.0, chunk_size=self.chunk,
                       callback=callback, key=jax.random.key(self.calls))

    def warmup(self, score, n=None):
        self.score = score
        post = self._fit(self.chunk)  # compiles the scan chunk
        if post.history.n_iter < self.chunk:
            raise Diverged(post.history.message)
        if self.staged:  # iterations per second over both stages, once both are compiled
            self.time_steps(4 * self.chunk)
            self.rate = 4 * self.chunk / self.time_steps(4 * self.chunk)
        self.model = post.model
        self.check(score, self.chunk)  # compiles the prediction and the scoring
        self.model = self.model0
        return self

    def time_steps(self, n):
        post = self._fit(n)
        if post.history.n_iter < n:  # fit stops at a non-finite objective
            raise Diverged(post.history.message)
        return float(post.history.wall_time[-1])  # the training loop, not fit's setup

    def train(self, schedule, on_eval):
        self.model = self.model0
        if on_eval(0, 0.0):
            return "non-finite test NLL at the start"
        schedule.start()
        st = {"t0": time.perf_counter(), "paused": 0.0, "stop": None, "last": 0}

        def callback(it, objective, model):
            t = time.perf_counter()
            clock = t - st["t0"] - st["paused"]
            if not schedule.due(it, clock):
                return False
            self.model, st["last"] = model, it
            stop = on_eval(it, clock)
            done = schedule.done(it, clock)
            st["paused"] += time.perf_counter() - t
            if stop:
                st["stop"] = f"non-finite test NLL at iteration {it}"
            return bool(stop) or done

        # (whole chunks in both stages: a shorter last chunk would compile inside the clock)
        max_iter = (max(1, int(self.rate * schedule.times[-1]) // (2 * self.chunk)) * 2
                    * self.chunk if self.staged and schedule.times else schedule.max_iter)
        post = self._fit(max_iter, callback)
        if st["stop"] or post.history.status == "callback":
            return st["stop"]
        self.model = post.model
        if st["last"] != post.history.n_iter:
            on_eval(post.history.n_iter, time.perf_counter() - st["t0"] - st["paused"])
        return None if post.history.n_iter == max_iter else post.history.message


class StepRunner(Runner):
    """Peers: a Python loop over one compiled / eager step per iteration."""

    def warmup(self, score, n=5):
        self.score = score
        try:
            for _ in range(n):
                self.step()
            self.check(score, n)
        finally:
            self.restore(self.initial)
        return self

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

    def train(self, schedule, on_eval):
        self.restore(self.initial)
        if on_eval(0, 0.0):
            return "non-finite test NLL at the start"
        schedule.start()
        clock, it = 0.0, 0
        t0 = time.perf_counter()
        while True:
            try:
                self.step()
            except Exception as err:
                on_eval(it, clock + time.perf_counter() - t0)  # the state before the failure
                return f"failed at iteration {it + 1}: {describe(err)}"
            it += 1
            now = time.perf_counter()
            if schedule.due(it, clock + now - t0):
                clock += now - t0
                if on_eval(it, clock):
                    return f"non-finite test NLL at iteration {it}"
                if schedule.done(it, clock):
                    return None
                t0 = time.perf_counter()


GPFLOW_NGD = ((0.1, "XiNat"), (0.01, "XiSqrtMeanVar"), (0.01, "XiNat"))


class GpflowRunner(StepRunner):
    """A GPflow model trained as its notebooks do: ``tf.data`` shuffled minibatches, one
    ``tf.function`` step; *NGD+Adam*: ``NaturalGradient(gamma)`` on (q_mu, q_sqrt) and Adam
    on the rest from the same batch; *Adam*: Adam on everything."""

    lib = "gpflow"

    def __init__(self, data, model, scheme, *, predict, batch=100, lr=0.01,
                 ngd=GPFLOW_NGD[0], seed=0):
        from gpflow.optimizers.natgrad import XiNat, XiSqrtMeanVar

        self.data, self.model, self.scheme, self.predict, self.ngd = data, model, scheme, \
            predict, ngd
        m = model
        ds = tf.data.Dataset.from_tensor_slices((data.X, data.y[:, None]))
        batches = iter(ds.repeat().shuffle(data.n, seed=seed).batch(batch))
        self.adam = tf_keras.optimizers.Adam(lr)
        if scheme.startswith("NGD"):
            gpflow.set_trainable(m.q_mu, False)
            gpflow.set_trainable(m.q_sqrt, False)
            natgrad = gpflow.optimizers.NaturalGradient(gamma=ngd[0])
            xi = XiNat() if ngd[1] == "XiNat" else XiSqrtMeanVar()

            @tf.function
            def step():
                batch = next(batches)
                loss = lambda: m.training_loss(batch)
                natgrad.minimize(loss, [(m.q_mu, m.q_sqrt, xi)])
                self.adam.minimize(loss, m.trainable_variables)
        else:
            @tf.function
            def step():
                batch = next(batches)
                self.adam.minimize(lambda: m.training_loss(batch), m.trainable_variables)

        self.step = step
        self.adam.build(m.trainable_variables)
        self.initial = self.snapshot()

    def _variables(self):
        return list(self.model.variables) + list(self.adam.variables)

    def snapshot(self):
        return [v.numpy() for v in self._variables()]

    def restore(self, state):
        for v, value in zip(self._variables(), state, strict=True):
            v.assign(value)


def gpflow_build(make, score, notes, key, check_steps=100, n=5, options=GPFLOW_NGD):
    """A warmed-up GPflow runner ``make(ngd)`` for configuration ``key``. NGD+Adam: gamma 0.1
    (the notebook's, for minibatches and non-conjugate likelihoods); if that fails within
    ``check_steps`` steps, the next of ``options`` (gamma, xi), with a note."""
    if "NGD" not in key[-1]:
        return make(options[0]).warmup(score, n)
    failures = []
    for ngd in options:
        r = make(ngd)
        try:
            r.warmup(score, check_steps)
        except Exception as err:
            failures.append(f"gamma {ngd[0]} with {ngd[1]} failed within {check_steps} steps "
                            f"({describe(err)})")
            continue
        if failures:
            notes[key] = "; ".join(failures) + f"; using gamma {ngd[0]} with {ngd[1]}"
        return r
    raise Diverged("; ".join(failures))


def gpflow_svgp(Z, lengthscale, likelihood, n, *, variance=1.0, mean=None, learn_Z=True,
                num_latent_gps=None):
    """GPflow SVGP, whitened, ARD squared-exponential kernel."""
    kernel = gpflow.kernels.SquaredExponential(variance=variance, lengthscales=lengthscale.copy())
    kw = {} if num_latent_gps is None else {"num_latent_gps": num_latent_gps}
    m = gpflow.models.SVGP(kernel, likelihood, inducing_variable=Z.copy(), mean_function=mean,
                           num_data=n, whiten=True, **kw)
    if not learn_Z:
        gpflow.set_trainable(m.inducing_variable, False)
    return m


def gpytorch_svgp(Z, lengthscale, *, variance=1.0, natural=False, learn_Z=True, tasks=None):
    """GPyTorch ApproximateGP: zero mean, ScaleKernel(ARD RBF), q(u) Cholesky or natural;
    ``tasks``: one q(u) per task (batch [tasks]) under IndependentMultitaskVariationalStrategy
    with the kernel shared (its multitask SVGP recipe)."""
    V = gpytorch.variational
    shape = torch.Size([tasks] if tasks else [])
    q = (V.NaturalVariationalDistribution if natural else
         V.CholeskyVariationalDistribution)(Z.shape[0], batch_shape=shape)

    class SVGPModel(gpytorch.models.ApproximateGP):
        def __init__(self):
            s = V.VariationalStrategy(self, torch.tensor(Z), q, learn_inducing_locations=learn_Z)
            super().__init__(V.IndependentMultitaskVariationalStrategy(s, num_tasks=tasks)
                             if tasks else s)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    model = SVGPModel()
    model.covar_module.outputscale = variance
    model.covar_module.base_kernel.lengthscale = torch.tensor(lengthscale[None, :])
    return model


class GpytorchRunner(StepRunner):
    """GPyTorch as its examples train: ``DataLoader(shuffle=True)``, VariationalELBO;
    *NGD+Adam*: natural q(u), ``NGD`` on it and Adam on the hyperparameters from one backward
    pass; *Adam*: Adam on everything."""

    lib = "gpytorch"

    def __init__(self, data, model, likelihood, scheme, *, predict, batch=100, lr=0.01,
                 ngd=0.1, seed=0):
        torch.manual_seed(seed)
        self.data, self.model, self.likelihood, self.scheme = data, model, likelihood, scheme
        self.predict = predict
        self.mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=data.n)
        if scheme.startswith("NGD"):
            self.optimizers = [
                gpytorch.optim.NGD(model.variational_parameters(), num_data=data.n, lr=ngd),
                torch.optim.Adam([{"params": model.hyperparameters()},
                                  {"params": likelihood.parameters()}], lr=lr)]
        else:
            self.optimizers = [torch.optim.Adam([{"params": model.parameters()},
                                                 {"params": likelihood.parameters()}], lr=lr)]
        self.loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.tensor(data.X), torch.tensor(data.y)),
            batch_size=batch, shuffle=True, drop_last=True,
            generator=torch.Generator().manual_seed(seed))
        self.batches = iter(self.loader)
        model.train()
        likelihood.train()
        self.initial = self.snapshot()

    def step(self):
        try:
            xb, yb = next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            xb, yb = next(self.batches)
        for opt in self.optimizers:
            opt.zero_grad()
        (-self.mll(self.model(xb), yb)).backward()
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

    def latent(self, X):
        """The latent predictive mean and variance at X (blocks of 2048 rows)."""
        self.model.eval()
        means, variances = [], []
        with torch.no_grad():
            for Xb in np.array_split(X, max(1, len(X) // 2048)):
                f = self.model(torch.tensor(Xb))
                means.append(f.mean.numpy())
                variances.append(f.variance.numpy())
        self.model.train()
        return np.concatenate(means), np.concatenate(variances)


def label(key) -> str:
    return " ".join(key)


def race(name, data, configs, schedule, *, rounds, round_seconds=None,
         round_steps=None, units=None, after=None, **extra) -> dict:
    """Run every configuration of one problem side by side.

    ``configs``: {key: build(notes) -> a runner warmed up with its ``score(prediction)`` ->
    the metrics tuple (test NLL first)}; ``schedule``: when to evaluate. it/s: ``rounds``
    interleaved rounds of ``round_steps`` iterations, or of about ``round_seconds`` (the
    count fixed per configuration from a first timed run of ``units(key)`` x 2 iterations).
    ``after``: {name: fn(key, runner)} taken at the end of each curve (a cross-check: its
    failure is printed and recorded as None)."""
    t_start, w = time.perf_counter(), max(len(label(k)) for k in configs) if configs else 0
    print(f"== {name}: n={data.n} test={len(data.y_test)} d={data.d} "
          + " ".join(f"{k}={v}" for k, v in extra.items() if isinstance(v, int | float)),
          flush=True)
    runners, notes, build_s = {}, {}, {}
    for key, build in configs.items():
        t0 = time.perf_counter()
        try:
            runners[key] = build(notes)
        except Exception as err:
            why = err if isinstance(err, Diverged) else describe(err)
            notes[key] = f"build / warm-up failed: {why}"
        build_s[key] = time.perf_counter() - t0
        print(f"  {label(key):{w}s} build + warm-up {build_s[key]:6.1f} s {notes.get(key, '')}",
              flush=True)
    steps = {}
    for key, r in runners.items():
        if round_steps:
            steps[key] = round_steps
            continue
        unit = units(key)
        try:
            rate = 2 * unit / r.time_steps(2 * unit)
        except Diverged as err:
            notes[key] = f"no it/s: {err}"
            continue
        steps[key] = max(unit, int(rate * round_seconds) // unit * unit)
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k in list(times):
            try:
                times[k].append(runners[k].time_steps(steps[k]))
            except Diverged as err:
                notes[k] = f"no it/s: a step failed in the timing rounds ({err})"
                del times[k]
    rates = {k: {"median": steps[k] / float(np.median(v)), "best": steps[k] / float(np.min(v)),
                 "steps": steps[k]} for k, v in times.items()}
    for k, v in rates.items():
        print(f"  {label(k):{w}s} {v['median']:9.2f} it/s (median of {rounds} rounds of "
              f"{v['steps']}; best {v['best']:.2f})", flush=True)
    res = {"name": name, "data": data, "rates": rates, "curves": {}, "failed": set(),
           "notes": notes, "build_s": build_s, "eval_s": {}, **extra}
    for a in after or {}:
        res[a] = {}
    for k, r in runners.items():
        curve, spent = [], [0.0]

        def on_eval(it, seconds, r=r, curve=curve, spent=spent):
            t = time.perf_counter()
            m = r.score(r.prediction())
            curve.append((it, seconds, *m))
            spent[0] += time.perf_counter() - t
            return not np.isfinite(m[0])

        t0 = time.perf_counter()
        why = r.train(schedule, on_eval)
        if why is not None:
            res["failed"].add(k)
            notes[k] = f"{notes[k]}; curve: {why}" if k in notes else f"curve: {why}"
        res["curves"][k], res["eval_s"][k] = np.array(curve), spent[0]
        for a, fn in (after or {}).items():
            try:
                res[a][k] = fn(k, r)
            except Exception as err:  # a cross-check only
                res[a][k] = None
                print(f"  {label(k)}: {a} failed: {describe(err)}", flush=True)
        last = curve[-1]
        print(f"  {label(k):{w}s} {int(last[0]):7d} it in {last[1]:6.1f} s: "
              + ", ".join(f"{x:.4f}" for x in last[2:])
              + "".join(f"; {a} {res[a][k]}" for a in after or {})
              + f" ({time.perf_counter() - t0:.0f} s with evaluations) {why or ''}", flush=True)
    res["seconds"] = time.perf_counter() - t_start
    return res


def time_to(curve, target, skip_start=True):
    """Training seconds of the first evaluation (after iteration 0) at or below target."""
    if target is None or not len(curve):
        return None
    hit = np.flatnonzero((curve[:, 2] <= target) & ((curve[:, 0] > 0) | (not skip_start)))
    return float(curve[hit[0], 1]) if hit.size else None


def final(res, key, col=2):
    c = res["curves"].get(key)
    if c is None or not len(c) or not np.isfinite(c[-1, col]):
        return None
    return float(c[-1, col])


def summarise(res, ours, reference, margin) -> dict:
    """Target = the lowest final NLL of the ``reference`` configurations + margin; the time
    of every configuration to it; the reference that reached it first; ``ours``'s speed-ups
    against that one and against the best."""
    ref = [k for k in reference if final(res, k) is not None]
    if not ref:
        return {"best": None}
    best = min(ref, key=lambda k: final(res, k))
    target = final(res, best) + margin
    ttt = {k: time_to(c, target) for k, c in res["curves"].items()}
    o = ttt.get(ours)
    reached = [k for k in ref if ttt.get(k) is not None]
    fastest = min(reached, key=lambda k: ttt[k]) if reached else None
    return {"best": best, "target": target, "ttt": ttt, "fastest": fastest, "ours": o,
            "speedup_fastest": ratio(ttt[fastest], o) if fastest else None,
            "speedup_best": ratio(ttt.get(best), o)}


def config_table(all_res, header, cells) -> list[str]:
    """One row per (problem, configuration): ``cells(res, key, curve)`` after the problem and
    the configuration (marked ``(best)`` where it sets the target, with a footnote where it
    has a note); a configuration that never ran gets dashes."""
    rows, notes = [], []
    for res in all_res:
        best = res.get("summary", {}).get("best")
        for key in [*res["curves"], *(k for k in res["notes"] if k not in res["curves"])]:
            mark = " (best)" if key == best else ""
            if key in res["notes"]:
                notes.append(f"{res['name']} {label(key)}: {res['notes'][key]}")
                mark += f" [{len(notes)}]"
            c = res["curves"].get(key)
            rows.append([res["name"], label(key) + mark] + (
                cells(res, key, c) if c is not None and len(c) else ["—"] * (len(header) - 2)))
    return [markdown_table(header, rows), "", *(f"- [{i}] {n}" for i, n in enumerate(notes, 1))]


def race_table(all_res, ours, metrics, extra=None) -> list[str]:
    """``config_table`` with the standard columns: it/s (median, best, ours / this),
    iterations, the final ``metrics`` ({curve column: name}; column 2, the NLL, marks a failed
    run), target NLL, time to target and its ratio to ``ours``'s; ``extra``: {name:
    fn(res, key)} columns at the end."""
    extra = extra or {}

    def cells(res, key, c):
        s, rate, o = res.get("summary", {}), res["rates"].get(key, {}), key == ours
        t, ours_rate = s.get("ttt", {}).get(key), res["rates"].get(ours, {}).get("median")
        return [fmt(rate.get("median"), ".1f"), fmt(rate.get("best"), ".1f"),
                "" if o else fmt(ratio(ours_rate, rate.get("median")), ".2f"), int(c[-1, 0]),
                *(fmt(float(c[-1, i]), ".4f") + (" (failed)" if i == 2 and key in res["failed"]
                                                 else "") for i in metrics),
                fmt(s.get("target"), ".4f"), fmt(t, ".2f", "not reached"),
                "" if o else fmt(ratio(t, s.get("ours")), ".1f",
                                 f"{ours[-1]} never reached" if t is not None else "—"),
                *(f(res, key) for f in extra.values())]

    header = ["problem", "configuration", "it/s (median)", "it/s (best)",
              f"{ours[-1]} it/s / this", "iterations", *metrics.values(), "target NLL",
              "time to target (s)", f"time to target / {ours[-1]}'s", *extra]
    return config_table(all_res, header, cells)


def speedup(s) -> str:
    """'time to target a s vs b s (configuration) -> speed-up x' from ``summarise``."""
    sec = lambda t: "not reached" if t is None else f"{t:.2f} s"
    x = lambda q: "n/a" if q is None else f"{q:.1f}x"
    if s.get("fastest") is None:
        return f"time to target {sec(s.get('ours'))}; no reference configuration reached it"
    return (f"time to target {sec(s['ours'])} vs {sec(s['ttt'][s['fastest']])} "
            f"({label(s['fastest'])}) -> speed-up {x(s['speedup_fastest'])} (against the best, "
            f"{label(s['best'])}: {x(s['speedup_best'])})")


def speedup_claim(res, ours, margin, factor=10.0) -> str:
    """'- problem: best reference, ours's final NLL, time to target -> **met** / **not met**'
    for the claim 'ours reaches the target >= factor x faster than the reference that
    reached it first, at equal or better final NLL' (when no reference reached it within
    the budget, the speed-up is at least budget / ours's time)."""
    s = res["summary"]
    if s["best"] is None:
        return f"- {res['name']}: no reference result; not assessed."
    o, b, sp = final(res, ours), final(res, s["best"]), s["speedup_fastest"]
    equal, why = o is not None and o <= b + margin, speedup(s)
    if s["ours"] is not None and s["fastest"] is None:
        sp = res["budget"] / s["ours"]
        why += f", so the speed-up is > budget / {s['ours']:.2f} s = {sp:.1f}x at least"
    return (f"- {res['name']}: best reference {label(s['best'])} (final NLL {b:.4f}); "
            f"{ours[-1]} final NLL {fmt(o, '.4f')} ({'equal or better' if equal else 'worse'});"
            f" {why} -> **" + ("met" if equal and sp is not None and sp >= factor else "not met")
            + "**.")


def race_measures(args, grid_ratio, target) -> str:
    """The report's paragraph on how ``race`` measured (``target``: what sets it)."""
    return (f"**Measures.** *it/s*: {args.rounds} interleaved rounds of about "
            f"{args.round_seconds:g} s per configuration from the initial state (after "
            "compilation / tracing; augmentedgp: `fit`'s training loop, peers: their Python "
            "loop), median and best round. *Curves*: from the common initial state until the "
            "training clock passes the budget, evaluated at the first iteration past each of "
            f"{args.eval_points} geometric times (budget / {grid_ratio:g} to the budget; "
            "augmentedgp: between scan chunks), evaluations excluded from the clock. *Target* "
            f"= {target} + {args.margin}; *time to target* = the training time of the first "
            "evaluation after iteration 0 at or below it.")


def curves_section(all_res) -> list[str]:
    """Per problem: its seconds (build + warm-up, evaluations) and its ``curves_table``."""
    return [x for res in all_res for x in (
        f"**{res['name']}** ({res['seconds']:.0f} s for this problem, of which "
        f"{sum(res['build_s'].values()):.0f} s build + warm-up and "
        f"{sum(res['eval_s'].values()):.0f} s evaluations)", "",
        curves_table(res, res.get("budget")), "")]


def curves_table(res, budget=None) -> str:
    """Metrics 2 and 3 of each curve at training times 0.1, 0.3, 1, ... s below the budget
    (the last evaluation at or before each) and at the end; without a budget, at every
    evaluation (NLL and seconds)."""
    keys = list(res["curves"])
    rows = []
    if budget is None:
        longest = max(res["curves"].values(), key=len)
        for i, it in enumerate(longest[:, 0]):
            rows.append([int(it)] + [f"{c[i, 2]:.4f} ({c[i, 1]:.1f} s)" if i < len(c) else "—"
                                     for c in (res["curves"][k] for k in keys)])
        return markdown_table(["iteration"] + [label(k) for k in keys], rows)
    for t in [t for t in (0.1, 0.3, 1, 3, 10, 30, 100, 300) if t < budget] + [None]:
        row = [f"{budget:g} (final)" if t is None else f"{t:g}"]
        for k in keys:
            c = res["curves"][k]
            i = (np.arange(len(c)) if t is None else np.flatnonzero(c[:, 1] <= t * (1 + 1e-9))
                 ) if len(c) else np.array([])
            row.append("—" if not i.size else f"{c[i[-1], 2]:.4f} / {c[i[-1], 3]:.4f} "
                       f"({int(c[i[-1], 0])} it)")
        rows.append(row)
    return markdown_table(["training s"] + [label(k) for k in keys], rows)


# --- reporting ----------------------------------------------------------------------------


def markdown_table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def fmt(x, spec=".4f", missing="—"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def checkout() -> str:
    """' (checkout abc1234[, src/ modified])', or '' outside a git checkout."""
    try:
        git = ["git", "-C", str(REPO)]
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "src"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" (checkout {commit}{', src/ modified' if dirty else ''})"


def cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def versions(*modules) -> dict[str, str]:
    """Python, augmentedgp (and the checkout), JAX, numpy, the peers asked for in start()
    and ``modules``."""
    import equinox
    import jaxlib

    out = {"python": platform.python_version(), "augmentedgp": agp.__version__ + checkout(),
           "jax": jax.__version__, "jaxlib": jaxlib.__version__,
           "equinox": equinox.__version__, "numpy": np.__version__}
    for name in [m for p in PEERS for m in PEER_MODULES[p]] + list(modules):
        mod = sys.modules.get("sklearn" if name == "scikit-learn" else name)
        out[name] = getattr(mod, "__version__", "?") if mod else "not installed"
    return out


def machine() -> str:
    threads = ("OMP/OPENBLAS/MKL_NUM_THREADS=1, XLA CPU single-threaded "
               "(`--xla_cpu_multi_thread_eigen=false`)" if THREADS == 1 else
               f"OMP/OPENBLAS/MKL_NUM_THREADS={THREADS}" if THREADS else
               "XLA and OpenBLAS at their defaults (all cores)")
    if PEERS:
        threads += f", torch / TensorFlow {THREADS or os.cpu_count()} threads"
    pin = ("" if PINNED is None else
           f"; the process pinned to CPU {PINNED} (`os.sched_setaffinity`)" if PIN == "process"
           else "; JAX's CPU client created under a one-CPU affinity (an intra-op pool of one "
           "thread: jaxlib 0.10's batched LAPACK kernels can deadlock a 2-thread pool), every "
           "thread's affinity then restored")
    try:  # the BLAS / OpenMP pools as threadpoolctl sees them
        from threadpoolctl import threadpool_info

        pin += "; pools: " + ", ".join(sorted({f"{p['internal_api']} ({p['num_threads']})"
                                               for p in threadpool_info()}))
    except ImportError:
        pass
    return (f"nproc: {os.cpu_count()}; CPU: {cpu_model()}; platform: {platform.platform()}; "
            f"threads (--threads {THREADS}): {threads}{pin}")


def report(title: str, intro: list[str], body: list[str], vers: dict | None = None) -> str:
    """The section: title, command, run time, ``intro``, machine, versions, skipped peers,
    ``body``."""
    cmd = " ".join([Path(sys.executable).as_posix(), f"benchmarks/{SCRIPT}", *sys.argv[1:]])
    vers = vers or versions()
    lines = [f"## {title} (`benchmarks/{SCRIPT}`)", "",
             f"Run {datetime.datetime.now().isoformat(timespec='seconds')} from the repository "
             "root:", "", f"    {cmd}", "",
             f"Total run time {(time.perf_counter() - _T0) / 60:.1f} min. " + intro[0],
             *intro[1:], "",
             f"**Machine.** {machine()}; load average (1 min) at start / end: {_LOAD0:.2f} / "
             f"{os.getloadavg()[0]:.2f} (the VM is shared with other jobs: timings are noisy; "
             "read the ratios between runs side by side).", "",
             "**Versions.** " + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".", ""]
    if SKIPPED:
        lines += ["**Skipped.** " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()), ""]
    return "\n".join(lines + body).rstrip() + "\n"


def jsonable(x):
    if isinstance(x, dict):
        return {(label(map(str, k)) if isinstance(k, tuple) else str(k)): jsonable(v)
                for k, v in x.items()}
    if isinstance(x, list | tuple | set):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return x.tolist()
    return x if isinstance(x, str | int | float | bool | type(None)) else str(x)


def finish(args, text: str, raw=None, section: str = "") -> None:
    """Print the report; write ``--out`` and ``--json``; rewrite the script's section of
    ``--results`` (RESULTS.md) unless told not to."""
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json and raw is not None:
        Path(args.json).write_text(json.dumps(jsonable(raw), indent=1))
    if args.write_results:
        name = SCRIPT + (f", {section}" if section else "")
        write_section(text, f"<!-- BEGIN {name} (generated, overwritten on each run) -->",
                      f"<!-- END {name} -->", Path(args.results))
        print(f"(wrote the section '{name}' of {args.results})")
    print(f"Total wall time {time.perf_counter() - _T0:.0f} s", flush=True)


def write_section(text: str, begin: str, end: str, path: Path = RESULTS_MD) -> None:
    """Replace the text between the ``begin`` and ``end`` markers of ``path`` (or append)."""
    section = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + section + ("\n" + tail if tail.strip() else "")
    else:
        new = old.rstrip() + "\n\n" + section
    path.write_text(new)
