"""How ``fit`` finds the training of a model by an inference method: a registry keyed by
(model type, inference type), and the checked settings every training receives.

A training is a function ``train(model, X, y, inference, settings) -> posterior``,
registered with ``@register(ModelType, InferenceType)``; lookup follows both classes' method
resolution orders (a subclass of a registered model or inference uses its base's training
unless it registers its own), model first. ``@register_default(ModelType)`` names the
inference used when ``fit`` is given none. Adding a model or an inference method therefore
adds a registration next to its training and edits no existing function.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.loop import GradientTransformation
from augmentedgp.core.validation import check_int, check_key, check_positive, check_real

OPTIMIZERS = ("lbfgs", "l-bfgs", "l-bfgs-b", "adam")  # by name; or an optax transformation

Training = Callable[..., Any]  # train(model, X, y, inference, settings) -> posterior
_TRAININGS: dict[tuple[type, type], Training] = {}
_DEFAULTS: dict[type, Callable[[Any], Any]] = {}


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """The settings of :func:`augmentedgp.fit`, checked once (:meth:`check`). ``None``
    means "the training's own default" (e.g. 1000 iterations, L-BFGS for type-II maximum
    likelihood, Adam for variational fits); a training rejects the settings it does not use
    (:meth:`reject`)."""

    optimizer: str | GradientTransformation | None = None
    max_iter: int | None = None
    learning_rate: float | None = None
    tol: float | None = None
    n_restarts: int = 0
    key: PRNGKeyArray | None = None
    callback: Callable | None = None
    verbose: bool = False
    validation_data: tuple | None = None
    patience: int = 5
    chunk_size: int = 50
    window: int = 20
    hyper_every: int = 1

    @classmethod
    def check(cls, **settings) -> FitSettings:
        """The settings, each checked: a ValueError (a bad value) or TypeError (a bad type)
        naming the argument."""
        import optax

        s = cls(**settings)
        optimizer = s.optimizer
        if optimizer is not None and not isinstance(optimizer, optax.GradientTransformation):
            if not isinstance(optimizer, str):
                raise TypeError("optimizer must be 'lbfgs', 'adam' or an optax "
                                f"GradientTransformation, got {type(optimizer).__name__} "
                                f"{optimizer!r}")
            if optimizer.lower() not in OPTIMIZERS:
                raise ValueError("optimizer must be 'lbfgs', 'adam' or an optax "
                                 f"GradientTransformation, got {optimizer!r}")
        if s.callback is not None and not callable(s.callback):
            raise TypeError(f"callback must be callable or None, got "
                            f"{type(s.callback).__name__}")
        if not isinstance(s.verbose, bool | np.bool_ | numbers.Integral):
            raise TypeError(f"verbose must be a bool, got {type(s.verbose).__name__} "
                            f"{s.verbose!r}")
        check_key(s.key, "key", allow_none=True)
        return dataclasses.replace(
            s, max_iter=check_int(s.max_iter, "max_iter", low=0, allow_none=True),
            n_restarts=check_int(s.n_restarts, "n_restarts", low=0),
            patience=check_int(s.patience, "patience"),
            chunk_size=check_int(s.chunk_size, "chunk_size"),
            window=check_int(s.window, "window"),
            hyper_every=check_int(s.hyper_every, "hyper_every"),
            learning_rate=(None if s.learning_rate is None
                           else check_positive(s.learning_rate, "learning_rate")),
            tol=check_real(s.tol, "tol", low=0.0, allow_none=True),
            verbose=bool(s.verbose))

    def reject(self, *names: str, why: str) -> None:
        """A ValueError if any of the settings ``names`` differs from its default: the
        training at hand does not use it (``why`` says so)."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        given = [n for n in names if getattr(self, n) is not fields[n].default
                 and getattr(self, n) != fields[n].default]
        if given:
            raise ValueError(f"{', '.join(given)} {why}")


def register(model_type: type, inference_type: type) -> Callable[[Training], Training]:
    """Decorator: the training of ``model_type`` models by ``inference_type`` methods."""

    def add(train: Training) -> Training:
        _TRAININGS[model_type, inference_type] = train
        return train

    return add


def register_default(model_type: type) -> Callable[[Callable], Callable]:
    """Decorator: ``default(model) -> inference``, the inference of ``model_type`` models
    when ``fit`` is given none."""

    def add(default: Callable) -> Callable:
        _DEFAULTS[model_type] = default
        return default

    return add


def default_inference(model) -> Any:
    """The inference ``fit`` uses for ``model`` when given none (a TypeError for a model
    type nothing is registered for)."""
    for klass in type(model).__mro__:
        if klass in _DEFAULTS:
            return _DEFAULTS[klass](model)
    models = sorted({m.__name__ for m, _ in _TRAININGS} | {m.__name__ for m in _DEFAULTS})
    raise TypeError(f"fit supports {', '.join(models)} models, got {type(model).__name__}")


def training_for(model, inference) -> Training:
    """The registered training of ``model`` by ``inference`` (model's MRO first)."""
    for m in type(model).__mro__:
        for i in type(inference).__mro__:
            if (m, i) in _TRAININGS:
                return _TRAININGS[m, i]
    known = [i.__name__ for m in type(model).__mro__ for (mm, i) in _TRAININGS if mm is m]
    if not known:
        default_inference(model)  # the TypeError for an unknown model type
    raise ValueError(f"{type(model).__name__} is not trained by {type(inference).__name__}; "
                     f"it is by {', '.join(dict.fromkeys(known))}")


def train(model, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], inference,
          settings: FitSettings) -> Any:
    """Fit ``model`` by ``inference`` (its default if None) with checked ``settings``."""
    if inference is None:
        inference = default_inference(model)
    return training_for(model, inference)(model, X, y, inference, settings)


__all__ = ["FitSettings", "default_inference", "register", "register_default", "train",
           "training_for"]
