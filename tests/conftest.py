import os

# one BLAS thread in the library's computations, in the tests and the processes they start:
# augmentedgp's own default (augmentedgp.core.runtime applies it inside fit, predict and
# sample), forced here so that a developer's OPENBLAS_NUM_THREADS cannot change it
os.environ["AUGMENTEDGP_BLAS_THREADS"] = "1"
# XLA compiles for speed of compilation, not of the compiled code: the suite's problems are
# small and compiling dominates it (a 3-class GPClassifier fit on 20 rows: 29.6 s of XLA
# backend compilation at the default settings, 5.7 s with these two flags: LLVM's -O0 and
# XLA's classic loop emitters; results agree to rounding, as the order of a reduction may
# differ, and the compiled code runs slower, which small problems do not notice). XLA reads
# the flags when JAX creates its CPU client, after this file; AGP_TEST_XLA_DEFAULT=1 keeps
# XLA's defaults (the benchmarks always run with them).
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
if os.environ.get("AGP_TEST_XLA_DEFAULT", "0") != "1":
    given = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = " ".join([given] + [f for f in FAST_COMPILE
                                                 if f.split("=")[0] not in given]).strip()
# the persistent compilation cache is on, as augmentedgp's users have it: the programs that
# each module recompiles after the cache clear below are read back instead (a clean-clone
# CI run from an empty cache: 21.7 -> 17.8 min on 2 cores). Workers writing one entry at
# once are safe: JAX reads an unreadable entry as a miss (a warning, then it compiles).
# AUGMENTEDGP_COMPILATION_CACHE=0 turns it off.

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.linalg.cython_lapack  # noqa: F401, E402  (loads the OpenBLAS that JAX calls)
from threadpoolctl import threadpool_limits  # noqa: E402

import augmentedgp  # noqa: F401, E402  (enables float64 before any test builds arrays)

# and one thread in the tests' own numpy / scipy linear algebra (the oracles): importing
# augmentedgp leaves the pools alone, and on a busy machine a multi-threaded OpenBLAS
# call waits for every core (a Cholesky of n = 200: 168 ms against 0.34 ms)
threadpool_limits(limits=1, user_api="blas")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FULL = os.environ.get("AGP_FULL_SLOW", "0") == "1"


def load_shared(name):
    path = DATA / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"shared dataset {path} not available")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def standardise(A):
    A = np.asarray(A, dtype=float)
    sd = A.std(0)
    return (A - A.mean(0)) / np.where(sd > 0, sd, 1.0)


def elliptical_slice(loglik, K, n_chains, n_keep, n_burn, seed):
    """Elliptical slice sampling (Murray, Adams & MacKay 2010) of p(f) ~ N(f | 0, K) L(f),
    ``n_chains`` independent chains (from prior draws) advanced together in numpy;
    ``loglik`` maps (chains, n) to (chains,). Returns the per-chain means and second moments
    of the kept samples."""
    rng = np.random.default_rng(seed)
    Lk = np.linalg.cholesky(K)
    n = K.shape[0]
    f = rng.normal(size=(n_chains, n)) @ Lk.T
    ll = loglik(f)
    s1, s2 = np.zeros((n_chains, n)), np.zeros((n_chains, n))
    for it in range(n_burn + n_keep):
        nu = rng.normal(size=(n_chains, n)) @ Lk.T
        log_y = ll + np.log(rng.uniform(size=n_chains))
        theta = rng.uniform(0.0, 2.0 * np.pi, n_chains)
        lo, hi = theta - 2.0 * np.pi, theta.copy()
        idx = np.arange(n_chains)
        while idx.size:  # shrink each chain's bracket until its proposal is on the slice
            prop = f[idx] * np.cos(theta[idx])[:, None] + nu[idx] * np.sin(theta[idx])[:, None]
            lp = loglik(prop)
            ok = lp > log_y[idx]
            f[idx[ok]], ll[idx[ok]] = prop[ok], lp[ok]
            rej = idx[~ok]
            neg = theta[rej] < 0.0
            lo[rej[neg]], hi[rej[~neg]] = theta[rej[neg]], theta[rej[~neg]]
            theta[rej] = rng.uniform(lo[rej], hi[rej])
            idx = rej
        if it >= n_burn:
            s1 += f
            s2 += f * f
    return s1 / n_keep, s2 / n_keep


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Drop compiled programs after each test module: in one long process, thousands of
    accumulated XLA executables ended in a segfault inside XLA's compiler late in a CI run
    (twice, at different tests of tests/test_sklearn.py, which passes on its own)."""
    yield
    import jax

    jax.clear_caches()


def declared(name, **values):
    """A built-in likelihood, or one the library lacks, declared by its super-Gaussian
    pieces (``SuperGaussian``: no sampler, no mixing density): "StudentT" (df, scale),
    "Laplace" (scale), "Matern32" (scale), "Logistic", "GeneralisedGaussian" (scale,
    shape: p(y | f) = shape / (2 scale Gamma(1/shape)) exp(-|(y - f) / scale|^shape)).
    ``values``: the parameters (numbers or Parameters)."""
    import jax.numpy as jnp
    from jax.scipy.special import gammaln

    from augmentedgp.likelihoods import SuperGaussian

    loc = dict(a=lambda y, **p: -y / p.get("scale", 1.0),
               b=lambda y, **p: jnp.ones_like(y) / p.get("scale", 1.0),
               mean=lambda f, **p: f)
    if name == "StudentT":
        return SuperGaussian(
            lambda t, df, scale: -0.5 * (df + 1.0) * jnp.log1p(t / df),
            log_c=lambda y, df, scale: (gammaln(0.5 * (df + 1.0)) - gammaln(0.5 * df)
                                        - 0.5 * jnp.log(df * np.pi) - jnp.log(scale)),
            variance=lambda f, df, scale: jnp.full(jnp.shape(f), scale**2 * df / (df - 2.0)),
            params=values, name="DeclaredStudentT", **loc)
    if name == "Laplace":
        return SuperGaussian(
            lambda t, scale: -jnp.sqrt(t), log_c=lambda y, scale: -jnp.log(2.0 * scale),
            variance=lambda f, scale: jnp.full(jnp.shape(f), 2.0 * scale**2),
            params=values, name="DeclaredLaplace", **loc)
    if name == "Matern32":  # h = (f - y) / scale, phi(t) = (1 + sqrt(3 t)) e^{-sqrt(3 t)}
        return SuperGaussian(
            lambda t, scale: jnp.log1p(jnp.sqrt(3.0 * t)) - jnp.sqrt(3.0 * t),
            log_c=lambda y, scale: jnp.log(0.25 * np.sqrt(3.0) / scale),
            variance=lambda f, scale: jnp.full(jnp.shape(f), 4.0 * scale**2 / 3.0),
            params=values, name="DeclaredMatern32", **loc)
    if name == "Logistic":  # sigmoid(y f) = e^{y f / 2} / 2 cosh(f / 2)^-1
        return SuperGaussian(lambda t: -jnp.log(jnp.cosh(0.5 * jnp.sqrt(t))),
                             log_c=-np.log(2.0), g=lambda y: 0.5 * y, support="binary",
                             name="DeclaredLogistic")
    if name == "GeneralisedGaussian":
        return SuperGaussian(
            lambda t, scale, shape: -jnp.power(t, 0.5 * shape),
            log_c=lambda y, scale, shape: (jnp.log(0.5 * shape / scale) - gammaln(1.0 / shape)),
            variance=lambda f, scale, shape: jnp.full(
                jnp.shape(f), scale**2 * jnp.exp(gammaln(3.0 / shape) - gammaln(1.0 / shape))),
            params=values, name="GeneralisedGaussian", **loc)
    raise ValueError(name)


def assert_vi_matches_slice(means, second, mu0, fits, bands, mean_g):
    """Two-latent VI fixed points against elliptical slice sampling of the joint (f, g)
    (``means`` and ``second`` per chain from :func:`elliptical_slice`, prior mean ``mu0``
    (2n,)): the sampler mixed (se < 0.15 sd) and the data moved the posterior (> 5 sd in f,
    > 1 sd in g from ``mean_g``); for each ``fits[name] = (mean, var)`` ((n, 2) each),
    |E_q - E_p| <= t sd_p + 4 se and sd_q / sd_p within (lo, hi), per latent, from
    ``bands[name] = ((t_f, t_g), ((lo_f, hi_f), (lo_g, hi_g)))``."""
    n_chains, n = means.shape[0], means.shape[1] // 2
    pm = means.mean(0)
    psd = np.sqrt(second.mean(0) - pm**2)
    se = means.std(0, ddof=1) / np.sqrt(n_chains)
    pm = (pm + mu0).reshape(2, n).T
    psd, se = psd.reshape(2, n).T, se.reshape(2, n).T
    assert np.max(se / psd) < 0.15  # the sampler mixed
    assert np.max(np.abs(pm[:, 0]) / psd[:, 0]) > 5.0
    assert np.max(np.abs(pm[:, 1] - mean_g) / psd[:, 1]) > 1.0
    for name, (m, v) in fits.items():
        t, lims = bands[name]
        excess = (np.abs(m - pm) - 4.0 * se) / psd
        ratio = np.sqrt(v) / psd
        print(f"{name} vs MCMC: max (|dm| - 4 se) / sd f {excess[:, 0].max():.3f} "
              f"g {excess[:, 1].max():.3f}; sd ratio f {ratio[:, 0].min():.3f}-"
              f"{ratio[:, 0].max():.3f} g {ratio[:, 1].min():.3f}-{ratio[:, 1].max():.3f}")
        for c in (0, 1):
            assert excess[:, c].max() <= t[c], (name, c, excess[:, c].max())
            lo, hi = lims[c]
            assert lo <= ratio[:, c].min() and ratio[:, c].max() <= hi, (name, c)
