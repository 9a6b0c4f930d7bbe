"""Latent-variable augmentations: likelihoods made conditionally conjugate.

A "super-Gaussian" likelihood ([Galy-Fajou2020, eqs. 4-5]) is, for each observation,

    p(y | f) = C(y) e^{g(y) f} phi(h^2),   h = a(y) + b(y) f,

with phi completely monotone and phi(0) = 1. By Bernstein-Widder phi(r) = E_{p(w)} e^{-r w},
so p(y | f) = int p(y | f, w) p(w) dw with p(y | f, w) = C e^{g f - w h^2}: given w, a
Gaussian site in f ([Galy-Fajou2020, Theorem 1]; the sign of g f in its proof, eq. 10, is +).
Everything variational inference needs follows from phi ([Galy-Fajou2020, App. A.2, A.4]):

- the optimal q(w) = pi(w | c), the prior tilted by e^{-c^2 w}, with c^2 = E_q[h^2];
- E[w] = -d log phi(t)/dt at t = c^2 ([Galy-Fajou2020, App. A.2]; mind the minus sign);
- the site of f: log-potential (g - 2 E[w] a b) f - 1/2 (2 E[w] b^2) f^2;
- KL(q(w) || p(w)) = -c^2 E[w] - log phi(c^2), so the augmented data term is
  log C + g E[f] - E[h^2] E[w] - KL, and at the optimal q(w) it collapses to
  log C + g E[f] + log phi(E[h^2]). It never exceeds the original E_q[log p(y | f)] =
  log C + g E[f] + E_q[log phi(h^2)] (Jensen: log phi is convex); the difference is the
  augmentation gap ([Galy-Fajou2020, App. A.4.3]).

Gibbs sampling uses the same site with a draw in place of E[w]: the full conditional
p(w | y, f) is the tilted law pi(w | |h|) ([Galy-Fajou2020, Theorem 2]), drawn by
``sample_omega`` (Polya-Gamma, gamma, inverse-Gaussian or GIG, ``augmentation.samplers``, for
the built-ins; by default the generic sampler of ``augmentation.inversion``, numerical
inversion of phi's Laplace transform [Galy-Fajou2020, Algorithm 2]), and ``sites(y, aux)``
is the Gaussian site given w.

Two abstract classes. ``Augmented`` is the protocol that inference uses: ``aux_posterior``,
``aux_sites``, ``augmented_expectations``, ``sample_aux`` and ``sites``, one signature each.
``ScaleMixture(Augmented)`` implements those five once from the pieces above, which a
subclass gives: ``super_gaussian`` (log C, g, a, b) and ``log_phi``, with
``omega_mean`` (default: -d log phi / dt by autodiff), ``sample_omega`` and
``log_mixing_density`` (p(w), for the numerical checks of ``augmentedgp.testing``; both by
default by numerical inversion of phi) optional: closed forms and exact samplers.
``likelihoods.SuperGaussian`` builds such a likelihood from its pieces, with no class.
Likelihoods with a hierarchical augmentation (the Poisson with a scaled-logistic link, the
multi-latent ones) subclass ``Augmented`` and give the five methods directly.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree, Shaped

from augmentedgp.augmentation import inversion, samplers

_LOG_2 = math.log(2.0)


class SuperGaussianForm(NamedTuple):
    """p(y | f) = exp(log_c + g f) phi((a + b f)^2), elementwise in y."""

    log_c: jax.Array
    g: jax.Array
    a: jax.Array
    b: jax.Array


class CountAux(NamedTuple):
    """A Gibbs draw of a count-then-Polya-Gamma augmentation: counts n and w = PG(. , |f|) / 2
    (with ``f_precision``, for the heteroscedastic likelihoods, the precision of the
    collapsed site of f given g: precision sigmoid(g), times the Gamma scale u for
    Student-t)."""

    n: jax.Array
    w: jax.Array
    f_precision: jax.Array | None = None


class Tilt(NamedTuple):
    """q(w_i) = pi(w_i | c_i) ([Galy-Fajou2020, eq. 7]), stored as c_i^2."""

    c2: jax.Array


def log_cosh(x: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
    """log cosh x, stable for any x."""
    ax = jnp.abs(x)
    return ax + jnp.log1p(jnp.exp(-2.0 * ax)) - _LOG_2


def tanh_ratio(c: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
    """tanh(c / 2) / (2 c) = E[PG(1, c)] (even in c), with its limit 1/4 at c = 0
    ([Wenzel2019, Sec. 3.1])."""
    small = jnp.abs(c) < 1e-4
    cs = jnp.where(small, 1.0, c)  # double-where: finite gradients at c = 0
    return jnp.where(small, 0.25 - c**2 / 48.0, jnp.tanh(0.5 * cs) / (2.0 * cs))


def log_cosh_sqrt(t: Float[Array, "*batch"]) -> Float[Array, "*batch"]:
    """log cosh(sqrt(t) / 2) for t >= 0, smooth at t = 0 (= t/8 - t^2/192 + ...)."""
    small = t < 1e-6
    ts = jnp.where(small, 1.0, t)
    return jnp.where(small, t / 8.0 - t**2 / 192.0, log_cosh(0.5 * jnp.sqrt(ts)))


def _safe_sqrt(t):
    pos = t > 0.0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, t, 1.0)), 0.0)


def expected_h2(s: SuperGaussianForm, mean: Float[Array, "*batch"], var: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
    """E[h^2] = (a + b mean)^2 + b^2 var for f ~ N(mean, var)."""
    return (s.a + s.b * mean) ** 2 + s.b**2 * var


class Augmented(eqx.Module):
    """The protocol of a conditionally conjugate likelihood (AnalyticVI, AnalyticSVI, Gibbs
    sampling): auxiliary variables w such that, given w, each observation is a Gaussian site
    on f. A likelihood subclasses both :class:`~augmentedgp.likelihoods.Likelihood` and this
    class and gives the five abstract methods, with these signatures:

    - ``aux_posterior(y, mean, var)``: the optimal q(w) when f_i ~ N(mean_i, var_i) (a
      NamedTuple of arrays);
    - ``aux_sites(y, q_aux)``: (beta, gamma), E_{q(w)} of the site log-potential
      beta f - gamma f^2 / 2;
    - ``augmented_expectations(y, mean, var, q_aux=None)``: E_{q(f) q(w)}[log p(y, w | f)]
      - E_{q(w)}[log q(w)], elementwise, at ``q_aux`` or, if None, at the optimal q(w);
    - ``sample_aux(key, y, f)``: a draw of w ~ p(w | y, f) (Gibbs);
    - ``sites(y, aux)``: (beta, gamma) of the Gaussian site given the draw ``aux``.

    With several latent functions, mean, var and f are (n, C) and beta, gamma too.
    Scale mixtures subclass :class:`ScaleMixture`, which derives all five from phi.
    ``gibbs_joint``: whether the latents are independent given w, so that a Gibbs sweep
    draws them jointly (False: one latent at a time, w redrawn before each).
    """

    gibbs_joint: ClassVar[bool] = True

    @abc.abstractmethod
    def aux_posterior(self, y: Shaped[Array, "*batch"], mean: Float[Array, "*batch"],
                      var: Float[Array, "*batch"]) -> tuple:
        """The optimal q(w) when f_i ~ N(mean_i, var_i) (the local step of
        [Galy-Fajou2020, Algorithm 1])."""

    @abc.abstractmethod
    def aux_sites(self, y: Shaped[Array, "*batch"], q_aux: tuple
                 ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
        """(beta, gamma): E_{q(w)} of the Gaussian site on f, log-potential
        beta f - gamma f^2 / 2."""

    @abc.abstractmethod
    def augmented_expectations(self, y: Shaped[Array, "*batch"], mean: Float[Array, "*batch"],
                               var: Float[Array, "*batch"], q_aux: tuple | None = None
                              ) -> Float[Array, "*batch"]:
        """E_{q(f) q(w)}[log p(y, w | f)] - E_{q(w)}[log q(w)], elementwise: the data term
        of the augmented bound at ``q_aux``, or at the optimal q(w) if ``q_aux`` is None.
        Never above E_{q(f)}[log p(y | f)], and equal to log p(y | f) when var = 0."""

    @abc.abstractmethod
    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                  ) -> PyTree[Array]:
        """A draw of w ~ p(w | y, f) (the first step of a Gibbs sweep)."""

    @abc.abstractmethod
    def sites(self, y: Shaped[Array, "*batch"], aux: PyTree[Array]
             ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
        """(beta, gamma) of the Gaussian site on f given w = ``aux``: log p(y | f, w) =
        const + beta f - gamma f^2 / 2."""


class ScaleMixture(Augmented):
    """A super-Gaussian likelihood (module doc; [Galy-Fajou2020, eqs. 4-5]):
    p(y | f) = C(y) e^{g(y) f} phi(h^2), h = a(y) + b(y) f, with phi(t) = E_{p(w)} e^{-t w}
    the Laplace transform of a mixing density p(w) (Bernstein-Widder). Subclasses give

    - ``super_gaussian(y)``: the pieces ``SuperGaussianForm(log_c, g, a, b)``;
    - ``log_phi(y, t)``: log phi(t), elementwise;

    and may override with closed forms or exact samplers

    - ``omega_mean(y, t)``: E[w] under pi(w | t) (default: -d log phi / dt by autodiff);
    - ``sample_omega(key, y, t)``: a draw from the tilted law pi(w | t) ~ e^{-t w} p(w)
      (default: inverse-CDF sampling with the numerical inverse Laplace transform of phi,
      ``augmentation.inversion.sample``, which needs ``log_phi`` to evaluate at complex t);
    - ``log_mixing_density(y, w)``: log p(w), or None if w is a constant (a point mass)
      (default: the numerical inverse Laplace transform of phi).

    The five methods of :class:`Augmented` follow.
    """

    @abc.abstractmethod
    def super_gaussian(self, y: Shaped[Array, "*batch"]) -> SuperGaussianForm:
        """The pieces (log C, g, a, b) of p(y | f) = exp(log C + g f) phi((a + b f)^2)."""

    @abc.abstractmethod
    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        """log phi(t) = log E_{p(w)} e^{-t w}, for t >= 0 (phi(0) = 1)."""

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """log p(w) of the mixing law, elementwise (w > 0), whose Laplace transform is phi;
        None if w is a constant. Not used by inference: ``augmentedgp.testing`` integrates
        it numerically to check the augmentation. Default: the numerical inverse Laplace
        transform of phi (``inversion.log_mixing_density``, accurate to ~1e-8 absolute)."""
        y, w = jnp.broadcast_arrays(jnp.asarray(y, float), jnp.asarray(w, float))
        one = lambda yi, wi: inversion.log_mixing_density(lambda t: self.log_phi(yi, t), wi)
        return jax.vmap(one)(y.reshape(-1), w.reshape(-1)).reshape(w.shape)

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        """A draw of w ~ pi(w | t), the mixing law tilted by e^{-t w} (``t`` has the shape
        of the output). Default: the generic sampler ``inversion.sample`` (numerical
        inversion of phi's Laplace transform, [Galy-Fajou2020, Sec. 3.3.2]); the built-in
        likelihoods override it with exact samplers."""
        y = jnp.broadcast_to(jnp.asarray(y, float), jnp.shape(t))
        return inversion.sample(key, lambda tt, yi: self.log_phi(yi, tt), t, y)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        """E[w] under pi(w | t): -d log phi / dt (autodiff here; subclasses may give a
        closed form)."""
        return -jax.grad(lambda tt: jnp.sum(self.log_phi(y, tt)))(t)

    def aux_posterior(self, y: Shaped[Array, "*batch"], mean: Float[Array, "*batch"],
                      var: Float[Array, "*batch"]) -> Tilt:
        """The optimal q(w) = pi(w | c) with c^2 = E[h^2] ([Galy-Fajou2020,
        Algorithm 1], local step)."""
        return Tilt(expected_h2(self.super_gaussian(y), mean, var))

    def aux_sites(self, y: Shaped[Array, "*batch"], q_aux: Tilt
                 ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
        """(beta, gamma) = sites(y, E_{q(w)}[w]) ([Galy-Fajou2020, eq. 11] with
        h = a + b f)."""
        return self.sites(y, self.omega_mean(y, q_aux.c2))

    def sample_aux(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], f: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        """w ~ p(w | y, f) = pi(w | h(f)^2), the mixing law tilted by e^{-h^2 w}
        ([Galy-Fajou2020, Theorem 2; Algorithm 2], first step)."""
        s = self.super_gaussian(y)
        t = (s.a + s.b * f) ** 2
        return self.sample_omega(key, y, jnp.broadcast_to(t, jnp.broadcast_shapes(
            jnp.shape(t), jnp.shape(y))))

    def sites(self, y: Shaped[Array, "*batch"], aux: Float[Array, "*batch"]
             ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
        """(beta, gamma) of the Gaussian site on f given w = ``aux``: log p(y | f, w) =
        const + beta f - gamma f^2 / 2 with beta = g - 2 w a b, gamma = 2 w b^2."""
        s = self.super_gaussian(y)
        return s.g - 2.0 * aux * s.a * s.b, 2.0 * aux * s.b**2

    def augmented_expectations(self, y: Shaped[Array, "*batch"], mean: Float[Array, "*batch"],
                               var: Float[Array, "*batch"], q_aux: Tilt | None = None
                              ) -> Float[Array, "*batch"]:
        """E_{q(f) q(w)}[log p(y | f, w)] - KL(q(w) || p(w)), elementwise; with ``q_aux=None``
        at the optimal q(w), where it equals log C + g E[f] + log phi(E[h^2])."""
        s = self.super_gaussian(y)
        e_h2 = expected_h2(s, mean, var)
        if q_aux is None:
            return s.log_c + s.g * mean + self.log_phi(y, e_h2)
        w = self.omega_mean(y, q_aux.c2)
        # - E[h^2] E[w] - KL = -(E[h^2] - c^2) E[w] + log phi(c^2)   (KL of a tilted law)
        return s.log_c + s.g * mean - (e_h2 - q_aux.c2) * w + self.log_phi(y, q_aux.c2)


def log_polya_gamma_density(b: Float[ArrayLike, "*batch"], x: Float[ArrayLike, "*batch"],
                            terms: int = 200) -> Float[Array, "*batch"]:
    """log density of PG(b, 0) at x > 0, elementwise ([Polson2013, Sec. 2.1]: the
    alternating series 2^{b-1} / Gamma(b) sum_n (-1)^n Gamma(n + b) / n! (2n + b) /
    sqrt(2 pi x^3) e^{-(2n + b)^2 / (8x)}, ``terms`` terms). The series cancels far in the
    right tail: where the sum is below 1e-11 of its largest term (density < ~1e-11 of its
    peak for b <~ 10), or has not converged within ``terms`` terms, the density is returned
    as 0."""
    b, x = jnp.broadcast_arrays(jnp.asarray(b, float), jnp.asarray(x, float))
    n = jnp.arange(terms, dtype=x.dtype)
    bb, xx = b[..., None], jnp.maximum(x, 1e-300)[..., None]
    log_abs = ((bb - 1.0) * _LOG_2 - gammaln(bb) + gammaln(n + bb) - gammaln(n + 1.0)
               + jnp.log(2.0 * n + bb) - 0.5 * math.log(2.0 * math.pi) - 1.5 * jnp.log(xx)
               - (2.0 * n + bb) ** 2 / (8.0 * xx))
    top = jnp.max(log_abs, axis=-1)
    total = jnp.sum(jnp.where(n % 2 == 0, 1.0, -1.0) * jnp.exp(log_abs - top[..., None]), -1)
    converged = log_abs[..., -1] < top - 40.0  # the terms left out are negligible
    ok = (total > 1e-11) & (x > 0.0) & converged
    return jnp.where(ok, top + jnp.log(jnp.where(ok, total, 1.0)), -jnp.inf)


class PolyaGamma(ScaleMixture):
    """phi(t) = cosh(sqrt(t) / 2)^-b with h = f: w = PG(b, 0) / 2 ([Polson2013]).
    Subclasses give ``super_gaussian(y)`` and ``pg_b(y)``."""

    pg_method: ClassVar[str] = "series"  # see augmentedgp.samplers.polya_gamma

    @abc.abstractmethod
    def pg_b(self, y: Shaped[Array, "*batch"]) -> Float[Array, "*batch"] | float:
        """The Polya-Gamma shape b(y) > 0."""

    def log_phi(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
               ) -> Float[Array, "*batch"]:
        """-b log cosh(sqrt(t) / 2)."""
        return -self.pg_b(y) * log_cosh_sqrt(t)

    def log_mixing_density(self, y: Shaped[Array, "*batch"], w: Float[Array, "*batch"]
                          ) -> Float[Array, "*batch"] | None:
        """log density of w = PG(b, 0) / 2 (the series of ``log_polya_gamma_density``)."""
        return _LOG_2 + log_polya_gamma_density(self.pg_b(y), 2.0 * w)

    def omega_mean(self, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                  ) -> Float[Array, "*batch"]:
        """E[PG(b, c)] / 2 = b tanh(c / 2) / (4 c), c = sqrt(t)."""
        return 0.5 * self.pg_b(y) * tanh_ratio(_safe_sqrt(t))

    def sample_omega(self, key: PRNGKeyArray, y: Shaped[Array, "*batch"], t: Float[Array, "*batch"]
                    ) -> Float[Array, "*batch"]:
        """PG(b, sqrt(t)) / 2 (``augmentedgp.samplers.polya_gamma``, method ``pg_method``)."""
        b = jnp.broadcast_to(self.pg_b(y), jnp.shape(t))
        return 0.5 * samplers.polya_gamma(key, b, _safe_sqrt(t), method=self.pg_method)


__all__ = ["Augmented", "CountAux", "PolyaGamma", "ScaleMixture", "SuperGaussianForm", "Tilt",
           "expected_h2", "log_cosh", "log_cosh_sqrt", "log_polya_gamma_density", "tanh_ratio"]
