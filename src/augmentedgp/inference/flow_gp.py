"""Particle flows for GP models: the whitened posterior of a VGP's latent values, or of an
SVGP's inducing values, as a flow target."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.params import real
from augmentedgp.core.runtime import limits
from augmentedgp.inference.flow import (
    ADVI,
    SVGD,
    GaussianFlow,
    ParticleFlow,
    Target,
    fit_gaussian_target,
)
from augmentedgp.models.mcgp import latent_priors
from augmentedgp.models.sparse import SVGP, VGP, SparsePosterior
from augmentedgp.variational.families import LowRankQ

_LOG2PI = math.log(2 * math.pi)
_LOG2PIE = _LOG2PI + 1.0


class GPTarget(Target):
    """The whitened posterior of a GP model as a flow target: x = (v^1, ..., v^C) and
    phi(v) = -sum_i E_{p(f_i | v)}[log p(y_i | f_i)] - log N(v | 0, I).

    - VGP: v at the training inputs, f^c(X) = m^c(X) + L^c v^c with K^c(X, X) = L^c L^c^T;
      p(f | v) is a point mass, the term is log p(y_i | f(x_i)).
    - SVGP: v at the inducing inputs Z, u^c = Lmm^c v^c, and
      p(f_i | v) = N(m(x_i) + a_i^T v, k_ii - a_i^T a_i) with a_i = Lmm^-1 k(Z, x_i); the
      term is the likelihood's ``variational_expectations`` at that mean and variance. For
      any Gaussian q(v), E_q[phi] - H[q] is then minus the SVGP bound ([Hensman2015]):
      the flow's free energy is -ELBO.

    ``data`` = (row indices, y), so minibatches subsample the likelihood terms (an SVGP
    projects only the rows of the batch). Its trainable parameters are the model's
    hyperparameters (and an SVGP's trainable inducing inputs)."""

    model: SVGP = None
    X: jax.Array = None

    def potentials(self, V: Float[Array, "N D"], batch: tuple[ArrayLike, ...],
                   scale: float | Float[Array, ""]) -> Float[Array, " N"]:
        idx, y = batch
        N, C = V.shape[0], self.model.num_latent
        if isinstance(self.model, VGP):
            priors, per_latent = latent_priors(self.model, self.X, self.X)
            R, m0, var = priors.L[..., idx, :], priors.m0[..., idx], None  # f = m0 + L v
        else:
            Xb = self.X[idx]
            priors, per_latent = latent_priors(self.model, self.model.inducing.value, Xb)
            R, m0, var = jnp.swapaxes(priors.A, -1, -2), priors.m0, priors.resid
        Vc = V.reshape(N, C, R.shape[-1])
        if C == 1:
            F = m0 + Vc[:, 0] @ R.T  # (N, b)
        elif per_latent:
            F = m0.T + jnp.einsum("cij,ncj->nic", R, Vc)  # (N, b, C)
            var = None if var is None else var.T
        else:
            F = m0[:, None] + jnp.einsum("ij,ncj->nic", R, Vc)
            var = None if var is None else jnp.broadcast_to(var[:, None], F.shape[1:])
        lik = self.model.likelihood
        if var is None:
            term = jax.vmap(lambda f: jnp.sum(lik.log_prob(y, f)))(F)
        else:
            term = jax.vmap(lambda f: jnp.sum(lik.variational_expectations(y, f, var)))(F)
        return -scale * term + 0.5 * jnp.sum(V**2, axis=1) + 0.5 * V.shape[1] * _LOG2PI


@limits
def fit_flow(model: SVGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
             method: ParticleFlow | GaussianFlow | ADVI | SVGD, *,
             key: PRNGKeyArray | None = None, max_iter: int = 1000, tol: float = 0.0,
             learning_rate: float = 0.01, optimizer: str = "adam",
             callback: Callable | None = None, verbose: bool = False,
             chunk_size: int = 50, window: int = 20) -> SparsePosterior:
    """``augmentedgp.fit(model, X, y, method)`` for a VGP or SVGP with a flow ``method``:
    the particles (or samples) live in the whitened latent space (:class:`GPTarget`: the
    n latent values of a VGP, the M inducing values of an SVGP; ``method.batch_size`` for
    minibatches); the fitted q(v) becomes a :class:`~augmentedgp.variational.LowRankQ` (one
    per latent function: with C > 1 the latents are independent blocks of the flow; ADVI's
    full-rank fit keeps each latent's marginal), so the result predicts like any fitted
    SVGP. The model's trainable hyperparameters (and an SVGP's inducing inputs) follow
    ``optimizer`` on the same free energy."""
    if not isinstance(model, SVGP):
        raise TypeError(f"particle flows fit VGP and SVGP models, not {type(model).__name__}")
    if isinstance(model, VGP):
        model = model.bind(X)
    Xa, ya = model.validate_data(X, y)
    size, C = model.inducing.value.shape[0], model.num_latent
    blocks = getattr(method, "blocks", None)
    if C > 1 and blocks is None:
        blocks = (size,) * C  # SVGP keeps one q per latent function
    elif C > 1 and blocks != "diagonal":
        raise ValueError("with several latent functions, blocks must be None (one block per "
                         "latent) or 'diagonal'")
    per_latent = C > 1 and hasattr(method, "blocks") and blocks != "diagonal"
    if per_latent:
        method = dataclasses.replace(method, blocks=blocks)
    target = GPTarget(data=(jnp.arange(Xa.shape[0]), ya),
                      model=eqx.tree_at(lambda m: m.q, model, None), X=Xa)
    q, fitted = fit_gaussian_target(
        target, jnp.zeros(size * C), method, key=key, max_iter=max_iter, tol=tol,
        learning_rate=learning_rate, optimizer=optimizer, callback=callback, verbose=verbose,
        chunk_size=chunk_size, window=window)
    if per_latent:  # block-diagonal factor: keep each latent's own columns
        k = q.factor.shape[1] // C
        factor = jnp.stack([q.factor[c * size:(c + 1) * size, c * k:(c + 1) * k] for c in range(C)])
    else:  # the marginal factor of each latent (ADVI's full Cholesky: its rows)
        factor = q.factor.reshape(C, size, -1)
    if q.sd is not None:
        sd = q.sd.reshape(C, size)
        factor = jnp.concatenate([jax.vmap(jnp.diag)(sd), factor], axis=2)
    mean = q.mean.reshape(C, size)
    lowrank = LowRankQ(real(mean if C > 1 else mean[0], "q mean"),
                       real(factor if C > 1 else factor[0], "q factor"))
    fitted_model = eqx.tree_at(lambda m: m.q, fitted.model, lowrank, is_leaf=lambda x: x is None)
    return SparsePosterior(fitted_model, Xa, ya, q.history)


__all__ = ["GPTarget", "fit_flow"]
