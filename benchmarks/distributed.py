"""Scale-out benchmark: ``augmentedgp.distributed.fit`` (augmented VI as map-reduce over
partitions on a Dask cluster, or sharded over JAX devices) -- time per CAVI iteration.

    python benchmarks/distributed.py --quick            # n = 1e5, 2e5; 1-2 workers; no write
    python benchmarks/distributed.py --write            # full run (~30 min), writes RESULTS.md
    python benchmarks/distributed.py --data-dir /tmp/agp-distributed-bench --threads 1

Problem: logistic likelihood (``agp.likelihoods.Logistic()``), labels in {-1, 1} drawn from
sigmoid(f(x)) of a smooth synthetic latent f, x ~ U[-2, 2]^4 (d = 4), SVGP with M = 100
inducing points (uniform in the box, fixed: ``agp.params.fixed(agp.params.real(Z))``), RBF
kernel, ``agp.AnalyticVI()`` (full batch), 3 iterations (``tol=0``, ``chunk_size=1``, so
that ``History.wall_time`` has one entry per iteration). The first iteration compiles (on
each worker); "per iteration" is the median of the later ones.

Measured:

1. n = 1e5, 1e6, 1e7 rows written once as npz files of 2e5 rows (generated file by file,
   never all in memory; cached under ``--data-dir`` and reused), streamed (each file read
   on a worker at every pass) on a ``LocalCluster`` of 2 single-threaded worker processes;
2. n = 1e6 streamed with 1, 2 and 4 worker processes (speed-up over 1 worker);
3. in-memory (X, y): single-process ``agp.fit`` against ``distributed.fit`` with numpy
   (X, y) persisted on 1 and 2 workers (the ratio is Dask's overhead, plus parallelism);
4. one 2e5-row partition's statistics (``distributed._statistics``, jitted, after a
   warm-up) in this process, and the bytes a partition sends back (pickled ``Statistics``);
5. JAX devices on one host (a subprocess with
   ``XLA_FLAGS=--xla_force_host_platform_device_count=4``): ``distributed.fit(...,
   devices=k)`` for k = 1, 2, 4 at n = 1e5 in memory, and ``agp.fit`` there;
6. a cluster-scale estimate from 4 (written into the RESULTS section).

``--threads 1`` (default) makes XLA and BLAS single-threaded in this process, in the Dask
workers and in the subprocess (environment variables set before JAX starts); nothing is
pinned to a CPU: the workers need the cores. ``--threads 0`` keeps the libraries' defaults.
"""

from __future__ import annotations

import os
import sys

# This file is named like the dask.distributed package: take its folder off the front of
# sys.path (and put it at the end, for _threads / _report) so that ``import distributed``
# -- here, in augmentedgp.distributed and in the spawned workers -- finds the package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

from _threads import arg  # noqa: E402

THREADS = int(arg(sys.argv[1:], "--threads", "1"))
if THREADS == 1:  # before JAX / numpy start; inherited by the workers and the subprocess
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"
    # (only ``--`` flags: XLA stops reading XLA_FLAGS at a token without ``--``, so a bare
    # ``intra_op_parallelism_threads=1`` would silently drop the device count set below)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false").strip()
if "--devices-child" in sys.argv:  # item 5: 4 host devices, before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4").strip()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _report import REPO, checkout, cpu_model, fmt, markdown_table, ratio, write_results  # noqa: E402

sys.path.insert(0, str(REPO / "src"))
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import augmentedgp as agp  # noqa: E402
from augmentedgp.training import distributed  # noqa: E402

# the scheduler's HTTP server (dashboard off) moves off a busy port 8787 with a warning
warnings.filterwarnings("ignore", "Port .* is already in use")

BEGIN = "<!-- BEGIN distributed.py (generated, overwritten on each run) -->"
END = "<!-- END distributed.py -->"
D, M, PART_ROWS, ITERS, SEED = 4, 100, 200_000, 3, 0
# devices=: the carry comes back from the first chunk with a NamedSharding (it went in with
# a SingleDeviceSharding), so the second chunk compiles again; 5 iterations keep that one
# out of the median of the later ones
DEV_ITERS = 5


# --- data ------------------------------------------------------------------------------


def latent(X):
    return np.sin(2.0 * X[:, 0]) + np.cos(1.5 * X[:, 1]) * X[:, 2] - 0.5 * X[:, 3] ** 2 + 0.5


def make_part(i: int, rows: int):
    """Partition i: (X, y) from its own seed, so any subset is generated without the rest."""
    rng = np.random.default_rng([SEED, i])
    X = rng.uniform(-2.0, 2.0, (rows, D))
    p = 1.0 / (1.0 + np.exp(-2.0 * latent(X)))
    y = np.where(rng.uniform(size=rows) < p, 1.0, -1.0)
    return X, y


def _save(path: Path, X, y):
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, X=X, y=y)
    os.replace(tmp, path)


def data_dir(root: Path, n: int) -> Path:
    """``root/n{n}``: n rows as npz files of PART_ROWS rows (links into ``root/parts``,
    written once); n < PART_ROWS is one file of its own."""
    out = root / f"n{n}"
    if out.is_dir() and len(list(out.glob("*.npz"))) == max(1, n // PART_ROWS):
        return out
    out.mkdir(parents=True, exist_ok=True)
    if n < PART_ROWS:
        if not (out / "part-00000.npz").exists():
            _save(out / "part-00000.npz", *make_part(10_000 + n, n))
        return out
    if n % PART_ROWS:
        raise ValueError(f"n = {n} is not a multiple of {PART_ROWS}")
    parts = root / "parts"
    parts.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n // PART_ROWS):
        src = parts / f"part-{i:05d}.npz"
        if not src.exists():
            _save(src, *make_part(i, PART_ROWS))
        link = out / src.name
        if not link.exists():
            link.symlink_to(src)
    print(f"  data {out}: {n // PART_ROWS} files ({time.perf_counter() - t0:.1f} s)",
          flush=True)
    return out


def load(root: Path, n: int):
    """The n rows of ``data_dir(root, n)`` in memory."""
    files = sorted(data_dir(root, n).glob("*.npz"))
    Xs, ys = [], []
    for f in files:
        with np.load(f) as z:
            Xs.append(z["X"])
            ys.append(z["y"])
    return np.concatenate(Xs), np.concatenate(ys)


def make_model():
    Z = np.random.default_rng(SEED + 1).uniform(-2.0, 2.0, (M, D))
    return agp.SVGP(agp.kernels.RBF(lengthscale=1.0, variance=1.0), agp.likelihoods.Logistic(),
                    agp.params.fixed(agp.params.real(Z)))


# --- timing ----------------------------------------------------------------------------


def times(post):
    """(first iteration, median of the later ones) from the history's cumulative times."""
    t = np.diff(np.concatenate([[0.0], np.asarray(post.history.wall_time, float)]))
    return float(t[0]), (float(np.median(t[1:])) if t.size > 1 else None), t.round(4).tolist()


@contextlib.contextmanager
def cluster(workers: int):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as c, Client(c) as cl:
        yield cl


def dask_fit(data, client, max_iter=ITERS):
    t0 = time.perf_counter()
    post = distributed.fit(make_model(), data, agp.AnalyticVI(), client=client,
                           max_iter=max_iter, tol=0.0, chunk_size=1)
    total = time.perf_counter() - t0
    first, per, each = times(post)
    return dict(first=first, per_iter=per, times=each, total=total,
                setup=total - float(post.history.wall_time[-1]),
                objective=float(post.history.objective[-1]))


def local_fit(X, y, max_iter=ITERS):
    t0 = time.perf_counter()
    post = agp.fit(make_model(), X, y, agp.AnalyticVI(), max_iter=max_iter, tol=0.0,
                   chunk_size=1)
    total = time.perf_counter() - t0
    first, per, each = times(post)
    return dict(first=first, per_iter=per, times=each, total=total,
                objective=float(post.history.objective[-1]))


def log(what, r):
    print(f"  {what}: first {r['first']:.2f} s, per iteration {fmt(r['per_iter'], '.3f')} s, "
          f"objective {r['objective']:.6g}, iterations {r['times']}", flush=True)


# --- the measurements ------------------------------------------------------------------


def streamed(root, ns, workers, budget_s):
    """Item 1: per n, streamed npz on `workers` processes."""
    out = {}
    for n in ns:
        iters = ITERS
        prev = max((m for m in out if out[m]["per_iter"]), default=None)
        if prev is not None:
            guess = out[prev]["per_iter"] * n / prev
            if guess * ITERS > budget_s:
                iters = 1
                print(f"  n = {n}: estimated {guess:.0f} s per iteration, running 1 only",
                      flush=True)
        path = data_dir(root, n)
        with cluster(workers) as client:
            out[n] = dask_fit(str(path), client, iters)
        out[n]["estimate"] = None if iters > 1 else guess
        log(f"streamed n = {n}, {workers} workers", out[n])
    return out


def scaling(root, n, worker_counts):
    out = {}
    path = str(data_dir(root, n))
    for w in worker_counts:
        with cluster(w) as client:
            out[w] = dask_fit(path, client)
        log(f"streamed n = {n}, {w} workers", out[w])
    return out


def in_memory(root, ns, worker_counts):
    out = {}
    for n in ns:
        X, y = load(root, n)
        out[(n, "agp.fit")] = r = local_fit(X, y)
        log(f"in memory n = {n}, agp.fit", r)
        for w in worker_counts:
            with cluster(w) as client:
                out[(n, w)] = r = dask_fit((X, y), client)
            log(f"in memory n = {n}, distributed.fit {w} workers", r)
    return out


def partition_cost(root, repeats=5):
    """Item 4: one PART_ROWS-row partition's statistics in this process, and their size."""
    import equinox as eqx

    from augmentedgp.core.params import partition_trainable

    model = make_model()
    inference = agp.AnalyticVI()
    params, static = partition_trainable(model)
    hyp, q = eqx.tree_at(lambda m: m.q, params, None), params.q
    with np.load(sorted(data_dir(root, PART_ROWS).glob("*.npz"))[0]) as z:
        X, y = distributed._prepare((z["X"], z["y"]), model.likelihood, D, "0")
    w = np.ones(X.shape[0])
    key = jax.random.key(0)
    out = {}
    for need_grad in (True, False):
        run = lambda g=need_grad: jax.block_until_ready(distributed._statistics(
            hyp, q, static, inference, X, y, w, key, g))
        t0 = time.perf_counter()
        stats = run()
        first = time.perf_counter() - t0
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t0)
        out["grad" if need_grad else "no_grad"] = dict(first=first, median=float(np.median(ts)))
        if need_grad:
            msg = distributed._to_numpy(stats)
            leaves = jax.tree_util.tree_leaves(msg)
            out["bytes_pickled"] = len(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
            out["bytes_arrays"] = int(sum(np.asarray(a).nbytes for a in leaves))
            out["n_hyper"] = int(sum(np.size(a) for a in jax.tree_util.tree_leaves(msg.grad)))
            out["leaves"] = [list(np.shape(a)) for a in leaves]
    out["rows"] = int(X.shape[0])
    return out


def devices_child(n, root):
    """Item 5, in the subprocess with 4 host devices: prints one JSON line."""
    X, y = load(root, n)
    res = {"devices": len(jax.devices())}
    for k in (1, 2, 4):
        post = distributed.fit(make_model(), (X, y), agp.AnalyticVI(), devices=k,
                               max_iter=DEV_ITERS, tol=0.0, chunk_size=1)
        first, per, each = times(post)
        res[str(k)] = dict(first=first, per_iter=per, times=each,
                           objective=float(post.history.objective[-1]))
    res["agp.fit"] = local_fit(X, y, DEV_ITERS)
    print("RESULT " + json.dumps(res), flush=True)


def devices(root, n):
    data_dir(root, n)
    env = dict(os.environ)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--devices-child", str(n),
           "--data-dir", str(root), "--threads", str(THREADS)]
    # this process' XLA_FLAGS were set by the --threads code above; the child sets its own
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((s for s in proc.stdout.splitlines() if s.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise RuntimeError(f"the devices subprocess failed (exit {proc.returncode})")
    res = json.loads(line[len("RESULT "):])
    for k in ("1", "2", "4", "agp.fit"):
        log(f"devices n = {n}, {k}", res[k])
    return res


# --- report ----------------------------------------------------------------------------


def sci(n):
    e = int(np.floor(np.log10(n)))
    m = n / 10**e
    return f"{m:g}e{e}" if m != 1 else f"1e{e}"


def estimate(part, part_time, per_task_s, bandwidth=1e9, n=10**9, workers=100):
    """Item 6: (text lines) the cluster-scale estimate from the measured partition cost."""
    P = n // PART_ROWS
    msg = part["bytes_pickled"]
    compute = P / workers * part_time
    comm = P * msg / bandwidth
    sched = P * per_task_s
    w_cross = part_time * bandwidth / msg  # workers at which P/W * t_p = P * msg / B
    return [
        "### Cluster scale estimate",
        "",
        f"*Measured* (item 4, this machine, one core): the statistics of one {sci(PART_ROWS)}-"
        f"row partition (value, gradient, s1, S2 with M = {M}) take t_p = {part_time:.2f} s "
        f"and their message is {msg / 1e3:.1f} kB pickled ({part['bytes_arrays']} B of array "
        f"data: 8 (M^2 + M + 1 + {part['n_hyper']}) with {part['n_hyper']} hyperparameter "
        "gradient entries), independent of the partition's rows.",
        "",
        f"*Assumed*: n = {sci(n)} rows in P = n / {sci(PART_ROWS)} = {P} partitions on W = "
        f"{workers} workers with cores as fast as this one, one partition per task, files "
        f"read at disk / object-store speed hidden behind compute, a driver link of "
        f"{bandwidth / 1e9:g} GB/s, and a scheduler cost of ~{per_task_s * 1e3:.0f} ms per "
        "task (the order of magnitude dask documents; not measured here -- item 3's gap "
        "between `distributed.fit` on 1 worker and `agp.fit` is larger, because it also "
        "holds the per-iteration round trip, pickling and this shared machine's noise).",
        "",
        f"- compute: P / W * t_p = {P} / {workers} * {part_time:.2f} s = **{compute:.0f} s "
        "per iteration** (the workers run in parallel; the driver's update is O(M^3), "
        "negligible);",
        f"- communication into the driver: P * {msg / 1e3:.0f} kB / {bandwidth / 1e9:g} GB/s"
        f" = {comm:.2f} s per iteration (plus summing P (M, M) arrays: ~{P * M * M / 1e9:.2f}"
        " G additions, well under a second);",
        f"- scheduling: P tasks * {per_task_s * 1e3:.0f} ms = {sched:.0f} s per iteration on "
        "the scheduler, overlapped with compute;",
        f"- communication starts to dominate only when P/W * t_p < P * msg / B, i.e. W > t_p "
        f"B / msg = {w_cross:.0f} workers for {sci(PART_ROWS)}-row partitions (whatever n); "
        f"scheduling dominates first, at W > t_p / (per-task cost) = "
        f"{part_time / per_task_s:.0f} workers. Larger partitions move both thresholds up "
        "in proportion (t_p grows with the rows, the message does not).",
    ]


def report(args, res, quick):
    cores = os.cpu_count()
    lines = [
        "## Distributed: augmentedgp.distributed.fit (Dask map-reduce, JAX devices)",
        "",
        f"`python benchmarks/distributed.py{' --quick' if quick else ''}"
        f"{' --write' if args.write else ''}` on {datetime.date.today()}{checkout()}, "
        f"{cpu_model()}, {cores} cores, Python {platform.python_version()}, jax "
        f"{jax.__version__}, dask {res['dask']}; "
        f"{'XLA / BLAS single-threaded in every process' if THREADS == 1 else 'default threads'}"
        ". **The machine has only 2 cores and was shared with another user's test runs "
        "during the measurement: timings are noisy, read the ratios.** Logistic SVGP, "
        f"d = {D}, M = {M} fixed inducing points, RBF kernel, `AnalyticVI()` (full batch), "
        f"{ITERS} iterations with `tol=0, chunk_size=1`; 'first' is the first iteration "
        "(it includes compilation on the workers), 'per iter' the median of the later "
        "iterations (`History.wall_time` differences; the cluster start and reading the "
        "partitions' sizes are not included).",
        "",
        f"### 1. Streamed npz partitions of {sci(PART_ROWS)} rows, LocalCluster of 2 worker "
        "processes",
        "",
    ]
    rows = []
    for n, r in res["streamed"].items():
        per = r["per_iter"]
        note = ""
        if per is None:
            note = (f"1 iteration only (estimated {r['estimate']:.0f} s each from the "
                    "previous n); 'per iter' = first")
            per = r["first"]
        rows.append([sci(n), max(1, n // PART_ROWS), fmt(r["first"], ".2f"), fmt(per, ".2f"),
                     f"{n / per:,.0f}", note])
    lines += [markdown_table(["n", "files", "first (s)", "per iter (s)", "rows / s", "note"],
                             rows), ""]
    sc = res["scaling"]
    n2 = res["scaling_n"]
    lines += [f"### 2. Workers: n = {sci(n2)} streamed, 1 / 2 / 4 worker processes "
              f"(this machine has {cores} cores: 4 processes oversubscribe them)", ""]
    base = sc[min(sc)]["per_iter"]
    lines += [markdown_table(["workers", "first (s)", "per iter (s)", "speed-up vs 1"],
                             [[w, fmt(r["first"], ".2f"), fmt(r["per_iter"], ".2f"),
                               fmt(ratio(base, r["per_iter"]), ".2f")] for w, r in sc.items()]),
              ""]
    mem = res["in_memory"]
    lines += ["### 3. In-memory (X, y): single-process `agp.fit` vs `distributed.fit` "
              "(numpy arrays persisted on the workers, 2 partitions per worker)", "",
              "The single process runs on one core (single-threaded XLA), each worker on one: "
              "with 1 worker the ratio is Dask's overhead alone, with 2 workers it also has "
              "the parallel speed-up.", ""]
    rows = []
    for (n, how), r in mem.items():
        ref = mem[(n, "agp.fit")]["per_iter"]
        rows.append([sci(n), "agp.fit" if how == "agp.fit" else f"distributed.fit, {how} "
                     f"worker{'s' if how > 1 else ''}", fmt(r["first"], ".2f"),
                     fmt(r["per_iter"], ".3f"), fmt(ratio(r["per_iter"], ref), ".2f"),
                     f"{r['objective']:.6g}"])
    lines += [markdown_table(["n", "method", "first (s)", "per iter (s)", "/ agp.fit",
                              "objective after 3 it."], rows), ""]
    part = res["partition"]
    lines += [f"### 4. One partition ({sci(part['rows'])} rows) in one process", "",
              markdown_table(
                  ["statistics", "first call (s, compiles)", "median of 5 (s)", "rows / s"],
                  [["value + gradient + s1 + S2", fmt(part["grad"]["first"], ".2f"),
                    fmt(part["grad"]["median"], ".3f"),
                    f"{part['rows'] / part['grad']['median']:,.0f}"],
                   ["value + s1 + S2 (no gradient)", fmt(part["no_grad"]["first"], ".2f"),
                    fmt(part["no_grad"]["median"], ".3f"),
                    f"{part['rows'] / part['no_grad']['median']:,.0f}"]]),
              "",
              f"Message per partition and iteration (the `Statistics` as numpy): "
              f"{part['bytes_pickled']:,} bytes pickled, {part['bytes_arrays']:,} bytes of "
              f"arrays (leaf shapes {part['leaves']}).", ""]
    dv = res["devices"]
    nd = res["devices_n"]
    ref = dv["agp.fit"]["per_iter"]
    lines += [f"### 5. JAX devices on one host: n = {sci(nd)} in memory, "
              "`XLA_FLAGS=--xla_force_host_platform_device_count=4` (a subprocess; "
              f"{cores} physical cores); {DEV_ITERS} iterations here, 'per iter' the median of "
              "iterations 2-5: with `devices=` the second chunk compiles again (the carry "
              "returns from the first with a `NamedSharding` where it entered with a "
              "`SingleDeviceSharding`), see the iteration times in the script's output", "",
              markdown_table(["executor", "first (s)", "per iter (s)", "/ agp.fit"],
                             [[f"devices={k}" if k != "agp.fit" else "agp.fit (same process)",
                               fmt(dv[k]["first"], ".2f"), fmt(dv[k]["per_iter"], ".3f"),
                               fmt(ratio(dv[k]["per_iter"], ref), ".2f")]
                              for k in ("1", "2", "4", "agp.fit")]), ""]
    # dask per-task overhead: in-memory 1 worker at the smallest n, minus the compute
    lines += estimate(part, part["grad"]["median"], res["per_task_s"])
    return "\n".join(lines)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return [_jsonable(v) for v in x] if isinstance(x, list | tuple) else x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e5, 2e5; 1 and 2 workers")
    ap.add_argument("--write", action="store_true", help="rewrite this section of RESULTS.md")
    ap.add_argument("--data-dir", default="/tmp/agp-distributed-bench")
    ap.add_argument("--threads", type=int, default=1, help="1: single-threaded XLA / BLAS")
    ap.add_argument("--budget", type=float, default=600.0,
                    help="seconds allowed for the largest n's iterations (else 1 iteration)")
    ap.add_argument("--devices-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also dump the raw numbers here")
    args = ap.parse_args()
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.devices_child is not None:
        devices_child(args.devices_child, root)
        return

    import dask

    if args.quick:
        ns, n2, workers, mem_ns = [10**5, 2 * 10**5], 2 * 10**5, [1, 2], [10**5, 2 * 10**5]
    else:
        ns, n2, workers, mem_ns = [10**5, 10**6, 10**7], 10**6, [1, 2, 4], [10**5, 10**6]
    nd = 10**5
    res = {"dask": dask.__version__, "scaling_n": n2, "devices_n": nd}
    t0 = time.perf_counter()
    print("4. one partition", flush=True)
    res["partition"] = part = partition_cost(root)
    print(f"  {json.dumps(part)}", flush=True)
    print("1. streamed, 2 workers", flush=True)
    res["streamed"] = streamed(root, ns, 2, args.budget)
    print("2. workers", flush=True)
    res["scaling"] = scaling(root, n2, workers)
    print("3. in memory", flush=True)
    res["in_memory"] = in_memory(root, mem_ns, [1, 2])
    print("5. JAX devices (subprocess)", flush=True)
    res["devices"] = devices(root, nd)
    res["per_task_s"] = 1e-3  # assumed (dask's documented order of magnitude), not measured
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(_jsonable(res), indent=1))
    text = report(args, res, args.quick)
    print(text)
    if args.write:
        write_results(text, BEGIN, END)


if __name__ == "__main__":
    main()
