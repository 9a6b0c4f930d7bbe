"""Particle flows for GP models: the whitened VGP posterior as a flow target."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from augmentedgp.core.params import real
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
    """The whitened posterior of a VGP's latent values: x = (v^1, ..., v^C), f^c(X) =
    m^c(X) + L^c v^c with K^c(X, X) = L^c L^c^T, and
    phi(v) = -sum_i log p(y_i | f(x_i)) - log N(v | 0, I). ``data`` = (row indices, y), so
    minibatches subsample the likelihood terms. Its trainable parameters are the model's
    hyperparameters."""

    model: SVGP = None
    X: jax.Array = None

    def potentials(self, V: Float[Array, "N D"], batch: tuple[ArrayLike, ...],
                   scale: float | Float[Array, ""]) -> Float[Array, " N"]:
        idx, y = batch
        N, n, C = V.shape[0], self.X.shape[0], self.model.num_latent
        priors, per_latent = latent_priors(self.model, self.X, self.X)
        Vc = V.reshape(N, C, n)
        if C == 1:
            F = priors.m0 + Vc[:, 0] @ priors.L.T  # (N, n)
        elif per_latent:
            F = priors.m0.T + jnp.einsum("cij,ncj->nic", priors.L, Vc)  # (N, n, C)
        else:
            F = priors.m0[:, None] + jnp.einsum("ij,ncj->nic", priors.L, Vc)
        lik = jax.vmap(lambda f: jnp.sum(self.model.likelihood.log_prob(y, f[idx])))(F)
        return -scale * lik + 0.5 * jnp.sum(V**2, axis=1) + 0.5 * V.shape[1] * _LOG2PI


def fit_vgp(model: VGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
            method: ParticleFlow | GaussianFlow | ADVI | SVGD, *,
            key: PRNGKeyArray | None = None, max_iter: int = 1000, tol: float = 0.0,
            learning_rate: float = 0.01, optimizer: str = "adam",
            callback: Callable | None = None, verbose: bool = False,
            chunk_size: int = 50, window: int = 20) -> SparsePosterior:
    """``augmentedgp.fit(VGP(...), X, y, method)`` with a flow ``method``: the particles (or
    samples) live in the whitened latent space; the fitted q(v) becomes a
    :class:`~augmentedgp.variational.LowRankQ` (one per latent function: with C > 1 the
    latents are independent blocks of the flow; ADVI's full-rank fit keeps each latent's
    marginal), so the result predicts like any fitted VGP. The
    model's trainable hyperparameters follow ``optimizer`` on the same free energy."""
    if not isinstance(model, VGP):
        raise TypeError("particle flows fit VGP models (the latent values at the training "
                        f"inputs), not {type(model).__name__}")
    model = model.bind(X)
    Xa, ya = model.validate_data(X, y)
    n, C = Xa.shape[0], model.num_latent
    blocks = getattr(method, "blocks", None)
    if C > 1 and blocks is None:
        blocks = (n,) * C  # SVGP keeps one q per latent function
    elif C > 1 and blocks != "diagonal":
        raise ValueError("with several latent functions, blocks must be None (one block per "
                         "latent) or 'diagonal'")
    per_latent = C > 1 and hasattr(method, "blocks") and blocks != "diagonal"
    if per_latent:
        method = dataclasses.replace(method, blocks=blocks)
    target = GPTarget(data=(jnp.arange(n), ya),
                      model=eqx.tree_at(lambda m: m.q, model, None), X=Xa)
    q, fitted = fit_gaussian_target(
        target, jnp.zeros(n * C), method, key=key, max_iter=max_iter, tol=tol,
        learning_rate=learning_rate, optimizer=optimizer, callback=callback, verbose=verbose,
        chunk_size=chunk_size, window=window)
    if per_latent:  # block-diagonal factor: keep each latent's own columns
        k = q.factor.shape[1] // C
        factor = jnp.stack([q.factor[c * n:(c + 1) * n, c * k:(c + 1) * k] for c in range(C)])
    else:  # the marginal factor of each latent (ADVI's full Cholesky: its rows)
        factor = q.factor.reshape(C, n, -1)
    if q.sd is not None:
        sd = q.sd.reshape(C, n)
        factor = jnp.concatenate([jax.vmap(jnp.diag)(sd), factor], axis=2)
    mean = q.mean.reshape(C, n)
    lowrank = LowRankQ(real(mean if C > 1 else mean[0], "q mean"),
                       real(factor if C > 1 else factor[0], "q factor"))
    fitted_model = eqx.tree_at(lambda m: m.q, fitted.model, lowrank, is_leaf=lambda x: x is None)
    return SparsePosterior(fitted_model, Xa, ya, q.history)


__all__ = ["GPTarget", "fit_vgp"]
