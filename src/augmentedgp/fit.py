"""``fit``: optimise a model's hyperparameters and return the fitted posterior."""

from __future__ import annotations

import jax
import numpy as np

from .models import GP
from .params import log_prior
from .training import History, minimize, perturb


def _objective(model, inference, X, y):
    """Negative log marginal likelihood minus log prior (type-II ML / MAP)."""
    return -(inference.log_marginal_likelihood(model, X, y) + log_prior(model))


def fit(model, X, y, inference=None, *, optimizer="lbfgs", max_iter: int = 1000,
        learning_rate: float = 0.05, tol: float = 1e-9, n_restarts: int = 0, key=None,
        callback=None, verbose: bool = False):
    """Type-II maximum likelihood (MAP when parameters carry priors), then condition.

    ``inference`` defaults to ``Exact()`` for a Gaussian likelihood and ``Laplace()``
    otherwise. ``n_restarts`` extra runs start from :func:`~augmentedgp.training.perturb`
    draws (needs ``key``); the run with the best objective is kept and the final objectives
    of all runs are in ``history.restarts``. Returns a fitted posterior with ``history``.
    """
    if not isinstance(model, GP):
        raise TypeError(f"fit supports augmentedgp.GP models, got {type(model).__name__}")
    inference = model._inference(inference)
    if n_restarts < 0:
        raise ValueError(f"n_restarts must be >= 0, got {n_restarts}")
    if n_restarts and key is None:
        raise ValueError("n_restarts > 0 needs a jax.random key (key=jax.random.key(0))")
    Xa, ya = model._data(X, y)

    starts = [model]
    if n_restarts:
        starts += [perturb(model, k) for k in jax.random.split(key, n_restarts)]
    best, best_hist = None, None
    finals = []
    for start in starts:
        try:
            fitted, hist = minimize(_objective, start, inference, Xa, ya, optimizer=optimizer,
                                    max_iter=max_iter,
                                    learning_rate=learning_rate, tol=tol, callback=callback,
                                    verbose=verbose)
        except ValueError:
            if start is model:
                raise
            finals.append(np.inf)  # a random restart may start where the objective is not finite
            continue
        finals.append(float(hist.objective[-1]))
        if best_hist is None or finals[-1] < best_hist.objective[-1]:
            best, best_hist = fitted, hist
    best_hist.restarts = finals
    return best.posterior(X, y, inference, history=best_hist)


__all__ = ["fit", "History"]
