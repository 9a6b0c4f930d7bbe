"""Hyperparameters as pytree leaves: an unconstrained ``raw`` array, a bijection to the
constrained value, an optional prior on the constrained value, and a ``trainable`` flag.

Models are ``equinox.Module`` trees whose hyperparameters are :class:`Parameter` nodes;
training partitions a model into its trainable raw arrays and the rest
(:func:`partition_trainable`), so fixing a parameter is ``fixed(p)``.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import stats
from jaxtyping import Array, ArrayLike, Float, PyTree

from augmentedgp.core.validation import check_positive

# --- bijections: unconstrained raw <-> constrained value -------------------------------


@dataclasses.dataclass(frozen=True)
class Identity:
    """The identity bijection (unconstrained real parameters)."""

    def forward(self, raw: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return raw

    def inverse(self, value: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return value


@dataclasses.dataclass(frozen=True)
class Softplus:
    """value = softplus(raw), value > 0; smoother than exp for large values."""

    def forward(self, raw: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return jax.nn.softplus(raw)

    def inverse(self, value: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        value = jnp.asarray(value)
        return value + jnp.log(-jnp.expm1(-value))  # softplus^{-1}, stable for small values


@dataclasses.dataclass(frozen=True)
class Exp:
    """value = exp(raw): optimisers move in log-space (scale-free steps; the default)."""

    def forward(self, raw: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.exp(raw)

    def inverse(self, value: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.log(jnp.asarray(value))


# --- priors on the constrained value (no Jacobian: the MAP is a mode in value space) ---


@dataclasses.dataclass(frozen=True)
class Normal:
    """A normal prior N(loc, scale^2) on the parameter value."""

    loc: float = 0.0
    scale: float = 1.0

    def log_prob(self, x: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return stats.norm.logpdf(x, self.loc, self.scale)


@dataclasses.dataclass(frozen=True)
class LogNormal:
    """A log-normal prior: log(value) ~ N(loc, scale^2)."""

    loc: float = 0.0
    scale: float = 1.0

    def log_prob(self, x: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return stats.norm.logpdf(jnp.log(x), self.loc, self.scale) - jnp.log(x)


@dataclasses.dataclass(frozen=True)
class Gamma:
    """Gamma(shape, rate)."""

    shape: float = 1.0
    rate: float = 1.0

    def log_prob(self, x: Float[ArrayLike, "*batch"]) -> Float[Array, "*batch"]:
        return stats.gamma.logpdf(x, self.shape, scale=1.0 / self.rate)


PRIORS = (Normal, LogNormal, Gamma)


class Parameter(eqx.Module):
    """A hyperparameter. ``value`` is the constrained value; ``raw`` is what optimisers see."""

    raw: jax.Array
    transform: Identity | Softplus | Exp = eqx.field(static=True, default=Identity())
    prior: Normal | LogNormal | Gamma | None = eqx.field(static=True, default=None)
    trainable: bool = eqx.field(static=True, default=True)

    @property
    def value(self) -> jax.Array:
        return self.transform.forward(self.raw)


def _as_float_array(value, name, max_ndim):
    """``value`` as a finite float array, or a TypeError / ValueError naming ``name``."""
    label = name or "a parameter value"
    if value is None or isinstance(value, bool | np.bool_ | str | bytes):
        raise TypeError(f"{label} must be a real number, got {value!r}")
    try:
        arr = np.asarray(value)
        if arr.dtype.kind == "O":  # a list of Python numbers mixed with arrays, say
            arr = arr.astype(float)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{label} must be a real number or array, got {value!r} ({err})"
                        ) from None
    if arr.dtype.kind not in "iuf":  # complex, strings, booleans, dates
        raise TypeError(f"{label} must be real-valued, got {value!r} (dtype {arr.dtype})")
    _check_ndim(arr.shape, label, max_ndim)
    arr = arr.astype(float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{label} must be finite, got {value!r}")
    return arr


def _check_ndim(shape, label, max_ndim, allow_empty=False):
    if max_ndim is not None and len(shape) > max_ndim:
        what = "a scalar" if max_ndim == 0 else f"a scalar or an array of at most {max_ndim} " \
            f"dimension{'s' if max_ndim > 1 else ''}"
        raise ValueError(f"{label} must be {what}, got shape {tuple(shape)}")
    if not allow_empty and 0 in tuple(shape):
        raise ValueError(f"{label} must not be empty, got shape {tuple(shape)}")


def _given(p: Parameter, name, max_ndim) -> Parameter:
    """A Parameter passed as is: only its shape is checked (its raw value may be traced)."""
    _check_ndim(jnp.shape(p.raw), name or "a parameter value", max_ndim, allow_empty=True)
    return p


def positive(value, name: str | None = None, *, prior=None, trainable: bool = True,
             transform: Exp | Softplus = Exp(), max_ndim: int | None = None) -> Parameter:
    """A strictly positive parameter. ``value`` may be an array (ARD).

    The default transform is exp (log-space optimisation, as in GPML and scikit-learn):
    gradient steps are relative changes, so lengthscales of irrelevant inputs can grow
    by orders of magnitude; ``Softplus()`` is the alternative. ``value`` must be real and
    finite (a TypeError for None, booleans, strings, complex numbers; a ValueError for
    NaN, inf, values <= 0, an empty array, or more than ``max_ndim`` dimensions:
    ``max_ndim=0`` for a scalar parameter); messages name ``name``.
    """
    if isinstance(value, Parameter):
        return _given(value, name, max_ndim)
    arr = _as_float_array(value, name, max_ndim)
    if not np.all(arr > 0):
        raise ValueError(f"{name or 'a parameter value'} must be > 0, got {value!r}")
    return Parameter(transform.inverse(jnp.asarray(arr)), transform, prior, trainable)


def scalar_positive(value, name: str) -> Parameter:
    """A positive scalar hyperparameter: a scalar-valued :class:`Parameter` as it is, or a
    finite real number > 0 as a trainable one (a ValueError naming ``name`` otherwise:
    arrays, booleans, strings, NaN, inf, values <= 0)."""
    if isinstance(value, Parameter):
        if jnp.ndim(value.value) != 0:
            raise ValueError(f"{name} must be a scalar Parameter, got shape "
                             f"{jnp.shape(value.value)}")
        return value
    return positive(check_positive(value, name), name)


def real(value, name: str | None = None, *, prior=None, trainable: bool = True,
         max_ndim: int | None = None) -> Parameter:
    """An unconstrained real parameter (identity transform); ``value`` is checked as in
    :func:`positive` (real, finite, at most ``max_ndim`` dimensions)."""
    if isinstance(value, Parameter):
        return _given(value, name, max_ndim)
    arr = _as_float_array(value, name, max_ndim)
    return Parameter(jnp.asarray(arr), Identity(), prior, trainable)


def fixed(p: Parameter) -> Parameter:
    """The same parameter, excluded from training."""
    return dataclasses.replace(p, trainable=False)


def with_prior(p: Parameter, prior) -> Parameter:
    """The same parameter with a prior (``Normal``, ``LogNormal`` or ``Gamma``)."""
    return dataclasses.replace(p, prior=prior)


def is_parameter(x) -> bool:
    return isinstance(x, Parameter)


def parameters(tree) -> list[Parameter]:
    """All Parameter nodes of a model, in pytree order."""
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_parameter)
    return [p for p in leaves if is_parameter(p)]


def trainable_mask(tree: PyTree) -> PyTree[bool]:
    """Boolean pytree: True exactly on the raw arrays of trainable Parameters."""

    def mark(x):
        flag = is_parameter(x) and x.trainable
        return jax.tree_util.tree_map(lambda _: flag, x)

    return jax.tree_util.tree_map(mark, tree, is_leaf=is_parameter)


def partition_trainable(tree: PyTree) -> tuple[PyTree, PyTree]:
    """(trainable, static) such that ``eqx.combine(trainable, static) == tree``."""
    return eqx.partition(tree, trainable_mask(tree))


def log_prior(tree) -> jax.Array:
    """Sum of the log prior densities of all Parameters that carry a prior."""
    total = jnp.zeros(())
    for p in parameters(tree):
        if p.prior is not None:
            total = total + jnp.sum(p.prior.log_prob(p.value))
    return total
