"""``fit``: train a model by an inference method and return the fitted posterior.

``fit`` checks its settings once (:class:`~augmentedgp.training.dispatch.FitSettings`) and
hands over to the training registered for the model's and the inference's types
(:mod:`augmentedgp.training.dispatch`): type-II maximum likelihood for GP and the collapsed
sparse models (``training.marginal``), collapsed augmented VI (``training.collapsed``),
variational inference and particle flows for SVGP / VGP (``training.variational``), and the
estimators' size-dependent plan (``training.planned``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.loop import GradientTransformation
from augmentedgp.core.runtime import limits

# the trainings register themselves with the dispatcher when imported
from augmentedgp.training import collapsed, marginal, planned, variational  # noqa: F401
from augmentedgp.training.dispatch import FitSettings, train
from augmentedgp.training.marginal import perturb


@limits
def fit(model, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], inference=None, *,
        optimizer: str | GradientTransformation | None = None,
        max_iter: int | None = None, learning_rate: float | None = None,
        tol: float | None = None, n_restarts: int = 0, key: PRNGKeyArray | None = None,
        callback: Callable | None = None, verbose: bool = False,
        validation_data: tuple | None = None, patience: int = 5, chunk_size: int = 50,
        window: int = 20, hyper_every: int = 1) -> Any:
    """Fit ``model`` to (X, y) by ``inference`` and return its posterior (with ``history``).

    ``inference`` defaults by model: ``Exact()`` for a GP with a Gaussian likelihood and
    ``Laplace()`` otherwise (or ``EP()``); ``Collapsed()`` for SGPR / DTC / FITC with a
    Gaussian likelihood and ``CollapsedVI()`` for an SGPR with an augmentable likelihood or
    a TaylorSGPR; ``QuadratureVI()`` for SVGP and VGP (or ``QuadratureSVI(batch_size)``,
    ``AnalyticVI()``, ``AnalyticSVI(batch_size)``, a particle flow). ``Plan()`` chooses the
    model, inference and budget from the data size (what the scikit-learn estimators run).

    GP and the collapsed models (type-II maximum likelihood): L-BFGS by default
    (``optimizer="adam"`` or an optax transformation otherwise, ``learning_rate`` 0.05),
    ``max_iter`` 1000, ``tol`` 1e-9; ``n_restarts`` extra runs start from
    :func:`~augmentedgp.training.perturb` draws (needs ``key``), the best is kept.

    CollapsedVI: rounds of closed-form q(w) updates and 50 L-BFGS iterations on the
    collapsed bound, ``max_iter`` (1000) L-BFGS iterations in all, stopping when a round
    changes the bound by less than ``tol`` (relative, default 1e-6).

    SVGP and VGP: Adam (``learning_rate`` 0.01) on the hyperparameters and inducing inputs
    alternates with natural-gradient steps on q(u); ``key`` seeds the minibatches. Training
    stops after ``max_iter`` (1000) iterations, when the mean objective of the last
    ``window`` iterations changes by less than ``tol`` (1e-6, relative) against the
    ``window`` before, or -- with ``validation_data=(X_val, y_val)`` -- when the held-out
    negative log predictive density has not improved for ``patience`` chunks of
    ``chunk_size`` iterations (the best state is returned). ``hyper_every=k`` takes the
    optimizer step on the hyperparameters only every k-th iteration (AugmentedGaussian-
    Processes.jl's ``atfrequency``); the others are natural steps on q(u) alone.

    Particle flows (``ParticleFlow``, ``GaussianFlow``, ``ADVI``, ``SVGD``): the flow moves
    q(v) of the whitened latents and ``optimizer`` (Adam, ``learning_rate`` 0.01) fits the
    hyperparameters on the same free energy; ``key`` seeds the particles; ``tol`` 0 runs all
    ``max_iter`` iterations.

    Every setting is checked first: a ValueError (a bad value, or a setting the training
    does not use) or TypeError (a bad type) naming the argument. A run whose objective or
    parameters become non-finite stops and returns the last finite state, with a
    ``RuntimeWarning`` and ``history.status == "non_finite"``. ``history.status`` says how
    every fit ended. New models and inference methods plug in with
    :func:`~augmentedgp.training.dispatch.register`.
    """
    settings = FitSettings.check(
        optimizer=optimizer, max_iter=max_iter, learning_rate=learning_rate, tol=tol,
        n_restarts=n_restarts, key=key, callback=callback, verbose=verbose,
        validation_data=validation_data, patience=patience, chunk_size=chunk_size,
        window=window, hyper_every=hyper_every)
    return train(model, X, y, inference, settings)


__all__ = ["fit", "perturb"]
