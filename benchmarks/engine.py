"""The cost of one AnalyticSVI iteration, side by side with GPflow and a hand-written floor.

Logistic SVGP, M = 100 inducing inputs, batch 100, d = 8, n = 20,000 synthetic points,
one thread (``--threads 1``), float64. Iterations per second of:

- augmentedgp ``AnalyticSVI`` with the hyperparameters (kernel, inducing inputs) learned
  every step (``hyper_every=1``), every 10th step, and never between two hyperparameter
  steps (the q-only natural step: ``hyper_every`` larger than the run);
- a hand-written pure-JAX q-only step (whitened natural parameters, Pólya-Gamma sites, no
  objective value, no checks): the floor of the q-only step on this machine, two triangular
  solves and one Cholesky of size 100;
- GPflow SVGP (whitened) with Adam, and with natural gradients + Adam, as its notebooks
  train it (``tf.function`` step over ``tf.data`` minibatches).

Wall-clock it/s and process-time it/s (CPU time of this process: less sensitive to other
processes on a shared machine) are both reported; ratios are taken within one run.

    /work/peers-venv/bin/python benchmarks/engine.py            # writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/engine.py --quick    # fewer iterations
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import harness as H

H.start("engine.py", threads=1, peers=("gpflow",))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import gpflow, markdown_table  # noqa: E402
from jax import lax  # noqa: E402

import augmentedgp as agp  # noqa: E402

p = H.parser(__doc__)
p.add_argument("--steps", type=int, default=None, help="iterations per timed run")
p.add_argument("--repeats", type=int, default=None)
args = H.parse(p, quick=dict(steps=500, repeats=2), full=dict(steps=3000, repeats=5))

N, D, M, B = 20_000, 8, 100, 100
rng = np.random.default_rng(0)
X = rng.normal(size=(N, D))
y = (np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(float)
Z = X[rng.choice(N, M, replace=False)]


def timed(run):
    """(wall it/s, process it/s): the best of ``repeats`` runs of ``args.steps`` iterations
    after one untimed run (compilation)."""
    run()
    walls, cpus = [], []
    for _ in range(args.repeats):
        w, c = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return args.steps / min(walls), args.steps / min(cpus)


def agp_run(hyper_every):
    model = agp.SVGP(agp.kernels.RBF(lengthscale=np.ones(D)), agp.likelihoods.Logistic(), Z)
    return lambda: agp.fit(model, X, y, agp.AnalyticSVI(B), max_iter=args.steps, tol=0.0,
                           chunk_size=args.steps, hyper_every=hyper_every).history.objective


def floor_run():
    """The q-only natural step written out: whitened natural parameters (theta1, P), the
    Pólya-Gamma sites in closed form ([Wenzel2019, eq. 12]), fixed kernel."""
    Xj, yj, Zj = jnp.asarray(X), jnp.asarray(y), jnp.asarray(Z)

    def k(A, C):
        d2 = jnp.sum(A**2, 1)[:, None] + jnp.sum(C**2, 1)[None] - 2 * A @ C.T
        return jnp.exp(-0.5 * jnp.maximum(d2, 0.0))

    L = jnp.linalg.cholesky(k(Zj, Zj) + 1e-8 * jnp.eye(M))
    perm = jnp.asarray(rng.permutation(N))

    def step(carry, t):
        theta1, P = carry
        rows = lax.dynamic_slice(perm, ((t % (N // B)) * B,), (B,))
        A = jax.scipy.linalg.solve_triangular(L, k(Zj, Xj[rows]), lower=True)
        Lp = jnp.linalg.cholesky(P)
        mean = A.T @ jax.scipy.linalg.cho_solve((Lp, True), theta1)
        V = jax.scipy.linalg.solve_triangular(Lp, A, lower=True)
        c = jnp.sqrt(mean**2 + 1.0 - jnp.sum(A**2, 0) + jnp.sum(V**2, 0))
        gamma = 0.5 * jnp.tanh(0.5 * c) / c
        rho, s = 0.1, N / B
        target1, targetP = s * A @ (yj[rows] - 0.5), jnp.eye(M) + s * (A * gamma) @ A.T
        return ((1 - rho) * theta1 + rho * target1, (1 - rho) * P + rho * targetP), mean[0]

    run = jax.jit(lambda c: lax.scan(step, c, jnp.arange(args.steps)))
    c0 = (jnp.zeros(M), jnp.eye(M))
    return lambda: jax.block_until_ready(run(c0))


def gpflow_run(scheme):
    data = SimpleNamespace(X=X, y=y, n=N)
    lik = gpflow.likelihoods.Bernoulli(invlink=H.tf.sigmoid)
    runner = H.GpflowRunner(data, H.gpflow_svgp(Z, np.ones(D), lik, N), scheme,
                            predict=None, batch=B)

    def run():
        for _ in range(args.steps):
            runner.step()

    return run


configs = {
    "augmentedgp AnalyticSVI, hyperparameters every step": lambda: agp_run(1),
    "augmentedgp AnalyticSVI, hyperparameters every 10th step": lambda: agp_run(10),
    "augmentedgp AnalyticSVI, q-only steps": lambda: agp_run(10**9),
    "hand-written q-only step (floor)": floor_run,
}
if "gpflow" not in H.SKIPPED:
    configs["gpflow Adam"] = lambda: gpflow_run("Adam")
    configs["gpflow NGD+Adam"] = lambda: gpflow_run("NGD+Adam")

raw, failed = {}, {}
for name, make in configs.items():
    print(name, "...", flush=True)
    try:
        raw[name] = timed(make())
    except Exception as err:  # GPflow's natural gradients can leave the PD cone (NaN)
        failed[name] = H.describe(err)
        print("  failed:", failed[name], flush=True)
        continue
    print(f"  {raw[name][0]:.0f} it/s wall, {raw[name][1]:.0f} it/s process time", flush=True)

ref = raw.get("gpflow Adam")
rows = [[name, f"{w:.0f}", f"{c:.0f}",
         f"{w / ref[0]:.2f}" if ref else "—", f"{c / ref[1]:.2f}" if ref else "—"]
        for name, (w, c) in raw.items()]
rows += [[name, "failed", "failed", "—", "—"] for name in failed]
body = [markdown_table(["configuration", "it/s (wall)", "it/s (process time)",
                        "/ gpflow Adam (wall)", "/ gpflow Adam (process)"], rows), "",
        f"Targets (issue): hyperparameters every step >= 1,500 it/s and >= 5x GPflow Adam; "
        f"q-only steps >= 5,000 it/s. Best of {args.repeats} runs of {args.steps} "
        f"iterations after one untimed run."]
body += [f"- {name}: {why}" for name, why in failed.items()]
text = H.report("One AnalyticSVI iteration against GPflow and a hand-written floor", [
    f"Logistic SVGP, n = {N:,} synthetic, d = {D}, M = {M}, batch {B}, float64."], body)
H.finish(args, text, raw={k: list(v) for k, v in raw.items()})
