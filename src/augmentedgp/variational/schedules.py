"""Step-size schedules rho(t) for natural-gradient steps (t = 0, 1, ... is the step).

The training loop asks ``rate(state, t, direction)`` -> (rho, state), with ``state`` from
``init(size)`` and ``direction`` the current natural gradient (flattened), so a schedule
may adapt to the gradients it sees (``Adaptive``); the others are functions of t alone.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from augmentedgp.core.validation import check_int, check_positive, check_real

#: The state of :class:`Adaptive`: running means of the direction and of its squared norm,
#: and the memory tau.
AdaptiveState = tuple[Float[Array, " p"], Float[Array, ""], Float[Array, ""]]


class Schedule(eqx.Module):
    """Base class of step-size schedules: ``schedule(t)`` is the step size at iteration t."""

    def __call__(self, t):
        raise NotImplementedError

    def init(self, size: int) -> PyTree:
        """The initial state for directions of length ``size``."""
        return None

    def rate(self, state: PyTree, t: Int[Array, ""], direction: Float[Array, " p"]
            ) -> tuple[Float[Array, ""], PyTree]:
        """(rho at step t, the next state)."""
        return self(t), state


class Constant(Schedule):
    """rho(t) = value."""

    value: float = 1.0

    def __init__(self, value: float = 1.0):
        self.value = check_real(value, "value", low=0.0, high=1.0, open_low=True)

    def __call__(self, t):
        return jnp.asarray(self.value)


class Warmup(Schedule):
    """Geometric ramp from ``start`` to ``end`` over ``steps`` steps, then ``end``
    ([Kobe2021, Sec. 4.1.3]: 1e-4 to 1e-1 over 40 iterations)."""

    start: float = 1e-4
    end: float = 1e-1
    steps: int = 40

    def __init__(self, start: float = 1e-4, end: float = 1e-1, steps: int = 40):
        self.start, self.end = (check_real(v, n, low=0.0, high=1.0, open_low=True)
                                  for v, n in ((start, "start"), (end, "end")))
        self.steps = check_int(steps, "steps")

    def __call__(self, t):
        frac = jnp.minimum(t / max(self.steps - 1, 1), 1.0)
        return jnp.exp((1 - frac) * jnp.log(self.start) + frac * jnp.log(self.end))


class RobbinsMonro(Schedule):
    """rho(t) = (t + tau)^-kappa with 0.5 < kappa <= 1 (sum rho = inf, sum rho^2 < inf;
    Robbins & Monro 1951, Hoffman et al. 2013)."""

    kappa: float = 0.51
    tau: float = 1.0

    def __init__(self, kappa: float = 0.51, tau: float = 1.0):
        kappa, tau = check_positive(kappa, "kappa"), check_positive(tau, "tau")
        if not 0.5 < kappa <= 1.0:
            raise ValueError(f"kappa must be in (0.5, 1] (RobbinsMonro), got {kappa}")
        if tau < 1.0:
            raise ValueError(f"tau must be >= 1 (RobbinsMonro), got {tau}")
        self.kappa, self.tau = kappa, tau

    def __call__(self, t):
        return (t + self.tau) ** (-self.kappa)


class Adaptive(Schedule):
    """The adaptive learning rate of Ranganath et al. (2013) for stochastic VI:
    with running averages g_bar = (1 - 1/tau) g_bar + g / tau and h_bar = (1 - 1/tau) h_bar
    + g^T g / tau of the natural gradient g, rho = g_bar^T g_bar / h_bar (in [0, 1]: small
    when the minibatch gradients disagree) and tau <- tau (1 - rho) + 1.

    The averages start as plain means of the first ``init_steps`` gradients, during which
    q does not move (rho = 0; Ranganath et al. initialise from Monte Carlo estimates at the
    starting point), and tau starts at ``init_steps``.
    """

    init_steps: int = 10

    def __init__(self, init_steps: int = 10):
        self.init_steps = check_int(init_steps, "init_steps")

    def __call__(self, t):
        raise TypeError("Adaptive depends on the gradients: use rate(state, t, direction)")

    def init(self, size: int) -> AdaptiveState:
        return jnp.zeros(size), jnp.zeros(()), jnp.asarray(float(self.init_steps))

    def rate(self, state: AdaptiveState, t: Int[Array, ""], direction: Float[Array, " p"]
             ) -> tuple[Float[Array, ""], AdaptiveState]:
        g_bar, h_bar, tau = state
        warm = t < self.init_steps
        w = jnp.where(warm, 1.0 / (t + 1.0), 1.0 / tau)
        g_bar = (1.0 - w) * g_bar + w * direction
        h_bar = (1.0 - w) * h_bar + w * jnp.sum(direction**2)
        rho = jnp.where(warm, 0.0, jnp.sum(g_bar**2) / jnp.maximum(h_bar, 1e-300))
        rho = jnp.clip(rho, 0.0, 1.0)
        tau = jnp.where(warm, tau, tau * (1.0 - rho) + 1.0)
        return rho, (g_bar, h_bar, tau)


def as_schedule(step_size, name: str = "step_size") -> Schedule:
    """A Schedule as is, or a constant one from a number in (0, 1] (a ValueError naming
    ``name`` otherwise)."""
    if isinstance(step_size, Schedule):
        return step_size
    return Constant(check_real(step_size, name, low=0.0, high=1.0, open_low=True))


__all__ = ["Schedule", "Constant", "Warmup", "RobbinsMonro", "Adaptive", "as_schedule"]
