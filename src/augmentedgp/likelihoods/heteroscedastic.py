"""Heteroscedastic regression, Gaussian and Student-t: a second latent function g for the
noise, precision lambda sigmoid(g) ([Galy-Fajou2022, Sec. 7.2])."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import digamma, gammaln, xlogy
from jaxtyping import Array, Float, PRNGKeyArray, PyTree, Shaped

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import Augmented, CountAux, tanh_ratio
from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.quadrature import (
    adaptive_log_gauss_hermite,
    gauss_hermite,
    log_gauss_hermite,
    panel_log_gauss_legendre,
)
from augmentedgp.core.validation import is_concrete
from augmentedgp.likelihoods.base import MultiLatent
from augmentedgp.likelihoods.numerics import log_2cosh_half, log_gamma_half_ratio
from augmentedgp.likelihoods.robust import (
    check_finite_variance,
    expected_log1p_square,
    student_t_log_predictive,
)

_LOG_2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)


class HeteroTilt(NamedTuple):
    """q(n_i, w_i) of the heteroscedastic augmentation: n_i ~ Po(n_mean_i) and
    w_i | n_i ~ PG(1/2 + n_i, c_i) (c^2 stored); psi_i = e^{-m_g/2} / (2 cosh(c_i/2))."""

    c2: jax.Array
    n_mean: jax.Array
    psi: jax.Array


class HeteroStudentTilt(NamedTuple):
    """q(u_i) q(n_i, w_i) of the heteroscedastic Student-t augmentation: the Gamma scale
    u_i ~ Ga(u_shape_i, u_rate_i) and, as in :class:`HeteroTilt`, n_i ~ Po(n_mean_i),
    w_i | n_i ~ PG(1/2 + n_i, c_i) (c^2 stored), psi_i = e^{-m_g/2} / (2 cosh(c_i/2))."""

    c2: jax.Array
    n_mean: jax.Array
    psi: jax.Array
    u_shape: jax.Array
    u_rate: jax.Array


def _split(mean, var):
    """(m_f, v_f, m_g, v_g) from (n, 2) marginals: latent 0 is f, latent 1 is g."""
    return mean[..., 0], var[..., 0], mean[..., 1], var[..., 1]


def _psi(mg, c2):
    """psi = e^{-m_g/2} / (2 cosh(c/2)), the approximation of E[sigmoid(-g)] that the
    optimal q(n, w) implies ([Galy-Fajou2022, Algorithm 3], corrected)."""
    return jnp.exp(-0.5 * mg - log_2cosh_half(c2))


def _noise_bound(rho, mu, mg, vg, c2):
    """The augmented g part of the double bound, E_q[log sigmoid(g)^{1/2} sigmoid(-g)^n
    Po(n | rho) PG-tilt] - E_q log q(n, w), at q(n) = Po(mu), q(w | n) = PG(1/2 + n, c) / 2
    (with rho the Poisson rate lambda E[(y - f)^2] / 2, times E[u] for Student-t):
    -rho + mu log(rho / mu) + mu + (1/2 - mu) m_g / 2 - E[w] (E[g^2] - c^2)
    - (1/2 + mu) log(2 cosh(c/2)), E[w] = (1/2 + mu) tanh(c/2) / (4c)."""
    e_w = 0.5 * (0.5 + mu) * tanh_ratio(jnp.sqrt(c2))
    return (-rho + xlogy(mu, rho) - xlogy(mu, mu) + mu + 0.5 * (0.5 - mu) * mg
            - e_w * (mg**2 + vg - c2) - (0.5 + mu) * log_2cosh_half(c2))


def _sites(y, prec_f, n_mean, c2):
    """(beta, gamma), (n, 2): f: the Gaussian site of precision prec_f on y; g:
    beta = (1/2 - E n) / 2, gamma = (1/2 + E n) tanh(c/2) / (2c) ([Galy-Fajou2022,
    Algorithm 3], corrected: the minus sign in the g potential)."""
    beta = jnp.stack([prec_f * y, 0.5 * (0.5 - n_mean)], -1)
    gamma = jnp.stack([prec_f, (0.5 + n_mean) * tanh_ratio(jnp.sqrt(c2))], -1)
    return beta, gamma


def _draw_counts(key, rate, g, f_precision):
    """n ~ Po(rate sigmoid(-g)), w ~ PG(1/2 + n, |g|) / 2 ([Galy-Fajou2022, Algorithm 2]),
    with the collapsed f-site precision."""
    kn, kw = jax.random.split(key)
    n = jax.random.poisson(kn, rate * jax.nn.sigmoid(-g)).astype(g.dtype)
    return CountAux(n, 0.5 * samplers.polya_gamma(kw, 0.5 + n, g), f_precision)


def _draw_sites(y, aux):
    """Gibbs sites given ``aux``: f: the collapsed precision on y; g: (1/2 - n) / 2 and the
    PG draw (2 w)."""
    return (jnp.stack([aux.f_precision * y, 0.5 * (0.5 - aux.n)], -1),
            jnp.stack([aux.f_precision, 2.0 * aux.w], -1))


def _noise_variance_overflow(name, factor, mg, vg):
    """A ValueError if E[1 / sigmoid(g)] factor = (1 + e^{-m_g + v_g/2}) factor exceeds
    float64 (concrete values only), naming the worst latent marginal."""
    worst = int(jnp.argmax(-mg + 0.5 * vg))
    raise ValueError(
        f"{name} predict_y: the predictive variance {factor} (1 + exp(-mean_g + var_g / 2)) "
        f"exceeds float64 (noise latent mean {float(mg.ravel()[worst]):.4g}, variance "
        f"{float(vg.ravel()[worst]):.4g}); use predict_f or predict_log_density")


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

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch C"]
                ) -> Float[Array, "*batch"]:
        f, g = f[..., 0], f[..., 1]
        lam = self.precision.value
        return 0.5 * (jnp.log(lam) + jax.nn.log_sigmoid(g) - _LOG_2PI) - 0.5 * lam * (
            jax.nn.sigmoid(g) * (y - f) ** 2)

    def conditional_mean(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch"]:
        """E[y | f, g] = f."""
        return f[..., 0]

    def conditional_variance(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch"]:
        """Var[y | f, g] = 1 / (precision sigmoid(g))."""
        return 1.0 / (self.precision.value * jax.nn.sigmoid(f[..., 1]))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                                 var: Float[Array, "n C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """Exact in f; Gauss-Hermite in g (``n`` nodes, None: 20)."""
        n = 20 if n is None else n
        mf, vf, mg, vg = _split(mean, var)
        lam = self.precision.value
        e = (y - mf) ** 2 + vf
        term = lambda g: 0.5 * jax.nn.log_sigmoid(g) - 0.5 * lam * e[..., None] * jax.nn.sigmoid(g)
        return 0.5 * (jnp.log(lam) - _LOG_2PI) + gauss_hermite(term, mg, vg, n)

    def predict_y(self, mean: Float[Array, "n C"], var: Float[Array, "n C"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """Mean and variance of y: E f and V f + E[1 / (precision sigmoid(g))], the latter
        (1 + e^{-m_g + v_g / 2}) / precision in closed form (``n`` is not used)."""
        mf, vf, mg, vg = _split(mean, var)
        # log(1 + e^{-m_g + v_g/2}) = softplus(-m_g + v_g/2): inf only where the true value
        # exceeds float64
        noise = jnp.exp(jax.nn.softplus(-mg + 0.5 * vg) - jnp.log(self.precision.value))
        vy = vf + noise
        if is_concrete(vy) and not bool(jnp.all(jnp.isfinite(vy))):
            _noise_variance_overflow("HeteroscedasticGaussian", "E[1 / (precision sigmoid(g))] "
                                     "= 1 / precision", mg, vg)
        return mf, vy

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                            var: Float[Array, "n C"]) -> Float[Array, " n"]:
        """log int N(y | m_f, v_f + 1 / (precision sigmoid(g))) q(g) dg: finite for any
        finite moments. Gauss-Hermite in log space on q(g), and adaptive Gauss-Hermite
        around the mode in g (``core.quadrature.adaptive_log_gauss_hermite``) where the residual
        (y - m_f)^2 is far beyond the noise variance at m_g, so that the integrand's mass
        lies many latent sds into the tail of q(g) (e.g. m_f = 1e8); the log noise variance
        is softplus(-g) - log precision (never the variance, which overflows)."""
        y, mean, var = jnp.asarray(y, float), jnp.asarray(mean, float), jnp.asarray(var, float)
        mf, vf, mg, vg = _split(mean, var)
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

    def aux_posterior(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                      var: Float[Array, "n C"]) -> tuple:
        mf, vf, mg, vg = _split(mean, var)
        c2 = mg**2 + vg
        psi = _psi(mg, c2)
        return HeteroTilt(c2, 0.5 * self.precision.value * ((y - mf) ** 2 + vf) * psi, psi)

    def aux_sites(self, y: Shaped[Array, " n"], q_aux: tuple
                 ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        return _sites(y, self.precision.value * (1.0 - q_aux.psi), q_aux.n_mean, q_aux.c2)

    # f and g are not independent given (n, w): Gibbs draws f | g (n, w integrated out),
    # then (n, w) | f, g, then g | n, w ([Galy-Fajou2022, Algorithm 2], collapsed in f)
    gibbs_joint = False

    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, " n"], f: Float[Array, "*batch C"]
                  ) -> PyTree[Array]:
        """n ~ Po(precision sigmoid(-g) (y - f)^2 / 2), w ~ PG(1/2 + n, |g|) / 2
        ([Galy-Fajou2022, Sec. 7.2.1, Algorithm 2])."""
        f, g = f[..., 0], f[..., 1]
        lam = self.precision.value
        return _draw_counts(key, 0.5 * lam * (y - f) ** 2, g, lam * jax.nn.sigmoid(g))

    def sites(self, y: Shaped[Array, " n"], aux: PyTree[Array]
             ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        """f: precision * sigmoid(g) on y (exact, collapsed over n and w; y, not the
        y / 2 printed in [Galy-Fajou2022, Algorithm 2]);
        g: beta = (1/2 - n) / 2, gamma = PG draw."""
        return _draw_sites(y, aux)

    def augmented_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                               var: Float[Array, "n C"], q_aux: tuple | None = None
                              ) -> Float[Array, " n"]:
        """The double bound at the optimal q(n, w) (class docstring), or at ``q_aux``:
        q(n) = Po(n_mean), q(w | n) = PG(1/2 + n, c) / 2. With rho = precision E / 2,
        mu = n_mean and E[w] = (1/2 + mu) tanh(c/2) / (4c), it is log(precision / 2 pi) / 2
        - rho + mu log(rho / mu) + mu + (1/2 - mu) m_g / 2 - E[w] (E[g^2] - c^2)
        - (1/2 + mu) log(2 cosh(c/2))."""
        mf, vf, mg, vg = _split(mean, var)
        lam = self.precision.value
        if q_aux is None:
            c2 = mg**2 + vg
            return (0.5 * (jnp.log(lam) - _LOG_2PI) + 0.25 * mg - 0.5 * log_2cosh_half(c2)
                    - 0.5 * lam * ((y - mf) ** 2 + vf) * (1.0 - _psi(mg, c2)))
        rho = 0.5 * lam * ((y - mf) ** 2 + vf)
        return 0.5 * (jnp.log(lam) - _LOG_2PI) + _noise_bound(rho, q_aux.n_mean, mg, vg, q_aux.c2)


class HeteroscedasticStudentT(MultiLatent, Augmented):
    """y ~ Student-t(df) with location f and precision-scale precision * sigmoid(g):
    p(y | f, g) = Z sqrt(tau / (pi df)) (1 + tau (y - f)^2 / df)^{-(df + 1)/2},
    tau = precision sigmoid(g), Z = Gamma((df + 1)/2) / Gamma(df/2) ([Galy-Fajou2022,
    Sec. 7.2.2, eq. 7.5]): latent 0 is the mean f, latent 1 the noise function g. Heavy
    tails and a noise level that varies with x; df -> inf is
    :class:`HeteroscedasticGaussian`.

    Augmentation (derivation: docs/heteroscedastic-student-t.md): the Gamma scale mixture
    y | f, g, u ~ N(f, 1 / (tau u)), u ~ Ga(df/2, df/2) makes f conjugate; given u, the g part
    is the heteroscedastic Gaussian's, augmented as there with n ~ Po and a Polya-Gamma w.
    With E = E_q[(y - f)^2] the double bound at its optimal q(u) q(n, w) is, per point,

        log Z + log(precision / (pi df)) / 2 + m_g / 4 - log(2 cosh(c/2)) / 2
        - (df + 1)/2 log(1 + precision E (1 - psi) / df),

    c^2 = E[g^2], psi = e^{-m_g/2} / (2 cosh(c/2)), with q(u) = Ga((df + 1)/2,
    df/2 + precision E (1 - psi) / 2); its sites are those of the heteroscedastic Gaussian
    with precision E[u] * precision. It equals log p(y | f, g) when both latents have
    variance 0.

    Gibbs sampling draws u ~ Ga((df + 1)/2, df/2 + tau (y - f)^2 / 2), then
    n ~ Po(precision u sigmoid(-g) (y - f)^2 / 2) and w ~ PG(1/2 + n, |g|) / 2, and f given
    g and u (collapsed over n, w), g given n and w, one latent at a time.

    ``df`` and ``precision``: positive scalars (a ValueError naming them otherwise).
    ``predict_y`` raises a ValueError where y has no variance (df <= 2, as
    :class:`StudentT`) or where it exceeds float64 (as :class:`HeteroscedasticGaussian`).
    """

    df: Parameter
    precision: Parameter

    def __init__(self, df=3.0, precision=1.0):
        self.df = positive(df, "Student-t degrees of freedom df", max_ndim=0)
        self.precision = positive(precision, "noise precision", max_ndim=0)

    @property
    def num_latent(self) -> int:
        return 2

    def _log_norm(self):
        """log Z + log(precision / (pi df)) / 2."""
        nu = self.df.value
        return (log_gamma_half_ratio(nu)
                + 0.5 * (jnp.log(self.precision.value) - jnp.log(math.pi * nu)))

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch C"]
                ) -> Float[Array, "*batch"]:
        f, g = f[..., 0], f[..., 1]
        nu, lam = self.df.value, self.precision.value
        return self._log_norm() + 0.5 * jax.nn.log_sigmoid(g) - 0.5 * (nu + 1.0) * jnp.log1p(
            lam * jax.nn.sigmoid(g) * (y - f) ** 2 / nu)

    def conditional_mean(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch"]:
        """E[y | f, g] = f."""
        return f[..., 0]

    def _variance_factor(self):
        """df / (df - 2) for df > 2, inf otherwise."""
        nu = self.df.value
        return jnp.where(nu > 2.0, nu / jnp.where(nu > 2.0, nu - 2.0, 1.0), jnp.inf)

    def conditional_variance(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch"]:
        """Var[y | f, g] = df / ((df - 2) precision sigmoid(g)) (inf for df <= 2)."""
        return self._variance_factor() / (self.precision.value * jax.nn.sigmoid(f[..., 1]))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                                 var: Float[Array, "n C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """Exact in f for each g (:func:`~augmentedgp.likelihoods.robust.expected_log1p_square`,
        accurate for any v_f), Gauss-Hermite in g (``n`` nodes, None: 20)."""
        n = 20 if n is None else n
        mf, vf, mg, vg = _split(mean, var)
        nu, lam = self.df.value, self.precision.value
        d, vf = (y - mf)[..., None], vf[..., None]

        def term(g):
            c = nu / (lam * jax.nn.sigmoid(g))  # E log(1 + tau r^2 / df) = E log(1 + r^2 / c)
            return (0.5 * jax.nn.log_sigmoid(g)
                    - 0.5 * (nu + 1.0) * expected_log1p_square(d, vf, c))

        return self._log_norm() + gauss_hermite(term, mg, vg, n)

    def predict_y(self, mean: Float[Array, "n C"], var: Float[Array, "n C"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """Mean and variance of y: E f and V f + df / (df - 2) E[1 / (precision sigmoid(g))],
        the latter df / (df - 2) (1 + e^{-m_g + v_g / 2}) / precision in closed form (``n``
        is not used)."""
        check_finite_variance(self.df.value, "predict_y", "HeteroscedasticStudentT")
        mf, vf, mg, vg = _split(mean, var)
        noise = jnp.exp(jax.nn.softplus(-mg + 0.5 * vg) + jnp.log(self._variance_factor())
                        - jnp.log(self.precision.value))
        vy = vf + noise
        if is_concrete(vy) and not bool(jnp.all(jnp.isfinite(vy))):
            _noise_variance_overflow("HeteroscedasticStudentT", "df / ((df - 2) precision)",
                                     mg, vg)
        return mf, vy

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                            var: Float[Array, "n C"]) -> Float[Array, " n"]:
        """log int int p(y | f, g) q(f) q(g): for each g the f-integral is the Student-t
        convolved with q(f) (:func:`~augmentedgp.likelihoods.robust.student_t_log_predictive`,
        accurate for any residual and v_f); the g-integral by Gauss-Legendre panels
        (``core.quadrature.panel_log_gauss_legendre``, 8 panels of 48 nodes) whose
        breakpoints bracket each feature of the integrand on its own scale: the bulk of
        q(g) (m_g +- 10 sd); its tilt towards small precision, like sigmoid(g)^{df/2} q(g),
        for a residual far beyond the noise scale (centred at m_g - df v_g / 2, clipped to
        [g_b, m_g]); the sigmoid's transition (|g| <= 12); and the likelihood's peak in g,
        g_b = -log(precision ((y - m_f)^2 + v_f)), where the noise scale meets the residual
        (+- 12, and its left tail, decaying like e^{g/2}, to g_b - 45). Accurate (~1e-8)
        for latent variances from 0 to 1e4 and residuals up to 1e6 noise scales."""
        y, mean, var = jnp.asarray(y, float), jnp.asarray(mean, float), jnp.asarray(var, float)
        nu, lam = self.df.value, self.precision.value
        mf, vf, mg, vg = jnp.broadcast_arrays(*_split(mean, var))
        d2 = jnp.broadcast_to((y - mf) ** 2, mf.shape)

        def point(args):  # one observation: 8 panels x 48 nodes, 128 nodes in log w each
            d2, vf, mg, vg = args
            sd = jnp.sqrt(vg)
            g_b = -jnp.log(lam) - jnp.log(jnp.maximum(d2 + vf, 1e-300))
            tilt = jnp.clip(mg - 0.5 * nu * vg, jnp.minimum(g_b, mg), mg)
            bp = jnp.stack([mg - 10.0 * sd, mg + 10.0 * sd, tilt - 10.0 * sd, tilt + 10.0 * sd,
                            -12.0, 12.0, g_b - 45.0, g_b - 12.0, g_b + 12.0])
            vg_ = jnp.maximum(vg, 1e-300)

            def log_integrand(g):  # the noise scale^2 (1 + e^{-g}) / precision, in logs
                return (student_t_log_predictive(d2, vf, nu, jax.nn.softplus(-g) - jnp.log(lam),
                                                 128)
                        - 0.5 * (_LOG_2PI + jnp.log(vg_) + (g - mg) ** 2 / vg_))

            # v_g = 0: q(g) is a point mass
            at_mean = student_t_log_predictive(d2, vf, nu, jax.nn.softplus(-mg) - jnp.log(lam))
            return jnp.where(vg > 0.0, panel_log_gauss_legendre(log_integrand, bp, 48), at_mean)

        flat = [a.reshape(-1) for a in (d2, vf, mg, vg)]
        return lax.map(point, flat, batch_size=64).reshape(mf.shape)

    def aux_posterior(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                      var: Float[Array, "n C"]) -> tuple:
        mf, vf, mg, vg = _split(mean, var)
        nu, lam = self.df.value, self.precision.value
        c2 = mg**2 + vg
        psi = _psi(mg, c2)
        e = (y - mf) ** 2 + vf
        shape = jnp.broadcast_to(0.5 * (nu + 1.0), jnp.shape(e))
        rate = 0.5 * nu + 0.5 * lam * e * (1.0 - psi)
        return HeteroStudentTilt(c2, 0.5 * lam * (shape / rate) * e * psi, psi, shape, rate)

    def aux_sites(self, y: Shaped[Array, " n"], q_aux: tuple
                 ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        e_u = q_aux.u_shape / q_aux.u_rate
        return _sites(y, self.precision.value * e_u * (1.0 - q_aux.psi), q_aux.n_mean, q_aux.c2)

    # f and g are not independent given (u, n, w): one latent at a time, as the
    # heteroscedastic Gaussian
    gibbs_joint = False

    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, " n"], f: Float[Array, "*batch C"]
                  ) -> PyTree[Array]:
        """u ~ Ga((df + 1)/2, df/2 + tau (y - f)^2 / 2) (f, g given; n, w integrated out),
        then n ~ Po(precision u sigmoid(-g) (y - f)^2 / 2), w ~ PG(1/2 + n, |g|) / 2."""
        f, g = f[..., 0], f[..., 1]
        nu, lam = self.df.value, self.precision.value
        ku, kn = jax.random.split(key)
        r2 = (y - f) ** 2
        shape = jnp.broadcast_to(0.5 * (nu + 1.0), jnp.shape(r2))
        u = jax.random.gamma(ku, shape) / (0.5 * nu + 0.5 * lam * jax.nn.sigmoid(g) * r2)
        return _draw_counts(kn, 0.5 * lam * u * r2, g, lam * u * jax.nn.sigmoid(g))

    def sites(self, y: Shaped[Array, " n"], aux: PyTree[Array]
             ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        """f: precision * u * sigmoid(g) on y (collapsed over n and w); g: beta = (1/2 - n) / 2,
        gamma = PG draw."""
        return _draw_sites(y, aux)

    def augmented_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                               var: Float[Array, "n C"], q_aux: tuple | None = None
                              ) -> Float[Array, " n"]:
        """The double bound at the optimal q(u) q(n, w) (class docstring), or at ``q_aux``:
        log(precision / 2 pi) / 2 + E[log u] / 2 - KL(q(u) || Ga(df/2, df/2)) plus the
        heteroscedastic Gaussian's g part at Poisson rate precision E[u] E / 2."""
        mf, vf, mg, vg = _split(mean, var)
        nu, lam = self.df.value, self.precision.value
        e = (y - mf) ** 2 + vf
        if q_aux is None:
            c2 = mg**2 + vg
            return (self._log_norm() + 0.25 * mg - 0.5 * log_2cosh_half(c2)
                    - 0.5 * (nu + 1.0) * jnp.log1p(lam * e * (1.0 - _psi(mg, c2)) / nu))
        a, b, a0 = q_aux.u_shape, q_aux.u_rate, 0.5 * nu
        e_log_u = digamma(a) - jnp.log(b)
        kl_u = ((a - a0) * digamma(a) - gammaln(a) + gammaln(a0) + a0 * (jnp.log(b) - jnp.log(a0))
                + a * (a0 - b) / b)
        rho = 0.5 * lam * (a / b) * e
        return (0.5 * (jnp.log(lam) - _LOG_2PI + e_log_u) - kl_u
                + _noise_bound(rho, q_aux.n_mean, mg, vg, q_aux.c2))
