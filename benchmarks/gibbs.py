"""Gibbs-sampling benchmark (thesis ch. 5.1, Table 2): augmentedgp's augmented blocked Gibbs
sampler against numpyro NUTS and a random-walk Metropolis baseline, on full GPs.

Four problems, all in one process, each with hyperparameters fitted once and then frozen
(every sampler targets the same posterior of the n latent values f = f(X)):

- *Logistic*: a fixed random 300-row slice (seed 0) of a9a's training set (the size of the
  thesis' Heart set, n = 303), labels +-1, isotropic RBF kernel fitted by Laplace ML-II;
- *Student-t* (df 4), *Laplace*, *Matern 3/2*: Boston housing (n = 506, 13 features), X and
  y standardised, ARD RBF kernel from a Gaussian GP's ML-II; each likelihood's scale is set
  so that its noise variance equals the Gaussian's fitted noise variance.

Samplers (float64, 4 chains, every chain started from its own draw):

- augmentedgp ``sample(MCGP(kernel, likelihood), X, y, GibbsSampling(S, n_chains=4,
  burn_in=B))`` (Polya-Gamma / gamma / inverse-Gaussian / GIG auxiliary draws, then
  f | w by one n x n Cholesky per sweep); called twice with the same settings, the second
  call (compiled) is the one timed and measured;
- numpyro ``NUTS`` on the whitened latent v ~ N(0, I_n), f = L v (L = chol(K), the same
  factor as the Gibbs sampler's, computed once outside the model): numpyro's defaults
  (target acceptance 0.8, diagonal mass matrix, max tree depth 10), ``num_warmup`` and
  ``num_samples`` per chain, chains run one after the other (``chain_method="sequential"``);
- random-walk Metropolis on the same whitened target, written here in JAX (``lax.scan``,
  chains ``vmap``-ed: the target has only a matvec with the fixed L, no factorisation):
  proposals v' = v + s e, e ~ N(0, I), the scalar s adapted during warm-up by Robbins-Monro
  on log s towards 0.234 acceptance (Roberts, Gelman & Gilks 1997), then fixed; ``thin``
  times more iterations than kept samples.

Measured for each (problem, sampler), on f (the n latent values) and with one estimator for
every sampler (``augmentedgp.diagnostics``): wall and process time, compile time apart
(JAX's own tracing / lowering / compile events), time per kept sample, median lag-1
autocorrelation, max rank-normalised split R-hat, min / median bulk ESS, min ESS per second
of the whole run (warm-up / burn-in included, compilation not), and agreement with NUTS:
max |mean - mean_NUTS| / sd_NUTS and max |z| with z = (mean - mean_NUTS) / sqrt(mcse^2 +
mcse_NUTS^2), mcse = sd / sqrt(bulk ESS).

Run from the repository root, with the peers' virtualenv (see benchmarks/README.md):

    /work/peers-venv/bin/python benchmarks/gibbs.py               # full, writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/gibbs.py --quick       # smoke test, no write
    /work/peers-venv/bin/python benchmarks/gibbs.py --likelihoods studentt --json /tmp/g.json

augmentedgp is imported from the checkout (src/), never from an installed copy.
"""

from __future__ import annotations

import os
import sys

from _threads import single_thread

# one CPU, single-threaded XLA and BLAS (see _threads.py), set before JAX starts
THREADS, PINNED_CPU = single_thread(sys.argv[1:])

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from _report import RESULTS_MD, checkout, cpu_model, fmt, markdown_table, ratio  # noqa: E402
from _report import write_results as _write_section  # noqa: E402
from jax import lax  # noqa: E402

# Synchronous dispatch on CPU (before the CPU client starts): numpyro traces and compiles
# inside its runs, once per chain; with JAX's default asynchronous dispatch a chain's
# compilation overlaps the previous chain's execution and the compile time could not be
# told apart from the run time. Every sampler here is one long XLA call per chain or run,
# so blocking on each call costs nothing measurable.
jax.config.update("jax_cpu_enable_async_dispatch", False)

import augmentedgp as agp  # noqa: E402  (enables float64 in JAX)

jax.config.update("jax_enable_x64", True)

SKIPPED: dict[str, str] = {}
try:
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    numpyro.enable_x64()
except ImportError as err:  # pragma: no cover - depends on the environment
    numpyro = None
    SKIPPED["numpyro"] = f"not installed ({err.name})"

SECTION_BEGIN = "<!-- BEGIN gibbs.py (generated, overwritten on each run) -->"
SECTION_END = "<!-- END gibbs.py -->"
TITLE = "## Gibbs sampling: augmentedgp vs numpyro NUTS and random-walk Metropolis"

LIKELIHOODS = ("logistic", "studentt", "laplace", "matern32")
LABEL = {"logistic": "Logistic", "studentt": "Student-t", "laplace": "Laplace",
         "matern32": "Matern 3/2"}
METHODS = ("RWM", "NUTS", "Gibbs")
STUDENT_DF = 4.0
RWM_TARGET = 0.234
RHAT_OK = 1.05  # above: the chains have not mixed and their ESS means nothing (marked †)
TARGET_RATIO = {"logistic": 1.0, "studentt": 10.0, "laplace": 10.0, "matern32": 10.0}
# Thesis Table 2 (Turing.jl MH and hand-tuned HMC vs Gibbs; 5 chains x 10,000 samples):
# (time / sample s, lag-1 autocorrelation, Gelman-Rubin) for MH, HMC, Gibbs.
THESIS = {
    "logistic": {"MH": (0.001, 0.996, 1.38), "HMC": (0.041, 0.53, 1.00),
                 "Gibbs": (0.01, 0.11, 1.00)},
    "studentt": {"MH": (0.003, 1.0, 1.51), "HMC": (0.573, 0.857, 1.00),
                 "Gibbs": (0.028, 0.04, 1.00)},
    "laplace": {"MH": (0.002, 0.995, 1.44), "HMC": (0.082, 0.931, 1.01),
                "Gibbs": (0.028, 0.26, 1.00)},
    "matern32": {"MH": (0.005, 0.997, 1.59), "HMC": (0.15, 0.995, 1.10),
                 "Gibbs": (0.029, 0.05, 1.00)},
}


# --- timing ----------------------------------------------------------------------------------


class CompileClock:
    """Wall seconds JAX spends tracing, lowering to MLIR and compiling, from its monitoring
    events (the union of their time spans: nested traces count once)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        self.spans: list[tuple[float, float]] = []
        self.compiled: list[tuple[float, float, str]] = []  # (end, seconds, function)
        jax.monitoring.register_event_time_span_listener(self._record)

    def _record(self, event, start_time, end_time, **kwargs):
        if event in self.EVENTS:
            self.spans.append((start_time, end_time))
        if event == self.EVENTS[-1]:
            self.compiled.append((end_time, end_time - start_time,
                                  str(kwargs.get("fun_name", "?"))))

    def programs_since(self, t0: float, min_seconds: float = 0.5) -> list[str]:
        """Names of the programs XLA compiled since t0 in at least ``min_seconds`` (the
        small eager helpers left out)."""
        return [name for end, secs, name in self.compiled if end >= t0 and secs >= min_seconds]

    def seconds_since(self, t0: float) -> float:
        total, end = 0.0, -math.inf
        for a, b in sorted(s for s in self.spans if s[1] >= t0):
            a = max(a, t0, end)
            if b > a:
                total, end = total + b - a, b
        return total


CLOCK = CompileClock()


@contextlib.contextmanager
def timed():
    """Wall (``wall``) and process (``cpu``) seconds of the block, and the wall seconds JAX
    spent compiling in it (``compile``)."""
    rec = {}
    t0, w0, c0 = time.time(), time.perf_counter(), time.process_time()
    yield rec
    rec["wall"] = time.perf_counter() - w0
    rec["cpu"] = time.process_time() - c0
    rec["compile"] = CLOCK.seconds_since(t0)
    rec["programs"] = CLOCK.programs_since(t0)


# --- problems --------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
    key: str  # one of LIKELIHOODS
    dataset: str
    X: np.ndarray
    y: np.ndarray  # +-1 (logistic) or standardised
    kernel: agp.kernels.Kernel
    likelihood: agp.likelihoods.Likelihood
    hyper: dict  # the frozen hyperparameters, for the report
    fit_note: str

    @property
    def n(self) -> int:
        return self.X.shape[0]


def _standardise(X):
    X = np.asarray(X, float)
    sd = X.std(0)
    sd[sd == 0] = 1.0
    return (X - X.mean(0)) / sd


def load_boston(n_rows=None):
    with np.load(DATA_DIR / "boston.npz") as f:
        X, y = f["X"], f["y"]
    if n_rows and n_rows < X.shape[0]:
        idx = np.random.default_rng(0).choice(X.shape[0], n_rows, replace=False)
        X, y = X[idx], y[idx]
    y = np.asarray(y, float)
    return _standardise(X), (y - y.mean()) / y.std()


def load_binary(name, n_rows):
    with np.load(DATA_DIR / f"{name}.npz") as f:
        X, y = (f["X_train"], f["y_train"]) if "X_train" in f else (f["X"], f["y"])
    idx = np.random.default_rng(0).choice(X.shape[0], n_rows, replace=False)
    return _standardise(X[idx]), np.where(y[idx] > 0, 1.0, -1.0)


def _values(p):
    v = np.asarray(p.value)
    return float(v) if v.ndim == 0 else [float(x) for x in v]


def make_problems(keys, args) -> list[Problem]:
    out = []
    if "logistic" in keys:
        X, y = load_binary(args.binary_data, args.n_binary)
        d = X.shape[1]
        t = time.perf_counter()
        post = agp.fit(agp.GP(agp.kernels.RBF(math.sqrt(d), 1.0), agp.likelihoods.Logistic()),
                       X, y)
        kern = post.kernel
        hyper = {"kernel": "RBF (isotropic)", "lengthscale": _values(kern.lengthscale),
                 "variance": _values(kern.variance)}
        note = (f"Laplace-approximation ML-II (`fit(GP(RBF, Logistic()), X, y)`, L-BFGS, "
                f"{time.perf_counter() - t:.0f} s), log marginal likelihood "
                f"{post.log_marginal_likelihood():.2f}")
        out.append(Problem("logistic", f"{args.binary_data} (random {X.shape[0]} training "
                           f"rows, seed 0; {int((y > 0).sum())} positive; d = {d})", X, y,
                           kern, agp.likelihoods.Logistic(), hyper, note))
    regression = [k for k in keys if k != "logistic"]
    if regression:
        X, y = load_boston(args.n_boston)
        d = X.shape[1]
        t = time.perf_counter()
        post = agp.fit(agp.GP(agp.kernels.RBF(np.full(d, math.sqrt(d)), 1.0), noise=0.1), X, y)
        kern, noise = post.kernel, float(post.likelihood.variance.value)
        sigma = math.sqrt(noise)
        note = (f"Gaussian GP ML-II (`fit(GP(RBF(ARD), noise=0.1), X, y)`, L-BFGS, "
                f"{time.perf_counter() - t:.0f} s): noise variance {noise:.4g}, log marginal "
                f"likelihood {post.log_marginal_likelihood():.2f}; each likelihood's scale "
                "matches that noise variance")
        # noise variances: Student-t s^2 df / (df - 2), Laplace 2 b^2, Matern-3/2 4 s^2 / 3
        liks = {"studentt": agp.likelihoods.StudentT(
                    STUDENT_DF, sigma * math.sqrt((STUDENT_DF - 2.0) / STUDENT_DF)),
                "laplace": agp.likelihoods.Laplace(sigma / math.sqrt(2.0)),
                "matern32": agp.likelihoods.Matern32(sigma * math.sqrt(3.0) / 2.0)}
        for k in regression:
            lik = liks[k]
            hyper = {"kernel": "RBF (ARD)", "lengthscale": _values(kern.lengthscale),
                     "variance": _values(kern.variance), "scale": _values(lik.scale),
                     "gaussian_noise_variance": noise}
            if k == "studentt":
                hyper["df"] = STUDENT_DF
            out.append(Problem(k, f"boston (n = {X.shape[0]}, d = {d})", X, y, kern, lik,
                               hyper, note))
    return out


def loglik(prob: Problem, y, f):
    """log p(y | f) elementwise, written with numpyro's distributions (Matern 3/2 by hand):
    the density NUTS samples from (checked against augmentedgp's ``log_prob``)."""
    lik = prob.likelihood
    if prob.key == "logistic":
        return dist.Bernoulli(logits=f).log_prob((y > 0).astype(f.dtype))
    if prob.key == "studentt":
        return dist.StudentT(lik.df.value, f, lik.scale.value).log_prob(y)
    if prob.key == "laplace":
        return dist.Laplace(f, lik.scale.value).log_prob(y)
    a = math.sqrt(3.0) / lik.scale.value
    r = jnp.abs(y - f)
    return jnp.log(a / 4.0) + jnp.log1p(a * r) - a * r


def check_loglik(prob: Problem) -> float:
    """max |numpyro log p(y | f) - augmentedgp log_prob| at 200 random f per observation."""
    y = jnp.asarray(prob.y)
    f = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (200, prob.n), y.dtype) + y
    return float(jnp.max(jnp.abs(loglik(prob, y, f) - prob.likelihood.log_prob(y, f))))


# --- samplers --------------------------------------------------------------------------------


def run_gibbs(prob: Problem, args, key):
    model = agp.MCGP(prob.kernel, prob.likelihood)
    settings = agp.GibbsSampling(args.samples, n_chains=args.chains, burn_in=args.burn_in)
    k1, k2 = jax.random.split(key)
    with timed() as first:
        post = agp.sample(model, prob.X, prob.y, settings, key=k1)
        post.f.block_until_ready()
    with timed() as t:
        post = agp.sample(model, prob.X, prob.y, settings, key=k2)
        post.f.block_until_ready()
    sweeps = args.chains * (args.burn_in + args.samples)
    return {"f": np.asarray(post.f), "first_call": first, "timing": t,
            "compile": first["compile"],  # JAX's compile events in the first call
            "sampling_wall": t["wall"] * args.samples / (args.burn_in + args.samples),
            "settings": f"burn-in {args.burn_in}, {args.samples} kept, thin 1",
            "iterations": sweeps,
            "notes": f"{1e3 * t['wall'] / sweeps:.2f} ms / sweep"}


def run_nuts(prob: Problem, L, args, key):
    y = jnp.asarray(prob.y)
    n = prob.n

    def model():
        v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([n]).to_event(1))
        f = L @ v
        numpyro.factor("loglik", jnp.sum(loglik(prob, y, f)))

    mcmc = MCMC(NUTS(model), num_warmup=args.nuts_warmup, num_samples=args.nuts_samples,
                num_chains=args.chains, chain_method=args.nuts_chain_method, progress_bar=False)
    # numpyro traces and compiles inside warmup() and run() (per phase, not per chain): the
    # compile seconds JAX reports there are subtracted from the run's wall and process time
    fields = ("num_steps", "diverging", "accept_prob", "adapt_state.step_size")
    with timed() as tw:
        mcmc.warmup(key, extra_fields=fields, collect_warmup=True)
        jax.block_until_ready(mcmc.post_warmup_state)
    warm_steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    with timed() as ts:
        mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=fields)
        v = mcmc.get_samples(group_by_chain=True)["v"]
        v.block_until_ready()
    extra = {k: np.asarray(x) for k, x in mcmc.get_extra_fields(group_by_chain=True).items()}
    f = np.asarray(jnp.einsum("csj,ij->csi", v, L))
    compile_s = tw["compile"] + ts["compile"]
    # process time spent compiling is not observable apart: take each phase's process time
    # net of the same fraction as its wall time
    t = {"wall": tw["wall"] + ts["wall"] - compile_s,
         "programs": tw["programs"] + ts["programs"],
         "cpu": sum(p["cpu"] * max(1.0 - p["compile"] / p["wall"], 0.0) for p in (tw, ts))}
    sampling_wall = ts["wall"] - ts["compile"]
    steps = extra["num_steps"]
    depth = np.log2(steps + 1.0)
    step_sizes = extra["adapt_state.step_size"][:, -1]
    return {"f": f, "timing": t, "warmup_timing": tw, "sampling_timing": ts,
            "compile": compile_s, "sampling_wall": sampling_wall,
            "settings": f"warm-up {args.nuts_warmup}, {args.nuts_samples} kept, thin 1",
            "iterations": args.chains * (args.nuts_warmup + args.nuts_samples),
            "leapfrog_warmup": int(warm_steps.sum()), "leapfrog_sampling": int(steps.sum()),
            "mean_steps": float(steps.mean()), "max_depth_hits": int((depth >= 10).sum()),
            "divergences": int(extra["diverging"].sum()),
            "accept_prob": float(extra["accept_prob"].mean()),
            "step_size": [float(x) for x in step_sizes],
            "notes": (f"{steps.mean():.0f} leapfrog steps / iteration in sampling "
                      f"({100 * np.mean(depth >= 10):.0f} % at the max tree depth 10; warm-up "
                      f"{warm_steps.mean():.0f}), {int(extra['diverging'].sum())} divergent, "
                      f"mean acceptance {extra['accept_prob'].mean():.2f}, step sizes "
                      + "/".join(f"{x:.3g}" for x in step_sizes)
                      + f"; {1e6 * t['wall'] / (warm_steps.sum() + steps.sum()):.0f} us per "
                      "leapfrog step; compile (inside warm-up / sampling) "
                      f"{tw['compile']:.1f} / {ts['compile']:.1f} s, "
                      f"{len(tw['programs'])} / {len(ts['programs'])} XLA programs of > 0.5 s")}


def make_rwm(prob: Problem, L, n_warm: int, n_keep: int, thin: int):
    """Jitted random-walk Metropolis on log N(v | 0, I) + sum log p(y | L v), chains vmapped:
    (keys (C, 2), v0 (C, n)) -> (f (C, n_keep, n), acceptance (C,), step (C,))."""
    y = jnp.asarray(prob.y)
    n = prob.n

    def logp(v):
        return -0.5 * v @ v + jnp.sum(loglik(prob, y, L @ v))

    def step(key, v, lp, s):
        k1, k2 = jax.random.split(key)
        prop = v + s * jax.random.normal(k1, v.shape, v.dtype)
        lp_prop = logp(prop)
        log_a = jnp.minimum(0.0, lp_prop - lp)
        accept = jnp.log(jax.random.uniform(k2, dtype=v.dtype)) < log_a
        return jnp.where(accept, prop, v), jnp.where(accept, lp_prop, lp), jnp.exp(log_a)

    def chain(key, v0):
        k_warm, k_keep = jax.random.split(key)

        def warm(carry, i):
            v, lp, log_s = carry
            v, lp, a = step(jax.random.fold_in(k_warm, i), v, lp, jnp.exp(log_s))
            return (v, lp, log_s + (a - RWM_TARGET) / (i + 1.0) ** 0.6), None

        log_s0 = jnp.log(2.38 / math.sqrt(n))
        (v, lp, log_s), _ = lax.scan(warm, (v0, logp(v0), log_s0), jnp.arange(n_warm))
        s = jnp.exp(log_s)

        def keep(carry, i):
            def inner(j, c):
                v, lp, acc = c
                v, lp, a = step(jax.random.fold_in(jax.random.fold_in(k_keep, i), j), v, lp, s)
                return v, lp, acc + a

            v, lp, acc = lax.fori_loop(0, thin, inner, carry)
            return (v, lp, acc), L @ v

        (v, lp, acc), fs = lax.scan(keep, (v, lp, 0.0), jnp.arange(n_keep))
        return fs, acc / (n_keep * thin), s

    return jax.jit(jax.vmap(chain))


def run_rwm(prob: Problem, L, args, key):
    thin = args.rwm_thin
    n_warm, n_keep = thin * args.samples, args.samples
    fn = make_rwm(prob, L, n_warm, n_keep, thin)
    kc, k0 = jax.random.split(key)
    keys = jax.random.split(kc, args.chains)
    v0 = jax.random.normal(k0, (args.chains, prob.n), L.dtype)  # prior draws, as Gibbs
    with timed() as comp:
        compiled = fn.lower(keys, v0).compile()
    with timed() as t:
        f, acc, s = compiled(keys, v0)
        f.block_until_ready()
    acc, s = np.asarray(acc), np.asarray(s)
    return {"f": np.asarray(f), "timing": t, "compile": comp["wall"],
            "sampling_wall": t["wall"] * n_keep * thin / (n_warm + n_keep * thin),
            "settings": f"warm-up {n_warm}, {n_keep} kept, thin {thin}",
            "iterations": args.chains * (n_warm + n_keep * thin),
            "acceptance": [float(a) for a in acc], "step": [float(x) for x in s],
            "notes": (f"acceptance {acc.mean():.3f}, step s = "
                      + "/".join(f"{x:.3g}" for x in s)
                      + f"; {1e3 * t['wall'] / (args.chains * (n_warm + n_keep * thin)):.3f}"
                      " ms / iteration; lag-1 is of the thinned chain")}


def sweep_breakdown(prob: Problem, f_state, reps: int = 100):
    """ms per call of the two Gibbs steps at a posterior state: the auxiliary draw
    w ~ p(w | y, f) (``sample_aux``) and f ~ p(f | w, y) (the sampler's ``_draw_full``), each
    looped ``reps`` times inside one jitted call. Uses a private function of the sampler."""
    from augmentedgp.inference import gibbs as G

    X = jnp.asarray(prob.X)
    lik = prob.likelihood
    y = jnp.asarray(lik.targets(prob.y, prob.n))
    K = prob.kernel(X)
    prior = G.FullPrior(K, agp.linalg.cholesky(K), jnp.zeros(prob.n, X.dtype))
    f0 = jnp.asarray(f_state)
    w0 = lik.sample_aux(jax.random.PRNGKey(0), y, f0)
    beta, gamma = lik.sites(y, w0)

    def aux_loop(key):
        return lax.fori_loop(0, reps, lambda i, acc: acc + lik.sample_aux(
            jax.random.fold_in(key, i), y, f0 + 1e-9 * acc), jnp.zeros_like(f0))

    def draw_loop(key):
        return lax.fori_loop(0, reps, lambda i, acc: acc + G._draw_full(
            jax.random.fold_in(key, i), prior, beta, gamma + 1e-12 * acc)[0],
            jnp.zeros_like(f0))

    out = {}
    for name, fn in (("aux", aux_loop), ("draw_f", draw_loop)):
        jf = jax.jit(fn)
        jf(jax.random.PRNGKey(1)).block_until_ready()
        best = math.inf
        for i in range(3):  # the best of 3: less sensitive to other jobs
            t = time.perf_counter()
            jf(jax.random.PRNGKey(2 + i)).block_until_ready()
            best = min(best, time.perf_counter() - t)
        out[name] = 1e3 * best / reps
    return out


# --- measures --------------------------------------------------------------------------------


def diagnose(res: dict, chains: int) -> dict:
    f = res["f"]
    s = agp.diagnostics.summary(f)
    kept = f.shape[0] * f.shape[1]
    wall, cpu = res["timing"]["wall"], res["timing"]["cpu"]
    ess = s["ess_bulk"]
    return {"kept": kept, "wall": wall, "cpu": cpu, "compile": res["compile"],
            "ms_per_sample": 1e3 * wall / kept, "lag1_median": float(np.median(s["acf1"])),
            "lag1_max": float(np.max(s["acf1"])), "rhat_max": float(np.max(s["rhat"])),
            "rhat_median": float(np.median(s["rhat"])), "ess_min": float(np.min(ess)),
            "ess_median": float(np.median(ess)), "ess_tail_min": float(np.min(s["ess_tail"])),
            "ess_per_s": ratio(float(np.min(ess)), wall),
            "ess_per_cpu_s": ratio(float(np.min(ess)), cpu),
            "ess_per_s_sampling": ratio(float(np.min(ess)), res["sampling_wall"]),
            "mean": s["mean"], "sd": s["sd"], "ess": ess, "rhat": s["rhat"], "acf1": s["acf1"]}


def agreement(d: dict, ref: dict) -> dict:
    delta = np.abs(d["mean"] - ref["mean"]) / ref["sd"]
    se = np.sqrt(d["sd"] ** 2 / d["ess"] + ref["sd"] ** 2 / ref["ess"])
    z = np.abs(d["mean"] - ref["mean"]) / se
    sd_ratio = d["sd"] / ref["sd"]
    return {"dmean_max": float(np.max(delta)), "dmean_median": float(np.median(delta)),
            "z_max": float(np.max(z)), "z_frac_gt3": float(np.mean(z > 3.0)),
            "sd_ratio_median": float(np.median(sd_ratio)),
            "sd_ratio_min": float(np.min(sd_ratio)), "sd_ratio_max": float(np.max(sd_ratio))}


def bench_problem(prob: Problem, args, methods) -> dict:
    print(f"\n== {LABEL[prob.key]}: {prob.dataset}", flush=True)
    print(f"   hyperparameters: {prob.hyper}", flush=True)
    X = jnp.asarray(prob.X)
    L = agp.linalg.cholesky(prob.kernel(X))
    key = jax.random.PRNGKey(args.seed)
    out = {"problem": prob, "runs": {}, "diag": {}, "errors": {}}
    if numpyro is not None:
        out["loglik_check"] = check_loglik(prob)
        print(f"   max |numpyro - augmentedgp log p(y | f)| = {out['loglik_check']:.2e}")
    runners = {"Gibbs": lambda k: run_gibbs(prob, args, k),
               "NUTS": lambda k: run_nuts(prob, L, args, k),
               "RWM": lambda k: run_rwm(prob, L, args, k)}
    for i, m in enumerate(METHODS):
        if m not in methods:
            continue
        if m == "NUTS" and numpyro is None:
            out["errors"][m] = SKIPPED["numpyro"]
            continue
        try:
            res = runners[m](jax.random.fold_in(key, i))
        except Exception as err:  # report and go on with the other samplers
            out["errors"][m] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            print(f"   {m}: FAILED {out['errors'][m]}", flush=True)
            continue
        out["runs"][m] = res
        d = diagnose(res, args.chains)
        out["diag"][m] = d
        print(f"   {m:5s} {res['settings']}: run {d['wall']:.1f} s wall / {d['cpu']:.1f} s "
              f"CPU (compile {d['compile']:.1f} s), lag-1 {d['lag1_median']:.3f}, R-hat max "
              f"{d['rhat_max']:.3f}, ESS min/median {d['ess_min']:.0f}/{d['ess_median']:.0f},"
              f" min ESS/s {_g(d['ess_per_s'])}; {res['notes']}", flush=True)
    if "NUTS" in out["diag"]:
        out["agree"] = {m: agreement(d, out["diag"]["NUTS"])
                        for m, d in out["diag"].items() if m != "NUTS"}
        for m, a in out["agree"].items():
            print(f"   {m} vs NUTS: max |dmean|/sd {a['dmean_max']:.3f}, max |z| "
                  f"{a['z_max']:.2f}, sd ratio median {a['sd_ratio_median']:.3f}", flush=True)
    if "Gibbs" in out["runs"] and not args.no_breakdown:
        try:
            out["breakdown"] = sweep_breakdown(prob, out["diag"]["Gibbs"]["mean"])
            out["breakdown"]["sweep"] = (1e3 * out["runs"]["Gibbs"]["timing"]["wall"]
                                         / out["runs"]["Gibbs"]["iterations"])
            print(f"   Gibbs sweep: {out['breakdown']}", flush=True)
        except Exception as err:  # private API: optional
            out["breakdown_error"] = f"{type(err).__name__}: {err}"
    return out


# --- report ----------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "augmentedgp": agp.__version__ + checkout(),
           "jax": jax.__version__, "jaxlib": jaxlib.__version__, "equinox": eqx.__version__,
           "numpy": np.__version__}
    out["numpyro"] = numpyro.__version__ if numpyro is not None else "not installed"
    return out


def machine() -> str:
    threads = ("XLA CPU single-threaded (`--xla_cpu_multi_thread_eigen=false "
               "intra_op_parallelism_threads=1`), OMP/OPENBLAS/MKL_NUM_THREADS=1"
               if THREADS == 1 else "XLA CPU and OpenBLAS at their defaults")
    pin = (f"the whole process pinned to CPU {PINNED_CPU} (`os.sched_setaffinity`): every "
           "sampler and its chains run on one core, one chain after the other (RWM's chains "
           "are vmapped)" if PINNED_CPU is not None else "no CPU pinning")
    return (f"nproc: {os.cpu_count()}; CPU: {cpu_model()}; platform: {platform.platform()}; "
            f"{threads}; {pin}; synchronous CPU dispatch (`jax_cpu_enable_async_dispatch="
            "False`, so that compilation never overlaps execution)")


def _g(x, spec=".3g"):
    return fmt(x, spec)


def problem_table(res: dict) -> str:
    header = ["sampler", "settings per chain", "run wall s (CPU s)", "compile s",
              "ms / kept sample", "lag-1 (median)", "max R-hat", "bulk ESS min / median",
              "min ESS / s (sampling phase)", "vs NUTS: max abs dmean / sd", "max abs z",
              "sd ratio (median)"]
    rows = []
    for m in METHODS:
        if m in res["errors"]:
            rows.append([m, res["errors"][m]] + ["—"] * (len(header) - 2))
            continue
        if m not in res["diag"]:
            continue
        d, r = res["diag"][m], res["runs"][m]
        a = res.get("agree", {}).get(m)
        rows.append([m, r["settings"], f"{d['wall']:.1f} ({d['cpu']:.1f})",
                     f"{d['compile']:.1f}", _g(d["ms_per_sample"]), f"{d['lag1_median']:.3f}",
                     f"{d['rhat_max']:.3f}" + (" †" if d["rhat_max"] > RHAT_OK else ""),
                     f"{d['ess_min']:.0f} / {d['ess_median']:.0f}",
                     f"{_g(d['ess_per_s'])} ({_g(d['ess_per_s_sampling'])})",
                     "(reference)" if m == "NUTS" else _g(a and a["dmean_max"]),
                     "" if m == "NUTS" else _g(a and a["z_max"]),
                     "" if m == "NUTS" else _g(a and a["sd_ratio_median"])])
    return markdown_table(header, rows)


def verdicts(all_res) -> tuple[list[str], list[list]]:
    lines, rows = [], []
    for res in all_res:
        k = res["problem"].key
        g, n = res["diag"].get("Gibbs"), res["diag"].get("NUTS")
        q = ratio(g and g["ess_per_s"], n and n["ess_per_s"])
        qc = ratio(g and g["ess_per_cpu_s"], n and n["ess_per_cpu_s"])
        qs = ratio(g and g["ess_per_s_sampling"], n and n["ess_per_s_sampling"])
        target = TARGET_RATIO[k]
        a = res.get("agree", {}).get("Gibbs")
        ok = None if q is None else q >= target
        rows.append([LABEL[k], _g(g and g["ess_per_s"]), _g(n and n["ess_per_s"]),
                     _g(q), _g(qc), _g(qs), f">= {target:g}x",
                     "n/a" if ok is None else ("**met**" if ok else "**not met**"),
                     _g(a and a["z_max"])])
        if ok is not None:
            agree = ("" if a is None else
                     f"; Gibbs and NUTS agree (max |z| {a['z_max']:.2f}, max |dmean| / sd "
                     f"{a['dmean_max']:.3f})" if a["z_max"] < 5.0 else
                     f"; **Gibbs and NUTS disagree** (max |z| {a['z_max']:.1f}, max |dmean| / "
                     f"sd {a['dmean_max']:.2f})")
            mixed = [m for m, d in (("Gibbs", g), ("NUTS", n)) if d["rhat_max"] > RHAT_OK]
            warn = (f"; but max R-hat > {RHAT_OK} for {' and '.join(mixed)}, so the ESS "
                    "behind this ratio is not reliable" if mixed else "")
            lines.append(f"- {LABEL[k]}: min ESS/s Gibbs / NUTS = {q:.2f} (process time: "
                         f"{_g(qc)}; sampling phases alone: {_g(qs)}) -> '>= {target:g}x' "
                         + ("**met**" if ok else "**not met**") + agree + warn + ".")
    return lines, rows


def thesis_table(all_res) -> str:
    header = ["likelihood", "metric", "MH (thesis)", "RWM (ours)", "HMC (thesis)",
              "NUTS (ours)", "Gibbs (thesis)", "Gibbs (ours)"]
    rows = []
    for res in all_res:
        k = res["problem"].key
        th = THESIS[k]
        for j, metric in enumerate(("time / sample (s)", "lag 1", "Gelman (max R-hat)")):
            ours = []
            for m in METHODS:
                d = res["diag"].get(m)
                if d is None:
                    ours.append("—")
                else:
                    val = (d["ms_per_sample"] / 1e3, d["lag1_median"], d["rhat_max"])[j]
                    ours.append(f"{val:.3g}" if j == 0 else f"{val:.3f}")
            rows.append([LABEL[k] if j == 0 else "", metric, f"{th['MH'][j]:g}", ours[0],
                         f"{th['HMC'][j]:g}", ours[1], f"{th['Gibbs'][j]:g}", ours[2]])
    return markdown_table(header, rows)


def hyper_lines(all_res) -> list[str]:
    lines, seen = [], set()
    for res in all_res:
        p = res["problem"]
        h = dict(p.hyper)
        ls = h.pop("lengthscale")
        ls_s = (f"{ls:.4g}" if isinstance(ls, float) else
                "[" + ", ".join(f"{x:.4g}" for x in ls) + "]")
        rest = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in h.items() if k != "kernel")
        fit = "" if p.fit_note in seen else f" Fit: {p.fit_note}."
        seen.add(p.fit_note)
        lines.append(f"- {LABEL[p.key]} ({p.dataset}): {type(p.likelihood).__name__}; "
                     f"{h['kernel']} lengthscale {ls_s}; {rest}.{fit}")
    return lines


def report(args, all_res, total_s, load, vers) -> str:
    cmd = " ".join([Path(sys.executable).as_posix(), "benchmarks/gibbs.py", *sys.argv[1:]])
    verdict_lines, verdict_rows = verdicts(all_res)
    lines = [
        TITLE + " (`benchmarks/gibbs.py`)",
        "",
        f"Run {datetime.datetime.now().isoformat(timespec='seconds')} from the repository root:",
        "",
        f"    {cmd}",
        "",
        f"Total run time {total_s / 60:.1f} min. The thesis' Table 2 (ch. 5.1) on the same "
        "kinds of problems: logistic classification at the size of its Heart set (n = 303) "
        "and Student-t, Laplace and Matern-3/2 regression on Boston housing (n = 506).",
        "",
        "**Data.** Logistic: a random slice (seed 0) of "
        f"{args.n_binary} training rows of `{args.binary_data}.npz` (the thesis' Heart set is "
        "not in the shared data), labels +-1; regression: `boston.npz`, "
        + ("all rows" if args.n_boston is None else f"a random {args.n_boston}-row slice "
           "(seed 0)")
        + ". X standardised (zero-sd columns left at 0), y standardised (regression).",
        "",
        "**Fixed hyperparameters** (fitted once, then frozen: every sampler targets the same "
        "posterior of the n latent values f = f(X), zero prior mean):",
        "",
        *hyper_lines(all_res),
        "",
        "**Samplers** (float64, "
        f"{args.chains} chains each, every chain from its own random start):",
        "",
        "- *Gibbs*: augmentedgp `sample(MCGP(kernel, likelihood), X, y, GibbsSampling("
        f"{args.samples}, n_chains={args.chains}, burn_in={args.burn_in}), key=...)` (the "
        "augmented blocked sampler, thesis Algorithm 2: w ~ p(w | y, f) by Polya-Gamma "
        "(Devroye) / gamma / inverse-Gaussian / GIG draws, then f | w by Matheron's rule, one "
        "n x n Cholesky per sweep; chains by `lax.map`; started from a prior draw). Called "
        "twice with the same settings: the second (compiled) call is timed and measured; "
        "its compile time is what JAX's monitoring events report in the first call.",
        f"- *NUTS*: numpyro {vers.get('numpyro')} `NUTS(model)` with its defaults (target "
        "acceptance 0.8, diagonal mass matrix adapted in warm-up, max tree depth 10), "
        f"`MCMC(num_warmup={args.nuts_warmup}, num_samples={args.nuts_samples}, "
        f"num_chains={args.chains}, chain_method=\"{args.nuts_chain_method}\")`, on the "
        "whitened latent (its users' standard set-up): v ~ N(0, I_n), f = L v with L = "
        "chol(K) computed once outside the model (the same factor as Gibbs'), "
        "`numpyro.factor` of sum log p(y | f) written with numpyro's `Bernoulli(logits=f)`, "
        "`StudentT(df, f, scale)`, `Laplace(f, scale)` and, for Matern 3/2, log(a/4) + "
        "log1p(a |y - f|) - a |y - f| with a = sqrt(3) / scale (each checked against "
        "augmentedgp's `log_prob`: max difference "
        + ", ".join(f"{LABEL[r['problem'].key]} {r['loglik_check']:.1e}" for r in all_res
                    if "loglik_check" in r)
        + "); numpyro's default initialisation (uniform in (-2, 2)). `mcmc.warmup(...)` "
        "then `mcmc.run(...)`, timed apart; numpyro traces and compiles inside both calls, "
        "its sampling loop once per chain (`_fori_collect_loop`, a new `jit` wrapper per "
        "call: the program counts are in the notes): the compile seconds that JAX's "
        "monitoring events "
        "report there are subtracted from its wall time (and the same fraction of each "
        "call's process time) and shown as its compile time. "
        f"{args.nuts_warmup} warm-up + {args.nuts_samples} kept iterations per chain, fewer "
        "than Gibbs', to keep the whole run under ~25 minutes (NUTS's leapfrog steps per "
        "iteration, up to 1023, are in the notes under each table); the *sampling phase* "
        "ESS/s below does not depend on the length of the warm-ups.",
        f"- *RWM*: random-walk Metropolis on the same whitened target (log N(v | 0, I) + "
        "sum log p(y | L v), with augmentedgp's `log_prob`), written in this script with "
        "`lax.scan`, chains `vmap`-ed, Gaussian proposals v + s e with one scalar step s: "
        f"{args.rwm_thin} x {args.samples} warm-up iterations adapting log s by Robbins-Monro "
        f"(gain (t + 1)^-0.6) towards {RWM_TARGET} acceptance (Roberts, Gelman & Gilks 1997), "
        f"from s = 2.38 / sqrt(n); then s fixed and {args.rwm_thin} x {args.samples} "
        f"iterations, every {args.rwm_thin}th kept (its lag-1 is at lag {args.rwm_thin} "
        "iterations); started from a prior draw. Compiled ahead of time (`jit(...).lower("
        ").compile()`), not included in its run time.",
        "",
        "**Measures** (on f, all n latent values; `augmentedgp.diagnostics`, the same "
        "estimator for every sampler): *run* = the sampler's whole run, warm-up / burn-in "
        "included, compilation excluded (wall; process time in brackets); *ms / kept "
        "sample* = run wall / (chains x kept samples); *lag-1* = the chain-averaged lag-1 "
        "autocorrelation of each f_i, median over i; *max R-hat* = the largest "
        "rank-normalised split R-hat (Vehtari et al. 2021) over the f_i (the thesis reports "
        "Gelman-Rubin without saying which statistic or how it aggregates); *ESS* = bulk "
        "ESS of each f_i, min and median over i; *min ESS / s* = min bulk ESS / run wall "
        "seconds (what a user waits for, warm-up included), and in brackets min bulk ESS "
        "/ the wall seconds of the sampling phase alone (Gibbs and RWM: their run times the "
        "fraction of their iterations after burn-in / warm-up; NUTS: its `run` call). "
        f"† marks max R-hat > {RHAT_OK}: chains that have not mixed, whose ESS means "
        "nothing. *vs NUTS*: max over i of "
        "|mean_i - mean_i(NUTS)| / sd_i(NUTS); max |z| with z = (mean - mean_NUTS) / "
        "sqrt(mcse^2 + mcse_NUTS^2), mcse = sd / sqrt(bulk ESS) (~N(0, 1) per latent when "
        "both are right: the max over n latents is ~3.5); sd ratio = median over i of "
        "sd_i / sd_i(NUTS).",
        "",
        f"**Machine.** {machine()}; load average (1 min) at start / end: {load[0]:.2f} / "
        f"{load[1]:.2f} (the VM is shared with other jobs: timings are noisy; the ratios "
        "below are from samplers run side by side in this one process).",
        "",
        "**Versions** (checkout as imported at the start). "
        + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
    ]
    if SKIPPED:
        lines += ["**Skipped.** " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()), ""]
    lines += ["### Targets", "", *verdict_lines, "",
              markdown_table(["likelihood", "Gibbs min ESS/s", "NUTS min ESS/s",
                              "Gibbs / NUTS (wall)", "Gibbs / NUTS (process time)",
                              "Gibbs / NUTS (sampling phases, wall)", "target",
                              "verdict", "Gibbs vs NUTS max abs z"], verdict_rows), ""]
    lines += ["### Results per likelihood", ""]
    for res in all_res:
        p = res["problem"]
        lines += [f"**{LABEL[p.key]}** ({p.dataset}; {res['seconds']:.0f} s for this problem)",
                  "", problem_table(res), ""]
        notes = [f"{m}: {res['runs'][m]['notes']}" for m in METHODS if m in res["runs"]]
        lines += [f"- {n}" for n in notes]
        b = res.get("breakdown")
        if b:
            lines += [f"- Gibbs sweep ({b['sweep']:.2f} ms in the run): the auxiliary draw "
                      f"w ~ p(w | y, f) {b['aux']:.2f} ms, the draw of f | w (Cholesky of "
                      f"I + s K s, Matheron's rule) {b['draw_f']:.2f} ms (each timed alone, "
                      "100 calls in one jitted loop)."]
        lines += [""]
    lines += ["### Against the thesis' Table 2", "",
              "Thesis: Turing.jl MH and HMC (step size and leapfrog steps hand-tuned by a grid "
              "search, App. Tables 3-5) against Gibbs (AugmentedGaussianProcesses.jl), 5 "
              "chains x 10,000 samples, time per sample in seconds. Ours: RWM (adaptive, "
              "thinned), numpyro NUTS (default adaptation, no tuning) and augmentedgp Gibbs "
              "as above; time per sample = run wall (warm-up included) / kept samples; "
              "lag 1 = median over the latents; Gelman = max split R-hat over the latents.",
              "", thesis_table(all_res), "", *comparison_lines(all_res), ""]
    return "\n".join(lines)


def comparison_lines(all_res) -> list[str]:
    out = []
    for res in all_res:
        k = res["problem"].key
        g, n, r = (res["diag"].get(m) for m in ("Gibbs", "NUTS", "RWM"))
        parts = []
        if g:
            parts.append(f"Gibbs lag-1 {g['lag1_median']:.3f} (thesis {THESIS[k]['Gibbs'][1]:g}),"
                         f" {g['ms_per_sample']:.3g} ms / sample (thesis "
                         f"{1e3 * THESIS[k]['Gibbs'][0]:g} ms)")
        if n:
            parts.append(f"NUTS lag-1 {n['lag1_median']:.3f} against hand-tuned HMC's "
                         f"{THESIS[k]['HMC'][1]:g}, max R-hat {n['rhat_max']:.3f} (thesis "
                         f"{THESIS[k]['HMC'][2]:g}), {n['ms_per_sample']:.3g} ms / sample "
                         f"(thesis HMC {1e3 * THESIS[k]['HMC'][0]:g} ms)")
        if g and n:
            speed = n["ms_per_sample"] / g["ms_per_sample"]
            parts.append(f"time per sample NUTS / Gibbs {speed:.2f} (thesis HMC / Gibbs "
                         f"{THESIS[k]['HMC'][0] / THESIS[k]['Gibbs'][0]:.1f})")
        if r:
            parts.append(f"RWM max R-hat {r['rhat_max']:.2f} (thesis MH {THESIS[k]['MH'][2]:g})")
        if parts:
            out.append(f"- {LABEL[k]}: " + "; ".join(parts) + ".")
    return out


def dump_json(path, all_res, args, total_s, load, vers):
    def clean(d):
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}

    out = {"command": " ".join(["benchmarks/gibbs.py", *sys.argv[1:]]),
           "args": vars(args), "total_seconds": total_s, "load": load, "versions": vers,
           "machine": machine(), "problems": []}
    for res in all_res:
        p = res["problem"]
        runs = {m: {k: v for k, v in r.items() if k != "f"} for m, r in res["runs"].items()}
        q = ratio(res["diag"].get("Gibbs", {}).get("ess_per_s"),
                  res["diag"].get("NUTS", {}).get("ess_per_s"))
        out["problems"].append({
            "likelihood": p.key, "dataset": p.dataset, "n": p.n, "hyperparameters": p.hyper,
            "fit": p.fit_note, "loglik_check": res.get("loglik_check"),
            "seconds": res["seconds"], "errors": res["errors"], "runs": runs,
            "diagnostics": {m: clean(d) for m, d in res["diag"].items()},
            "agreement_vs_nuts": res.get("agree"), "gibbs_sweep_ms": res.get("breakdown"),
            "gibbs_over_nuts_min_ess_per_s": q, "target": TARGET_RATIO[p.key],
            "met": None if q is None else q >= TARGET_RATIO[p.key]})
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 100 kept samples, short warm-ups, 2 chains, "
                        "no RESULTS.md unless --write")
    parser.add_argument("--likelihoods", default=",".join(LIKELIHOODS),
                        help="comma-separated subset of " + ",".join(LIKELIHOODS))
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument("--samples", type=int, default=None,
                        help="kept samples per chain, every sampler (default 1000)")
    parser.add_argument("--chains", type=int, default=None, help="chains (default 4)")
    parser.add_argument("--burn-in", type=int, default=None, help="Gibbs burn-in (default 200)")
    parser.add_argument("--nuts-warmup", type=int, default=None, help="default 500")
    parser.add_argument("--nuts-samples", type=int, default=None,
                        help="kept NUTS samples per chain (default 500)")
    parser.add_argument("--nuts-chain-method", default="sequential",
                        choices=("sequential", "vectorized"))
    parser.add_argument("--rwm-thin", type=int, default=None,
                        help="RWM runs thin x samples warm-up and thin x samples iterations, "
                        "keeping every thin-th (default 20)")
    parser.add_argument("--binary-data", default="a9a", choices=("a9a", "bank"))
    parser.add_argument("--n-binary", type=int, default=None,
                        help="rows of the binary slice (default 300)")
    parser.add_argument("--n-boston", type=int, default=None,
                        help="subsample Boston's rows (default all 506)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-breakdown", action="store_true",
                        help="skip timing the two Gibbs steps apart")
    parser.add_argument("--threads", type=int, default=1,
                        help="1 (default): one CPU, single-threaded XLA / BLAS; 0: defaults. "
                        "Read at import")
    parser.add_argument("--cpu", type=int, default=None,
                        help="with --threads 1: the CPU to pin to (default: the last allowed)")
    parser.add_argument("--json", default=None, help="write all numbers to this file")
    parser.add_argument("--write", action="store_true", help="with --quick: write RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS_MD}")
    args = parser.parse_args(argv)
    defaults = ({"samples": 50, "chains": 2, "burn_in": 20, "nuts_warmup": 50,
                 "nuts_samples": 50, "rwm_thin": 2, "n_boston": 200, "n_binary": 150}
                if args.quick else
                {"samples": 1000, "chains": 4, "burn_in": 200, "nuts_warmup": 500,
                 "nuts_samples": 500, "rwm_thin": 20, "n_boston": None, "n_binary": 300})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    keys = args.likelihoods.split(",")
    methods = args.methods.split(",")
    if set(keys) - set(LIKELIHOODS):
        parser.error(f"unknown likelihoods: {sorted(set(keys) - set(LIKELIHOODS))}")
    if set(methods) - set(METHODS):
        parser.error(f"unknown methods: {sorted(set(methods) - set(METHODS))}")
    write = (args.write or not args.quick) and not args.no_write
    for lib, why in SKIPPED.items():
        print(f"note: skipping {lib}: {why}")

    start, load0, vers = time.perf_counter(), os.getloadavg()[0], versions()
    problems = make_problems([k for k in LIKELIHOODS if k in keys], args)
    all_res = []
    for prob in problems:
        t = time.perf_counter()
        res = bench_problem(prob, args, methods)
        res["seconds"] = time.perf_counter() - t
        all_res.append(res)
    total, load = time.perf_counter() - start, (load0, os.getloadavg()[0])
    text = report(args, all_res, total, load, vers)
    print()
    print(text)
    if args.json:
        dump_json(args.json, all_res, args, total, load, vers)
    if write:
        _write_section(text, SECTION_BEGIN, SECTION_END)
        print(f"\n(wrote {RESULTS_MD.relative_to(REPO)})")


if __name__ == "__main__":
    main()
