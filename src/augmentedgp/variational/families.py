"""Gaussian variational posteriors q(u) = N(m, S) over the inducing values u = g(Z).

Four parameterisations share one interface. Kmm = Lmm Lmm^T and v = Lmm^{-1} u is the
whitened variable (p(v) = N(0, I)); ``A = Lmm^{-1} Kmn`` projects onto the points X.

- ``CholeskyQ(whiten=False)``: m and a lower-triangular L with S = L L^T (Hensman 2013);
- ``CholeskyQ(whiten=True)``: the same for q(v) (GPflow's default);
- ``NaturalQ``: theta1 = S^-1 m, theta2 = -1/2 S^-1 (of u, or of v with ``whiten``);
- ``SiteQ``: the O(M) "prior + diagonal" family of [Kobe2021, Sec. 3.1] (after [Panos2018]),
  q(u) proportional to p(u) exp(lam^T u - 1/2 u^T diag(g) u), i.e. S = (Kmm^-1 + G)^-1 and
  m = S lam, stored in the site coordinates (lam, g), g > 0, rather than in the (mu, g) of
  [Kobe2021, Sec. 3.2], whose mu is not an affine natural parameter.

Each gives the marginals of g(X) = f(X) - mean(X) under q(f) = int p(f|u) q(u) du
(``conditional``), ``kl`` = KL(q(u) || p(u)), and its distribution as whitened natural
parameters (``whitened_natural``; ``from_whitened_natural`` maps back), on which the
natural-gradient step acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from augmentedgp.core import linalg
from augmentedgp.core.params import Parameter, positive, real


def map_latents(fn: Callable[..., PyTree], args: tuple, mapped: tuple[bool, ...]) -> PyTree:
    """fn(*args) for each latent function: ``args[i]`` is sliced along its leading latent
    axis where ``mapped[i]``, and shared otherwise; results are stacked.

    A compiled ``lax.map``, not ``vmap``: vmapped factorisations and triangular solves
    become batched LAPACK calls, which jaxlib 0.10 parallelises over XLA's intra-op pool
    and which can deadlock it (seen on 2 cores: both pool threads blocked in
    ``jax::ParallelBatchMap`` inside a batched trsm). One matrix per call is the path
    single-latent models take; the likelihood terms stay vectorised over the latents."""
    xs = tuple(a for a, m in zip(args, mapped, strict=True) if m)

    def body(x):
        it = iter(x)
        return fn(*(next(it) if m else a for a, m in zip(args, mapped, strict=True)))

    return jax.lax.map(body, xs)


def _gauss_kl_whitened(mv, tr_S, logdet_S):
    """KL(N(mv, Sv) || N(0, I))."""
    return 0.5 * (tr_S + jnp.sum(mv**2) - mv.shape[0] - logdet_S)


def _marginals(mean, R_A, A, kdiag, Kxx, full_cov):
    """Marginals of g(X) from whitened q(v) = N(mv, R R^T): mean A^T mv and
    K_xx - A^T A + (R^T A)^T (R^T A)."""
    if full_cov:
        return mean, Kxx - A.T @ A + R_A.T @ R_A
    return mean, jnp.maximum(kdiag - jnp.sum(A**2, 0) + jnp.sum(R_A**2, 0), 0.0)


def _sym(P):
    return 0.5 * (P + P.T)


def _inverse_factor(P):
    """Lower-triangular R with R R^T = P^-1 from one Cholesky and one triangular inverse:
    with J the reversal permutation and J P J = L L^T, R = J L^-T J."""
    L = linalg.cholesky(_sym(P)[::-1, ::-1])
    return linalg.solve_lower(L, jnp.eye(P.shape[0], dtype=P.dtype)).T[::-1, ::-1]


class QPosterior(eqx.Module):
    """Interface of a parameterised q(u)."""

    def conditional(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                    Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"],
                    Kxx: Float[Array, "n n"] | None = None, full_cov: bool = False
                   ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        raise NotImplementedError

    def kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]) -> Float[Array, ""]:
        raise NotImplementedError

    def conditional_kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                       Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"]
                      ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, ""]]:
        """(marginal mean, marginal variance, KL): what the bound needs, sharing work."""
        return (*self.conditional(Kmm, Lmm, Kmn, A, kdiag), self.kl(Kmm, Lmm))

    def whitened_natural(self, Lmm: Float[Array, "M M"]
                        ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        """(theta1, P): P = Sv^-1 the precision of v and theta1 = P mv."""
        raise NotImplementedError

    def from_whitened_natural(self, theta1: Float[Array, " M"], P: Float[Array, "M M"],
                              Lmm: Float[Array, "M M"]) -> QPosterior:
        raise NotImplementedError

    def mean_cov(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]
                ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        """(m, S) of q(u)."""
        theta1, P = self.whitened_natural(Lmm)
        Lp = linalg.cholesky(_sym(P))
        mv, Sv = linalg.cho_solve(Lp, theta1), linalg.cho_solve(Lp, jnp.eye(P.shape[0]))
        return Lmm @ mv, Lmm @ Sv @ Lmm.T

    @property
    def num_params(self) -> int:
        raise NotImplementedError

    @property
    def num_inducing(self) -> int:
        return jax.tree_util.tree_leaves(self)[0].shape[0]  # every field leads with M


class CholeskyQ(QPosterior):
    """q = N(mean, L L^T) over u, or over v = Lmm^-1 u when ``whiten``."""

    mean: Parameter
    chol: Parameter  # only the lower triangle is used
    whiten: bool = eqx.field(static=True, default=False)

    @classmethod
    def prior(cls, Lmm: Float[Array, "M M"], whiten: bool) -> QPosterior:
        M = Lmm.shape[0]
        L = jnp.eye(M, dtype=Lmm.dtype) if whiten else Lmm
        return cls(real(jnp.zeros(M), "q mean"), real(L, "q cholesky"), whiten)

    def _whitened(self, Lmm):
        """(mv, Rv) with Sv = Rv Rv^T."""
        m, L = self.mean.value, jnp.tril(self.chol.value)
        if self.whiten:
            return m, L
        return linalg.solve_lower(Lmm, m), linalg.solve_lower(Lmm, L)

    def conditional(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                    Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"],
                    Kxx: Float[Array, "n n"] | None = None, full_cov: bool = False
                   ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        mv, R = self._whitened(Lmm)
        return _marginals(A.T @ mv, R.T @ A, A, kdiag, Kxx, full_cov)

    def kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]) -> Float[Array, ""]:
        mv, R = self._whitened(Lmm)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.abs(jnp.diag(R))))  # R is lower triangular
        return _gauss_kl_whitened(mv, jnp.sum(R**2), logdet)

    def whitened_natural(self, Lmm: Float[Array, "M M"]
                        ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        mv, R = self._whitened(Lmm)
        Rinv = linalg.solve_lower(R, jnp.eye(R.shape[0], dtype=R.dtype))
        P = Rinv.T @ Rinv
        return P @ mv, P

    def from_whitened_natural(self, theta1: Float[Array, " M"], P: Float[Array, "M M"],
                              Lmm: Float[Array, "M M"]) -> QPosterior:
        R = _inverse_factor(P)
        mv = R @ (R.T @ theta1)
        m, L = (mv, R) if self.whiten else (Lmm @ mv, Lmm @ R)
        return dataclasses.replace(self, mean=dataclasses.replace(self.mean, raw=m),
                                   chol=dataclasses.replace(self.chol, raw=L))

    @property
    def num_params(self) -> int:
        M = self.mean.raw.shape[0]
        return M + M * (M + 1) // 2


class NaturalQ(QPosterior):
    """q stored as natural parameters theta1 = S^-1 m, theta2 = -1/2 S^-1 of u (or of v)."""

    theta1: Parameter
    theta2: Parameter
    whiten: bool = eqx.field(static=True, default=False)

    @classmethod
    def prior(cls, Lmm: Float[Array, "M M"], whiten: bool) -> QPosterior:
        M = Lmm.shape[0]
        eye = jnp.eye(M, dtype=Lmm.dtype)
        prec = eye if whiten else linalg.cho_solve(Lmm, eye)
        return cls(real(jnp.zeros(M), "q theta1"), real(-0.5 * prec, "q theta2"), whiten)

    def whitened_natural(self, Lmm: Float[Array, "M M"]
                        ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        t1, prec = self.theta1.value, -2.0 * _sym(self.theta2.value)
        if self.whiten:
            return t1, prec
        return Lmm.T @ t1, Lmm.T @ prec @ Lmm  # u = Lmm v

    def from_whitened_natural(self, theta1: Float[Array, " M"], P: Float[Array, "M M"],
                              Lmm: Float[Array, "M M"]) -> QPosterior:
        if not self.whiten:
            theta1 = linalg.solve_upper_t(Lmm, theta1)
            Linv = linalg.solve_lower(Lmm, jnp.eye(P.shape[0], dtype=P.dtype))
            P = Linv.T @ P @ Linv
        return dataclasses.replace(self, theta1=dataclasses.replace(self.theta1, raw=theta1),
                                   theta2=dataclasses.replace(self.theta2, raw=-0.5 * _sym(P)))

    def _whitened(self, Lmm):
        theta1, P = self.whitened_natural(Lmm)
        Lp = linalg.cholesky(_sym(P))
        return linalg.cho_solve(Lp, theta1), Lp

    def conditional(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                    Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"],
                    Kxx: Float[Array, "n n"] | None = None, full_cov: bool = False
                   ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        return self._conditional(self._whitened(Lmm), A, kdiag, Kxx, full_cov)

    @staticmethod
    def _conditional(whitened, A, kdiag, Kxx=None, full_cov=False):
        mv, Lp = whitened  # Sv = Lp^-T Lp^-1, so R^T A = Lp^-1 A
        return _marginals(A.T @ mv, linalg.solve_lower(Lp, A), A, kdiag, Kxx, full_cov)

    def kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]) -> Float[Array, ""]:
        return self._kl(self._whitened(Lmm))

    @staticmethod
    def _kl(whitened):
        mv, Lp = whitened
        Linv = linalg.solve_lower(Lp, jnp.eye(Lp.shape[0], dtype=Lp.dtype))
        return _gauss_kl_whitened(mv, jnp.sum(Linv**2), -linalg.logdet_chol(Lp))

    def conditional_kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                       Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"]
                      ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, ""]]:
        w = self._whitened(Lmm)  # one factorisation for both
        return (*self._conditional(w, A, kdiag), self._kl(w))

    @property
    def num_params(self) -> int:
        M = self.theta1.raw.shape[0]
        return M + M * (M + 1) // 2


class SiteQ(QPosterior):
    """O(M) q(u) = N(S lam, S), S = (Kmm^-1 + diag(g))^-1 ([Kobe2021, eq. 3.5], site form).

    All quantities come from B = I + G^1/2 Kmm G^1/2 (no factor of Kmm is needed):
    mu = (Kmm + G^-1)^-1 G^-1 lam = G^1/2 B^-1 G^-1/2 lam, the mean of q(f(x)) is
    k_x^T mu and its variance k_xx - |L_B^-1 G^1/2 k_x|^2 ([Kobe2021, eq. 3.6], corrected: the
    cross-covariances k_x in place of Kmm).
    """

    lam: Parameter
    g: Parameter

    @classmethod
    def prior(cls, M: int, g0: float = 1e-3) -> QPosterior:
        return cls(real(jnp.zeros(M), "q site potentials"),
                   positive(jnp.full(M, g0), "q site precisions"))

    def factors(self, Kmm: Float[Array, "M M"]
               ) -> tuple[Float[Array, " M"], Float[Array, "M M"], Float[Array, " M"]]:
        """(sqrt(g), L_B, mu)."""

        return linalg.site_factors(Kmm, self.g.value, self.lam.value)

    def conditional(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                    Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"],
                    Kxx: Float[Array, "n n"] | None = None, full_cov: bool = False
                   ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        s, LB, mu = self.factors(Kmm)
        V = linalg.solve_lower(LB, s[:, None] * Kmn)
        if full_cov:
            return Kmn.T @ mu, Kxx - V.T @ V
        return Kmn.T @ mu, jnp.maximum(kdiag - jnp.sum(V**2, 0), 0.0)

    def kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]) -> Float[Array, ""]:
        s, LB, mu = self.factors(Kmm)  # [Kobe2021, eq. 3.7] with log|K + G^-1| + log|G| = log|B|
        Binv = linalg.solve_lower(LB, jnp.eye(LB.shape[0], dtype=LB.dtype))
        tr = LB.shape[0] - jnp.sum(Binv**2)  # tr((K + G^-1)^-1 K) = M - tr(B^-1)
        return 0.5 * (mu @ Kmm @ mu - tr) + 0.5 * linalg.logdet_chol(LB)

    def whitened_natural(self, Lmm: Float[Array, "M M"]
                        ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        return Lmm.T @ self.lam.value, jnp.eye(Lmm.shape[0]) + Lmm.T @ (
            self.g.value[:, None] * Lmm)

    def mean_cov(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]
                ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        s, LB, mu = self.factors(Kmm)
        V = linalg.solve_lower(LB, s[:, None] * Kmm)
        return Kmm @ mu, Kmm - V.T @ V

    @property
    def num_params(self) -> int:
        return 2 * self.lam.raw.shape[0]


class LowRankQ(QPosterior):
    """Whitened q(v) = N(mean, W W^T + I - P_W) with a factor W (M, K) of rank r <= M and
    P_W the projector onto its column span: the Gaussian of a particle cloud
    (``augmentedgp.inference.flow``, W = centred particles / sqrt(N)) with the directions the
    particles do not span kept at the prior's unit variance -- the regularised Gaussian of
    [Galy-Fajou2021, Sec. 3.4.1], so KL = 1/2 (tr(W W^T) - r + |mean|^2 - sum log lambda_+)
    over the r nonzero eigenvalues of W^T W, and the bound stays a bound. With r = M
    (N > M particles) it is N(mean, W W^T). Natural-gradient steps are not defined."""

    mean: Parameter
    factor: Parameter

    def _basis(self):
        """(W, Q, r): an orthonormal basis Q of span(W) (zero columns where W^T W is
        singular) and the rank r."""
        W = self.factor.value
        lam, U = jnp.linalg.eigh(W.T @ W)
        pos = lam > 1e-10 * jnp.max(lam)
        Q = (W @ U) * jnp.where(pos, 1.0 / jnp.sqrt(jnp.where(pos, lam, 1.0)), 0.0)
        return W, Q, lam, pos

    def conditional(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"],
                    Kmn: Float[Array, "M n"], A: Float[Array, "M n"], kdiag: Float[Array, " n"],
                    Kxx: Float[Array, "n n"] | None = None, full_cov: bool = False
                   ) -> tuple[Float[Array, " n"], Float[Array, " n"] | Float[Array, "n n"]]:
        W, Q, _, _ = self._basis()
        R_A = jnp.concatenate([W.T @ A, A - Q @ (Q.T @ A)], axis=0)  # (W W^T + I - Q Q^T)
        return _marginals(A.T @ self.mean.value, R_A, A, kdiag, Kxx, full_cov)

    def kl(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]) -> Float[Array, ""]:
        W, _, lam, pos = self._basis()
        logdet = jnp.sum(jnp.where(pos, jnp.log(jnp.where(pos, lam, 1.0)), 0.0))
        mv = self.mean.value
        return 0.5 * (jnp.sum(W**2) - jnp.sum(pos) + mv @ mv - logdet)

    def whitened_natural(self, Lmm: Float[Array, "M M"]
                        ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        raise TypeError("LowRankQ has no natural parameters; fit it with a particle flow")

    def from_whitened_natural(self, theta1: Float[Array, " M"], P: Float[Array, "M M"],
                              Lmm: Float[Array, "M M"]) -> QPosterior:
        return self.whitened_natural(Lmm)

    def mean_cov(self, Kmm: Float[Array, "M M"], Lmm: Float[Array, "M M"]
                ) -> tuple[Float[Array, " M"], Float[Array, "M M"]]:
        W, Q, _, _ = self._basis()
        Sv = W @ W.T + jnp.eye(W.shape[0], dtype=W.dtype) - Q @ Q.T
        return Lmm @ self.mean.value, Lmm @ Sv @ Lmm.T

    @property
    def num_params(self) -> int:
        return self.mean.raw.shape[0] * (1 + self.factor.raw.shape[1])


def make_q(kind: str | QPosterior, Lmm: Float[Array, "M M"]) -> QPosterior:
    """A q(u) at the prior for ``kind`` in {"whitened", "cholesky", "natural",
    "natural_whitened", "site"} (or a QPosterior, returned as is)."""
    if isinstance(kind, QPosterior):
        return kind
    if kind == "whitened":
        return CholeskyQ.prior(Lmm, True)
    if kind == "cholesky":
        return CholeskyQ.prior(Lmm, False)
    if kind == "natural":
        return NaturalQ.prior(Lmm, False)
    if kind == "natural_whitened":
        return NaturalQ.prior(Lmm, True)
    if kind == "site":
        return SiteQ.prior(Lmm.shape[0])
    raise ValueError("q must be 'whitened', 'cholesky', 'natural', 'natural_whitened', 'site' "
                     f"or a QPosterior, got {kind!r}")


__all__ = ["QPosterior", "CholeskyQ", "NaturalQ", "SiteQ", "LowRankQ", "make_q", "map_latents"]
