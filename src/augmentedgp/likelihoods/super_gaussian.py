"""A likelihood declared by its super-Gaussian pieces: automated augmented inference
([Galy-Fajou2020], the paper's Theorems 1-2 and Algorithms 1-2) for a likelihood the
library does not have."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.augmentation import inversion
from augmentedgp.augmentation.protocol import ScaleMixture, SuperGaussianForm
from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.quadrature import kinked_expectation
from augmentedgp.core.validation import check_binary, check_counts, check_finite, is_concrete
from augmentedgp.likelihoods.base import Likelihood

_SUPPORTS = ("real", "binary", "counts")


def _piece(value, name: str) -> Callable:
    """A piece given as a number or a callable ``fn(y, **params)``, as a callable."""
    if callable(value):
        return value
    try:
        const = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"SuperGaussian: {name} must be a number or a function "
                        f"{name}(y, **params), got {value!r}") from None
    if not np.isfinite(const):
        raise ValueError(f"SuperGaussian: {name} must be finite, got {value!r}")
    return lambda y, **p: jnp.full(jnp.shape(y), const)


class SuperGaussian(Likelihood, ScaleMixture):
    """A likelihood given by its pieces ([Galy-Fajou2020, eqs. 4-5]),

        p(y | f) = exp(log_c(y) + g(y) f) phi(h^2),   h = a(y) + b(y) f,

    with phi completely monotone and phi(0) = 1 (``log_phi(t)`` = log phi(t)). Nothing else
    is needed: it is conditionally conjugate by its type, so ``AnalyticVI``, ``AnalyticSVI``
    and the Gibbs sampler (``MCGP``) accept it. Variational inference uses E[w] =
    -d log phi / dt by autodiff; Gibbs sampling draws w from the tilted law
    pi(w | h^2) ~ e^{-h^2 w} p(w) by numerical inversion of phi's Laplace transform
    (``augmentation.inversion``; CDF accurate to ~1e-8), unless ``sample_omega`` gives an
    exact sampler.

    ``log_c``, ``g``, ``a``, ``b``: numbers or functions ``fn(y, **params)``, elementwise
    in y. ``log_phi``: a function ``log_phi(t, **params)``, elementwise, that also
    evaluates at complex t as phi's analytic continuation (write it with ``jnp.sqrt``,
    ``jnp.log1p``, ``jnp.power``, ``jnp.exp``; not ``jnp.abs``, ``jnp.maximum`` or
    comparisons of t), which the inversion needs. ``params``: the hyperparameters, a
    mapping of names to numbers (each becomes a trainable positive :class:`Parameter`) or
    Parameters (``augmentedgp.params.real``, ``fixed``, ...); the functions receive their
    values as keywords. ``mean``, ``variance``: functions ``fn(f, **params)`` giving
    E[y | f] and Var[y | f], needed to predict y (``predict_y``); for binary targets they
    default to p(y = +1 | f) and p (1 - p). ``support``: "real" (default), "binary"
    (labels in {-1, +1}, {0, 1} accepted) or "counts". ``sample_omega``: an optional
    exact sampler ``fn(key, t, **params)`` of pi(w | t), replacing the numerical one.
    ``name``: used in messages.

    The constructor checks that phi is admissible (phi(0) = 1, completely monotone to
    sixth order on a grid, analytic at complex t: ``inversion.check_phi``) and raises a
    ValueError naming what fails. It checks the parameters' values at construction: fix
    (``augmentedgp.params.fixed``) a parameter whose training could leave the admissible
    range (the generalised Gaussian's shape above 2, say). Being code, a SuperGaussian
    cannot be saved by :func:`augmentedgp.save`.
    """

    params: dict[str, Parameter]
    support: str = eqx.field(static=True)
    name: str = eqx.field(static=True)
    form: SuperGaussianForm = eqx.field(static=True)  # the functions log_c, g, a, b of y
    log_phi_fn: Callable = eqx.field(static=True)
    mean_fn: Callable | None = eqx.field(static=True)
    variance_fn: Callable | None = eqx.field(static=True)
    sampler: Callable | None = eqx.field(static=True)

    def __init__(self, log_phi: Callable, *, log_c=0.0, g=0.0, a=0.0, b=1.0,
                 params: Mapping | None = None, mean: Callable | None = None,
                 variance: Callable | None = None, support: str = "real",
                 sample_omega: Callable | None = None, name: str = "SuperGaussian"):
        if not callable(log_phi):
            raise TypeError(f"{name}: log_phi must be a function log_phi(t, **params), got "
                            f"{log_phi!r}")
        if support not in _SUPPORTS:
            raise ValueError(f"{name}: support must be one of {_SUPPORTS}, got {support!r}")
        for label, fn in (("mean", mean), ("variance", variance), ("sample_omega", sample_omega)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}: {label} must be a function or None, got {fn!r}")
        self.params = {str(k): positive(v, f"{name} parameter {k!r}")
                       for k, v in dict(params or {}).items()}
        self.support, self.name = support, name
        self.form = SuperGaussianForm(log_c=_piece(log_c, "log_c"), g=_piece(g, "g"),
                                      a=_piece(a, "a"), b=_piece(b, "b"))
        self.log_phi_fn, self.sampler = log_phi, sample_omega
        self.mean_fn, self.variance_fn = mean, variance
        values = self._values()
        if all(is_concrete(v) for v in values.values()):
            inversion.check_phi(lambda t: log_phi(t, **values), what=name,
                                complex_step=sample_omega is None)

    def _values(self) -> dict:
        return {k: p.value for k, p in self.params.items()}

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        if self.support == "binary":
            return check_binary(y, name)
        if self.support == "counts":
            return check_counts(y, name)
        return check_finite(y, name)

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        p = self._values()
        shape = jnp.shape(y)
        return SuperGaussianForm(*(jnp.broadcast_to(fn(y, **p), shape) for fn in self.form))

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        return self.log_phi_fn(t, **self._values())

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        s = self.super_gaussian(y)
        return s.log_c + s.g * f + self.log_phi(y, (s.a + s.b * f) ** 2)

    def _kink(self, y):
        """Where h = 0, the one point where log phi(h^2) may be non-smooth in f (a completely
        monotone phi is analytic on (0, inf)), as (..., 1); far out where b = 0."""
        s = self.super_gaussian(y)
        b = jnp.where(s.b == 0.0, 1.0, s.b)
        return jnp.where(s.b == 0.0, 1e300, -s.a / b)[..., None]

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """Gauss-Legendre panels split at h = 0 (``kinked_expectation``, ``n`` nodes per
        panel, None: 20)."""
        return kinked_expectation(lambda f: self.log_prob(y[..., None, None], f), mean,
                                  var, self._kink(y), 20 if n is None else n)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log int p(y | f) N(f | mean, var) df, Gauss-Legendre split at h = 0."""
        return kinked_expectation(lambda f: self.log_prob(y[..., None, None], f), mean,
                                  var, self._kink(y), 20, log=True)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        if self.mean_fn is not None:
            return self.mean_fn(f, **self._values())
        if self.support == "binary":
            return jnp.exp(self.log_prob(jnp.ones_like(f), f))  # p(y = +1 | f)
        raise ValueError(f"{self.name}: E[y | f] is not known; pass mean=fn(f, **params) "
                         "(and variance=) to SuperGaussian to predict y")

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        if self.variance_fn is not None:
            return self.variance_fn(f, **self._values())
        if self.support == "binary":
            p = self.conditional_mean(f)
            return p * (1.0 - p)
        raise ValueError(f"{self.name}: Var[y | f] is not known; pass variance=fn(f, **params)"
                         " to SuperGaussian to predict y")

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        """w ~ pi(w | t): ``sample_omega`` if given, else the numerical inversion."""
        if self.sampler is not None:
            return self.sampler(key, t, **self._values())
        return super().sample_omega(key, y, t)


__all__ = ["SuperGaussian"]
