"""Likelihoods of several latent functions: multi-class classification and heteroscedastic
regression.

The latent values of observation i form a vector f_i = (f_i^1, ..., f_i^C); SVGP and VGP
keep one q(u^c) per latent (shared inducing inputs), so the marginals passed to every
method here are arrays of shape (n, C) of means and variances, independent across c.

- :class:`LogisticSoftmax` p(y = k | f) = sigmoid(f_k) / sum_c sigmoid(f_c) (thesis ch. 4),
  augmented with lambda (Gamma), n^c (Poisson) and w^c (Polya-Gamma);
- :class:`Softmax` (Monte Carlo expectations) and :class:`RobustMax` (Hernandez-Lobato et
  al. 2011; Hensman et al. 2015, one-dimensional quadrature): the usual non-augmented
  multi-class likelihoods;
- :class:`HeteroscedasticGaussian` y ~ N(f, 1 / (precision * sigmoid(g))) (thesis 7.2),
  augmented in g with a Poisson and a Polya-Gamma variable.

Class probabilities integrate over the latent predictive distribution (randomised
quasi-Monte Carlo over C dimensions; one-dimensional Gauss-Hermite for RobustMax), never
the plug-in mean.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import log_ndtr, logsumexp

from . import samplers
from .augmentation import Augmented, CountAux, log_cosh_sqrt, tanh_ratio
from .likelihoods import Likelihood, _finite_targets
from .params import Parameter, fixed, positive
from .quadrature import _nodes, gauss_hermite, log_gauss_hermite
from .validation import check_vector

_LOG_2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)


@functools.lru_cache(maxsize=8)
def _qmc_normal(n_samples: int, dim: int) -> np.ndarray:
    """(n_samples, dim) scrambled-Sobol standard normal points (fixed seed): quasi-Monte
    Carlo error ~ 1 / n_samples for smooth integrands (Owen 1998)."""
    import warnings

    from scipy.stats import norm, qmc

    with warnings.catch_warnings():  # balance is exact only for powers of 2; fine for any n
        warnings.simplefilter("ignore", UserWarning)
        u = qmc.Sobol(dim, scramble=True, seed=0).random(n_samples)
    return norm.ppf(np.clip(u, 1e-12, 1.0 - 1e-12))


def _mc_expectation(fn, mean, var, n_samples, key=None):
    """E[fn(f_i)] for f_i ~ N(mean_i, diag var_i), per row i; ``fn`` maps (..., C) latent
    vectors to (...) or (..., K). With a key: independent pseudo-random draws for every row
    (unbiased stochastic gradients); without: the same quasi-Monte Carlo points for every
    row, rows taken in batches to bound memory."""
    if key is not None:
        eps = jax.random.normal(key, (mean.shape[0], n_samples, mean.shape[-1]), mean.dtype)
        return jnp.mean(fn(mean[:, None, :] + jnp.sqrt(var)[:, None, :] * eps), axis=1)
    eps = jnp.asarray(_qmc_normal(n_samples, mean.shape[-1]), mean.dtype)
    row = lambda mv: jnp.mean(fn(mv[0] + jnp.sqrt(mv[1]) * eps), axis=0)
    return lax.map(row, (mean, var), batch_size=32)


def _log_2cosh_half(c2):
    """log(2 cosh(c / 2)) from c^2."""
    return _LOG_2 + log_cosh_sqrt(c2)


class MultiLatent(Likelihood):
    """A likelihood of ``num_latent`` latent functions; marginals are (n, C) arrays."""

    @property
    def num_latent(self) -> int:
        raise NotImplementedError

    def grad_log_prob(self, y, f):
        raise TypeError(f"{type(self).__name__} has several latent functions: use SVGP or "
                        "VGP, not the Laplace or EP approximations")

    hess_log_prob = grad_log_prob


class Categorical(MultiLatent):
    """Multi-class likelihoods. ``classes``: the number of classes C (labels 0..C-1) or the
    sequence of class labels (integers or strings). Targets are mapped to codes 0..C-1 in
    that order; a label outside ``classes`` is an error. A declared class with no training
    points is allowed: its latent function only receives evidence against it."""

    classes: tuple = eqx.field(static=True)

    def __init__(self, classes):
        self.classes = _class_tuple(classes)

    @property
    def num_latent(self) -> int:
        return len(self.classes)

    def targets(self, y, n: int, name: str = "y"):
        return self.check_targets(check_vector(y, n, name), name)

    def check_targets(self, y, name: str = "y"):
        """Class codes 0..C-1 of the labels ``y``."""
        arr = np.asarray(y)
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
        values, inverse = np.unique(arr, return_inverse=True)
        code = {label: k for k, label in enumerate(self.classes)}
        unknown = [v for v in values.tolist() if v not in code]
        if unknown:
            raise ValueError(f"{name} has labels {unknown[:5]} not among the {len(self.classes)} "
                             f"classes {list(self.classes)[:10]} of the likelihood")
        return np.asarray([code[v] for v in values.tolist()], dtype=np.int64)[inverse.ravel()]

    def predict_proba(self, mean, var):
        """p(y = k | data) for each class, (n, C), integrated over q(f)."""
        raise NotImplementedError

    def predict_y(self, mean, var):
        """Class probabilities p and their variances p (1 - p), each (n, C)."""
        p = self.predict_proba(mean, var)
        return p, p * (1.0 - p)

    def predictive_log_prob(self, y, mean, var):
        p = self.predict_proba(mean, var)
        return jnp.log(jnp.take_along_axis(p, jnp.asarray(y)[:, None], axis=1)[:, 0])


def _class_tuple(classes) -> tuple:
    if isinstance(classes, int | np.integer) and not isinstance(classes, bool):
        labels = list(range(int(classes)))
    else:
        arr = np.asarray(classes)
        if arr.ndim != 1:
            raise ValueError("classes must be the number of classes or a 1-D sequence of "
                             f"labels, got {classes!r}")
        labels = arr.tolist()
        if len(set(labels)) != len(labels):
            raise ValueError(f"classes has repeated labels: {labels}")
    if len(labels) < 2:
        raise ValueError(f"a multi-class likelihood needs at least 2 classes, got {labels}")
    return tuple(labels)


class SoftmaxTilt(NamedTuple):
    """q(n_i, w_i) for the logistic-softmax: negative multinomial counts with means n_mean
    (n, C) and, given them, w^c ~ PG(y^c + n^c, c^c) with c^2 stored."""

    c2: jax.Array
    n_mean: jax.Array


class LogisticSoftmax(Categorical, Augmented):
    """p(y = k | f) = sigmoid(f_k) / sum_c sigmoid(f_c) (thesis ch. 4 eq. 5).

    Augmentation (thesis ch. 4 eqs. 6-9, with the errata's sigma(-f)): 1 / sum_c sigmoid(f_c)
    = int_0^inf exp(-lambda sum_c sigmoid(f_c)) d lambda, each exp(-lambda sigmoid(f_c)) a
    Poisson series in sigmoid(-f_c) with counts n^c ~ Po(lambda), and sigmoid(f)^y
    sigmoid(-f)^n a Polya-Gamma mixture. Here lambda is integrated out in closed form
    (thesis 7.4.1): the counts are negative multinomial, so the optimal q(n) is too, with
    E[n^c] = psi_c / (C - sum_j psi_j), psi_c = e^{-m_c/2} / (2 cosh(c_c / 2)) and
    c_c^2 = E[f_c^2]; no inner loop between q(lambda) and q(n). The bound at the optimal
    q(n, w) is, per point,

        m_y / 2 - log(2 cosh(c_y / 2)) - log(sum_c (1 - psi_c)),

    never below the thesis' mean-field q(lambda) q(n) q(w) bound and never above
    E_q[log p(y | f)]. ``num_samples`` Monte Carlo draws estimate E_q[log sum_c sigmoid(f_c)]
    in the non-augmented bound (QuadratureVI); ``predict_samples`` quasi-Monte Carlo points
    integrate the class probabilities.
    """

    num_samples: int = eqx.field(static=True, default=100)
    predict_samples: int = eqx.field(static=True, default=2048)

    def __init__(self, classes, *, num_samples: int = 100, predict_samples: int = 2048):
        super().__init__(classes)
        self.num_samples, self.predict_samples = _check_samples(num_samples, predict_samples)

    @staticmethod
    def _log_probs(F):
        ls = jax.nn.log_sigmoid(F)
        return ls - logsumexp(ls, axis=-1, keepdims=True)

    def log_prob(self, y, F):
        return jnp.take_along_axis(self._log_probs(F), jnp.asarray(y)[..., None], -1)[..., 0]

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        """E[log sigmoid(f_y)] by Gauss-Hermite, E[log sum_c sigmoid(f_c)] by Monte Carlo."""
        pick = lambda a: jnp.take_along_axis(a, jnp.asarray(y)[:, None], 1)[:, 0]
        first = gauss_hermite(jax.nn.log_sigmoid, pick(mean), pick(var), n)
        lse = lambda F: logsumexp(jax.nn.log_sigmoid(F), axis=-1)
        return first - _mc_expectation(lse, mean, var, self.num_samples, key)

    def predict_proba(self, mean, var):
        return _mc_expectation(lambda F: jnp.exp(self._log_probs(F)), mean, var,
                               self.predict_samples)

    def aux_posterior(self, y, mean, var):
        c2 = mean**2 + var
        psi = jnp.exp(-0.5 * mean - _log_2cosh_half(c2))  # "sigma~" of thesis 7.4, corrected
        return SoftmaxTilt(c2, psi / (self.num_latent - jnp.sum(psi, -1, keepdims=True)))

    def aux_sites(self, y, q_aux):
        """beta^c = (y^c - E n^c) / 2, gamma^c = E[w^c] = (y^c + E n^c) tanh(c/2) / (2c)
        (thesis 7.4 Algorithm 5; ch. 4 eqs. 14-16 as reconstructed in the notes)."""
        Y = jax.nn.one_hot(y, self.num_latent, dtype=q_aux.c2.dtype)
        return 0.5 * (Y - q_aux.n_mean), (Y + q_aux.n_mean) * tanh_ratio(jnp.sqrt(q_aux.c2))

    def sample_aux(self, key, y, F):
        """(n, w) ~ p(n, w | y, F) (thesis 7.4 Algorithm 4): the negative multinomial n is
        drawn through lambda ~ Exp(sum_c sigmoid(f_c)) (n integrated out: each
        exp(-lambda sigmoid(f_c)) is the n^c series), n^c ~ Po(lambda sigmoid(-f_c)), then
        w^c ~ PG(y^c + n^c, |f^c|) / 2."""
        kl, kn, kw = jax.random.split(key, 3)
        lam = jax.random.exponential(kl, y.shape, F.dtype) / jnp.sum(jax.nn.sigmoid(F), -1)
        n = jax.random.poisson(kn, lam[:, None] * jax.nn.sigmoid(-F)).astype(F.dtype)
        Y = jax.nn.one_hot(y, self.num_latent, dtype=F.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, Y + n, F))

    def sites(self, y, aux):
        """beta^c = (y^c - n^c) / 2, gamma^c = PG draw (Algorithm 4)."""
        Y = jax.nn.one_hot(y, self.num_latent, dtype=aux.w.dtype)
        return 0.5 * (Y - aux.n), 2.0 * aux.w

    def augmented_expectations(self, y, mean, var):
        """The augmented data term at the optimal q(n, w) (see the class docstring)."""
        c2 = mean**2 + var
        psi = jnp.exp(-0.5 * mean - _log_2cosh_half(c2))
        pick = lambda a: jnp.take_along_axis(a, jnp.asarray(y)[:, None], 1)[:, 0]
        return (0.5 * pick(mean) - _log_2cosh_half(pick(c2))
                - jnp.log(jnp.sum(1.0 - psi, axis=-1)))


class Softmax(Categorical):
    """p(y = k | f) = exp(f_k) / sum_c exp(f_c); E_q[log sum_c exp(f_c)] by ``num_samples``
    Monte Carlo draws (as GPflow's and GPyTorch's softmax likelihoods)."""

    num_samples: int = eqx.field(static=True, default=100)
    predict_samples: int = eqx.field(static=True, default=2048)

    def __init__(self, classes, *, num_samples: int = 100, predict_samples: int = 2048):
        super().__init__(classes)
        self.num_samples, self.predict_samples = _check_samples(num_samples, predict_samples)

    def log_prob(self, y, F):
        return jnp.take_along_axis(jax.nn.log_softmax(F, -1), jnp.asarray(y)[..., None],
                                   -1)[..., 0]

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        pick = jnp.take_along_axis(mean, jnp.asarray(y)[:, None], 1)[:, 0]
        lse = lambda F: logsumexp(F, axis=-1)
        return pick - _mc_expectation(lse, mean, var, self.num_samples, key)

    def predict_proba(self, mean, var):
        return _mc_expectation(lambda F: jax.nn.softmax(F, axis=-1), mean, var,
                               self.predict_samples)


class RobustMax(Categorical):
    """p(y = k | f) = 1 - epsilon if k = argmax_c f_c, else epsilon / (C - 1)
    (Hernandez-Lobato et al. 2011; GPflow's convention). E_q and the class probabilities
    need P(f_k is the largest) = E_{x ~ N(0,1)} prod_{j != k} Phi((m_k + s_k x - m_j) / s_j),
    a one-dimensional Gauss-Hermite integral with ``n_points`` nodes (Hensman et al. 2015;
    100 by default: with 20, as GPflow, rows can be off by 1e-2 when the latent variances
    differ a lot).
    ``epsilon`` is fixed by default (GPflow's default 1e-3)."""

    epsilon: Parameter
    n_points: int = eqx.field(static=True, default=100)

    def __init__(self, classes, epsilon=1e-3, *, n_points: int = 100):
        super().__init__(classes)
        if not 0.0 < float(epsilon) < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
        self.epsilon, self.n_points = fixed(positive(epsilon, "robust-max epsilon")), n_points

    def _log_levels(self):
        eps = self.epsilon.value
        return jnp.log1p(-eps), jnp.log(eps / (self.num_latent - 1))

    def log_prob(self, y, F):
        hit, miss = self._log_levels()
        return jnp.where(jnp.argmax(F, -1) == jnp.asarray(y), hit, miss)

    def _argmax_prob(self, k, mean, var):
        """P(f_k > f_j for all j != k) under independent N(mean, var), k: (n,) codes."""
        x, w = _nodes(self.n_points)
        s = jnp.sqrt(jnp.maximum(var, 1e-300))
        pick = lambda a: jnp.take_along_axis(a, k[:, None], 1)  # (n, 1)
        fk = pick(mean)[..., None] + pick(s)[..., None] * x  # (n, 1, Q)
        log_phi = log_ndtr((fk - mean[..., None]) / s[..., None])  # (n, C, Q)
        others = jax.nn.one_hot(k, self.num_latent, dtype=mean.dtype) < 0.5
        return jnp.sum(jnp.exp(jnp.sum(jnp.where(others[..., None], log_phi, 0.0), 1)) * w, -1)

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        P = self._argmax_prob(jnp.asarray(y), mean, var)
        hit, miss = self._log_levels()
        return P * hit + (1.0 - P) * miss

    def predict_proba(self, mean, var):
        codes = jnp.arange(self.num_latent)
        P = jax.vmap(lambda k: self._argmax_prob(jnp.full(mean.shape[:1], k), mean, var),
                     out_axes=1)(codes)
        eps = self.epsilon.value
        return (1.0 - eps) * P + eps / (self.num_latent - 1) * (1.0 - P)


def _check_samples(num_samples, predict_samples):
    for name, v in (("num_samples", num_samples), ("predict_samples", predict_samples)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(num_samples), int(predict_samples)


class HeteroTilt(NamedTuple):
    """q(n_i, w_i) of the heteroscedastic augmentation: n_i ~ Po(n_mean_i) and
    w_i | n_i ~ PG(1/2 + n_i, c_i) (c^2 stored); psi_i = e^{-m_g/2} / (2 cosh(c_i/2))."""

    c2: jax.Array
    n_mean: jax.Array
    psi: jax.Array


class HeteroscedasticGaussian(MultiLatent, Augmented):
    """y ~ N(f, 1 / (precision * sigmoid(g))): latent 0 is the mean f, latent 1 the noise
    function g (thesis 7.2, eq. 7.1; the sigmoid link makes the augmentation possible).

    Augmented inference uses the thesis' double bound: with E_i = E_q[(y_i - f_i)^2], the
    data term E_q[log p(y | f, g)] is exact in f and its g part
    sqrt(sigmoid(g)) exp(-(precision E_i / 2) sigmoid(g)) is augmented with
    n_i ~ Po(precision E_i sigmoid(-g_i) / 2) and a Polya-Gamma w_i (eq. 7.3 with the
    errata: g^2 w, not g^2 / w). At the optimal q(n, w) the bound per point is

        log(precision / 2 pi) / 2 + m_g / 4 - log(2 cosh(c/2)) / 2 - precision E (1 - psi) / 2,

    c^2 = E[g^2], psi = e^{-m_g/2} / (2 cosh(c/2)); its sites are f: precision (1 - psi)
    on y, and g: beta = (1/2 - E n) / 2, gamma = (1/2 + E n) tanh(c/2) / (2c) with
    E n = precision E psi / 2 (Algorithm 3 with the errata: no square roots, and the minus
    sign in the g potential).
    """

    precision: Parameter

    def __init__(self, precision=1.0):
        self.precision = positive(precision, "noise precision")

    @property
    def num_latent(self) -> int:
        return 2

    def check_targets(self, y, name: str = "y"):
        return _finite_targets(y, name)

    def log_prob(self, y, F):
        f, g = F[..., 0], F[..., 1]
        lam = self.precision.value
        return 0.5 * (jnp.log(lam) + jax.nn.log_sigmoid(g) - _LOG_2PI) - 0.5 * lam * (
            jax.nn.sigmoid(g) * (y - f) ** 2)

    @staticmethod
    def _split(mean, var):
        return mean[..., 0], var[..., 0], mean[..., 1], var[..., 1]

    def variational_expectations(self, y, mean, var, n: int = 20, key=None):
        """Exact in f; Gauss-Hermite in g."""
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value
        e = (y - mf) ** 2 + vf
        term = lambda g: 0.5 * jax.nn.log_sigmoid(g) - 0.5 * lam * e[..., None] * jax.nn.sigmoid(g)
        return 0.5 * (jnp.log(lam) - _LOG_2PI) + gauss_hermite(term, mg, vg, n)

    def predict_y(self, mean, var):
        """Mean and variance of y: E f and V f + E[1 / (precision sigmoid(g))], the latter
        (1 + e^{-m_g + v_g / 2}) / precision in closed form."""
        mf, vf, mg, vg = self._split(mean, var)
        return mf, vf + (1.0 + jnp.exp(-mg + 0.5 * vg)) / self.precision.value

    def predictive_log_prob(self, y, mean, var):
        """log int N(y | m_f, v_f + 1 / (precision sigmoid(g))) q(g) dg (Gauss-Hermite)."""
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value

        def log_density(g):
            v = vf[..., None] + (1.0 + jnp.exp(-g)) / lam
            return -0.5 * (_LOG_2PI + jnp.log(v) + (y - mf)[..., None] ** 2 / v)

        return log_gauss_hermite(log_density, mg, vg)

    def aux_posterior(self, y, mean, var):
        mf, vf, mg, vg = self._split(mean, var)
        c2 = mg**2 + vg
        psi = jnp.exp(-0.5 * mg - _log_2cosh_half(c2))
        return HeteroTilt(c2, 0.5 * self.precision.value * ((y - mf) ** 2 + vf) * psi, psi)

    def aux_sites(self, y, q_aux):
        prec_f = self.precision.value * (1.0 - q_aux.psi)
        beta = jnp.stack([prec_f * y, 0.5 * (0.5 - q_aux.n_mean)], -1)
        gamma = jnp.stack([prec_f, (0.5 + q_aux.n_mean) * tanh_ratio(jnp.sqrt(q_aux.c2))], -1)
        return beta, gamma

    # f and g are not independent given (n, w): Gibbs draws f | g (n, w integrated out),
    # then (n, w) | f, g, then g | n, w (thesis 7.2 Algorithm 2, collapsed in f)
    gibbs_joint = False

    def sample_aux(self, key, y, F):
        """n ~ Po(precision sigmoid(-g) (y - f)^2 / 2), w ~ PG(1/2 + n, |g|) / 2
        (thesis 7.2 Algorithm 2)."""
        f, g = F[..., 0], F[..., 1]
        kn, kw = jax.random.split(key)
        rate = 0.5 * self.precision.value * jax.nn.sigmoid(-g) * (y - f) ** 2
        n = jax.random.poisson(kn, rate).astype(F.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, 0.5 + n, g), jax.nn.sigmoid(g))

    def sites(self, y, aux):
        """f: precision * sigmoid(g) on y (exact, collapsed over n and w; the errata's y,
        not y / 2); g: beta = (1/2 - n) / 2, gamma = PG draw."""
        prec_f = self.precision.value * aux.sigmoid_g
        return (jnp.stack([prec_f * y, 0.5 * (0.5 - aux.n)], -1),
                jnp.stack([prec_f, 2.0 * aux.w], -1))

    def augmented_expectations(self, y, mean, var):
        mf, vf, mg, vg = self._split(mean, var)
        lam = self.precision.value
        c2 = mg**2 + vg
        psi = jnp.exp(-0.5 * mg - _log_2cosh_half(c2))
        return (0.5 * (jnp.log(lam) - _LOG_2PI) + 0.25 * mg - 0.5 * _log_2cosh_half(c2)
                - 0.5 * lam * ((y - mf) ** 2 + vf) * (1.0 - psi))


__all__ = ["MultiLatent", "Categorical", "LogisticSoftmax", "Softmax", "RobustMax",
           "HeteroscedasticGaussian"]
