"""AnalyticVI / AnalyticSVI: augmented conjugate variational inference (thesis ch. 3 and 5;
seed 000 part 1 sections 3.5-3.9, part 2 sections 1.6-1.9) against its own theory and
against independent oracles: dense numpy formulas, numerical integration, quadrature VI,
an elliptical slice sampler, and quadrature SVI on real data.

Problems are small and well conditioned (Matern-5/2, lengthscale 0.8; inducing points on a
grid of spacing 0.85; where Z = X the inputs lie on a grid of spacing 0.26). Hyperparameters
and inducing inputs are frozen (``fixed``) wherever a variational fixed point is the oracle.

Cost: almost all of this file's time is XLA compilation (a few seconds per model structure),
so the CAVI iterations run in one jitted loop per problem (``_cavi_run``), which also
evaluates the bounds at perturbed q; its results are cached and shared between tests. The
full likelihood x parameterisation grid, the long MCMC runs and the larger real-data fits
(kin40k, bike) run with AGP_FULL_SLOW=1.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FULL, declared, elliptical_slice, load_shared
from jax import lax

import augmentedgp as agp
from augmentedgp.core.params import fixed, positive, real
from augmentedgp.inference import AnalyticVI
from augmentedgp.likelihoods import augmentable
from augmentedgp.variational import natgrad

AUGMENTED = [c.__name__ for c in augmentable()]  # decided by type: Likelihood and Augmented

LIK = agp.likelihoods
LS, KVAR = 0.8, 1.3  # kernel hyperparameters of every synthetic problem
ZGRID = np.linspace(0.3, 9.7, 12)[:, None]  # M = 12, spacing 0.85
XS = np.linspace(-0.5, 10.5, 40)[:, None]  # test inputs (as many as the VGP training inputs)
T_MAX = 150  # CAVI steps to convergence (LogisticPoisson needs ~120 to settle to 1e-10)
NAMES = ["Gaussian", "Logistic", "BayesianSVM", "StudentT", "Laplace", "Matern32",
         "LogisticPoisson", "NegativeBinomial"]
MEANS = {"Gaussian": 0.5, "LogisticPoisson": 0.5, "NegativeBinomial": 1.0}  # constant prior means


# --- problems ----------------------------------------------------------------------------------


def fp(value):
    return fixed(positive(value))


def kern():
    return agp.kernels.Matern52(fp(LS), fp(KVAR))


def make_likelihood(name):
    return {
        "Gaussian": lambda: LIK.Gaussian(fp(0.09)),
        "Logistic": LIK.Logistic,
        "BayesianSVM": LIK.BayesianSVM,
        "StudentT": lambda: LIK.StudentT(fp(3.0), fp(0.3)),
        "Laplace": lambda: LIK.Laplace(fp(0.3)),
        "Matern32": lambda: LIK.Matern32(fp(0.3)),
        "LogisticPoisson": lambda: LIK.LogisticPoisson(fp(10.0)),
        "NegativeBinomial": lambda: LIK.NegativeBinomial(fp(2.0)),
    }[name]()


def targets(name, X, seed):
    """Synthetic targets for likelihood ``name`` around f = sin(x) (+ the prior mean)."""
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    f = np.sin(X[:, 0]) + MEANS.get(name, 0.0)
    if name == "Gaussian":
        return f + 0.3 * rng.normal(size=n)
    if name in ("Logistic", "BayesianSVM"):
        return np.where(rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-2.0 * f)), 1.0, -1.0)
    if name in ("StudentT", "Laplace", "Matern32"):  # 10% gross outliers
        y = f + 0.2 * rng.normal(size=n)
        out = rng.uniform(size=n) < 0.1
        return y + out * rng.choice([-3.0, 3.0], n)
    if name == "LogisticPoisson":
        return rng.poisson(10.0 / (1.0 + np.exp(-1.5 * f))).astype(float)
    if name == "NegativeBinomial":  # mean r e^f, r = 2
        return rng.negative_binomial(2.0, 1.0 / (1.0 + np.exp(f))).astype(float)
    raise ValueError(name)


def sparse_data(name, n=80, seed=0):
    X = np.sort(np.random.default_rng(100 + seed).uniform(0.0, 10.0, n))[:, None]
    return X, targets(name, X, seed)


def full_data(name, n=40, seed=0):
    """Inputs on a grid (spacing 0.26, cond K ~ 1e4), so that Z = X is well conditioned."""
    X = np.linspace(0.0, 10.0, n)[:, None]
    return X, targets(name, X, seed)


def const_mean(name):
    return agp.means.Constant(fixed(real(MEANS[name]))) if name in MEANS else None


def make_model(name, kind):
    """(model, X, y): kind "whitened" / "natural" (SVGP, Z fixed on a grid), "vgp" (bound VGP)
    or "svgp_x" (SVGP with Z = X fixed: the VGP problem in SVGP clothing)."""
    lik, mean = make_likelihood(name), const_mean(name)
    if kind in ("vgp", "svgp_x"):
        X, y = full_data(name)
        if kind == "vgp":
            return agp.VGP(kern(), lik, mean=mean).bind(X), X, y
        return agp.SVGP(kern(), lik, fixed(real(X)), mean=mean), X, y
    X, y = sparse_data(name)
    return agp.SVGP(kern(), lik, fixed(real(ZGRID)), mean=mean, q=kind), X, y


def with_q(model, q):
    return eqx.tree_at(lambda m: m.q, model, q)


# --- dense numpy oracles -------------------------------------------------------------------------


def matern52(A, B, ls=LS, var=KVAR):
    r = np.sqrt(5.0) * np.abs(np.asarray(A)[:, None, 0] - np.asarray(B)[None, :, 0]) / ls
    return var * (1.0 + r + r**2 / 3.0) * np.exp(-r)


def log_cosh(x):
    x = np.abs(x)
    return x + np.log1p(np.exp(-2.0 * x)) - math.log(2.0)


_GL_T, _GL_W = np.polynomial.legendre.leggauss(200)


def gauss_expectation(fun, m, v, kink=None):
    """E fun(f), f ~ N(m, v), by 200-point Gauss-Legendre panels on m +- 12 sd, split at a
    kink of fun if there is one (fun is vectorised over f)."""
    s = math.sqrt(v)
    edges = [m - 12.0 * s, m + 12.0 * s]
    if kink is not None and edges[0] < kink < edges[1]:
        edges.insert(1, kink)
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        f = 0.5 * (a + b) + 0.5 * (b - a) * _GL_T
        dens = np.exp(-0.5 * ((f - m) / s) ** 2) / (s * math.sqrt(2.0 * math.pi))
        total += 0.5 * (b - a) * np.sum(_GL_W * fun(f) * dens)
    return total


def dense_kl(mu, S, K):
    """KL(N(mu, S) || N(0, K))."""
    Ki = np.linalg.inv(K)
    return 0.5 * (np.trace(Ki @ S) + mu @ Ki @ mu - len(mu) + np.linalg.slogdet(K)[1]
                  - np.linalg.slogdet(S)[1])


def tanh_ratio(c):
    return np.tanh(c / 2.0) / (2.0 * c)


# --- CAVI by direct calls: one jitted loop per problem, cached ----------------------------------


@eqx.filter_jit
def _cavi_run(model, X, y, n_steps):
    """n_steps CAVI steps (AnalyticVI sites, natgrad.natural_step with scale 1 and rho 1)
    from ``model`` in one jitted loop. Returns the final model and, for t = 0..n_steps, the
    augmented and the plain ELBO after t steps, and for t < n_steps the step size taken and
    the max |change| of the whitened natural parameters in step t + 1 (NaN-padded to
    T_MAX + 1). With n_steps = 0 it only evaluates the two bounds."""
    params, static = eqx.partition(model, eqx.is_array)
    nan = jnp.full(T_MAX + 1, jnp.nan)

    def body(state):
        params, t, trace = state
        m = eqx.combine(params, static)
        lik = m.likelihood
        aug, p = m.elbo_projection(X, y, 1.0, lik.augmented_expectations)
        plain = jnp.sum(lik.variational_expectations(y, p.mean, p.var)) - m.q.kl(p.Kmm, p.Lmm)
        beta, gamma = AnalyticVI().sites(lik, y, p.mean, p.var, p.prior_mean)
        q, rho = natgrad.natural_step(m.q, p.Kmm, p.Lmm, p.Kmn, p.A, p.kdiag, beta, gamma,
                                      1.0, 1.0)
        old1, oldP = m.q.whitened_natural(p.Lmm)
        new1, newP = q.whitened_natural(p.Lmm)
        change = jnp.maximum(jnp.max(jnp.abs(new1 - old1)), jnp.max(jnp.abs(newP - oldP)))
        active = t < n_steps
        q = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), q, m.q)
        last = jnp.where(active, 0.0, jnp.nan)
        trace = tuple(buf.at[t].set(val) for buf, val in
                      zip(trace, (aug, plain, rho + last, change + last), strict=True))
        return eqx.partition(with_q(m, q), eqx.is_array)[0], t + 1, trace

    state = (params, jnp.asarray(0), (nan, nan, nan, nan))
    params, _, trace = lax.while_loop(lambda s: s[1] <= n_steps, body, state)
    return (eqx.combine(params, static),) + trace


def aug_elbo(model, X, y):
    """The augmented ELBO of ``model`` through the compiled loop (no CAVI step)."""
    return float(_cavi_run(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(0))[1][0])


def perturbed(model, direction, eps):
    q = jax.tree_util.tree_map(lambda a, d: a + eps * d, model.q, direction)
    return with_q(model, q)


def random_directions(model, seed):
    """One random direction per leaf of q's raw parameters (mean / Cholesky factor, or
    theta1 / theta2), uniform on [-1, 1] in that leaf and zero elsewhere."""
    leaves, tree = jax.tree_util.tree_flatten(model.q)
    rng = np.random.default_rng(seed)
    for i in range(len(leaves)):
        yield jax.tree_util.tree_unflatten(tree, [
            jnp.asarray(rng.uniform(-1, 1, np.shape(x)) if j == i else np.zeros(np.shape(x)))
            for j, x in enumerate(leaves)])


_RUNS = {}


def cavi(name, kind, n_steps=T_MAX):
    """(model after n_steps CAVI steps from the prior, X, y, trace dict), cached."""
    key = (name, kind, n_steps)
    if key not in _RUNS:
        model, X, y = make_model(name, kind)
        y = np.asarray(model.likelihood.check_targets(y))
        out = _cavi_run(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(n_steps))
        names = ("aug", "plain", "rho", "change")
        trace = {k: np.asarray(v)[: n_steps + (k in ("aug", "plain"))]
                 for k, v in zip(names, out[1:], strict=True)}
        _RUNS[key] = (out[0], X, y, trace)
    return _RUNS[key]


def whitened(model):
    """q's whitened natural parameters (theta1, P) as numpy arrays."""
    Z = np.asarray(model.inducing.value)
    Lmm = jnp.asarray(np.linalg.cholesky(matern52(Z, Z)))
    return [np.asarray(a) for a in model.q.whitened_natural(Lmm)]


# --- 1. CAVI never decreases the augmented ELBO ------------------------------------------------

KINDS = ["whitened", "natural", "vgp"]
DEFAULT_CAVI = {(n, "whitened") for n in NAMES} | {("NegativeBinomial", "natural"),
                                                    ("Logistic", "vgp"), ("StudentT", "vgp")}
CAVI_CASES = [pytest.param(n, k, marks=() if (n, k) in DEFAULT_CAVI else pytest.mark.slow)
              for n in NAMES for k in KINDS]


@pytest.mark.parametrize("name,kind", CAVI_CASES)
def test_cavi_is_monotone_and_converges_to_a_stationary_point(name, kind):
    """Full-batch CAVI (local step: optimal q(w) given q(f); global step: optimal q(u) given
    q(w)) is coordinate ascent on the augmented bound, so elbo(augmented=True) never
    decreases (seed 000 part 2 section 1.9; part 1 section 7 test 13). At its fixed point
    the sites are self-consistent and -- the sites (aux_sites) and the bound
    (augmented_expectations) being separate code -- the augmented bound is stationary in q.
    The augmented bound never exceeds the plain one at the same q (Jensen)."""
    if not FULL and (name, kind) not in DEFAULT_CAVI:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 runs the full likelihood x q grid)")
    model, X, y, tr = cavi(name, kind)
    aug, plain = tr["aug"], tr["plain"]
    scale = abs(aug[-1])
    assert np.all(tr["rho"] == 1.0)  # rho = 1 steps never leave the PD cone
    steps = np.diff(aug)
    assert np.all(steps >= -1e-9 * scale), steps.min()
    assert aug[-1] > aug[0] + 1.0  # it did move
    assert abs(steps[-1]) < 1e-8
    # the augmented bound is below the plain one at every iterate
    assert np.all(plain - aug >= -1e-9 * scale), np.min(plain - aug)
    if name == "Gaussian":  # phi(t) = e^-t: log phi is linear, the gap is zero
        np.testing.assert_allclose(plain, aug, rtol=1e-10)
    else:
        assert np.all(plain - aug > 1e-3)
    # the fixed point: one more step leaves q unchanged ...
    t1, P = whitened(model)
    again = _cavi_run(model, jnp.asarray(X), jnp.asarray(y), jnp.asarray(1))[0]
    a1, aP = whitened(again)
    tol = 1e-8 * max(1.0, np.max(np.abs(P)))
    assert np.max(np.abs(a1 - t1)) < tol and np.max(np.abs(aP - P)) < tol
    # ... and the augmented bound has a maximum in q there: along a random direction d in
    # each of q's raw parameter arrays, L(+-eps d) - L(0) is second order in eps, its odd
    # part (the directional derivative, ~ |g| eps) negligible against its even part
    # (~ H eps^2 / 2): |g / H| < 0.005 eps, the optimum along d within 5e-7 of the fixed
    # point (measured |odd| / even <= 3.5e-4 over the full grid; a 5% error in the sites'
    # gamma gives > 1 for every likelihood)
    eps = 1e-4
    for d in random_directions(model, 0):
        up, down = (aug_elbo(perturbed(model, d, e), X, y) for e in (eps, -eps))
        odd, even = 0.5 * (up - down), aug[-1] - 0.5 * (up + down)
        assert even > 0, (up, down, aug[-1])
        assert abs(odd) < 0.01 * even, (odd, even)
    # the bounds tracked are the public ones (elbo(augmented=...) evaluates the same
    # elbo_projection; checked through the compiled public method once, to save compiles)
    if (name, kind) == ("Logistic", "whitened"):
        np.testing.assert_allclose(model.elbo(X, y, augmented=True), aug[-1], rtol=1e-12)


def test_gaussian_cavi_step_is_exact_regression():
    """Gaussian likelihood (w = 1): one CAVI step reaches Titsias' collapsed bound (SVGP),
    with the constant prior mean handled by the sites' shift beta - gamma m0."""
    model, X, y, tr = cavi("Gaussian", "whitened")
    sgpr = agp.SGPR(kern(), fixed(real(ZGRID)), likelihood=make_likelihood("Gaussian"),
                    mean=const_mean("Gaussian"))
    F = sgpr.elbo(X, y)
    np.testing.assert_allclose(tr["aug"][1:], F, rtol=1e-9)
    assert tr["aug"][0] < F - 1.0


# --- 2. the augmentation gap ---------------------------------------------------------------------


@pytest.mark.parametrize("n_steps", [0, 2])
def test_logistic_augmentation_gap_closed_form(n_steps):
    """Logistic: elbo() - elbo(augmented=True) = sum_i [log cosh(c_i/2) - E log cosh(f_i/2)],
    c_i^2 = m_i^2 + v_i (seed 000 part 1 section 3.9), with E by Gauss-Legendre from the
    model's own marginals; elbo(augmented=True) against the closed form
    sum_i [y_i m_i / 2 - log 2 - log cosh(c_i / 2)] - KL (dense), at the prior and after two
    CAVI steps."""
    model, X, y, _ = cavi("Logistic", "whitened", n_steps)
    post = agp.SparsePosterior(model, jnp.asarray(X), jnp.asarray(y))
    m, v = (np.asarray(a) for a in post.predict_f(X))
    c = np.sqrt(m**2 + v)
    e_lc = np.array([gauss_expectation(lambda f: log_cosh(0.5 * f), mi, vi)
                     for mi, vi in zip(m, v, strict=True)])
    gap = np.sum(log_cosh(0.5 * c) - e_lc)
    assert gap > 0.1
    # elbo() uses 20-point Gauss-Hermite for E log sigmoid: 3e-10 per point at v = 1.3
    np.testing.assert_allclose(post.augmentation_gap(), gap, rtol=1e-6)
    per_point = post.augmentation_gap(per_point=True)  # the same terms, one per point
    np.testing.assert_allclose(per_point, log_cosh(0.5 * c) - e_lc, rtol=1e-6, atol=1e-9)
    assert per_point.shape == (len(y),) and np.all(per_point >= -1e-12)
    np.testing.assert_allclose(per_point.sum(), post.elbo() - post.elbo(augmented=True),
                               rtol=1e-10)
    Kmm = matern52(ZGRID, ZGRID)
    Lmm = jnp.asarray(np.linalg.cholesky(Kmm))
    mu, S = (np.asarray(a) for a in model.q.mean_cov(jnp.asarray(Kmm), Lmm))
    kl = dense_kl(mu, S, Kmm)
    aug = np.sum(0.5 * y * m - math.log(2.0) - log_cosh(0.5 * c)) - kl
    np.testing.assert_allclose(post.elbo(augmented=True), aug, rtol=1e-10)
    e_ls = np.array([gauss_expectation(lambda f, yi=yi: -np.logaddexp(0.0, -yi * f), mi, vi)
                     for yi, mi, vi in zip(y, m, v, strict=True)])
    np.testing.assert_allclose(post.elbo(), np.sum(e_ls) - kl, rtol=1e-8)
    assert post.elbo(augmented=True) < post.elbo()


def test_augmented_term_at_zero_variance_is_the_log_density():
    """At q(f_i) = delta(m_i) the optimal q(w) makes the augmentation exact: the augmented
    data term log C + g m + log phi(h(m)^2) equals log p(y | m), checked against scipy.stats
    (catches errors in C, g, h = a + b f and phi, cf. the table errata of seed 000 part 2
    section 1.10). With variance v it is strictly below E_q log p(y | f) (computed by
    Gauss-Legendre quadrature of the scipy density: Jensen, log phi convex), and the gap shrinks
    with v (like v where phi is smooth at h^2, like sqrt(v) near the kink of e^{-sqrt t})."""
    from scipy import stats

    rng = np.random.default_rng(3)
    n = 10
    f = rng.normal(0.0, 1.5, n)
    sig = lambda t: 1.0 / (1.0 + np.exp(-t))
    a = math.sqrt(3.0) / 0.7
    cases = {  # likelihood, targets, log p(y | f) (scipy.stats or by hand), kink of log p
        "Gaussian": (LIK.Gaussian(0.3), rng.normal(size=n),
                     lambda y, t: stats.norm.logpdf(y, t, math.sqrt(0.3)), None),
        "Logistic": (LIK.Logistic(), rng.choice([-1.0, 1.0], n),
                     lambda y, t: -np.logaddexp(0.0, -y * t), None),
        "BayesianSVM": (LIK.BayesianSVM(), rng.choice([-1.0, 1.0], n),
                        lambda y, t: -2.0 * np.maximum(1.0 - y * t, 0.0), lambda y: y),
        "StudentT": (LIK.StudentT(4.0, 0.6), 2.0 * rng.normal(size=n),
                     lambda y, t: stats.t.logpdf(y, 4.0, loc=t, scale=0.6), None),
        "Laplace": (LIK.Laplace(0.7), 2.0 * rng.normal(size=n),
                    lambda y, t: stats.laplace.logpdf(y, loc=t, scale=0.7), lambda y: y),
        "Matern32": (LIK.Matern32(0.7), 2.0 * rng.normal(size=n),
                     lambda y, t: np.log(a / 4 * (1 + a * np.abs(y - t))) - a * np.abs(y - t),
                     lambda y: y),
        "LogisticPoisson": (LIK.LogisticPoisson(7.0), rng.poisson(3.0, n).astype(float),
                            lambda y, t: stats.poisson.logpmf(y, 7.0 * sig(t)), None),
        "NegativeBinomial": (LIK.NegativeBinomial(2.5), rng.poisson(3.0, n).astype(float),
                             lambda y, t: stats.nbinom.logpmf(y, 2.5, 1.0 - sig(t)), None),
        # declared by its pieces: the generalised Gaussian, shape 1.5 (scipy's gennorm)
        "SuperGaussian": (declared("GeneralisedGaussian", scale=0.7, shape=fixed(positive(1.5))),
                          2.0 * rng.normal(size=n),
                          lambda y, t: stats.gennorm.logpdf(y, 1.5, loc=t, scale=0.7),
                          lambda y: y),
    }
    assert sorted(cases) == sorted(a for a in AUGMENTED
                                   if not issubclass(getattr(LIK, a), LIK.MultiLatent))
    for name, (lik, y, logp, kink) in cases.items():
        yj, fj = jnp.asarray(y), jnp.asarray(f)
        exact = np.asarray(lik.augmented_expectations(yj, fj, jnp.zeros(n)))
        np.testing.assert_allclose(exact, logp(y, f), rtol=1e-10, atol=1e-10, err_msg=name)
        gaps = []
        for v in (0.2, 0.02):
            aug = np.asarray(lik.augmented_expectations(yj, fj, jnp.full(n, v)))
            e_logp = np.array([gauss_expectation(lambda t, yi=yi, lp=logp: lp(yi, t), fi, v,
                                                 None if kink is None else kink(yi))
                               for yi, fi in zip(y, f, strict=True)])
            gaps.append(e_logp - aug)
        if name == "Gaussian":
            np.testing.assert_allclose(gaps[0], 0.0, atol=1e-10)
            continue
        assert np.all(gaps[1] > 1e-6), (name, gaps[1])
        assert np.all(gaps[1] < 0.5 * gaps[0]), name


# --- 3. AnalyticSVI on the full batch with step 1 is one CAVI step -------------------------------


def test_full_batch_svi_step_is_the_cavi_step():
    """fit treats batch_size >= n as the full batch (scale 1, no shuffling), so
    AnalyticSVI(n, step_size=1) and AnalyticVI() both take exactly the CAVI step of the
    direct building blocks (seed 000 part 1 section 3.6: "s = n with rho = 1 is CAVI"); with
    the augmented objective the history records the augmented bound."""
    model, X, y, _ = cavi("Logistic", "whitened", 0)
    one, _, _, tr = cavi("Logistic", "whitened", 1)
    ref1, refP = whitened(one)
    for inference in (agp.AnalyticSVI(batch_size=len(y), step_size=1.0, objective="augmented"),
                      agp.AnalyticVI(objective="augmented")):
        post = agp.fit(model, X, y, inference, max_iter=1, chunk_size=1)
        t1, P = whitened(post.model)
        np.testing.assert_allclose(t1, ref1, rtol=1e-10, atol=1e-10 * np.max(np.abs(ref1)))
        np.testing.assert_allclose(P, refP, rtol=1e-10, atol=1e-10 * np.max(np.abs(refP)))
        np.testing.assert_allclose(post.history.objective, [-tr["aug"][0]], rtol=1e-12)
        np.testing.assert_allclose(post.history.step_size, [1.0])
        np.testing.assert_allclose(post.elbo(augmented=True), tr["aug"][1], rtol=1e-10)


# --- 4. the minibatch step ------------------------------------------------------------------


def numpy_sites(name, y, m, v):
    """(beta, gamma) of the augmented model from the reconciled table of seed 000 part 2
    section 1.10 (zero prior mean): logistic beta = y/2, gamma = tanh(c/2)/(2c), c^2 = m^2 + v;
    Student-t gamma = (nu + 1) / (nu sigma^2 + E), beta = gamma y, E = (y - m)^2 + v."""
    if name == "Logistic":
        return 0.5 * y, tanh_ratio(np.sqrt(m**2 + v))
    if name == "StudentT":
        gamma = 4.0 / (3.0 * 0.3**2 + (y - m) ** 2 + v)
        return gamma * y, gamma
    raise ValueError(name)


def first_batch(key, n, s):
    """The first minibatch of fit's shuffled epochs (fit._batch: at t = 0 the key is split
    and the permutation drawn from the second half)."""
    _, sub = jax.random.split(key)
    return np.asarray(jax.random.permutation(sub, n))[:s]


@pytest.mark.parametrize("name", ["Logistic", pytest.param("StudentT", marks=pytest.mark.slow)])
def test_minibatch_step_interpolates_natural_parameters(name):
    """One AnalyticSVI step on a batch B of s points with step rho gives, in the natural
    parameters of q(u) (unwhitened, q="natural"),
        eta <- (1 - rho) eta + rho eta_hat,  eta1_hat = (n/s) kappa_B^T beta_B,
        eta2_hat = -1/2 (Kmm^-1 + (n/s) kappa_B^T diag(gamma_B) kappa_B)
    (seed 000 part 1 eq. 12, the errata's n/|B| scale and natural-parameter interpolation),
    with kappa = K_Bm Kmm^-1 and the sites at the marginals of the current q -- all in numpy
    from the kernel matrices."""
    if name != "Logistic" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds the Student-t case)")
    run, X, y, _ = cavi(name, "whitened", 2)  # a q away from the prior and the optimum ...
    Lmm = jnp.asarray(np.linalg.cholesky(matern52(ZGRID, ZGRID)))
    q = agp.variational.make_q("natural", Lmm).from_whitened_natural(*whitened(run), Lmm)
    start = with_q(run, q)  # ... held as unwhitened natural parameters
    n, s, rho = len(y), 20, 0.3
    key = jax.random.key(7)
    post = agp.fit(start, X, y, agp.AnalyticSVI(s, step_size=rho), max_iter=1, chunk_size=1,
                   key=key)
    np.testing.assert_allclose(post.history.step_size, [rho])
    B = first_batch(key, n, s)
    Kmm, KmB = matern52(ZGRID, ZGRID), matern52(ZGRID, X[B])
    kappa = np.linalg.solve(Kmm, KmB).T
    eta1, eta2 = np.asarray(start.q.theta1.value), np.asarray(start.q.theta2.value)
    S = np.linalg.inv(-2.0 * eta2)
    mu = S @ eta1
    m = kappa @ mu
    v = KVAR - np.sum(kappa * KmB.T, 1) + np.sum((kappa @ S) * kappa, 1)
    beta, gamma = numpy_sites(name, y[B], m, v)
    hat1 = (n / s) * kappa.T @ beta
    hat2 = -0.5 * (np.linalg.inv(Kmm) + (n / s) * kappa.T @ (gamma[:, None] * kappa))
    new1, new2 = np.asarray(post.model.q.theta1.value), np.asarray(post.model.q.theta2.value)
    want1, want2 = (1 - rho) * eta1 + rho * hat1, (1 - rho) * eta2 + rho * hat2
    np.testing.assert_allclose(new1, want1, rtol=1e-9, atol=1e-9 * np.max(np.abs(want1)))
    np.testing.assert_allclose(0.5 * (new2 + new2.T), want2, rtol=1e-9,
                               atol=1e-9 * np.max(np.abs(want2)))
    # the full-batch target differs: the step really used the batch and its scale
    assert np.max(np.abs(hat1 - (kappa.T @ beta))) > 1.0


# --- 5. Z = X: SVGP is VGP ---------------------------------------------------------------------


def test_svgp_with_inducing_at_the_data_equals_vgp():
    """SVGP with Z = X (fixed) and VGP hold the same q(f(X)) after the same CAVI steps (the
    sparse -> full reduction, seed 000 part 2 section 8 test 13): their bounds agree at every
    iteration and their predictions at new inputs agree."""
    steps = 2
    vgp, X, y, tv = cavi("Logistic", "vgp", steps)
    svgp, _, _, ts = cavi("Logistic", "svgp_x", steps)
    np.testing.assert_allclose(ts["aug"], tv["aug"], rtol=1e-9)
    np.testing.assert_allclose(ts["plain"], tv["plain"], rtol=1e-9)
    assert tv["aug"][steps - 1] < tv["aug"][steps] - 1e-6  # not converged yet: a non-trivial q
    mv, vv = (np.asarray(a) for a in vgp.predict_f(XS))
    ms, vs = (np.asarray(a) for a in svgp.predict_f(XS))
    np.testing.assert_allclose(ms, mv, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(vs, vv, rtol=1e-6, atol=1e-8)


# --- 6. the logistic fixed point of the full GP ------------------------------------------------


def logistic_fixed_point(K, y, tol=1e-13):
    """Iterate Sigma = (K^-1 + diag(theta))^-1, mu = Sigma y/2, theta = tanh(c/2)/(2c),
    c = sqrt(Sigma_ii + mu_i^2) (seed 000 part 1 section 3.6, non-sparse variant) in numpy."""
    Kinv = np.linalg.inv(K)
    theta = np.full(len(y), 0.25)
    for _ in range(1000):
        S = np.linalg.inv(Kinv + np.diag(theta))
        mu = S @ (0.5 * y)
        new = tanh_ratio(np.sqrt(np.diag(S) + mu**2))
        if np.max(np.abs(new - theta)) < tol:
            return mu, S, new
        theta = new
    raise AssertionError("the numpy fixed-point iteration did not converge")


def test_vgp_logistic_cavi_fixed_point_equations():
    model, X, y, _ = cavi("Logistic", "vgp")
    K = matern52(X, X)
    mu, S = (np.asarray(a) for a in model.q.mean_cov(jnp.asarray(K),
                                                     jnp.asarray(np.linalg.cholesky(K))))
    # the library's q satisfies the fixed-point equations ...
    theta = tanh_ratio(np.sqrt(np.diag(S) + mu**2))
    S_eq = np.linalg.inv(np.linalg.inv(K) + np.diag(theta))
    np.testing.assert_allclose(S, S_eq, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(mu, S_eq @ (0.5 * y), rtol=1e-8, atol=1e-10)
    # ... and is the point numpy's own iteration reaches
    mu_np, S_np, _ = logistic_fixed_point(K, y)
    np.testing.assert_allclose(mu, mu_np, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(S, S_np, rtol=1e-8, atol=1e-10)
    # and the marginals at the training inputs are q's
    m, v = (np.asarray(a) for a in model.predict_f(X))
    np.testing.assert_allclose(m, mu, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(v, np.diag(S), rtol=1e-8, atol=1e-10)


# --- 7. agreement with quadrature VI and with MCMC ----------------------------------------------


def numpy_loglik(name, y):
    if name == "Logistic":
        return lambda F: -np.sum(np.logaddexp(0.0, -y * F), -1)
    if name == "StudentT":  # df 3, scale 0.3 (constants dropped)
        return lambda F: -2.0 * np.sum(np.log1p(((y - F) / 0.3) ** 2 / 3.0), -1)
    raise ValueError(name)


# tolerances in units of the posterior sd: see the docstring of the test
MCMC_TOL = {"Logistic": (0.2, (0.85, 1.05)), "StudentT": (0.3, (0.6, 1.05))}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Logistic", "StudentT"])
def test_vgp_cavi_posterior_agrees_with_elliptical_slice_sampling(name):
    """The CAVI fixed point of the full GP (VGP, fixed hyperparameters) against the exact
    posterior of f at the training inputs from elliptical slice sampling (independent numpy
    code and kernel matrix, seeded; 40 chains x 1000 samples (logistic) and 64 x 1200
    (Student-t) here, 200 x 10000 with AGP_FULL_SLOW=1).

    Tolerance |E_q f_i - E_p f_i| <= t sd_p(f_i) + 4 se_i, se_i the Monte Carlo standard
    error from the spread of the independent chains' means (4 se: the max of 40 normal
    deviates exceeds 4 with probability 0.3%). t is the VI bias allowed: q is the Gaussian
    of a mean-field (q(f) q(w)) fit of a looser bound, whose mean is off by a fraction of the
    posterior sd set by the skewness of the posterior: t = 0.2 for the log-concave logistic
    posterior (measured 0.064 in the long run; 0.08 with kernel variance 4), t = 0.3 for the
    Student-t with 10% outliers, whose posterior is not log-concave (measured 0.145). Both
    are far below how far the data move the posterior mean (asserted: > 1.5 sd somewhere;
    1.9 and 5.2 sd here). Mean-field VI underestimates variances: sd_q / sd_p must lie in the
    stated band (long runs: 0.935 -- 0.978 logistic, 0.80 -- 0.91 Student-t)."""
    model, X, y, _ = cavi(name, "vgp")
    n_chains, n_keep, n_burn = (200, 10000, 2000) if FULL else (
        (40, 1000, 300) if name == "Logistic" else (64, 1200, 800))
    means, second = elliptical_slice(numpy_loglik(name, y), matern52(X, X), n_chains, n_keep,
                                     n_burn, seed=11)
    pm = means.mean(0)
    psd = np.sqrt(second.mean(0) - pm**2)
    se = means.std(0, ddof=1) / np.sqrt(n_chains)
    assert np.max(se / psd) < 0.1  # the sampler mixed
    m, v = (np.asarray(a) for a in model.predict_f(X))
    t, (lo, hi) = MCMC_TOL[name]
    err = np.abs(m - pm)
    assert np.all(err <= t * psd + 4.0 * se), np.max((err - 4.0 * se) / psd)
    assert np.max(np.abs(pm) / psd) > 1.5  # the prior mean 0 would fail the tolerance
    ratio = np.sqrt(v) / psd
    assert lo <= ratio.min() and ratio.max() <= hi, (ratio.min(), ratio.max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Logistic", pytest.param("StudentT", marks=pytest.mark.slow)])
def test_analytic_vi_agrees_with_quadrature_vi(name):
    """AnalyticVI and QuadratureVI fitted to convergence on the same VGP (fixed
    hyperparameters): predictive means at new inputs agree to 0.25 predictive sd (logistic;
    0.4 for the non-log-concave Student-t). The optima differ -- the augmented bound is
    looser, and its optimum is not the plain bound's -- so only closeness is asserted (the
    measured differences are 0.066 sd (logistic) and 0.15 sd (Student-t)), and the plain
    bound at the quadrature optimum is at least the plain bound at the augmented one."""
    if name != "Logistic" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds the Student-t case)")
    model, X, y, tr = cavi(name, "vgp")
    quad = agp.fit(agp.VGP(kern(), make_likelihood(name)), X, y, agp.QuadratureVI(1.0),
                   max_iter=100, chunk_size=100, tol=0.0)
    obj = quad.history.objective
    assert abs(obj[-1] - obj[-2]) < 1e-8 * abs(obj[-1])
    ma, va = (np.asarray(a) for a in model.predict_f(XS))
    mq, vq = (np.asarray(a) for a in quad.predict_f(XS))
    tol = 0.25 if name == "Logistic" else 0.4
    assert np.max(np.abs(ma - mq) / np.sqrt(vq)) <= tol
    assert quad.elbo() >= tr["plain"][-1] - 1e-8 * abs(quad.elbo())


# --- 8. real data: AnalyticSVI against QuadratureSVI ------------------------------------------


def _standardise_train_test(Xtr, Xte):
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    return (Xtr - mu) / sd, (Xte - mu) / sd


def real_problem(name, n_train, n_test, seed=0):
    """(Xtr, ytr, Xte, yte, kernel factory, likelihood factory, mean factory, baseline NLL):
    the baseline is the constant predictor of the same family (base rate; N(median, 1) for
    the standardised kin40k; moment-matched negative binomial; Poisson at the mean)."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    if name == "Logistic":  # a9a: 123 binary features, kept as 0/1; official split
        d = load_shared("a9a")
        i = rng.choice(len(d["y_train"]), n_train, replace=False)
        j = rng.choice(len(d["y_test"]), n_test, replace=False)
        Xtr, Xte = d["X_train"][i], d["X_test"][j]
        ytr, yte = 2.0 * d["y_train"][i] - 1.0, 2.0 * d["y_test"][j] - 1.0
        p = np.mean(ytr > 0)
        base = -np.mean(np.where(yte > 0, np.log(p), np.log1p(-p)))
        return (Xtr, ytr, Xte, yte, lambda: agp.kernels.RBF(4.0, 1.0), LIK.Logistic,
                lambda: None, base)
    if name in ("StudentT", "Laplace"):  # kin40k (standardised), 5% gross outliers in ytr
        d = load_shared("kin40k")
        idx = rng.permutation(len(d["y"]))
        i, j = idx[:n_train], idx[n_train:n_train + n_test]
        Xtr, Xte, ytr, yte = d["X"][i], d["X"][j], d["y"][i].copy(), d["y"][j]
        out = rng.uniform(size=n_train) < 0.05
        ytr[out] += rng.choice([-1.0, 1.0], out.sum()) * rng.uniform(3.0, 6.0, out.sum())
        lik = (lambda: LIK.StudentT(3.0, 0.3)) if name == "StudentT" else (
            lambda: LIK.Laplace(0.3))
        base = -np.mean(stats.norm.logpdf(yte, np.median(ytr), 1.0))
        return (Xtr, ytr, Xte, yte, lambda: agp.kernels.RBF(np.full(8, 1.5), 1.0), lik,
                lambda: None, base)
    # bike, night hours (hr <= 5): counts 1..283; over the whole day (counts up to 977) the
    # Poisson model is grossly overdispersed (test NLL ~30 vs ~6 for the negative binomial)
    d = load_shared("bike")
    night = d["X"][:, 3] <= 5
    X, y = d["X"][night], d["y"][night]
    n_train, n_test = min(n_train, len(y) // 2), min(n_test, len(y) - min(n_train, len(y) // 2))
    idx = rng.permutation(len(y))
    i, j = idx[:n_train], idx[n_train:n_train + n_test]
    Xtr, Xte = _standardise_train_test(X[i], X[j])
    ytr, yte = y[i], y[j]
    mu, var = ytr.mean(), ytr.var()
    r = mu**2 / (var - mu)
    if name == "NegativeBinomial":
        base = -np.mean(stats.nbinom.logpmf(yte, r, r / (r + mu)))
        lik, mean = (lambda: LIK.NegativeBinomial(2.0)), (
            lambda: agp.means.Constant(float(np.log(mu / 2.0))))
    else:
        base = -np.mean(stats.poisson.logpmf(yte, mu))
        lik, mean = (lambda: LIK.LogisticPoisson(1.5 * ytr.max())), (lambda: None)
    return (Xtr, ytr, Xte, yte, lambda: agp.kernels.RBF(np.full(X.shape[1], 2.0), 1.0), lik,
            mean, base)


REAL_DEFAULT = {"Logistic"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Logistic", "StudentT", "Laplace", "NegativeBinomial",
                                  "LogisticPoisson"])
def test_analytic_svi_on_real_data_is_no_worse_than_quadrature_svi(name):
    """Same data, kernel, likelihood and mean (hyperparameters trained by Adam from the same
    start), same fixed k-means inducing inputs, same minibatches (key), same Robbins-Monro
    step sizes and iterations: AnalyticSVI's test NLL is at most QuadratureSVI's plus a
    margin of 0.01 + 1.5% of it, and for a9a its test error at most 0.01 above.

    Why a margin: AnalyticSVI maximises the augmented bound, which is looser (section 2) and
    under-estimates the latent variance (the sd ratios of the MCMC test), which costs a
    little calibration, and its hyperparameters follow that bound. Measured (NLL analytic /
    quadrature): reduced size a9a 0.3686 / 0.3631 (error 0.175 / 0.175); with
    AGP_FULL_SLOW=1 (n = 5000, M = 50, 1000 iterations) a9a 0.3350 / 0.3337 (0.1516 /
    0.1516), kin40k Student-t 1.136 / 1.201, Laplace 1.183 / 1.207, bike negative binomial
    3.311 / 3.295, logistic-Poisson 4.115 / 4.291. (At the reduced size, which runs only a9a,
    kin40k-Laplace gives 1.379 / 1.317, beyond the margin: at the same fixed hyperparameters
    -- those QuadratureSVI learned -- the two agree to 0.001 (1.2740 / 1.2746), so the
    difference is the hyperparameters learned on the augmented bound with few data, not the
    inference of q.) Both fits must beat a constant predictor of their family, so that the
    comparison is between working models."""
    if name not in REAL_DEFAULT and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds kin40k and bike)")
    n_train, n_test, M, iters = (5000, 5000, 50, 1000) if FULL else (1000, 1000, 30, 300)
    Xtr, ytr, Xte, yte, kernel, lik, mean, base = real_problem(name, n_train, n_test)
    Z = agp.inducing.kmeans(Xtr, M, jax.random.key(0))
    res = {}
    rm = agp.schedules.RobbinsMonro()  # the papers' steps, for both (the defaults are 0.1)
    for inference in (agp.AnalyticSVI(100, rm), agp.QuadratureSVI(100, rm)):
        model = agp.SVGP(kernel(), lik(), fixed(real(Z)), mean=mean())
        post = agp.fit(model, Xtr, ytr, inference, max_iter=iters, learning_rate=0.02, tol=0.0,
                       chunk_size=iters, key=jax.random.key(1))
        assert post.history.n_iter == iters
        nll = -float(np.mean(np.asarray(post.predict_log_density(Xte, yte))))
        err = (float(np.mean((np.asarray(post.predict_proba(Xte)) > 0.5) != (yte > 0)))
               if name == "Logistic" else None)
        res[type(inference).__name__] = (nll, err, post)
    (nll_a, err_a, post_a), (nll_q, err_q, _) = res["AnalyticSVI"], res["QuadratureSVI"]
    print(f"{name}: NLL analytic {nll_a:.4f} quadrature {nll_q:.4f} baseline {base:.4f}; "
          f"error analytic {err_a} quadrature {err_q}")
    np.testing.assert_allclose(post_a.history.step_size, (np.arange(iters) + 1.0) ** -0.51,
                               rtol=1e-12)
    assert nll_a <= nll_q + 0.01 + 0.015 * abs(nll_q), (nll_a, nll_q)
    assert max(nll_a, nll_q) < base - 0.02, (nll_a, nll_q, base)
    if name == "Logistic":
        assert err_a <= err_q + 0.01, (err_a, err_q)
        assert max(err_a, err_q) < min(np.mean(yte > 0), np.mean(yte < 0)) - 0.03


# --- 9. errors --------------------------------------------------------------------------------


def test_bad_use_raises_value_error():
    X, y = sparse_data("Logistic")
    counts = np.arange(80.0) % 4
    Xf, yf = full_data("Logistic")
    for lik, yy in ((LIK.Probit(), y), (LIK.Poisson(), counts)):
        model = agp.SVGP(kern(), lik, fixed(real(ZGRID)))
        for inference in (agp.AnalyticVI(), agp.AnalyticSVI(5)):
            with pytest.raises(ValueError, match="QuadratureVI") as info:
                agp.fit(model, X, yy, inference, max_iter=1)
            for alternative in AUGMENTED:
                assert alternative in str(info.value)
    with pytest.raises(ValueError, match="QuadratureVI"):
        agp.fit(agp.VGP(kern(), LIK.Poisson()), Xf, counts[:40], agp.AnalyticVI(), max_iter=1)
    logistic = agp.SVGP(kern(), LIK.Logistic(), fixed(real(ZGRID)))
    with pytest.raises(ValueError, match="full batch"):
        agp.fit(agp.VGP(kern(), LIK.Logistic()), Xf, yf, agp.AnalyticSVI(5), max_iter=1)
    with pytest.raises(ValueError, match="batch_size"):
        agp.fit(logistic, X, y, agp.AnalyticSVI(81), max_iter=1)
    with pytest.raises(ValueError, match="GP is not trained by AnalyticVI; it is by Exact"):
        agp.fit(agp.GP(kern(), LIK.Logistic()), X, y, agp.AnalyticVI())
    for bad in (0, 1.5, -3):
        with pytest.raises(ValueError, match="batch_size"):
            agp.AnalyticSVI(bad)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError):
            agp.AnalyticVI(step_size=bad)
        with pytest.raises(ValueError):
            agp.AnalyticSVI(10, step_size=bad)
    probit = agp.SVGP(kern(), LIK.Probit(), fixed(real(ZGRID)))
    with pytest.raises(ValueError, match="no augmentation"):
        probit.elbo(X, y, augmented=True)
    post = agp.SparsePosterior(probit, jnp.asarray(X), jnp.asarray(y))
    with pytest.raises(ValueError, match="no augmentation"):
        post.elbo(augmented=True)
    with pytest.raises(ValueError, match="no augmentation"):
        post.augmentation_gap()


def test_adaptive_step_size_reaches_the_cavi_optimum():
    """AnalyticSVI with the adaptive rate of Ranganath et al. (the schedule's state carried
    through the scan): q does not move during the first init_steps, the rate stays in
    [0, 1], and with fixed hyperparameters the minibatch run ends within 0.5% of the
    augmented bound at the CAVI optimum (200 iterations of batch 20 of 80 points; measured
    0.02%), far above the bound at the prior."""
    model, X, y = make_model("Logistic", "whitened")
    prior = model.elbo(X, y, augmented=True)
    cavi_fit = agp.fit(model, X, y, agp.AnalyticVI(), max_iter=T_MAX, tol=0.0)
    best = cavi_fit.elbo(augmented=True)
    ad = agp.AnalyticSVI(20, agp.schedules.Adaptive(init_steps=8))
    svi = agp.fit(model, X, y, ad, max_iter=200, tol=0.0, key=jax.random.key(3))
    rho = np.asarray(svi.history.step_size)
    assert np.all(rho[:8] == 0.0) and rho[8] > 0.0
    assert np.all((0.0 <= rho) & (rho <= 1.0))
    got = svi.elbo(augmented=True)
    assert best - got <= 5e-3 * abs(best) and best - got < 0.05 * (best - prior)


def test_hyper_every_updates_hyperparameters_only_every_kth_iteration():
    """fit(..., hyper_every=3): iterations 1 and 2 are natural steps on q(u) alone, so after
    3 iterations the hyperparameters are those after the first iteration (same minibatches),
    while q(u) has moved on; with hyper_every=1 they move at every iteration. The fits start
    from q(u) after one natural step: at q(u) = p(u) the bound's gradient in the kernel's
    hyperparameters is zero, and the first Adam step would move them only by rounding."""
    X, y = sparse_data("StudentT")
    model = agp.SVGP(agp.kernels.Matern52(LS, KVAR), LIK.StudentT(3.0, 0.3),
                     fixed(real(ZGRID)))
    inf = agp.AnalyticSVI(20, 0.5)
    model = agp.fit(model, X, y, inf, max_iter=1, tol=0.0, key=jax.random.key(1),
                    learning_rate=1e-300).model
    fit = lambda n, k: agp.fit(model, X, y, inf, max_iter=n, tol=0.0, key=jax.random.key(0),
                               hyper_every=k, learning_rate=0.05).model
    one, three, three_every = fit(1, 1), fit(3, 3), fit(3, 1)
    ls = lambda m: float(m.kernel.lengthscale.value)
    assert float(model.kernel.lengthscale.value) == LS
    assert abs(math.log(ls(one) / LS)) > 1e-3  # an Adam step of the learning rate's order
    assert ls(three) == ls(one) and abs(math.log(ls(three_every) / ls(one))) > 1e-3
    assert float(three.likelihood.scale.value) == float(one.likelihood.scale.value)
    assert not np.allclose(three.q.mean_cov(*qargs(three))[0], one.q.mean_cov(*qargs(one))[0])
    with pytest.raises(ValueError, match="hyper_every"):
        agp.fit(model, X, y, inf, max_iter=2, hyper_every=0)
    with pytest.raises(ValueError, match="natural"):
        agp.fit(model, X, y, agp.QuadratureSVI(20, natural=False), max_iter=2, hyper_every=2)


def qargs(model):
    Kmm = model.kernel(jnp.asarray(model.inducing.value))
    return Kmm, agp.linalg.cholesky(Kmm)


@pytest.mark.parametrize("objective", ["augmented", "exact"])
def test_hyperparameter_objective_is_the_bound_it_names(objective):
    """AnalyticVI(objective=...): q(u) takes the same closed-form augmented steps; the
    hyperparameters (and the history) follow the augmented bound at the optimal q(w), or
    the plain ELBO E_q[log p(y | f)] - KL ("exact"). Oracle: the recorded objective of a
    step at fixed hyperparameters (learning rate ~0) is minus that bound at the state it
    started from, computed by the model's own elbo(augmented=...)."""
    X, y = sparse_data("StudentT")
    model = agp.SVGP(agp.kernels.Matern52(LS, KVAR), LIK.StudentT(3.0, 0.3),
                     fixed(real(ZGRID)))
    inf = agp.AnalyticVI(objective=objective)
    warm = agp.fit(model, X, y, inf, max_iter=3, tol=0.0).model  # q(u) away from the prior
    post = agp.fit(warm, X, y, inf, max_iter=1, tol=0.0, learning_rate=1e-300)
    bound = warm.elbo(X, y, augmented=objective == "augmented")
    np.testing.assert_allclose(-post.history.objective[0], bound, rtol=1e-10)
    other = warm.elbo(X, y, augmented=objective != "augmented")
    assert abs(other - bound) > 1e-3  # the two bounds differ here: the check can fail
    for bad in ("elbo", None, 1):
        with pytest.raises(ValueError, match="objective must be one of"):
            agp.AnalyticSVI(10, objective=bad)
    with pytest.raises(ValueError, match="n_points"):
        agp.AnalyticVI(objective="exact", n_points=0)


def test_a_loose_augmented_fit_warns_naming_the_remedy():
    """A fit on the augmented objective warns when the mean augmentation gap per training
    point exceeds GAP_WARNING, naming the remedies; a fit on the plain ELBO
    (objective="exact"), one whose gap is small, or one shorter than GAP_MIN_ITER (whose
    gap measures its start) does not. Oracle for the number in the
    message: the posterior's own augmentation_gap() / n. Problems: 5 classes on 150 points
    with the logistic-softmax (gap 0.086 nats per point, measured) and a noisy binary
    logistic problem (0.005)."""
    import warnings

    from augmentedgp.inference.vi import GAP_MIN_ITER, GAP_WARNING

    rng = np.random.default_rng(0)
    n, C = 150, 5
    X = rng.normal(size=(n, 2))
    y = np.argmax(X @ rng.normal(size=(2, C)) * 8 + rng.gumbel(size=(n, C)), 1)
    yb = (X[:, 0] + rng.logistic(size=n) > 0).astype(float)
    fit = lambda lik, yy, **kw: agp.fit(agp.VGP(agp.kernels.RBF(1.0, 1.0), lik), X, yy,
                                        agp.AnalyticVI(**kw), max_iter=300)
    with pytest.warns(UserWarning, match="nats per point below the ELBO.*QuadratureVI") as w:
        post = fit(LIK.LogisticSoftmax(C), y)  # the default objective: augmented
    gap = post.augmentation_gap() / n
    assert gap > GAP_WARNING and f"{gap:.3f} nats" in str(w[0].message)
    assert w[0].filename == __file__  # points at the caller's fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # GAP_MIN_ITER iterations: long enough for the check, which these objectives skip
        for objective in ("exact", "tight"):
            agp.fit(agp.VGP(agp.kernels.RBF(1.0, 1.0), LIK.LogisticSoftmax(C)), X, y,
                    agp.AnalyticVI(objective=objective), max_iter=GAP_MIN_ITER, tol=0.0)
        small = fit(LIK.Logistic(), yb)
        short = agp.fit(agp.VGP(agp.kernels.RBF(1.0, 1.0), LIK.LogisticSoftmax(C)), X, y,
                        agp.AnalyticVI(), max_iter=GAP_MIN_ITER - 1)
    assert small.augmentation_gap() / n < GAP_WARNING
    assert short.augmentation_gap() / n > GAP_WARNING


# the ELBO's optimum by objective="tight": likelihood parameters trainable (the Student-t's
# degrees of freedom fixed); BayesianSVM is left out: its hinge makes tight natural steps of
# size 1 cycle (QuadratureVI's own 3,000-step run does not settle: gradient norm 1.3)
TIGHT_LIKELIHOODS = {
    "Logistic": LIK.Logistic, "StudentT": lambda: LIK.StudentT(fp(3.0), 0.3),
    "Laplace": lambda: LIK.Laplace(0.3), "Matern32": lambda: LIK.Matern32(0.3),
    "LogisticPoisson": lambda: LIK.LogisticPoisson(10.0),
    "NegativeBinomial": lambda: LIK.NegativeBinomial(2.0)}
TIGHT_REDUCED = ("Logistic", "Laplace", "Matern32")
# iterations (1,000 elsewhere): the Student-t's and the Laplace's tight stages take natural
# steps of 0.2 (inference.vi.quadrature_step) and need ~1,500 to settle to these tolerances
TIGHT_ITER = {"StudentT": 3000, "Laplace": 3000}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n in TIGHT_REDUCED else pytest.mark.slow)
    for n in TIGHT_LIKELIHOODS])
def test_tight_objective_reaches_the_optimum_of_quadrature_vi(name):
    """objective="tight" (the augmented fit, then tight sites) ends at the plain ELBO's
    optimum, the fixed point of QuadratureVI: on a 40-point VGP with trainable kernel and
    likelihood parameters (Adam 0.02), those parameters agree with QuadratureVI's fitted
    from the prior to 1e-3 (relative; measured <= 3e-4), its objective is no worse, and
    q(u) is the fixed point of the tight step (the whitened natural parameters equal their
    target from the Gauss-Hermite sites to 1e-3, relative; measured <= 3e-4). The
    augmented objective's hyperparameters are 10-100% away (benchmarks/objectives.py)."""
    if name not in TIGHT_REDUCED and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 runs every augmented likelihood)")
    X, y = (jnp.asarray(a) for a in full_data(name))
    fits = {}
    for label, inference in (("tight", agp.AnalyticVI(objective="tight")),
                             ("quadrature", agp.QuadratureVI(1.0))):
        model = agp.VGP(agp.kernels.Matern52(1.0, 1.0), TIGHT_LIKELIHOODS[name](),
                        mean=const_mean(name))
        fits[label] = agp.fit(model, X, y, inference, max_iter=TIGHT_ITER.get(name, 1000),
                              learning_rate=0.02, tol=0.0)
    tight, quad = fits["tight"], fits["quadrature"]
    assert "then QuadratureVI" in tight.history.message
    obj_t, obj_q = tight.history.objective[-1], quad.history.objective[-1]
    assert obj_t <= obj_q + 1e-7 * abs(obj_q), (obj_t, obj_q)
    for part in ("kernel", "likelihood"):
        for field in ("variance", "lengthscale", "scale", "rate", "r"):
            pt = getattr(getattr(tight.model, part), field, None)
            if pt is not None and pt.trainable:
                pq = getattr(getattr(quad.model, part), field)
                np.testing.assert_allclose(pt.value, pq.value, rtol=1e-3, err_msg=field)
    m = tight.model
    p = m.project(X)
    beta, gamma = natgrad.quadrature_sites(m.likelihood, y, p.mean, p.var, p.prior_mean)
    s1, S2 = natgrad.site_statistics(p.A, beta, gamma)
    theta1, P = m.q.whitened_natural(p.Lmm)
    assert np.max(np.abs(theta1 - s1)) < 1e-3 * np.max(np.abs(s1))
    assert np.max(np.abs(P - np.eye(P.shape[0]) - S2)) < 1e-3 * np.max(np.abs(P))


def test_tight_objective_runs_its_stages_within_one_fit():
    """objective="tight" splits max_iter: the augmented fit for the first half, the tight
    stage (QuadratureSVI on the same minibatches) for what is left; one history whose
    iterations, wall times and step sizes run on, a callback counting the whole fit's
    iterations (and able to stop it in either stage). Distributed fits refuse it, naming
    the recipe."""
    from augmentedgp.inference.vi import stages, tight_stage

    X, y = sparse_data("Laplace")
    model = agp.SVGP(agp.kernels.RBF(1.0, 1.0), LIK.Laplace(0.3), fixed(real(ZGRID)))
    inference = agp.AnalyticSVI(20, objective="tight")
    (first, n1), (second, n2) = stages(inference, model.likelihood, 101)
    assert (type(first), first.objective, n1) == (agp.AnalyticSVI, "augmented", 51)
    assert type(second) is agp.QuadratureSVI and second.batch_size == 20 and n2 == 50
    assert tight_stage(agp.AnalyticVI(n_points=7), model.likelihood).n_points == 7
    seen = []
    post = agp.fit(model, X, y, inference, max_iter=101, chunk_size=10, tol=0.0,
                   callback=lambda it, f, m: seen.append(it))
    h = post.history
    assert h.n_iter == 101 and h.step_size.shape == (101,) and np.all(np.diff(h.wall_time) >= 0)
    assert h.message == "max_iter reached; then QuadratureSVI: max_iter reached"
    assert seen == [*range(10, 51, 10), 51, *range(61, 102, 10)]
    for stop_at in (30, 70):
        stopped = agp.fit(model, X, y, inference, max_iter=101, chunk_size=10, tol=0.0,
                          callback=lambda it, f, m, s=stop_at: it >= s)
        assert stopped.history.n_iter == stop_at + (stop_at > 51)
        assert stopped.history.message.endswith("stopped by callback")
    with pytest.raises(ValueError, match="runs two fits in turn"):
        agp.distributed.fit(model, (X, y), inference, max_iter=2)


# one latent value per coordinate (inputs 100 apart: K = k I to ~1e-90), so each distinct
# target has a one-dimensional posterior: likelihood -> (factory, prior mean, prior variance,
# targets, the kink of log p(y | f) in f if any)
ONE_D = {
    "Logistic": (LIK.Logistic, 0.5, 4.0, (1.0, -1.0), None),
    "BayesianSVM": (LIK.BayesianSVM, 0.3, 2.0, (1.0, -1.0), "y"),
    "StudentT": (lambda: LIK.StudentT(fp(3.0), fp(0.3)), 0.0, 1.0, (0.2, 1.2, 2.5), None),
    "Laplace": (lambda: LIK.Laplace(fp(0.5)), 0.0, 1.0, (0.3, 1.5), "y"),
    "Matern32": (lambda: LIK.Matern32(fp(0.5)), 0.0, 1.0, (0.3, 2.0), None),
    "LogisticPoisson": (lambda: LIK.LogisticPoisson(fp(10.0)), 0.0, 2.0, (0.0, 3.0, 9.0), None),
    "NegativeBinomial": (lambda: LIK.NegativeBinomial(fp(2.0)), 0.0, 2.0, (0.0, 40.0), None),
}
ONE_D_REDUCED = ("Logistic", "Laplace", "NegativeBinomial")


def one_d_moments(logpdf, m0, k, kink, start):
    """(the optimal Gaussian's mean and sd, the exact posterior's mean and sd) of the 1-D
    posterior p(f | y) ~ exp(logpdf(f)) N(f | m0, k). The Gaussian maximises
    E_N(m, s^2)[logpdf] - KL(N(m, s^2) || N(m0, k)) (Nelder-Mead), the expectation by
    400-point Gauss-Legendre panels on z in [-12, 12] split at the kink; the posterior's
    moments by the trapezoid rule on a fine grid."""
    from scipy import optimize

    x, w = np.polynomial.legendre.leggauss(400)

    def expectation(m, s):
        cuts = [-12.0, 12.0]
        if kink is not None and -12.0 < (kink - m) / s < 12.0:
            cuts.insert(1, (kink - m) / s)
        total = 0.0
        for a, b in zip(cuts[:-1], cuts[1:], strict=False):
            z = 0.5 * (a + b) + 0.5 * (b - a) * x
            total += 0.5 * (b - a) * np.sum(w * np.exp(-0.5 * z**2) * logpdf(m + s * z))
        return total / np.sqrt(2.0 * np.pi)

    def negative_elbo(p):
        m, s = p[0], np.exp(p[1])
        return -(expectation(m, s) - 0.5 * (s**2 / k + (m - m0) ** 2 / k - 1.0
                                            - np.log(s**2 / k)))

    opt = optimize.minimize(negative_elbo, [start[0], np.log(start[1])], method="Nelder-Mead",
                            options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 4000})
    grid = np.linspace(m0 - 12.0 * np.sqrt(k) - 20.0, m0 + 12.0 * np.sqrt(k) + 60.0, 400001)
    lp = logpdf(grid) - 0.5 * (grid - m0) ** 2 / k
    p = np.exp(lp - lp.max())
    p /= np.trapezoid(p, grid)
    mean = np.trapezoid(grid * p, grid)
    sd = np.sqrt(np.trapezoid((grid - mean) ** 2 * p, grid))
    return (opt.x[0], np.exp(opt.x[1])), (mean, sd)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n in ONE_D_REDUCED else pytest.mark.slow) for n in ONE_D])
def test_tight_q_is_the_optimal_gaussian_of_one_dimensional_posteriors(name):
    """On independent one-dimensional posteriors, q after objective="tight" is the Gaussian
    that maximises the plain ELBO, found independently (Nelder-Mead on a Gauss-Legendre
    expectation split at the kink): mean and sd to 1e-5 (measured <= 1e-6). And it is
    closer than the augmented q to the exact posterior (grid integration) in mean and in
    sd at every target: the augmented q's sd is 0.47-0.95 of the posterior's, the tight
    one's 0.69-0.996 (measured; both lowest at the Student-t target 2.5, in the tail)."""
    if name not in ONE_D_REDUCED and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 runs every augmented likelihood)")
    make, m0, k, values, kink = ONE_D[name]
    n = 30
    X = (100.0 * np.arange(n))[:, None]
    lik = make()
    y = np.asarray(lik.check_targets(np.resize(np.asarray(values, float), n)))
    model = agp.VGP(agp.kernels.Matern52(fp(1.0), fp(k)), lik,
                    mean=agp.means.Constant(fixed(real(m0))))
    tight = agp.fit(model, X, y, agp.AnalyticVI(objective="tight"), max_iter=400, tol=0.0)
    augmented = agp.fit(model, X, y, agp.AnalyticVI(), max_iter=400, tol=0.0)
    log_prob = eqx.filter_jit(lambda yy, f: lik.log_prob(yy, f))
    for j, target in enumerate(values):
        mt, vt = (float(a[j]) for a in tight.predict_f(X))
        ma, va = (float(a[j]) for a in augmented.predict_f(X))
        logpdf = lambda f, t=target: np.asarray(log_prob(jnp.full(np.shape(f), t), f))
        (om, osd), (pm, psd) = one_d_moments(logpdf, m0, k, None if kink is None else target,
                                             (mt, np.sqrt(vt)))
        np.testing.assert_allclose([mt, np.sqrt(vt)], [om, osd], rtol=1e-5, atol=1e-5)
        assert abs(mt - pm) < abs(ma - pm), (target, mt, ma, pm)
        assert abs(np.sqrt(vt) - psd) < abs(np.sqrt(va) - psd), (target, vt, va, psd)


@pytest.mark.parametrize("name", ["StudentT", pytest.param("Laplace", marks=pytest.mark.slow),
                                  pytest.param("bike", marks=pytest.mark.slow)])
def test_robust_regressor_default_fits_the_elbo_optimum(name, monkeypatch):
    """GPRegressor's robust likelihoods and GPCountRegressor's negative binomial fit
    objective="tight" by default: on 1,000 kin40k rows with 5% gross outliers (1,000 rows
    of bike's full-day counts, up to 941) its test NLL is below that of the augmented
    objective by more than 0.02, its history runs into the tight stage, and it is not worse
    than inference="quadrature" by more than 0.03. Measured (tight / augmented /
    quadrature): Student-t 0.7230 / 0.7665 / 0.7207, Laplace 0.8388 / 0.8727 / 0.8202,
    negative binomial 4.9245 / 5.8268 / 5.0278."""
    import augmentedgp.inference.plan as agp_plan
    import augmentedgp.sklearn as agp_sklearn
    import augmentedgp.training.planned as agp_planned

    if name != "StudentT" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds the Laplace likelihood and bike)")
    if name == "bike":
        d = load_shared("bike")
        X, y = d["X"], d["y"].astype(float)
        idx = np.random.default_rng(0).permutation(len(y))
        (Xtr, ytr), (Xte, yte) = ((X[k], y[k]) for k in (idx[:1000], idx[1000:2000]))
        make = lambda **kw: agp_sklearn.GPCountRegressor("negative_binomial", **kw)
    else:
        Xtr, ytr, Xte, yte, *_ = real_problem(name, 1000, 1000)
        lik = {"StudentT": "student_t", "Laplace": "laplace"}[name]
        make = lambda **kw: agp_sklearn.GPRegressor(lik, **kw)

    def nll(**kw):
        est = make(random_state=0, **kw).fit(Xtr, ytr)
        return -float(np.mean(est.log_predictive_density(Xte, yte))), est

    inferences = []  # what the estimator fits with
    train = agp_planned.train
    monkeypatch.setattr(agp_planned, "train",
                        lambda *a, **kw: inferences.append(a[3]) or train(*a, **kw))
    default, est = nll()
    assert [i.objective for i in inferences] == ["tight"]
    quadrature, _ = nll(inference="quadrature")
    monkeypatch.setattr(agp_plan, "augmented_objective",
                        lambda likelihood, minibatch: "augmented")
    augmented, _ = nll()
    assert default < augmented - 0.02, (default, augmented)
    assert default < quadrature + 0.03, (default, quadrature)


@pytest.mark.parametrize("name, margin", [
    ("Laplace", 0.01), pytest.param("NegativeBinomial", 0.02, marks=pytest.mark.slow)])
def test_tight_svi_on_real_data_is_within_a_margin_of_quadrature_svi(name, margin):
    """The margins of the augmented-VI issue: on 1,000 rows (M = 30 fixed k-means inducing
    inputs, batch 100, 2,000 steps, Adam 0.02, the same minibatches), AnalyticSVI with
    objective="tight" ends within 0.01 test NLL of QuadratureSVI on kin40k with Laplace
    noise, within 0.02 on bike counts with the negative binomial. Measured (augmented /
    tight / quadrature): Laplace 1.2872 / 1.2591 / 1.2609 -- the augmented objective misses
    the margin, so the test can fail --, negative binomial 3.2478 / 3.2446 / 3.2473 (the
    night-hour counts of bike, up to 283)."""
    if name != "Laplace" and not FULL:
        pytest.skip("reduced run (AGP_FULL_SLOW=1 adds bike)")
    Xtr, ytr, Xte, yte, kernel, lik, mean, _ = real_problem(name, 1000, 1000)
    Z = agp.inducing.kmeans(Xtr, 30, jax.random.key(0))
    nll = {}
    for label, inference in (("augmented", agp.AnalyticSVI(100)),
                             ("tight", agp.AnalyticSVI(100, objective="tight")),
                             ("quadrature", agp.QuadratureSVI(100, agp.schedules.RobbinsMonro()))):
        model = agp.SVGP(kernel(), lik(), fixed(real(Z)), mean=mean())
        post = agp.fit(model, Xtr, ytr, inference, max_iter=2000, learning_rate=0.02, tol=0.0,
                       chunk_size=500, key=jax.random.key(1))
        nll[label] = -float(np.mean(np.asarray(post.predict_log_density(Xte, yte))))
    assert nll["tight"] <= nll["quadrature"] + margin, nll
    if name == "Laplace":
        assert nll["augmented"] > nll["quadrature"] + margin, nll
