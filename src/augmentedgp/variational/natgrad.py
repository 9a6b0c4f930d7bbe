"""The one conjugate update: a natural-gradient step on q(u) from Gaussian sites.

Every likelihood term enters the update as a Gaussian site on g_i = f(x_i) - mean(x_i),
log-potential  beta_i g_i - 1/2 gamma_i g_i^2  (the site view of [Khan2017]; docs/design.md).
Quadrature VI obtains the sites from the derivatives of the variational expectations
(gamma = -2 dE/dvar, beta = dE/dmean + gamma * mean); augmented likelihoods give them
in closed form. With the minibatch scale s = n / |B|, the target of the step in whitened
natural parameters is ([Hensman2013]; [Salimbeni2018])

    theta1* = A (s beta),   P* = I + A diag(s gamma) A^T,   A = Lmm^-1 Kmb,

and theta <- (1 - rho) theta + rho theta*  (rho = 1 on the full batch is the CAVI / VB
update). Natural gradients are invariant to the affine map u = Lmm v, so the step is the
same distribution update for the whitened, unwhitened and natural parameterisations.
The O(M) site family instead takes the Fisher-preconditioned step in its own coordinates
beta = (lam, g) ([Kobe2021, Sec. 3.2] steps in (mu, g), but mu is not an affine natural
parameter): beta <- beta + rho F_beta^-1 grad_beta ELBO.
A step that leaves the positive-definite cone (or makes g <= 0) is halved until it does
not; if 30 halvings do not help, q is left unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, PRNGKeyArray, PyTree, Shaped

from augmentedgp.core import linalg
from augmentedgp.likelihoods.base import Likelihood
from augmentedgp.variational.families import QPosterior, SiteQ, map_latents

_MAX_HALVINGS = 30


def quadrature_sites(likelihood: Likelihood, y: Shaped[Array, " n"], mean: Float[Array, "n ..."],
                     var: Float[Array, "n ..."], prior_mean: Float[Array, "n ..."],
                     n: int | None = None, key: PRNGKeyArray | None = None
                    ) -> tuple[Float[Array, "n ..."], Float[Array, "n ..."]]:
    """(beta, gamma) from the derivatives of E_q[log p(y|f)] at the current marginals."""
    gm, gv = jax.grad(lambda m, v: jnp.sum(likelihood.variational_expectations(y, m, v, n, key)),
                      (0, 1))(mean, var)
    gamma = -2.0 * gv
    return gm + gamma * (mean - prior_mean), gamma


def site_objective(beta: Float[Array, "n ..."], gamma: Float[Array, "n ..."],
                   mean_g: Float[Array, "n ..."], var: Float[Array, "n ..."]) -> Float[Array, ""]:
    """sum_i beta_i E[g_i] - 1/2 gamma_i E[g_i^2]: a surrogate data term whose gradient in
    the marginals (and hence in any q parameters) equals that of the true one."""
    return jnp.sum(beta * mean_g - 0.5 * gamma * (mean_g**2 + var))


def _is_pd(P):
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(P)))


def _backoff(ok_at, rho):
    """The largest rho / 2^k (k < 30) with ok_at(rho), or 0."""

    def cond(state):
        r, k = state
        return (k < _MAX_HALVINGS) & ~ok_at(r)

    r, k = lax.while_loop(cond, lambda s: (0.5 * s[0], s[1] + 1), (rho, 0))
    return jnp.where(k < _MAX_HALVINGS, r, 0.0)


def natural_step(q: QPosterior, Kmm: Float[Array, "*c M M"], Lmm: Float[Array, "*c M M"],
                 Kmn: Float[Array, "*c M n"], A: Float[Array, "*c M n"],
                 kdiag: Float[Array, "*c n"], beta: Float[Array, "n ..."],
                 gamma: Float[Array, "n ..."], scale: float | Float[Array, ""],
                 rho: float | Float[Array, ""], psd: bool = False, multi: bool = False
                ) -> tuple[QPosterior, Float[Array, ""]]:
    """q after one natural-gradient step of size rho towards the sites; returns (q, rho).

    ``psd=True`` promises gamma >= 0 (augmented sites): the target precision is then
    positive definite and so is every step with rho <= 1, and the back-off is skipped."""
    q, rho, _ = scheduled_step(q, Kmm, Lmm, Kmn, A, kdiag, beta, gamma, scale,
                               lambda direction: (rho, None), psd, multi)
    return q, rho


def scheduled_step(q: QPosterior, Kmm: Float[Array, "*c M M"], Lmm: Float[Array, "*c M M"],
                   Kmn: Float[Array, "*c M n"], A: Float[Array, "*c M n"],
                   kdiag: Float[Array, "*c n"], beta: Float[Array, "n ..."],
                   gamma: Float[Array, "n ..."], scale: float | Float[Array, ""], rate: Callable,
                   psd: bool = False, multi: bool = False
                  ) -> tuple[QPosterior, Float[Array, ""], PyTree]:
    """As :func:`natural_step` with the step size from ``rate(direction) -> (rho, aux)``,
    where direction is the flattened natural gradient (target minus current whitened
    natural parameters, or the site family's Fisher step); returns (q, rho, aux).

    ``multi``: several latent functions. q and the projection (Kmm, ..., kdiag) carry a
    leading latent axis, beta and gamma are (n, C); every latent takes its own step
    (``variational.map_latents``), with one step size from the concatenated direction."""
    return statistics_step(q, Kmm, Lmm, site_statistics(A, beta, gamma, multi), scale, rate,
                           psd, multi)


def site_statistics(A: Float[Array, "*c M n"], beta: Float[Array, "n ..."],
                    gamma: Float[Array, "n ..."], multi: bool = False
                   ) -> tuple[Float[Array, "*c M"], Float[Array, "*c M M"]]:
    """The data's part of the natural-gradient target, (A beta, A diag(gamma) A^T) with
    A = Lmm^-1 Kmn: sums over the points, so the statistics of disjoint partitions of the
    data add up to those of the whole (:mod:`augmentedgp.training.distributed`). With ``multi``,
    A is (C, M, n), beta and gamma (n, C), and the statistics lead with the latent axis."""
    if multi:
        return map_latents(site_statistics, (A, beta.T, gamma.T), (True, True, True))
    return A @ beta, (A * gamma) @ A.T


def statistics_step(q: QPosterior, Kmm: Float[Array, "*c M M"], Lmm: Float[Array, "*c M M"],
                    statistics: tuple[Float[Array, "*c M"], Float[Array, "*c M M"]],
                    scale: float | Float[Array, ""], rate: Callable, psd: bool = False,
                    multi: bool = False) -> tuple[QPosterior, Float[Array, ""], PyTree]:
    """:func:`scheduled_step` from summed :func:`site_statistics` (s1, S2) of the data: the
    target is theta1* = scale s1, P* = I + scale S2; the site family takes its Fisher step,
    whose data term is also a function of (s1, S2)."""
    each = _each(multi)
    if isinstance(q, SiteQ):
        step = each(_site_fisher_step, (q, Kmm, Lmm, *statistics, scale),
                    (True, True, True, True, True, False))
        return _take_step(q, step, step, Lmm, rate, False, each)
    direction, state = each(_whitened_direction, (q, Lmm, *statistics, scale),
                            (True, True, True, True, False))
    return _take_step(q, direction, state, Lmm, rate, psd, each)


def _each(multi):
    return map_latents if multi else (lambda fn, args, mapped: fn(*args))


def _take_step(q, direction, state, Lmm, rate, psd, each):
    rho, aux = rate(direction.ravel())
    if isinstance(q, SiteQ) or not psd:
        rho = _backoff(lambda r: jnp.all(each(_valid, (q, state, r), (True, True, False))), rho)
    return each(_apply, (q, state, rho, Lmm), (True, True, False, True)), rho, aux


def _whitened_direction(q, Lmm, s1, S2, scale):
    """(the natural-gradient direction, flattened; the state _valid and _apply need)."""
    theta1, P = q.whitened_natural(Lmm)
    target1 = scale * s1
    targetP = jnp.eye(P.shape[0], dtype=P.dtype) + scale * S2
    return (jnp.concatenate([target1 - theta1, (targetP - P).ravel()]),
            (theta1, P, target1, targetP))


def _mix(state, r):
    theta1, P, target1, targetP = state
    return (1 - r) * theta1 + r * target1, (1 - r) * P + r * targetP


def _valid(q, state, r):
    """Whether the step r keeps q a distribution (P positive definite; site g > 0)."""
    if isinstance(q, SiteQ):
        return jnp.all(q.g.value + r * state[q.lam.value.shape[0]:] > 0)
    return _is_pd(_mix(state, r)[1])


def _apply(q, state, r, Lmm):
    if isinstance(q, SiteQ):
        M = q.lam.value.shape[0]
        return dataclasses.replace(
            q, lam=dataclasses.replace(q.lam, raw=q.lam.value + r * state[:M]),
            g=dataclasses.replace(q.g, raw=q.g.transform.inverse(q.g.value + r * state[M:])))
    return q.from_whitened_natural(*_mix(state, r), Lmm)


def direction_size(q, num_latent: int = 1) -> int:
    """Length of the direction that ``scheduled_step`` passes to ``rate``."""
    M = jax.tree_util.tree_leaves(q)[0].shape[-1]  # every q field leads with M (per latent)
    return num_latent * (2 * M if isinstance(q, SiteQ) else M + M * M)


def _site_fisher_step(q, Kmm, Lmm, s1, S2, scale):
    """F^-1 grad of the ELBO in the site coordinates (lam, g) (see the module doc). The data term
    sum_i beta_i E[g_i] - gamma_i E[g_i^2] / 2 depends on q only through the whitened
    moments: with E[g_i] = a_i^T m, m = Lmm^T mu, and Var[g_i] = k_ii - a_i^T W^T W a_i,
    W = L_B^-1 G^1/2 Lmm, it is s1^T m - (m^T S2 m - tr(S2 W^T W)) / 2 + const."""
    lam, g = q.lam.value, q.g.value

    def elbo(lam, g):
        qq = dataclasses.replace(q, lam=dataclasses.replace(q.lam, raw=lam),
                                 g=dataclasses.replace(q.g, raw=q.g.transform.inverse(g)))
        s, LB, mu = qq.factors(Kmm)
        m = Lmm.T @ mu
        W = linalg.solve_lower(LB, s[:, None] * Lmm)
        data = s1 @ m - 0.5 * (m @ S2 @ m - jnp.sum(W * (W @ S2)))
        return scale * data - qq.kl(Kmm, Lmm)

    grad = jnp.concatenate(jax.grad(elbo, (0, 1))(lam, g))
    m, S = q.mean_cov(Kmm, Lmm)
    # Fisher of the sub-family with sufficient statistics (u_i, -u_j^2 / 2) (Isserlis' theorem)
    F = jnp.block([[S, -S * m[None, :]], [-(S * m[None, :]).T, 0.5 * S**2 + S * jnp.outer(m, m)]])
    step = linalg.cho_solve(linalg.cholesky(0.5 * (F + F.T)), grad)
    return jnp.where(jnp.all(jnp.isfinite(step)), step, 0.0)


__all__ = ["natural_step", "scheduled_step", "statistics_step", "site_statistics",
           "direction_size", "quadrature_sites", "site_objective"]
