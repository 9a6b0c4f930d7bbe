"""Draws per second of the generic sampler of the tilted mixing law against the exact ones.

``augmentation.inversion.sample`` (numerical inversion of phi's Laplace transform, the Gibbs
sampler of a likelihood declared with ``likelihoods.SuperGaussian``) against each built-in's
exact ``sample_omega`` (Gamma for the Student-t, inverse Gaussian for the Laplace and the
Bayesian SVM, GIG for the Matern-3/2, Polya-Gamma for the logistic), on the same tilts, in one
run: n draws at each of c = 0, 1 and 30 (c^2 = E[h^2], the tilt), one thread, jitted, compile
excluded (best of ``--repeats``). A two-sample Kolmogorov-Smirnov p-value between the two sets
of draws is printed alongside (the tests assert it; here it shows the draws are comparable).

The Gibbs effect (min ESS/s with the generic sampler in place of the exact one, Boston
Student-t) is the Gibbs-generic row of benchmarks/gibbs.py.

    /work/peers-venv/bin/python benchmarks/tilted.py            # writes RESULTS.md
    /work/peers-venv/bin/python benchmarks/tilted.py --quick    # 10^4 draws, no write
"""

from __future__ import annotations

import time

import harness as H

H.start("tilted.py", threads=1, pin="process")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt, markdown_table  # noqa: E402
from scipy import stats  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp.augmentation import inversion  # noqa: E402

L = agp.likelihoods
# built-in, its log phi written analytically (complex t), y (the negative binomial's phi
# depends on it: PG(y + r))
CASES = {
    "Student-t (df 3): Gamma": (L.StudentT(df=3.0), lambda t: -2.0 * jnp.log1p(t / 3.0), 0.0),
    "Laplace: inverse Gaussian": (L.Laplace(), lambda t: -jnp.sqrt(t), 0.0),
    "Matern-3/2: GIG": (L.Matern32(), lambda t: jnp.log1p(jnp.sqrt(3.0 * t))
                        - jnp.sqrt(3.0 * t), 0.0),
    "Logistic: Polya-Gamma PG(1)": (L.Logistic(),
                                    lambda t: -jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))), 1.0),
    "Negative binomial (y + r = 5): PG(5)": (
        L.NegativeBinomial(r=2.0), lambda t: -5.0 * jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))), 3.0),
}
TILTS = (0.0, 1.0, 30.0)


def rate(fn, key, c2, repeats):
    """Draws per second (wall) of jitted ``fn(key, c2)``, compile excluded, best of
    ``repeats``; and the draws."""
    out = fn(key, c2).block_until_ready()
    best = np.inf
    for i in range(repeats):
        t = time.perf_counter()
        fn(jax.random.fold_in(key, i), c2).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return c2.size / best, np.asarray(out)


def main():
    p = H.parser(__doc__)
    p.add_argument("--draws", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    args = H.parse(p, dict(draws=10_000, repeats=2), dict(draws=100_000, repeats=3))
    key = jax.random.PRNGKey(0)
    rows, raw = [], []
    for name, (lik, log_phi, y) in CASES.items():
        yy = jnp.full(args.draws, y)
        exact = jax.jit(lambda k, c2, lik=lik, yy=yy: lik.sample_omega(k, yy, c2))
        generic = jax.jit(lambda k, c2, lp=log_phi: inversion.sample(k, lp, c2))
        for c in TILTS:
            c2 = jnp.full(args.draws, c * c)
            r_exact, d_exact = rate(exact, key, c2, args.repeats)
            r_gen, d_gen = rate(generic, jax.random.fold_in(key, 7), c2, args.repeats)
            p_ks = stats.ks_2samp(d_exact, d_gen).pvalue
            rows.append([name, f"{c:g}", fmt(r_exact, ".3g"), fmt(r_gen, ".3g"),
                         fmt(r_exact / r_gen, ".1f"), fmt(p_ks, ".2f")])
            raw.append({"sampler": name, "c": c, "exact_per_s": r_exact, "generic_per_s": r_gen,
                        "ks_p": p_ks})
            print(rows[-1], flush=True)
    slow = [r["exact_per_s"] / r["generic_per_s"] for r in raw]
    body = [markdown_table(["law (built-in)", "c", "exact draws/s", "generic draws/s",
                            "exact / generic", "two-sample KS p"], rows), "",
            f"The generic sampler is {min(slow):.1f}-{max(slow):.1f}x slower per draw than the "
            "exact ones (median " f"{np.median(slow):.1f}x). Its cost is 39 complex "
            "evaluations of log phi per Newton step, 3-4 steps per draw on average, so it "
            "is slowest where log phi is dear (log cosh for the Polya-Gamma laws)."]
    text = H.report("The generic sampler of the tilted mixing law against the exact ones",
                    [f"{args.draws} draws per tilt, one thread, compile excluded (best of "
                     f"{args.repeats})."], body)
    H.finish(args, text, raw)


if __name__ == "__main__":
    main()
