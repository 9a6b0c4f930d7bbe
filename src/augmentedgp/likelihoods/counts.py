"""Count likelihoods: Poisson (exponential and scaled-logistic links) and
negative binomial."""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, xlogy
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree, Shaped

from augmentedgp.augmentation import log_cosh_sqrt, samplers, tanh_ratio
from augmentedgp.augmentation.protocol import Augmented, CountAux, PolyaGamma, SuperGaussianForm
from augmentedgp.core.params import Parameter, scalar_positive
from augmentedgp.core.validation import check_counts, check_positive, require_finite
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.quantiles import count_quantile

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


class Poisson(Likelihood):
    """y ~ Poisson(binsize * exp(f)), y = 0, 1, 2, ... ``integer=False`` also accepts
    non-negative real y, with the same log density (the quasi-Poisson likelihood of
    scikit-learn's PoissonRegressor)."""

    support = "counts"
    log_concave = True
    binsize: float = eqx.field(static=True)
    integer: bool = eqx.field(static=True)

    def __init__(self, binsize=1.0, integer: bool = True):
        self.binsize = check_positive(binsize, "binsize")
        self.integer = bool(integer)

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return check_counts(y, name, integer=self.integer)

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        # y log(b e^f) - b e^f - log y!
        return y * (f + math.log(self.binsize)) - self.binsize * jnp.exp(f) - gammaln(y + 1.0)

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return y - self.binsize * jnp.exp(f)

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return jnp.broadcast_to(-self.binsize * jnp.exp(f),
                                jnp.broadcast_shapes(jnp.shape(y), jnp.shape(f)))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        # E[e^f] = exp(m + v/2) (lognormal mean)
        return (y * (mean + math.log(self.binsize)) - self.binsize * jnp.exp(mean + 0.5 * var)
                - gammaln(y + 1.0))

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.binsize * jnp.exp(f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.binsize * jnp.exp(f)

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        # E[y] = b e^{m + v/2}; Var[y] = E[y] + b^2 (e^v - 1) e^{2m + v}, in log space
        # (log(e^v - 1) = v + log1p(-e^{-v})): finite wherever the true value is; a value
        # beyond float64 raises on concrete input (under jit it is inf: models check it)
        log_ey = jnp.log(self.binsize) + mean + 0.5 * var
        v = jnp.maximum(var, 1e-300)
        ey = jnp.exp(log_ey)
        return require_finite("Poisson predict_y: the predictive mean or variance",
                              ey, ey + jnp.exp(2.0 * log_ey + v + jnp.log1p(-jnp.exp(-v))))

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y ~ Poisson(binsize e^f), f ~ N(mean, var): the
        smallest count whose predictive CDF reaches ``level`` (numpy):
        :func:`~augmentedgp.likelihoods.quantiles.count_quantile`."""
        import scipy.stats

        return count_quantile(lambda f: scipy.stats.poisson(self.binsize * np.exp(f)), mean,
                              var, level)


class PoissonTilt(NamedTuple):
    """q(n, w) = Po(n | n_mean) PG(w | y + n, c) (with w the Polya-Gamma variable / 2)."""

    c2: jax.Array
    n_mean: jax.Array


class LogisticPoisson(Likelihood, Augmented):
    """y ~ Poisson(rate * sigmoid(f)): counts with a bounded intensity ([Donner2018];
    the Poisson augmentation of [Galy-Fajou2019, Sec. 3.2]). Augmentation: e^{-rate sigmoid(f)}
    = e^{-rate} sum_n (rate sigmoid(-f))^n / n! adds a latent count n | f ~ Po(rate sigmoid(-f))
    (sigma(-f): the conditional printed in [Galy-Fajou2019, Sec. 3.2] has sigma(f)), then
    sigmoid(f)^y sigmoid(-f)^n is Polya-Gamma with b = y + n. The
    optimal q(n) is Poisson with mean rate e^{-m/2} / (2 cosh(c/2)), c^2 = E[f^2]."""

    support = "counts"
    rate: Parameter

    def __init__(self, rate=1.0):
        self.rate = scalar_positive(rate, "Poisson maximum rate")

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return check_counts(y, name)

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        lam = self.rate.value
        return (y * (jnp.log(lam) + jax.nn.log_sigmoid(f)) - lam * jax.nn.sigmoid(f)
                - gammaln(y + 1.0))

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.rate.value * jax.nn.sigmoid(f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.rate.value * jax.nn.sigmoid(f)

    def aux_posterior(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                      var: Float[Array, " n"]) -> tuple:
        c2 = mean**2 + var
        return PoissonTilt(c2, jnp.exp(jnp.log(self.rate.value) - 0.5 * mean - _LOG_2
                                       - log_cosh_sqrt(c2)))

    def aux_sites(self, y: Shaped[Array, " n"], q_aux: tuple
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        b = y + q_aux.n_mean
        return 0.5 * (y - q_aux.n_mean), b * tanh_ratio(jnp.sqrt(q_aux.c2))

    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, " n"], f: Float[Array, "*batch"]
                  ) -> PyTree[Array]:
        """n ~ Po(rate sigmoid(-f)), then w ~ PG(y + n, |f|) / 2 (sigma(-f), not the sigma(f)
        printed in [Galy-Fajou2019, Sec. 3.2])."""
        kn, kw = jax.random.split(key)
        n = jax.random.poisson(kn, self.rate.value * jax.nn.sigmoid(-f)).astype(f.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, y + n, f))

    def sites(self, y: Shaped[Array, " n"], aux: PyTree[Array]
             ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        return 0.5 * (y - aux.n), 2.0 * aux.w

    def augmented_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                               var: Float[Array, " n"], q_aux: tuple | None = None
                              ) -> Float[Array, " n"]:
        """E_q[log p(y, n, w | f)] - E_q[log q(n, w)] (the n-prior depends on f, so it is
        in the first term); at the optimal q equal to
        y m / 2 - y log(2 cosh(c/2)) + y log rate - rate - log y! + E[n]."""
        lam = self.rate.value
        opt = q_aux is None
        q = self.aux_posterior(y, mean, var) if opt else q_aux
        mu, log_2cosh = q.n_mean, _LOG_2 + log_cosh_sqrt(q.c2)
        base = y * jnp.log(lam) - lam - gammaln(y + 1.0)
        if opt:
            return base + 0.5 * y * mean - y * log_2cosh + mu
        e_w = 0.5 * (y + mu) * tanh_ratio(jnp.sqrt(q.c2))
        return (base + 0.5 * (y - mu) * mean - e_w * (mean**2 + var - q.c2)
                - (y + mu) * log_2cosh + mu * jnp.log(lam) - xlogy(mu, mu) + mu)


class NegativeBinomial(Likelihood, PolyaGamma):
    """Counts with p(y | f) = Gamma(y + r) / (Gamma(r) y!) sigmoid(f)^y sigmoid(-f)^r:
    mean r e^f, variance r e^f (1 + e^f) (overdispersed Poisson; Poisson as r -> inf).

    Augmentation: sigmoid(f)^y sigmoid(-f)^r = 2^{-(y + r)} e^{(y - r) f / 2}
    cosh(f / 2)^{-(y + r)}, Polya-Gamma with b = y + r (Polson et al. 2013).
    ``integer=False`` also accepts non-negative real y (the same density, gamma functions
    for the factorials)."""

    support = "counts"
    log_concave = True  # d^2/df^2 = -(y + r) sigmoid(f) sigmoid(-f)
    r: Parameter
    integer: bool = eqx.field(static=True)

    def __init__(self, r=1.0, integer: bool = True):
        self.r = scalar_positive(r, "negative-binomial dispersion r")
        self.integer = bool(integer)

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return check_counts(y, name, integer=self.integer)

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        r = self.r.value
        return (gammaln(y + r) - gammaln(r) - gammaln(y + 1.0)
                + y * jax.nn.log_sigmoid(f) + r * jax.nn.log_sigmoid(-f))

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return y * jax.nn.sigmoid(-f) - self.r.value * jax.nn.sigmoid(f)

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return -(y + self.r.value) * jax.nn.sigmoid(f) * jax.nn.sigmoid(-f)

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        # 20 nodes leave ~1e-7 at var = 2; 64 nodes ~1e-13 up to var = 2, ~1e-10 at var = 4
        return super().variational_expectations(y, mean, var, 64 if n is None else n)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.r.value * jnp.exp(f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return self.r.value * jnp.exp(f) * (1.0 + jnp.exp(f))  # mu + mu^2 / r

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        # E[y] = r e^{m + v/2}; Var[y] = E[y] + r (r + 1) e^{2m + 2v} - E[y]^2
        r = self.r.value  # in log space as Poisson's: e^v (1 + 1/r) - 1 = e^v (1 + 1/r - e^-v)
        log_ey = jnp.log(r) + mean + 0.5 * var
        ey = jnp.exp(log_ey)
        extra = jnp.exp(2.0 * log_ey + var + jnp.log(1.0 + 1.0 / r - jnp.exp(-var)))
        return require_finite("NegativeBinomial predict_y: the predictive mean or variance",
                              ey, ey + extra)

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y, f ~ N(mean, var): the smallest count whose
        predictive CDF reaches ``level`` (numpy):
        :func:`~augmentedgp.likelihoods.quantiles.count_quantile`."""
        import scipy.special
        import scipy.stats

        r = float(self.r.value)  # mean r e^f: scipy's nbinom(n = r, p = sigmoid(-f))
        return count_quantile(lambda f: scipy.stats.nbinom(r, scipy.special.expit(-f)), mean,
                              var, level)

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        """sigmoid(f)^y sigmoid(-f)^r = 2^{-(y + r)} e^{(y - r) f / 2} cosh(f / 2)^{-(y + r)}."""
        r = self.r.value
        log_c = gammaln(y + r) - gammaln(r) - gammaln(y + 1.0) - (y + r) * _LOG_2
        return SuperGaussianForm(log_c, 0.5 * (y - r), 0.0, 1.0)

    def pg_b(self, y: Shaped[Array, "*batch"]) -> Float[Array, "*batch"] | float:
        """b = y + r."""
        return y + self.r.value
