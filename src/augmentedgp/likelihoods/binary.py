"""Binary classification likelihoods (labels in {-1, +1})."""

from __future__ import annotations

import abc
import math

import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr, logsumexp, ndtr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import PolyaGamma, ScaleMixture, SuperGaussianForm
from augmentedgp.core.quadrature import (
    gauss_hermite,
    kinked_expectation,
    laguerre_nodes,
    log_gauss_hermite,
)
from augmentedgp.core.validation import check_binary
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.numerics import log_inv_gamma, sqrt_floor

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


class Bernoulli(Likelihood):
    """Binary y in {-1, +1} (users may pass {0, 1}). Subclasses give ``log_prob`` and
    ``predict_proba``."""

    support = "binary"

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return check_binary(y, name)

    @abc.abstractmethod
    def predict_proba(self, mean: Float[Array, " n"], var: Float[Array, " n"]
                     ) -> Float[Array, " n"]:
        """p(y = +1) = int p(y = +1 | f) N(f | mean, var) df."""

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """p(y = +1) and its variance p (1 - p) (``n`` is not used)."""
        p = self.predict_proba(mean, var)
        return p, p * (1.0 - p)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.exp(self.log_prob(jnp.ones_like(f), f))  # p(y = +1 | f)

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        p = self.conditional_mean(f)
        return p * (1.0 - p)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log p(y | data), elementwise. This default takes the log of p(y = +1) or of
        1 - p(y = +1) and underflows to -inf once that probability is below 1e-308;
        the subclasses here compute it in log space (finite for every finite mean and
        variance)."""
        p = self.predict_proba(mean, var)
        return jnp.log(jnp.where(y > 0, p, 1.0 - p))


class Logistic(Bernoulli, PolyaGamma):
    """p(y | f) = 1 / (1 + exp(-y f)) = e^{y f / 2} / (2 cosh(f / 2)); augmented with
    Polya-Gamma variables, q(w) = PG(1, c) ([Wenzel2019, Sec. 3.1])."""

    log_concave = True  # d^2/df^2 log sigmoid(y f) = -sigmoid(f) sigmoid(-f)

    pg_method = "devroye"  # b = 1: exact

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        """sigmoid(y f) = e^{y f / 2} / (2 cosh(f / 2)): log C = -log 2, g = y / 2, h = f."""
        return SuperGaussianForm(-_LOG_2, 0.5 * y, 0.0, 1.0)

    def pg_b(self, y: Shaped[Array, "*batch"]) -> Float[Array, "*batch"] | float:
        """b = 1."""
        return 1.0

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        return -jax.nn.softplus(-y * f)

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return y * jax.nn.sigmoid(-y * f)  # = (y + 1)/2 - sigmoid(f)   ([Rasmussen2006, Sec. 3.4])

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return -jax.nn.sigmoid(f) * jax.nn.sigmoid(-f)

    def predict_proba(self, mean: Float[Array, " n"], var: Float[Array, " n"]
                     ) -> Float[Array, " n"]:
        """int sigmoid(f) N(f | m, v) df, accurate to ~1e-12 for any variance.

        Small v: Gauss-Hermite. Large v (the sigmoid's step is narrow against the Gaussian):
        sigmoid(f) = 1[f > 0] - sign(f) sigmoid(-|f|) gives
        Phi(m / sqrt(v)) + int_0^inf e^{-x} sigmoid(x) [N(-x | m, v) - N(x | m, v)] dx,
        a smooth integrand for Gauss-Laguerre.
        """
        mean, var = jnp.asarray(mean), jnp.asarray(var)
        small = gauss_hermite(jax.nn.sigmoid, mean, var, 64)
        return jnp.where(var < 3.0, small, self._proba_laguerre(mean, var))

    @staticmethod
    def _proba_laguerre(mean, var):
        """``predict_proba``'s large-variance form (Gauss-Laguerre)."""
        x, w = laguerre_nodes()
        v = jnp.maximum(var, 1e-12)[..., None]
        m = mean[..., None]
        dens = lambda t: jnp.exp(-0.5 * (t - m) ** 2 / v) / jnp.sqrt(2.0 * math.pi * v)
        return ndtr(mean / jnp.sqrt(jnp.maximum(var, 1e-12))) + jnp.sum(
            w * jax.nn.sigmoid(x) * (dens(-x) - dens(x)), axis=-1)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log int sigmoid(y f) N(f | m, v) df in log space, finite for any finite m, v.
        With a = y m (y f ~ N(a, v)) and P(a, v) = E sigmoid(f), f ~ N(a, v):

        - v < 3: Gauss-Hermite in log space (logsumexp of log sigmoid over 100 nodes);
        - a > 0: log P(a, v) >= log(1/2), no underflow;
        - a + v <= 0: the exponential tilt sigmoid(f) = e^f sigmoid(-f),
          e^f N(f | a, v) = e^{a + v/2} N(f | a + v, v), gives
          log P(a, v) = a + v/2 + log P(-(a + v), v), the last factor >= 1/2;
        - otherwise: P = Phi(a / sqrt v) + int_0^inf e^{-x} sigmoid(x) N(-x | a, v)
          (1 - e^{2 a x / v}) dx (``predict_proba``'s split, every term positive for
          a <= 0), a logaddexp of log_ndtr and a Gauss-Laguerre logsumexp.
        """
        y = jnp.where(jnp.asarray(y) > 0, 1.0, -1.0)  # as the default: {0, 1} labels too
        y, mean, var = jnp.broadcast_arrays(y, jnp.asarray(mean, float), jnp.asarray(var, float))
        a = y * mean
        small = log_gauss_hermite(jax.nn.log_sigmoid, a, var, 100)
        big = var >= 3.0
        v = jnp.where(big, var, 3.0)  # double-where: the unused branches stay finite
        pos = a > 0.0
        tilt = -(a + v) >= 0.0
        # one Laguerre pass for both: P(a, v) where a > 0, P(-(a + v), v) for the tilt
        log_big = jnp.log(self._proba_laguerre(jnp.where(pos, a, jnp.where(tilt, -(a + v), 0.0)),
                                               v))
        up, flip = log_big, a + 0.5 * v + log_big
        x, w = laguerre_nodes()
        an = jnp.where(pos | tilt, -1.0, a)[..., None]
        vv = v[..., None]
        log_terms = (jnp.log(w) + jax.nn.log_sigmoid(x) - 0.5 * (x + an) ** 2 / vv
                     - 0.5 * jnp.log(2.0 * math.pi * vv) + jnp.log(-jnp.expm1(2.0 * an * x / vv)))
        split = jnp.logaddexp(log_ndtr(an[..., 0] / jnp.sqrt(v)), logsumexp(log_terms, axis=-1))
        large = jnp.where(pos, up, jnp.where(tilt, flip, split))
        return jnp.where(big, large, small)


class Probit(Bernoulli):
    """p(y | f) = Phi(y f)."""

    log_concave = True  # log Phi is concave ([Rasmussen2006], Sec. 3.4)

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        return log_ndtr(y * f)

    def _ratio(self, z):
        """N(z) / Phi(z), stable for very negative z."""
        return jnp.exp(-0.5 * z**2 - 0.5 * _LOG_2PI - log_ndtr(z))

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return y * self._ratio(y * f)

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        z = y * f
        r = self._ratio(z)
        return -r * (r + z)  # R&W eq. 3.16 with y^2 = 1

    def predict_proba(self, mean: Float[Array, " n"], var: Float[Array, " n"]
                     ) -> Float[Array, " n"]:
        return ndtr(mean / jnp.sqrt(1.0 + var))  # int Phi(f) N(f|m,v) df = Phi(m / sqrt(1+v))

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log Phi(y m / sqrt(1 + v)) (log_ndtr: finite for any finite m, v)."""
        y = jnp.where(jnp.asarray(y) > 0, 1.0, -1.0)  # as the default: {0, 1} labels too
        return log_ndtr(y * mean / jnp.sqrt(1.0 + var))


class BayesianSVM(Bernoulli, ScaleMixture):
    """The Bayesian SVM pseudo-likelihood L(y | f) = exp(-2 max(1 - y f, 0)) (Polson & Scott
    2011; Wenzel et al. 2017), y in {-1, +1}. Augmentation: L = e^{-1} e^{y f} e^{-|1 - y f|},
    h = 1 - y f, phi(t) = e^{-sqrt t}, q(w) inverse Gaussian with mean 1 / (2 c).

    L is not normalised over y; class probabilities use p(y = +1 | f) = L(+1 | f) /
    (L(+1 | f) + L(-1 | f)), averaged over f by Gauss-Hermite."""

    twice_differentiable = False  # the hinge: W = 0 except at y f = 1

    normalised = False

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        return -2.0 * jnp.maximum(1.0 - y * f, 0.0)

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """-2 E[max(u, 0)], u = 1 - y f ~ N(mu, var): E[u_+] = mu Phi(mu / s) + s phi(mu / s)
        (closed form; Gauss-Hermite over the hinge was off by ~1e-2 at var = 2)."""
        mu = 1.0 - y * mean
        pos = var > 0.0
        s = jnp.sqrt(jnp.where(pos, var, 1.0))  # double-where: finite gradients at var = 0
        z = mu / s
        e_plus = mu * ndtr(z) + s * jnp.exp(-0.5 * z**2 - 0.5 * _LOG_2PI)
        return -2.0 * jnp.where(pos, e_plus, jnp.maximum(mu, 0.0))

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jax.nn.sigmoid(self.log_prob(1.0, f) - self.log_prob(-1.0, f))

    def predict_proba(self, mean: Float[Array, " n"], var: Float[Array, " n"]
                     ) -> Float[Array, " n"]:
        """int p(y = +1 | f) N(f | mean, var) df: Gauss-Legendre split at the kinks f = +-1
        and at f = 0, where p(y = +1 | f) = sigmoid(4 f) is steepest (``kinked_expectation``;
        ~1e-12, where 100-node Gauss-Hermite was off by up to 1.4e-4)."""
        mean, var = jnp.broadcast_arrays(jnp.asarray(mean, float), jnp.asarray(var, float))
        kinks = jnp.broadcast_to(jnp.asarray([-1.0, 0.0, 1.0]), mean.shape + (3,))
        return kinked_expectation(self.conditional_mean, mean, var, kinks, 20)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log int p(y | f) N(f | mean, var) df, p(y | f) = sigmoid(y (log L(+1 | f) -
        log L(-1 | f))), by ``kinked_expectation`` in log space (logsumexp: finite for any
        finite mean and variance, where the log of ``predict_proba`` underflowed)."""
        y = jnp.where(jnp.asarray(y) > 0, 1.0, -1.0)  # as the default: {0, 1} labels too
        y, mean, var = jnp.broadcast_arrays(y, jnp.asarray(mean, float), jnp.asarray(var, float))
        kinks = jnp.broadcast_to(jnp.asarray([-1.0, 0.0, 1.0]), mean.shape + (3,))
        yy = y[..., None, None]
        log_p = lambda f: jax.nn.log_sigmoid(yy * (self.log_prob(1.0, f) - self.log_prob(-1.0, f)))
        return kinked_expectation(log_p, mean, var, kinks, 20, log=True)

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        return SuperGaussianForm(-1.0, y, 1.0, -y)

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        return -sqrt_floor(t)

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """Levy: InvGamma(1/2, scale 1/4), whose Laplace transform is e^{-sqrt t}."""
        return log_inv_gamma(w, 0.5, 0.25)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        return 0.5 / sqrt_floor(t)

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        # e^{-sqrt t} = E e^{-t w}, w ~ Levy(1/2); tilted: inverse Gaussian(1 / (2c), 1/2)
        return samplers.inverse_gaussian(key, 0.5 / sqrt_floor(t), 0.5)
