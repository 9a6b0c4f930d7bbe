"""Regression likelihoods: Gaussian and the heavy-tailed scale mixtures (Student-t, Laplace,
Matern-3/2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, gammaln, log_ndtr
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import ScaleMixture, SuperGaussianForm
from augmentedgp.core.params import Parameter, scalar_positive
from augmentedgp.core.quadrature import kinked_expectation, uniform_nodes
from augmentedgp.core.validation import is_concrete, require_finite
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.likelihoods.numerics import (
    log_gamma_density,
    log_gamma_half_ratio,
    log_inv_gamma,
    sqrt_floor,
)
from augmentedgp.likelihoods.quantiles import check_level, noise_quantile

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


class Gaussian(Likelihood, ScaleMixture):
    """y = f + e, e ~ N(0, variance). Conjugate as it is: in the augmentation scheme
    h = (f - y) / sqrt(2 variance) and phi(t) = e^-t, so w = 1.

    ``variance`` is one number, the same for every observation (a ValueError otherwise:
    there would be no noise variance to predict with at new inputs); noise that varies
    with x is :class:`~augmentedgp.likelihoods.HeteroscedasticGaussian`."""

    log_concave = True
    variance: Parameter

    def __init__(self, variance=1.0):
        if not isinstance(variance, Parameter) and np.ndim(variance) != 0:
            raise ValueError(
                f"noise variance must be a scalar, got an array of shape "
                f"{np.shape(variance)}: per-point noise has no value at new inputs; for noise "
                "that varies with x use likelihoods.HeteroscedasticGaussian (VGP or SVGP)")
        self.variance = scalar_positive(variance, "noise variance")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        s2 = self.variance.value
        return -0.5 * (_LOG_2PI + jnp.log(s2) + (y - f) ** 2 / s2)

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return (y - f) / self.variance.value

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return jnp.broadcast_to(-1.0 / self.variance.value, jnp.shape(f))

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return f

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.broadcast_to(self.variance.value, jnp.shape(f))

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """Mean and variance of y."""
        return mean, var + self.variance.value

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y ~ N(mean, var + variance) (numpy, closed form)."""
        import scipy.stats

        level = check_level(level)
        var = np.maximum(np.asarray(var, np.float64), 0.0)
        return scipy.stats.norm.ppf(level, np.asarray(mean, np.float64),
                                    np.sqrt(var + float(self.variance.value)))

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        v = var + self.variance.value
        return require_finite("Gaussian predictive_log_prob: (y - mean)^2 / (var + noise "
                              "variance)", -0.5 * (_LOG_2PI + jnp.log(v) + (y - mean) ** 2 / v))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        s2 = self.variance.value  # closed form
        return require_finite("Gaussian variational_expectations: ((y - mean)^2 + var) / "
                              "noise variance",
                              -0.5 * (_LOG_2PI + jnp.log(s2) + ((y - mean) ** 2 + var) / s2))

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        s2 = self.variance.value
        b = jnp.broadcast_to(1.0 / jnp.sqrt(2.0 * s2), jnp.shape(y))
        return SuperGaussianForm(-0.5 * (_LOG_2PI + jnp.log(s2)), 0.0, -y * b, b)

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        return -t

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """None: w = 1 (a point mass)."""
        return None

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        return jnp.ones_like(t)

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        return jnp.ones_like(t)


class StudentT(Likelihood, ScaleMixture):
    """y = f + scale * t_df (Student-t noise; heavy tails, robust regression).

    Augmentation: a gamma scale mixture of Gaussians, h = (f - y) / scale,
    phi(t) = (1 + t / df)^{-(df + 1)/2}, q(w) = Gamma((df + 1)/2, rate df + c^2)
    ([Galy-Fajou2020, Table 1]; the table of its App. A.6 has Gamma(df) for Gamma(df / 2))."""

    df: Parameter
    scale: Parameter

    def __init__(self, df=3.0, scale=1.0):
        self.df = scalar_positive(df, "Student-t degrees of freedom df")
        self.scale = scalar_positive(scale, "Student-t scale")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        nu, s = self.df.value, self.scale.value
        return self._log_norm() - 0.5 * (nu + 1.0) * jnp.log1p(((y - f) / s) ** 2 / nu)

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        nu, s2, r = self.df.value, self.scale.value**2, y - f
        return (nu + 1.0) * r / (nu * s2 + r**2)

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        nu, s2, r = self.df.value, self.scale.value**2, y - f
        return (nu + 1.0) * (r**2 - nu * s2) / (nu * s2 + r**2) ** 2  # > 0 for |r| > s sqrt(nu)

    def _log_norm(self):
        nu = self.df.value  # log G((nu+1)/2) - log G(nu/2) - log(s sqrt(nu pi))
        return (log_gamma_half_ratio(nu) - 0.5 * jnp.log(nu * math.pi)
                - jnp.log(self.scale.value))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """Accurate for any variance (Gauss-Hermite is not once sqrt(var) >~ scale sqrt(df):
        the integrand has poles at f = y +- i scale sqrt(df)): :func:`expected_log1p_square`
        with ``n`` trapezoid nodes (None: 256)."""
        nu = self.df.value
        e_log1p = expected_log1p_square(y - mean, var, nu * self.scale.value**2,
                                        256 if n is None else n)
        return self._log_norm() - 0.5 * (nu + 1.0) * e_log1p

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """Accurate for any variance (the generic Gauss-Hermite rule is not, see above):
        :func:`student_t_log_predictive`."""
        return student_t_log_predictive((y - mean) ** 2, var, self.df.value,
                                        2.0 * jnp.log(self.scale.value))

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return f

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        nu = self.df.value
        # s^2 nu / (nu - 2) for nu > 2, infinite otherwise
        v = self.scale.value**2 * nu / jnp.where(nu > 2.0, nu - 2.0, 1.0)
        return jnp.broadcast_to(jnp.where(nu > 2.0, v, jnp.inf), jnp.shape(f))

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """Mean and variance of y; a ValueError naming df where y has no variance (df <= 2;
        under jit, with df traced, the variance is inf)."""
        self.check_variance("predict_y")
        return mean, var + self.conditional_variance(mean)

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y = f + scale * t_df, f ~ N(mean, var) (numpy):
        :func:`~augmentedgp.likelihoods.quantiles.noise_quantile`."""
        import scipy.stats

        noise = scipy.stats.t(float(self.df.value), scale=float(self.scale.value))
        return noise_quantile(noise, mean, var, level)

    def check_variance(self, what: str) -> None:
        """A ValueError for ``what`` if the noise has no variance (df <= 2; a concrete df
        only: traced values pass)."""
        check_finite_variance(self.df.value, what, "StudentT")

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        b = jnp.broadcast_to(1.0 / self.scale.value, jnp.shape(y))
        return SuperGaussianForm(self._log_norm(), 0.0, -y * b, b)

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        nu = self.df.value
        return -0.5 * (nu + 1.0) * jnp.log1p(t / nu)

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """Gamma((df + 1) / 2, rate df)."""
        nu = self.df.value
        return log_gamma_density(w, 0.5 * (nu + 1.0), nu)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        nu = self.df.value
        return 0.5 * (nu + 1.0) / (nu + t)

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        # (1 + t / nu)^{-(nu+1)/2} = E e^{-t w}, w ~ Gamma((nu + 1)/2, rate nu); tilted:
        # rate nu + t
        nu = self.df.value
        return jax.random.gamma(key, jnp.broadcast_to(0.5 * (nu + 1.0), t.shape)) / (nu + t)


class Laplace(Likelihood, ScaleMixture):
    """p(y | f) = exp(-|y - f| / scale) / (2 scale).

    Augmentation: h = f - y, phi(t) = exp(-sqrt(t) / scale); q(w) is inverse Gaussian with
    mean 1 / (2 scale c) ([Galy-Fajou2020, Table 1]). Kinked at f = y (no Laplace
    approximation: use variational inference)."""

    twice_differentiable = False
    scale: Parameter

    def __init__(self, scale=1.0):
        self.scale = scalar_positive(scale, "Laplace scale")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        b = self.scale.value
        return -jnp.abs(y - f) / b - jnp.log(2.0 * b)

    def grad_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        return jnp.sign(y - f) / self.scale.value

    def hess_log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        # zero away from the kink at f = y (log-concave, but not strictly)
        return jnp.zeros(jnp.broadcast_shapes(jnp.shape(y), jnp.shape(f)))

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        b = self.scale.value
        d = y - mean
        pos = var > 0.0
        s = jnp.sqrt(jnp.where(pos, var, 1.0))  # double-where: finite gradients at var = 0
        z = d / s
        # E|y - f| = s [2 phi(z) + z (2 Phi(z) - 1)], z = (y - m)/s; -> |y - m| as v -> 0
        e_abs = 2.0 * s * jnp.exp(-0.5 * z**2 - 0.5 * _LOG_2PI) + d * erf(z / math.sqrt(2.0))
        return -jnp.where(pos, e_abs, jnp.abs(d)) / b - jnp.log(2.0 * b)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        b = self.scale.value
        d = y - mean
        pos = var > 0.0
        v = jnp.where(pos, var, 1.0)
        s = jnp.sqrt(v)
        # u = y - f ~ N(d, v): E[e^{-|u|/b}] = e^{v/(2b^2)} [e^{-d/b} Phi(d/s - s/b)
        #                                                  + e^{d/b} Phi(-d/s - s/b)]
        log_e = 0.5 * v / b**2 + jnp.logaddexp(-d / b + log_ndtr(d / s - s / b),
                                               d / b + log_ndtr(-d / s - s / b))
        return jnp.where(pos, log_e, -jnp.abs(d) / b) - jnp.log(2.0 * b)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return f

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.broadcast_to(2.0 * self.scale.value**2, jnp.shape(f))

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        return mean, var + 2.0 * self.scale.value**2

    def predictive_quantile(self, mean: ArrayLike, var: ArrayLike, level: float
                            ) -> Float[np.ndarray, " n"]:
        """The ``level`` quantile of y = f + Laplace(0, scale) noise, f ~ N(mean, var)
        (numpy): :func:`~augmentedgp.likelihoods.quantiles.noise_quantile`."""
        import scipy.stats

        return noise_quantile(scipy.stats.laplace(scale=float(self.scale.value)), mean, var,
                              level)

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        return SuperGaussianForm(-jnp.log(2.0 * self.scale.value), 0.0, -y, 1.0)

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        return -sqrt_floor(t) / self.scale.value

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """Levy: InvGamma(1/2, scale 1 / (4 scale^2)), Laplace transform e^{-sqrt(t) / scale}."""
        return log_inv_gamma(w, 0.5, 0.25 / self.scale.value**2)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        return 0.5 / (self.scale.value * sqrt_floor(t))

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        # e^{-sqrt(t) / s} = E e^{-t w}, w ~ Levy(1 / (2 s^2)); tilted: inverse Gaussian
        s = self.scale.value
        return samplers.inverse_gaussian(key, 0.5 / (s * sqrt_floor(t)), 0.5 / s**2)


class Matern32(Likelihood, ScaleMixture):
    """Matern-3/2 noise: p(y | f) = (a / 4) (1 + a |y - f|) e^{-a |y - f|}, a = sqrt(3) /
    scale (the likelihood [Galy-Fajou2020] builds from a kernel profile). Augmentation:
    h = f - y, phi(t) = (1 + a sqrt t) e^{-a sqrt t} (its Table 1 and App. A.6 print r where
    sqrt r is meant), q(w) generalised inverse Gaussian with mean a^2 / (2 (1 + a c)); noise
    variance 4 scale^2 / 3."""

    log_concave = True  # d^2/df^2 = -a^2 / (1 + a |y - f|)^2
    scale: Parameter

    def __init__(self, scale=1.0):
        self.scale = scalar_positive(scale, "Matern-3/2 noise scale")

    def _a(self):
        return math.sqrt(3.0) / self.scale.value

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                ) -> Float[Array, "*batch"]:
        a, r = self._a(), jnp.abs(y - f)
        return jnp.log(0.25 * a) + jnp.log1p(a * r) - a * r

    def _kinks(self, y):
        # the kink at f = y, and where log1p(a |y - f|) bends (its branch point is 1/a away)
        return jnp.asarray(y)[..., None] + jnp.asarray([-2.0, 0.0, 2.0]) / self._a()

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                                 var: Float[Array, " n"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """Gauss-Legendre split at the kink f = y (``kinked_expectation``, ``n`` nodes per
        panel, None: 20); Gauss-Hermite over the kink was off by ~2e-3 at var = 2."""
        n = 20 if n is None else n
        return kinked_expectation(lambda f: self.log_prob(y[..., None, None], f), mean, var,
                                  self._kinks(y), n)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, " n"],
                            var: Float[Array, " n"]) -> Float[Array, " n"]:
        """log int p(y | f) N(f | mean, var) df, Gauss-Legendre split at the kink f = y."""
        return kinked_expectation(lambda f: self.log_prob(y[..., None, None], f), mean, var,
                                  self._kinks(y), 20, log=True)

    def conditional_mean(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return f

    def conditional_variance(self, f: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
        return jnp.broadcast_to(4.0 / self._a() ** 2, jnp.shape(f))

    def predict_y(self, mean: Float[Array, " n"], var: Float[Array, " n"], n: int | None = None
                 ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        return mean, var + 4.0 / self._a() ** 2

    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        return SuperGaussianForm(jnp.log(0.25 * self._a()), 0.0, -y, 1.0)

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        a = self._a()
        ac = a * sqrt_floor(t)
        # log1p(x) - x = -x^2/2 + x^3/3 - ... : smooth in t at t = 0
        return jnp.where(ac < 1e-5, -0.5 * a**2 * t + a**3 * t**1.5 / 3.0, jnp.log1p(ac) - ac)

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """InvGamma(3/2, scale a^2 / 4), Laplace transform (1 + a sqrt t) e^{-a sqrt t}."""
        return log_inv_gamma(w, 1.5, 0.25 * self._a() ** 2)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        a = self._a()
        return 0.5 * a**2 / (1.0 + a * sqrt_floor(t))

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                     ) -> Float[Array, "*batch"]:
        # (1 + a sqrt t) e^{-a sqrt t} = E e^{-t w}, w ~ InvGamma(3/2, a^2 / 4); tilted:
        # GIG(-3/2, 2 t, a^2 / 2), density ~ w^{-5/2} e^{-t w - a^2 / (4 w)}
        a = self._a()
        return samplers.gig(key, -1.5, 2.0 * t, 0.5 * a**2)


def check_finite_variance(df, what: str, cls: str) -> None:
    """A ValueError for ``what`` if Student-t noise with ``df`` degrees of freedom has no
    variance (df <= 2; a concrete df only: traced values pass), suggesting a fixed df for
    the likelihood class named ``cls``."""
    if is_concrete(df) and float(df) <= 2.0:
        raise ValueError(
            f"{what}: the Student-t noise has df = {float(df):.4g} <= 2, so y has no finite "
            f"variance; fix df above 2 (e.g. {cls}(fixed(positive(4.0))) from "
            "augmentedgp.params) or use predict_f, the predictive density or quantiles")


def expected_log1p_square(d: Float[Array, "*batch"], v: Float[Array, "*batch"],
                          c: Float[ArrayLike, "*batch"], n: int = 256) -> Float[Array, "*batch"]:
    """E log(1 + r^2 / c) for r ~ N(d, v), elementwise, accurate for any v, d and c > 0.

    Frullani: log(1 + a) = int_0^inf (e^{-u} - e^{-u(1+a)}) du/u, and
    E exp(-u r^2/c) = (1 + 2uv/c)^{-1/2} exp(-u d^2/(c + 2uv)). The u-integral is done by
    the trapezoid rule in t = log u with ``n`` nodes (geometric convergence; 256 nodes:
    ~1e-14 even for (d^2 + v) / c ~ 1e10)."""
    d, v, c = jnp.broadcast_arrays(jnp.asarray(d, float), jnp.asarray(v, float),
                                   jnp.asarray(c, float))
    # below lo the integrand is ~ e^t (v + d^2)/c < 1e-16 of the result; above hi e^{-e^t}
    lo = jax.lax.stop_gradient(-37.0 - jnp.log1p((v + d**2) / c))
    t, h = uniform_nodes(lo, math.log(40.0), n)
    u = jnp.exp(t)
    vv, dd, cc = v[..., None], d[..., None], c[..., None]
    g = 0.5 * jnp.log1p(2.0 * u * vv / cc) + u * dd**2 / (cc + 2.0 * u * vv)
    return h * jnp.sum(jnp.exp(-u) * -jnp.expm1(-g), axis=-1)


def student_t_log_predictive(d2: Float[Array, "*batch"], v: Float[Array, "*batch"],
                             df: Float[ArrayLike, ""], log_s2: Float[ArrayLike, ""], n: int = 512
                            ) -> Float[Array, "*batch"]:
    """log int t_df(d | f, s) N(f | 0, v) df for d^2 = ``d2`` and log s^2 = ``log_s2``,
    elementwise, accurate for any v, d and s (~1e-11 relative for df in [0.1, 200] with the
    default ``n``; s^2 itself may exceed float64).

    Scale mixture: t_df(d | f, s) = int N(d | f, s^2 w) InvGamma(w | df/2, df/2) dw, so the
    integral is int N(d | 0, v + s^2 w) InvGamma(w | df/2, df/2) dw, done by the trapezoid
    rule in t = log w with ``n`` nodes."""
    b = 0.5 * df
    d2, v, log_s2 = jnp.broadcast_arrays(jnp.asarray(d2, float), jnp.asarray(v, float),
                                         jnp.asarray(log_s2, float))
    # the integrand peaks below t = log((d^2 + v)/s^2) and is < e^{-40} of its peak
    # outside [lo, hi]: exp(-b (e^{-t} + t - 1)) on the left, e^{-(b + 1/2) t} on the right
    lo = -jnp.minimum(jnp.sqrt(80.0 / b), jnp.log1p(80.0 / b) + 5.0)
    peak = jnp.maximum(0.0, jnp.log(jnp.maximum(d2 + v, 1e-300)) - log_s2)
    hi = peak + jnp.sqrt(80.0 / b) + 40.0 / (b + 0.5)
    t, h = uniform_nodes(jax.lax.stop_gradient(lo), jax.lax.stop_gradient(hi), n)
    log_tot = jnp.logaddexp(jnp.log(v)[..., None], log_s2[..., None] + t)  # log(v + s^2 w)
    log_f = (b * jnp.log(b) - gammaln(b) - b * (t + jnp.exp(-t))  # InvGamma(w) dw/dt
             - 0.5 * (_LOG_2PI + log_tot + d2[..., None] * jnp.exp(-log_tot)))
    return jax.scipy.special.logsumexp(log_f, axis=-1) + jnp.log(h)
