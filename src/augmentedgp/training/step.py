"""One iteration of variational training for SVGP / VGP, written once and used by
:func:`augmentedgp.fit` and by the distributed executors (``training.distributed``).

An iteration from a :class:`VIState` is

1. the rows of this step (``core.loop.minibatch``): the full batch, or the next minibatch
   of a shuffled epoch (a new permutation when an epoch starts);
2. the :class:`Statistics` of those rows (:func:`statistics`): the objective to minimise,
   its gradient in the hyperparameters, and the natural-gradient statistics
   s1 = sum_i beta_i a_i, S2 = sum_i gamma_i a_i a_i^T with a_i = Lmm^-1 k_Z(x_i) -- sums
   over points, so partitions of the rows can compute them where they live and add up;
3. the update (:func:`update`): an optimizer step on the hyperparameters (every
   ``hyper_every`` iterations) and the natural step on q(u) from (s1, S2), both from the
   same state (Hensman et al. 2013; Wenzel et al. 2019, Algorithm 1).

:func:`vi_step` is the three on one machine; the executors run step 2 as a map-reduce and
add the prior part of the objective (KL - log prior) once on the driver
(:func:`prior_objective`). With ``natural=False`` q(u) is a plain parameter of the
optimizer (:func:`joint_step`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from augmentedgp.core.loop import Minibatches, minibatch
from augmentedgp.core.params import log_prior, partition_trainable
from augmentedgp.core.validation import check_int
from augmentedgp.variational.families import CholeskyQ, NaturalQ, map_latents
from augmentedgp.variational.natgrad import direction_size, site_statistics, statistics_step


class VIState(NamedTuple):
    """The carry of variational training (also what a checkpoint stores)."""

    hyper: Any  # trainable part of the model, q(u) left out (None)
    q: Any  # trainable part of q(u)
    opt_state: Any  # the optimizer's state (of hyper, or of (hyper, q) without natural steps)
    schedule: Any  # the step-size schedule's state
    t: jax.Array  # iteration count
    batches: Minibatches  # the minibatch stream (its key also seeds Monte Carlo expectations)


class VISetup(NamedTuple):
    """What stays fixed during a fit."""

    static: Any  # the non-trainable part of the model
    inference: Any  # a VariationalInference
    optimizer: Any  # an optax GradientTransformation
    hyper_every: int  # optimizer steps on the hyperparameters every k iterations


class Statistics(NamedTuple):
    """What the update needs from the rows of one iteration (sums over points)."""

    value: jax.Array  # the objective's part from these rows
    grad: Any  # its gradient in the hyperparameters (zeros when not asked for)
    s1: jax.Array  # sum_i w_i beta_i a_i                        (M,) or (C, M)
    S2: jax.Array  # sum_i w_i gamma_i a_i a_i^T                 (M, M) or (C, M, M)


def check_step_settings(inference, max_iter, hyper_every) -> tuple[int, int]:
    """(max_iter, hyper_every) as ints, checked against each other and the inference."""
    max_iter = check_int(max_iter, "max_iter")
    hyper_every = check_int(hyper_every, "hyper_every")
    if hyper_every > 1 and not inference.natural:
        raise ValueError("hyper_every > 1 needs natural-gradient steps on q(u) (natural=True)")
    return max_iter, hyper_every


def with_q(hyper, q):
    """The trainable tree with q(u) put back."""
    return eqx.tree_at(lambda m: m.q, hyper, q, is_leaf=lambda x: x is None)


def model_at(hyper, q, static):
    return eqx.combine(with_q(hyper, q), static)


def step_form(model, natural: bool):
    """``model`` with q(u) in the parameterisation natural steps are cheapest in. A
    whitened Cholesky q(v) becomes the same distribution in whitened natural parameters
    (theta1, P = Sv^-1): the step mixes exactly those ([Hensman2013]), so no conversion
    (a triangular inverse, a product and a factorisation) is paid per step. Natural steps
    are the same in every parameterisation, and q(v) stays what the hyperparameter steps
    hold fixed, so the fit is the same. Other families are kept."""
    q = model.q
    if not (natural and isinstance(q, CholeskyQ) and q.whiten):
        return model

    M = q.num_inducing
    convert = lambda q, template: template.from_whitened_natural(*q.whitened_natural(None), None)
    template = NaturalQ.prior(jnp.eye(M, dtype=q.mean.value.dtype), True)
    new = (map_latents(convert, (q, template), (True, False)) if model.num_latent > 1
           else convert(q, template))
    return eqx.tree_at(lambda m: m.q, model, new)


def user_form(model, template):
    """``model`` with q(u) back in the parameterisation of ``template`` (the q it had before
    :func:`step_form`)."""
    q = model.q
    if type(q) is type(template):
        return model
    back = lambda q, template: template.from_whitened_natural(*q.whitened_natural(None), None)
    new = (map_latents(back, (q, template), (True, True)) if model.num_latent > 1
           else back(q, template))
    return eqx.tree_at(lambda m: m.q, model, new)


def init_state(model, inference, optimizer, hyper_every: int, key, n: int
               ) -> tuple[VIState, VISetup]:
    """The initial state of ``model`` (its q(u) in :func:`step_form`) for ``inference`` with
    ``optimizer`` on the hyperparameters, and the fixed :class:`VISetup`. The model of a
    state is ``user_form(model_at(state.hyper, state.q, setup.static), model.q)``."""
    model = step_form(model, inference.natural)
    params, static = partition_trainable(model)
    setup = VISetup(static, inference, optimizer, hyper_every)
    hyper, q = eqx.tree_at(lambda m: m.q, params, None), params.q
    natural = setup.inference.natural
    opt_state = setup.optimizer.init(hyper if natural else (hyper, q))
    schedule = setup.inference.step_size.init(direction_size(q, model.num_latent))
    state = VIState(hyper, q, opt_state, schedule, jnp.asarray(0), Minibatches.start(key, n))
    return state, setup


def statistics(hyper, q, static, inference, X, y, w, key, need_grad: bool, scale=1.0,
               with_prior: bool = False):
    """(:class:`Statistics`, (Kmm, Lmm) of the projection) of the rows (X, y) with weights w
    (None: all 1; 0 marks padding) at ``model_at(hyper, q, static)``: the objective
    -scale * sum_i w_i E_q[log p(y_i | f_i)] (plus KL - log prior when ``with_prior``: the
    whole objective of a single machine, the KL from the projection's factorisation).
    ``key`` seeds Monte Carlo expectations."""
    model = model_at(hyper, q, static)
    multi = model.num_latent > 1

    def objective(h):
        m = model_at(h, q, static)
        expectations = weighted(lambda yy, mean, var: inference.expectations(
            m.likelihood, yy, mean, var, key), w)
        if with_prior:
            elbo, p = m.elbo_projection(X, y, scale, expectations)
            return -(elbo + log_prior(m)), p
        p = m.project(X)
        return -scale * jnp.sum(expectations(y, p.mean, p.var)), p

    if need_grad:
        (value, p), grad = jax.value_and_grad(objective, has_aux=True)(hyper)
    else:
        (value, p), grad = objective(hyper), jax.tree_util.tree_map(jnp.zeros_like, hyper)
    p = jax.tree_util.tree_map(lax.stop_gradient, p)
    beta, gamma = inference.sites(model.likelihood, y, p.mean, p.var, p.prior_mean, key)
    if w is not None:
        wl = w[:, None] if multi else w
        beta, gamma = wl * beta, wl * gamma
    return Statistics(value, grad, *site_statistics(p.A, beta, gamma, multi)), (p.Kmm, p.Lmm)


def weighted(expectations, w):
    """``expectations(y, mean, var)`` times the row weights w (None: unweighted)."""
    if w is None:
        return expectations
    return lambda y, mean, var: w * expectations(y, mean, var)


def prior_objective(hyper, q, static):
    """(KL(q(u) || p(u)) - log prior, its gradient in the hyperparameters)."""
    return jax.value_and_grad(
        lambda h: model_at(h, q, static).prior_kl() - log_prior(model_at(h, q, static)))(hyper)


def update(state: VIState, stats: Statistics, batches, scale, do_hyper, setup: VISetup,
           factors=None):
    """The update of one iteration from the rows' statistics: an optimizer step on the
    hyperparameters when ``do_hyper``, and the natural step on q(u) towards
    theta1* = scale s1, P* = I + scale S2 (step size from the schedule). Returns the new
    state and (objective, step size). ``factors``: (Kmm, Lmm) at the state, if known."""
    inference, opt = setup.inference, setup.optimizer

    def hyper_step(_):
        updates, opt_state = opt.update(stats.grad, state.opt_state, state.hyper)
        return eqx.apply_updates(state.hyper, updates), opt_state

    no_step = lambda _: (state.hyper, state.opt_state)
    if isinstance(do_hyper, bool):
        hyper, opt_state = hyper_step(None) if do_hyper else no_step(None)
    else:
        hyper, opt_state = lax.cond(do_hyper, hyper_step, no_step, None)
    model = model_at(state.hyper, state.q, setup.static)
    Kmm, Lmm = model.prior_factors() if factors is None else factors
    new_q, rho, schedule = statistics_step(
        model.q, Kmm, Lmm, (stats.s1, stats.S2), scale,
        lambda d: inference.step_size.rate(state.schedule, state.t, d), inference.psd_sites,
        model.num_latent > 1)
    new = VIState(hyper, partition_trainable(new_q)[0], opt_state, schedule, state.t + 1,
                  batches)
    return new, (stats.value, rho)


def joint_step(state: VIState, X, y, w, batches, scale, setup: VISetup):
    """One optimizer step on (hyperparameters, q(u)) together (``natural=False``)."""
    mc_key = jax.random.fold_in(batches.key, state.t)
    inference, opt = setup.inference, setup.optimizer

    def objective(hq):
        m = model_at(*hq, setup.static)
        expectations = weighted(lambda yy, mean, var: inference.expectations(
            m.likelihood, yy, mean, var, mc_key), w)
        return -(m.elbo_projection(X, y, scale, expectations)[0] + log_prior(m))

    params = (state.hyper, state.q)
    value, grad = jax.value_and_grad(objective)(params)
    updates, opt_state = opt.update(grad, state.opt_state, params)
    hyper, q = eqx.apply_updates(params, updates)
    return state._replace(hyper=hyper, q=q, opt_state=opt_state, t=state.t + 1,
                          batches=batches), (value, jnp.nan)


def vi_step(state: VIState, args):
    """One iteration on one machine; ``args`` = (VISetup, X, y, w) with w the row weights
    (None, or 0 on the padding rows of ``core.loop.pad_rows``: full batches only)."""
    setup, X, y, w = args
    inference = setup.inference
    rows, batches, scale = minibatch(state.batches, state.t, inference.batch_size)
    if rows is not None:
        X, y = X[rows], y[rows]
    if not inference.natural:
        return joint_step(state, X, y, w, batches, scale, setup)
    mc_key = jax.random.fold_in(batches.key, state.t)  # Monte Carlo; leaves the batch stream
    of = lambda need_grad: statistics(state.hyper, state.q, setup.static, inference, X, y, w,
                                      mc_key, need_grad, scale, with_prior=True)
    if setup.hyper_every == 1:
        stats, factors = of(True)
        return update(state, stats, batches, scale, True, setup, factors)
    do_hyper = state.t % setup.hyper_every == 0
    stats, factors = lax.cond(do_hyper, lambda: of(True), lambda: of(False))
    return update(state, stats, batches, scale, do_hyper, setup, factors)


__all__ = ["check_step_settings", "VIState", "VISetup", "Statistics", "init_state", "statistics",
           "prior_objective", "weighted", "update", "joint_step", "vi_step", "with_q", "model_at",
           "step_form", "user_form"]
