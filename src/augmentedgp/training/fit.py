"""``fit``: optimise a model and return the fitted posterior.

- ``GP``: type-II maximum likelihood (MAP with priors) of the exact, Laplace or EP
  marginal likelihood, then conditioning;
- ``SGPR``: the same on the collapsed bound (or the DTC / FITC likelihood);
- ``SVGP`` / ``VGP``: variational inference, one jitted iteration (``training.step``) per
  step: an optimizer step on the hyperparameters and inducing inputs and a natural-gradient
  step on q(u), on the full batch or on minibatches.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.loop import minimize, optax_optimizer, pad_rows, run_steps
from augmentedgp.core.params import Identity, is_parameter, log_prior
from augmentedgp.core.validation import check_int, check_key, check_positive, check_real
from augmentedgp.inference.flow import METHODS
from augmentedgp.inference.flow_gp import fit_flow
from augmentedgp.inference.vi import QuadratureVI, VariationalInference, stages, warn_if_loose
from augmentedgp.models.gp import GP
from augmentedgp.models.sites import SitePosterior
from augmentedgp.models.sparse import SGPR, SVGP, VGP, CollapsedSparseGP, SparsePosterior
from augmentedgp.training.collapsed import fit_collapsed
from augmentedgp.training.step import (
    check_settings,
    init_state,
    model_at,
    user_form,
    vi_step,
)
from augmentedgp.variational.families import QPosterior

COLLAPSED_LBFGS_ITER = 50  # L-BFGS iterations per round of collapsed augmented VI
OPTIMIZERS = ("lbfgs", "l-bfgs", "l-bfgs-b", "adam")  # by name; or an optax transformation


class _FitSettings(NamedTuple):
    """The checked settings of :func:`fit` (defaults, where None, are set per model)."""

    max_iter: int
    n_restarts: int
    patience: int
    chunk_size: int
    window: int
    hyper_every: int
    learning_rate: float | None
    tol: float | None


def _check_settings(*, optimizer, max_iter, learning_rate, tol, n_restarts, key, callback,
                    verbose, patience, chunk_size, window, hyper_every) -> _FitSettings:
    """The settings of :func:`fit`, checked once for every model and inference: a
    ValueError (a bad value) or TypeError (a bad type) naming the argument."""
    if optimizer is not None and not isinstance(optimizer, optax.GradientTransformation):
        if not isinstance(optimizer, str):
            raise TypeError("optimizer must be 'lbfgs', 'adam' or an optax GradientTransformation"
                            f", got {type(optimizer).__name__} {optimizer!r}")
        if optimizer.lower() not in OPTIMIZERS:
            raise ValueError("optimizer must be 'lbfgs', 'adam' or an optax GradientTransformation"
                             f", got {optimizer!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    if not isinstance(verbose, bool | np.bool_ | numbers.Integral):
        raise TypeError(f"verbose must be a bool, got {type(verbose).__name__} {verbose!r}")
    check_key(key, "key", allow_none=True)
    return _FitSettings(
        max_iter=check_int(max_iter, "max_iter", low=0),
        n_restarts=check_int(n_restarts, "n_restarts", low=0),
        patience=check_int(patience, "patience"), chunk_size=check_int(chunk_size, "chunk_size"),
        window=check_int(window, "window"), hyper_every=check_int(hyper_every, "hyper_every"),
        learning_rate=None if learning_rate is None else check_positive(learning_rate,
                                                                        "learning_rate"),
        tol=check_real(tol, "tol", low=0.0, allow_none=True))


def _objective(model, inference, X, y):
    """Negative log marginal likelihood minus log prior (type-II ML / MAP)."""
    return -(inference.log_marginal_likelihood(model, X, y) + log_prior(model))


def _sgpr_objective(model, X, y):
    """Negative collapsed bound (or DTC / FITC log likelihood) minus log prior."""
    return -(model.training_objective(X, y) + log_prior(model))


def fit(model: GP | SGPR | SVGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
        inference=None, *, optimizer=None, max_iter: int = 1000,
        learning_rate: float | None = None, tol: float | None = None, n_restarts: int = 0,
        key: PRNGKeyArray | None = None, callback=None, verbose: bool = False,
        validation_data=None, patience: int = 5, chunk_size: int = 50, window: int = 20,
        hyper_every: int = 1) -> SitePosterior | SparsePosterior:
    """Fit ``model`` to (X, y) and return its posterior (with ``history``).

    SGPR with an augmented likelihood (or TaylorSGPR): collapsed augmented VI
    (:func:`~augmentedgp.training.collapsed.fit_collapsed`): rounds of closed-form q(w)
    updates (the Taylor expansion points) and 50 L-BFGS iterations on the collapsed bound
    (the Taylor objective), ``max_iter`` L-BFGS iterations in all, stopping when a round
    changes the objective by less than ``tol`` (relative, default 1e-6).

    GP and SGPR: L-BFGS by default (``optimizer="adam"`` or an optax transformation
    otherwise, ``learning_rate`` 0.05); ``inference`` for GP is ``Exact()`` for a Gaussian
    likelihood and ``Laplace()`` otherwise; ``n_restarts`` extra runs start from
    :func:`~augmentedgp.training.perturb` draws (needs ``key``), the best is kept.

    SVGP and VGP: ``inference`` is ``QuadratureVI()`` (full batch, default),
    ``QuadratureSVI(batch_size)``, ``AnalyticVI()`` or ``AnalyticSVI(batch_size)`` (for
    augmentable likelihoods); Adam (``learning_rate`` 0.01) on the hyperparameters
    and inducing inputs alternates with natural-gradient steps on q(u). ``key`` seeds the
    minibatches. Training stops after ``max_iter`` iterations, when the mean objective of
    the last ``window`` iterations changes by less than ``tol`` (relative) against the
    ``window`` before, or -- with ``validation_data=(X_val, y_val)`` -- when the held-out
    negative log predictive density has not improved for ``patience`` chunks of
    ``chunk_size`` iterations (the best state is returned). ``hyper_every=k`` takes the
    optimizer step on the hyperparameters only every k-th iteration (AugmentedGaussian-
    Processes.jl's ``atfrequency``); the others are natural steps on q(u) alone, without
    a gradient pass.

    VGP or SVGP with ``inference`` a particle flow (``ParticleFlow``, ``GaussianFlow``,
    ``ADVI`` or ``SVGD``, see :mod:`augmentedgp.inference.flow`): the flow moves q(v) of the
    whitened latents (an SVGP's inducing values, with the likelihood term averaged over
    p(f | v); ``batch_size`` of the method for minibatches) and ``optimizer`` (Adam,
    ``learning_rate`` 0.01) fits the hyperparameters on the same free energy; ``key`` seeds
    the particles; ``tol`` 0 runs all ``max_iter`` iterations.

    Every setting is checked first: a ValueError (a bad value) or TypeError (a bad type)
    naming the argument. A run whose objective or parameters become non-finite stops and
    returns the last finite state, with a ``RuntimeWarning`` and ``history.message`` naming
    the iteration.
    """
    s = _check_settings(
        optimizer=optimizer, max_iter=max_iter, learning_rate=learning_rate, tol=tol,
        n_restarts=n_restarts, key=key, callback=callback, verbose=verbose, patience=patience,
        chunk_size=chunk_size, window=window, hyper_every=hyper_every)
    max_iter, n_restarts, patience, learning_rate, tol = (
        s.max_iter, s.n_restarts, s.patience, s.learning_rate, s.tol)
    chunk_size, window, hyper_every = s.chunk_size, s.window, s.hyper_every
    if isinstance(model, CollapsedSparseGP) and model.has_aux:
        if (inference is not None or optimizer is not None or n_restarts
                or validation_data is not None or hyper_every != 1):
            raise ValueError("an SGPR with an augmented likelihood or a TaylorSGPR is "
                             "fitted in rounds (training.collapsed.fit_collapsed): inference, "
                             "optimizer, n_restarts, validation_data and hyper_every do not "
                             "apply")
        rounds = max(1, -(-check_int(max_iter, "max_iter") // COLLAPSED_LBFGS_ITER))
        return fit_collapsed(model, X, y, max_rounds=rounds, lbfgs_iter=COLLAPSED_LBFGS_ITER,
                             tol=1e-6 if tol is None else tol, callback=callback,
                             verbose=verbose)
    if isinstance(model, GP | CollapsedSparseGP):
        if validation_data is not None or hyper_every != 1:
            raise ValueError("validation_data and hyper_every are for the iterative SVGP / "
                             "VGP fits")
        return _fit_marginal(model, X, y, inference, optimizer or "lbfgs", max_iter,
                             learning_rate or 0.05, 1e-9 if tol is None else tol, n_restarts,
                             key, callback, verbose)
    if isinstance(inference, METHODS):
        if n_restarts or validation_data is not None or hyper_every != 1:
            raise ValueError("n_restarts, validation_data and hyper_every are not used by "
                             "particle flows")
        return fit_flow(model, X, y, inference, key=key, max_iter=max_iter,
                            tol=0.0 if tol is None else tol,
                            learning_rate=learning_rate or 0.01, optimizer=optimizer or "adam",
                            callback=callback, verbose=verbose, chunk_size=chunk_size,
                            window=window)
    if isinstance(model, SVGP):
        if n_restarts:
            raise ValueError("n_restarts is for GP and SGPR; for SVGP restart from "
                             "augmentedgp.training.perturb(model, key) yourself")
        return _fit_variational(model, X, y, inference, optimizer or "adam", max_iter,
                                learning_rate or 0.01, 1e-6 if tol is None else tol, key,
                                callback, verbose, validation_data, patience, chunk_size, window,
                                hyper_every)
    raise TypeError(f"fit supports GP, SGPR, SVGP and VGP models, got {type(model).__name__}")


def _fit_marginal(model, X, y, inference, optimizer, max_iter, learning_rate, tol, n_restarts,
                  key, callback, verbose):
    if isinstance(model, GP):
        inference = model.resolve_inference(inference)
        objective, extra = _objective, (inference,)
    else:
        if inference is not None:
            raise ValueError("SGPR, DTC and FITC take no inference argument (the model's "
                             "class chooses the objective)")
        objective, extra = _sgpr_objective, ()
    if n_restarts and key is None:
        raise ValueError("n_restarts > 0 needs a jax.random key (key=jax.random.key(0))")
    Xa, ya = model.validate_data(X, y)

    starts = [model]
    if n_restarts:
        starts += [perturb(model, k) for k in jax.random.split(key, n_restarts)]
    best, best_hist = None, None
    finals = []
    for start in starts:
        try:
            fitted, hist = minimize(objective, start, *extra, Xa, ya, optimizer=optimizer,
                                    max_iter=max_iter, learning_rate=learning_rate, tol=tol,
                                    callback=callback, verbose=verbose)
        except ValueError:
            if start is model:
                raise
            finals.append(np.inf)  # a random restart may start where the objective is not finite
            continue
        finals.append(float(hist.objective[-1]))
        if best_hist is None or finals[-1] < best_hist.objective[-1]:
            best, best_hist = fitted, hist
    best_hist.restarts = finals
    if isinstance(model, GP):
        return best.posterior(X, y, inference, history=best_hist)
    return SparsePosterior(best.to_svgp(Xa, ya), Xa, ya, best_hist)


# --- variational inference ---------------------------------------------------------------


@eqx.filter_jit
def _heldout_nlpd(model, X, y):
    p = model.project(X)
    return -jnp.mean(model.likelihood.predictive_log_prob(y, p.mean, p.var))


def _fit_variational(model, X, y, inference, optimizer, max_iter, learning_rate, tol, key,
                     callback, verbose, validation_data, patience, chunk_size, window,
                     hyper_every):
    if isinstance(model, VGP):
        model = model.bind(X)
    inference = inference if inference is not None else QuadratureVI()
    if not isinstance(inference, VariationalInference):
        raise ValueError("SVGP / VGP need QuadratureVI, QuadratureSVI, AnalyticVI or "
                         f"AnalyticSVI, got {inference!r}")
    inference.check(model)
    max_iter, hyper_every = check_settings(inference, max_iter, hyper_every)
    Xa, ya = model.validate_data(X, y)
    if inference.batch_size is not None and inference.batch_size > Xa.shape[0]:
        full = type(inference).__name__.replace("SVI", "VI")
        raise ValueError(f"batch_size {inference.batch_size} exceeds the {Xa.shape[0]} data "
                         f"points; use {full} for full batches")
    monitor = None
    if validation_data is not None:
        Xv, yv = model.validate_data(*validation_data, name="Xnew")
        monitor = lambda m: _heldout_nlpd(m, Xv, yv)
    key = jax.random.key(0) if key is None else key
    opt = optax_optimizer(optimizer, learning_rate)
    # full batches are padded to a shape bucket (weight 0 on the padding), so that a new data
    # set of similar size reuses the compiled program (a VGP's inducing inputs are its data)
    full = inference.batch_size is None and not isinstance(model, VGP)
    Xp, yp, w = pad_rows(Xa, ya) if full else (Xa, ya, None)
    hist = None
    for stage, iters in stages(inference, model.likelihood, max_iter):
        done = 0 if hist is None else hist.n_iter
        if hist is not None:  # a later stage gets the iterations the ones before left
            if iters <= 0 or hist.message == "stopped by callback":
                break
            iters = max_iter - done
        state, setup = init_state(model, stage, opt, hyper_every, key, Xp.shape[0])
        to_model = lambda s, setup=setup, template=model.q: user_form(
            model_at(s.hyper, s.q, setup.static), template)
        # the callback counts the iterations of the whole fit
        stage_callback = callback and (lambda it, f, m, done=done: callback(done + it, f, m))
        state, stage_hist = run_steps(vi_step, state, (setup, Xp, yp, w), to_model,
                                      max_iter=iters, tol=tol, chunk_size=chunk_size,
                                      window=window, callback=stage_callback, verbose=verbose,
                                      monitor=monitor, patience=patience)
        model = to_model(state)
        hist = stage_hist if hist is None else hist.then(stage_hist, type(stage).__name__)
    post = SparsePosterior(model, Xa, ya, hist)
    warn_if_loose(inference, post)
    return post


def perturb(model, key, scale: float = 1.0):
    """A random restart point: positive parameters times exp(N(0, scale^2)), real ones plus
    N(0, scale^2). Fixed parameters and the variational posterior q(u) (whose natural
    parameters have constraints of their own) are left alone."""
    skip = lambda x: is_parameter(x) or isinstance(x, QPosterior)
    params = [p for p in jax.tree_util.tree_leaves(model, is_leaf=skip)
              if is_parameter(p) and p.trainable]
    keys = jax.random.split(key, max(len(params), 1))
    it = iter(keys)

    def move(p):
        if not (is_parameter(p) and p.trainable):
            return p
        eps = scale * jax.random.normal(next(it), jnp.shape(p.raw), dtype=p.raw.dtype)
        if isinstance(p.transform, Identity):
            return dataclasses.replace(p, raw=p.raw + eps)
        return dataclasses.replace(p, raw=p.transform.inverse(p.value * jnp.exp(eps)))

    return jax.tree_util.tree_map(move, model, is_leaf=skip)


__all__ = ["fit", "perturb"]
