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

# --- bijections: unconstrained raw <-> constrained value -------------------------------


@dataclasses.dataclass(frozen=True)
class Identity:
    """The identity bijection (unconstrained real parameters)."""

    def forward(self, raw):
        return raw

    def inverse(self, value):
        return value


@dataclasses.dataclass(frozen=True)
class Softplus:
    """value = softplus(raw), value > 0; smoother than exp for large values."""

    def forward(self, raw):
        return jax.nn.softplus(raw)

    def inverse(self, value):
        value = jnp.asarray(value)
        return value + jnp.log(-jnp.expm1(-value))  # softplus^{-1}, stable for small values


@dataclasses.dataclass(frozen=True)
class Exp:
    """value = exp(raw): optimisers move in log-space (scale-free steps; the default)."""

    def forward(self, raw):
        return jnp.exp(raw)

    def inverse(self, value):
        return jnp.log(jnp.asarray(value))


# --- priors on the constrained value (no Jacobian: the MAP is a mode in value space) ---


@dataclasses.dataclass(frozen=True)
class Normal:
    """A normal prior N(loc, scale^2) on the parameter value."""

    loc: float = 0.0
    scale: float = 1.0

    def log_prob(self, x):
        return stats.norm.logpdf(x, self.loc, self.scale)


@dataclasses.dataclass(frozen=True)
class LogNormal:
    """A log-normal prior: log(value) ~ N(loc, scale^2)."""

    loc: float = 0.0
    scale: float = 1.0

    def log_prob(self, x):
        return stats.norm.logpdf(jnp.log(x), self.loc, self.scale) - jnp.log(x)


@dataclasses.dataclass(frozen=True)
class Gamma:
    """Gamma(shape, rate)."""

    shape: float = 1.0
    rate: float = 1.0

    def log_prob(self, x):
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


def _as_float_array(value, name):
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return arr


def positive(value, name: str = "parameter", *, prior=None, trainable: bool = True,
             transform: Exp | Softplus = Exp()) -> Parameter:
    """A strictly positive parameter. ``value`` may be an array (ARD).

    The default transform is exp (log-space optimisation, as in GPML and scikit-learn):
    gradient steps are relative changes, so lengthscales of irrelevant inputs can grow
    by orders of magnitude; ``Softplus()`` is the alternative.
    """
    if isinstance(value, Parameter):
        return value
    arr = _as_float_array(value, name)
    if not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return Parameter(transform.inverse(jnp.asarray(arr)), transform, prior, trainable)


def real(value, name: str = "parameter", *, prior=None, trainable: bool = True) -> Parameter:
    """An unconstrained real parameter (identity transform)."""
    if isinstance(value, Parameter):
        return value
    arr = _as_float_array(value, name)
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


def trainable_mask(tree):
    """Boolean pytree: True exactly on the raw arrays of trainable Parameters."""

    def mark(x):
        flag = is_parameter(x) and x.trainable
        return jax.tree_util.tree_map(lambda _: flag, x)

    return jax.tree_util.tree_map(mark, tree, is_leaf=is_parameter)


def partition_trainable(tree):
    """(trainable, static) such that ``eqx.combine(trainable, static) == tree``."""
    return eqx.partition(tree, trainable_mask(tree))


def log_prior(tree) -> jax.Array:
    """Sum of the log prior densities of all Parameters that carry a prior."""
    total = jnp.zeros(())
    for p in parameters(tree):
        if p.prior is not None:
            total = total + jnp.sum(p.prior.log_prob(p.value))
    return total
