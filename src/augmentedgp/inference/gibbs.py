"""Augmented blocked Gibbs sampling ([Galy-Fajou2020, Algorithm 2]; for multi-class
[Galy-Fajou2019, Sec. 4.3] and [Galy-Fajou2022, Sec. 7.4.2, Algorithm 4]; for the
heteroscedastic models [Galy-Fajou2022, Sec. 7.2.1, Algorithm 2, and Sec. 7.2.2]; with
inducing points [Galy-Fajou2022, Sec. 7.5, Algorithm 6]).

Given its auxiliary variables w, every augmented likelihood is a Gaussian site on f with
log-potential beta f - gamma f^2 / 2: the natural parameters of AnalyticVI with a draw of w
in place of E[w]. One sweep of the sampler is

1. w ~ p(w | y, f)                                        (``likelihood.sample_aux``);
2. f ~ p(f | w, y) = N(S (K^-1 m + beta), S), S = (K^-1 + G)^-1, G = diag(gamma)
   (``likelihood.sites``).

Step 2 is drawn by Matheron's rule with the pseudo-targets beta / gamma and noise 1 / gamma:
f = f0 + K s B^-1 (beta / s - s f0 - e), f0 ~ N(m, K), e ~ N(0, I), s = sqrt(gamma) and
B = I + s K s (Rasmussen & Williams eq. 3.26): one n x n Cholesky per sweep and no inverse of
gamma, K or B. With inducing points Z (the variational Gibbs sampler of [Galy-Fajou2022,
Sec. 7.5] with alpha = 0) step 2 draws u from the Titsias-optimal q(u) for the site, whitened
v = Lmm^-1 u ~ N(P^-1 A (beta - G m), P^-1) with P = I + A G A^T, A = Lmm^-1 Kmn, then
f_i ~ p(f_i | u) independently: O(n M^2) per sweep, a sampler of that approximation rather
than of the exact posterior (with Z = X it is the exact sampler).

Several latent functions (multi-class, heteroscedastic) get one GP each. When they are
independent given w (logistic-softmax) they are drawn together after one draw of w; the
heteroscedastic likelihoods set ``gibbs_joint = False`` and the latents are then swept in
turn, w redrawn before each (f | g is collapsed over w, as [Galy-Fajou2022, Sec. 7.2.1,
Algorithm 2] requires).

Optional hyperparameter moves (``GibbsSampling(hyper_every=k)``, full sampler): every k
sweeps one random-walk Metropolis step on the unconstrained values of all trainable
parameters (kernel, mean, likelihood), under their priors, with the whitened latent
v = L^-1 (f - m) held fixed ([Murray2010]): the proposal moves f = m + L v with the
kernel, and the acceptance ratio is that of p(y | f) p(theta), w (integrated out) being
redrawn at the next sweep.

Chains run side by side (``vmap``): the products with the shared K and L become one
matrix-matrix product for all chains (a sweep at n ~ 500 is bound by its passes over
n x n matrices as much as by the factorisation) and the auxiliary draws one vectorised
call. Each chain's factorisation and triangular solves (``_per_chain``) stay single-matrix
LAPACK calls on CPU, one chain after the other (batched ones can deadlock XLA's intra-op
pool, see ``variational.map_latents``), and are batched on accelerators. With
hyperparameter moves the chains' priors differ, so on CPU the chains then run one after
the other (``lax.map``).
"""

from __future__ import annotations

import functools
import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap
from jax.flatten_util import ravel_pytree
from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core import linalg
from augmentedgp.core.loop import progress
from augmentedgp.core.params import log_prior, parameters, partition_trainable
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import (
    MAX_VALUES,
    check_int,
    check_key,
    check_positive,
    check_real,
)
from augmentedgp.models.mcgp import MCGP, FullPrior, MCPosterior, SparsePrior
from augmentedgp.variational.families import map_latents


class GibbsSampling(eqx.Module):
    """Blocked Gibbs sampling of an :class:`MCGP`: ``n_chains`` chains, each ``burn_in``
    discarded sweeps then ``n_samples`` kept samples, one every ``thin`` sweeps.
    ``store_aux`` also keeps the auxiliary draws w (as the likelihood's ``sample_aux``
    returns them).

    ``hyper_every = k > 0`` adds a random-walk Metropolis move on the hyperparameters after
    every k-th sweep (see the module docstring), with proposal sd ``hyper_step`` on the
    unconstrained scale; every trainable parameter needs a prior (``params.with_prior``)
    or must be fixed (``params.fixed``).

    ``overrelax = rho`` in (-1, 1) replaces the draw of f | w by the overrelaxed move
    mu + rho (f - mu) + sqrt(1 - rho^2) (f* - mu) ([Adler1981]): still exact
    (the move leaves p(f | w, y) invariant), with anti-correlated successive draws for
    rho < 0 (more effective samples per sweep, see ``benchmarks/gibbs.py``). Full sampler
    only, and not for likelihoods whose latents are swept in turn (heteroscedastic)."""

    n_samples: int = eqx.field(static=True, default=1000)  # each count at most MAX_COUNT
    n_chains: int = eqx.field(static=True, default=4)
    burn_in: int = eqx.field(static=True, default=200)
    thin: int = eqx.field(static=True, default=1)
    store_aux: bool = eqx.field(static=True, default=False)
    hyper_every: int = eqx.field(static=True, default=0)
    hyper_step: float = eqx.field(static=True, default=0.05)
    overrelax: float = eqx.field(static=True, default=0.0)

    def __post_init__(self):
        for name, low in (("n_samples", 1), ("n_chains", 1), ("burn_in", 0), ("thin", 1),
                          ("hyper_every", 0)):
            # static: a plain int (6.0, np.int64(6))
            value = check_int(getattr(self, name), name, low)
            object.__setattr__(self, name, value)
        if self.n_samples * self.n_chains > MAX_VALUES:
            raise ValueError(f"n_samples * n_chains = {self.n_samples * self.n_chains} draws "
                             f"exceed {MAX_VALUES} values (they are kept in memory)")
        if not isinstance(self.store_aux, bool | np.bool_):
            raise TypeError(f"store_aux must be True or False, got {self.store_aux!r}")
        object.__setattr__(self, "store_aux", bool(self.store_aux))
        object.__setattr__(self, "hyper_step", check_positive(self.hyper_step, "hyper_step"))
        object.__setattr__(self, "overrelax", check_real(
            self.overrelax, "overrelax", low=-1.0, high=1.0, open_low=True, open_high=True))


def _per_chain(fn):
    """``fn`` (the LAPACK part of a draw: a factorisation and its triangular solves) as a
    ``custom_vmap``: vmapped over chains on CPU it runs one chain after the other
    (``lax.map``), so that no batched LAPACK kernel is made (see
    ``variational.map_latents`` for the deadlock those can cause); elsewhere it is batched.
    The draw's other steps (the products with the shared K and L, the auxiliary draws)
    stay batched over the chains: one matrix-matrix product where each chain would read
    the n x n matrix on its own."""
    wrapped = custom_vmap(fn)

    @wrapped.def_vmap
    def _(axis_size, in_batched, *args):
        if jax.default_backend() == "cpu":  # the batched arguments mapped, the others shared

            def one(xs):
                it = iter(xs)
                return fn(*(next(it) if b else a for a, b in zip(args, in_batched, strict=True)))

            out = lax.map(one, tuple(a for a, b in zip(args, in_batched, strict=True) if b))
        else:  # the plain function: batched kernels
            out = jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*args)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return wrapped


@_per_chain
def _site_solve(K, s, nu):
    """alpha = S B^-1 (nu / s), B = I + S K S, for each row of nu (k, n) (``site_alpha``;
    sites with s = 0 have nu = 0). B >= I: no jitter, and LAPACK's potrf reads one
    triangle, so B is not symmetrised (a pass over n x n)."""
    n = s.shape[0]
    LB = lax.linalg.cholesky(jnp.eye(n, dtype=K.dtype) + s[:, None] * K * s,
                             symmetrize_input=False)
    r = jnp.where(s > 0, nu / jnp.where(s > 0, s, 1.0), 0.0)
    return s * linalg.cho_solve(LB, r.T).T


def _draw_full(key, prior: FullPrior, beta, gamma, f=None, rho=0.0):
    """(f, v) with f ~ N(mu, S), S = (K^-1 + diag gamma)^-1, mu = S (K^-1 m + beta), by
    Matheron's rule (module docstring), and v = L^-1 (f - m) its whitened value.

    With ``rho`` != 0 and the current value ``f``, the overrelaxed move
    mu + rho (f - mu) + sqrt(1 - rho^2) (f* - mu), f* the draw (the overrelaxation of a
    Gaussian conditional, [Adler1981]; [Neal1998]): it leaves N(mu, S) invariant and is
    reversible, so the chain keeps its stationary law; rho < 0 makes successive draws
    anti-correlated. mu is the same rule without the noise: one more right-hand side for
    the same factor."""
    n = prior.m0.shape[0]
    e = jax.random.normal(key, (2, n), prior.K.dtype)
    f0 = prior.m0 + prior.L @ e[0]
    s = jnp.sqrt(gamma)
    if f is None or rho == 0.0:
        f = f0 + prior.K @ _site_solve(prior.K, s, beta - gamma * f0 - s * e[1])
    else:
        nu = jnp.stack([beta - gamma * f0 - s * e[1], beta - gamma * prior.m0])
        draw, mean = (prior.K @ _site_solve(prior.K, s, nu).T).T
        draw, mean = f0 + draw, prior.m0 + mean
        f = mean + rho * (f - mean) + math.sqrt(1.0 - rho**2) * (draw - mean)
    return f, linalg.solve_lower(prior.L, f - prior.m0)


@_per_chain
def _capacitance_solve(P, b, e):
    """P^-1 b + R^-T e, R = chol(P): a draw of N(P^-1 b, P^-1) for e ~ N(0, I)."""
    R = jnp.linalg.cholesky(P)
    return linalg.cho_solve(R, b) + linalg.solve_upper_t(R, e)


def _draw_sparse(key, prior: SparsePrior, beta, gamma, f=None):
    """(f, v): v ~ q*(v) for the site (Titsias-optimal, whitened), f_i ~ p(f_i | u) (the
    current f is not used)."""
    A = prior.A
    M, n = A.shape
    k1, k2 = jax.random.split(key)
    e1, e2 = jax.random.normal(k1, (M,), A.dtype), jax.random.normal(k2, (n,), A.dtype)
    P = jnp.eye(M, dtype=A.dtype) + (A * gamma) @ A.T  # >= I
    v = _capacitance_solve(P, A @ (beta - gamma * prior.m0), e1)
    return prior.m0 + A.T @ v + jnp.sqrt(prior.resid) * e2, v


def _sweep(key, F, likelihood, y, priors, per_latent, draw):
    """One Gibbs sweep from F ((n,) or (n, C)): (F, V, aux)."""
    C = getattr(likelihood, "num_latent", 1)
    k_aux, k_f = jax.random.split(key)
    if C == 1:
        aux = likelihood.sample_aux(k_aux, y, F)
        return (*draw(k_f, priors, *likelihood.sites(y, aux), F), aux)
    if getattr(likelihood, "gibbs_joint", True):
        aux = likelihood.sample_aux(k_aux, y, F)
        beta, gamma = likelihood.sites(y, aux)
        keys = jax.random.split(k_f, C)
        F, V = map_latents(draw, (keys, priors, beta.T, gamma.T, F.T),
                           (True, per_latent, True, True, True))
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


def _map_chains(fn, keys, shared_prior):
    """fn over the chains' keys, side by side (``vmap``), except on CPU with hyperparameter
    moves: the chains' priors then differ and their factorisations would be batched LAPACK
    calls (see ``_per_chain``), so the chains run one after the other (``lax.map``)."""
    if shared_prior or jax.default_backend() != "cpu":
        return jax.vmap(fn)(keys)
    return lax.map(fn, keys)


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


def _tick(chains):
    """Progress of ``_TICK`` sweeps of each chain in ``chains`` (one value per chain: a
    scalar when the chains run one after the other, an array when side by side)."""
    _PROGRESS["done"] += _TICK * np.size(chains)
    if _PROGRESS["update"] is not None:
        _PROGRESS["update"](_PROGRESS["done"])


@eqx.filter_jit
def _run(model: MCGP, X, y, key, settings: GibbsSampling, verbose: bool = False):
    sparse = model.inducing is not None
    anchor = model.inducing.value if sparse else X
    draw = _draw_sparse if sparse else functools.partial(_draw_full, rho=settings.overrelax)
    C, n = model.num_latent, X.shape[0]
    hyper, static = partition_trainable(model)
    priors_of = lambda h: eqx.combine(h, static).priors(anchor, X)[0]
    priors, per_latent = model.priors(anchor, X)

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
            lax.cond(i % _TICK == _TICK - 1,
                     lambda: jax.debug.callback(_tick, jnp.isfinite(state[0].ravel()[0])),
                     lambda: None)
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

    return _map_chains(chain, jax.random.split(key, settings.n_chains),
                       not settings.hyper_every)


@limits
def sample(model: MCGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
           inference: GibbsSampling | None = None, *, key: PRNGKeyArray | None = None,
           verbose: bool = False) -> MCPosterior:
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
    if inference.overrelax and (model.inducing is not None
                                or not getattr(model.likelihood, "gibbs_joint", True)):
        raise ValueError("overrelax needs the full sampler (MCGP without inducing points) "
                         "and a likelihood whose latents are drawn together given w")
    if inference.hyper_every:
        if model.inducing is not None:
            raise ValueError("hyperparameter moves need the full sampler (MCGP without "
                             "inducing points)")
        missing = [p for p in parameters(model) if p.trainable and p.prior is None]
        if missing:
            raise ValueError(f"hyperparameter moves need a prior on every trainable parameter "
                             f"({len(missing)} have none): give one with params.with_prior "
                             "or fix the parameter with params.fixed")
    key = check_key(key, "key", allow_none=True)
    if not isinstance(verbose, bool | np.bool_ | numbers.Integral):
        raise TypeError(f"verbose must be a bool, got {type(verbose).__name__} {verbose!r}")
    X, y = model.validate_data(X, y)
    size = inference.n_chains * inference.n_samples * X.shape[0] * model.num_latent
    if size > MAX_VALUES:
        raise ValueError(f"inference: n_chains * n_samples * n * latents = {size} values of f "
                         f"exceed {MAX_VALUES} (8 bytes each, kept in memory, twice with the "
                         "whitened draws): lower n_samples or n_chains, or thin the chains")
    key = jax.random.PRNGKey(0) if key is None else key
    s = inference
    update = progress(verbose, s.n_chains * (s.burn_in + s.n_samples * s.thin), "Gibbs sampling")
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


__all__ = ["GibbsSampling", "sample"]
