"""Multi-class likelihoods: logistic-softmax (augmented), softmax and robust-max."""

from __future__ import annotations

import abc
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import log_ndtr, logsumexp, xlogy
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree, Shaped

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import Augmented, CountAux, tanh_ratio
from augmentedgp.core.params import Parameter, fixed, positive
from augmentedgp.core.quadrature import (
    gauss_hermite,
    kinked_expectation,
    mc_expectation,
    qmc_normal,
)
from augmentedgp.core.validation import check_int, check_vector, unique_labels
from augmentedgp.likelihoods.base import MultiLatent
from augmentedgp.likelihoods.numerics import log_2cosh_half

_LOG_2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)


class Categorical(MultiLatent):
    """Multi-class likelihoods. ``classes``: the number of classes C (labels 0..C-1) or the
    sequence of class labels (integers or strings). Targets are mapped to codes 0..C-1 in
    that order; a label outside ``classes`` is an error. A declared class with no training
    points is allowed: its latent function only receives evidence against it."""

    support = "classes"
    classes: tuple = eqx.field(static=True)

    def __init__(self, classes):
        self.classes = _class_tuple(classes)

    @property
    def num_latent(self) -> int:
        return len(self.classes)

    def targets(self, y: ArrayLike, n: int, name: str = "y") -> Shaped[ArrayLike, " n"]:
        return self.check_targets(check_vector(y, n, name), name)

    def check_targets(self, y: ArrayLike, name: str = "y") -> Shaped[ArrayLike, " n"]:
        """Class codes 0..C-1 of the labels ``y``."""
        arr = np.asarray(y)
        if arr.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array of class labels, got shape {arr.shape}")
        if arr.size == 0:
            raise ValueError(f"{name} must hold at least one class label, got an empty array")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
        values, inverse = unique_labels(arr, name)
        code = {label: k for k, label in enumerate(self.classes)}
        unknown = [v for v in values.tolist() if v not in code]
        if unknown:
            raise ValueError(f"{name} has labels {unknown[:5]} not among the {len(self.classes)} "
                             f"classes {list(self.classes)[:10]} of the likelihood")
        return np.asarray([code[v] for v in values.tolist()], dtype=np.int64)[inverse.ravel()]

    @abc.abstractmethod
    def predict_proba(self, mean: Float[Array, "n C"], var: Float[Array, "n C"]
                     ) -> Float[Array, "n C"]:
        """p(y = k | data) for each class, (n, C), integrated over q(f)."""

    def conditional_mean(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch C"]:
        """p(y = k | f) for each class k, (..., C): the mean of the class indicators."""
        codes = jnp.arange(self.num_latent)
        return jax.vmap(lambda k: jnp.exp(self.log_prob(jnp.full(jnp.shape(f)[:-1], k), f)),
                        out_axes=-1)(codes)

    def conditional_variance(self, f: Float[Array, "*batch C"]) -> Float[Array, "*batch C"]:
        """p (1 - p) for each class, (..., C): the variance of the class indicators."""
        p = self.conditional_mean(f)
        return p * (1.0 - p)

    def predict_y(self, mean: Float[Array, "n C"], var: Float[Array, "n C"], n: int | None = None
                 ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        """Class probabilities p and their variances p (1 - p), each (n, C) (``n`` is not
        used)."""
        p = self.predict_proba(mean, var)
        return p, p * (1.0 - p)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                            var: Float[Array, "n C"]) -> Float[Array, " n"]:
        """log p(y | data) per point: the log of ``predict_proba`` at the label (subclasses
        with a log-space form override this: finite where that probability underflows)."""
        p = self.predict_proba(mean, var)
        return jnp.log(jnp.take_along_axis(p, jnp.asarray(y)[:, None], axis=1)[:, 0])


def _row_log_expectation(log_fn, y, mean, var, n_samples: int):
    """log E[exp(log_fn(f_i, y_i))] for f_i ~ N(mean_i, diag var_i), per row i, over the
    quasi-Monte Carlo points of ``mc_expectation`` (the same points: the log of that
    estimate) with logsumexp, so no underflow where the expectation is below 1e-308.
    ``log_fn`` maps (S, C) latent vectors and a label to (S,)."""
    eps = jnp.asarray(qmc_normal(n_samples, mean.shape[-1]), mean.dtype)
    row = lambda a: logsumexp(log_fn(a[1] + jnp.sqrt(a[2]) * eps, a[0]), axis=0)
    return lax.map(row, (y, mean, var), batch_size=32) - math.log(n_samples)


_MAX_CLASSES = 100_000  # one latent GP per class: beyond this no model fits in memory


def _class_tuple(classes) -> tuple:
    if isinstance(classes, bool | np.bool_):
        raise ValueError(f"classes must be the number of classes or a 1-D sequence of labels, "
                         f"got {classes!r}")
    if isinstance(classes, int | np.integer):
        count = check_int(classes, "classes", low=2)
        if count > _MAX_CLASSES:
            raise ValueError(f"classes must be at most {_MAX_CLASSES} (one latent function per "
                             f"class), got {classes}")
        labels = list(range(count))
    else:
        arr = np.asarray(classes)
        if arr.ndim != 1:
            raise ValueError("classes must be the number of classes or a 1-D sequence of "
                             f"labels, got {classes!r}")
        labels = arr.tolist()
        if len(labels) > _MAX_CLASSES:
            raise ValueError(f"classes must hold at most {_MAX_CLASSES} labels, got {len(labels)}")
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
    """p(y = k | f) = sigmoid(f_k) / sum_c sigmoid(f_c) ([Galy-Fajou2019, eq. 5]).

    Augmentation ([Galy-Fajou2019, eqs. 6-9]; the conditional of n printed in its Sec. 3.2
    has sigma(f) where sigma(-f) is meant): 1 / sum_c sigmoid(f_c)
    = int_0^inf exp(-lambda sum_c sigmoid(f_c)) d lambda, each exp(-lambda sigmoid(f_c)) a
    Poisson series in sigmoid(-f_c) with counts n^c ~ Po(lambda), and sigmoid(f)^y
    sigmoid(-f)^n a Polya-Gamma mixture. Here lambda is integrated out in closed form
    ([Galy-Fajou2022, Sec. 7.4.1]): the counts are negative multinomial, so the optimal q(n)
    is too, with E[n^c] = psi_c / (C - sum_j psi_j), psi_c = e^{-m_c/2} / (2 cosh(c_c / 2)) and
    c_c^2 = E[f_c^2]; no inner loop between q(lambda) and q(n). The bound at the optimal
    q(n, w) is, per point,

        m_y / 2 - log(2 cosh(c_y / 2)) - log(sum_c (1 - psi_c)),

    never below the mean-field q(lambda) q(n) q(w) bound of [Galy-Fajou2019] and never above
    E_q[log p(y | f)]. ``num_samples`` Monte Carlo draws estimate E_q[log sum_c sigmoid(f_c)]
    in the non-augmented bound (QuadratureVI); ``predict_samples`` quasi-Monte Carlo points
    integrate the class probabilities.
    """

    num_samples: int = eqx.field(static=True, default=100)
    predict_samples: int = eqx.field(static=True, default=2048)

    def __init__(self, classes, *, num_samples: int = 100, predict_samples: int = 2048):
        super().__init__(classes)
        self.num_samples = check_int(num_samples, "num_samples")
        self.predict_samples = check_int(predict_samples, "predict_samples")

    @staticmethod
    def _log_probs(F):
        ls = jax.nn.log_sigmoid(F)
        return ls - logsumexp(ls, axis=-1, keepdims=True)

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch C"]
                ) -> Float[Array, "*batch"]:
        return jnp.take_along_axis(self._log_probs(f), jnp.asarray(y)[..., None], -1)[..., 0]

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                                 var: Float[Array, "n C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        """E[log sigmoid(f_y)] by Gauss-Hermite (``n`` nodes, None: 20), E[log sum_c
        sigmoid(f_c)] by Monte Carlo."""
        n = 20 if n is None else n
        pick = lambda a: jnp.take_along_axis(a, jnp.asarray(y)[:, None], 1)[:, 0]
        first = gauss_hermite(jax.nn.log_sigmoid, pick(mean), pick(var), n)
        lse = lambda F: logsumexp(jax.nn.log_sigmoid(F), axis=-1)
        return first - mc_expectation(lse, mean, var, self.num_samples, key)

    def predict_proba(self, mean: Float[Array, "n C"], var: Float[Array, "n C"]
                     ) -> Float[Array, "n C"]:
        return mc_expectation(lambda F: jnp.exp(self._log_probs(F)), mean, var,
                              self.predict_samples)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                            var: Float[Array, "n C"]) -> Float[Array, " n"]:
        """log p(y | data): the log of ``predict_proba``'s quasi-Monte Carlo estimate,
        computed in log space (finite where p(y | data) underflows)."""
        y = jnp.asarray(y)
        log_fn = lambda F, k: self._log_probs(F)[..., k]
        return _row_log_expectation(log_fn, y, mean, var, self.predict_samples)

    def aux_posterior(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                      var: Float[Array, "n C"]) -> tuple:
        c2 = mean**2 + var
        # psi: the "sigma~" of [Galy-Fajou2022, Sec. 7.4.2, Algorithm 5], corrected
        psi = jnp.exp(-0.5 * mean - log_2cosh_half(c2))
        return SoftmaxTilt(c2, psi / (self.num_latent - jnp.sum(psi, -1, keepdims=True)))

    def aux_sites(self, y: Shaped[Array, " n"], q_aux: tuple
                 ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        """beta^c = (y^c - E n^c) / 2, gamma^c = E[w^c] = (y^c + E n^c) tanh(c/2) / (2c)
        ([Galy-Fajou2022, Sec. 7.4.2, Algorithm 5]; with lambda kept, the updates of
        [Galy-Fajou2019, Algorithm 1], re-derived from the conditionals of its Sec. 3.2)."""
        Y = jax.nn.one_hot(y, self.num_latent, dtype=q_aux.c2.dtype)
        return 0.5 * (Y - q_aux.n_mean), (Y + q_aux.n_mean) * tanh_ratio(jnp.sqrt(q_aux.c2))

    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, " n"], f: Float[Array, "*batch C"]
                  ) -> PyTree[Array]:
        """(n, w) ~ p(n, w | y, F) ([Galy-Fajou2022, Sec. 7.4.2, Algorithm 4]): the negative
        multinomial n is drawn through lambda ~ Exp(sum_c sigmoid(f_c)) (n integrated out: each
        exp(-lambda sigmoid(f_c)) is the n^c series), n^c ~ Po(lambda sigmoid(-f_c)), then
        w^c ~ PG(y^c + n^c, |f^c|) / 2."""
        kl, kn, kw = jax.random.split(key, 3)
        lam = jax.random.exponential(kl, y.shape, f.dtype) / jnp.sum(jax.nn.sigmoid(f), -1)
        n = jax.random.poisson(kn, lam[:, None] * jax.nn.sigmoid(-f)).astype(f.dtype)
        Y = jax.nn.one_hot(y, self.num_latent, dtype=f.dtype)
        return CountAux(n, 0.5 * samplers.polya_gamma(kw, Y + n, f))

    def sites(self, y: Shaped[Array, " n"], aux: PyTree[Array]
             ) -> tuple[Float[Array, "n C"], Float[Array, "n C"]]:
        """beta^c = (y^c - n^c) / 2, gamma^c = PG draw ([Galy-Fajou2022, Algorithm 4])."""
        Y = jax.nn.one_hot(y, self.num_latent, dtype=aux.w.dtype)
        return 0.5 * (Y - aux.n), 2.0 * aux.w

    def augmented_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                               var: Float[Array, "n C"], q_aux: tuple | None = None
                              ) -> Float[Array, " n"]:
        """The augmented data term at the optimal q(n, w) (see the class docstring), or at
        ``q_aux``: q(n) negative multinomial (r = 1) with means n_mean, q(w^c | n) =
        PG(y^c + n^c, c_c) / 2. With mu = n_mean, M = sum_c mu_c and E[w^c] =
        (y^c + mu_c) tanh(c_c / 2) / (4 c_c), it is sum_c [(y^c - mu_c) m_c / 2
        - E[w^c] (E[f_c^2] - c_c^2) - (y^c + mu_c) log(2 cosh(c_c / 2))]
        + (M + 1) log((M + 1) / C) - sum_c mu_c log mu_c (the q(n) terms: the n-prior with
        lambda integrated out, minus log q(n))."""
        if q_aux is None:
            c2 = mean**2 + var
            psi = jnp.exp(-0.5 * mean - log_2cosh_half(c2))
            pick = lambda a: jnp.take_along_axis(a, jnp.asarray(y)[:, None], 1)[:, 0]
            return (0.5 * pick(mean) - log_2cosh_half(pick(c2))
                    - jnp.log(jnp.sum(1.0 - psi, axis=-1)))
        Y = jax.nn.one_hot(y, self.num_latent, dtype=q_aux.c2.dtype)
        mu = q_aux.n_mean
        e_w = 0.5 * (Y + mu) * tanh_ratio(jnp.sqrt(q_aux.c2))
        per_class = (0.5 * (Y - mu) * mean - e_w * (mean**2 + var - q_aux.c2)
                     - (Y + mu) * log_2cosh_half(q_aux.c2) - xlogy(mu, mu))
        m1 = jnp.sum(mu, -1) + 1.0
        return jnp.sum(per_class, -1) + m1 * (jnp.log(m1) - math.log(self.num_latent))


class Softmax(Categorical):
    """p(y = k | f) = exp(f_k) / sum_c exp(f_c); E_q[log sum_c exp(f_c)] by ``num_samples``
    Monte Carlo draws (as GPflow's and GPyTorch's softmax likelihoods)."""

    num_samples: int = eqx.field(static=True, default=100)
    predict_samples: int = eqx.field(static=True, default=2048)

    def __init__(self, classes, *, num_samples: int = 100, predict_samples: int = 2048):
        super().__init__(classes)
        self.num_samples = check_int(num_samples, "num_samples")
        self.predict_samples = check_int(predict_samples, "predict_samples")

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch C"]
                ) -> Float[Array, "*batch"]:
        return jnp.take_along_axis(jax.nn.log_softmax(f, -1), jnp.asarray(y)[..., None],
                                   -1)[..., 0]

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                                 var: Float[Array, "n C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        pick = jnp.take_along_axis(mean, jnp.asarray(y)[:, None], 1)[:, 0]
        lse = lambda F: logsumexp(F, axis=-1)
        return pick - mc_expectation(lse, mean, var, self.num_samples, key)

    def predict_proba(self, mean: Float[Array, "n C"], var: Float[Array, "n C"]
                     ) -> Float[Array, "n C"]:
        return mc_expectation(lambda F: jax.nn.softmax(F, axis=-1), mean, var,
                              self.predict_samples)

    def predictive_log_prob(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                            var: Float[Array, "n C"]) -> Float[Array, " n"]:
        """log p(y | data): the log of ``predict_proba``'s quasi-Monte Carlo estimate,
        computed in log space with log_softmax (finite where p(y | data) underflows)."""
        y = jnp.asarray(y)
        log_fn = lambda F, k: jax.nn.log_softmax(F, -1)[..., k]
        return _row_log_expectation(log_fn, y, mean, var, self.predict_samples)


class RobustMax(Categorical):
    """p(y = k | f) = 1 - epsilon if k = argmax_c f_c, else epsilon / (C - 1)
    (Hernandez-Lobato et al. 2011; GPflow's convention). E_q and the class probabilities
    need P(f_k is the largest) = E_{x ~ N(0,1)} prod_{j != k} Phi((m_k + s_k x - m_j) / s_j),
    a one-dimensional integral (Hensman et al. 2015), here by Gauss-Legendre with
    ``n_points`` nodes on panels split where each factor rises, at m_j + {-6, 0, 6} s_j
    (``kinked_expectation``; ~1e-12 for any latent variances). Gauss-Hermite over x, as
    GPflow, is off by up to 4e-2 when some latent variance is far below the others' (each
    factor is then a step in x).
    ``epsilon`` is fixed by default (GPflow's default 1e-3)."""

    epsilon: Parameter
    n_points: int = eqx.field(static=True, default=16)

    def __init__(self, classes, epsilon=1e-3, *, n_points: int = 16):
        super().__init__(classes)
        if not 0.0 < float(epsilon) < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
        self.epsilon, self.n_points = fixed(positive(epsilon, "robust-max epsilon")), n_points

    def _log_levels(self):
        eps = self.epsilon.value
        return jnp.log1p(-eps), jnp.log(eps / (self.num_latent - 1))

    def log_prob(self, y: Shaped[Array, "*batch"], f: Float[Array, "*batch C"]
                ) -> Float[Array, "*batch"]:
        hit, miss = self._log_levels()
        return jnp.where(jnp.argmax(f, -1) == jnp.asarray(y), hit, miss)

    def _argmax_prob(self, k, mean, var):
        """P(f_k > f_j for all j != k) under independent N(mean, var), k: (n,) codes:
        E over f_k of prod_{j != k} Phi((f_k - m_j) / s_j)."""
        s = jnp.sqrt(jnp.maximum(var, 1e-300))
        pick = lambda a: jnp.take_along_axis(a, k[:, None], 1)[:, 0]
        others = jax.nn.one_hot(k, self.num_latent, dtype=mean.dtype) < 0.5  # (n, C)

        def product(fk):  # (n, panels, Q) -> (n, panels, Q)
            log_phi = log_ndtr((fk[..., None] - mean[:, None, None, :]) / s[:, None, None, :])
            return jnp.exp(jnp.sum(jnp.where(others[:, None, None, :], log_phi, 0.0), -1))

        rises = (mean[..., None] + s[..., None] * jnp.asarray([-6.0, 0.0, 6.0]))
        return kinked_expectation(product, pick(mean), pick(var),
                                  rises.reshape(mean.shape[0], -1), self.n_points)

    def variational_expectations(self, y: Shaped[Array, " n"], mean: Float[Array, "n C"],
                                 var: Float[Array, "n C"], n: int | None = None,
                                 key: PRNGKeyArray | None = None) -> Float[Array, " n"]:
        P = self._argmax_prob(jnp.asarray(y), mean, var)
        hit, miss = self._log_levels()
        return P * hit + (1.0 - P) * miss

    def predict_proba(self, mean: Float[Array, "n C"], var: Float[Array, "n C"]
                     ) -> Float[Array, "n C"]:
        codes = jnp.arange(self.num_latent)
        P = jax.vmap(lambda k: self._argmax_prob(jnp.full(mean.shape[:1], k), mean, var),
                     out_axes=1)(codes)
        eps = self.epsilon.value
        return (1.0 - eps) * P + eps / (self.num_latent - 1) * (1.0 - P)
