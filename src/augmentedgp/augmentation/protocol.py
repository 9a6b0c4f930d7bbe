"""Latent-variable augmentations: likelihoods made conditionally conjugate.

A "super-Gaussian" likelihood (thesis ch. 5, eqs. 4-5) is, for each observation,

    p(y | f) = C(y) e^{g(y) f} phi(h^2),   h = a(y) + b(y) f,

with phi completely monotone and phi(0) = 1. By Bernstein-Widder phi(r) = E_{p(w)} e^{-r w},
so p(y | f) = int p(y | f, w) p(w) dw with p(y | f, w) = C e^{g f - w h^2}: given w, a
Gaussian site in f (thesis ch. 5 Theorem 1, with the sign of g f corrected as in the errata).
Everything variational inference needs follows from phi (thesis App. A.2, A.4):

- the optimal q(w) = pi(w | c), the prior tilted by e^{-c^2 w}, with c^2 = E_q[h^2];
- E[w] = -d log phi(t)/dt at t = c^2 (no minus sign is dropped here; see the errata);
- the site of f: log-potential (g - 2 E[w] a b) f - 1/2 (2 E[w] b^2) f^2;
- KL(q(w) || p(w)) = -c^2 E[w] - log phi(c^2), so the augmented data term is
  log C + g E[f] - E[h^2] E[w] - KL, and at the optimal q(w) it collapses to
  log C + g E[f] + log phi(E[h^2]). It never exceeds the original E_q[log p(y | f)] =
  log C + g E[f] + E_q[log phi(h^2)] (Jensen: log phi is convex); the difference is the
  augmentation gap (thesis App. A.4.3).

Gibbs sampling uses the same site with a draw in place of E[w]: the full conditional
p(w | y, f) is the tilted law pi(w | |h|) (thesis ch. 5 Theorem 2), drawn by
``_sample_omega`` (Polya-Gamma, gamma, inverse-Gaussian or GIG; ``augmentedgp.samplers``),
and ``sites(y, w)`` is the Gaussian site given w.

``Augmented`` implements this once from ``_super_gaussian`` (log C, g, a, b), ``_log_phi``,
``_omega_mean`` and ``_sample_omega``; likelihoods with a hierarchical augmentation (the
Poisson with a scaled-logistic link, the multi-latent ones) override the public methods.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from augmentedgp.augmentation import samplers

_LOG_2 = math.log(2.0)


class SuperGaussian(NamedTuple):
    """p(y | f) = exp(log_c + g f) phi((a + b f)^2), elementwise in y."""

    log_c: jax.Array
    g: jax.Array
    a: jax.Array
    b: jax.Array


class CountAux(NamedTuple):
    """A Gibbs draw of a count-then-Polya-Gamma augmentation: counts n and w = PG(. , |f|) / 2
    (with ``sigmoid_g`` = sigmoid(g) for the heteroscedastic likelihood)."""

    n: jax.Array
    w: jax.Array
    sigmoid_g: jax.Array | None = None


class Tilt(NamedTuple):
    """q(w_i) = pi(w_i | c_i) (thesis ch. 5 eq. 7), stored as c_i^2."""

    c2: jax.Array


def log_cosh(x):
    """log cosh x, stable for any x."""
    ax = jnp.abs(x)
    return ax + jnp.log1p(jnp.exp(-2.0 * ax)) - _LOG_2


def tanh_ratio(c):
    """tanh(c / 2) / (2 c) = E[PG(1, c)] (even in c), with its limit 1/4 at c = 0
    (thesis ch. 3)."""
    small = jnp.abs(c) < 1e-4
    cs = jnp.where(small, 1.0, c)  # double-where: finite gradients at c = 0
    return jnp.where(small, 0.25 - c**2 / 48.0, jnp.tanh(0.5 * cs) / (2.0 * cs))


def log_cosh_sqrt(t):
    """log cosh(sqrt(t) / 2) for t >= 0, smooth at t = 0 (= t/8 - t^2/192 + ...)."""
    small = t < 1e-6
    ts = jnp.where(small, 1.0, t)
    return jnp.where(small, t / 8.0 - t**2 / 192.0, log_cosh(0.5 * jnp.sqrt(ts)))


def _safe_sqrt(t):
    pos = t > 0.0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, t, 1.0)), 0.0)


class Augmented(eqx.Module):
    """Mixin for likelihoods with a conditionally conjugate augmentation (see module doc).

    Subclasses give ``_super_gaussian(y)``, ``_log_phi(y, t)`` and ``_omega_mean(y, t)``.
    """

    def _super_gaussian(self, y) -> SuperGaussian:
        raise NotImplementedError

    def _log_phi(self, y, t):
        raise NotImplementedError

    def _omega_mean(self, y, t):
        """E[w] under pi(w | sqrt(t)): -d log phi / dt."""
        return -jax.grad(lambda tt: jnp.sum(self._log_phi(y, tt)))(t)

    def _sample_omega(self, key, y, t):
        """A draw of w ~ pi(w | sqrt(t)) (t has the shape of the output)."""
        raise NotImplementedError

    @staticmethod
    def _expected_h2(s: SuperGaussian, mean, var):
        return (s.a + s.b * mean) ** 2 + s.b**2 * var

    def aux_posterior(self, y, mean, var):
        """The optimal q(w) when f_i ~ N(mean_i, var_i): tilt c^2 = E[h^2] (thesis ch. 5
        Algorithm 1, local step)."""
        return Tilt(self._expected_h2(self._super_gaussian(y), mean, var))

    def aux_sites(self, y, q_aux):
        """(beta, gamma): E_{q(w)} of the Gaussian site on f, log-potential
        beta f - gamma f^2 / 2 (thesis ch. 5 eq. 11 with h = a + b f)."""
        return self.sites(y, self._omega_mean(y, q_aux.c2))

    def sample_aux(self, key, y, f):
        """w ~ p(w | y, f) = pi(w | |h(f)|), the prior tilted by e^{-h^2 w} (thesis ch. 5
        Theorem 2; Algorithm 2, first step)."""
        s = self._super_gaussian(y)
        t = (s.a + s.b * f) ** 2
        return self._sample_omega(key, y, jnp.broadcast_to(t, jnp.broadcast_shapes(
            jnp.shape(t), jnp.shape(y))))

    def sites(self, y, w):
        """(beta, gamma) of the Gaussian site on f given w: log p(y | f, w) = const +
        beta f - gamma f^2 / 2 with beta = g - 2 w a b, gamma = 2 w b^2 (ch. 5 eq. 11)."""
        s = self._super_gaussian(y)
        return s.g - 2.0 * w * s.a * s.b, 2.0 * w * s.b**2

    def augmented_expectations(self, y, mean, var, q_aux=None):
        """E_{q(f) q(w)}[log p(y | f, w)] - KL(q(w) || p(w)), elementwise; with ``q_aux=None``
        at the optimal q(w), where it equals log C + g E[f] + log phi(E[h^2])."""
        s = self._super_gaussian(y)
        e_h2 = self._expected_h2(s, mean, var)
        if q_aux is None:
            return s.log_c + s.g * mean + self._log_phi(y, e_h2)
        w = self._omega_mean(y, q_aux.c2)
        # - E[h^2] E[w] - KL = -(E[h^2] - c^2) E[w] + log phi(c^2)   (thesis App. A.4.1)
        return s.log_c + s.g * mean - (e_h2 - q_aux.c2) * w + self._log_phi(y, q_aux.c2)


class PolyaGamma(Augmented):
    """phi(t) = cosh(sqrt(t) / 2)^-b with h = f: w = PG(b, 0) / 2 (Polson et al. 2013).
    Subclasses give ``_pg_b(y)``."""

    def _pg_b(self, y):
        raise NotImplementedError

    def _log_phi(self, y, t):
        return -self._pg_b(y) * log_cosh_sqrt(t)

    pg_method: ClassVar[str] = "series"  # see augmentedgp.samplers.polya_gamma

    def _omega_mean(self, y, t):
        return 0.5 * self._pg_b(y) * tanh_ratio(_safe_sqrt(t))  # E[PG(b, c)] / 2

    def _sample_omega(self, key, y, t):
        b = jnp.broadcast_to(self._pg_b(y), jnp.shape(t))
        return 0.5 * samplers.polya_gamma(key, b, _safe_sqrt(t), method=self.pg_method)


__all__ = ["Augmented", "CountAux", "PolyaGamma", "SuperGaussian", "Tilt", "log_cosh",
           "log_cosh_sqrt", "tanh_ratio"]
