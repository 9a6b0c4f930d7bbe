"""Heteroscedastic regression benchmark: augmentedgp's augmented two-latent model against
GPflow's heteroskedastic SVGP.

A synthetic problem with a known noise sd (y = sin(2x) + s(x) eps) and a real one (default
protein): augmentedgp ``SVGP([RBF, RBF], HeteroscedasticGaussian)`` by ``AnalyticSVI`` and
``QuadratureSVI`` (and a homoscedastic baseline) against GPflow's
``HeteroskedasticTFPConditional`` SVGP (NGD + Adam; Adam). The noise links differ, so the
models are compared on predictive quality (one scoring function), noise recovery and time
(``harness.race``).

    /work/peers-venv/bin/python benchmarks/heteroscedastic.py            # full, ~13 min
    /work/peers-venv/bin/python benchmarks/heteroscedastic.py --quick    # synthetic, ~2 min
"""

from __future__ import annotations

import dataclasses
import math

import harness as H

# one core for the whole process (--threads 1): jaxlib 0.10.2's batched Cholesky of the two
# latents deadlocks XLA's 2-thread intra-op pool at M >= 67; with one CPU it runs inline
H.start("heteroscedastic.py", pin="process", peers=("gpflow",))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, gpflow, label, ratio, tfp  # noqa: E402

import augmentedgp as agp  # noqa: E402

REAL = ("power_plant", "protein", "kin40k", "naval", "concrete", "energy", "yacht", "boston")
AGP = ("AnalyticSVI", "QuadratureSVI", "homoscedastic AnalyticSVI")
G0 = "AnalyticSVI, g mean 0"  # sensitivity: the initial precision 2 / noise0 (headroom 2)
OURS, HOMO = ("augmentedgp", "AnalyticSVI"), ("augmentedgp", "homoscedastic AnalyticSVI")
METRICS = ("nll", "rmse", "sd_rmse", "sd_corr", "sd_logrmse", "f_rmse")
GH_X, GH_W = np.polynomial.hermite_e.hermegauss(40)  # nodes in g for the common test NLL
GH_LOGW = np.log(GH_W / math.sqrt(2.0 * math.pi))


def noise_sd_true(x):
    return 0.1 + 0.45 * (1.0 - np.cos(x))  # 0.1 at x = 0, ~0.995 at x = +-3


def synthetic(n_train, n_test, seed=0):
    rng = np.random.default_rng(seed)

    def draw(n):
        x = rng.uniform(-3.0, 3.0, n)
        return x[:, None], np.sin(2.0 * x) + noise_sd_true(x) * rng.standard_normal(n)

    (X, y), (Xt, yt) = draw(n_train), draw(n_test)
    return H.Data("synthetic", X, y, Xt, yt, f"x ~ U[-3, 3], seed {seed}; raw scale",
                  {"grid": np.linspace(-3.0, 3.0, 201)[:, None]})


# --- scoring: one function for every library ---------------------------------------------


@dataclasses.dataclass
class Prediction:
    """f ~ N(mf, vf), g ~ N(mg, vg) at the test points (and the grid), the noise variance a
    function of g: ``link`` sigmoid (1 / (lam sigmoid(g))), exp (exp(2 g)) or const (lam)."""

    mf: object
    vf: object
    mg: object
    vg: object
    link: str
    lam: float = 1.0

    def noise_var(self, g):
        if self.link == "sigmoid":
            return (1.0 + np.exp(np.minimum(-g, 700.0))) / self.lam
        return np.exp(np.minimum(2.0 * g, 1400.0))

    def expected_noise_var(self):
        if self.link == "const":
            return np.full_like(self.mf, self.lam)
        if self.link == "sigmoid":  # E[1 + e^-g] = 1 + e^(-m + v/2)
            return (1.0 + np.exp(-self.mg + 0.5 * self.vg)) / self.lam
        return np.exp(2.0 * self.mg + 2.0 * self.vg)  # E[e^2g]

    def take(self, sl):
        pick = lambda a: None if a is None else a[sl]
        return Prediction(self.mf[sl], self.vf[sl], pick(self.mg), pick(self.vg), self.link,
                          self.lam)


def log_density(pred, y):
    """log int N(y | mf, vf + noise(g)) N(g | mg, vg) dg."""
    if pred.link == "const":
        v = pred.vf + pred.lam
        return -0.5 * (np.log(2 * np.pi * v) + (y - pred.mf) ** 2 / v)
    g = pred.mg[:, None] + np.sqrt(np.maximum(pred.vg, 0.0))[:, None] * GH_X
    v = pred.vf[:, None] + pred.noise_var(g)
    lp = -0.5 * (np.log(2 * np.pi * v) + (y - pred.mf)[:, None] ** 2 / v) + GH_LOGW
    top = np.max(lp, axis=1, keepdims=True)
    return top[:, 0] + np.log(np.sum(np.exp(lp - top), axis=1))


def scorer(data):
    """Test NLL and RMSE; synthetic: the noise recovery on the grid (RMS error and
    correlation of sqrt(E[noise variance]) against s(x), RMS of log(fitted / true)) and the
    RMS error of the mean against sin(2x)."""
    nt = len(data.y_test)

    def score(pred):
        out = dict.fromkeys(METRICS, math.nan)
        if all(np.all(np.isfinite(a)) for a in (pred.mf, pred.vf, pred.mg, pred.vg)
               if a is not None):
            test = pred.take(slice(0, nt))
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                out["nll"] = -float(np.mean(log_density(test, data.y_test)))
            out["rmse"] = float(np.sqrt(np.mean((data.y_test - test.mf) ** 2)))
            if "grid" in data.meta:
                grid, x = pred.take(slice(nt, None)), data.meta["grid"][:, 0]
                sd, true = np.sqrt(grid.expected_noise_var()), noise_sd_true(x)
                out.update(sd_rmse=float(np.sqrt(np.mean((sd - true) ** 2))),
                           sd_corr=float(np.corrcoef(sd, true)[0, 1]) if np.std(sd) > 0
                           else math.nan,
                           sd_logrmse=float(np.sqrt(np.mean(np.log(sd / true) ** 2))),
                           f_rmse=float(np.sqrt(np.mean((grid.mf - np.sin(2 * x)) ** 2))))
        return tuple(out[m] for m in METRICS)

    return score


def eval_inputs(data):
    return np.concatenate([data.X_test, data.meta["grid"]]) if "grid" in data.meta \
        else data.X_test


# --- configurations -------------------------------------------------------------------------


def configs(data, M, args):
    score, Xe = scorer(data), eval_inputs(data)
    Z = np.asarray(agp.inducing.kmeans(data.X, M, jax.random.key(0)))
    ls = np.full(data.d, 1.0 if "grid" in data.meta else math.sqrt(data.d))
    mean_y, noise0 = float(np.mean(data.y)), 0.1 * float(np.var(data.y))
    rbf = lambda: agp.kernels.RBF(lengthscale=ls.copy(), variance=1.0)
    Zf = agp.params.fixed(agp.params.real(Z, "inducing"))

    def agp_run(scheme):
        def build(notes):
            if scheme == "homoscedastic AnalyticSVI":
                model = agp.SVGP(rbf(), agp.likelihoods.Gaussian(noise0), Zf,
                                 mean=agp.means.Constant(mean_y), q="natural_whitened")
            else:  # plug-in noise 1 / (lam sigmoid(g0)) = noise0, floor noise0 / h
                h = 2.0 if scheme == G0 else args.headroom
                model = agp.SVGP([rbf(), rbf()], agp.likelihoods.HeteroscedasticGaussian(
                    precision=h / noise0), Zf, mean=[agp.means.Constant(mean_y),
                                                     agp.means.Constant(-math.log(h - 1.0))],
                    q="whitened" if scheme == "QuadratureSVI" else "natural_whitened")
            inf = (agp.QuadratureSVI(args.batch, 0.1) if scheme == "QuadratureSVI"
                   else agp.AnalyticSVI(args.batch, args.agp_step_schedule))
            return H.AgpRunner(data, model, inf, predict=agp_predict).warmup(score)
        return build

    def agp_predict(r):
        mean, var = (np.asarray(a) for a in r.model.predict_f(Xe))
        lik = r.model.likelihood
        if not hasattr(lik, "precision"):
            return Prediction(mean.ravel(), var.ravel(), None, None, "const",
                              float(lik.variance.value))
        return Prediction(mean[:, 0], var[:, 0], mean[:, 1], var[:, 1], "sigmoid",
                          float(lik.precision.value))

    def gpflow_predict(r):
        mean, var = (a.numpy() for a in r.model.predict_f(Xe))
        return Prediction(mean[:, 0], var[:, 0], mean[:, 1], var[:, 1], "exp")

    def gpflow_run(scheme):
        def make(ngd):
            lik = gpflow.likelihoods.HeteroskedasticTFPConditional(
                distribution_class=tfp.distributions.Normal,
                scale_transform=tfp.bijectors.Exp())
            kernel = gpflow.kernels.SeparateIndependent(
                [gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=ls.copy())
                 for _ in range(lik.latent_dim)])
            inducing = gpflow.inducing_variables.SharedIndependentInducingVariables(
                gpflow.inducing_variables.InducingPoints(Z.copy()))
            mean = gpflow.mean_functions.Constant(np.array([mean_y, 0.5 * math.log(noise0)]))
            m = gpflow.models.SVGP(kernel, lik, inducing, mean_function=mean,
                                   num_latent_gps=lik.latent_dim, num_data=data.n, whiten=True)
            gpflow.set_trainable(m.inducing_variable, False)
            return H.GpflowRunner(data, m, scheme, batch=args.batch, ngd=ngd,
                                  predict=gpflow_predict)

        return lambda notes: H.gpflow_build(make, score, notes, ("gpflow", scheme),
                                            options=((0.1, "XiNat"), (0.01, "XiNat")))

    keys = [("augmentedgp", s) for s in AGP]
    if args.headroom != 2.0:
        keys.insert(2, ("augmentedgp", G0))
    out = {k: agp_run(k[1]) for k in keys}
    if "gpflow" not in H.SKIPPED:
        out.update({("gpflow", s): gpflow_run(s) for s in ("NGD+Adam", "Adam")})
    return H.select(out, args)


def native_nll(key, r):
    d = r.data
    if key[0] == "augmentedgp":
        return -float(np.mean(np.asarray(r.model.predict_log_density(d.X_test, d.y_test))))
    return -float(np.mean(r.model.predict_log_density((d.X_test, d.y_test[:, None])).numpy()))


def fitted(key, r):
    if key[0] == "gpflow":
        c = r.model.mean_function.c.numpy()
        v = [float(k.variance.numpy()) for k in r.model.kernel.kernels]
        return f"g mean {c[1]:.3g}, kernel variances {np.round(v, 3).tolist()}"
    lik = r.model.likelihood
    if not hasattr(lik, "precision"):
        return f"noise variance {float(lik.variance.value):.4g}"
    return (f"precision {float(lik.precision.value):.4g}, g mean "
            f"{np.asarray(r.model.mean.c.value)[1]:.3g}, kernel variances "
            f"{np.round(np.asarray(r.model.kernel.variance.value), 3).tolist()}")


# --- report ---------------------------------------------------------------------------------


def final(res, key, metric="nll"):
    return H.final(res, key, 2 + METRICS.index(metric))


def findings(all_res):
    lines = []
    for res in all_res:
        s, parts = res["summary"], []
        f_ours, f_homo = final(res, OURS), final(res, HOMO)
        if f_ours is not None and f_homo is not None:
            parts.append(f"modelling the noise: test NLL {f_homo:.4f} (homoscedastic) -> "
                         f"{f_ours:.4f} (AnalyticSVI), {f_homo - f_ours:+.4f} nats per point")
        if s["best"] is not None and s["best"][0] == "gpflow":
            f_best = final(res, s["best"])
            parts.append(f"AnalyticSVI final NLL {fmt(f_ours, '.4f')} vs best GPflow "
                         f"({s['best'][1]}) {f_best:.4f} ("
                         + ("better" if f_ours is not None and f_ours < f_best else "worse")
                         + f" by {fmt(None if f_ours is None else abs(f_ours - f_best), '.4f')})")
            if "grid" in res["data"].meta:
                parts.append(f"noise sd RMSE {fmt(final(res, OURS, 'sd_rmse'), '.4f')} vs "
                             f"{fmt(final(res, s['best'], 'sd_rmse'), '.4f')}")
            r_ours = res["rates"].get(OURS, {}).get("median")
            parts.append("it/s AnalyticSVI / GPflow: " + ", ".join(
                f"{fmt(ratio(r_ours, res['rates'].get(k, {}).get('median')), '.1f')}x ({k[1]})"
                for k in res["curves"] if k[0] == "gpflow"))
            parts.append(f"target NLL {s['target']:.4f}: AnalyticSVI's {H.speedup(s)}")
            if ("augmentedgp", G0) in res["curves"]:
                parts.append(f"started at g mean 0 (precision 2 / noise0), AnalyticSVI ends at "
                             f"NLL {fmt(final(res, ('augmentedgp', G0)), '.4f')} and reaches the "
                             f"target in {fmt(s['ttt'].get(('augmentedgp', G0)), '.2f', 'never')}"
                             " s")
        lines.append(f"- **{res['name']}**: " + "; ".join(parts) + ".")
    return lines


def intro(args, all_res):
    step = ("Robbins-Monro (t + 1)^-0.51" if args.agp_step == "rm"
            else f"constant {args.agp_step}" + (" (AnalyticSVI's default)"
                                                 if float(args.agp_step) == 0.1 else ""))
    probs = "; ".join(f"{r['name']}: n={r['data'].n}, test {len(r['data'].y_test)}, "
                      f"d={r['data'].d}, M={r['M']}, budget {r['budget']:g} s "
                      f"({r['data'].split})" for r in all_res)
    return [
        f"Problems: {probs}.", "",
        "**Data.** *synthetic*: x ~ U[-3, 3], y = sin(2x) + s(x) eps with the known noise sd "
        "s(x) = 0.1 + 0.45 (1 - cos x) (0.1 at x = 0, 0.995 at x = +-3), raw scale; noise "
        "recovery on 201 grid points in [-3, 3]. *Real*: inputs and target standardised with "
        "the training statistics (NLL in standardised units).", "",
        "**Models.** augmentedgp: `SVGP([RBF, RBF], HeteroscedasticGaussian(precision), Z, "
        "mean=[Constant(mean y), Constant(logit(1 / h))])`, y ~ N(f, 1 / (precision "
        "sigmoid(g))) (thesis 7.2); GPflow: `SVGP(SeparateIndependent([SE, SE]), "
        "HeteroskedasticTFPConditional(Normal, scale_transform=Exp()), "
        "SharedIndependentInducingVariables(InducingPoints(Z)), mean_function=Constant([mean "
        "y, c_g]), num_latent_gps=2, whiten=True)`, y ~ N(f, exp(g)^2) (its heteroskedastic "
        "notebook); the homoscedastic baseline: augmentedgp `SVGP(RBF, Gaussian(noise), Z)`. "
        "Common start: kernel variances 1, ARD lengthscales 1 (synthetic) or sqrt(d) (real); "
        "the plug-in noise variance noise0 = 0.1 var(y_train) at the g prior mean (augmentedgp: "
        f"precision = h / noise0 with h = {args.headroom:g}, a noise floor noise0 / h, g mean "
        "logit(1 / h); GPflow: c_g = log(noise0) / 2); *AnalyticSVI, g mean 0* starts at h = 2. "
        "Means, kernel and likelihood parameters trained by Adam(0.01); the same M k-means "
        f"inducing inputs for every library, **kept fixed**; batch {args.batch}; float64.", "",
        f"**Configurations.** augmentedgp `AnalyticSVI(batch)` (step {step}; q(u) "
        "`natural_whitened`; `lax.scan` chunks of 50) and `QuadratureSVI(batch, 0.1)` (q(u) "
        "`whitened`); the homoscedastic baseline with `AnalyticSVI(batch)`. GPflow *NGD+Adam*: "
        "`NaturalGradient(gamma=0.1)` on (q_mu, q_sqrt) + Adam(0.01) on the rest in one "
        "`tf.function` step (gamma 0.01 if 0.1 fails within 100 steps); *Adam*: Adam(0.01) on "
        "everything; GPflow's expectations by its 2-D Gauss-Hermite (20 x 20).", "",
        H.race_measures(args, 1000, "the best GPflow final NLL (QuadratureSVI's without "
                        "GPflow)")
        + " *Test NLL*: one numpy function, -mean log int N(y | m_f, v_f + noise(g)) q(g) dg "
        "with 40-point Gauss-Hermite in g, from each library's latent marginals (their own "
        "`predict_log_density`: the *native* cross-check in the log). *Noise sd* = "
        "sqrt(E_q[noise variance]); its RMS error and correlation against s(x), the RMS of "
        "log(fitted / true); *f RMSE*: the mean against sin(2x) on the grid."]


def main():
    p = H.parser(__doc__)
    p.add_argument("--datasets", default=None, help="synthetic and / or one of "
                   + ",".join(REAL) + " (default synthetic,protein; --quick: synthetic)")
    p.add_argument("--n-synthetic", type=int, default=None, help="synthetic training rows")
    p.add_argument("--n-train", type=int, default=None, help="real data: training rows")
    H.race_options(p, "n-test", "M", "batch", "rounds", "round-seconds", "eval-points",
                   "margin", "libraries", "agp-step", batch=200)
    p.add_argument("--M-synthetic", type=int, default=None, help="inducing points, synthetic")
    p.add_argument("--budget", type=float, default=None, help="training seconds, synthetic")
    p.add_argument("--budget-real", type=float, default=None, help="training seconds, real")
    p.add_argument("--headroom", type=float, default=10.0,
                   help="augmentedgp's initial precision = headroom / initial noise variance")
    args = H.parse(p, {"datasets": "synthetic", "n_synthetic": 1500, "n_train": 1500,
                       "n_test": 500, "M": 40,
                       "M_synthetic": 30, "budget": 3.0, "budget_real": 3.0, "rounds": 2,
                       "round_seconds": 0.2, "eval_points": 10},
                   {"datasets": "synthetic,protein", "n_synthetic": 4000, "n_train": 8000,
                    "n_test": 1000, "M": 100,
                    "M_synthetic": 50, "budget": 30.0, "budget_real": 45.0, "rounds": 3,
                    "round_seconds": 1.0, "eval_points": 30})
    all_res = []
    for name in H.csv(args.datasets):
        syn = name == "synthetic"
        data = synthetic(args.n_synthetic, args.n_test) if syn else \
            H.dataset(name, "published", args.n_train, args.n_test, scale_y=True)
        M, budget = (args.M_synthetic, args.budget) if syn else (args.M, args.budget_real)
        res = H.race(name, data, configs(data, M, args), H.geometric(budget, args.eval_points),
                     rounds=args.rounds, round_seconds=args.round_seconds, budget=budget, M=M,
                     units=lambda k: 50 if k[0] == "augmentedgp" else 10,
                     after={"native": native_nll, "fitted": fitted})
        peers = [k for k in res["curves"] if k[0] == "gpflow" and final(res, k) is not None]
        res["summary"] = H.summarise(res, OURS, peers or [("augmentedgp", "QuadratureSVI")],
                                     args.margin)
        all_res.append(res)
    names = ("final test NLL", "final RMSE", "noise sd RMSE", "noise sd corr",
             "noise RMS log ratio", "f RMSE (grid)")
    body = ["### Findings", "", *findings(all_res), "", "### Results", "",
            *H.race_table(all_res, OURS, dict(enumerate(names, 2))), "",
            "`(best)`: the configuration whose final NLL sets the target. Ratios > 1 mean "
            "AnalyticSVI is faster. Noise columns: synthetic problem only.", "",
            "Fitted noise parameters at the end of each curve:", ""]
    body += [f"- {r['name']}: " + "; ".join(f"{label(k)}: {v}" for k, v in r["fitted"].items())
             for r in all_res]
    body += ["", "### Test NLL / RMSE at training times (iterations in brackets)", "",
            *H.curves_section(all_res)]
    text = H.report("Heteroscedastic regression: augmentedgp vs GPflow", intro(args, all_res),
                    body)
    H.finish(args, text, [{k: v for k, v in r.items() if k != "data"} for r in all_res])


if __name__ == "__main__":
    main()
