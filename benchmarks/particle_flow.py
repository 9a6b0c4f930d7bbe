"""Gaussian particle flow benchmark (thesis ch. 6, section 4, in miniature): augmentedgp's
``ParticleFlow`` (GPF) and ``GaussianFlow`` (GF) against its ``ADVI`` and ``SVGD`` and, on
Bayesian logistic regression, numpyro's SVI with automatic guides.

Parts: 1. Gaussian targets (4.1: errors of mean and covariance against time, a Theorem 2
check); 2. low-rank GPF (4.2, Theorem 3); 3. Bayesian logistic regression on ijcnn1 (4.5);
4. GP classification (VGP with flows against ``QuadratureVI`` / ``AnalyticVI``); 5. sparse GP
classification (SVGP with flows, full batch and minibatches, against ``QuadratureVI`` and
``QuadratureSVI``). Every run's
clock excludes JAX's compilation and the measurement callbacks; one CPU.

    /work/peers-venv/bin/python benchmarks/particle_flow.py            # full, writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/particle_flow.py --quick    # ~2 min, no write
    python benchmarks/particle_flow.py --quick                         # library env: no numpyro
"""

from __future__ import annotations

import math
import time
import warnings

import harness as H

H.start("particle_flow.py", pin="process", peers=("numpyro",), sync_dispatch=True)

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from harness import fmt, markdown_table, numpyro, ratio  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp.core.params import Parameter, fixed, real  # noqa: E402
from augmentedgp.variational import LowRankQ  # noqa: E402

PARTS, THRESHOLDS = ("gauss", "lowrank", "blr", "gp", "svgp"), (1e-1, 1e-2)
_e, _s = (lambda x: fmt(x, ".1e")), (lambda x: fmt(x, ".2f"))


# --- timing: run seconds less JAX's compile time and the measurement callbacks -------------


class Recorder:
    """A ``callback`` for the training loops: at each chunk boundary, the run's seconds so
    far (wall since :meth:`start`, less compile time and this callback's own time) and
    ``measure(model)`` (every ``every``-th call)."""

    def __init__(self, measure, every=1):
        self.measure, self.every, self.clock = measure, every, H.CompileClock.get()

    def start(self):
        self.records, self.calls, self.cb, self.cb_compile = [], 0, 0.0, 0.0
        self.t0, self.wall0 = time.perf_counter(), time.time()
        return self

    def elapsed(self):
        comp = self.clock.seconds_since(self.wall0)
        return (time.perf_counter() - self.t0 - self.cb - (comp - self.cb_compile),
                comp - self.cb_compile)

    def __call__(self, i, objective, model):
        a, comp0 = time.perf_counter(), self.clock.seconds_since(self.wall0)
        run_s, compile_s = self.elapsed()
        rec = {"iter": int(i), "time": run_s, "compile": compile_s, "objective": float(objective)}
        if (self.calls + 1) % self.every == 0:
            rec.update(self.measure(model))
        self.records.append(rec)
        self.calls += 1
        self.cb += time.perf_counter() - a
        self.cb_compile += self.clock.seconds_since(self.wall0) - comp0
        return False


def timed_fit(fit, iters, chunk, rec):
    """``fit(max_iter, callback)`` for ``chunk`` iterations (warm-up: compiles and pays the
    first-call costs), then for ``iters`` with ``rec`` started: (result, compile seconds)."""
    warm = Recorder(rec.measure).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fit(chunk, warm)
        out = fit(iters, rec.start())
    return out, warm.elapsed()[1] + rec.elapsed()[1]


def diverged(history):
    msg = getattr(history, "message", "") or ""
    return msg if "non-finite" in msg else None


# --- 1. Gaussian targets -------------------------------------------------------------------


class GaussianTarget(agp.inference.flow.Target):
    """phi(x) = (x - mu)^T Lam (x - mu) / 2 (arrays as fields: one program per dimension)."""

    mu: jax.Array = None
    Lam: jax.Array = None

    def log_prior(self, x):
        d = x - self.mu
        return -0.5 * d @ self.Lam @ d

    def potentials(self, X, batch, scale):
        Dm = X - self.mu
        return 0.5 * jnp.sum((Dm @ self.Lam) * Dm, axis=1)


def gaussian_problem(D, kappa, seed, low=0.1):
    rng = np.random.default_rng([seed, D, int(round(kappa))])
    mu = rng.standard_normal(D)
    U, _ = np.linalg.qr(rng.standard_normal((D, D)))
    lam = low * 10.0 ** (np.log10(kappa) * np.arange(D) / max(D - 1, 1))
    return mu, (U * lam) @ U.T, lam


GAUSS_METHODS = {
    "GPF": ("gd", lambda lr, D: agp.ParticleFlow(learning_rate=lr)),
    "GPF (natural mean)": ("gd", lambda lr, D: agp.ParticleFlow(learning_rate=lr,
                                                               natural_mean=True)),
    "GF": ("gd", lambda lr, D: agp.GaussianFlow(learning_rate=lr)),
    "ADVI full rank (Adam)": ("adam", lambda lr, D: agp.ADVI(n_samples=D + 1, learning_rate=lr)),
    "ADVI mean field (Adam)": ("adam", lambda lr, D: agp.ADVI(n_samples=D + 1, mean_field=True,
                                                              learning_rate=lr)),
    "SVGD (RBF)": ("gd", lambda lr, D: agp.SVGD(learning_rate=lr)),
    "SVGD (linear)": ("lin", lambda lr, D: agp.SVGD(kernel="linear", learning_rate=lr)),
}
GAUSS_GRIDS = {"gd": (0.01, 0.03, 0.1), "adam": (0.003, 0.01, 0.03), "lin": (0.001, 0.003, 0.01)}


def run_gaussian(D, kappa, method, iters, chunk, seed):
    mu, S, _ = gaussian_problem(D, kappa, seed)
    target = GaussianTarget(mu=jnp.asarray(mu), Lam=jnp.asarray(np.linalg.inv(S)))
    nmu, nS = np.linalg.norm(mu), np.linalg.norm(S)

    def measure(model):
        with np.errstate(all="ignore"):  # diverging runs
            return {"mean_err": float(np.linalg.norm(np.asarray(model[0].mean) - mu) / nmu),
                    "cov_err": float(np.linalg.norm(np.asarray(model[0].cov()) - S) / nS)}

    rec = Recorder(measure)
    q, compile_s = timed_fit(lambda n, cb: agp.fit_gaussian(
        target, jnp.zeros(D), method, key=jax.random.key(seed), max_iter=n, chunk_size=chunk,
        callback=cb), iters, chunk, rec)
    c = rec.records
    out = {"curve": c, "final": measure((q, target)), "diverged": diverged(q.history),
           "iters": q.history.n_iter, "run_s": rec.elapsed()[0], "compile_s": compile_s,
           "us_per_it": 1e6 * c[-1]["time"] / c[-1]["iter"] if c else None}
    for thr in THRESHOLDS:
        hit = next((r for r in c if r["mean_err"] < thr and r["cov_err"] < thr), None)
        out[f"hit_{thr:g}"] = None if hit is None else (hit["iter"], hit["time"])
    return out


def lr_score(res):
    """Rate selection: reached 1e-2 (fewest iterations first), else the smallest final
    error sum; diverged runs last."""
    if res["diverged"]:
        return (2, math.inf)
    if res["hit_0.01"] is not None:
        return (0, res["hit_0.01"][0])
    err = res["final"]["mean_err"] + res["final"]["cov_err"]
    return (1, err if math.isfinite(err) else math.inf)


def short(res):
    f, h = res["final"], res.get("hit_0.01")
    return (f"mean {f['mean_err']:.2e} cov {f['cov_err']:.2e}"
            + (" DIVERGED" if res["diverged"] else "")
            + (f", 1e-2 at it {h[0]} ({h[1]:.2f} s)" if h else ""))


def bench_gauss(args):
    methods = [m for m in GAUSS_METHODS if m in args.gauss_methods]
    grids = {k: v[:2] if args.quick else v for k, v in GAUSS_GRIDS.items()}
    d_sel = 20 if 20 in args.dims else max(args.dims)
    out = {"select": {}, "runs": {}, "grids": {m: grids[GAUSS_METHODS[m][0]] for m in methods},
           "d_select": d_sel}
    iters = {D: args.gauss_iters if D < 50 else args.gauss_iters_50 for D in args.dims}

    def run(D, kappa, m, lr):
        t = time.perf_counter()
        res = run_gaussian(D, kappa, GAUSS_METHODS[m][1](lr, D), iters[D], args.chunk,
                           args.seed)
        print(f"  gauss D={D} kappa={kappa:g} {m} lr={lr:g}: {short(res)} "
              f"({time.perf_counter() - t:.1f} s)", flush=True)
        return dict(res, lr=lr)

    for kappa in args.kappas:  # learning rates on D = d_sel, then the other dimensions
        for m in methods:
            tried = {lr: run(d_sel, kappa, m, lr) for lr in grids[GAUSS_METHODS[m][0]]}
            best = min(tried, key=lambda lr: lr_score(tried[lr]))
            out["select"][kappa, m] = {"lr": best, "tried": tried}
            out["runs"][d_sel, kappa, m] = tried[best]
    for D in [d for d in args.dims if d != d_sel]:
        for kappa in args.kappas:
            for m in methods:
                lrs = sorted((lr for lr in grids[GAUSS_METHODS[m][0]]
                              if lr <= out["select"][kappa, m]["lr"]), reverse=True)
                for j, lr in enumerate(lrs):  # a smaller rate where it diverges
                    res = out["runs"][D, kappa, m] = dict(run(D, kappa, m, lr), fallback=j > 0)
                    if not res["diverged"]:
                        break
    if "GPF" in methods and "GPF (natural mean)" in methods:  # Theorem 2: one step size
        runs = {(kappa, m): run_gaussian(d_sel, kappa, GAUSS_METHODS[m][1](0.01, d_sel),
                                         args.thm2_iters, args.chunk, args.seed)
                for kappa in (1.0, 10.0, 100.0) for m in ("GPF", "GPF (natural mean)")}
        out["thm2"] = {"eta": 0.01, "D": d_sel, "iters": args.thm2_iters, "runs": runs}
    return out


def first_below(curve, key, thr):
    return next((r["iter"] for r in curve if r.get(key, math.inf) < thr), None)


# --- 2. low rank ---------------------------------------------------------------------------


def bench_lowrank(args):
    D, kappa, eta = args.lowrank_dim, 100.0, args.lowrank_lr
    mu, S, lam = gaussian_problem(D, kappa, args.seed)
    lam = np.sort(lam)
    target = GaussianTarget(mu=jnp.asarray(mu), Lam=jnp.asarray(np.linalg.inv(S)))
    rows = []
    for N in args.particles:  # (natural_mean is refused below full rank)
        method = agp.ParticleFlow(n_particles=N, learning_rate=eta)
        rec = Recorder(lambda model: {})
        q, compile_s = timed_fit(lambda n, cb, method=method: agp.fit_gaussian(
            target, jnp.zeros(D), method, key=jax.random.key(args.seed), max_iter=n,
            chunk_size=500, callback=cb), args.lowrank_iters, 500, rec)
        C, k = np.asarray(q.cov()), min(N - 1, D)
        ev, top = np.sort(np.linalg.eigvalsh(C))[::-1][:k], lam[::-1][:k]
        rows.append({"N": N, "trace_gap": abs(float(np.trace(C - S))),
                     "predicted": float(lam[:D - N + 1].sum()) if N <= D else 0.0,
                     "eig_err": float(np.max(np.abs(ev - top) / top)),
                     "mean_err": float(np.linalg.norm(np.asarray(q.mean) - mu)
                                       / np.linalg.norm(mu)),
                     "run_s": rec.elapsed()[0], "compile_s": compile_s,
                     "diverged": diverged(q.history)})
        print(f"  lowrank N={N}: |tr(C - S)| {rows[-1]['trace_gap']:.6g} vs "
              f"{rows[-1]['predicted']:.6g}", flush=True)
    return {"D": D, "kappa": kappa, "eta": eta, "iters": args.lowrank_iters, "rows": rows,
            "lam": [float(lam[0]), float(lam[-1])]}


# --- 3. Bayesian logistic regression -------------------------------------------------------


def binary(name, n_train, n_test, seed):
    d = H.dataset(name, "official", n_train, n_test, seed=seed)
    ytr, yte = (np.where(y > 0, 1, 0) for y in (d.y, d.y_test))
    desc = (f"{name} (random {d.n} training / {len(yte)} test rows, seed {seed}; {d.d} "
            f"standardised features; {100 * ytr.mean():.1f} % positive)")
    return d.X, ytr, d.X_test, yte, desc


def nll_acc(p, y):
    p = np.clip(np.asarray(p, float), 1e-12, 1 - 1e-12)
    return {"nll": float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))),
            "acc": float(np.mean((p > 0.5) == (y > 0)))}


def blr_methods(D, opt, lr, batch):
    ad = optax.sgd(lr) if opt == "gd" else optax.rmsprop(lr)
    kw = {"learning_rate": lr, "batch_size": batch}
    return [("GPF", agp.ParticleFlow(optimizer=opt, **kw)),
            ("GPF mean field", agp.ParticleFlow(optimizer=opt, blocks="diagonal", **kw)),
            ("GF", agp.GaussianFlow(optimizer=opt, **kw)),
            ("ADVI full rank", agp.ADVI(n_samples=D + 1, optimizer=ad, **kw)),
            ("ADVI mean field", agp.ADVI(n_samples=D + 1, mean_field=True, optimizer=ad, **kw)),
            ("SVGD (RBF)", agp.SVGD(optimizer=opt, dimensionwise=opt != "gd", **kw))]


def run_numpyro_blr(guide_cls, lr, Xtr, ytr, Xte, yte, args):
    """numpyro SVI as its users write it; ``svi.run``'s scan of ``svi.update``, jitted and
    cut into chunks so that the test metrics can be taken between them."""
    dist, infer = numpyro.distributions, numpyro.infer
    X, y, Xte = jnp.asarray(Xtr), jnp.asarray(ytr, dtype=jnp.float64), jnp.asarray(Xte)
    D, sd = X.shape[1], math.sqrt(args.prior_var)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, sd).expand([D]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=args.batch):
            Xb, yb = numpyro.subsample(X, event_dim=1), numpyro.subsample(y, event_dim=0)
            numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)

    guide = guide_cls(model)
    svi = infer.SVI(model, guide, numpyro.optim.Adam(lr), infer.Trace_ELBO())
    step = jax.jit(lambda s: jax.lax.scan(lambda c, _: svi.update(c, X, y), s, None,
                                          length=args.blr_chunk))

    def measure(state):
        W = guide.sample_posterior(jax.random.PRNGKey(123), svi.get_params(state),
                                   sample_shape=(args.pred_samples,))["w"]
        return nll_acc(jnp.mean(jax.nn.sigmoid(W @ Xte.T), axis=0), yte)

    warm = Recorder(measure).start()
    warm(args.blr_chunk, 0.0, step(svi.init(jax.random.PRNGKey(args.seed), X, y))[0])
    rec, state, losses = Recorder(measure).start(), svi.init(jax.random.PRNGKey(args.seed), X,
                                                             y), []
    for i in range(args.blr_iters // args.blr_chunk):
        state, loss = step(state)
        losses.append(np.asarray(loss))
        rec((i + 1) * args.blr_chunk, float(np.mean(losses[-1])), state)
    run_s, compile_s = rec.elapsed()
    return {"curve": rec.records, "run_s": run_s, "compile_s": compile_s + warm.elapsed()[1],
            "diverged": None if np.all(np.isfinite(np.concatenate(losses))) else "non-finite",
            "lr": lr, "lib": "numpyro"}


def bench_blr(args):
    Xtr, ytr, Xte, yte, desc = binary(args.blr_data, args.blr_train, args.blr_test, args.seed)
    target = agp.contrib.bayesian.LogisticRegression(Xtr, ytr, prior_var=args.prior_var,
                                                     intercept=True)
    measure = lambda model: nll_acc(target.predict_proba(model[0], Xte, jax.random.key(123),
                                                         args.pred_samples), yte)
    runs = {}
    for opt, lr in (("gd", args.blr_lr_gd), ("rmsprop", args.blr_lr_rmsprop)):
        for name, method in blr_methods(target.dim, opt, lr, args.batch):
            rec = Recorder(measure)
            q, compile_s = timed_fit(lambda n, cb, method=method: agp.fit_gaussian(
                target, target.init(), method, key=jax.random.key(args.seed), max_iter=n,
                chunk_size=args.blr_chunk, callback=cb), args.blr_iters, args.blr_chunk, rec)
            run_s, c = rec.elapsed()[0], rec.records
            if not c or c[-1]["iter"] != q.history.n_iter:  # stopped early
                c.append(dict(iter=q.history.n_iter, time=run_s, **measure((q, target))))
            runs[name, opt] = {"curve": c, "run_s": run_s, "compile_s": compile_s, "lr": lr,
                               "diverged": diverged(q.history), "lib": "augmentedgp"}
            print(f"  blr {name} {opt}: NLL {c[-1]['nll']:.4f} acc {c[-1]['acc']:.4f} "
                  f"({run_s:.1f} s + compile {compile_s:.1f} s)", flush=True)
    if numpyro is not None:
        one = lambda X: np.hstack([X, np.ones((len(X), 1))])
        guides = numpyro.infer.autoguide
        for gname in ("AutoMultivariateNormal", "AutoNormal"):
            for lr in args.numpyro_lrs:
                r = runs[f"numpyro {gname}", f"Adam {lr:g}"] = run_numpyro_blr(
                    getattr(guides, gname), lr, one(Xtr), ytr, one(Xte), yte, args)
                print(f"  blr numpyro {gname} Adam {lr:g}: NLL {r['curve'][-1]['nll']:.4f} "
                      f"({r['run_s']:.1f} s + compile {r['compile_s']:.1f} s)", flush=True)
    return {"desc": desc, "D": target.dim, "runs": runs}


# --- 4. GP classification ------------------------------------------------------------------


def flow_posterior(q, target):
    """The SparsePosterior ``fit_flow`` builds from a flow's Gaussian over the whitened
    latents (here so that the ELBO can be taken during training)."""
    factor = q.factor if q.sd is None else jnp.concatenate([jnp.diag(q.sd), q.factor], axis=1)
    lowrank = LowRankQ(real(q.mean, "q mean"), real(factor, "q factor"))
    model = eqx.tree_at(lambda m: m.q, target.model, lowrank, is_leaf=lambda x: x is None)
    return agp.SparsePosterior(model, target.X, target.data[1])


def bench_gp(args):
    Xtr, ytr, Xte, yte, desc = binary(args.gp_data, args.gp_train, args.gp_test, args.seed)
    n, d = Xtr.shape
    ypm, ytest_pm = np.where(ytr > 0, 1.0, -1.0), np.where(yte > 0, 1.0, -1.0)
    lik = agp.likelihoods.Logistic()
    kern = jax.tree_util.tree_map(
        lambda p: fixed(p) if isinstance(p, Parameter) else p,
        agp.kernels.RBF(args.gp_lengthscale or math.sqrt(d), args.gp_variance),
        is_leaf=lambda p: isinstance(p, Parameter))
    kmax = float(np.linalg.eigvalsh(np.asarray(kern(jnp.asarray(Xtr))))[-1])

    def metrics(post):
        return {"elbo": float(post.elbo()),
                "nlpd": -float(np.mean(np.asarray(post.predict_log_density(Xte, ytest_pm)))),
                "acc": float(np.mean((np.asarray(post.predict_proba(Xte)) > 0.5) == (yte > 0)))}

    runs, every = {}, max(1, args.gp_iters // args.gp_chunk // 4)
    for name, inf in (("QuadratureVI (Cholesky q)", agp.QuadratureVI()),
                      ("AnalyticVI (Cholesky q)", agp.AnalyticVI())):
        rec = Recorder(lambda post: {})
        post, compile_s = timed_fit(lambda n, cb, inf=inf: agp.fit(
            agp.VGP(kern, lik, q="cholesky"), Xtr, ypm, inf, max_iter=n, callback=cb),
            args.gp_vi_iters, args.gp_vi_iters, rec)  # warm-up: the same fit
        runs[name] = dict(metrics(post), run_s=rec.elapsed()[0], compile_s=compile_s,
                          iters=post.history.n_iter, curve=[])
    flows = [(f"GPF, N = n + 1 = {n + 1}", agp.ParticleFlow(n_particles=n + 1,
                                                            learning_rate=args.gp_lr)),
             (f"GPF, N = 2n = {2 * n}", agp.ParticleFlow(n_particles=2 * n,
                                                         learning_rate=args.gp_lr)),
             (f"GF, n + 1 = {n + 1} samples", agp.GaussianFlow(learning_rate=args.gp_lr_gf))]
    for name, method in flows:
        rec = Recorder(lambda m: {"elbo": float(flow_posterior(*m).elbo())}, every=every)
        post, compile_s = timed_fit(lambda n, cb, method=method: agp.fit(
            agp.VGP(kern, lik), Xtr, ypm, method, max_iter=n, key=jax.random.key(args.seed),
            chunk_size=args.gp_chunk, callback=cb), args.gp_iters, args.gp_chunk, rec)
        runs[name] = dict(metrics(post), run_s=rec.elapsed()[0], compile_s=compile_s,
                          iters=post.history.n_iter, lr=method.learning_rate[0],
                          curve=[r for r in rec.records if "elbo" in r],
                          free_energy=float(np.mean(post.history.objective[-args.gp_chunk:])))
    for name, r in runs.items():
        print(f"  gp {name}: ELBO {r['elbo']:.3f} ({r['run_s']:.1f} s)", flush=True)
    return {"desc": desc, "n": n, "runs": runs, "kmax": kmax,
            "lengthscale": float(np.asarray(kern.lengthscale.value)),
            "variance": float(np.asarray(kern.variance.value))}


# --- 5. sparse GP classification -----------------------------------------------------------


def bench_svgp(args):
    """SVGP, fixed kernel and k-means Z: flows on the whitened inducing values against the
    ELBO's optimum (QuadratureVI, full batch) and QuadratureSVI on the same minibatches."""
    Xtr, ytr, Xte, yte, desc = binary(args.gp_data, args.svgp_train, args.gp_test, args.seed)
    n, d = Xtr.shape
    ypm, ytest_pm = np.where(ytr > 0, 1.0, -1.0), np.where(yte > 0, 1.0, -1.0)
    kern = agp.kernels.RBF(fixed(agp.core.params.positive(math.sqrt(d))),
                           fixed(agp.core.params.positive(args.gp_variance)))
    Z = fixed(real(np.asarray(agp.inducing.kmeans(Xtr, args.svgp_m, jax.random.key(0)))))
    M, b, iters = args.svgp_m, args.svgp_batch, args.svgp_iters

    def model():
        return agp.SVGP(kern, agp.likelihoods.Logistic(), Z)

    def metrics(post):
        return {"elbo": float(post.elbo()) / n,
                "nlpd": -float(np.mean(np.asarray(post.predict_log_density(Xte, ytest_pm)))),
                "acc": float(np.mean((np.asarray(post.predict_proba(Xte)) > 0.5) == (yte > 0)))}

    lr = args.svgp_lr
    configs = [("QuadratureVI (full batch)", agp.QuadratureVI(), args.gp_vi_iters),
               (f"QuadratureSVI({b})", agp.QuadratureSVI(b), iters),
               (f"GPF, N = M + 1 = {M + 1}, full batch", agp.ParticleFlow(learning_rate=lr),
                iters),
               (f"GPF, N = 2M = {2 * M}, batch {b}",
                agp.ParticleFlow(n_particles=2 * M, learning_rate=lr, batch_size=b), iters),
               (f"GF, M + 1 = {M + 1} samples, batch {b}",
                agp.GaussianFlow(learning_rate=lr, batch_size=b), iters)]
    runs = {}
    for name, inf, n_iter in configs:
        rec = Recorder(lambda m: {})
        post, compile_s = timed_fit(lambda k, cb, inf=inf: agp.fit(
            model(), Xtr, ypm, inf, max_iter=k, tol=0.0, key=jax.random.key(args.seed),
            chunk_size=args.gp_chunk, callback=cb), n_iter, args.gp_chunk, rec)
        runs[name] = dict(metrics(post), run_s=rec.elapsed()[0], compile_s=compile_s,
                          iters=post.history.n_iter, message=post.history.message)
        print(f"  svgp {name}: ELBO/n {runs[name]['elbo']:.4f} ({runs[name]['run_s']:.1f} s)",
              flush=True)
    return {"desc": desc, "n": n, "M": M, "runs": runs}


def svgp_lines(sv, args):
    ref = sv["runs"]["QuadratureVI (full batch)"]["elbo"]
    rows = [[name, r["iters"], f"{r['elbo']:.4f}", f"{r['elbo'] - ref:+.4f}",
             f"{r['nlpd']:.4f}", f"{r['acc']:.4f}", _s(r["run_s"]), _s(r["compile_s"])]
            for name, r in sv["runs"].items()]
    return [f"Data: {sv['desc']}; labels +-1. SVGP with M = {sv['M']} fixed k-means inducing "
            "inputs, RBF kernel (lengthscale sqrt(d), variance "
            f"{args.gp_variance:g}) fixed, logistic likelihood; the flows' q(v) over the "
            f"whitened inducing values, plain gradient steps at lr {args.svgp_lr:g} (below "
            "2 / the potential's largest curvature, at most n / 4 times the prior variance); "
            "QuadratureSVI with its default constant natural step 0.1. ELBO per training "
            "point by Gauss-Hermite at the final q.", "",
            markdown_table(["method", "iterations", "ELBO / n", "vs QuadratureVI",
                            "test NLPD", "test acc", "run s", "compile s"], rows), ""]


# --- report --------------------------------------------------------------------------------


def gauss_lines(g, args):
    lines, methods = [], [m for m in GAUSS_METHODS if m in args.gauss_methods]
    for kappa in args.kappas:
        rows = []
        for D in args.dims:
            base = g["runs"].get((D, kappa, "GPF"), {}).get("hit_0.01")
            for m in methods:
                r = g["runs"][D, kappa, m]
                h1, h2 = r["hit_0.1"], r["hit_0.01"]
                status = ", ".join((["diverged (" + r["diverged"].split("iteration")[-1].strip()
                                     + ")"] if r["diverged"] else [])
                                   + (["rate lowered (diverged)"] if r.get("fallback") else []))
                rows.append([D, m, f"{r['lr']:g}", _e(r["final"]["mean_err"]),
                             _e(r["final"]["cov_err"]),
                             *("—" if h is None else f"{h[1]:.3f} ({h[0]})" for h in (h1, h2)),
                             first_below(r["curve"], "cov_err", 1e-2) or "—",
                             _s(ratio(h2 and h2[1], base and base[1])),
                             fmt(r["us_per_it"], ".0f"), status or "ok"])
        lines += [f"**kappa = {kappa:g}** (eigenvalues of Sigma log-uniform from 0.1 to "
                  f"{0.1 * kappa:g}; {args.gauss_iters} iterations for D < 50, "
                  f"{args.gauss_iters_50} for D = 50)", "",
                  markdown_table(["D", "method", "lr", "final rel. mean err",
                                  "final rel. cov err", "s (iter) to 1e-1", "s (iter) to 1e-2",
                                  "iter to cov err 1e-2", "time to 1e-2 / GPF's", "us / iter",
                                  "status"], rows), ""]
    sel = [[f"{kappa:g}", m, f"{s['lr']:g}", "; ".join(
        f"{lr:g}: " + ("diverged" if t["diverged"] else f"1e-2 at it {t['hit_0.01'][0]}"
                       if t["hit_0.01"] else
                       f"{t['final']['mean_err']:.1e} / {t['final']['cov_err']:.1e}")
        for lr, t in s["tried"].items())] for (kappa, m), s in g["select"].items()]
    lines += [f"Learning-rate selection (D = {g['d_select']}; per rate: iterations to 1e-2 on "
              "both errors, or the final mean / cov errors):", "",
              markdown_table(["kappa", "method", "chosen", "grid"], sel), ""]
    if "thm2" in g:
        t = g["thm2"]
        rows = [[f"{kappa:g}", m] + [first_below(r["curve"], k, thr) or "—"
                                     for k in ("mean_err", "cov_err") for thr in (1e-2, 1e-6)]
                + [_e(r["final"]["mean_err"]), _e(r["final"]["cov_err"])]
                for (kappa, m), r in t["runs"].items()]
        lines += [f"Theorem 2 check: GPF at one step size eta = {t['eta']:g}, D = {t['D']}, "
                  f"{t['iters']} iterations (first chunk boundary, every {args.chunk} "
                  "iterations, where the relative error is below the threshold):", "",
                  markdown_table(["kappa", "method", "mean < 1e-2", "mean < 1e-6", "cov < 1e-2",
                                  "cov < 1e-6", "final mean err", "final cov err"], rows), ""]
    return lines


def lowrank_lines(lr):
    rows = [[r["N"], fmt(r["trace_gap"], ".6g"), fmt(r["predicted"], ".6g"),
             _e(abs(r["trace_gap"] - r["predicted"]) / r["predicted"]) if r["predicted"] > 0
             else _e(r["trace_gap"]), _e(r["eig_err"]), _e(r["mean_err"]), _s(r["run_s"]),
             "diverged" if r["diverged"] else "ok"] for r in lr["rows"]]
    return [f"D = {lr['D']}, eigenvalues of Sigma log-uniform from {lr['lam'][0]:g} to "
            f"{lr['lam'][1]:g} (kappa = {lr['kappa']:g}), GPF with plain gradient steps "
            f"eta = {lr['eta']:g}, {lr['iters']} iterations; prediction (Theorem 3): the sum "
            "of the D - N + 1 smallest eigenvalues of Sigma; *eig err* = max relative error of "
            "the N - 1 nonzero eigenvalues of C against the N - 1 largest of Sigma.", "",
            markdown_table(["N", "abs tr(C - Sigma)", "Theorem 3", "rel. difference",
                            "eig err", "rel. mean err", "run s", "status"], rows), ""]


def time_to(curve, target):
    return next((r["time"] for r in curve if r.get("nll", math.inf) <= target), None) \
        if target is not None else None


def blr_lines(b, args):
    runs = b["runs"]
    finals = [r["curve"][-1]["nll"] for r in runs.values() if r["curve"] and not r["diverged"]]
    target = min(finals) + args.nll_margin if finals else None
    its, ch = args.blr_iters, args.blr_chunk
    marks = sorted({max(ch, round(its * f / ch) * ch) for f in (1 / 6, 1 / 3, 2 / 3)})
    gpf = {opt: time_to(r["curve"], target) for (n, opt), r in runs.items() if n == "GPF"}
    rows = []
    for (name, opt), r in runs.items():
        c, tt = r["curve"], time_to(r["curve"], target)
        cells = [next((f"{x['nll']:.4f} ({x['time']:.1f} s)" for x in c if x["iter"] == it),
                      "—") for it in marks]
        rows.append([name, opt, f"{r['lr']:g}", fmt(1e6 * c[-1]["time"] / c[-1]["iter"], ".0f"),
                     *cells, f"{c[-1]['nll']:.4f}", f"{c[-1]['acc']:.4f}", _s(c[-1]["time"]),
                     _s(r["compile_s"]), _s(tt),
                     _s(ratio(tt, gpf.get(opt) if r["lib"] == "augmentedgp" else None)),
                     "diverged" if r["diverged"] else "ok"])
    header = (["method", "optimiser", "lr", "us / iter"]
              + [f"NLL at it {it} (s)" for it in marks]
              + [f"final NLL (it {its})", "final acc", "run s", "compile s",
                 f"s to NLL <= {target:.4f}" if target else "s to target",
                 "/ GPF's (same optimiser)", "status"])
    return [f"Data: {b['desc']}; D = {b['D']} weights (features + intercept).", "",
            markdown_table(header, rows), ""]


def gp_lines(gp, args):
    ref = gp["runs"]["QuadratureVI (Cholesky q)"]["elbo"]
    rows = [[name, fmt(r.get("lr"), "g"), r["iters"], f"{r['elbo']:.3f}",
             f"{r['elbo'] - ref:+.3f}", fmt(r.get("free_energy") and -r["free_energy"], ".3f"),
             f"{r['nlpd']:.4f}", f"{r['acc']:.4f}", _s(r["run_s"]), _s(r["compile_s"]),
             ", ".join(f"{x['iter']}: {x['elbo']:.2f}" for x in r["curve"]) or "—"]
            for name, r in gp["runs"].items()]
    return [f"Data: {gp['desc']}; labels +-1. Kernel: RBF, lengthscale {gp['lengthscale']:.4g}, "
            f"variance {gp['variance']:.4g}, fixed (largest eigenvalue of K: {gp['kmax']:.1f}); "
            "logistic likelihood. QuadratureVI / AnalyticVI: `fit(VGP(kernel, Logistic(), "
            f"q=\"cholesky\"), X, y, ...)` (at most {args.gp_vi_iters} iterations); flows: "
            f"`fit(VGP(kernel, Logistic()), X, y, flow, max_iter={args.gp_iters})`, plain "
            "gradient steps.", "",
            markdown_table(["method", "lr", "iterations", "ELBO", "vs QuadratureVI",
                            "particle / MC -F (last chunk)", "test NLPD", "test acc", "run s",
                            "compile s", "ELBO during training (iteration: ELBO)"], rows), ""]


def claims(res):
    """The thesis' claims (ch. 6 section 4) against this run's numbers."""
    out, g, verdict = [], res.get("gauss"), lambda ok: "reproduces" if ok else \
        "does not reproduce"
    if g:
        pick = lambda m: {k[:2]: r for k, r in g["runs"].items() if k[2] == m}
        gpf, nat, gf, advi = (pick(m) for m in ("GPF", "GPF (natural mean)", "GF",
                                                "ADVI full rank (Adam)"))
        if gpf:
            cov = max(r["final"]["cov_err"] for r in gpf.values())
            mean10 = max((r["final"]["mean_err"] for k, r in gpf.items() if k[1] < 50),
                         default=None)
            mean_nat = max((r["final"]["mean_err"] for r in nat.values()), default=None)
            out.append(f"- Theorem 1 (D + 1 particles: GPF exact on Gaussian targets): **"
                       f"{verdict(cov < 1e-8 and (mean_nat is None or mean_nat < 1e-6))}**. "
                       f"Largest final relative covariance error of GPF {cov:.1e}; mean error "
                       f"{_e(mean10)} at kappa = 10, with the natural-gradient mean step "
                       f"{_e(mean_nat)} at every kappa (plain steps at kappa = 100 converge at "
                       "rate eta / lam_max(Sigma)).")
        rat = [gf[k]["final"]["cov_err"] / advi[k]["final"]["cov_err"] for k in gf
               if k in advi and not gf[k]["diverged"] and not advi[k]["diverged"]]
        if rat:
            out.append("- GF is noise-limited like DSVI / ADVI: **"
                       f"{verdict(0.2 < min(rat) and max(rat) < 5.0)}** (within a factor 5): "
                       f"GF's final covariance error / full-rank ADVI's {min(rat):.2f}-"
                       f"{max(rat):.2f} (both stochastic with D + 1 samples), GPF is exact.")
        rbf = pick("SVGD (RBF)")
        if rbf:
            me, ce = ([r["final"][k] for r in rbf.values()] for k in ("mean_err", "cov_err"))
            out.append(f"- Sq.-exp. SVGD: good mean, bad covariance: **"
                       f"{verdict(min(ce) > 0.1 and float(np.median(me)) < 0.05)}**: final "
                       f"relative mean error {min(me):.1e}-{max(me):.1e}, covariance error "
                       f"{min(ce):.2f}-{max(ce):.2f}.")
        lin = pick("SVGD (linear)")
        if lin:
            sel = [t for (k, m), s in g["select"].items() if m == "SVGD (linear)"
                   for t in s["tried"].items()]
            div = sorted({lr for lr, t in sel if t["diverged"]})
            hits = [f"D = {k[0]}, kappa = {k[1]:g}" for k, r in lin.items() if r["hit_0.01"]]
            out.append(
                "- Linear SVGD: \"good when stable, most runs diverge\": **partly**: diverged in "
                f"{sum(1 for _, t in sel if t['diverged'])} of {len(sel)} grid runs on D = "
                f"{g['d_select']} (lr {', '.join(format(x, 'g') for x in div) or '—'}); at the "
                f"selected lr, {sum(1 for r in lin.values() if r['diverged'])} of {len(lin)} "
                f"runs diverged; 1e-2 on both errors within the budget: {'; '.join(hits) or 'none'}"
                ". One seed per target: the thesis' fraction of divergent runs is not measured.")
        t = g.get("thm2")
        if t:
            r = t["runs"]
            fb = lambda m, key, thr, ks: "/".join(str(first_below(r[k, m]["curve"], key, thr))
                                                  for k in ks)
            stable = {k: max((lr for lr, x in s["tried"].items() if not x["diverged"]),
                             default=None) for (k, m), s in g["select"].items() if m == "GPF"}
            out.append(
                "- Theorem 2 (covariance speed independent of Sigma; the mean's depends on "
                "Lambda unless the natural gradient is used): **reproduces at a fixed step** "
                f"(eta = {t['eta']:g}: covariance error below 1e-6 after "
                f"{fb('GPF', 'cov_err', 1e-6, (1.0, 10.0, 100.0))} iterations at kappa = "
                f"1/10/100; mean below 1e-2 after {fb('GPF', 'mean_err', 1e-2, (1.0, 100.0))} "
                "at kappa = 1/100 with plain steps, "
                f"{fb('GPF (natural mean)', 'mean_err', 1e-2, (1.0, 100.0))} with the natural "
                "mean), **but the stable step is not independent of Sigma**: the largest stable "
                "rate of the grid was " + ", ".join(f"{fmt(v, 'g')} at kappa = {k:g}"
                                                    for k, v in stable.items())
                + ". Linearised at C = Sigma, the off-diagonal modes of C decay at rate lam_i / "
                "lam_j + lam_j / lam_i, so explicit steps need eta < 2 / (kappa + 1 / kappa): "
                "in iterations, GPF's covariance converges about kappa times slower on "
                "ill-conditioned targets.")
    lr = res.get("lowrank")
    rows = [r for r in (lr or {}).get("rows", []) if r["predicted"] > 0]
    if rows:
        worst = max(abs(r["trace_gap"] - r["predicted"]) / r["predicted"] for r in rows)
        out.append(f"- Theorem 3 (N < D + 1: |tr(C - Sigma)| = the sum of the D - N + 1 "
                   f"smallest eigenvalues): **{verdict(worst < 1e-3)}** (largest relative "
                   f"difference {worst:.1e}).")
    b = res.get("blr")
    if b:
        parts, gaps = [], []
        for opt in ("gd", "rmsprop"):
            v = {n: r["curve"][-1]["nll"] for (n, o), r in b["runs"].items() if o == opt}
            if "GPF" in v and "GF" in v:
                gaps += [abs(v["GPF"] - v["GF"]), abs(v["GPF"] - v.get("GPF mean field", 9.0))]
                parts.append(f"{opt}: " + ", ".join(f"{k} {x:.4f}" for k, x in v.items()
                                                    if not k.startswith("numpyro")))
        us = {lib: [1e6 * r["curve"][-1]["time"] / r["curve"][-1]["iter"]
                    for r in b["runs"].values() if r["lib"] == lib]
              for lib in ("augmentedgp", "numpyro")}
        out.append("- BLR: \"GPF and GF consistently on par\", \"mean field does not hurt\": **"
                   f"{verdict(gaps and max(gaps) < 0.01)}** (final test NLL within 0.01; "
                   + "; ".join(parts) + f"). Library methods: {min(us['augmentedgp']):.0f}-"
                   f"{max(us['augmentedgp']):.0f} us per iteration"
                   + (f", numpyro SVI {min(us['numpyro']):.0f}-{max(us['numpyro']):.0f} us (one "
                      "sample per step against D + 1)" if us["numpyro"] else "") + ".")
    gp = res.get("gp")
    if gp:
        ref = gp["runs"]["QuadratureVI (Cholesky q)"]["elbo"]
        flows = {k: v for k, v in gp["runs"].items() if k.startswith(("GPF", "GF"))}
        out.append("- GP classification (not in the thesis): ELBO against QuadratureVI's optimum "
                   + ", ".join(f"{k} {v['elbo'] - ref:+.3f}" for k, v in flows.items())
                   + ". GPF's particle free energy is biased (its -F "
                   + ", ".join(f"{-v['free_energy']:.2f}" for k, v in flows.items()
                               if k.startswith("GPF"))
                   + f" against the optimal ELBO {ref:.2f}); more particles shrink the bias; "
                   "GF's Monte Carlo estimate is unbiased.")
    return out


def body(args, res):
    lines = []
    if "gauss" in res:
        grids = "; ".join(f"{m}: {', '.join(f'{x:g}' for x in v)}"
                          for m, v in res["gauss"]["grids"].items())
        lines += [
            "### 1. Gaussian targets (thesis 4.1)", "",
            "Target N(mu, Sigma): mu ~ N(0, I), Sigma = U diag(lam) U^T (U random orthogonal), "
            "log10 lam_i = log10(kappa) (i - 1) / (D - 1) - 1; one target per (D, kappa); every "
            "method starts at mean 0, covariance I, with D + 1 particles / samples: GPF "
            "`ParticleFlow(learning_rate=lr)` (plain steps), the same with "
            "`natural_mean=True`, GF `GaussianFlow`, `ADVI(n_samples=D + 1)` full rank and "
            "mean field (Adam), `SVGD` (RBF, median heuristic) and `SVGD(kernel=\"linear\")`. "
            "Errors ||m - mu|| / ||mu|| and ||C - Sigma||_F / ||Sigma||_F at every chunk "
            f"boundary ({args.chunk} iterations); *s (iter) to 1e-x*: the first boundary where "
            f"both are below 1e-x; the ratio is against GPF. Rate grids: {grids}; the best per "
            f"method and kappa picked on D = {res['gauss']['d_select']} and reused for the "
            "other D (the next smaller rate where it diverged).", "",
            *gauss_lines(res["gauss"], args)]
    if "lowrank" in res:
        lines += ["### 2. Low-rank GPF (thesis 4.2, Theorem 3)", "", *lowrank_lines(res["lowrank"])]
    if "blr" in res:
        lines += [
            "### 3. Bayesian logistic regression (thesis 4.5)", "",
            "`agp.contrib.bayesian.LogisticRegression(X, y, prior_var="
            f"{args.prior_var:g}, intercept=True)`, `fit_gaussian(target, target.init(), "
            f"method, max_iter={args.blr_iters}, chunk_size={args.blr_chunk})`, minibatches of "
            f"{args.batch}, D + 1 particles / samples; plain steps at lr {args.blr_lr_gd:g} "
            f"(the thesis' step) and RMSProp at lr {args.blr_lr_rmsprop:g} (dimension-wise, "
            "shared across particles; `optax.rmsprop` for ADVI). Test NLL and accuracy from "
            f"{args.pred_samples} draws of w ~ q. Target NLL = the best final NLL + "
            f"{args.nll_margin:g}. numpyro: `SVI(model, guide, numpyro.optim.Adam(lr), "
            "Trace_ELBO())` with `AutoMultivariateNormal` / `AutoNormal`, the model with "
            f"`numpyro.plate(subsample_size={args.batch})`, `svi.update` in a jitted `lax.scan` "
            f"in chunks of {args.blr_chunk}.", "", *blr_lines(res["blr"], args)]
    if "gp" in res:
        lines += ["### 4. GP classification: VGP with particle flows vs QuadratureVI / "
                  "AnalyticVI", "", *gp_lines(res["gp"], args)]
    if "svgp" in res:
        lines += ["### 5. Sparse GP classification: SVGP with particle flows vs QuadratureVI / "
                  "QuadratureSVI", "", *svgp_lines(res["svgp"], args)]
    c = claims(res)
    return lines + (["### The thesis' claims against this run", "", *c] if c else [])


def main():
    p = H.parser(__doc__)
    p.add_argument("--parts", default=",".join(PARTS), help="subset of " + ",".join(PARTS))
    p.add_argument("--gauss-methods", default=",".join(GAUSS_METHODS))
    for name in ("--blr-data", "--gp-data"):
        p.add_argument(name, default="ijcnn1", choices=("ijcnn1", "a9a", "a9a_small"))
    # (option, type, default): None takes the --quick / full default below
    for name, kind, default in (
            ("seed", int, 0), ("dims", str, None), ("kappas", str, None),
            ("gauss-iters", int, None), ("gauss-iters-50", int, None), ("thm2-iters", int, None),
            ("chunk", int, 50), ("lowrank-dim", int, 50), ("particles", str, None),
            ("lowrank-lr", float, 0.015), ("lowrank-iters", int, None), ("blr-train", int, None),
            ("blr-test", int, None), ("blr-iters", int, None), ("blr-chunk", int, 250),
            ("blr-lr-gd", float, 1e-4), ("blr-lr-rmsprop", float, 3e-3),
            ("numpyro-lrs", str, None), ("batch", int, 100), ("prior-var", float, 10.0),
            ("pred-samples", int, 200), ("nll-margin", float, 0.01), ("gp-train", int, None),
            ("gp-test", int, 1000), ("gp-lengthscale", float, None), ("gp-variance", float, 1.0),
            ("gp-iters", int, None), ("gp-chunk", int, 100), ("gp-lr", float, 0.02),
            ("gp-lr-gf", float, 0.005), ("gp-vi-iters", int, 500), ("svgp-train", int, None),
            ("svgp-m", int, 50), ("svgp-batch", int, 200), ("svgp-iters", int, None),
            ("svgp-lr", float, 0.001)):
        p.add_argument(f"--{name}", type=kind, default=default)
    args = H.parse(p, {"dims": "5,20", "kappas": "10", "gauss_iters": 1000,
                       "gauss_iters_50": 1000, "thm2_iters": 2000, "particles": "2,10,51",
                       "lowrank_iters": 3000,
                       "blr_train": 1000, "blr_test": 1000, "blr_iters": 1000,
                       "numpyro_lrs": "0.01", "gp_train": 100, "gp_iters": 600,
                       "svgp_train": 1000, "svgp_iters": 600},
                   {"dims": "5,20,50", "kappas": "10,100", "gauss_iters": 3000,
                    "gauss_iters_50": 2000, "thm2_iters": 6000, "particles": "2,5,10,20,51",
                    "lowrank_iters": 6000,
                    "blr_train": 5000, "blr_test": 5000, "blr_iters": 2000,
                    "numpyro_lrs": "0.01,0.001", "gp_train": 200, "gp_iters": 2000,
                    "svgp_train": 5000, "svgp_iters": 3000})
    args.dims, args.kappas = H.csv(args.dims, int), H.csv(args.kappas, float)
    args.particles, args.numpyro_lrs = H.csv(args.particles, int), H.csv(args.numpyro_lrs, float)
    args.gauss_methods, parts = H.csv(args.gauss_methods), H.csv(args.parts)
    if set(parts) - set(PARTS) or set(args.gauss_methods) - set(GAUSS_METHODS):
        p.error("unknown parts or methods")
    if (args.blr_iters % args.blr_chunk or args.gp_iters % args.gp_chunk
            or args.svgp_iters % args.gp_chunk):
        p.error("--blr-iters / --gp-iters / --svgp-iters must be multiples of their chunk "
                "sizes")
    res = {}
    for part, fn in (("gauss", bench_gauss), ("lowrank", bench_lowrank), ("blr", bench_blr),
                     ("gp", bench_gp), ("svgp", bench_svgp)):
        if part in parts:
            t = time.perf_counter()
            res[part] = fn(args)
            print(f"== {part}: {time.perf_counter() - t:.0f} s", flush=True)
    intro = ["The experiments of thesis ch. 6 section 4 (4.1, 4.2, 4.5) in miniature, plus a "
             "GP-classification application; every method runs in this one process, one after "
             "the other. **Timing.** A run's seconds are wall seconds less JAX's compile time "
             "(its trace / lower / compile monitoring events) and less the measurement "
             "callback's time, read at chunk boundaries; compile seconds are shown apart; "
             "every configuration first runs one chunk (warm-up); synchronous CPU dispatch."]
    text = H.report("Gaussian particle flow: GPF / GF vs ADVI, SVGD and numpyro SVI (thesis "
                    "ch. 6)", intro, body(args, res), H.versions("optax"))
    # a run of some parts writes a section of its own, next to the full run's
    H.finish(args, text, res, section="" if set(parts) == set(PARTS) else ", ".join(parts))


if __name__ == "__main__":
    main()
