"""``fit`` with a :class:`~augmentedgp.inference.plan.Plan`: build the model the plan
chooses for the data, train it, and for a minibatch fit run the full-batch finish; one
history whose ``status`` tells a plan's default budget (``"budget"``) from a budget the
user set (``"max_iter"``)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jaxtyping import ArrayLike, Float, Shaped

from augmentedgp.core.loop import History
from augmentedgp.core.validation import check_X
from augmentedgp.inference.plan import FINISH_TOL, Plan
from augmentedgp.models.gp import GP
from augmentedgp.models.sparse import VGP, SparsePosterior
from augmentedgp.training.dispatch import FitSettings, register, train

_WINDOW = 20  # the loop's default window: the budget message's measure of the change


def _budget_message(history: History, window: int = _WINDOW) -> str:
    """Why a fit stopped at the plan's budget: the relative change of the mean objective
    over the last ``window`` iterations against the ``window`` before (the training loop's
    convergence measure), and what to do for a longer fit."""
    f = np.asarray(history.objective)
    change = (abs(f[-window:].mean() - f[-2 * window:-window].mean())
              / (abs(f[-2 * window:-window].mean()) + 1.0) if f.size >= 2 * window else np.inf)
    return (f"stopped at the default budget of {f.size} iterations (the mean objective still "
            f"changed by {change:.1e}, relative, over the last {window}); set max_iter to "
            "train longer")


def _joined(first: History, second: History, budget: bool) -> History:
    """One history of the minibatch stage and the full-batch iterations after it. It has
    converged if the first stage did, or if the second half of the full-batch iterations
    changed the full objective by less than FINISH_TOL (relative; the first full-batch step
    moves q(u) from the minibatch estimate to its optimum given all the data, a jump that
    says nothing about convergence)."""
    f = second.objective
    settled = abs(f[-1] - f[f.size // 2]) / (abs(f[f.size // 2]) + 1.0) < FINISH_TOL
    message = (f"{first.message}; then {f.size} full-batch iterations (relative change of "
               f"the objective over the last {f.size - f.size // 2} "
               f"{'below' if settled else 'above'} {FINISH_TOL:g})")
    status = ("converged" if first.converged or settled
              else "budget" if budget and first.status == "max_iter" else first.status)
    return dataclasses.replace(first.then(second, "full batch"), status=status,
                               message=message)


def fit_planned(spec: GP | VGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
                plan: Plan, s: FitSettings):
    """Train the model ``plan`` chooses for (X, y) from ``spec``'s prior and likelihood."""
    s.reject("optimizer", "learning_rate", "tol", "n_restarts", "validation_data",
             "patience", "chunk_size", "window", "hyper_every",
             why="are chosen by the Plan (fit a model of your own for other settings)")
    plan.check(spec)
    Xa = np.asarray(check_X(X))
    key = jax.random.key(0) if s.key is None else s.key
    choice = plan.choose(spec.likelihood, Xa.shape[0], s.max_iter)
    model = plan.model(spec, Xa, key, choice)
    settings = dataclasses.replace(s, key=key, max_iter=choice.max_iter)
    if choice.tol is not None:
        settings = dataclasses.replace(settings, tol=choice.tol, window=choice.window)
    post = train(model, X, y, choice.inference, settings)
    history = post.history
    if choice.finish:
        post = train(post.model, X, y, choice.finish_inference, dataclasses.replace(
            s, key=key, max_iter=choice.finish, chunk_size=choice.finish))
        history = _joined(history, post.history, choice.budget)
    elif choice.budget and choice.inference is not None and history.status == "max_iter":
        history = dataclasses.replace(history, status="budget",
                                      message=_budget_message(history))
    else:
        return post
    return SparsePosterior(post.model, post.X, post.y, history)


register(GP, Plan)(fit_planned)
register(VGP, Plan)(fit_planned)

__all__ = ["fit_planned"]
