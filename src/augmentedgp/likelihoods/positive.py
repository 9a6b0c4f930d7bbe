"""Likelihoods for positive and unit-interval targets: Gamma and Beta."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.stats
import numpy as np
from jax.scipy.special import gammaln
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.params import Parameter, positive, scalar_positive
from augmentedgp.core.quadrature import adaptive_log_gauss_hermite
from augmentedgp.core.validation import check_finite, require_finite
from augmentedgp.likelihoods.base import Likelihood

_LOG_2 = math.log(2.0)


def _inside(y, name, lo, hi, what):
    """Finite targets strictly inside (lo, hi), else a ValueError naming the range found."""
    arr = check_finite(y, name)
    if np.any((arr <= lo) | (arr >= hi)):
        raise ValueError(f"{name} must be {what}, got values in [{arr.min()}, {arr.max()}]")
    return arr


class Gamma(Likelihood):
    """y ~ Gamma(shape, rate = shape e^{-f}): positive y with mean e^f, variance e^{2f}/shape.

    ``shape``: a positive scalar (a ValueError naming it otherwise). Overflow rule: every
    returned quantity whose true value is a float64 number comes out finite
    (``predictive_log_prob`` by adaptive Gauss-Hermite in log space, the moments in log
    space); where the true value itself exceeds float64 -- E[y] = e^{m + v/2} or
    E[e^{-f}] in ``variational_expectations`` with m + v/2 or v/2 - m above ~709 -- a call on
    concrete values raises a ValueError saying what overflowed (under jit the value is inf:
    ``predict_y`` of the models checks it).
    """

    log_concave = True  # d^2/df^2 log p = -shape y e^{-f} < 0

    support = "positive"
    shape: Parameter

    def __init__(self, shape=1.0):
        self.shape = scalar_positive(shape, "Gamma shape")

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return _inside(y, name, 0.0, np.inf, "strictly positive for a Gamma likelihood")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        k = self.shape.value
        # k log(k e^{-f}) - log Gamma(k) + (k - 1) log y - k e^{-f} y
        return (k * (jnp.log(k) - f) - gammaln(k) + (k - 1.0) * jnp.log(y)
                - k * y * jnp.exp(-f))

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        k = self.shape.value
        return k * (y * jnp.exp(-f) - 1.0)

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return -self.shape.value * y * jnp.exp(-f)

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        k = self.shape.value
        # E[e^{-f}] = exp(-m + v/2)
        value = (k * (jnp.log(k) - mean) - gammaln(k) + (k - 1.0) * jnp.log(y)
                 - k * y * jnp.exp(-mean + 0.5 * var))
        return require_finite("Gamma variational_expectations: shape * y * E[e^{-f}] = "
                               "shape * y * exp(-mean + var / 2)", value)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log int Gamma(y | shape, shape e^{-f}) N(f | mean, var) df by adaptive
        Gauss-Hermite in log space around the mode of the (log-concave) integrand, which
        lies between the latent mean and log y: finite for any finite mean and variance."""
        k = self.shape.value
        y, mean, var = jnp.broadcast_arrays(jnp.asarray(y, float), jnp.asarray(mean, float),
                                            jnp.asarray(var, float))
        v = jnp.maximum(var, 1e-300)
        yy, m, vv = y[..., None], mean[..., None], v[..., None]
        h = lambda f: self.log_prob(yy, f) + jax.scipy.stats.norm.logpdf(f, m, jnp.sqrt(vv))
        dh = lambda f: k * (y * jnp.exp(-f) - 1.0) - (f - mean) / v
        log_y = jnp.log(y)
        # 200 nodes: ~1e-11 relative also where the prior is flat (var 1e6) and the
        # integrand has the skewed log-gamma shape (100 nodes: ~1e-8)
        return adaptive_log_gauss_hermite(h, dh, jnp.minimum(mean, log_y),
                                          jnp.maximum(mean, log_y), 200)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.exp(f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.exp(2.0 * f) / self.shape.value

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        # E[y] = e^{m + v/2}; E[y^2] = (1 + 1/k) e^{2m + 2v}, so, in log space,
        # Var[y] = e^{2m + 2v} (1 + 1/k - e^{-v})
        ey = jnp.exp(mean + 0.5 * var)
        vy = jnp.exp(2.0 * (mean + var) + jnp.log1p(1.0 / self.shape.value - jnp.exp(-var)))
        return require_finite("Gamma predict_y: the predictive mean e^{mean + var/2} or "
                               "variance e^{2 mean + 2 var} (1 + 1/shape - e^{-var})", ey, vy)


class Beta(Likelihood):
    """y ~ Beta(mu precision, (1 - mu) precision), mu = sigmoid(f): y in (0, 1) with mean mu,
    variance mu (1 - mu) / (1 + precision).

    ``precision``: a positive scalar (a ValueError naming it otherwise). Every returned
    quantity is finite for finite latent moments: log p(y | f) is computed with log Gamma(a)
    = log Gamma(1 + a) - log a and log a = log precision + log sigmoid(f), so it stays finite
    where a = precision sigmoid(f) underflows (|f| > ~745).
    """

    support = "unit"
    precision: Parameter

    def __init__(self, precision=10.0):
        self.precision = positive(precision, "beta precision", max_ndim=0)

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return _inside(y, name, 0.0, 1.0, "inside (0, 1) for a Beta likelihood")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        phi = self.precision.value
        a, b = phi * jax.nn.sigmoid(f), phi * jax.nn.sigmoid(-f)  # 1 - sigmoid(f) = sigmoid(-f)
        # log Gamma(a) = log Gamma(1 + a) - log a, log a = log phi + log sigmoid(f): finite
        # where a underflows to 0 (|f| > ~745), where gammaln(a) was inf
        log_phi = jnp.log(phi)
        lg_a = gammaln(1.0 + a) - log_phi - jax.nn.log_sigmoid(f)
        lg_b = gammaln(1.0 + b) - log_phi - jax.nn.log_sigmoid(-f)
        return (gammaln(phi) - lg_a - lg_b + (a - 1.0) * jnp.log(y)
                + (b - 1.0) * jnp.log1p(-y))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        # 20 nodes leave ~1e-6 at var = 2; 64 nodes ~1e-13 up to var = 2, ~1e-9 at var = 4
        return super().variational_expectations(y, mean, var, 64 if n is None else n)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jax.nn.sigmoid(f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jax.nn.sigmoid(f) * jax.nn.sigmoid(-f) / (1.0 + self.precision.value)
