"""Type-II maximum likelihood (MAP with priors): a full GP's exact, Laplace or EP marginal
likelihood, or a collapsed sparse model's bound, minimised over the hyperparameters by
L-BFGS (or an optax optimizer), with optional random restarts; then conditioning."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.loop import minimize
from augmentedgp.core.params import Identity, is_parameter, log_prior
from augmentedgp.inference.collapsed import Collapsed, CollapsedVI
from augmentedgp.models.approximations import EP, Exact, Laplace
from augmentedgp.models.gp import GP
from augmentedgp.models.sites import SitePosterior
from augmentedgp.models.sparse import CollapsedSparseGP, SparsePosterior
from augmentedgp.training.dispatch import FitSettings, register, register_default
from augmentedgp.variational.families import QPosterior

MAX_ITER, LEARNING_RATE, TOL = 1000, 0.05, 1e-9  # defaults of the settings left at None
_ITERATIVE_ONLY = ("validation_data", "hyper_every")


def _gp_objective(model, inference, X, y):
    """Negative log marginal likelihood minus log prior (type-II ML / MAP)."""
    return -(inference.log_marginal_likelihood(model, X, y) + log_prior(model))


def _collapsed_objective(model, X, y):
    """Negative collapsed bound (or DTC / FITC log likelihood) minus log prior."""
    return -(model.training_objective(X, y) + log_prior(model))


def _minimize_restarts(objective, model, extra, X, y, s: FitSettings):
    """The best of ``minimize`` from ``model`` and ``s.n_restarts`` :func:`perturb`-ed
    starts; the history's ``restarts`` lists each start's final objective (inf where a
    random start's objective was not finite)."""
    if s.n_restarts and s.key is None:
        raise ValueError("n_restarts > 0 needs a jax.random key (key=jax.random.key(0))")
    starts = [model]
    if s.n_restarts:
        starts += [perturb(model, k) for k in jax.random.split(s.key, s.n_restarts)]
    best, best_hist, finals = None, None, []
    for start in starts:
        try:
            fitted, hist = minimize(
                objective, start, *extra, X, y, optimizer=s.optimizer or "lbfgs",
                max_iter=MAX_ITER if s.max_iter is None else s.max_iter,
                learning_rate=s.learning_rate or LEARNING_RATE,
                tol=TOL if s.tol is None else s.tol, callback=s.callback, verbose=s.verbose)
        except ValueError:
            if start is model:
                raise
            finals.append(np.inf)  # a random restart may start where the objective is not finite
            continue
        finals.append(float(hist.objective[-1]))
        if best_hist is None or finals[-1] < best_hist.objective[-1]:
            best, best_hist = fitted, hist
    best_hist.restarts = finals
    return best, best_hist


@register_default(GP)
def _gp_default(model: GP):
    return model.default_inference()


def fit_gp(model: GP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
           inference: Exact | Laplace | EP, s: FitSettings) -> SitePosterior:
    """A full GP by type-II maximum likelihood of ``inference``'s marginal likelihood."""
    s.reject(*_ITERATIVE_ONLY, why="are for the iterative SVGP / VGP fits")
    inference = model.resolve_inference(inference)
    Xa, ya = model.validate_data(X, y)
    best, hist = _minimize_restarts(_gp_objective, model, (inference,), Xa, ya, s)
    return best.posterior(X, y, inference, history=hist)


for _approximation in (Exact, Laplace, EP):
    register(GP, _approximation)(fit_gp)


@register_default(CollapsedSparseGP)
def _collapsed_default(model: CollapsedSparseGP):
    return CollapsedVI() if model.has_aux else Collapsed()


@register(CollapsedSparseGP, Collapsed)
def fit_collapsed_model(model: CollapsedSparseGP, X: Float[ArrayLike, "n d"],
                        y: Shaped[ArrayLike, " n"], inference: Collapsed,
                        s: FitSettings) -> SparsePosterior:
    """SGPR, DTC or FITC with a Gaussian likelihood by type-II maximum likelihood of its
    bound (or DTC / FITC likelihood); q(u) is the optimum at the fitted hyperparameters."""
    s.reject(*_ITERATIVE_ONLY, why="are for the iterative SVGP / VGP fits")
    inference.check(model)
    Xa, ya = model.validate_data(X, y)
    best, hist = _minimize_restarts(_collapsed_objective, model, (), Xa, ya, s)
    return SparsePosterior(best.to_svgp(Xa, ya), Xa, ya, hist)


def perturb(model, key: PRNGKeyArray, scale: float = 1.0):
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


__all__ = ["fit_collapsed_model", "fit_gp", "perturb"]
