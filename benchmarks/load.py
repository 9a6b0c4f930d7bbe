"""Fits under load: already-compiled augmentedgp fits on an idle machine and with cores kept
busy by other processes, under the library's BLAS thread policy and without it.

Four fits, each compiled once and then timed: an exact GP regression (L-BFGS), a Laplace
classification of 200 points, an SVGP with ``AnalyticSVI`` (M = 100, batch 100, 300
iterations) and a short Gibbs run. Each is timed idle and while ``--busy`` busy-loop
processes (started and stopped here) keep cores busy, in two BLAS modes: ``policy`` (the
limit augmentedgp applies inside its calls, ``augmentedgp.core.runtime.limits``: one thread
unless the environment says otherwise) and ``no limit`` (a BLAS thread per core: OpenBLAS's default,
the behaviour before the policy). Reported: median times and the busy / idle ratios; the
target is a ratio of at most 1.5 for every fit under the policy.

    .venv/bin/python benchmarks/load.py            # full (~10 min on 2 cores), writes RESULTS.md
    .venv/bin/python benchmarks/load.py --quick    # smoke test, ~2 min, no write
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import harness as H

# threads=0: the harness sets no thread variable, so the library's own policy applies
H.start("load.py", threads=0)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, markdown_table, ratio  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp.core import runtime  # noqa: E402

TARGET = 1.5  # busy / idle, under the policy
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
POLICY = runtime.settings()  # the limit from the environment
MODES = {"policy": POLICY.blas_threads, "no limit": CORES}


def fits(args) -> dict:
    """{name: (description, run)}: ``run()`` fits and blocks until the result is ready."""
    rng = np.random.default_rng(0)
    out, L = {}, agp.likelihoods
    X = rng.normal(size=(args.n_exact, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=len(X))
    out["exact GP"] = (
        f"`fit(GP(RBF ARD, noise=0.1), X, y)`, n = {args.n_exact}, d = 3 (L-BFGS)",
        lambda: jax.block_until_ready(agp.fit(
            agp.GP(agp.kernels.RBF(lengthscale=np.ones(3)), noise=0.1), X, y)
            .log_marginal_likelihood()))
    Xc = rng.normal(size=(200, 2))
    yc = np.where(np.sin(2 * Xc[:, 0]) + Xc[:, 1] + 0.3 * rng.normal(size=200) > 0, 1.0, -1.0)
    out["Laplace"] = (
        "`fit(GP(RBF, Logistic()), X, y)` (Laplace), n = 200, d = 2",
        lambda: jax.block_until_ready(agp.fit(
            agp.GP(agp.kernels.RBF(1.0, 1.0), L.Logistic()), Xc, yc)
            .log_marginal_likelihood()))
    Xs = rng.normal(size=(args.n_svgp, 2))
    ys = np.where(np.sin(2 * Xs[:, 0]) * Xs[:, 1] + 0.3 * rng.normal(size=len(Xs)) > 0,
                  1.0, -1.0)
    Z = agp.inducing.kmeans(Xs, 100, jax.random.key(0))
    out["SVGP"] = (
        f"`fit(SVGP(RBF, Logistic(), Z), X, y, AnalyticSVI(100), max_iter={args.svgp_iter}, "
        f"tol=0)`, n = {args.n_svgp}, M = 100",
        lambda: jax.block_until_ready(agp.fit(
            agp.SVGP(agp.kernels.RBF(1.0, 1.0), L.Logistic(), Z), Xs, ys, agp.AnalyticSVI(100),
            max_iter=args.svgp_iter, tol=0, key=jax.random.key(1)).predict_f(Xs[:10])))
    Xg = np.sort(rng.uniform(-3, 3, 100))[:, None]
    yg = np.sin(2 * Xg[:, 0]) + 0.1 * rng.normal(size=100)
    gibbs = agp.GibbsSampling(n_samples=args.gibbs_samples, n_chains=4, burn_in=100)
    out["Gibbs"] = (
        f"`sample(MCGP(Matern52, Laplace(0.1)), X, y, GibbsSampling(n_samples="
        f"{args.gibbs_samples}, n_chains=4, burn_in=100))`, n = 100",
        lambda: jax.block_until_ready(agp.sample(
            agp.MCGP(agp.kernels.Matern52(lengthscale=1.0, variance=1.0), L.Laplace(scale=0.1)),
            Xg, yg, gibbs, key=jax.random.key(0)).f))
    return out


def busy_loops(n: int) -> list:
    """``n`` processes that each keep a core busy until killed."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.5)  # let the scheduler spread them
    return procs


def stop(procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def cell(run, repeats: int, cap_s: float) -> dict:
    """Up to ``repeats`` timed runs (fewer once they pass ``cap_s`` in all): their median."""
    times = []
    while len(times) < repeats and sum(times) < cap_s:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"median": float(np.median(times)), "times": times, "load": os.getloadavg()[0]}


def measure(cases, args) -> dict:
    """{(fit, mode, state): [cell per round]}; rounds interleave idle and busy."""
    res = {}
    for name, (_, run) in cases.items():
        t0 = time.perf_counter()
        run()  # compile
        print(f"{name}: compiled and ran once in {time.perf_counter() - t0:.1f} s", flush=True)
    for r in range(args.rounds):
        for state in ("idle", "busy"):
            procs = busy_loops(args.busy) if state == "busy" else []
            try:
                for mode, threads in MODES.items():
                    runtime.set_blas_threads(threads)
                    for name, (_, run) in cases.items():
                        # the whole case inside the library's limit, as agp.fit runs
                        c = cell(runtime.limits(run), args.repeats, args.cap)
                        res.setdefault((name, mode, state), []).append(c)
                        print(f"round {r + 1} {state:4s} {mode:8s} {name:9s} "
                              f"{c['median']:8.3f} s ({len(c['times'])} runs, load "
                              f"{c['load']:.2f})", flush=True)
            finally:
                stop(procs)
                runtime.set_blas_threads(POLICY.blas_threads)
    return res


def body(cases, res, args) -> list[str]:
    rows, worst = [], 0.0
    for name in cases:
        for mode in MODES:
            med = {s: float(np.median([c["median"] for c in res[name, mode, s]]))
                   for s in ("idle", "busy")}
            q = ratio(med["busy"], med["idle"])
            pairs = zip(res[name, mode, "idle"], res[name, mode, "busy"], strict=True)
            per_round = ", ".join(fmt(ratio(b["median"], i["median"]), ".2f") for i, b in pairs)
            if mode == "policy":
                worst = max(worst, q)
            rows.append([name, mode, fmt(med["idle"], ".3f"), fmt(med["busy"], ".3f"),
                         fmt(q, ".2f"), per_round])
    threads = (f"{POLICY.blas_threads} BLAS thread(s)" if POLICY.blas_threads else
               "BLAS pools left alone")
    verdict = "**met**" if worst <= TARGET else "**not met**"
    return [
        "| fit | what |", "|---|---|",
        *(f"| {k} | {d} |" for k, (d, _) in cases.items()), "",
        f"**Modes.** *policy*: the limit augmentedgp applies inside its calls ({threads}: "
        f"{POLICY.blas_reason}); *no limit*: {CORES} BLAS threads (one per core, OpenBLAS's "
        "default and the behaviour before the policy). XLA's own CPU thread pool is at its "
        f"default in both. *busy*: {args.busy} busy-loop process(es) started by the script. "
        f"Each cell: up to {args.repeats} runs after compilation (fewer past {args.cap:g} s), "
        f"median; {args.rounds} round(s), idle and busy interleaved; the table shows the "
        "median over rounds and each round's busy / idle ratio.", "",
        markdown_table(["fit", "BLAS", "idle (s)", "busy (s)", "busy / idle",
                        "busy / idle per round"], rows), "",
        f"Target: every fit under the policy at most {TARGET}x slower with a core busy -> "
        f"{verdict} (worst ratio {worst:.2f})."]


def main():
    p = H.parser(__doc__)
    p.add_argument("--busy", type=int, default=1, help="busy-loop processes")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None, help="runs per cell")
    p.add_argument("--cap", type=float, default=None, help="seconds per cell (then stop)")
    p.add_argument("--n-exact", type=int, default=None)
    p.add_argument("--n-svgp", type=int, default=None)
    p.add_argument("--svgp-iter", type=int, default=None)
    p.add_argument("--gibbs-samples", type=int, default=None)
    args = H.parse(p, {"rounds": 1, "repeats": 2, "cap": 10.0, "n_exact": 300,
                       "n_svgp": 2000, "svgp_iter": 200, "gibbs_samples": 200},
                   {"rounds": 3, "repeats": 3, "cap": 20.0, "n_exact": 500,
                    "n_svgp": 5000, "svgp_iter": 300, "gibbs_samples": 500})
    cases = fits(args)
    res = measure(cases, args)
    text = H.report("Fits under load: the BLAS thread policy",
                    [f"Cores: {CORES}. " + __doc__.strip().splitlines()[0]],
                    body(cases, res, args))
    H.finish(args, text, {f"{k[0]} | {k[1]} | {k[2]}": v for k, v in res.items()})


if __name__ == "__main__":
    main()
