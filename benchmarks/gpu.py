"""GPU against CPU: the three workloads where an accelerator should pay, timed in one process
on JAX's GPU device and on its CPU device (the host's cores), float64 throughout.

1. One epoch of ``AnalyticSVI`` (logistic, M = 500 fixed inducing inputs, batch 1,000) on
   10^6 synthetic points: 1,000 iterations, hyperparameters learned every step;
2. the exact GP log marginal likelihood + gradient in all hyperparameters at n = 10,000
   (ARD RBF + Gaussian noise);
3. 64 Gibbs chains side by side (logistic, full GP, n = 1,000, fixed hyperparameters).

Each is run twice per device: the first call includes compilation, the second is the
steady state. Needs a GPU (``jax.devices("gpu")``); without one it says so and stops. CI
never runs it.

    python benchmarks/gpu.py                 # full sizes (8.5 min on one H200 host, mostly CPU)
    python benchmarks/gpu.py --quick         # small sizes, a smoke test (CPU only is fine)
"""

from __future__ import annotations

import time

import harness as H

H.start("gpu.py", threads=0)

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, markdown_table  # noqa: E402

import augmentedgp as agp  # noqa: E402

p = H.parser(__doc__)
p.add_argument("--n-svi", type=int, default=None)
p.add_argument("--M", type=int, default=None)
p.add_argument("--batch", type=int, default=None)
p.add_argument("--n-exact", type=int, default=None)
p.add_argument("--n-gibbs", type=int, default=None)
p.add_argument("--chains", type=int, default=None)
p.add_argument("--sweeps", type=int, default=None)
args = H.parse(p, quick=dict(n_svi=20_000, M=100, batch=200, n_exact=1_000, n_gibbs=200,
                             chains=8, sweeps=20),
               full=dict(n_svi=1_000_000, M=500, batch=1_000, n_exact=10_000, n_gibbs=1_000,
                         chains=64, sweeps=100))


def synthetic(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1] - 0.3 * X[:, 2] ** 2
    return X, f, rng


def twice(run):
    """(first call with compilation, second call) in seconds."""
    out = []
    for _ in range(2):
        t = time.perf_counter()
        jax.block_until_ready(run())
        out.append(time.perf_counter() - t)
    return out


def svi_epoch():
    X, f, rng = synthetic(args.n_svi, 8, 0)
    y = (f + 0.5 * rng.normal(size=f.shape) > 0).astype(float)
    Z = X[rng.choice(args.n_svi, args.M, replace=False)]
    steps = args.n_svi // args.batch

    def run():
        model = agp.SVGP(agp.kernels.RBF(lengthscale=np.ones(8)), agp.likelihoods.Logistic(),
                         agp.params.fixed(agp.params.real(jnp.asarray(Z))))
        post = agp.fit(model, X, y, agp.AnalyticSVI(args.batch), max_iter=steps, tol=0.0,
                       chunk_size=min(steps, 250))
        return post.history.objective

    return twice(run), f"{steps} iterations, n = {args.n_svi:,}, M = {args.M}, batch {args.batch}"


def exact():
    X, f, rng = synthetic(args.n_exact, 8, 1)
    y = f + 0.3 * rng.normal(size=f.shape)
    model = agp.GP(agp.kernels.RBF(lengthscale=np.ones(8)), noise=0.1)
    Xa, ya = jnp.asarray(X), jnp.asarray(y)
    params, static = agp.params.partition_trainable(model)
    lml = jax.jit(jax.value_and_grad(
        lambda p: agp.Exact().log_marginal_likelihood(eqx.combine(p, static), Xa, ya)))
    chol = jax.jit(lambda p: jnp.linalg.cholesky(
        eqx.combine(p, static).kernel(Xa) + 0.1 * jnp.eye(Xa.shape[0])))
    return (twice(lambda: lml(params)), twice(lambda: chol(params))), f"n = {args.n_exact:,}"


def gibbs():
    X, f, rng = synthetic(args.n_gibbs, 4, 2)
    y = (f + 0.5 * rng.normal(size=f.shape) > 0).astype(float)
    model = agp.MCGP(agp.kernels.RBF(lengthscale=np.ones(4)), agp.likelihoods.Logistic())
    settings = agp.GibbsSampling(n_samples=args.sweeps, burn_in=args.sweeps,
                                 n_chains=args.chains)
    run = lambda: agp.sample(model, X, y, settings, key=jax.random.key(0)).f
    sweeps = args.chains * 2 * args.sweeps
    return twice(run), f"{args.chains} chains x {2 * args.sweeps} sweeps, n = {args.n_gibbs:,}", \
        sweeps


devices = {"CPU": jax.devices("cpu")[0]}
try:
    devices["GPU"] = jax.devices("gpu")[0]
except RuntimeError as err:
    if not args.quick:
        raise SystemExit("no GPU visible to JAX: run with --quick for a CPU-only smoke "
                         "test") from err
names = {k: getattr(d, "device_kind", str(d)) for k, d in devices.items()}
print("devices:", names, flush=True)

raw, order = {}, ["GPU", "CPU"] if "GPU" in devices else ["CPU"]
for dev in order:
    with jax.default_device(devices[dev]):
        print(f"[{dev}] SVI epoch ...", flush=True)
        raw[dev, "svi"], svi_what = svi_epoch()
        print(f"[{dev}] exact GP ...", flush=True)
        (raw[dev, "exact"], raw[dev, "chol"]), exact_what = exact()
        print(f"[{dev}] Gibbs ...", flush=True)
        raw[dev, "gibbs"], gibbs_what, n_sweeps = gibbs()
        print({k: v for k, v in raw.items() if k[0] == dev}, flush=True)

rows = []
for key, what, label in (("svi", svi_what, "AnalyticSVI epoch"),
                         ("exact", exact_what, "exact LML + gradient"),
                         ("chol", exact_what, "bare Cholesky (reference)"),
                         ("gibbs", gibbs_what, "Gibbs, chains side by side")):
    row = [label, what]
    for dev in order:
        first, second = raw[dev, key]
        row += [fmt(first, ".3g"), fmt(second, ".3g")]
    if len(order) == 2:
        row.append(f"{raw['CPU', key][1] / raw['GPU', key][1]:.1f}x")
    rows.append(row)
header = ["workload", "size"]
for dev in order:
    header += [f"{dev} first (s)", f"{dev} second (s)"]
if len(order) == 2:
    header.append("GPU speed-up (second calls)")
body = [markdown_table(header, rows), "",
        f"Devices: {', '.join(f'{k}: {v}' for k, v in names.items())}. Exact LML + gradient / "
        f"Cholesky (second calls): "
        + ", ".join(f"{dev} {raw[dev, 'exact'][1] / raw[dev, 'chol'][1]:.1f}x" for dev in order)
        + f". Gibbs: {n_sweeps} sweeps in all per device."]
text = H.report("GPU against CPU", [
    "One process; each workload twice per device (first call with compilation, second the "
    "steady state); float64."], body)
H.finish(args, text, raw={f"{d}/{k}": v for (d, k), v in raw.items()})
