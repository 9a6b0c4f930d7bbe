"""Heteroscedastic Gaussian regression: a second latent function for the noise."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import Augmented, CountAux, tanh_ratio
from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.quadrature import (
    adaptive_log_gauss_hermite,
    gauss_hermite,
    log_gauss_hermite,
)
from augmentedgp.core.validation import is_concrete
from augmentedgp.likelihoods.base import MultiLatent, log_2cosh_half

_LOG_2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)


class HeteroTilt(NamedTuple):
    """q(n_i, w_i) of the heteroscedastic augmentation: n_i ~ Po(n_mean_i) and
    w_i | n_i ~ PG(1/2 + n_i, c_i) (c^2 stored); psi_i = e^{-m_g/2} / (2 cosh(c_i/2))."""

    c2: jax.Array
    n_mean: jax.Array
    psi: jax.Array


class HeteroscedasticGaussian(MultiLatent, Augmented):
    """y ~ N(f, 1 / (precision * sigmoid(g))): latent 0 is the mean f, latent 1 the noise
    function g ([Galy-Fajou2022, Sec. 7.2.1, eq. 7.1]; the sigmoid link makes the
    augmentation possible).

    Augmented inference uses the double bound of [Galy-Fajou2022, Sec. 7.2.1]: with
    E_i = E_q[(y_i - f_i)^2], the data term E_q[log p(y | f, g)] is exact in f and its g part
    sqrt(sigmoid(g)) exp(-(precision E_i / 2) sigmoid(g)) is augmented with
    n_i ~ Po(precision E_i sigmoid(-g_i) / 2) and a Polya-Gamma w_i (its eq. 7.3,
    corrected: g^2 w, not g^2 / w). At the optimal q(n, w) the bound per point is

        log(precision / 2 pi) / 2 + m_g / 4 - log(2 cosh(c/2)) / 2 - precision E (1 - psi) / 2,

    c^2 = E[g^2], psi = e^{-m_g/2} / (2 cosh(c/2)); its sites are f: precision (1 - psi)
    on y, and g: beta = (1/2 - E n) / 2, gamma = (1/2 + E n) tanh(c/2) / (2c) with
    E n = precision E psi / 2 ([Galy-Fajou2022, Algorithm 3], corrected: no square roots,
    and the minus sign in the g potential).

    ``precision``: a positive scalar (a ValueError naming it otherwise). Overflow rule: a
    returned quantity whose true value is a float64 number comes out finite
    (``predictive_log_prob`` works with log(noise variance) = softplus(-g) - log precision,
    never the variance itself); the one that can truly exceed float64 is the predictive
    variance of ``predict_y``, E[1 / (precision sigmoid(g))] = (1 + e^{-m_g + v_g / 2}) /
    precision, beyond float64 once v_g / 2 - m_g exceeds ~709 (e.g. latent variance 1e6): a
    call on concrete values then raises a ValueError saying so (under jit the value is inf,
    which the models' ``predict_y`` checks).
    """

    precision: Parameter

    def __init__(self, precision=1.0):
        self.precision = positive(precision, "noise precision", max_ndim=0)

    @property
    def num_latent(self) -> int:
        return 2

    def log_prob(self, y, f):
        f, g = f[..., 0], f[..., 1]
        lam = self.precision.value
        return 0.5 * (jnp.log(lam) + jax.nn.log_sigmoid(g) - _LOG_2PI) - 0.5 * lam * (
            jax.nn.sigmoid(g) * (y - f) ** 2)

    def conditional_mean(self, f):
        """E[y | f, g] = f."""
        return f[..., 0]

    def conditional_variance(self, f):
        """Var[y | f, g] = 1 / (precision sigmoid(g))."""
        return 1.0 / (self.precision.value * jax.nn.sigmoid(f[..., 1]))

    @staticmethod
    def _split(mean, var):
        return mean[..., 0], var[..., 0], mean[..., 1], var[..., 1]

    def variational_expectations(self, y, mean, var, n: int | None = None, key=None):
        """Exact in f; Gauss-Hermite in g (``n`` nodes, None: 20)."""
        n = 20 if n is None else n
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value
        e = (y - mf) ** 2 + vf
        term = lambda g: 0.5 * jax.nn.log_sigmoid(g) - 0.5 * lam * e[..., None] * jax.nn.sigmoid(g)
        return 0.5 * (jnp.log(lam) - _LOG_2PI) + gauss_hermite(term, mg, vg, n)

    def predict_y(self, mean, var, n: int | None = None):
        """Mean and variance of y: E f and V f + E[1 / (precision sigmoid(g))], the latter
        (1 + e^{-m_g + v_g / 2}) / precision in closed form (``n`` is not used)."""
        mf, vf, mg, vg = self._split(mean, var)
        # log(1 + e^{-m_g + v_g/2}) = softplus(-m_g + v_g/2): inf only where the true value
        # exceeds float64
        noise = jnp.exp(jax.nn.softplus(-mg + 0.5 * vg) - jnp.log(self.precision.value))
        vy = vf + noise
        if is_concrete(vy) and not bool(jnp.all(jnp.isfinite(vy))):
            worst = int(jnp.argmax(-mg + 0.5 * vg))
            raise ValueError(
                "HeteroscedasticGaussian predict_y: the predictive variance E[1 / (precision "
                "sigmoid(g))] = (1 + exp(-mean_g + var_g / 2)) / precision exceeds float64 "
                f"(noise latent mean {float(mg.ravel()[worst]):.4g}, variance "
                f"{float(vg.ravel()[worst]):.4g}); use predict_f or predict_log_density")
        return mf, vy

    def predictive_log_prob(self, y, mean, var):
        """log int N(y | m_f, v_f + 1 / (precision sigmoid(g))) q(g) dg: finite for any
        finite moments. Gauss-Hermite in log space on q(g), and adaptive Gauss-Hermite
        around the mode in g (``core.quadrature.adaptive_log_gauss_hermite``) where the residual
        (y - m_f)^2 is far beyond the noise variance at m_g, so that the integrand's mass
        lies many latent sds into the tail of q(g) (e.g. m_f = 1e8); the log noise variance
        is softplus(-g) - log precision (never the variance, which overflows)."""
        y, mean, var = jnp.asarray(y, float), jnp.asarray(mean, float), jnp.asarray(var, float)
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value
        r2 = (y - mf) ** 2
        log_vf = jnp.log(vf)

        def log_lik(g, r2=r2, log_vf=log_vf):  # in log v
            log_v = jnp.logaddexp(log_vf, jax.nn.softplus(-g) - jnp.log(lam))
            return -0.5 * (_LOG_2PI + log_v + r2 * jnp.exp(-log_v))

        plain = log_gauss_hermite(lambda g: log_lik(g, r2[..., None], log_vf[..., None]), mg, vg)
        # the mode in g: between m_g and g_r, where the noise variance (1 + e^{-g}) / lam
        # equals r2 (the likelihood's maximum); above m_g by at most v_g / 2 (its slope
        # towards small noise is below 1/2)
        g_r = -jnp.log(jnp.maximum(lam * r2 - 1.0, 1e-300))
        vg_ = jnp.maximum(vg, 1e-300)
        h = lambda g: log_lik(g, r2[..., None], log_vf[..., None]) - 0.5 * (
            _LOG_2PI + jnp.log(vg_[..., None]) + (g - mg[..., None]) ** 2 / vg_[..., None])
        dh = lambda g: jax.grad(lambda t: jnp.sum(log_lik(t)))(g) - (g - mg) / vg_
        adaptive = adaptive_log_gauss_hermite(h, dh, jnp.minimum(mg, g_r) - 1.0,
                                              jnp.maximum(mg, g_r) + 0.5 * vg + 1.0)
        far = r2 > 1e4 * (vf + (1.0 + jnp.exp(jnp.minimum(-mg, 700.0))) / lam)
        return jnp.where(far, adaptive, plain)

    def aux_posterior(self, y, mean, var):
        mf, vf, mg, vg = self._split(mean, var)
        c2 = mg**2 + vg
        psi = jnp.exp(-0.5 * mg - log_2cosh_half(c2))
        return HeteroTilt(c2, 0.5 * self.precision.value * ((y - mf) ** 2 + vf) * psi, psi)

    def aux_sites(self, y, q_aux):
        prec_f = self.precision.value * (1.0 - q_aux.psi)
        beta = jnp.stack([prec_f * y, 0.5 * (0.5 - q_aux.n_mean)], -1)
        gamma = jnp.stack([prec_f, (0.5 + q_aux.n_mean) * tanh_ratio(jnp.sqrt(q_aux.c2))], -1)
        return beta, gamma

    # f and g are not independent given (n, w): Gibbs draws f | g (n, w integrated out),
    # then (n, w) | f, g, then g | n, w ([Galy-Fajou2022, Algorithm 2], collapsed in f)
    gibbs_joint = False

    def sample_aux(self, key, y, f):
        """n ~ Po(precision sigmoid(-g) (y - f)^2 / 2), w ~ PG(1/2 + n, |g|) / 2
        ([Galy-Fajou2022, Sec. 7.2.1, Algorithm 2])."""
        f, g = f[..., 0], f[..., 1]
        kn, kw = jax.random.split(key)
        rate = 0.5 * self.precision.value * jax.nn.sigmoid(-g) * (y - f) ** 2
        n = jax.random.poisson(kn, rate).astype(f.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, 0.5 + n, g), jax.nn.sigmoid(g))

    def sites(self, y, aux):
        """f: precision * sigmoid(g) on y (exact, collapsed over n and w; y, not the
        y / 2 printed in [Galy-Fajou2022, Algorithm 2]);
        g: beta = (1/2 - n) / 2, gamma = PG draw."""
        prec_f = self.precision.value * aux.sigmoid_g
        return (jnp.stack([prec_f * y, 0.5 * (0.5 - aux.n)], -1),
                jnp.stack([prec_f, 2.0 * aux.w], -1))

    def augmented_expectations(self, y, mean, var, q_aux=None):
        """The double bound at the optimal q(n, w) (class docstring), or at ``q_aux``:
        q(n) = Po(n_mean), q(w | n) = PG(1/2 + n, c) / 2. With rho = precision E / 2,
        mu = n_mean and E[w] = (1/2 + mu) tanh(c/2) / (4c), it is log(precision / 2 pi) / 2
        - rho + mu log(rho / mu) + mu + (1/2 - mu) m_g / 2 - E[w] (E[g^2] - c^2)
        - (1/2 + mu) log(2 cosh(c/2))."""
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value
        if q_aux is None:
            c2 = mg**2 + vg
            psi = jnp.exp(-0.5 * mg - log_2cosh_half(c2))
            return (0.5 * (jnp.log(lam) - _LOG_2PI) + 0.25 * mg - 0.5 * log_2cosh_half(c2)
                    - 0.5 * lam * ((y - mf) ** 2 + vf) * (1.0 - psi))
        rho = 0.5 * lam * ((y - mf) ** 2 + vf)
        mu, c2 = q_aux.n_mean, q_aux.c2
        e_w = 0.5 * (0.5 + mu) * tanh_ratio(jnp.sqrt(c2))
        return (0.5 * (jnp.log(lam) - _LOG_2PI) - rho + xlogy(mu, rho) - xlogy(mu, mu) + mu
                + 0.5 * (0.5 - mu) * mg - e_w * (mg**2 + vg - c2)
                - (0.5 + mu) * log_2cosh_half(c2))
