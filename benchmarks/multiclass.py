"""Multi-class benchmark (thesis ch. 4): augmented logistic-softmax SVI against GPflow and
GPyTorch.

letter (20,000 x 16, 26 classes), shuttle (58,000 x 9, 7 very imbalanced classes) and
scikit-learn's digits (1,797 x 64, 10 classes); M = 200 inducing inputs from k-means++ kept
fixed, batch 200, one ARD RBF kernel shared by all classes (variance 1, lengthscales the
median pairwise distance), kernel hyperparameters learned by Adam(0.01), float64:

- augmentedgp ``AnalyticSVI(200)`` with ``LogisticSoftmax`` (thesis ch. 4: Gamma / Poisson /
  Polya-Gamma augmentation, closed-form local and natural-parameter steps) and, for
  reference, ``QuadratureSVI(200, 0.1)`` with the (Monte Carlo) ``Softmax``;
- GPflow SVGP (whitened, ``num_latent_gps=C``) with ``MultiClass`` (robust max) and with
  ``Softmax``, each with Adam(0.01) and with ``NaturalGradient(gamma=0.1)`` + Adam(0.01);
- GPyTorch ``SoftmaxLikelihood`` over an ``IndependentMultitaskVariationalStrategy``:
  Cholesky q + Adam(0.01), and natural q + ``NGD(lr=0.1)`` + Adam(0.01).

Measured per (dataset, configuration): it/s, the test NLL / error curve against training
time up to a budget, the time to a common target NLL (the best peer's final NLL + margin).
Every library's latent predictive (n, C) is scored by the same code: augmentedgp's class
probabilities for that library's likelihood.

    /work/peers-venv/bin/python benchmarks/multiclass.py            # full run, writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/multiclass.py --quick    # digits, ~2 min, no write
"""

from __future__ import annotations

import math

import harness as H

# one thread for XLA's intra-op pool too: jaxlib 0.10's batched LAPACK kernels (the Cholesky
# factors of the C stacked q(u)) can hang a 2-thread pool at M = 200 (see harness.start)
H.start("multiclass.py", pin="jax-client", peers=("gpflow", "gpytorch"))

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, gpflow, gpytorch, label, ratio, torch  # noqa: E402
from scipy.spatial.distance import pdist  # noqa: E402

import augmentedgp as agp  # noqa: E402

DATASETS, PEERS = ("letter", "shuttle", "digits"), ("gpflow", "gpytorch")
OURS = ("augmentedgp", "logistic-softmax", "AnalyticSVI")
L = agp.likelihoods


# --- scoring: one function for every library ---------------------------------------------


@eqx.filter_jit
def _proba(lik, mean, var):
    return lik.predict_proba(mean, var)


@eqx.filter_jit
def _robustmax_p_true(lik, y, mean, var):
    """P(f_y is the largest) from RobustMax.variational_expectations = P log(1 - eps) +
    (1 - P) log(eps / (C - 1)), solved for P (the same Gauss-Hermite integral, one class)."""
    hit = jax.numpy.log1p(-lik.epsilon.value)
    miss = jax.numpy.log(lik.epsilon.value / (lik.num_latent - 1))
    return (lik.variational_expectations(y, mean, var) - miss) / (hit - miss)


def scorers(C, y, samples):
    """score((mean, var)) -> (NLL, error) per likelihood kind. Softmaxes: class probabilities
    by ``samples`` QMC points; robust max (epsilon 1e-3): the true class's probability by
    100-node Gauss-Hermite, the predicted class by 20 nodes (GPflow's count)."""
    rm_nll, rm_argmax = L.RobustMax(C, 1e-3, n_points=100), L.RobustMax(C, 1e-3, n_points=20)

    def guard(f):
        def score(pred):
            mean, var = np.asarray(pred[0], float), np.maximum(np.asarray(pred[1], float), 0.0)
            if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
                return math.nan, math.nan
            return f(mean, var)
        return score

    def by_proba(lik):
        def f(mean, var):
            p = np.asarray(_proba(lik, mean, var))
            py = np.clip(p[np.arange(len(y)), y], 1e-300, None)
            return -float(np.mean(np.log(py))), float(np.mean(np.argmax(p, 1) != y))
        return guard(f)

    def robust(mean, var):
        P = np.clip(np.asarray(_robustmax_p_true(rm_nll, y, mean, var)), 0.0, 1.0)
        py = (1.0 - 1e-3) * P + 1e-3 / (C - 1) * (1.0 - P)
        p = np.asarray(_proba(rm_argmax, mean, var))
        return -float(np.mean(np.log(py))), float(np.mean(np.argmax(p, 1) != y))

    return {"logistic-softmax": by_proba(L.LogisticSoftmax(C, predict_samples=samples)),
            "softmax": by_proba(L.Softmax(C, predict_samples=samples)), "robust-max": guard(robust)}


# --- configurations -------------------------------------------------------------------------


def configs(data, args):
    C, sc = data.meta["C"], scorers(data.meta["C"], data.y_test, args.predict_samples)
    Z = np.asarray(agp.inducing.kmeans(data.X, args.M, jax.random.key(0)))
    ls = data.meta["lengthscale"]
    out = {}

    def agp_run(lik, method):
        def build(notes):
            like = {"logistic-softmax": L.LogisticSoftmax, "softmax": L.Softmax,
                    "robust-max": L.RobustMax}[lik](C)
            model = agp.SVGP(agp.kernels.RBF(lengthscale=ls, variance=1.0), like,
                             agp.params.fixed(agp.params.real(Z, "inducing")),
                             q="natural_whitened" if method == "AnalyticSVI" else "whitened")
            inf = (agp.AnalyticSVI(args.batch) if method == "AnalyticSVI"
                   else agp.QuadratureSVI(args.batch, 0.1))
            r = H.AgpRunner(data, model, inf, lr=0.01, chunk=args.chunk,
                            predict=lambda r: r.model.predict_f(data.X_test))
            r.warmup(sc[lik])
            return r
        return build

    def gpflow_run(lik, scheme):
        def make(ngd=H.GPFLOW_NGD[0]):
            like = (gpflow.likelihoods.MultiClass(C) if lik == "robust-max"
                    else gpflow.likelihoods.Softmax(C))
            # integer labels: Softmax's log density is a sparse cross-entropy
            return H.GpflowRunner(data, H.gpflow_svgp(Z, ls, like, data.n, learn_Z=False,
                                                      num_latent_gps=C), scheme,
                                  batch=args.batch, ngd=ngd, predict=lambda r: tuple(
                                      a.numpy() for a in r.model.predict_f(data.X_test)))

        def build(notes):
            if scheme == "Adam":
                r = make()
                r.warmup(sc[lik], 3)
                return r
            return H.gpflow_with_fallback(make, sc[lik], args.ngd_check, notes,
                                          ("gpflow", lik, scheme))
        return build

    def gpytorch_run(scheme):
        def build(notes):
            model = H.gpytorch_svgp(Z, ls, natural=scheme != "Adam", learn_Z=False, tasks=C)
            like = gpytorch.likelihoods.SoftmaxLikelihood(num_features=C, num_classes=C,
                                                          mixing_weights=False)
            r = H.GpytorchRunner(data, model, like, scheme, batch=args.batch,
                                 predict=lambda r: r.latent(data.X_test))
            r.warmup(sc["softmax"], 3)
            return r
        return build

    out[OURS] = agp_run("logistic-softmax", "AnalyticSVI")
    out["augmentedgp", "softmax", "QuadratureSVI"] = agp_run("softmax", "QuadratureSVI")
    if args.robustmax:
        out["augmentedgp", "robust-max", "QuadratureSVI"] = agp_run("robust-max",
                                                                    "QuadratureSVI")
    if "gpflow" not in H.SKIPPED:
        for lik in ("robust-max", "softmax"):
            for scheme in ("NGD+Adam", "Adam"):
                out["gpflow", lik, scheme] = gpflow_run(lik, scheme)
    if "gpytorch" not in H.SKIPPED:
        out["gpytorch", "softmax", "NGD+Adam"] = gpytorch_run("NGD+Adam")
        out["gpytorch", "softmax", "Adam"] = gpytorch_run("Adam")
    wanted = args.libraries and args.libraries.split(",")
    return {k: v for k, v in out.items() if not wanted or k[0] in wanted
            or label(k) in wanted}, sc


def native_nll(key, r):
    """The library's own test NLL at the final state (a cross-check of the common scorer)."""
    d = r.data
    if key[0] == "augmentedgp":  # its likelihood's default QMC points
        return -float(np.mean(np.asarray(r.model.predict_log_density(d.X_test, d.y_test))))
    if key[0] == "gpflow":  # robust max: Gauss-Hermite; softmax: 100 MC draws
        return -float(np.mean(r.model.predict_log_density((d.X_test, d.y_test[:, None])).numpy()))
    r.model.eval()
    r.likelihood.eval()
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(512):
        lp = r.likelihood.log_marginal(torch.tensor(d.y_test), r.model(torch.tensor(d.X_test)))
    r.model.train()
    r.likelihood.train()
    return -float(lp.mean())


def hyper(key, r):
    """(kernel variance, mean lengthscale) at the end."""
    if key[0] == "augmentedgp":
        k = r.model.kernel
        return float(k.variance.value), float(np.mean(np.asarray(k.lengthscale.value)))
    if key[0] == "gpflow":
        k = r.model.kernel
        return float(k.variance.numpy()), float(np.mean(k.lengthscales.numpy()))
    k = r.model.covar_module
    return float(k.outputscale.detach()), float(k.base_kernel.lengthscale.detach().mean())


# --- report ---------------------------------------------------------------------------------


def cells(res, key, c):
    s, rate = res["summary"], res["rates"].get(key, {})
    t, ours_rate = s.get("ttt", {}).get(key), res["rates"].get(OURS, {}).get("median")
    return [fmt(rate.get("median"), ".2f"), fmt(rate.get("best"), ".2f"),
            "" if key == OURS else fmt(ratio(ours_rate, rate.get("median")), ".2f"),
            int(c[-1, 0]), fmt(c[-1, 3], ".4f"),
            fmt(c[-1, 2], ".4f") + (" (failed)" if key in res["failed"] else ""),
            fmt(res["native"].get(key), ".4f"),
            "{:.3g} / {:.3g}".format(*res["hyper"][key]) if res["hyper"].get(key) else "—",
            fmt(s.get("target"), ".4f"), fmt(t, ".2f", "not reached"),
            "" if key == OURS else fmt(ratio(t, s.get("ours")), ".1f",
                                       "AnalyticSVI never reached" if t is not None else "—")]


def claims(all_res, margin):
    lines = ["**Target: >= 10x faster to the target NLL than the peers, at equal or better "
             f"NLL** (target = best peer final NLL + {margin}; 'faster' against the peer "
             "configuration that reached it first; 'equal or better NLL' = AnalyticSVI's final "
             "NLL <= the best peer's final NLL + margin):"]
    for res in all_res:
        s, name = res["summary"], res["name"]
        if s["best"] is None:
            lines.append(f"- {name}: no peer result; not assessed.")
            continue
        ours, best = H.final(res, OURS), H.final(res, s["best"])
        sp = s["speedup_fastest"]
        equal = ours is not None and ours <= best + margin
        holds = sp is not None and sp >= 10 and equal
        if s["ours"] is None:
            verdict = "AnalyticSVI never reached the target"
        elif s["fastest"] is None:
            verdict = (f"AnalyticSVI reached it in {s['ours']:.2f} s; no peer configuration "
                       "reached it within the budget, so the speed-up is > budget / "
                       f"{s['ours']:.2f} s = {res['budget'] / s['ours']:.1f}x at least")
            holds = equal and res["budget"] / s["ours"] >= 10
        else:
            verdict = (f"time to target {s['ours']:.2f} s vs {s['ttt'][s['fastest']]:.2f} s "
                       f"({label(s['fastest'])}) -> speed-up {sp:.1f}x (against the best-NLL "
                       f"peer {label(s['best'])}: {fmt(s['speedup_best'], '.1f', 'n/a')}x)")
        lines.append(f"- {name}: best peer {label(s['best'])} (final NLL {best:.4f}); "
                     f"AnalyticSVI final NLL {fmt(ours, '.4f')} "
                     f"({'equal or better' if equal else 'worse'}); {verdict} -> **"
                     + ("met" if holds else "not met") + "**.")
    lines += ["", "**Iteration rate** (median it/s; AnalyticSVI's divided by each peer "
              "configuration's):"]
    for res in all_res:
        ours = res["rates"].get(OURS, {}).get("median")
        parts = [f"{label(k)} {v['median']:.2f} ({fmt(ratio(ours, v['median']), '.2f')}x)"
                 for k, v in res["rates"].items() if k[0] in PEERS]
        lines.append(f"- {res['name']}: AnalyticSVI {fmt(ours, '.2f')} it/s; "
                     + ("; ".join(parts) if parts else "no peer rate") + ".")
    return lines


def intro(args, all_res):
    datasets = "; ".join(
        f"{d.name}: n={d.n}, test {len(d.y_test)}, d={d.d}, C={d.meta['C']}, training class "
        f"counts {np.bincount(d.y, minlength=d.meta['C']).tolist()} ({d.split}; lengthscale "
        f"init {d.meta['lengthscale'][0]:.3f}; budget {r['budget']:g} s)"
        for r in all_res for d in [r["data"]])
    return [
        f"Data: {datasets}. Inputs standardised with the training statistics (zero sd -> 1).",
        "", "**Model** (every library; thesis ch. 4 setup): C latent GPs with **one** variance x "
        "ARD RBF kernel shared by all classes, initial variance 1 and every lengthscale the "
        "median pairwise distance of (2000 random) training inputs; zero mean; "
        f"M = {args.M} inducing inputs from augmentedgp's k-means (k-means++ seeding, seed 0), "
        "shared by all classes and libraries and **kept fixed**; kernel hyperparameters "
        f"learned with Adam(0.01); batch {args.batch} (shuffled epochs); float64. "
        "Likelihoods: augmentedgp `LogisticSoftmax` p(y=k|f) = sigmoid(f_k) / sum_c "
        "sigmoid(f_c) (the augmented one) and `Softmax` (Monte Carlo expectations); GPflow "
        "`MultiClass` (robust max, epsilon 1e-3, Gauss-Hermite) and `Softmax`; GPyTorch "
        "`SoftmaxLikelihood(num_features=C, num_classes=C, mixing_weights=False)`.", "",
        "**Configurations.** augmentedgp `fit(SVGP(..., q=\"natural_whitened\"), "
        f"AnalyticSVI({args.batch}))` (Robbins-Monro natural step (t + 1)^-0.51; `lax.scan` "
        f"chunks of {args.chunk}) and `QuadratureSVI({args.batch}, 0.1)` with the softmax; "
        "GPflow SVGP (whitened, `num_latent_gps=C`): *NGD+Adam* = `NaturalGradient(gamma=0.1)` "
        "on (q_mu, q_sqrt) + Adam on the kernel in one `tf.function` step (if gamma 0.1 fails "
        f"in its first {args.ngd_check} steps, gamma 0.01 with `XiSqrtMeanVar`, then with "
        "`XiNat`; noted below), *Adam* = Adam on everything; GPyTorch: *NGD+Adam* = natural q "
        "+ `NGD(lr=0.1)` + Adam, *Adam* = Cholesky q + Adam, batch_shape [C] under "
        "`IndependentMultitaskVariationalStrategy`, `VariationalELBO(num_data=n)`.", "",
        f"**Measures.** *it/s*: {args.rounds} interleaved rounds of about "
        f"{args.round_seconds:g} s per configuration from the initial state; median and best. "
        "*Curves*: from the common initial state until the training clock passes the budget, "
        f"test NLL and error at the first iteration past each of {args.eval_points} geometric "
        "times (budget / 500 to the budget); evaluations excluded. *Scoring*: each library's "
        "latent test mean and variance (n*, C) through augmentedgp's likelihood of the kind "
        f"it trained (softmaxes: `predict_proba` by {args.predict_samples} scrambled-Sobol "
        "points; robust max: the true class's probability by 100-node Gauss-Hermite, the "
        "predicted class with 20 nodes); error = argmax, NLL = -mean log p(y* | x*). *Native "
        "NLL*: each library's own predictive at the end, a cross-check. *Target* = the best "
        f"peer configuration's final NLL + {args.margin}; *time to target* = the first "
        "evaluation after iteration 0 at or below it.", "",
        "**Differences from the thesis' ch. 4 experiments.** One random split per dataset, a "
        "fixed budget and a common target instead of each method's convergence; an ARD kernel "
        "shared by the classes; GPflow 2 / GPyTorch; no EPGPC or Laplace baselines."]


def main():
    p = H.parser(__doc__)
    p.add_argument("--datasets", default=None, help="comma-separated subset of "
                   + ",".join(DATASETS))
    p.add_argument("--n-train", type=int, default=None, help="subsample the training rows")
    p.add_argument("--n-test", type=int, default=None, help="subsample the test rows")
    p.add_argument("--M", type=int, default=None, help="inducing points (default 200)")
    p.add_argument("--batch", type=int, default=200, help="minibatch size")
    p.add_argument("--budgets", default=None,
                   help="training seconds: one number or 'letter=..,shuttle=..,digits=..'")
    p.add_argument("--rounds", type=int, default=None, help="timing rounds")
    p.add_argument("--round-seconds", type=float, default=None, help="seconds per timing round")
    p.add_argument("--eval-points", type=int, default=None, help="evaluations per curve")
    p.add_argument("--predict-samples", type=int, default=512, help="QMC points in the scoring")
    p.add_argument("--margin", type=float, default=0.01, help="target = best peer NLL + this")
    p.add_argument("--chunk", type=int, default=10, help="augmentedgp's scan chunk")
    p.add_argument("--ngd-check", type=int, default=20, help="GPflow NGD: steps that decide "
                   "the gamma fallback")
    p.add_argument("--robustmax", action="store_true", help="also augmentedgp + robust max")
    p.add_argument("--libraries", default=None,
                   help="library names or 'library likelihood scheme' labels")
    args = H.parse(p, {"datasets": "digits", "n_test": 500, "M": 50, "budgets": "3",
                       "rounds": 2, "round_seconds": 0.3, "eval_points": 8},
                   {"datasets": ",".join(DATASETS), "M": 200,
                    "budgets": "letter=40,shuttle=30,digits=15", "rounds": 3,
                    "round_seconds": 1.0, "eval_points": 14})
    names = H.csv(args.datasets)
    budgets = dict(b.split("=") for b in H.csv(args.budgets)) if "=" in args.budgets else \
        dict.fromkeys(names, args.budgets)
    all_res = []
    for name in names:
        data = H.dataset(name, "random", args.n_train, args.n_test, y_dtype=np.int64)
        data.meta["C"] = int(max(data.y.max(), data.y_test.max())) + 1
        sub = data.X[np.random.default_rng(0).choice(data.n, min(2000, data.n), replace=False)]
        data.meta["lengthscale"] = np.full(data.d, float(np.median(pdist(sub))))
        budget = float(budgets[name])
        print(f"== {name}: n={data.n} test={len(data.y_test)} d={data.d} C={data.meta['C']} "
              f"M={args.M} budget {budget:g} s", flush=True)
        cfg, sc = configs(data, args)
        res = H.race(name, data, cfg, H.geometric(budget, args.eval_points, 500),
                     rounds=args.rounds, round_seconds=args.round_seconds, budget=budget,
                     units=lambda k: args.chunk if k[0] == "augmentedgp" else 2,
                     after={"native": native_nll, "hyper": hyper}, scorers=sc)
        peers = [k for k in res["curves"] if k[0] in PEERS and H.final(res, k) is not None]
        res["summary"] = H.summarise(res, OURS, peers, args.margin)
        all_res.append(res)
    header = ["dataset", "configuration", "it/s (median)", "it/s (best)",
              "AnalyticSVI it/s / this", "iterations", "final error", "final NLL",
              "native NLL", "kernel variance / mean lengthscale (final)", "target NLL",
              "time to target (s)", "time to target / AnalyticSVI's"]
    body = ["### Claims", "", *claims(all_res, args.margin), "", "### Results", "",
            *H.config_table(all_res, header, cells), "",
            "`(best)`: the peer configuration whose final NLL sets the target. Ratios > 1 mean "
            "AnalyticSVI is faster. A failed run keeps its evaluations before the failure.", "",
            "### Test NLL / error at training times (iterations in brackets)", ""]
    for res in all_res:
        body += [f"**{res['name']}** ({res['seconds']:.0f} s for this dataset, of which "
                 f"{sum(res['build_s'].values()):.0f} s build + warm-up and "
                 f"{sum(res['eval_s'].values()):.0f} s evaluations)", "",
                 H.curves_table(res, res["budget"]), ""]
    text = H.report("Multi-class: augmented logistic-softmax SVI vs GPflow / GPyTorch "
                    "(thesis ch. 4)", intro(args, all_res), body)
    H.finish(args, text, [{k: v for k, v in r.items() if k not in ("data", "scorers")}
                          for r in all_res])


if __name__ == "__main__":
    main()
