"""Prior mean functions m(X) -> (n,)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from augmentedgp.core.params import Parameter, real
from augmentedgp.core.validation import check_inputs, is_concrete


class Mean(eqx.Module):
    """Base class of mean functions: ``mean(X)`` maps (n, d) inputs to (n,) values.

    ``mean(X)`` validates X as the kernels do (:func:`~augmentedgp.core.validation.
    check_inputs`: 2-D, real, finite when concrete), then calls the subclass's
    ``_evaluate(X)``; a non-finite concrete result raises a ValueError naming X.
    """

    def __call__(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        X = check_inputs(X, "X")
        out = self._evaluate(X)
        if is_concrete(out) and not bool(jnp.all(jnp.isfinite(out))):
            raise ValueError(f"X's scale overflows the mean function {type(self).__name__}: "
                             "standardise the inputs")
        return out

    def _evaluate(self, X):
        raise NotImplementedError


class Zero(Mean):
    """m(x) = 0."""

    def _evaluate(self, X):
        return jnp.zeros(X.shape[:1], dtype=X.dtype)


class Constant(Mean):
    """m(x) = c, a trainable constant."""

    c: Parameter

    def __init__(self, c: float | Parameter = 0.0):
        self.c = real(c, "c", max_ndim=0)

    def _evaluate(self, X):
        return jnp.broadcast_to(self.c.value, X.shape[:1]).astype(X.dtype)


class Linear(Mean):
    """X @ weights + bias."""

    weights: Parameter
    bias: Parameter

    def __init__(self, weights: Float[ArrayLike, " d"] | Parameter,
                 bias: float | Parameter = 0.0):
        self.weights = real(weights, "weights")
        self.bias = real(bias, "bias", max_ndim=0)
        if jnp.ndim(self.weights.raw) != 1:
            raise ValueError("weights must be a 1-D array with one entry per input column")

    def _evaluate(self, X):
        if X.shape[-1] != self.weights.raw.shape[0]:
            raise ValueError(
                f"Linear mean has {self.weights.raw.shape[0]} weights but X has "
                f"{X.shape[-1]} columns"
            )
        return X @ self.weights.value + self.bias.value
