"""Determinantal point processes with a kernel L, and their variational bounds ([Titsias2014];
see also [Bardenet2015]); the continuous bound is taken on a box, where it is finite.

An L-ensemble DPP on items x_1..x_n gives a subset Y the probability
det(L_Y) / det(L + I). Fitting L's parameters to observed subsets Y_1..Y_T maximises
sum_t log det L_{Y_t} - T log det(L + I); the normaliser costs O(n^3). With inducing inputs
Z (a subset of items or free pseudo-inputs) the collapsed GP bound at y = 0, noise 1 gives

    -log det(L + I) >= -log det(I + A A^T) - tr L + tr(A A^T),  A = R^-1 L_ZX, L_Z = R R^T,

in O(n m^2), equal to the exact value when Z = X. For a continuous DPP on a box Omega the
normaliser is prod (1 + lambda_i) over the kernel operator's eigenvalues and

    -sum log(1 + lambda_i) >= -log det(I + R^-1 Psi R^-T) - int_Omega L(x, x) dx
                               + tr(R^-1 Psi R^-T),   Psi_ij = int_Omega L(z_i, x) L(x, z_j) dx,

with Psi in closed form for the RBF kernel. Kernel parameters (and Z) are learnt by
maximising the bound (:func:`fit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from augmentedgp.core import linalg
from augmentedgp.core.loop import History, minimize
from augmentedgp.core.params import Parameter
from augmentedgp.core.quadrature import gauss_legendre
from augmentedgp.core.validation import check_X
from augmentedgp.kernels.covariance import RBF, Kernel


def _subsets(subsets, n):
    subsets = list(subsets)
    if not subsets:
        raise ValueError("need at least one observed subset")
    out = []
    for s in subsets:
        s = np.asarray(s, dtype=int).ravel()
        if s.size and (s.min() < 0 or s.max() >= n or len(set(s.tolist())) != s.size):
            raise ValueError(f"subsets must hold distinct item indices in [0, {n}), got {s}")
        out.append(s)
    return out


def _logdet_psd(A):
    return linalg.logdet_chol(linalg.cholesky(A)) if A.shape[0] else jnp.zeros(())


def _padded(subsets):
    """Subsets as one (T, k) index array and its mask (one compiled shape for all)."""
    k = max(1, max(len(s) for s in subsets))
    padded = np.zeros((len(subsets), k), dtype=int)
    mask = np.zeros((len(subsets), k), dtype=bool)
    for t, s in enumerate(subsets):
        padded[t, :len(s)], mask[t, :len(s)] = s, True
    return jnp.asarray(padded), jnp.asarray(mask)


def subset_log_det(kernel: Kernel, X: Float[Array, "n d"], padded: Int[Array, "T k"],
                   mask: Bool[Array, "T k"]) -> Float[Array, ""]:
    """sum_t log det L_{Y_t} for padded subsets (masked entries replaced by identity rows;
    the empty set contributes 0), one Cholesky per subset in a compiled ``lax.map``."""

    def one(args):
        idx, m = args
        Ks = jnp.where(m[:, None] & m[None, :], kernel(X[idx]), jnp.eye(idx.shape[0]))
        return _logdet_psd(Ks)

    return jnp.sum(jax.lax.map(one, (padded, mask)))


@eqx.filter_jit
def _exact(kernel, X, padded, mask):
    return subset_log_det(kernel, X, padded, mask) - padded.shape[0] * log_normaliser(kernel, X)


@eqx.filter_jit
def _bound(kernel, X, padded, mask, Z):
    return (subset_log_det(kernel, X, padded, mask)
            + padded.shape[0] * log_normaliser_bound(kernel, X, Z))


def log_normaliser(kernel: Kernel, X: Float[ArrayLike, "n d"]) -> Float[Array, ""]:
    """log det(L + I), exactly (O(n^3))."""
    L = kernel(X)
    return linalg.logdet_chol(linalg.cholesky(L + jnp.eye(L.shape[0], dtype=L.dtype)))


def log_normaliser_bound(kernel: Kernel, X: Float[ArrayLike, "n d"], Z: Float[ArrayLike, "m d"]
                         ) -> Float[Array, ""]:
    """The O(n m^2) lower bound on -log det(L + I) with inducing inputs Z ([Titsias2014])."""
    R, A = linalg.cholesky_project(kernel(Z), kernel(Z, X))
    AAt = A @ A.T
    I = jnp.eye(AAt.shape[0], dtype=AAt.dtype)
    return -_logdet_psd(I + AAt) - jnp.sum(kernel.diag(X)) + jnp.trace(AAt)


def log_likelihood(kernel: Kernel, X: Float[ArrayLike, "n d"],
                   subsets: Iterable[Sequence[int] | Int[ArrayLike, " k"]]) -> float:
    """Exact log-likelihood sum_t log det L_{Y_t} - T log det(L + I) of observed subsets
    (lists of item indices into X)."""
    X = jnp.asarray(check_X(X))
    return float(_exact(kernel, X, *_padded(_subsets(subsets, X.shape[0]))))


def elbo(kernel: Kernel, X: Float[ArrayLike, "n d"],
         subsets: Iterable[Sequence[int] | Int[ArrayLike, " k"]],
         Z: Float[ArrayLike, "m d"]) -> float:
    """The variational lower bound on :func:`log_likelihood` with inducing inputs Z."""
    X = jnp.asarray(check_X(X))
    Z = jnp.asarray(check_X(Z, "Z", d=X.shape[1]))
    return float(_bound(kernel, X, *_padded(_subsets(subsets, X.shape[0])), Z))


# --- continuous DPPs on a box ------------------------------------------------------------


def _box(lower, upper, d):
    lower, upper = np.asarray(lower, float).ravel(), np.asarray(upper, float).ravel()
    if lower.shape != (d,) or upper.shape != (d,) or not np.all(upper > lower):
        raise ValueError(f"the box needs lower < upper, both of length {d}")
    return jnp.asarray(lower), jnp.asarray(upper)


def psi(kernel: RBF, Z: Float[Array, "m d"], lower: Float[ArrayLike, " d"],
        upper: Float[ArrayLike, " d"]) -> Float[Array, "m m"]:
    """Psi_ij = int_box L(z_i, x) L(x, z_j) dx for the RBF kernel (closed form derived here):
    v^2 exp(-|z_i - z_j|^2 / (4 l^2)) prod_d (sqrt(pi) l / 2)
    [erf((b_d - zbar_d) / l) - erf((a_d - zbar_d) / l)], zbar = (z_i + z_j) / 2,
    per dimension with ARD lengthscales."""
    if not isinstance(kernel, RBF):
        raise TypeError(f"psi is in closed form for the RBF kernel, not {type(kernel).__name__}")
    ell = jnp.broadcast_to(kernel.lengthscale.value, (Z.shape[1],))
    v = kernel.variance.value
    diff = (Z[:, None, :] - Z[None, :, :]) / ell
    zbar = 0.5 * (Z[:, None, :] + Z[None, :, :])
    erf = jax.scipy.special.erf
    box = 0.5 * math.sqrt(math.pi) * ell * (erf((upper - zbar) / ell) - erf((lower - zbar) / ell))
    return v**2 * jnp.exp(-0.25 * jnp.sum(diff**2, -1)) * jnp.prod(box, -1)


@eqx.filter_jit
def continuous_log_normaliser_bound(kernel: RBF, Z: Float[Array, "m d"],
                                    lower: Float[ArrayLike, " d"],
                                    upper: Float[ArrayLike, " d"]) -> Float[Array, ""]:
    """Lower bound on -sum_i log(1 + lambda_i) for the DPP with kernel L on the box."""
    R = linalg.cholesky(kernel(Z))
    B = linalg.solve_lower(R, linalg.solve_lower(R, psi(kernel, Z, lower, upper)).T)
    I = jnp.eye(B.shape[0], dtype=B.dtype)
    trace_L = kernel.variance.value * jnp.prod(upper - lower)  # int L(x, x) dx
    return -_logdet_psd(I + 0.5 * (B + B.T)) - trace_L + jnp.trace(B)


def continuous_log_normaliser(kernel: Kernel, lower: Float[ArrayLike, " d"],
                              upper: Float[ArrayLike, " d"], n_nodes: int = 60) -> float:
    """-sum_i log(1 + lambda_i) by Nystrom quadrature (Gauss-Legendre, n_nodes per
    dimension, tensor grid): the exact value to quadrature accuracy, a test oracle for
    d <= 2."""
    d = int(np.size(lower))
    lower, upper = _box(lower, upper, d)
    lo, hi = np.asarray(lower), np.asarray(upper)
    nodes, weights = zip(*(gauss_legendre(int(n_nodes), lo[k], hi[k]) for k in range(d)),
                         strict=True)
    grid = np.stack(np.meshgrid(*nodes, indexing="ij"), -1).reshape(-1, d)
    wgrid = np.prod(np.stack(np.meshgrid(*weights, indexing="ij"), -1).reshape(-1, d), -1)
    sw = np.sqrt(wgrid)
    K = np.asarray(kernel(jnp.asarray(grid)))
    lam = np.linalg.eigvalsh(sw[:, None] * K * sw[None, :])
    return float(-np.sum(np.log1p(np.maximum(lam, 0.0))))


def continuous_elbo(kernel: Kernel, subsets: Iterable[Float[ArrayLike, "k d"]],
                    Z: Float[ArrayLike, "m d"], lower: Float[ArrayLike, " d"],
                    upper: Float[ArrayLike, " d"]) -> float:
    """Lower bound on the log Janossy density sum_t log det L_{Y_t} - T sum log(1 + lambda)
    of point sets Y_t (arrays (k_t, d) in the box) of a continuous DPP."""
    Z = jnp.asarray(check_X(Z, "Z"))
    lower, upper = _box(lower, upper, Z.shape[1])
    points = [np.asarray(Y, float).reshape(-1, Z.shape[1]) for Y in subsets]
    P = jnp.asarray(np.concatenate(points)) if points else jnp.zeros((0, Z.shape[1]))
    edges = np.cumsum([0, *(len(p) for p in points)])
    padded, mask = _padded([np.arange(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)])
    return float(subset_log_det(kernel, P, padded, mask)
                 + len(points) * continuous_log_normaliser_bound(kernel, Z, lower, upper))


# --- sampling ----------------------------------------------------------------------------


def sample(L: Float[ArrayLike, "n n"], rng: np.random.Generator | int | None = None
           ) -> Int[np.ndarray, " k"]:
    """One exact draw from the L-ensemble DPP (Hough et al.'s spectral algorithm, Kulesza &
    Taskar 2012 Algorithm 1): keep eigenvector k with probability lambda_k / (1 + lambda_k),
    then pick items one at a time from the projection DPP they span. Returns sorted item
    indices. ``rng`` is a numpy Generator or seed."""
    rng = np.random.default_rng(rng)
    L = np.asarray(L, float)
    lam, V = np.linalg.eigh(0.5 * (L + L.T))
    V = V[:, rng.uniform(size=lam.size) < np.maximum(lam, 0.0) / (1.0 + np.maximum(lam, 0.0))]
    items = []
    while V.shape[1]:
        p = np.sum(V**2, axis=1)
        i = int(rng.choice(len(p), p=p / p.sum()))
        items.append(i)
        j = int(np.argmax(np.abs(V[i])))  # eliminate e_i from the span, then re-orthonormalise
        V = V - np.outer(V[:, j] / V[i, j], V[i])
        V = np.delete(V, j, axis=1)
        if V.shape[1]:
            V, _ = np.linalg.qr(V)
    return np.sort(np.array(items, dtype=int))


# --- fitting -----------------------------------------------------------------------------


class _Bound(eqx.Module):
    kernel: eqx.Module
    Z: Parameter


def _neg_elbo(model, X, padded, mask):
    """-(bound) / T."""
    return -_bound(model.kernel, X, padded, mask, model.Z.value) / padded.shape[0]


def fit(kernel: Kernel, X: Float[ArrayLike, "n d"],
        subsets: Iterable[Sequence[int] | Int[ArrayLike, " k"]],
        Z: Float[ArrayLike, "m d"] | Parameter, *, max_iter: int = 500,
        optimizer: str = "lbfgs", learning_rate: float = 0.05, verbose: bool = False
        ) -> tuple[Kernel, Float[Array, "m d"], History]:
    """Learn the kernel's trainable parameters and the inducing inputs Z (a Parameter:
    ``params.fixed`` keeps it, e.g. a subset of the items) by maximising :func:`elbo`.
    Returns (kernel, Z, History); the history's objective is -elbo / T."""
    from augmentedgp.core.params import real

    X = jnp.asarray(check_X(X))
    subs = _subsets(subsets, X.shape[0])
    Zp = Z if isinstance(Z, Parameter) else real(np.asarray(check_X(Z, "Z", d=X.shape[1])), "Z")
    model, hist = minimize(_neg_elbo, _Bound(kernel, Zp), X, *_padded(subs),
                           optimizer=optimizer, max_iter=max_iter,
                           learning_rate=learning_rate, verbose=verbose)
    return model.kernel, model.Z.value, hist


def _neg_continuous_elbo(model, P, padded, mask, lower, upper):
    """-(continuous bound) / T."""
    T = padded.shape[0]
    return -(subset_log_det(model.kernel, P, padded, mask) + T * continuous_log_normaliser_bound(
        model.kernel, model.Z.value, lower, upper)) / T


def fit_continuous(kernel: RBF, point_sets: Iterable[Float[ArrayLike, "k d"]],
                   Z: Float[ArrayLike, "m d"] | Parameter, lower: Float[ArrayLike, " d"],
                   upper: Float[ArrayLike, " d"], *,
                   max_iter: int = 500, optimizer: str = "lbfgs", learning_rate: float = 0.05,
                   verbose: bool = False) -> tuple[RBF, Float[Array, "m d"], History]:
    """Learn an RBF kernel's trainable parameters and the pseudo-inputs Z of a continuous
    DPP on the box [lower, upper] from observed point sets (arrays (k_t, d)) by maximising
    :func:`continuous_elbo`. Returns (kernel, Z, History)."""
    from augmentedgp.core.params import real

    if not isinstance(kernel, RBF):
        raise TypeError(f"fit_continuous needs the RBF kernel, not {type(kernel).__name__}")
    Zp = Z if isinstance(Z, Parameter) else real(np.asarray(check_X(Z, "Z")), "Z")
    d = Zp.value.shape[1]
    lower, upper = _box(lower, upper, d)
    points = [np.asarray(Y, float).reshape(-1, d) for Y in point_sets]
    if not points:
        raise ValueError("need at least one observed point set")
    P = np.concatenate(points)
    if np.any(P < np.asarray(lower)) or np.any(P > np.asarray(upper)):
        raise ValueError("every observed point must lie in the box")
    edges = np.cumsum([0, *(len(p) for p in points)])
    padded, mask = _padded([np.arange(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)])
    model, hist = minimize(_neg_continuous_elbo, _Bound(kernel, Zp), jnp.asarray(P), padded,
                           mask, lower, upper, optimizer=optimizer, max_iter=max_iter,
                           learning_rate=learning_rate, verbose=verbose)
    return model.kernel, model.Z.value, hist


__all__ = ["log_likelihood", "elbo", "log_normaliser", "log_normaliser_bound",
           "psi", "continuous_log_normaliser_bound",
           "continuous_log_normaliser", "continuous_elbo", "sample", "fit", "fit_continuous"]
