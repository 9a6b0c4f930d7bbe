"""Gibbs-sampling benchmark (thesis ch. 5.1, Table 2): augmentedgp's augmented blocked Gibbs
sampler against numpyro NUTS and a random-walk Metropolis baseline, on full GPs.

Logistic classification (a 300-row slice of a9a) and Student-t, Laplace and Matern-3/2
regression (Boston), hyperparameters fitted once and frozen, 4 chains: augmentedgp
``sample(MCGP(...), GibbsSampling(...))``, the same with the likelihood declared by its
pieces (``SuperGaussian``: w drawn by the generic inversion sampler, row Gibbs-generic),
numpyro ``NUTS`` (defaults, whitened latent), NUTS on the augmented joint p(f, w | y) (the
thesis' sec. 7.3 question: is the gain the augmentation's or the Gibbs scheme's? row
NUTS-augmented; not for the logistic, whose Polya-Gamma prior has no usable density) and an
adaptive RWM. Measured on f with
``augmentedgp.diagnostics``: run and compile time, lag-1 autocorrelation, split R-hat, bulk
ESS, min ESS per second and agreement with NUTS.

    /work/peers-venv/bin/python benchmarks/gibbs.py            # full (~30 min), writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/gibbs.py --quick    # smoke test, ~2 min, no write
"""

from __future__ import annotations

import math
import time

import harness as H

# one CPU, single-threaded XLA / BLAS; synchronous dispatch: numpyro compiles inside its runs,
# and its compile time can only be told apart when compilation never overlaps execution
H.start("gibbs.py", pin="process", peers=("numpyro",), sync_dispatch=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, markdown_table, numpyro, ratio, timed  # noqa: E402
from jax import lax  # noqa: E402

import augmentedgp as agp  # noqa: E402

LIKELIHOODS = ("logistic", "studentt", "laplace", "matern32")
# NUTS-augmented: NUTS on the augmented joint p(f, w | y) (thesis sec. 7.3); Gibbs-generic: the
# same likelihood declared by its pieces (likelihoods.SuperGaussian), w drawn by the generic
# numerical-inversion sampler instead of the exact one
METHODS = ("RWM", "NUTS", "NUTS-augmented", "Gibbs", "Gibbs-generic")
LABEL = {"logistic": "Logistic", "studentt": "Student-t", "laplace": "Laplace",
         "matern32": "Matern 3/2"}
STUDENT_DF, RWM_TARGET = 4.0, 0.234
OVERRELAX = -0.5  # GibbsSampling(overrelax=...): the overrelaxed f | w move (exact)
RHAT_OK = 1.05  # above: the chains have not mixed and their ESS means nothing (marked †)
# min-ESS/s against NUTS that the engine aims for (issue "fastest non-conjugate GP engine")
TARGET_RATIO = {"logistic": 1.5, "studentt": 3.0, "laplace": 3.0, "matern32": 3.0}
# Thesis Table 2 (Turing.jl MH and hand-tuned HMC vs Gibbs; 5 chains x 10,000 samples):
# (time / sample s, lag-1 autocorrelation, Gelman-Rubin) for MH, HMC, Gibbs.
THESIS = {"logistic": {"MH": (0.001, 0.996, 1.38), "HMC": (0.041, 0.53, 1.00),
                       "Gibbs": (0.01, 0.11, 1.00)},
          "studentt": {"MH": (0.003, 1.0, 1.51), "HMC": (0.573, 0.857, 1.00),
                       "Gibbs": (0.028, 0.04, 1.00)},
          "laplace": {"MH": (0.002, 0.995, 1.44), "HMC": (0.082, 0.931, 1.01),
                      "Gibbs": (0.028, 0.26, 1.00)},
          "matern32": {"MH": (0.005, 0.997, 1.59), "HMC": (0.15, 0.995, 1.10),
                       "Gibbs": (0.029, 0.05, 1.00)}}
g3 = lambda x: fmt(x, ".3g")


# --- problems --------------------------------------------------------------------------------


def values(p):
    v = np.asarray(p.value)
    return float(v) if v.ndim == 0 else [float(x) for x in v]


def make_problems(keys, args):
    """[dict(key, dataset, X, y, kernel, likelihood, hyper, fit)], hyperparameters frozen."""
    out, L = [], agp.likelihoods
    if "logistic" in keys:
        d = H.dataset(args.binary_data, "slice", args.n_binary, 0, scale_x=True)
        X, y = d.X, np.where(d.y > 0, 1.0, -1.0)
        t = time.perf_counter()
        post = agp.fit(agp.GP(agp.kernels.RBF(math.sqrt(d.d), 1.0), L.Logistic()), X, y)
        k = post.kernel
        out.append({"key": "logistic", "X": X, "y": y, "kernel": k, "likelihood": L.Logistic(),
                    "dataset": f"{args.binary_data} (random {d.n} training rows, seed 0; "
                               f"{int((y > 0).sum())} positive; d = {d.d})",
                    "hyper": {"kernel": "RBF (isotropic)", "lengthscale": values(k.lengthscale),
                              "variance": values(k.variance)},
                    "fit": f"Laplace-approximation ML-II (`fit(GP(RBF, Logistic()), X, y)`, "
                           f"{time.perf_counter() - t:.0f} s), log marginal likelihood "
                           f"{post.log_marginal_likelihood():.2f}"})
    regression = [k for k in keys if k != "logistic"]
    if regression:
        d = H.dataset("boston", "slice", args.n_boston or 506, 0, scale_y=True)
        t = time.perf_counter()
        post = agp.fit(agp.GP(agp.kernels.RBF(np.full(d.d, math.sqrt(d.d)), 1.0), noise=0.1),
                       d.X, d.y)
        k, noise = post.kernel, float(post.likelihood.variance.value)
        s = math.sqrt(noise)
        fit = (f"Gaussian GP ML-II (`fit(GP(RBF(ARD), noise=0.1), X, y)`, "
               f"{time.perf_counter() - t:.0f} s): noise variance {noise:.4g}, log marginal "
               f"likelihood {post.log_marginal_likelihood():.2f}; each likelihood's scale "
               "matches that noise variance")
        # noise variances: Student-t s^2 df / (df - 2), Laplace 2 b^2, Matern-3/2 4 s^2 / 3
        liks = {"studentt": L.StudentT(STUDENT_DF, s * math.sqrt((STUDENT_DF - 2) / STUDENT_DF)),
                "laplace": L.Laplace(s / math.sqrt(2.0)),
                "matern32": L.Matern32(s * math.sqrt(3.0) / 2.0)}
        for key in regression:
            hyper = {"kernel": "RBF (ARD)", "lengthscale": values(k.lengthscale),
                     "variance": values(k.variance), "scale": values(liks[key].scale),
                     "gaussian_noise_variance": noise}
            out.append({"key": key, "X": d.X, "y": d.y, "kernel": k, "likelihood": liks[key],
                        "dataset": f"boston (n = {d.n}, d = {d.d})", "hyper": hyper,
                        "fit": fit})
    return out


def loglik(prob, y, f):
    """log p(y | f) with numpyro's distributions (Matern 3/2 by hand): NUTS's target."""
    dist, lik = numpyro.distributions, prob["likelihood"]
    if prob["key"] == "logistic":
        return dist.Bernoulli(logits=f).log_prob((y > 0).astype(f.dtype))
    if prob["key"] == "studentt":
        return dist.StudentT(lik.df.value, f, lik.scale.value).log_prob(y)
    if prob["key"] == "laplace":
        return dist.Laplace(f, lik.scale.value).log_prob(y)
    a, r = math.sqrt(3.0) / lik.scale.value, jnp.abs(y - f)
    return jnp.log(a / 4.0) + jnp.log1p(a * r) - a * r


def check_loglik(prob):
    """max |numpyro log p(y | f) - augmentedgp log_prob| at 200 random f per observation."""
    y = jnp.asarray(prob["y"])
    f = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (200, len(y)), y.dtype) + y
    return float(jnp.max(jnp.abs(loglik(prob, y, f) - prob["likelihood"].log_prob(y, f))))


# --- samplers --------------------------------------------------------------------------------


def run_gibbs(prob, L, args, key):
    model = agp.MCGP(prob["kernel"], prob["likelihood"])
    settings = agp.GibbsSampling(args.samples, n_chains=args.chains, burn_in=args.burn_in,
                                 overrelax=args.overrelax)
    k1, k2 = jax.random.split(key)
    timings = []
    for k in (k1, k2):  # the first call compiles; the second is measured
        with timed() as t:
            post = agp.sample(model, prob["X"], prob["y"], settings, key=k)
            post.f.block_until_ready()
        timings.append(t)
    first, t = timings
    sweeps = args.chains * (args.burn_in + args.samples)
    return {"f": np.asarray(post.f), "timing": t, "compile": first["compile"],
            "sampling_wall": t["wall"] * args.samples / (args.burn_in + args.samples),
            "settings": f"burn-in {args.burn_in}, {args.samples} kept, thin 1"
                        + (f", overrelax {args.overrelax:g}" if args.overrelax else ""),
            "iterations": sweeps, "notes": f"{1e3 * t['wall'] / sweeps:.2f} ms / sweep"}


def generic_twin(lik):
    """``lik`` declared by its super-Gaussian pieces (``SuperGaussian``, [Galy-Fajou2020,
    Table 1]): the same model, with w drawn by the generic inversion sampler."""
    SG = agp.likelihoods.SuperGaussian
    if isinstance(lik, agp.likelihoods.Logistic):
        return SG(lambda t: -jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))), log_c=-math.log(2.0),
                  g=lambda y: 0.5 * y, support="binary")
    s = float(lik.scale.value)
    loc = dict(a=lambda y: -y / s, b=1.0 / s)
    if isinstance(lik, agp.likelihoods.StudentT):
        nu = float(lik.df.value)
        return SG(lambda t: -0.5 * (nu + 1.0) * jnp.log1p(t / nu),
                  log_c=float(lik.log_prob(0.0, 0.0)), **loc)
    if isinstance(lik, agp.likelihoods.Laplace):
        return SG(lambda t: -jnp.sqrt(t), log_c=-math.log(2.0 * s), **loc)
    return SG(lambda t: jnp.log1p(jnp.sqrt(3.0 * t)) - jnp.sqrt(3.0 * t),  # Matern-3/2
              log_c=math.log(0.25 * math.sqrt(3.0) / s), **loc)


def run_gibbs_generic(prob, L, args, key):
    twin = dict(prob, likelihood=generic_twin(prob["likelihood"]))
    y = jnp.asarray(prob["y"])
    f = 2.0 * jax.random.normal(jax.random.PRNGKey(2), (50, len(y)), y.dtype) + y
    gap = float(jnp.max(jnp.abs(twin["likelihood"].log_prob(y, f)
                                - prob["likelihood"].log_prob(y, f))))
    assert gap < 1e-10, f"the declared twin's log p(y | f) is off by {gap:.2g}"
    res = run_gibbs(twin, L, args, key)
    res["notes"] += "; w by numerical inversion (SuperGaussian)"
    return res


def mixing_prior(lik):
    """The mixing law p(w) of a scale-mixture likelihood as a numpyro distribution (its Laplace
    transform is phi, [Galy-Fajou2020, Table 1]); None for the Polya-Gamma law, whose density
    is an alternating series (thesis sec. 7.3: HMC needs the prior density)."""
    dist, L = numpyro.distributions, agp.likelihoods
    if isinstance(lik, L.StudentT):
        nu = lik.df.value
        return dist.Gamma(0.5 * (nu + 1.0), nu)
    if isinstance(lik, L.Laplace):  # Levy: InvGamma(1/2, 1 / (4 scale^2))
        return dist.InverseGamma(0.5, 0.25 / lik.scale.value**2)
    if isinstance(lik, L.Matern32):  # InvGamma(3/2, a^2 / 4), a = sqrt(3) / scale
        return dist.InverseGamma(1.5, 0.75 / lik.scale.value**2)
    return None


def run_nuts_augmented(prob, L, args, key):
    return run_nuts(prob, L, args, key, augmented=True)


def run_nuts(prob, L, args, key, augmented=False):
    dist, y, n = numpyro.distributions, jnp.asarray(prob["y"]), len(prob["y"])
    lik = prob["likelihood"]

    def model():
        v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([n]).to_event(1))
        f = L @ v
        if not augmented:
            numpyro.factor("loglik", jnp.sum(loglik(prob, y, f)))
            return
        # the augmented joint: w_i ~ p(w), log p(y_i | f_i, w_i) = log C - w_i h_i^2
        # ([Galy-Fajou2020, Theorem 1]); numpyro samples log w (its positive transform)
        w = numpyro.sample("w", mixing_prior(lik).expand([n]).to_event(1))
        s = lik.super_gaussian(y)
        numpyro.factor("loglik", jnp.sum(s.log_c + s.g * f - w * (s.a + s.b * f) ** 2))

    mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(model), num_warmup=args.nuts_warmup,
                              num_samples=args.nuts_samples, num_chains=args.chains,
                              chain_method=args.nuts_chain_method, progress_bar=False)
    # numpyro compiles inside warmup() and run(): the compile seconds JAX reports there are
    # subtracted from the wall time (and the same fraction of each phase's process time)
    fields = ("num_steps", "diverging", "accept_prob", "adapt_state.step_size")
    with timed() as tw:
        mcmc.warmup(key, extra_fields=fields, collect_warmup=True)
        jax.block_until_ready(mcmc.post_warmup_state)
    warm = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    with timed() as ts:
        mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=fields)
        v = mcmc.get_samples(group_by_chain=True)["v"]
        v.block_until_ready()
    extra = {k: np.asarray(x) for k, x in mcmc.get_extra_fields(group_by_chain=True).items()}
    compile_s = tw["compile"] + ts["compile"]
    t = {"wall": tw["wall"] + ts["wall"] - compile_s,
         "cpu": sum(p["cpu"] * max(1.0 - p["compile"] / p["wall"], 0.0) for p in (tw, ts))}
    steps, sizes = extra["num_steps"], extra["adapt_state.step_size"][:, -1]
    depth = np.log2(steps + 1.0)
    return {"f": np.asarray(jnp.einsum("csj,ij->csi", v, L)), "timing": t, "compile": compile_s,
            "sampling_wall": ts["wall"] - ts["compile"],
            "settings": f"warm-up {args.nuts_warmup}, {args.nuts_samples} kept, thin 1"
                        + (", on (f, w): 2n dimensions" if augmented else ""),
            "iterations": args.chains * (args.nuts_warmup + args.nuts_samples),
            "leapfrog": [int(warm.sum()), int(steps.sum())],
            "divergences": int(extra["diverging"].sum()), "step_size": sizes.tolist(),
            "notes": (f"{steps.mean():.0f} leapfrog steps / iteration in sampling "
                      f"({100 * np.mean(depth >= 10):.0f} % at the max tree depth 10; warm-up "
                      f"{warm.mean():.0f}), {int(extra['diverging'].sum())} divergent, mean "
                      f"acceptance {extra['accept_prob'].mean():.2f}, step sizes "
                      + "/".join(f"{x:.3g}" for x in sizes)
                      + f"; {1e6 * t['wall'] / (warm.sum() + steps.sum()):.0f} us per leapfrog "
                      f"step; compile (inside warm-up / sampling) {tw['compile']:.1f} / "
                      f"{ts['compile']:.1f} s, {len(tw['programs'])} / {len(ts['programs'])} "
                      "XLA programs of > 0.5 s")}


def run_rwm(prob, L, args, key):
    """Random-walk Metropolis on log N(v | 0, I) + sum log p(y | L v), chains vmapped: log s
    adapted by Robbins-Monro towards 0.234 acceptance in warm-up, then fixed, thinned."""
    y, n, lik, thin = jnp.asarray(prob["y"]), len(prob["y"]), prob["likelihood"], args.rwm_thin
    n_warm, n_keep = thin * args.samples, args.samples
    logp = lambda v: -0.5 * v @ v + jnp.sum(lik.log_prob(y, L @ v))

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

        (v, lp, log_s), _ = lax.scan(warm, (v0, logp(v0), jnp.log(2.38 / math.sqrt(n))),
                                     jnp.arange(n_warm))
        s = jnp.exp(log_s)

        def keep(carry, i):
            def inner(j, c):
                v, lp, acc = c
                v, lp, a = step(jax.random.fold_in(jax.random.fold_in(k_keep, i), j), v, lp, s)
                return v, lp, acc + a

            carry = lax.fori_loop(0, thin, inner, carry)
            return carry, L @ carry[0]

        (v, lp, acc), fs = lax.scan(keep, (v, lp, 0.0), jnp.arange(n_keep))
        return fs, acc / (n_keep * thin), s

    kc, k0 = jax.random.split(key)
    keys = jax.random.split(kc, args.chains)
    v0 = jax.random.normal(k0, (args.chains, n), L.dtype)  # prior draws, as Gibbs
    with timed() as comp:
        compiled = jax.jit(jax.vmap(chain)).lower(keys, v0).compile()
    with timed() as t:
        f, acc, s = compiled(keys, v0)
        f.block_until_ready()
    acc, s, its = np.asarray(acc), np.asarray(s), args.chains * (n_warm + n_keep * thin)
    return {"f": np.asarray(f), "timing": t, "compile": comp["wall"],
            "sampling_wall": t["wall"] * n_keep * thin / (n_warm + n_keep * thin),
            "settings": f"warm-up {n_warm}, {n_keep} kept, thin {thin}", "iterations": its,
            "notes": f"acceptance {acc.mean():.3f}, step s = " + "/".join(f"{x:.3g}" for x in s)
                     + f"; {1e3 * t['wall'] / its:.3f} ms / iteration; lag-1 is of the "
                     "thinned chain"}


def sweep_breakdown(prob, f_state, reps=100):
    """ms per call of the two Gibbs steps at a posterior state (the auxiliary draw and the
    draw of f | w, a private function of the sampler), each looped ``reps`` times in one
    jitted call; the best of 3."""
    from augmentedgp.inference import gibbs as G

    X, lik, n = jnp.asarray(prob["X"]), prob["likelihood"], len(prob["y"])
    y = jnp.asarray(lik.targets(prob["y"], n))
    K = prob["kernel"](X)
    prior = G.FullPrior(K, agp.linalg.cholesky(K), jnp.zeros(n, X.dtype))
    f0 = jnp.asarray(f_state)
    beta, gamma = lik.sites(y, lik.sample_aux(jax.random.PRNGKey(0), y, f0))
    loops = {"aux": lambda key: lax.fori_loop(0, reps, lambda i, acc: acc + lik.sample_aux(
                 jax.random.fold_in(key, i), y, f0 + 1e-9 * acc), jnp.zeros_like(f0)),
             "draw_f": lambda key: lax.fori_loop(0, reps, lambda i, acc: acc + G._draw_full(
                 jax.random.fold_in(key, i), prior, beta, gamma + 1e-12 * acc)[0],
                 jnp.zeros_like(f0))}
    out = {}
    for name, fn in loops.items():
        jf = jax.jit(fn)
        run = lambda jf=jf: jf(jax.random.PRNGKey(2)).block_until_ready()
        out[name] = 1e3 / reps * H.time_call(run, 3, math.inf)["min"]
    return out


# --- measures --------------------------------------------------------------------------------


def diagnose(res):
    s = agp.diagnostics.summary(res["f"])
    kept, wall, cpu, ess = res["f"].shape[0] * res["f"].shape[1], res["timing"]["wall"], \
        res["timing"]["cpu"], s["ess_bulk"]
    return {"kept": kept, "wall": wall, "cpu": cpu, "compile": res["compile"],
            "ms_per_sample": 1e3 * wall / kept, "lag1_median": float(np.median(s["acf1"])),
            "rhat_max": float(np.max(s["rhat"])), "ess_min": float(np.min(ess)),
            "ess_median": float(np.median(ess)), "ess_per_s": ratio(float(np.min(ess)), wall),
            "ess_per_cpu_s": ratio(float(np.min(ess)), cpu),
            "ess_per_s_sampling": ratio(float(np.min(ess)), res["sampling_wall"]),
            "mean": s["mean"], "sd": s["sd"], "ess": ess}


def agreement(d, ref):
    diff = np.abs(d["mean"] - ref["mean"])
    z = diff / np.sqrt(d["sd"] ** 2 / d["ess"] + ref["sd"] ** 2 / ref["ess"])
    return {"dmean_max": float(np.max(diff / ref["sd"])), "z_max": float(np.max(z)),
            "sd_ratio_median": float(np.median(d["sd"] / ref["sd"]))}


def bench_problem(prob, args, methods):
    print(f"\n== {LABEL[prob['key']]}: {prob['dataset']}\n   hyperparameters: {prob['hyper']}",
          flush=True)
    L = agp.linalg.cholesky(prob["kernel"](jnp.asarray(prob["X"])))
    key, t0 = jax.random.PRNGKey(args.seed), time.perf_counter()
    out = {"problem": prob, "runs": {}, "diag": {}, "errors": {}}
    if numpyro is not None:
        out["loglik_check"] = check_loglik(prob)
        print(f"   max |numpyro - augmentedgp log p(y | f)| = {out['loglik_check']:.2e}")
    runners = {"Gibbs": run_gibbs, "NUTS": run_nuts, "RWM": run_rwm,
               "Gibbs-generic": run_gibbs_generic, "NUTS-augmented": run_nuts_augmented}
    for i, m in enumerate(METHODS):
        if m not in methods:
            continue
        if m.startswith("NUTS") and numpyro is None:
            out["errors"][m] = H.SKIPPED["numpyro"]
            continue
        if m == "NUTS-augmented" and mixing_prior(prob["likelihood"]) is None:
            out["errors"][m] = ("not run: the Polya-Gamma prior density is an alternating "
                                "series, which HMC cannot use (thesis sec. 7.3)")
            continue
        try:
            res = out["runs"][m] = runners[m](prob, L, args, jax.random.fold_in(key, i))
        except Exception as err:  # report and go on with the other samplers
            out["errors"][m] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            print(f"   {m}: FAILED {out['errors'][m]}", flush=True)
            continue
        d = out["diag"][m] = diagnose(res)
        print(f"   {m:5s} {res['settings']}: run {d['wall']:.1f} s wall / {d['cpu']:.1f} s "
              f"CPU (compile {d['compile']:.1f} s), lag-1 {d['lag1_median']:.3f}, R-hat max "
              f"{d['rhat_max']:.3f}, ESS min/median {d['ess_min']:.0f}/{d['ess_median']:.0f},"
              f" min ESS/s {g3(d['ess_per_s'])}; {res['notes']}", flush=True)
    if "NUTS" in out["diag"]:
        out["agree"] = {m: agreement(d, out["diag"]["NUTS"])
                        for m, d in out["diag"].items() if m != "NUTS"}
        print(f"   vs NUTS: {out['agree']}", flush=True)
    if "Gibbs" in out["runs"] and not args.no_breakdown:
        try:
            out["breakdown"] = sweep_breakdown(prob, out["diag"]["Gibbs"]["mean"])
            out["breakdown"]["sweep"] = (1e3 * out["runs"]["Gibbs"]["timing"]["wall"]
                                         / out["runs"]["Gibbs"]["iterations"])
        except Exception as err:  # private API: optional
            out["breakdown_error"] = f"{type(err).__name__}: {err}"
    out["seconds"] = time.perf_counter() - t0
    return out


# --- report ----------------------------------------------------------------------------------


def problem_table(res):
    header = ["sampler", "settings per chain", "run wall s (CPU s)", "compile s",
              "ms / kept sample", "lag-1 (median)", "max R-hat", "bulk ESS min / median",
              "min ESS / s (sampling phase)", "vs NUTS: max abs dmean / sd", "max abs z",
              "sd ratio (median)"]
    rows = []
    for m in METHODS:
        if m in res["errors"]:
            rows.append([m, res["errors"][m]] + ["—"] * (len(header) - 2))
        if m not in res["diag"]:
            continue
        d, a = res["diag"][m], res.get("agree", {}).get(m)
        rows.append([m, res["runs"][m]["settings"], f"{d['wall']:.1f} ({d['cpu']:.1f})",
                     f"{d['compile']:.1f}", g3(d["ms_per_sample"]), f"{d['lag1_median']:.3f}",
                     f"{d['rhat_max']:.3f}" + (" †" if d["rhat_max"] > RHAT_OK else ""),
                     f"{d['ess_min']:.0f} / {d['ess_median']:.0f}",
                     f"{g3(d['ess_per_s'])} ({g3(d['ess_per_s_sampling'])})"]
                    + (["(reference)", "", ""] if m == "NUTS" else
                       [g3(a and a[k]) for k in ("dmean_max", "z_max", "sd_ratio_median")]))
    return markdown_table(header, rows)


def verdicts(all_res):
    lines, rows = [], []
    for res in all_res:
        k = res["problem"]["key"]
        g, n = res["diag"].get("Gibbs"), res["diag"].get("NUTS")
        q, qc, qs = (ratio(g and g[m], n and n[m])
                     for m in ("ess_per_s", "ess_per_cpu_s", "ess_per_s_sampling"))
        a, target = res.get("agree", {}).get("Gibbs"), TARGET_RATIO[k]
        ok = None if q is None else q >= target
        rows.append([LABEL[k], g3(g and g["ess_per_s"]), g3(n and n["ess_per_s"]), g3(q),
                     g3(qc), g3(qs), f">= {target:g}x",
                     "n/a" if ok is None else ("**met**" if ok else "**not met**"),
                     g3(a and a["z_max"])])
        if ok is None:
            continue
        agree = ("" if a is None else f"; Gibbs and NUTS agree (max |z| {a['z_max']:.2f}, max "
                 f"|dmean| / sd {a['dmean_max']:.3f})" if a["z_max"] < 5.0 else
                 f"; **Gibbs and NUTS disagree** (max |z| {a['z_max']:.1f}, max |dmean| / sd "
                 f"{a['dmean_max']:.2f})")
        mixed = [m for m, d in (("Gibbs", g), ("NUTS", n)) if d["rhat_max"] > RHAT_OK]
        lines.append(f"- {LABEL[k]}: min ESS/s Gibbs / NUTS = {q:.2f} (process time: {g3(qc)}; "
                     f"sampling phases alone: {g3(qs)}) -> '>= {target:g}x' "
                     + ("**met**" if ok else "**not met**") + agree
                     + (f"; but max R-hat > {RHAT_OK} for {' and '.join(mixed)}, so the ESS "
                        "behind this ratio is not reliable" if mixed else "") + ".")
    header = ["likelihood", "Gibbs min ESS/s", "NUTS min ESS/s", "Gibbs / NUTS (wall)",
              "Gibbs / NUTS (process time)", "Gibbs / NUTS (sampling phases, wall)", "target",
              "verdict", "Gibbs vs NUTS max abs z"]
    return [*lines, "", markdown_table(header, rows)]


def thesis_lines(all_res):
    rows, out = [], []
    for res in all_res:
        k, th, dg = res["problem"]["key"], THESIS[res["problem"]["key"]], res["diag"]
        for j, metric in enumerate(("time / sample (s)", "lag 1", "Gelman (max R-hat)")):
            ours = ["—" if m not in dg else fmt((dg[m]["ms_per_sample"] / 1e3,
                    dg[m]["lag1_median"], dg[m]["rhat_max"])[j], ".3g" if j == 0 else ".3f")
                    for m in METHODS]
            rows.append([LABEL[k] if j == 0 else "", metric, f"{th['MH'][j]:g}", ours[0],
                         f"{th['HMC'][j]:g}", ours[1], f"{th['Gibbs'][j]:g}", ours[2]])
        g, n, r = (dg.get(m) for m in ("Gibbs", "NUTS", "RWM"))
        parts = ([f"Gibbs lag-1 {g['lag1_median']:.3f} (thesis {th['Gibbs'][1]:g}), "
                  f"{g['ms_per_sample']:.3g} ms / sample (thesis {1e3 * th['Gibbs'][0]:g} ms)"]
                 if g else [])
        if n:
            parts.append(f"NUTS lag-1 {n['lag1_median']:.3f} against hand-tuned HMC's "
                         f"{th['HMC'][1]:g}, max R-hat {n['rhat_max']:.3f} (thesis "
                         f"{th['HMC'][2]:g}), {n['ms_per_sample']:.3g} ms / sample (thesis HMC "
                         f"{1e3 * th['HMC'][0]:g} ms)")
        if g and n:
            q = n["ms_per_sample"] / g["ms_per_sample"]
            parts.append(f"time per sample NUTS / Gibbs {q:.2f} (thesis HMC / Gibbs "
                         f"{th['HMC'][0] / th['Gibbs'][0]:.1f})")
        if r:
            parts.append(f"RWM max R-hat {r['rhat_max']:.2f} (thesis MH {th['MH'][2]:g})")
        out += [f"- {LABEL[k]}: " + "; ".join(parts) + "."] if parts else []
    return [markdown_table(["likelihood", "metric", "MH (thesis)", "RWM (ours)", "HMC (thesis)",
                            "NUTS (ours)", "Gibbs (thesis)", "Gibbs (ours)"], rows), "", *out]


def hyper_lines(all_res):
    lines, seen = [], set()
    for res in all_res:
        p = res["problem"]
        h = dict(p["hyper"])
        ls = h.pop("lengthscale")
        ls = f"{ls:.4g}" if isinstance(ls, float) else "[" + ", ".join(f"{x:.4g}" for x in ls) + "]"
        rest = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in h.items() if k != "kernel")
        fit = "" if p["fit"] in seen else f" Fit: {p['fit']}."
        seen.add(p["fit"])
        lines.append(f"- {LABEL[p['key']]} ({p['dataset']}): {type(p['likelihood']).__name__}; "
                     f"{h['kernel']} lengthscale {ls}; {rest}.{fit}")
    return lines


def intro(args, all_res):
    checks = ", ".join(f"{LABEL[r['problem']['key']]} {r['loglik_check']:.1e}" for r in all_res
                       if "loglik_check" in r)
    return [
        "The thesis' Table 2 (ch. 5.1) on the same kinds of problems: logistic classification "
        "at the size of its Heart set (n = 303) and Student-t, Laplace and Matern-3/2 "
        "regression on Boston housing (n = 506).", "",
        f"**Data.** Logistic: a random slice (seed 0) of {args.n_binary} training rows of "
        f"`{args.binary_data}.npz`, labels +-1; regression: `boston.npz`, "
        + ("all rows" if args.n_boston is None else f"a random {args.n_boston}-row slice")
        + ". X standardised, y standardised (regression).", "",
        "**Fixed hyperparameters** (fitted once, then frozen; zero prior mean):", "",
        *hyper_lines(all_res), "",
        f"**Samplers** (float64, {args.chains} chains each, every chain from its own start):",
        "", "- *Gibbs*: augmentedgp `sample(MCGP(kernel, likelihood), X, y, GibbsSampling("
        f"{args.samples}, n_chains={args.chains}, burn_in={args.burn_in}"
        + (f", overrelax={args.overrelax:g}" if args.overrelax else "") + "))` (thesis "
        "Algorithm 2: w ~ p(w | y, f) by Polya-Gamma / gamma / inverse-Gaussian / GIG draws, "
        "then f | w by Matheron's rule, one n x n Cholesky per sweep"
        + (f", as the overrelaxed move mu + rho (f - mu) + sqrt(1 - rho^2) (f* - mu), rho = "
           f"{args.overrelax:g}, which leaves p(f | w, y) invariant" if args.overrelax else "")
        + "; chains side by side, each chain's factorisation a single-matrix LAPACK call; "
        "started from a prior draw), called twice: the second (compiled) call is measured, "
        "the first's compile time reported.",
        f"- *NUTS*: numpyro `NUTS(model)` with its defaults (target acceptance 0.8, diagonal "
        f"mass matrix, max tree depth 10), `MCMC(num_warmup={args.nuts_warmup}, num_samples="
        f"{args.nuts_samples}, num_chains={args.chains}, chain_method=\""
        f"{args.nuts_chain_method}\")` on the whitened latent v ~ N(0, I_n), f = L v, L = "
        "chol(K) computed once outside the model, `numpyro.factor` of sum log p(y | f) with "
        "numpyro's `Bernoulli(logits=f)`, `StudentT`, `Laplace` and a hand-written Matern 3/2 "
        f"(max difference to augmentedgp's `log_prob`: {checks or 'not checked'}); "
        "`mcmc.warmup` then `mcmc.run`, timed apart, the compile seconds JAX reports inside "
        "them subtracted (the leapfrog counts are in the notes).",
        "- *NUTS-augmented*: the same NUTS on the augmented joint p(f, w | y) ([Galy-Fajou2020,"
        " Theorem 1]; thesis sec. 7.3): w_i ~ p(w) as numpyro's `Gamma((df + 1) / 2, df)` "
        "(Student-t), `InverseGamma(1/2, 1 / (4 scale^2))` (Laplace) and `InverseGamma(3/2, "
        "3 / (4 scale^2))` (Matern 3/2), sampled in log w, and `numpyro.factor` of sum log C "
        "+ g f - w h^2 from the likelihood's `super_gaussian` pieces: 2n dimensions. Not for "
        "the logistic: the Polya-Gamma prior density is an alternating series.",
        "- *Gibbs-generic*: *Gibbs* with the likelihood declared by its pieces "
        "(`likelihoods.SuperGaussian(log_phi, log_c=, g=, a=, b=)`, log p(y | f) checked "
        "against the built-in's to 1e-10), so w is drawn by the generic sampler "
        "(`augmentation.inversion.sample`: numerical Laplace inversion and Newton) instead "
        "of the exact one.",
        f"- *RWM*: random-walk Metropolis on the same whitened target (this script, "
        f"`lax.scan`, chains `vmap`-ed): {args.rwm_thin} x {args.samples} warm-up iterations "
        f"adapting log s by Robbins-Monro towards {RWM_TARGET} acceptance from s = 2.38 / "
        f"sqrt(n), then {args.rwm_thin} x {args.samples} iterations, every {args.rwm_thin}th "
        "kept; compiled ahead of time.", "",
        "**Measures** (on f, all n latent values; `augmentedgp.diagnostics` for every "
        "sampler): *run* = the whole run, warm-up / burn-in included, compilation excluded "
        "(wall; process time in brackets); *lag-1* = chain-averaged lag-1 autocorrelation, "
        "median over the latents; *max R-hat* = the largest rank-normalised split R-hat; "
        "*ESS* = bulk ESS, min and median; *min ESS / s* = min bulk ESS / run wall seconds "
        "(in brackets: / the sampling phase alone). † marks max R-hat > "
        f"{RHAT_OK}. *vs NUTS*: max |mean - mean_NUTS| / sd_NUTS; max |z| with z = (mean - "
        "mean_NUTS) / sqrt(mcse^2 + mcse_NUTS^2) (~3.5 expected over n latents); sd ratio = "
        "median of sd / sd_NUTS. Synchronous CPU dispatch (compilation never overlaps "
        "execution)."]


def main():
    p = H.parser(__doc__)
    p.add_argument("--nuts-chain-method", default="sequential",
                   choices=("sequential", "vectorized"))
    p.add_argument("--binary-data", default="a9a", choices=("a9a", "bank"))
    p.add_argument("--no-breakdown", action="store_true", help="skip the Gibbs step timings")
    for name, kind, helptext in (  # None: the --quick / full default below
            ("likelihoods", str, ",".join(LIKELIHOODS)), ("methods", str, ",".join(METHODS)),
            ("samples", int, "kept samples per chain"), ("chains", int, ""),
            ("burn-in", int, "Gibbs burn-in"), ("nuts-warmup", int, ""),
            ("nuts-samples", int, "kept NUTS samples per chain"), ("rwm-thin", int, ""),
            ("n-binary", int, "rows of the binary slice"), ("n-boston", int, "default all")):
        p.add_argument(f"--{name}", type=kind, default=None, help=helptext)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overrelax", type=float, default=OVERRELAX,
                   help="GibbsSampling(overrelax=...): 0 for the plain draw of f | w")
    args = H.parse(p, {"likelihoods": "logistic,studentt", "methods": ",".join(METHODS),
                       "samples": 50, "chains": 2,
                       "burn_in": 20, "nuts_warmup": 50, "nuts_samples": 50, "rwm_thin": 2,
                       "n_boston": 150, "n_binary": 100},
                   {"likelihoods": ",".join(LIKELIHOODS), "methods": ",".join(METHODS),
                    "samples": 1000, "chains": 4,
                    "burn_in": 200, "nuts_warmup": 500, "nuts_samples": 500, "rwm_thin": 20,
                    "n_binary": 300})
    keys, methods = H.csv(args.likelihoods), H.csv(args.methods)
    if set(keys) - set(LIKELIHOODS) or set(methods) - set(METHODS):
        p.error("unknown likelihoods or methods")
    all_res = [bench_problem(prob, args, methods)
               for prob in make_problems([k for k in LIKELIHOODS if k in keys], args)]
    body = ["### Targets", "", *verdicts(all_res), "", "### Results per likelihood", ""]
    for res in all_res:
        p, b = res["problem"], res.get("breakdown")
        body += [f"**{LABEL[p['key']]}** ({p['dataset']}; {res['seconds']:.0f} s for this "
                 "problem)", "", problem_table(res), ""]
        body += [f"- {m}: {res['runs'][m]['notes']}" for m in METHODS if m in res["runs"]]
        if b:
            body.append(f"- Gibbs sweep ({b['sweep']:.2f} ms in the run): the auxiliary draw "
                        f"{b['aux']:.2f} ms, the draw of f | w (Cholesky of I + s K s, "
                        f"Matheron's rule) {b['draw_f']:.2f} ms (each timed alone, 100 calls in "
                        "one jitted loop).")
        body.append("")
    body += ["### Against the thesis' Table 2", "",
             "Thesis: Turing.jl MH and hand-tuned HMC against Gibbs "
             "(AugmentedGaussianProcesses.jl), 5 chains x 10,000 samples. Ours: RWM, numpyro "
             "NUTS (default adaptation) and augmentedgp Gibbs as above; time per sample = run "
             "wall (warm-up included) / kept samples.", "", *thesis_lines(all_res)]
    text = H.report("Gibbs sampling: augmentedgp vs numpyro NUTS and random-walk Metropolis",
                    intro(args, all_res), body)
    H.finish(args, text, [{**r, "runs": {m: {k: v for k, v in x.items() if k != "f"}
                                         for m, x in r["runs"].items()}} for r in all_res])


if __name__ == "__main__":
    main()
