"""Variational training of SVGP and VGP models: by a :class:`VariationalInference` (one
jitted iteration, ``training.step``: an optimizer step on the hyperparameters and inducing
inputs and a natural-gradient step on q(u), on the full batch or on minibatches), or by a
Gaussian particle flow (:func:`augmentedgp.inference.flow_gp.fit_flow`)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike, Float, Shaped

from augmentedgp.core.loop import optax_optimizer, pad_rows, run_steps
from augmentedgp.inference.flow import FlowMethod
from augmentedgp.inference.flow_gp import fit_flow
from augmentedgp.inference.vi import QuadratureVI, VariationalInference, stages, warn_if_loose
from augmentedgp.models.sparse import SVGP, VGP, SparsePosterior
from augmentedgp.training.dispatch import FitSettings, register, register_default
from augmentedgp.training.step import check_step_settings, init_state, model_at, user_form, vi_step

MAX_ITER, LEARNING_RATE, TOL = 1000, 0.01, 1e-6  # defaults of the settings left at None


@register_default(SVGP)
def _svgp_default(model: SVGP) -> QuadratureVI:
    return QuadratureVI()


@eqx.filter_jit
def _heldout_nlpd(model, X, y):
    p = model.project(X)
    return -jnp.mean(model.likelihood.predictive_log_prob(y, p.mean, p.var))


@register(SVGP, VariationalInference)
def fit_variational(model: SVGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                    inference: VariationalInference, s: FitSettings) -> SparsePosterior:
    """An SVGP (or a VGP, bound to X first) by ``inference``'s stages (:func:`stages`),
    each continuing from the one before with the iterations it left."""
    s.reject("n_restarts", why="is for GP and SGPR; for SVGP restart from "
                                "augmentedgp.training.perturb(model, key) yourself")
    full_model = isinstance(model, VGP)
    if full_model:
        model = model.bind(X)
    inference.check(model)
    max_iter = MAX_ITER if s.max_iter is None else s.max_iter
    max_iter, hyper_every = check_step_settings(inference, max_iter, s.hyper_every)
    Xa, ya = model.validate_data(X, y)
    if inference.batch_size is not None and inference.batch_size > Xa.shape[0]:
        full = type(inference).__name__.replace("SVI", "VI")
        raise ValueError(f"batch_size {inference.batch_size} exceeds the {Xa.shape[0]} data "
                         f"points; use {full} for full batches")
    monitor = None
    if s.validation_data is not None:
        Xv, yv = model.validate_data(*s.validation_data, name="Xnew")
        monitor = lambda m: _heldout_nlpd(m, Xv, yv)
    key = jax.random.key(0) if s.key is None else s.key
    opt = optax_optimizer(s.optimizer or "adam", s.learning_rate or LEARNING_RATE)
    # full batches are padded to a shape bucket (weight 0 on the padding), so that a new data
    # set of similar size reuses the compiled program (a VGP's inducing inputs are its data)
    full = inference.batch_size is None and not full_model
    Xp, yp, w = pad_rows(Xa, ya) if full else (Xa, ya, None)
    tol = TOL if s.tol is None else s.tol
    hist = None
    for stage, iters in stages(inference, model.likelihood, max_iter):
        done = 0 if hist is None else hist.n_iter
        if hist is not None:  # a later stage gets the iterations the ones before left
            if iters <= 0 or hist.status == "callback":
                break
            iters = max_iter - done
        state, setup = init_state(model, stage, opt, hyper_every, key, Xp.shape[0])
        to_model = lambda st, setup=setup, template=model.q: user_form(
            model_at(st.hyper, st.q, setup.static), template)
        # the callback counts the iterations of the whole fit
        callback = s.callback and (lambda it, f, m, done=done: s.callback(done + it, f, m))
        state, stage_hist = run_steps(
            vi_step, state, (setup, Xp, yp, w), to_model, max_iter=iters, tol=tol,
            chunk_size=s.chunk_size, window=s.window, callback=callback, verbose=s.verbose,
            monitor=monitor, patience=s.patience)
        model = to_model(state)
        hist = stage_hist if hist is None else hist.then(stage_hist, type(stage).__name__)
    post = SparsePosterior(model, Xa, ya, hist)
    warn_if_loose(inference, post)
    return post


def fit_particles(model: SVGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                  method, s: FitSettings) -> SparsePosterior:
    """An SVGP or VGP by a Gaussian particle flow (:func:`fit_flow`); Adam on the
    hyperparameters by default, ``tol`` 0 (all ``max_iter`` iterations)."""
    s.reject("n_restarts", "validation_data", "hyper_every",
             why="are not used by particle flows")
    return fit_flow(model, X, y, method, key=s.key,
                    max_iter=MAX_ITER if s.max_iter is None else s.max_iter,
                    tol=0.0 if s.tol is None else s.tol,
                    learning_rate=s.learning_rate or LEARNING_RATE,
                    optimizer=s.optimizer or "adam", callback=s.callback, verbose=s.verbose,
                    chunk_size=s.chunk_size, window=s.window)


register(SVGP, FlowMethod)(fit_particles)


__all__ = ["fit_particles", "fit_variational"]
