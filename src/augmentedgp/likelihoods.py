"""Observation models p(y | f) for one latent function.

Each likelihood gives the elementwise ``log_prob(y, f)``, its first two derivatives in f
(for Newton/Laplace), the predictive distribution of y under f ~ N(mean, var), and a
``check_targets`` that validates and converts user targets at the public boundary.
Likelihoods that are also :class:`~augmentedgp.augmentation.Augmented` carry a
conditionally conjugate augmentation (AnalyticVI): Gaussian, Logistic, BayesianSVM,
StudentT, Laplace, Matern32, LogisticPoisson and NegativeBinomial.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, gammaln, log_ndtr, ndtr, xlogy

from . import samplers
from .augmentation import Augmented, CountAux, PolyaGamma, SuperGaussian, log_cosh_sqrt, tanh_ratio
from .params import Parameter, positive
from .quadrature import gauss_hermite, log_gauss_hermite
from .validation import check_binary, check_finite, check_y

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def _sqrt_floor(t):
    """sqrt(t), floored at 1e-150 so that its reciprocal stays finite."""
    return jnp.sqrt(jnp.maximum(t, 1e-300))


@functools.lru_cache(maxsize=1)
def _laguerre_nodes(n: int = 64):
    return np.polynomial.laguerre.laggauss(n)  # for int_0^inf e^{-x} g(x) dx


class Likelihood(eqx.Module):
    """Base class: ``log_prob(y, f)`` elementwise, its derivatives, the variational
    expectations and the predictive distribution of y given a Gaussian q(f)."""

    def log_prob(self, y, f):
        raise NotImplementedError

    def grad_log_prob(self, y, f):
        """d/df log p(y|f), elementwise."""
        return jax.vmap(jax.grad(self.log_prob, argnums=1))(y, f)

    def hess_log_prob(self, y, f):
        """d^2/df^2 log p(y|f), elementwise (the negative of W in Laplace)."""
        return jax.vmap(jax.grad(lambda yi, fi: self.grad_log_prob(yi[None], fi[None])[0], 1))(y, f)

    def check_targets(self, y):
        """Validated targets in the internal encoding (raises ValueError)."""
        return y

    def targets(self, y, n: int, name: str = "y"):
        """``check_targets`` of a numeric vector of n targets (an (n, 1) column is accepted)."""
        return self.check_targets(check_y(y, n, name))

    def predictive_log_prob(self, y, mean, var):
        """log int p(y|f) N(f | mean, var) df, elementwise (100-point Gauss-Hermite in log
        space: ~1e-12 relative for a likelihood as narrow as a third of the latent sd)."""
        return log_gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var)

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        """E_{N(f | mean, var)}[log p(y | f)], elementwise: the data term of the ELBO
        (seed 001 eq. 3.3). Gauss-Hermite with ``n`` nodes unless a closed form exists;
        ``key`` seeds the likelihoods that use Monte Carlo (ignored by the others)."""
        return gauss_hermite(lambda f: self.log_prob(y[..., None], f), mean, var, n)

    def conditional_mean(self, f):
        """E[y | f]."""
        raise NotImplementedError(f"{type(self).__name__} has no conditional mean")

    def conditional_variance(self, f):
        """Var[y | f]."""
        raise NotImplementedError(f"{type(self).__name__} has no conditional variance")

    def predict_y(self, mean, var, n: int = 32):
        """Mean and variance of y when f ~ N(mean, var) (law of total variance,
        Gauss-Hermite)."""
        ey = gauss_hermite(self.conditional_mean, mean, var, n)
        ey2 = gauss_hermite(lambda f: self.conditional_variance(f) + self.conditional_mean(f) ** 2,
                            mean, var, n)
        return ey, jnp.maximum(ey2 - ey**2, 0.0)


class Gaussian(Likelihood, Augmented):
    """y = f + e, e ~ N(0, variance). Conjugate as it is: in the augmentation scheme
    h = (f - y) / sqrt(2 variance) and phi(t) = e^-t, so w = 1."""

    variance: Parameter

    def __init__(self, variance=1.0):
        self.variance = positive(variance, "noise variance")

    def log_prob(self, y, f):
        s2 = self.variance.value
        return -0.5 * (_LOG_2PI + jnp.log(s2) + (y - f) ** 2 / s2)

    def grad_log_prob(self, y, f):
        return (y - f) / self.variance.value

    def hess_log_prob(self, y, f):
        return jnp.broadcast_to(-1.0 / self.variance.value, jnp.shape(f))

    def predict_y(self, mean, var):
        """Mean and variance of y."""
        return mean, var + self.variance.value

    def predictive_log_prob(self, y, mean, var):
        v = var + self.variance.value
        return -0.5 * (_LOG_2PI + jnp.log(v) + (y - mean) ** 2 / v)

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        s2 = self.variance.value  # closed form (seed 001 A.4)
        return -0.5 * (_LOG_2PI + jnp.log(s2) + ((y - mean) ** 2 + var) / s2)

    def _super_gaussian(self, y):
        s2 = self.variance.value
        b = jnp.broadcast_to(1.0 / jnp.sqrt(2.0 * s2), jnp.shape(y))
        return SuperGaussian(-0.5 * (_LOG_2PI + jnp.log(s2)), 0.0, -y * b, b)

    def _log_phi(self, y, t):
        return -t

    def _omega_mean(self, y, t):
        return jnp.ones_like(t)

    def _sample_omega(self, key, y, t):
        return jnp.ones_like(t)


class Bernoulli(Likelihood):
    """Binary y in {-1, +1} (users may pass {0, 1}); p(y | f) = sigmoid(y f)."""

    def check_targets(self, y):
        return check_binary(y)

    def predict_proba(self, mean, var):
        """p(y = +1) = int sigmoid(f) N(f | mean, var) df."""
        raise NotImplementedError

    def predict_y(self, mean, var):
        p = self.predict_proba(mean, var)
        return p, p * (1.0 - p)

    def conditional_mean(self, f):
        return jnp.exp(self.log_prob(jnp.ones_like(f), f))  # p(y = +1 | f)

    def conditional_variance(self, f):
        p = self.conditional_mean(f)
        return p * (1.0 - p)

    def predictive_log_prob(self, y, mean, var):
        p = self.predict_proba(mean, var)
        return jnp.log(jnp.where(y > 0, p, 1.0 - p))


class Logistic(Bernoulli, PolyaGamma):
    """p(y | f) = 1 / (1 + exp(-y f)) = e^{y f / 2} / (2 cosh(f / 2)); augmented with
    Polya-Gamma variables, q(w) = PG(1, c) (thesis ch. 3)."""

    pg_method = "devroye"  # b = 1: exact

    def _super_gaussian(self, y):
        return SuperGaussian(-_LOG_2, 0.5 * y, 0.0, 1.0)

    def _pg_b(self, y):
        return 1.0

    def log_prob(self, y, f):
        return -jax.nn.softplus(-y * f)

    def grad_log_prob(self, y, f):
        return y * jax.nn.sigmoid(-y * f)  # = (y + 1)/2 - sigmoid(f)   (seed 002 A.6)

    def hess_log_prob(self, y, f):
        return -jax.nn.sigmoid(f) * jax.nn.sigmoid(-f)

    def predict_proba(self, mean, var):
        """int sigmoid(f) N(f | m, v) df, accurate to ~1e-12 for any variance.

        Small v: Gauss-Hermite. Large v (the sigmoid's step is narrow against the Gaussian):
        sigmoid(f) = 1[f > 0] - sign(f) sigmoid(-|f|) gives
        Phi(m / sqrt(v)) + int_0^inf e^{-x} sigmoid(x) [N(-x | m, v) - N(x | m, v)] dx,
        a smooth integrand for Gauss-Laguerre.
        """
        mean, var = jnp.asarray(mean), jnp.asarray(var)
        small = gauss_hermite(jax.nn.sigmoid, mean, var, 64)
        x, w = _laguerre_nodes()
        v = jnp.maximum(var, 1e-12)[..., None]
        m = mean[..., None]
        dens = lambda t: jnp.exp(-0.5 * (t - m) ** 2 / v) / jnp.sqrt(2.0 * math.pi * v)
        large = ndtr(mean / jnp.sqrt(jnp.maximum(var, 1e-12))) + jnp.sum(
            w * jax.nn.sigmoid(x) * (dens(-x) - dens(x)), axis=-1)
        return jnp.where(var < 3.0, small, large)


class Probit(Bernoulli):
    """p(y | f) = Phi(y f)."""

    def log_prob(self, y, f):
        return log_ndtr(y * f)

    def _ratio(self, z):
        """N(z) / Phi(z), stable for very negative z."""
        return jnp.exp(-0.5 * z**2 - 0.5 * _LOG_2PI - log_ndtr(z))

    def grad_log_prob(self, y, f):
        return y * self._ratio(y * f)

    def hess_log_prob(self, y, f):
        z = y * f
        r = self._ratio(z)
        return -r * (r + z)  # R&W eq. 3.16 with y^2 = 1

    def predict_proba(self, mean, var):
        return ndtr(mean / jnp.sqrt(1.0 + var))  # int Phi(f) N(f|m,v) df = Phi(m / sqrt(1+v))


class BayesianSVM(Bernoulli, Augmented):
    """The Bayesian SVM pseudo-likelihood L(y | f) = exp(-2 max(1 - y f, 0)) (Polson & Scott
    2011; Wenzel et al. 2017), y in {-1, +1}. Augmentation: L = e^{-1} e^{y f} e^{-|1 - y f|},
    h = 1 - y f, phi(t) = e^{-sqrt t}, q(w) inverse Gaussian with mean 1 / (2 c).

    L is not normalised over y; class probabilities use p(y = +1 | f) = L(+1 | f) /
    (L(+1 | f) + L(-1 | f)), averaged over f by Gauss-Hermite."""

    def log_prob(self, y, f):
        return -2.0 * jnp.maximum(1.0 - y * f, 0.0)

    def conditional_mean(self, f):
        return jax.nn.sigmoid(self.log_prob(1.0, f) - self.log_prob(-1.0, f))

    def predict_proba(self, mean, var):
        return gauss_hermite(self.conditional_mean, jnp.asarray(mean), jnp.asarray(var), 100)

    def _super_gaussian(self, y):
        return SuperGaussian(-1.0, y, 1.0, -y)

    def _log_phi(self, y, t):
        return -_sqrt_floor(t)

    def _omega_mean(self, y, t):
        return 0.5 / _sqrt_floor(t)

    def _sample_omega(self, key, y, t):
        # e^{-sqrt t} = E e^{-t w}, w ~ Levy(1/2); tilted: inverse Gaussian(1 / (2c), 1/2)
        return samplers.inverse_gaussian(key, 0.5 / _sqrt_floor(t), 0.5)


# --- non-Gaussian likelihoods for quadrature variational inference ----------------------


_finite_targets = check_finite


def _count_targets(y, name: str = "y", integer: bool = True) -> np.ndarray:
    """Non-negative integer counts (any non-negative values if not ``integer``), as floats."""
    arr = _finite_targets(y, name)
    if np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative counts, got minimum {arr.min()}")
    if integer and np.any(arr != np.round(arr)):
        bad = arr[arr != np.round(arr)]
        raise ValueError(f"{name} must hold integer counts, got non-integer values {bad[:6]}")
    return arr


def _uniform_nodes(lo, hi, n: int):
    """n equispaced nodes on [lo, hi] (broadcast, nodes on a new last axis) and the step.
    Full weights at the ends: the integrands using this are negligible there."""
    lo, hi = jnp.broadcast_arrays(jnp.asarray(lo, float), jnp.asarray(hi, float))
    h = (hi - lo) / (n - 1)
    return lo[..., None] + h[..., None] * jnp.arange(n), h


class Poisson(Likelihood):
    """y ~ Poisson(binsize * exp(f)), y = 0, 1, 2, ... ``integer=False`` also accepts
    non-negative real y, with the same log density (the quasi-Poisson likelihood of
    scikit-learn's PoissonRegressor)."""

    binsize: float = eqx.field(static=True)
    integer: bool = eqx.field(static=True)

    def __init__(self, binsize=1.0, integer: bool = True):
        if not (np.isfinite(binsize) and binsize > 0):
            raise ValueError(f"binsize must be finite and > 0, got {binsize!r}")
        self.binsize = float(binsize)
        self.integer = bool(integer)

    def check_targets(self, y):
        return _count_targets(y, integer=self.integer)

    def log_prob(self, y, f):
        # y log(b e^f) - b e^f - log y!
        return y * (f + math.log(self.binsize)) - self.binsize * jnp.exp(f) - gammaln(y + 1.0)

    def grad_log_prob(self, y, f):
        return y - self.binsize * jnp.exp(f)

    def hess_log_prob(self, y, f):
        return jnp.broadcast_to(-self.binsize * jnp.exp(f),
                                jnp.broadcast_shapes(jnp.shape(y), jnp.shape(f)))

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        # E[e^f] = exp(m + v/2) (lognormal mean)
        return (y * (mean + math.log(self.binsize)) - self.binsize * jnp.exp(mean + 0.5 * var)
                - gammaln(y + 1.0))

    def conditional_mean(self, f):
        return self.binsize * jnp.exp(f)

    def conditional_variance(self, f):
        return self.binsize * jnp.exp(f)

    def predict_y(self, mean, var, n: int = 32):
        # E[y] = b e^{m + v/2}; Var[y] = E[y] + b^2 (e^v - 1) e^{2m + v}
        ey = self.binsize * jnp.exp(mean + 0.5 * var)
        return ey, ey + ey**2 * jnp.expm1(var)


class PoissonTilt(NamedTuple):
    """q(n, w) = Po(n | n_mean) PG(w | y + n, c) (with w the Polya-Gamma variable / 2)."""

    c2: jax.Array
    n_mean: jax.Array


class LogisticPoisson(Likelihood, Augmented):
    """y ~ Poisson(rate * sigmoid(f)): counts with a bounded intensity (Donner & Opper 2018;
    thesis ch. 4 and 7). Augmentation: e^{-rate sigmoid(f)} = e^{-rate} sum_n (rate
    sigmoid(-f))^n / n! adds a latent count n | f ~ Po(rate sigmoid(-f)) (sigma(-f), as the
    errata correct), then sigmoid(f)^y sigmoid(-f)^n is Polya-Gamma with b = y + n. The
    optimal q(n) is Poisson with mean rate e^{-m/2} / (2 cosh(c/2)), c^2 = E[f^2]."""

    rate: Parameter

    def __init__(self, rate=1.0):
        self.rate = positive(rate, "Poisson maximum rate")

    def check_targets(self, y):
        return _count_targets(y)

    def log_prob(self, y, f):
        lam = self.rate.value
        return (y * (jnp.log(lam) + jax.nn.log_sigmoid(f)) - lam * jax.nn.sigmoid(f)
                - gammaln(y + 1.0))

    def conditional_mean(self, f):
        return self.rate.value * jax.nn.sigmoid(f)

    def conditional_variance(self, f):
        return self.rate.value * jax.nn.sigmoid(f)

    def aux_posterior(self, y, mean, var):
        c2 = mean**2 + var
        return PoissonTilt(c2, jnp.exp(jnp.log(self.rate.value) - 0.5 * mean - _LOG_2
                                       - log_cosh_sqrt(c2)))

    def aux_sites(self, y, q_aux):
        b = y + q_aux.n_mean
        return 0.5 * (y - q_aux.n_mean), b * tanh_ratio(jnp.sqrt(q_aux.c2))

    def sample_aux(self, key, y, f):
        """n ~ Po(rate sigmoid(-f)), then w ~ PG(y + n, |f|) / 2 (the errata's sigma(-f))."""
        kn, kw = jax.random.split(key)
        n = jax.random.poisson(kn, self.rate.value * jax.nn.sigmoid(-f)).astype(f.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, y + n, f))

    def sites(self, y, aux):
        return 0.5 * (y - aux.n), 2.0 * aux.w

    def augmented_expectations(self, y, mean, var, q_aux=None):
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


class StudentT(Likelihood, Augmented):
    """y = f + scale * t_df (Student-t noise; heavy tails, robust regression).

    Augmentation: a gamma scale mixture of Gaussians, h = (f - y) / scale,
    phi(t) = (1 + t / df)^{-(df + 1)/2}, q(w) = Gamma((df + 1)/2, rate df + c^2)
    (thesis ch. 5 Table 1, normaliser corrected to Gamma(df / 2) as in the errata)."""

    df: Parameter
    scale: Parameter

    def __init__(self, df=3.0, scale=1.0):
        self.df = positive(df, "Student-t degrees of freedom")
        self.scale = positive(scale, "Student-t scale")

    def check_targets(self, y):
        return _finite_targets(y)

    def log_prob(self, y, f):
        nu, s = self.df.value, self.scale.value
        return self._log_norm() - 0.5 * (nu + 1.0) * jnp.log1p(((y - f) / s) ** 2 / nu)

    def grad_log_prob(self, y, f):
        nu, s2, r = self.df.value, self.scale.value**2, y - f
        return (nu + 1.0) * r / (nu * s2 + r**2)

    def hess_log_prob(self, y, f):
        nu, s2, r = self.df.value, self.scale.value**2, y - f
        return (nu + 1.0) * (r**2 - nu * s2) / (nu * s2 + r**2) ** 2  # > 0 for |r| > s sqrt(nu)

    def _log_norm(self):
        nu = self.df.value  # log G((nu+1)/2) - log G(nu/2) - log(s sqrt(nu pi))
        return (gammaln(0.5 * (nu + 1.0)) - gammaln(0.5 * nu) - 0.5 * jnp.log(nu * math.pi)
                - jnp.log(self.scale.value))

    def variational_expectations(self, y, mean, var, n: int = 256, key=None):
        """Accurate for any variance (Gauss-Hermite is not once sqrt(var) >~ scale sqrt(df):
        the integrand has poles at f = y +- i scale sqrt(df)). ``n``: trapezoid nodes.

        Frullani: log(1 + a) = int_0^inf (e^{-u} - e^{-u(1+a)}) du/u, and for r = y - f ~
        N(d, v), E exp(-u r^2/c) = (1 + 2uv/c)^{-1/2} exp(-u d^2/(c + 2uv)), c = df scale^2.
        The u-integral is done by the trapezoid rule in t = log u (geometric convergence;
        256 nodes: ~1e-14 even for (y - mean)^2 / (df scale^2) ~ 1e10).
        """
        nu = self.df.value
        c = nu * self.scale.value**2
        d, v = jnp.asarray(y - mean), jnp.asarray(var)
        d, v = jnp.broadcast_arrays(d, v)
        # below lo the integrand is ~ e^t (v + d^2)/c < 1e-16 of the result; above hi e^{-e^t}
        lo = jax.lax.stop_gradient(-37.0 - jnp.log1p((v + d**2) / c))
        t, h = _uniform_nodes(lo, math.log(40.0), n)
        u = jnp.exp(t)
        vv, dd = v[..., None], d[..., None]
        g = 0.5 * jnp.log1p(2.0 * u * vv / c) + u * dd**2 / (c + 2.0 * u * vv)
        e_log1p = h * jnp.sum(jnp.exp(-u) * -jnp.expm1(-g), axis=-1)  # E log(1 + r^2/c)
        return self._log_norm() - 0.5 * (nu + 1.0) * e_log1p

    def predictive_log_prob(self, y, mean, var):
        """Accurate for any variance (the generic Gauss-Hermite rule is not, see above).

        Scale mixture: t_df(y | f, s) = int N(y | f, s^2 w) InvGamma(w | df/2, df/2) dw, so
        p(y) = int N(y | mean, var + s^2 w) InvGamma(w | df/2, df/2) dw; trapezoid rule in
        t = log w (512 nodes: ~1e-11 relative for df in [0.1, 200], any var, y - mean).
        """
        b, s2 = 0.5 * self.df.value, self.scale.value**2
        d2, v = jnp.broadcast_arrays(jnp.asarray(y - mean) ** 2, jnp.asarray(var))
        # the integrand peaks below t = log((d^2 + v)/s^2) and is < e^{-40} of its peak
        # outside [lo, hi]: exp(-b (e^{-t} + t - 1)) on the left, e^{-(b + 1/2) t} on the right
        lo = -jnp.minimum(jnp.sqrt(80.0 / b), jnp.log1p(80.0 / b) + 5.0)
        peak = jnp.maximum(0.0, jnp.log(jnp.maximum(d2 + v, 1e-300) / s2))
        hi = peak + jnp.sqrt(80.0 / b) + 40.0 / (b + 0.5)
        t, h = _uniform_nodes(jax.lax.stop_gradient(lo), jax.lax.stop_gradient(hi), 512)
        tot = v[..., None] + s2 * jnp.exp(t)
        log_f = (b * jnp.log(b) - gammaln(b) - b * (t + jnp.exp(-t))  # InvGamma(w) dw/dt
                 - 0.5 * (_LOG_2PI + jnp.log(tot) + d2[..., None] / tot))
        return jax.scipy.special.logsumexp(log_f, axis=-1) + jnp.log(h)

    def conditional_mean(self, f):
        return f

    def conditional_variance(self, f):
        nu = self.df.value
        # s^2 nu / (nu - 2) for nu > 2, infinite otherwise
        v = self.scale.value**2 * nu / jnp.where(nu > 2.0, nu - 2.0, 1.0)
        return jnp.broadcast_to(jnp.where(nu > 2.0, v, jnp.inf), jnp.shape(f))

    def predict_y(self, mean, var, n: int = 32):
        return mean, var + self.conditional_variance(mean)

    def _super_gaussian(self, y):
        b = jnp.broadcast_to(1.0 / self.scale.value, jnp.shape(y))
        return SuperGaussian(self._log_norm(), 0.0, -y * b, b)

    def _log_phi(self, y, t):
        nu = self.df.value
        return -0.5 * (nu + 1.0) * jnp.log1p(t / nu)

    def _omega_mean(self, y, t):
        nu = self.df.value
        return 0.5 * (nu + 1.0) / (nu + t)

    def _sample_omega(self, key, y, t):
        # (1 + t / nu)^{-(nu+1)/2} = E e^{-t w}, w ~ Gamma((nu + 1)/2, rate nu); tilted:
        # rate nu + t
        nu = self.df.value
        return jax.random.gamma(key, jnp.broadcast_to(0.5 * (nu + 1.0), t.shape)) / (nu + t)


class Laplace(Likelihood, Augmented):
    """p(y | f) = exp(-|y - f| / scale) / (2 scale).

    Augmentation: h = f - y, phi(t) = exp(-sqrt(t) / scale); q(w) is inverse Gaussian with
    mean 1 / (2 scale c) (thesis ch. 5 Table 1)."""

    scale: Parameter

    def __init__(self, scale=1.0):
        self.scale = positive(scale, "Laplace scale")

    def check_targets(self, y):
        return _finite_targets(y)

    def log_prob(self, y, f):
        b = self.scale.value
        return -jnp.abs(y - f) / b - jnp.log(2.0 * b)

    def grad_log_prob(self, y, f):
        return jnp.sign(y - f) / self.scale.value

    def hess_log_prob(self, y, f):
        # zero away from the kink at f = y (log-concave, but not strictly)
        return jnp.zeros(jnp.broadcast_shapes(jnp.shape(y), jnp.shape(f)))

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        b = self.scale.value
        d = y - mean
        pos = var > 0.0
        s = jnp.sqrt(jnp.where(pos, var, 1.0))  # double-where: finite gradients at var = 0
        z = d / s
        # E|y - f| = s [2 phi(z) + z (2 Phi(z) - 1)], z = (y - m)/s; -> |y - m| as v -> 0
        e_abs = 2.0 * s * jnp.exp(-0.5 * z**2 - 0.5 * _LOG_2PI) + d * erf(z / math.sqrt(2.0))
        return -jnp.where(pos, e_abs, jnp.abs(d)) / b - jnp.log(2.0 * b)

    def predictive_log_prob(self, y, mean, var):
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

    def conditional_mean(self, f):
        return f

    def conditional_variance(self, f):
        return jnp.broadcast_to(2.0 * self.scale.value**2, jnp.shape(f))

    def predict_y(self, mean, var, n: int = 32):
        return mean, var + 2.0 * self.scale.value**2

    def _super_gaussian(self, y):
        return SuperGaussian(-jnp.log(2.0 * self.scale.value), 0.0, -y, 1.0)

    def _log_phi(self, y, t):
        return -_sqrt_floor(t) / self.scale.value

    def _omega_mean(self, y, t):
        return 0.5 / (self.scale.value * _sqrt_floor(t))

    def _sample_omega(self, key, y, t):
        # e^{-sqrt(t) / s} = E e^{-t w}, w ~ Levy(1 / (2 s^2)); tilted: inverse Gaussian
        s = self.scale.value
        return samplers.inverse_gaussian(key, 0.5 / (s * _sqrt_floor(t)), 0.5 / s**2)


class Matern32(Likelihood, Augmented):
    """Matern-3/2 noise: p(y | f) = (a / 4) (1 + a |y - f|) e^{-a |y - f|}, a = sqrt(3) /
    scale (the thesis' new likelihood from a kernel profile, ch. 5). Augmentation: h = f - y,
    phi(t) = (1 + a sqrt t) e^{-a sqrt t} (the errata's reading), q(w) generalised inverse
    Gaussian with mean a^2 / (2 (1 + a c)); noise variance 4 scale^2 / 3."""

    scale: Parameter

    def __init__(self, scale=1.0):
        self.scale = positive(scale, "Matern-3/2 noise scale")

    def check_targets(self, y):
        return _finite_targets(y)

    def _a(self):
        return math.sqrt(3.0) / self.scale.value

    def log_prob(self, y, f):
        a, r = self._a(), jnp.abs(y - f)
        return jnp.log(0.25 * a) + jnp.log1p(a * r) - a * r

    def conditional_mean(self, f):
        return f

    def conditional_variance(self, f):
        return jnp.broadcast_to(4.0 / self._a() ** 2, jnp.shape(f))

    def predict_y(self, mean, var, n: int = 32):
        return mean, var + 4.0 / self._a() ** 2

    def _super_gaussian(self, y):
        return SuperGaussian(jnp.log(0.25 * self._a()), 0.0, -y, 1.0)

    def _log_phi(self, y, t):
        a = self._a()
        ac = a * _sqrt_floor(t)
        # log1p(x) - x = -x^2/2 + x^3/3 - ... : smooth in t at t = 0
        return jnp.where(ac < 1e-5, -0.5 * a**2 * t + a**3 * t**1.5 / 3.0, jnp.log1p(ac) - ac)

    def _omega_mean(self, y, t):
        a = self._a()
        return 0.5 * a**2 / (1.0 + a * _sqrt_floor(t))

    def _sample_omega(self, key, y, t):
        # (1 + a sqrt t) e^{-a sqrt t} = E e^{-t w}, w ~ InvGamma(3/2, a^2 / 4); tilted:
        # GIG(-3/2, 2 t, a^2 / 2), density ~ w^{-5/2} e^{-t w - a^2 / (4 w)}
        a = self._a()
        return samplers.gig(key, -1.5, 2.0 * t, 0.5 * a**2)


class NegativeBinomial(Likelihood, PolyaGamma):
    """Counts with p(y | f) = Gamma(y + r) / (Gamma(r) y!) sigmoid(f)^y sigmoid(-f)^r:
    mean r e^f, variance r e^f (1 + e^f) (overdispersed Poisson; Poisson as r -> inf).

    Augmentation: sigmoid(f)^y sigmoid(-f)^r = 2^{-(y + r)} e^{(y - r) f / 2}
    cosh(f / 2)^{-(y + r)}, Polya-Gamma with b = y + r (Polson et al. 2013).
    ``integer=False`` also accepts non-negative real y (the same density, gamma functions
    for the factorials)."""

    r: Parameter
    integer: bool = eqx.field(static=True)

    def __init__(self, r=1.0, integer: bool = True):
        self.r = positive(r, "negative-binomial dispersion r")
        self.integer = bool(integer)

    def check_targets(self, y):
        return _count_targets(y, integer=self.integer)

    def log_prob(self, y, f):
        r = self.r.value
        return (gammaln(y + r) - gammaln(r) - gammaln(y + 1.0)
                + y * jax.nn.log_sigmoid(f) + r * jax.nn.log_sigmoid(-f))

    def grad_log_prob(self, y, f):
        return y * jax.nn.sigmoid(-f) - self.r.value * jax.nn.sigmoid(f)

    def hess_log_prob(self, y, f):
        return -(y + self.r.value) * jax.nn.sigmoid(f) * jax.nn.sigmoid(-f)

    def variational_expectations(self, y, mean, var, n: int = 64, key=None):
        # 20 nodes leave ~1e-7 at var = 2; 64 nodes ~1e-13 up to var = 2, ~1e-10 at var = 4
        return super().variational_expectations(y, mean, var, n)

    def conditional_mean(self, f):
        return self.r.value * jnp.exp(f)

    def conditional_variance(self, f):
        return self.r.value * jnp.exp(f) * (1.0 + jnp.exp(f))  # mu + mu^2 / r

    def predict_y(self, mean, var, n: int = 32):
        # E[y] = r e^{m + v/2}; Var[y] = E[y] + r (r + 1) e^{2m + 2v} - E[y]^2
        r = self.r.value
        ey = r * jnp.exp(mean + 0.5 * var)
        return ey, ey + ey**2 * (jnp.exp(var) * (1.0 + 1.0 / r) - 1.0)

    def _super_gaussian(self, y):
        r = self.r.value
        log_c = gammaln(y + r) - gammaln(r) - gammaln(y + 1.0) - (y + r) * _LOG_2
        return SuperGaussian(log_c, 0.5 * (y - r), 0.0, 1.0)

    def _pg_b(self, y):
        return y + self.r.value


class Gamma(Likelihood):
    """y ~ Gamma(shape, rate = shape e^{-f}): positive y with mean e^f, variance e^{2f}/shape."""

    shape: Parameter

    def __init__(self, shape=1.0):
        self.shape = positive(shape, "gamma shape")

    def check_targets(self, y):
        arr = _finite_targets(y)
        if np.any(arr <= 0):
            raise ValueError(f"y must be strictly positive for a Gamma likelihood, "
                             f"got minimum {arr.min()}")
        return arr

    def log_prob(self, y, f):
        k = self.shape.value
        # k log(k e^{-f}) - log Gamma(k) + (k - 1) log y - k e^{-f} y
        return (k * (jnp.log(k) - f) - gammaln(k) + (k - 1.0) * jnp.log(y)
                - k * y * jnp.exp(-f))

    def grad_log_prob(self, y, f):
        k = self.shape.value
        return k * (y * jnp.exp(-f) - 1.0)

    def hess_log_prob(self, y, f):
        return -self.shape.value * y * jnp.exp(-f)

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        k = self.shape.value
        # E[e^{-f}] = exp(-m + v/2)
        return (k * (jnp.log(k) - mean) - gammaln(k) + (k - 1.0) * jnp.log(y)
                - k * y * jnp.exp(-mean + 0.5 * var))

    def conditional_mean(self, f):
        return jnp.exp(f)

    def conditional_variance(self, f):
        return jnp.exp(2.0 * f) / self.shape.value

    def predict_y(self, mean, var, n: int = 32):
        # E[y] = e^{m + v/2}; E[y^2] = (1 + 1/k) e^{2m + 2v}
        ey = jnp.exp(mean + 0.5 * var)
        return ey, ey**2 * (jnp.exp(var) * (1.0 + 1.0 / self.shape.value) - 1.0)


class Beta(Likelihood):
    """y ~ Beta(mu precision, (1 - mu) precision), mu = sigmoid(f): y in (0, 1) with mean mu,
    variance mu (1 - mu) / (1 + precision)."""

    precision: Parameter

    def __init__(self, precision=10.0):
        self.precision = positive(precision, "beta precision")

    def check_targets(self, y):
        arr = _finite_targets(y)
        if np.any((arr <= 0) | (arr >= 1)):
            raise ValueError(f"y must lie strictly inside (0, 1) for a Beta likelihood, "
                             f"got values in [{arr.min()}, {arr.max()}]")
        return arr

    def log_prob(self, y, f):
        phi = self.precision.value
        a, b = phi * jax.nn.sigmoid(f), phi * jax.nn.sigmoid(-f)  # 1 - sigmoid(f) = sigmoid(-f)
        return (gammaln(phi) - gammaln(a) - gammaln(b) + (a - 1.0) * jnp.log(y)
                + (b - 1.0) * jnp.log1p(-y))

    def variational_expectations(self, y, mean, var, n: int = 64, key=None):
        # 20 nodes leave ~1e-6 at var = 2; 64 nodes ~1e-13 up to var = 2, ~1e-9 at var = 4
        return super().variational_expectations(y, mean, var, n)

    def conditional_mean(self, f):
        return jax.nn.sigmoid(f)

    def conditional_variance(self, f):
        return jax.nn.sigmoid(f) * jax.nn.sigmoid(-f) / (1.0 + self.precision.value)




# several latent functions: multi-class and heteroscedastic (they build on the classes above)
from .multilatent import (  # noqa: E402, F401
    Categorical,
    HeteroscedasticGaussian,
    LogisticSoftmax,
    MultiLatent,
    RobustMax,
    Softmax,
)
