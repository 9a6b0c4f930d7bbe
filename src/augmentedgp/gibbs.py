"""Augmented blocked Gibbs sampling (thesis ch. 5 Algorithm 2; ch. 4 section 4.3 and 7.4
Algorithm 4 for multi-class; 7.2 Algorithm 2 for the heteroscedastic model; 7.5 Algorithm 6
for inducing points).

Given its auxiliary variables w, every augmented likelihood is a Gaussian site on f with
log-potential beta f - gamma f^2 / 2: the natural parameters of AnalyticVI with a draw of w
in place of E[w]. One sweep of the sampler is

1. w ~ p(w | y, f)                                        (``likelihood.sample_aux``);
2. f ~ p(f | w, y) = N(S (K^-1 m + beta), S), S = (K^-1 + G)^-1, G = diag(gamma)
   (``likelihood.sites``).

Step 2 is drawn by Matheron's rule with the pseudo-targets beta / gamma and noise 1 / gamma:
f = f0 + K s B^-1 (beta / s - s f0 - e), f0 ~ N(m, K), e ~ N(0, I), s = sqrt(gamma) and
B = I + s K s (Rasmussen & Williams eq. 3.26): one n x n Cholesky per sweep and no inverse of
gamma, K or B. With inducing points Z (the variational Gibbs sampler of thesis 7.5 with
alpha = 0) step 2 draws u from the Titsias-optimal q(u) for the site, whitened
v = Lmm^-1 u ~ N(P^-1 A (beta - G m), P^-1) with P = I + A G A^T, A = Lmm^-1 Kmn, then
f_i ~ p(f_i | u) independently: O(n M^2) per sweep, a sampler of that approximation rather
than of the exact posterior (with Z = X it is the exact sampler).

Several latent functions (multi-class, heteroscedastic) get one GP each. When they are
independent given w (logistic-softmax) they are drawn together after one draw of w; the
heteroscedastic likelihood sets ``gibbs_joint = False`` and the latents are then swept in
turn, w redrawn before each (f | g is collapsed over w, as the thesis' algorithm requires).

Optional hyperparameter moves (``GibbsSampling(hyper_every=k)``, full sampler): every k
sweeps one random-walk Metropolis step on the unconstrained values of all trainable
parameters (kernel, mean, likelihood), under their priors, with the whitened latent
v = L^-1 (f - m) held fixed (Murray & Adams 2010): the proposal moves f = m + L v with the
kernel, and the acceptance ratio is that of p(y | f) p(theta), w (integrated out) being
redrawn at the next sweep.

Chains run in parallel: ``vmap`` on accelerators, a compiled ``lax.map`` on CPU (see
``variational.map_latents`` for the batched-LAPACK deadlock that vmap triggers there).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp

from . import diagnostics, linalg
from .augmentation import Augmented
from .kernels import Kernel
from .likelihoods import Likelihood
from .means import Mean
from .params import Parameter, fixed, log_prior, parameters, partition_trainable
from .posterior import Predictive, site_alpha
from .sparse import SVGP, _inducing_parameter
from .training import _progress
from .validation import check_X
from .variational import map_latents


class GibbsSampling(eqx.Module):
    """Blocked Gibbs sampling of an :class:`MCGP`: ``n_chains`` chains, each ``burn_in``
    discarded sweeps then ``n_samples`` kept samples, one every ``thin`` sweeps.
    ``store_aux`` also keeps the auxiliary draws w (as the likelihood's ``sample_aux``
    returns them).

    ``hyper_every = k > 0`` adds a random-walk Metropolis move on the hyperparameters after
    every k-th sweep (see the module docstring), with proposal sd ``hyper_step`` on the
    unconstrained scale; every trainable parameter needs a prior (``params.with_prior``)
    or must be fixed (``params.fixed``)."""

    n_samples: int = eqx.field(static=True, default=1000)
    n_chains: int = eqx.field(static=True, default=4)
    burn_in: int = eqx.field(static=True, default=200)
    thin: int = eqx.field(static=True, default=1)
    store_aux: bool = eqx.field(static=True, default=False)
    hyper_every: int = eqx.field(static=True, default=0)
    hyper_step: float = eqx.field(static=True, default=0.05)

    def __post_init__(self):
        for name, low in (("n_samples", 1), ("n_chains", 1), ("burn_in", 0), ("thin", 1),
                          ("hyper_every", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or int(v) != v or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
            object.__setattr__(self, name, int(v))  # static: a plain int (6.0, np.int64(6))
        if not (math.isfinite(self.hyper_step) and self.hyper_step > 0):
            raise ValueError(f"hyper_step must be > 0, got {self.hyper_step!r}")


class MCGP(eqx.Module):
    """A GP model sampled by augmented Gibbs: f ~ GP(mean, kernel), y_i ~ likelihood(f(x_i))
    with an augmented likelihood (see ``augmentedgp.inference.AUGMENTED``).

    ``inducing`` (M, d) selects the sparse sampler of thesis 7.5 (u at Z, f_i ~ p(f_i | u)),
    for n beyond a few thousand. Hyperparameters are held at their values; fit them first
    (e.g. with an SVGP) or pass the values to sample at. Several latent functions work as in
    :class:`~augmentedgp.SVGP` (one kernel shared, or a list of C kernels).
    """

    kernel: Kernel
    likelihood: Likelihood
    mean: Mean
    inducing: Parameter | None
    latent_kernels: bool = eqx.field(static=True, default=False)
    latent_means: bool = eqx.field(static=True, default=False)

    def __init__(self, kernel, likelihood, *, mean=None, inducing=None):
        if isinstance(likelihood, Likelihood) and not isinstance(likelihood, Augmented):
            raise ValueError(f"{type(likelihood).__name__} has no augmentation, so it cannot be "
                             "Gibbs-sampled; augmented likelihoods: "
                             "augmentedgp.inference.AUGMENTED")
        SVGP._set_prior(self, kernel, likelihood, mean)
        self.inducing = None if inducing is None else fixed(_inducing_parameter(inducing))

    num_latent = SVGP.num_latent

    def _data(self, X, y):
        d = None if self.inducing is None else self.inducing.value.shape[1]
        X = check_X(X, d=d)
        return jnp.asarray(X), jnp.asarray(self.likelihood.targets(y, X.shape[0]))

    def _priors(self, anchor, X):
        """(stacked per-latent priors at X, whether they are per latent): kernel and mean
        evaluated once when shared. ``anchor`` is X (full) or Z (sparse)."""

        def prior(kernel, mean):
            if anchor is X:
                K = kernel(X)
                return FullPrior(K, linalg.cholesky(K), mean(X))
            Lmm, A = linalg.cholesky_project(kernel(anchor), kernel(anchor, X))
            resid = jnp.maximum(kernel.diag(X) - jnp.sum(A**2, 0), 0.0)
            return SparsePrior(Lmm, A, resid, mean(X))

        if self.num_latent > 1 and (self.latent_kernels or self.latent_means):
            return map_latents(prior, (self.kernel, self.mean),
                               (self.latent_kernels, self.latent_means)), True
        return prior(self.kernel, self.mean), False


class FullPrior(NamedTuple):
    K: jax.Array
    L: jax.Array
    m0: jax.Array


class SparsePrior(NamedTuple):
    Lmm: jax.Array
    A: jax.Array  # Lmm^-1 Kmn
    resid: jax.Array  # diag(Knn - Qnn)
    m0: jax.Array


def _draw_full(key, prior: FullPrior, beta, gamma):
    """(f, v) with f ~ N(S (K^-1 m + beta), S), S = (K^-1 + diag gamma)^-1, by Matheron's
    rule (module docstring), and v = L^-1 (f - m) its whitened value."""
    n = prior.m0.shape[0]
    e = jax.random.normal(key, (2, n), prior.K.dtype)
    f0 = prior.m0 + prior.L @ e[0]
    s = jnp.sqrt(gamma)  # B = I + s K s has eigenvalues >= 1: no jitter needed
    LB = jnp.linalg.cholesky(jnp.eye(n, dtype=prior.K.dtype) + s[:, None] * prior.K * s)
    f = f0 + prior.K @ site_alpha(s, LB, beta - gamma * f0 - s * e[1])
    return f, linalg.solve_lower(prior.L, f - prior.m0)


def _draw_sparse(key, prior: SparsePrior, beta, gamma):
    """(f, v): v ~ q*(v) for the site (Titsias-optimal, whitened), f_i ~ p(f_i | u)."""
    A = prior.A
    M, n = A.shape
    k1, k2 = jax.random.split(key)
    e1, e2 = jax.random.normal(k1, (M,), A.dtype), jax.random.normal(k2, (n,), A.dtype)
    R = jnp.linalg.cholesky(jnp.eye(M, dtype=A.dtype) + (A * gamma) @ A.T)  # >= I
    v = linalg.cho_solve(R, A @ (beta - gamma * prior.m0)) + linalg.solve_upper_t(R, e1)
    return prior.m0 + A.T @ v + jnp.sqrt(prior.resid) * e2, v


def _sweep(key, F, likelihood, y, priors, per_latent, draw):
    """One Gibbs sweep from F ((n,) or (n, C)): (F, V, aux)."""
    C = getattr(likelihood, "num_latent", 1)
    k_aux, k_f = jax.random.split(key)
    if C == 1:
        aux = likelihood.sample_aux(k_aux, y, F)
        return (*draw(k_f, priors, *likelihood.sites(y, aux)), aux)
    if getattr(likelihood, "gibbs_joint", True):
        aux = likelihood.sample_aux(k_aux, y, F)
        beta, gamma = likelihood.sites(y, aux)
        keys = jax.random.split(k_f, C)
        F, V = map_latents(draw, (keys, priors, beta.T, gamma.T), (True, per_latent, True, True))
        return F.T, V.T, aux
    V = []
    for c in range(C):  # systematic scan: w | F, then latent c | w (and the other latents)
        k_aux, k_c, k_f = jax.random.split(k_f, 3)
        aux = likelihood.sample_aux(k_aux, y, F)
        beta, gamma = likelihood.sites(y, aux)
        prior = jax.tree_util.tree_map(lambda x, c=c: x[c], priors) if per_latent else priors
        f, v = draw(k_c, prior, beta[:, c], gamma[:, c])
        F = F.at[:, c].set(f)
        V.append(v)
    return F, jnp.stack(V, -1), aux


def _map_chains(fn, keys):
    if jax.default_backend() == "cpu":
        return lax.map(fn, keys)
    return jax.vmap(fn)(keys)


def _log_target(model, y, F):
    """log p(y | F) + log p(theta) + log |d theta / d raw| (the prior is on the constrained
    values; the random walk is on the raw ones)."""
    jac = jnp.zeros(())
    for p in parameters(model):
        if p.trainable:
            tangent = jax.jvp(p.transform.forward, (p.raw,), (jnp.ones_like(p.raw),))[1]
            jac = jac + jnp.sum(jnp.log(jnp.abs(tangent)))
    return jnp.sum(model.likelihood.log_prob(y, F)) + log_prior(model) + jac


def _unwhiten(priors: FullPrior, V, per_latent):
    """F = m + L v for each latent."""
    if V.ndim == 1:
        return priors.m0 + priors.L @ V
    if per_latent:
        return priors.m0.T + jnp.einsum("cij,jc->ic", priors.L, V)
    return priors.m0[:, None] + priors.L @ V


_PROGRESS = {"done": 0, "update": None}  # the progress bar of the running `sample`
_TICK = 10  # sweeps between progress reports


def _tick():
    _PROGRESS["done"] += _TICK
    if _PROGRESS["update"] is not None:
        _PROGRESS["update"](_PROGRESS["done"])


@eqx.filter_jit
def _run(model: MCGP, X, y, key, settings: GibbsSampling, verbose: bool = False):
    sparse = model.inducing is not None
    anchor = model.inducing.value if sparse else X
    draw = _draw_sparse if sparse else _draw_full
    C, n = model.num_latent, X.shape[0]
    hyper, static = partition_trainable(model)
    priors_of = lambda h: eqx.combine(h, static)._priors(anchor, X)[0]
    priors, per_latent = model._priors(anchor, X)

    def sweep(k, state):
        F, _, h, pri = state
        F, V, aux = _sweep(k, F, eqx.combine(h, static).likelihood, y, pri, per_latent, draw)
        return (F, V, h, pri), aux

    def move(k, state):  # random-walk Metropolis on the hyperparameters, v fixed
        F, V, h, pri = state
        flat, unravel = ravel_pytree(h)
        k_prop, k_acc = jax.random.split(k)
        h_new = unravel(flat + settings.hyper_step * jax.random.normal(k_prop, flat.shape,
                                                                       flat.dtype))
        pri_new = priors_of(h_new)
        F_new = _unwhiten(pri_new, V, per_latent)
        log_ratio = (_log_target(eqx.combine(h_new, static), y, F_new)
                     - _log_target(eqx.combine(h, static), y, F))
        accept = jnp.log(jax.random.uniform(k_acc, dtype=flat.dtype)) < log_ratio
        return jax.tree_util.tree_map(lambda a, b: jnp.where(accept, a, b),
                                      (F_new, V, h_new, pri_new), state)

    def step(k, state, i):
        """One sweep, and a hyperparameter move after every hyper_every-th sweep i."""
        if verbose:  # a host callback every _TICK sweeps drives the progress bar
            lax.cond(i % _TICK == _TICK - 1, lambda: jax.debug.callback(_tick), lambda: None)
        state, aux = sweep(jax.random.fold_in(k, 0), state)
        if settings.hyper_every:
            state = lax.cond((i + 1) % settings.hyper_every == 0, move, lambda k, s: s,
                             jax.random.fold_in(k, 1), state)
        return state, aux

    def chain(key):
        k_init, k_burn, k_keep = jax.random.split(key, 3)
        zeros = jnp.zeros(n, X.dtype)
        if C == 1:  # a prior draw: no sites
            F, V = draw(k_init, priors, zeros, zeros)
        else:
            F, V = map_latents(lambda k, p: draw(k, p, zeros, zeros),
                               (jax.random.split(k_init, C), priors), (True, per_latent))
            F, V = F.T, V.T
        state = lax.fori_loop(0, settings.burn_in, lambda i, s: step(
            jax.random.fold_in(k_burn, i), s, i)[0], (F, V, hyper, priors))

        def keep(state, i):
            k = jax.random.fold_in(k_keep, i)
            j0 = settings.burn_in + i * settings.thin
            if settings.thin > 1:
                state = lax.fori_loop(1, settings.thin, lambda j, s: step(
                    jax.random.fold_in(k, j), s, j0 + j - 1)[0], state)
            state, aux = step(jax.random.fold_in(k, 0), state, j0 + settings.thin - 1)
            F, V, h, _ = state
            return state, (F, V, h if settings.hyper_every else None,
                           aux if settings.store_aux else None)

        return lax.scan(keep, state, jnp.arange(settings.n_samples))[1]

    return _map_chains(chain, jax.random.split(key, settings.n_chains))


def sample(model: MCGP, X, y, inference: GibbsSampling | None = None, *, key=None,
           verbose: bool = False):
    """Draw posterior samples of the latent function(s) at X by augmented Gibbs sampling.

    Returns an :class:`MCPosterior` with samples ``f`` of shape (n_chains, n_samples, n)
    (or (..., n, C)), predictions that average over them, and convergence diagnostics.
    ``key`` is a ``jax.random`` key (default ``PRNGKey(0)``); ``verbose`` shows a
    progress bar over all sweeps of all chains."""
    if not isinstance(model, MCGP):
        raise ValueError(f"sample needs an MCGP model, got {type(model).__name__}")
    inference = GibbsSampling() if inference is None else inference
    if not isinstance(inference, GibbsSampling):
        raise ValueError(f"sample needs a GibbsSampling inference, got {inference!r}")
    if inference.hyper_every:
        if model.inducing is not None:
            raise ValueError("hyperparameter moves need the full sampler (MCGP without "
                             "inducing points)")
        missing = [p for p in parameters(model) if p.trainable and p.prior is None]
        if missing:
            raise ValueError(f"hyperparameter moves need a prior on every trainable parameter "
                             f"({len(missing)} have none): give one with params.with_prior "
                             "or fix the parameter with params.fixed")
    X, y = model._data(X, y)
    key = jax.random.PRNGKey(0) if key is None else key
    s = inference
    update = _progress(verbose, s.n_chains * (s.burn_in + s.n_samples * s.thin), "Gibbs sampling")
    _PROGRESS.update(done=0, update=update if verbose else None)
    try:
        F, V, hyper, aux = _run(model, X, y, key, inference, bool(verbose))
        jax.block_until_ready(F)
        jax.effects_barrier()
    finally:
        _PROGRESS["update"] = None
        update(None)
    if not bool(jnp.all(jnp.isfinite(F))):
        raise FloatingPointError("the Gibbs sampler produced non-finite values; check the "
                                 "kernel and likelihood parameters and the scale of X and y")
    return MCPosterior(model, X, y, F, V, hyper, aux)


class MCPosterior(Predictive):
    """Samples from an :class:`MCGP` posterior and predictions averaged over them.

    ``f``: samples of the latent values at the training inputs, (n_chains, n_samples, n)
    or (n_chains, n_samples, n, C); ``v``: the whitened values they are conditioned on
    (L^-1 (f - m) at X, or Lmm^-1 u at the inducing points); ``aux``: the auxiliary draws
    (with ``GibbsSampling(store_aux=True)``); ``hyper``: the trainable parameters' raw
    values per sample (with ``hyper_every``; ``models`` holds them as one MCGP whose
    parameters lead with (n_chains, n_samples)), and predictions then average over them."""

    model: MCGP
    X: jax.Array
    y: jax.Array
    f: jax.Array
    v: jax.Array
    hyper: object = None
    aux: object = None

    @property
    def models(self) -> MCGP:
        """The model with every trainable parameter's samples, (n_chains, n_samples, ...)."""
        if self.hyper is None:
            raise ValueError("no hyperparameter samples: use GibbsSampling(hyper_every=k)")
        return eqx.combine(self.hyper, partition_trainable(self.model)[1])

    @property
    def likelihood(self):
        return self.model.likelihood

    @property
    def kernel(self):
        return self.model.kernel

    @property
    def n_chains(self) -> int:
        return int(self.f.shape[0])

    @property
    def n_samples(self) -> int:
        return int(self.f.shape[1])

    def _check_new(self, Xnew):
        return jnp.asarray(check_X(Xnew, "Xnew", d=self.X.shape[1]))

    def _conditionals(self, Xnew, full_cov=False):
        """Per-sample means (S, n*[, C]) and the shared variance (n*[, C]) -- or covariance
        ((C,) n*, n*) -- of f(Xnew) given each sample (S = n_chains * n_samples)."""
        return _conditionals(self, self._check_new(Xnew), full_cov)

    def predict_f(self, Xnew, full_cov: bool = False):
        """Posterior mean and variance (or covariance) of f(Xnew): the moments of the
        mixture over samples of the Gaussian conditionals p(f(Xnew) | sample)."""
        means, var = self._conditionals(Xnew, full_cov)
        mean = jnp.mean(means, 0)
        if not full_cov:
            var = jnp.mean(var, 0) if self.hyper is not None else var  # per-sample variances
            return mean, var + jnp.var(means, 0)
        d = means - mean
        if d.ndim == 2:
            return mean, var + d.T @ d / d.shape[0]
        return mean, var + jnp.einsum("sic,sjc->cij", d, d) / d.shape[0]

    def predict_y(self, Xnew):
        """Mean and variance of y at Xnew, mixed over the samples (multi-class: the class
        probabilities p and p (1 - p), as for the other posteriors)."""
        if hasattr(self.likelihood, "classes"):  # class probabilities p and p (1 - p)
            p = self.predict_proba(Xnew)
            return p, p * (1.0 - p)
        means, var = self._conditionals(Xnew)
        ey, vy = self.likelihood.predict_y(means, var)
        mean = jnp.mean(ey, 0)
        return mean, jnp.mean(vy + ey**2, 0) - mean**2

    def predict_proba(self, Xnew):
        """p(y = +1 | Xnew, data) (n*,), or p(y = k | Xnew, data) (n*, C): the average over
        samples of p(y | f(Xnew)) integrated over p(f(Xnew) | sample) (by the likelihood's
        quadrature for binary likelihoods; by one draw per sample for multi-class ones)."""
        if not hasattr(self.likelihood, "predict_proba"):
            raise TypeError("predict_proba needs a classification likelihood (binary or "
                            f"multi-class), not {self.likelihood}")
        means, var = self._conditionals(Xnew)
        if means.ndim == 2:
            return jnp.mean(self.likelihood.predict_proba(means, var), 0)
        return _class_proba(self.likelihood, means, var)

    def predict_log_density(self, Xnew, ynew):
        """log p(y* | x*, data) per test point: log of the sample average of p(y* | sample)."""
        Xnew = self._check_new(Xnew)
        ynew = jnp.asarray(self.likelihood.targets(ynew, Xnew.shape[0], "ynew"))
        if hasattr(self.likelihood, "classes"):
            proba = self.predict_proba(Xnew)
            return jnp.log(jnp.take_along_axis(proba, ynew[:, None], 1)[:, 0])
        means, var = self._conditionals(Xnew)
        logp = self.likelihood.predictive_log_prob(ynew, means, var)
        return logsumexp(logp, 0) - math.log(logp.shape[0])

    # --- diagnostics ---------------------------------------------------------------------

    def rhat(self) -> np.ndarray:
        """Rank-normalised split R-hat of f at each training input (n,) or (n, C)."""
        return diagnostics.split_rhat(self.f)

    def ess(self) -> np.ndarray:
        """Bulk effective sample size of f at each training input (n,) or (n, C)."""
        return diagnostics.ess_bulk(self.f)

    def summary(self) -> dict:
        """Mean, sd, R-hat, bulk and tail ESS and lag-1 autocorrelation of f (per input)."""
        return diagnostics.summary(self.f)


@eqx.filter_jit
def _conditionals(post: MCPosterior, Xnew, full_cov):
    S = post.f.shape[0] * post.f.shape[1]
    V = post.v.reshape(S, *post.v.shape[2:])
    anchor = post.X if post.model.inducing is None else post.model.inducing.value
    if post.hyper is None:
        return _conditionals_at(post.model, anchor, Xnew, V, full_cov)
    # hyperparameters per sample: each sample's conditional under its own; variances per
    # sample (S, n*[, C]), covariances averaged over the samples
    hyper = jax.tree_util.tree_map(lambda x: x.reshape(S, *x.shape[2:]), post.hyper)
    static = partition_trainable(post.model)[1]

    def one(a):
        mean, var = _conditionals_at(eqx.combine(a[0], static), anchor, Xnew, a[1][None],
                                     full_cov)
        return mean[0], var

    if not full_cov:
        return lax.map(one, (hyper, V))
    shape = jax.eval_shape(one, jax.tree_util.tree_map(lambda x: x[0], (hyper, V)))[1]

    def add(total, a):
        mean, var = one(a)
        return total + var, mean

    total, means = lax.scan(add, jnp.zeros(shape.shape, shape.dtype), (hyper, V))
    return means, total / S


def _conditionals_at(model, anchor, Xnew, V, full_cov):

    def cond(kernel, mean):
        L = linalg.cholesky(kernel(anchor))
        As = linalg.solve_lower(L, kernel(anchor, Xnew))
        if full_cov:
            return As, kernel(Xnew) - As.T @ As, mean(Xnew)
        return As, jnp.maximum(kernel.diag(Xnew) - jnp.sum(As**2, 0), 0.0), mean(Xnew)

    if model.num_latent == 1:
        As, var, m0 = cond(model.kernel, model.mean)
        return m0 + V @ As, var
    if model.latent_kernels or model.latent_means:
        As, var, m0 = map_latents(cond, (model.kernel, model.mean),
                                  (model.latent_kernels, model.latent_means))
        means = m0.T + jnp.einsum("smc,cmj->sjc", V, As)
    else:
        As, var, m0 = cond(model.kernel, model.mean)
        means = m0[:, None] + jnp.einsum("smc,mj->sjc", V, As)
        var = jnp.broadcast_to(var, (model.num_latent, *var.shape))
    return means, var if full_cov else var.T


@eqx.filter_jit
def _class_proba(likelihood, means, var):
    """Sample average of p(y = k | f*), f* ~ N(mean_s, var): one draw per sample, with a
    fixed key (deterministic predictions)."""
    eps = jax.random.normal(jax.random.PRNGKey(0), means.shape, means.dtype)
    F = means + jnp.sqrt(var) * eps
    codes = jnp.arange(likelihood.num_latent)
    logp = jax.vmap(lambda k: likelihood.log_prob(jnp.full(F.shape[:-1], k), F), out_axes=-1)(
        codes)
    return jnp.mean(jnp.exp(logp), 0)


__all__ = ["MCGP", "GibbsSampling", "MCPosterior", "sample"]
