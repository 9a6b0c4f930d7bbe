"""Choosing inducing inputs Z (M, d) for sparse GPs.

* :func:`random_subset`: M distinct rows of X drawn uniformly without replacement.
* :func:`kmeans`: k-means++ seeding by D^2 sampling (Arthur & Vassilvitskii, 2007; greedy
  variant with a few candidates per centre, as in scikit-learn) refined by Lloyd iterations;
  the centres are the inducing inputs.
* :func:`greedy_variance`: greedy conditional-variance selection (Burt, Rasmussen & van der
  Wilk, 2020), i.e. the pivots of a partial pivoted Cholesky of K_XX, in O(n M^2) time and
  O(n M) memory; it reduces trace(K_XX - Q_XX) greedily. It may return fewer than M rows
  when K_XX is numerically of lower rank.
* :func:`oips`: online inducing point selection ([Galy-Fajou2020b, Alg. 1]): a streamed
  x joins Z when its largest kernel correlation with Z is below rho.

All return float64 numpy arrays. Randomness enters only through an explicit ``key``
(``jax.random.key`` or ``PRNGKey``): the same key gives the same Z.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jaxtyping import ArrayLike, Float, Int, PRNGKeyArray

from augmentedgp.core.validation import check_int, check_key, check_X
from augmentedgp.kernels.covariance import Kernel

__all__ = ["random_subset", "kmeans", "greedy_variance", "oips"]


def _distinct_rows(X: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct row of X, in order of appearance."""
    _, first = np.unique(X, axis=0, return_index=True)
    return np.sort(first)


def _check_M(M, X: np.ndarray) -> np.ndarray:
    """Validate M against X; returns the indices of X's distinct rows."""
    check_int(M, "M")
    distinct = _distinct_rows(X)
    if M > len(distinct):
        raise ValueError(
            f"M={M} inducing points requested but X has only {len(distinct)} distinct rows "
            f"(out of {X.shape[0]}); use M <= {len(distinct)}"
        )
    return distinct


def _sqdist(X, C):
    """Squared Euclidean distances (n, m) by one matrix product, clipped at 0."""
    d2 = np.sum(X**2, 1)[:, None] + np.sum(C**2, 1)[None, :] - 2.0 * X @ C.T
    return np.maximum(d2, 0.0)


def random_subset(X: Float[ArrayLike, "n d"], M: int, key: PRNGKeyArray
                  ) -> Float[np.ndarray, "M d"]:
    """M distinct rows of X (distinct values: duplicates count once), chosen uniformly."""
    X, key = check_X(X), check_key(key)
    distinct = _check_M(M, X)
    pick = np.asarray(jax.random.permutation(key, len(distinct)))[: int(M)]
    return X[distinct[pick]].copy()


def kmeans(X: Float[ArrayLike, "n d"], M: int, key: PRNGKeyArray, n_iter: int = 25, n_init: int = 1,
           n_local_trials: int | None = None) -> Float[np.ndarray, "M d"]:
    """k-means centres: k-means++ seeding then at most ``n_iter`` Lloyd iterations (stopping
    when the assignment no longer changes); empty clusters move to the farthest points.

    Seeding is greedy k-means++ (as in scikit-learn): each new centre is the best, by the
    resulting potential, of ``n_local_trials`` D^2-sampled candidates (default
    2 + floor(ln M); 1 gives plain k-means++). The best of ``n_init`` runs is returned.
    """
    X, key = check_X(X), check_key(key)
    _check_M(M, X)
    for name, v, lo in (("n_iter", n_iter, 0), ("n_init", n_init, 1),
                        ("n_local_trials", n_local_trials, 1)):
        check_int(v, name, lo, allow_none=True)
    M = int(M)
    trials = 2 + int(np.log(M)) if n_local_trials is None else int(n_local_trials)
    u = np.asarray(jax.random.uniform(key, (int(n_init), M, trials), dtype=float))
    runs = [_kmeans_once(X, M, u_run, int(n_iter)) for u_run in u]
    return min(runs, key=lambda r: r[1])[0]


def _kmeans_once(X, M, u, n_iter):
    """One seeding + Lloyd run from uniforms u (M, trials): (centres, inertia)."""
    n = X.shape[0]
    # first centre uniform, then D^2 sampling: candidates drawn with probability proportional
    # to the squared distance to the nearest centre so far; keep the one of least potential
    idx = [min(int(u[0, 0] * n), n - 1)]
    D2 = np.sum((X - X[idx[0]]) ** 2, 1)
    for j in range(1, M):
        cum = np.cumsum(D2)
        cand = np.searchsorted(cum, u[j] * cum[-1], side="right")
        cand = np.minimum(cand, np.flatnonzero(D2 > 0)[-1])  # u * total rounded up to total
        D2c = np.minimum(D2, np.sum((X[None, :, :] - X[cand][:, None, :]) ** 2, -1))
        best = int(np.argmin(D2c.sum(1)))
        idx.append(int(cand[best]))
        D2 = D2c[best]
    C = _lloyd(X, X[idx], n_iter)
    return C, float(np.sum(np.min(_sqdist(X, C), 1)))


def _lloyd(X, C, n_iter):
    """At most n_iter Lloyd iterations from centres C, stopping when the assignment is
    unchanged; an empty cluster is re-seeded at the point farthest from its centre."""
    n, M = X.shape[0], C.shape[0]
    C, labels = np.array(C, dtype=float), None
    for _ in range(n_iter):
        d2 = _sqdist(X, C)
        new = np.argmin(d2, 1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        empty = np.flatnonzero(np.bincount(labels, minlength=M) == 0)
        if empty.size:
            far = np.argsort(-d2[np.arange(n), labels], kind="stable")[: empty.size]
            labels[far] = empty
        counts = np.bincount(labels, minlength=M)
        sums = np.zeros_like(C)
        np.add.at(sums, labels, X)
        C = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
    return C


@eqx.filter_jit
def _kernel_column(kernel, X, z):
    return kernel(X, z[None, :])[:, 0]


def _pivoted_cholesky(X: np.ndarray, M: int, kernel, threshold: float):
    """Greedy partial pivoted Cholesky of K_XX without forming it.

    Returns (idx, L, d): pivots, L (n, len(idx)) with L L^T = Q_XX = K_XZ K_ZZ^-1 K_ZX, and
    d (n,) the conditional variances diag(K_XX - Q_XX) left (0 at the pivots).
    """
    n = X.shape[0]
    diag = np.asarray(kernel.diag(X), dtype=float)
    d = diag.copy()
    # conditional variances of still-selectable points; pivots and their duplicates
    # (whose variance is 0 up to rounding) are masked with -inf
    score = diag.copy()
    _, group = np.unique(X, axis=0, return_inverse=True)
    group = group.ravel()
    # below this the remaining variance is rounding error: stop rather than pivot on noise
    floor = max(float(threshold), 1e-12 * float(np.max(diag, initial=0.0)))
    L = np.zeros((n, M))
    idx: list[int] = []
    for m in range(M):
        i = int(np.argmax(score))
        if not score[i] > floor:
            break
        col = np.array(_kernel_column(kernel, X, X[i]), dtype=float)
        col[i] = diag[i]
        L[:, m] = (col - L[:, :m] @ L[i, :m]) / np.sqrt(d[i])
        d = np.maximum(d - L[:, m] ** 2, 0.0)
        d[group == group[i]] = 0.0
        score = np.where(np.isneginf(score) | (group == group[i]), -np.inf, d)
        idx.append(i)
    return np.asarray(idx, dtype=int), L[:, : len(idx)], d


def greedy_variance(X: Float[ArrayLike, "n d"], M: int, kernel: Kernel, threshold: float = 0.0,
                    return_indices: bool = False
                    ) -> Float[np.ndarray, "m d"] | tuple[Float[np.ndarray, "m d"],
                                                          Int[np.ndarray, " m"]]:
    """Greedy conditional-variance selection (Burt, Rasmussen & van der Wilk, 2020).

    Repeatedly adds the row x of X with the largest conditional variance k(x, x) - Q(x, x)
    given the rows chosen so far (pivoted Cholesky of K_XX, never formed: O(n M^2) time,
    O(n M) memory). Stops early, returning fewer than M rows, once the largest remaining
    variance is <= ``threshold`` (or at rounding level, 1e-12 * max k(x, x)). Never picks a
    duplicate of a chosen row. With ``return_indices`` returns (Z, indices into X).
    """
    X = check_X(X)
    _check_M(M, X)
    threshold = float(threshold)
    if not (threshold >= 0.0 and np.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold!r}")
    idx, _, _ = _pivoted_cholesky(X, int(M), kernel, threshold)
    Z = X[idx].copy()
    return (Z, idx) if return_indices else Z


def _inv_sd(var):
    """1 / sqrt(var), 0 for zero-variance rows (so their correlations become 0)."""
    var = np.asarray(var, dtype=float)
    return np.where(var > 0, 1.0 / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)


def _pad(A, size):
    """A padded to ``size`` rows with copies of its first row (fixed shapes: one compile)."""
    return np.concatenate([A, np.repeat(A[:1], size - len(A), 0)])


@eqx.filter_jit
def _block_kernels(kernel, B, Z):
    return kernel.diag(B), kernel(B), kernel(B, Z), kernel.diag(Z)


def oips(X: Float[ArrayLike, "n d"], kernel: Kernel, rho: float,
         Z: Float[ArrayLike, "M d"] | None = None, max_points: int | None = None
         ) -> Float[np.ndarray, "m d"]:
    """Online inducing point selection ([Galy-Fajou2020b, Algorithm 1]).

    The rows of X are streamed in order; x is appended to Z when
    max_j k(x, z_j) / sqrt(k(x, x) k(z_j, z_j)) < rho (correlation, so rho in (0, 1) means
    the same for any kernel variance). The first row is accepted when Z is empty; rows with
    zero prior variance are never added. Passing the returned Z back with the next batch
    continues the stream. ``max_points`` caps len(Z). Deterministic given the data order.
    """
    X = check_X(X)
    rho = float(rho)
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must lie strictly between 0 and 1, got {rho!r}")
    check_int(max_points, "max_points", allow_none=True)
    cap = np.inf if max_points is None else int(max_points)
    d = X.shape[1]
    zs = [] if Z is None else list(check_X(Z, "Z", d=d))

    block = 256
    for start in range(0, X.shape[0], block):
        if len(zs) >= cap:
            break
        B = X[start : start + block]
        # kernels of the (padded) block with itself and with the Z from before the block,
        # padded to a power-of-two size so that the jitted evaluation compiles a few times
        Zp = np.stack(zs) if zs else B[:1]
        Zp = _pad(Zp, max(16, 1 << (len(Zp) - 1).bit_length()))
        b_var, K_BB, K_BZ, z_var = map(np.asarray, _block_kernels(kernel, _pad(B, block), Zp))
        b_is, z_is = _inv_sd(b_var[: len(B)]), _inv_sd(z_var[: len(zs)])
        corr_old = K_BZ[: len(B), : len(zs)] * b_is[:, None] * z_is[None, :]
        corr_in = K_BB[: len(B), : len(B)] * np.outer(b_is, b_is)
        # row j looks at Z from before the block and at the block rows accepted before it,
        # so the result is exactly that of one row at a time
        accepted: list[int] = []
        for j in range(len(B)):
            if len(zs) >= cap:
                break
            if b_is[j] == 0.0:
                continue
            best = max(corr_old[j].max(initial=-np.inf),
                       corr_in[j, accepted].max(initial=-np.inf))
            if best < rho:  # also true for the first row when Z is empty (best = -inf)
                accepted.append(j)
                zs.append(B[j])
    return np.array(zs, dtype=float).reshape(-1, d)
