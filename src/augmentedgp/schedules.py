"""Step-size schedules rho(t) for natural-gradient steps (t = 0, 1, ... is the step)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp


class Schedule(eqx.Module):
    def __call__(self, t):
        raise NotImplementedError


class Constant(Schedule):
    """rho(t) = value."""

    value: float = 1.0

    def __init__(self, value: float = 1.0):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"a natural-gradient step size must be in (0, 1], got {value}")
        self.value = float(value)

    def __call__(self, t):
        return jnp.asarray(self.value)


class Warmup(Schedule):
    """Geometric ramp from ``start`` to ``end`` over ``steps`` steps, then ``end``
    (seed 001 section 4.1.3: 1e-4 to 1e-1 over 40 iterations)."""

    start: float = 1e-4
    end: float = 1e-1
    steps: int = 40

    def __init__(self, start: float = 1e-4, end: float = 1e-1, steps: int = 40):
        if not (0.0 < start <= 1.0 and 0.0 < end <= 1.0) or steps < 1:
            raise ValueError("Warmup needs 0 < start, end <= 1 and steps >= 1")
        self.start, self.end, self.steps = float(start), float(end), int(steps)

    def __call__(self, t):
        frac = jnp.minimum(t / max(self.steps - 1, 1), 1.0)
        return jnp.exp((1 - frac) * jnp.log(self.start) + frac * jnp.log(self.end))


class RobbinsMonro(Schedule):
    """rho(t) = (t + tau)^-kappa with 0.5 < kappa <= 1 (sum rho = inf, sum rho^2 < inf;
    Robbins & Monro 1951, Hoffman et al. 2013)."""

    kappa: float = 0.51
    tau: float = 1.0

    def __init__(self, kappa: float = 0.51, tau: float = 1.0):
        if not 0.5 < kappa <= 1.0 or tau < 1.0:
            raise ValueError(f"RobbinsMonro needs 0.5 < kappa <= 1 and tau >= 1, got {kappa}, "
                             f"{tau}")
        self.kappa, self.tau = float(kappa), float(tau)

    def __call__(self, t):
        return (t + self.tau) ** (-self.kappa)


def as_schedule(step_size) -> Schedule:
    return step_size if isinstance(step_size, Schedule) else Constant(step_size)


__all__ = ["Schedule", "Constant", "Warmup", "RobbinsMonro", "as_schedule"]
