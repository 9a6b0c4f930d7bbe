"""Scale-out benchmark: ``augmentedgp.distributed.fit`` (augmented VI as map-reduce over
partitions on a Dask cluster, or sharded over JAX devices) -- time per CAVI iteration of a
logistic SVGP (M = 100 fixed inducing points, d = 4, ``AnalyticVI``, synthetic data).

Items: 1. npz partitions streamed on a LocalCluster of 2 workers, n up to 1e7; 2. 1, 2 and 4
workers; 3. in memory, ``agp.fit`` against ``distributed.fit``; 4. one partition's statistics
and message size; 5. JAX host devices (a subprocess); 6. a cluster-scale estimate from 4.
``--threads 1`` (default): XLA and BLAS single-threaded in every process.

    python benchmarks/distributed.py            # full run (~30 min), writes RESULTS.md
    python benchmarks/distributed.py --quick    # n = 2e4, 5e4; 1-2 workers; no write
"""

from __future__ import annotations

import os
import sys

# This file is named like the dask.distributed package: its folder goes from the front of
# sys.path to the end, so that ``import distributed`` (here, in augmentedgp and in the
# workers) finds the package and ``import harness`` still finds the harness.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]
if "--devices-child" in sys.argv:  # item 5: 4 host devices, before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4").strip()

import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pickle  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import harness as H  # noqa: E402

H.start("distributed.py")  # env variables set here are inherited by workers and subprocess

import jax  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, markdown_table, ratio  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp.training import distributed  # noqa: E402

warnings.filterwarnings("ignore", "Port .* is already in use")  # the scheduler's HTTP port
D, M, PART_ROWS, ITERS, SEED = 4, 100, 200_000, 3, 0
# devices=: the carry comes back from the first chunk with a NamedSharding (it went in with
# a SingleDeviceSharding), so the second chunk compiles again; 5 iterations keep that one
# out of the median of the later ones
DEV_ITERS = 5


# --- data ----------------------------------------------------------------------------------


def make_part(i, rows):
    """Partition i: (X, y) from its own seed, so any subset is generated without the rest."""
    rng = np.random.default_rng([SEED, i])
    X = rng.uniform(-2.0, 2.0, (rows, D))
    f = np.sin(2.0 * X[:, 0]) + np.cos(1.5 * X[:, 1]) * X[:, 2] - 0.5 * X[:, 3] ** 2 + 0.5
    return X, np.where(rng.uniform(size=rows) < 1.0 / (1.0 + np.exp(-2.0 * f)), 1.0, -1.0)


def save(path, i, rows):
    if not path.exists():
        tmp = path.with_name("." + path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **dict(zip("Xy", make_part(i, rows), strict=True)))
        os.replace(tmp, path)


def data_dir(root, n):
    """``root/n{n}``: n rows as npz files of PART_ROWS rows (links into ``root/parts``,
    written once); n < PART_ROWS is one file of its own."""
    out = root / f"n{n}"
    if out.is_dir() and len(list(out.glob("*.npz"))) == max(1, n // PART_ROWS):
        return out
    out.mkdir(parents=True, exist_ok=True)
    if n < PART_ROWS:
        save(out / "part-00000.npz", 10_000 + n, n)
        return out
    if n % PART_ROWS:
        raise ValueError(f"n = {n} is not a multiple of {PART_ROWS}")
    (root / "parts").mkdir(exist_ok=True)
    for i in range(n // PART_ROWS):
        src = root / "parts" / f"part-{i:05d}.npz"
        save(src, i, PART_ROWS)
        if not (out / src.name).exists():
            (out / src.name).symlink_to(src)
    return out


def load(root, n):
    parts = []
    for f in sorted(data_dir(root, n).glob("*.npz")):
        with np.load(f) as z:
            parts.append((z["X"], z["y"]))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def make_model():
    Z = np.random.default_rng(SEED + 1).uniform(-2.0, 2.0, (M, D))
    return agp.SVGP(agp.kernels.RBF(lengthscale=1.0, variance=1.0), agp.likelihoods.Logistic(),
                    agp.params.fixed(agp.params.real(Z)))


# --- the measurements ----------------------------------------------------------------------


@contextlib.contextmanager
def cluster(workers):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as c, Client(c) as cl:
        yield cl


def run(what, fit, max_iter=ITERS, **kw):
    """A fit of ``max_iter`` iterations: first iteration, median of the later ones."""
    t0 = time.perf_counter()
    post = fit(make_model(), *kw.pop("args"), agp.AnalyticVI(), max_iter=max_iter, tol=0.0,
               chunk_size=1, **kw)
    total = time.perf_counter() - t0
    t = np.diff(np.concatenate([[0.0], np.asarray(post.history.wall_time, float)]))
    r = {"first": float(t[0]), "per_iter": float(np.median(t[1:])) if t.size > 1 else None,
         "times": t.round(4).tolist(), "total": total,
         "setup": total - float(post.history.wall_time[-1]),
         "objective": float(post.history.objective[-1])}
    print(f"  {what}: first {r['first']:.2f} s, per iteration {fmt(r['per_iter'], '.3f')} s, "
          f"objective {r['objective']:.6g}, iterations {r['times']}", flush=True)
    return r


def dask_fit(what, data, workers, max_iter=ITERS):
    with cluster(workers) as client:
        return run(what, distributed.fit, max_iter, args=(data,), client=client)


def streamed(root, ns, workers, budget_s):
    """Item 1: per n, streamed npz on ``workers`` processes (1 iteration only where the
    previous n predicts more than ``budget_s`` for all)."""
    out = {}
    for n in ns:
        prev = max((m for m in out if out[m]["per_iter"]), default=None)
        guess = out[prev]["per_iter"] * n / prev if prev else None
        iters = 1 if guess and guess * ITERS > budget_s else ITERS
        out[n] = dask_fit(f"streamed n = {n}, {workers} workers", str(data_dir(root, n)),
                          workers, iters)
        out[n]["estimate"] = None if iters > 1 else guess
    return out


def partition_cost(root, rows, repeats):
    """Item 4: one partition's statistics in this process, and their size."""
    import equinox as eqx

    params, static = agp.params.partition_trainable(make_model())
    hyp, q = eqx.tree_at(lambda m: m.q, params, None), params.q
    with np.load(sorted(data_dir(root, rows).glob("*.npz"))[0]) as z:
        X, y = distributed._prepare((z["X"], z["y"]), make_model().likelihood, D, "0")
    w, key, out = np.ones(X.shape[0]), jax.random.key(0), {"rows": int(X.shape[0])}
    for grad in (True, False):
        call = lambda g=grad: jax.block_until_ready(distributed._statistics(
            hyp, q, static, agp.AnalyticVI(), X, y, w, key, g))
        out["grad" if grad else "no_grad"] = H.time_call(call, repeats, float("inf"))
        out["repeats"] = repeats
    msg = distributed._to_numpy(call(True))
    leaves = jax.tree_util.tree_leaves(msg)
    out.update(bytes_pickled=len(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)),
               bytes_arrays=int(sum(np.asarray(a).nbytes for a in leaves)),
               n_hyper=int(sum(np.size(a) for a in jax.tree_util.tree_leaves(msg.grad))),
               leaves=[list(np.shape(a)) for a in leaves])
    return out


def devices_child(n, root):
    """Item 5, in the subprocess with 4 host devices: prints one JSON line."""
    X, y = load(root, n)
    res = {"devices": len(jax.devices())}
    for k in (1, 2, 4):
        res[str(k)] = run(f"devices n = {n}, {k}", distributed.fit, DEV_ITERS, args=((X, y),),
                          devices=k)
    res["agp.fit"] = run(f"devices n = {n}, agp.fit", agp.fit, DEV_ITERS, args=(X, y))
    print("RESULT " + json.dumps(res), flush=True)


def devices(root, n, threads):
    data_dir(root, n)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the child sets its own
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--devices-child",
                           str(n), "--data-dir", str(root), "--threads", str(threads)],
                          env=env, capture_output=True, text=True, check=False)
    line = next((s for s in proc.stdout.splitlines() if s.startswith("RESULT ")), None)
    print("\n".join(s for s in proc.stdout.splitlines() if s.startswith("  devices")))
    if proc.returncode or line is None:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise RuntimeError(f"the devices subprocess failed (exit {proc.returncode})")
    return json.loads(line[len("RESULT "):])


# --- report --------------------------------------------------------------------------------


def sci(n):
    e = int(np.floor(np.log10(n)))
    m = n / 10**e
    return f"{m:g}e{e}" if m != 1 else f"1e{e}"


def estimate(part, per_task_s, bandwidth=1e9, n=10**9, workers=100):
    """Item 6: the cluster-scale estimate from the measured partition cost."""
    rows = part["rows"]
    P, msg, t_p = n // rows, part["bytes_pickled"], part["grad"]["median"]
    return [
        "### Cluster scale estimate", "",
        f"*Measured* (item 4, this machine, one core): the statistics of one {sci(rows)}-"
        f"row partition (value, gradient, s1, S2 with M = {M}) take t_p = {t_p:.2f} s and their "
        f"message is {msg / 1e3:.1f} kB pickled ({part['bytes_arrays']} B of array data: 8 "
        f"(M^2 + M + 1 + {part['n_hyper']}) with {part['n_hyper']} hyperparameter gradient "
        "entries), independent of the partition's rows.", "",
        f"*Assumed*: n = {sci(n)} rows in P = {P} partitions on W = {workers} workers with "
        "cores as fast as this one, one partition per task, file reads hidden behind compute, "
        f"a driver link of {bandwidth / 1e9:g} GB/s, and a scheduler cost of "
        f"~{per_task_s * 1e3:.0f} ms per task (dask's documented order of magnitude; not "
        "measured here).", "",
        f"- compute: P / W * t_p = {P} / {workers} * {t_p:.2f} s = **{P / workers * t_p:.0f} s "
        "per iteration** (the driver's update is O(M^3), negligible);",
        f"- communication into the driver: P * {msg / 1e3:.0f} kB / {bandwidth / 1e9:g} GB/s = "
        f"{P * msg / bandwidth:.2f} s per iteration (plus summing P (M, M) arrays: "
        f"~{P * M * M / 1e9:.2f} G additions);",
        f"- scheduling: P tasks * {per_task_s * 1e3:.0f} ms = {P * per_task_s:.0f} s per "
        "iteration on the scheduler, overlapped with compute;",
        f"- communication dominates only when W > t_p B / msg = {t_p * bandwidth / msg:.0f} "
        f"workers for {sci(rows)}-row partitions (whatever n); scheduling first, at W > "
        f"t_p / (per-task cost) = {t_p / per_task_s:.0f} workers. Larger partitions move both "
        "thresholds up in proportion."]


def body(res):
    cores, rows = os.cpu_count(), []
    for n, r in res["streamed"].items():
        per, note = r["per_iter"], ""
        if per is None:
            per, note = r["first"], (f"1 iteration only (estimated {r['estimate']:.0f} s each "
                                     "from the previous n); 'per iter' = first")
        rows.append([sci(n), max(1, n // PART_ROWS), fmt(r["first"], ".2f"), fmt(per, ".2f"),
                     f"{n / per:,.0f}", note])
    sc, mem, part, dv = res["scaling"], res["in_memory"], res["partition"], res["devices"]
    base = sc[min(sc)]["per_iter"]
    mem_rows = [[sci(n), "agp.fit" if how == "agp.fit" else f"distributed.fit, {how} worker"
                 + ("s" if how > 1 else ""), fmt(r["first"], ".2f"), fmt(r["per_iter"], ".3f"),
                 fmt(ratio(r["per_iter"], mem[n, "agp.fit"]["per_iter"]), ".2f"),
                 f"{r['objective']:.6g}"] for (n, how), r in mem.items()]
    part_rows = [[what, fmt(part[k]["first"], ".2f"), fmt(part[k]["median"], ".3f"),
                  f"{part['rows'] / part[k]['median']:,.0f}"]
                 for k, what in (("grad", "value + gradient + s1 + S2"),
                                 ("no_grad", "value + s1 + S2 (no gradient)"))]
    return [
        f"### 1. Streamed npz partitions of up to {sci(PART_ROWS)} rows, LocalCluster of 2 worker "
        "processes", "",
        markdown_table(["n", "files", "first (s)", "per iter (s)", "rows / s", "note"], rows), "",
        f"### 2. Workers: n = {sci(res['scaling_n'])} streamed, "
        f"{' / '.join(map(str, sc))} worker processes (this machine has {cores} cores)", "",
        markdown_table(["workers", "first (s)", "per iter (s)", "speed-up vs 1"],
                       [[w, fmt(r["first"], ".2f"), fmt(r["per_iter"], ".2f"),
                         fmt(ratio(base, r["per_iter"]), ".2f")] for w, r in sc.items()]), "",
        "### 3. In-memory (X, y): single-process `agp.fit` vs `distributed.fit` (numpy arrays "
        "persisted on the workers, 2 partitions per worker)", "",
        "The single process runs on one core (single-threaded XLA), each worker on one: with 1 "
        "worker the ratio is Dask's overhead alone, with 2 workers it also has the parallel "
        "speed-up.", "",
        markdown_table(["n", "method", "first (s)", "per iter (s)", "/ agp.fit",
                        f"objective after {ITERS} it."], mem_rows), "",
        f"### 4. One partition ({sci(part['rows'])} rows) in one process", "",
        markdown_table(["statistics", "first call (s, compiles)",
                        f"median of {part['repeats']} (s)", "rows / s"],
                       part_rows), "",
        f"Message per partition and iteration (the `Statistics` as numpy): "
        f"{part['bytes_pickled']:,} bytes pickled, {part['bytes_arrays']:,} bytes of arrays "
        f"(leaf shapes {part['leaves']}).", "",
        f"### 5. JAX devices on one host: n = {sci(res['devices_n'])} in memory, "
        "`XLA_FLAGS=--xla_force_host_platform_device_count=4` (a subprocess; "
        f"{cores} physical cores); {DEV_ITERS} iterations, 'per iter' the median of iterations "
        "2-5 (with `devices=` the second chunk compiles again: the carry returns from the "
        "first with a `NamedSharding`)", "",
        markdown_table(["executor", "first (s)", "per iter (s)", "/ agp.fit"],
                       [[f"devices={k}" if k != "agp.fit" else "agp.fit (same process)",
                         fmt(dv[k]["first"], ".2f"), fmt(dv[k]["per_iter"], ".3f"),
                         fmt(ratio(dv[k]["per_iter"], dv["agp.fit"]["per_iter"]), ".2f")]
                        for k in ("1", "2", "4", "agp.fit")]), "",
        *estimate(part, res["per_task_s"])]


def main():
    p = H.parser(__doc__)
    p.add_argument("--data-dir", default="/tmp/agp-distributed-bench")
    p.add_argument("--budget", type=float, default=600.0,
                   help="seconds allowed for the largest n's iterations (else 1 iteration)")
    p.add_argument("--devices-child", type=int, default=None, help="(internal)")
    args = H.parse(p, {}, {})
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.devices_child is not None:
        return devices_child(args.devices_child, root)
    import dask

    big = not args.quick
    ns = [10**5, 10**6, 10**7] if big else [2 * 10**4, 5 * 10**4]
    n2, workers = (10**6, [1, 2, 4]) if big else (5 * 10**4, [1, 2])
    res = {"dask": dask.__version__, "scaling_n": n2, "devices_n": 10**5 if big else 2 * 10**4,
           "per_task_s": 1e-3}
    print("4. one partition", flush=True)
    res["partition"] = partition_cost(root, PART_ROWS if big else 5 * 10**4, 5 if big else 3)
    print("1. streamed, 2 workers", flush=True)
    res["streamed"] = streamed(root, ns, 2, args.budget)
    print("2. workers", flush=True)
    path = str(data_dir(root, n2))
    res["scaling"] = {w: dask_fit(f"streamed n = {n2}, {w} workers", path, w) for w in workers}
    print("3. in memory", flush=True)
    res["in_memory"] = {}
    for n in ([10**5, 10**6] if big else [2 * 10**4]):
        X, y = load(root, n)
        res["in_memory"][n, "agp.fit"] = run(f"in memory n = {n}, agp.fit", agp.fit,
                                             args=(X, y))
        for w in (1, 2):
            res["in_memory"][n, w] = dask_fit(f"in memory n = {n}, {w} workers", (X, y), w)
    print("5. JAX devices (subprocess)", flush=True)
    res["devices"] = devices(root, res["devices_n"], H.THREADS)
    intro = [f"dask {res['dask']}. Logistic SVGP, d = {D}, M = {M} fixed inducing points, RBF "
             f"kernel, `AnalyticVI()` (full batch), {ITERS} iterations with `tol=0, "
             "chunk_size=1`; 'first' is the first iteration (it includes compilation on the "
             "workers), 'per iter' the median of the later iterations (`History.wall_time` "
             "differences; the cluster start and reading the partitions' sizes are not "
             f"included). XLA / BLAS threads as below in every process (workers and "
             "subprocess included)."]
    text = H.report("Distributed: augmentedgp.distributed.fit (Dask map-reduce, JAX devices)",
                    intro, body(res), H.versions("dask", "distributed"))
    H.finish(args, text, res)


if __name__ == "__main__":
    main()
