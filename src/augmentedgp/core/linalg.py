"""Dense linear algebra for GPs: robust Cholesky, solves, log-determinants, Woodbury.

Everything is jit-safe. A failed factorisation inside ``jit`` shows up as NaN in ``L``;
public entry points call :func:`check_cholesky` on concrete results and raise
:class:`~augmentedgp.errors.NotPositiveDefiniteError` with advice instead of returning NaN.

Safe under ``jax.vmap``, to any order of differentiation: every factorisation and
triangular solve here is a single-matrix LAPACK call on CPU, one matrix after the other
(``lax.map``) when vmapped. jaxlib 0.10 parallelises its batched LAPACK kernels over
XLA's intra-op thread pool and can deadlock it (seen on 2 cores: every pool thread idle,
the result never ready), so none is ever made here. On accelerators the batched kernels
are used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero
from jax.scipy.linalg import solve_triangular
from jaxtyping import Array, ArrayLike, Float

from augmentedgp.core.errors import NotPositiveDefiniteError

__all__ = [
    "NotPositiveDefiniteError", "cholesky", "cholesky_project", "check_cholesky", "cho_solve",
    "solve_lower", "solve_upper_t", "logdet_chol", "mvn_logpdf", "woodbury_solve", "lowrank_logdet",
    "lowrank_cholesky", "set_jitter_levels", "jitter_levels", "system_factor", "site_alpha",
    "site_factors",
]

# Jitter levels tried in turn, relative to the mean of the diagonal.
_JITTER_LEVELS: tuple[float, ...] = (1e-10, 1e-8, 1e-6, 1e-4)


def set_jitter_levels(levels: Iterable[float]) -> None:
    """Set the escalating jitter levels (relative to the mean diagonal) for :func:`cholesky`.

    Takes effect for functions traced afterwards.
    """
    levels = tuple(float(v) for v in levels)
    if not levels or any(not (v > 0) for v in levels):
        raise ValueError(f"levels must be a non-empty sequence of positive floats, got {levels}")
    global _JITTER_LEVELS
    _JITTER_LEVELS = levels


def jitter_levels() -> tuple[float, ...]:
    """The jitter levels (multiples of the mean diagonal) tried in turn by ``cholesky``."""
    return _JITTER_LEVELS


# --- one matrix per LAPACK call, also under vmap -------------------------------------


def _one_matrix_per_call(fn, shared_rhs=None):
    """``fn`` (arrays in, arrays out; never differentiated itself) as a ``custom_vmap``
    that, vmapped on CPU, runs one batch entry after the other (``lax.map``), so that no
    batched LAPACK kernel is made; on other backends it is vmapped as usual.
    ``shared_rhs(axis_size, *args)``, where given, handles a batch of right-hand sides
    against an unbatched first argument (the matrix) in one call instead. Both call the
    wrapped function, so that an enclosing vmap meets this rule again."""
    wrapped = custom_vmap(fn)

    @wrapped.def_vmap
    def _(axis_size, in_batched, *args):
        if jax.default_backend() != "cpu":
            out = jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*args)
        elif shared_rhs is not None and not in_batched[0]:
            out = shared_rhs(axis_size, *args)
        else:  # the batched arguments mapped, the others shared

            def one(xs):
                it = iter(xs)
                return wrapped(*(next(it) if b else a for a, b in zip(args, in_batched,
                                                                       strict=True)))

            out = lax.map(one, tuple(a for a, b in zip(args, in_batched, strict=True) if b))
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return wrapped


def _columns_solver(transpose):
    """L^-1 B (L^-T B when ``transpose``) for a batch of right-hand sides B (batch, n, *k)
    against one L: a single triangular solve with the batch folded into the columns."""

    def solve(axis_size, L, B):
        n = L.shape[-1]
        cols = jnp.moveaxis(B, 0, -1).reshape(n, -1)  # (n, *k, batch) -> (n, k * batch)
        X = (_LOWER_SOLVE_T if transpose else _LOWER_SOLVE)(L, cols)  # L may be batched outside
        return jnp.moveaxis(X.reshape(B.shape[1:] + (axis_size,)), -1, 0)

    return solve


def _lower_solve(L, B):
    return solve_triangular(L, B, lower=True)


def _lower_solve_t(L, B):
    return solve_triangular(L, B, lower=True, trans="T")


_LOWER_SOLVE = _one_matrix_per_call(_lower_solve, _columns_solver(False))
_LOWER_SOLVE_T = _one_matrix_per_call(_lower_solve_t, _columns_solver(True))


@functools.partial(jax.jit, static_argnames="transpose")  # eager calls: traced once
def _tri_solve(L, B, transpose=False):
    """L^-1 B (L^-T B when ``transpose``) for lower-triangular L (its upper triangle
    ignored): L (..., n, n), B (..., n) or (..., n, k), leading dimensions broadcast (as in
    ``jax.scipy.linalg.solve_triangular``)."""
    L, B = jnp.asarray(L), jnp.asarray(B)
    dtype = jnp.result_type(L, B, 0.0)
    L, B = L.astype(dtype), B.astype(dtype)
    if L.ndim < 2 or L.shape[-1] != L.shape[-2] or B.ndim < 1:
        raise ValueError(f"L must be (..., n, n) and B (..., n) or (..., n, k), got L {L.shape} "
                         f"and B {B.shape}")
    vector = B.ndim == 1 or (L.ndim == B.ndim + 1 and L.shape[-1] == B.shape[-1])
    if L.ndim == 2 and B.ndim <= 2:
        return _tri_solve_2d(L, B, transpose)
    signature = "(n,n),(n)->(n)" if vector else "(n,n),(n,k)->(n,k)"
    return jnp.vectorize(functools.partial(_tri_solve_2d, transpose=transpose),
                         signature=signature)(L, B)  # vmapped: each matrix on its own


def _tri_solve_2d(L, B, transpose):
    """:func:`_tri_solve` for L (n, n) and B (n,) or (n, k), as a ``lax.custom_linear_solve``:
    differentiable (the derivatives are again such solves, transposable in reverse mode)
    while the LAPACK call itself, the only thing evaluated or batched, stays one matrix
    per call under vmap."""
    if B.shape[0] != L.shape[0]:
        raise ValueError(f"B must have n = {L.shape[0]} rows (L is {L.shape}), got B {B.shape}")
    forward, backward = (_LOWER_SOLVE_T, _LOWER_SOLVE) if transpose else (_LOWER_SOLVE,
                                                                           _LOWER_SOLVE_T)

    def matvec(x):
        T = jnp.tril(L)
        return (T.T if transpose else T) @ x

    return lax.custom_linear_solve(matvec, B, lambda _, b: forward(L, b),
                                   lambda _, b: backward(L, b))


def _keep(L, level, A, next_level):
    return L, level


def _retry(L, level, A, next_level):
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    return jnp.linalg.cholesky(A + next_level * jnp.mean(jnp.diagonal(A)) * eye), next_level


@functools.lru_cache(maxsize=8)
def _escalation(levels):
    """The failure branch for a tuple of jitter levels: one function object per tuple, so
    JAX's trace cache is reused, and a call to set_jitter_levels takes effect."""

    def escalate(L, A):
        level = jnp.zeros((), A.dtype)
        for next_level in levels:
            L, level = lax.cond(jnp.all(jnp.isfinite(L)), _keep, _retry,
                                L, level, A, jnp.asarray(next_level, A.dtype))
        return L, level

    return escalate


def _factorised(L, A):
    return L, jnp.zeros((), A.dtype)


def _cholesky_jittered(A):
    """(L, level): the factor of A + level * mean(diag A) * I for the first level that works
    (level 0 when A itself factorises, at the cost of one factorisation and one check)."""
    L = jnp.linalg.cholesky(A)
    return lax.cond(jnp.all(jnp.isfinite(L)), _factorised, _escalation(_JITTER_LEVELS), L, A)


_FACTOR = _one_matrix_per_call(_cholesky_jittered)  # reads the jitter levels when traced


def _with_jitter_tangent(dA, level):
    """Tangent of A + level * mean(diag A) * I: the jitter moves with the diagonal of A."""
    return dA + level * jnp.mean(jnp.diagonal(dA)) * jnp.eye(dA.shape[-1], dtype=dA.dtype)


def cholesky(A: Float[Array, "n n"]) -> Float[Array, "n n"]:
    """Lower Cholesky factor of a symmetric PD (n, n) matrix, adding jitter only when needed.

    Tries ``A`` first, then ``A + j * mean(diag(A)) * I`` for each escalating level ``j``.
    Differentiable: the derivative is that of the factor actually returned (jitter
    included). On total failure the result holds NaN (see :func:`check_cholesky`).
    """
    return _cholesky(A, _JITTER_LEVELS)


@functools.partial(jax.jit, static_argnums=1)
def _cholesky(A, levels):
    """``cholesky``, compiled once per shape and jitter levels (``levels`` is the cache key;
    the trace reads the same levels from ``_JITTER_LEVELS``)."""
    return _factor_and_level(A)[0]


@jax.custom_jvp
def _factor_and_level(A):
    """(L, level) of :func:`_cholesky_jittered` with the derivative of the factor actually
    returned (the level is piecewise constant): the one rule that ``cholesky`` and the
    rules built on the factor differentiate through, in either mode and again."""
    return _FACTOR(A)


@_factor_and_level.defjvp
def _factor_and_level_jvp(primals, tangents):
    (A,), (dA,) = primals, tangents
    L, level = _factor_and_level(A)  # this rule again, to any order
    dA = _with_jitter_tangent(0.5 * (dA + dA.T), level)
    # dL = L Phi(L^{-1} dA L^{-T}), Phi = lower triangle with halved diagonal
    M = _tri_solve(L, _tri_solve(L, dA).T).T
    return (L, level), (L @ _phi(M), jnp.zeros_like(level))


def _phi(X):
    """Lower triangle with the diagonal halved."""
    return jnp.tril(X) - 0.5 * jnp.diag(jnp.diagonal(X))


@jax.custom_vjp
def cholesky_project(K: Float[Array, "m m"], B: Float[Array, "m n"]
                     ) -> tuple[Float[Array, "m m"], Float[Array, "m n"]]:
    """(L, L^-1 B) with L = cholesky(K): the factor and the whitened projection that every
    sparse GP computes (Kmm, Kmn). Same values as ``cholesky`` and ``solve_lower``; the
    reverse-mode rule is written out (Murray 2016, eq. 10, fused with the solve), which
    is about twice as fast as transposing the Cholesky's forward-mode rule: with the
    cotangents (Lb, Ab), Bb = L^-T Ab and
    Kb = sym(L^-T Phi(L^T Lb - Ab A^T) L^-1), plus the moving jitter's share."""
    L = _factor_and_level(K)[0]
    return L, _tri_solve(L, B)


def _cholesky_project_fwd(K, B):
    L, level = _factor_and_level(K.value)
    A = _tri_solve(L, B.value)
    return (L, A), (L, A, level)


def _cholesky_project_bwd(res, cts):
    """With symbolic zeros: most callers use only A downstream of the factor (the sparse
    bounds), and then the L^T Lb product (an M^3 matrix product) is skipped."""
    L, A, level = res
    Lb, Ab = cts
    if isinstance(Ab, SymbolicZero):
        Ab = jnp.zeros_like(A)
    Bb = _tri_solve(L, Ab, transpose=True)
    X = -(Ab @ A.T)
    if not isinstance(Lb, SymbolicZero):
        X = X + L.T @ Lb
    Y = _tri_solve(L, _phi(X), transpose=True)  # L^-T X
    W = _tri_solve(L, Y.T, transpose=True).T  # L^-T X L^-1
    Kb = 0.5 * (W + W.T)
    # adjoint of dK -> dK + level mean(diag dK) I
    n = Kb.shape[0]
    return Kb + level * jnp.trace(Kb) / n * jnp.eye(n, dtype=Kb.dtype), Bb


cholesky_project.defvjp(_cholesky_project_fwd, _cholesky_project_bwd, symbolic_zeros=True)


def check_cholesky(L: Float[ArrayLike, "*b n n"], what: str = "covariance matrix"
                   ) -> Float[ArrayLike, "*b n n"]:
    """Raise NotPositiveDefiniteError if a (concrete) Cholesky factor holds NaN/inf."""
    if not bool(jnp.all(jnp.isfinite(L))):
        raise NotPositiveDefiniteError(what, jitter=_JITTER_LEVELS[-1])
    return L


def solve_lower(L: Float[Array, "n n"], B: Float[Array, " n *k"]) -> Float[Array, " n *k"]:
    """L^{-1} B for lower-triangular L."""
    return _tri_solve(L, B)


def solve_upper_t(L: Float[Array, "n n"], B: Float[Array, " n *k"]) -> Float[Array, " n *k"]:
    """L^{-T} B for lower-triangular L."""
    return _tri_solve(L, B, transpose=True)


def cho_solve(L: Float[Array, "n n"], B: Float[Array, " n *k"]) -> Float[Array, " n *k"]:
    """(L L^T)^{-1} B for lower-triangular L."""
    return _tri_solve(L, _tri_solve(L, B), transpose=True)


def logdet_chol(L: Float[Array, "*b n n"]) -> Float[Array, "*b"]:
    """log|L L^T| = 2 sum log diag L."""
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)


# --- K^{-1} from the Cholesky factor -----------------------------------------------------

_PANEL = 256  # panel width of _inverse_from_factor (at most 64 panels: wider for n > 16384)


def _inverse_from_factor(L):
    """(L L^T)^{-1} for lower-triangular L, swept right to left over column panels.

    With L = [[A, 0], [B, C]], A the next panel's diagonal block and Z = (C C^T)^{-1} the
    part already swept, the partitioned inverse ([Rasmussen2006], eqs. A.11-A.12, Schur
    complement C C^T) is [[(A A^T)^{-1} - Y^T W, W^T], [W, Z]] with Y = B A^{-1} and
    W = -Z Y. About 2n^3/3 flops, nearly all in matrix products (LAPACK potri's count),
    against 2n^3 for two triangular solves with n right-hand sides."""
    n = L.shape[-1]
    width = max(_PANEL, -(-n // 64))
    eye = jnp.eye(width, dtype=L.dtype)
    last = (n - 1) // width * width
    tail = cho_solve(L[last:, last:], eye[: n - last, : n - last])
    out = jnp.zeros_like(L).at[last:, last:].set(tail)
    for j in range(last - width, -1, -width):
        k = j + width
        A, B = L[j:k, j:k], L[k:, j:k]
        Y = _tri_solve(A, B.T, transpose=True).T  # B A^{-1} = (A^{-T} B^T)^T
        W = -out[k:, k:] @ Y
        top = cho_solve(A, eye) - Y.T @ W
        out = out.at[j:k, j:k].set(top).at[k:, j:k].set(W).at[j:k, k:].set(W.T)
    return out


# --- Gaussian log density with an O(n^3)-cheap exact derivative ---------------------------


@jax.custom_jvp
def mvn_logpdf(r: Float[Array, " n"], K: Float[Array, "n n"]) -> Float[Array, ""]:
    """log N(r | 0, K) for a residual vector r (n,) and covariance K (n, n).

    Differentiation uses d log N = -alpha^T dr + 1/2 tr((alpha alpha^T - K^{-1}) dK),
    alpha = K^{-1} r (Rasmussen & Williams eq. 5.9), instead of differentiating through the
    Cholesky factorisation. K^{-1} comes from the factor by a blocked sweep of about
    2n^3/3 flops (what LAPACK potri needs), so a value and gradient take about three
    factorisations' worth of flops (n^3/3 each), not seven as with two triangular solves
    against the identity.
    """
    L = cholesky(K)
    return _mvn_logpdf_chol(r, L)


def _mvn_logpdf_chol(r, L):
    v = solve_lower(L, r)
    n = r.shape[-1]
    return -0.5 * jnp.sum(v**2) - 0.5 * logdet_chol(L) - 0.5 * n * math.log(2 * math.pi)


def _mvn_logpdf_jvp(primals, tangents):
    r, K = primals
    dr, dK = tangents
    L, level = _factor_and_level(K)
    value = _mvn_logpdf_chol(r, L)
    alpha = cho_solve(L, r)
    dvalue = jnp.zeros_like(value)
    if not isinstance(dr, SymbolicZero):
        dvalue = dvalue - alpha @ dr
    if not isinstance(dK, SymbolicZero):
        dK = _with_jitter_tangent(dK, level)
        Kinv = _inverse_from_factor(L)
        dvalue = dvalue + 0.5 * (alpha @ dK @ alpha) - 0.5 * jnp.sum(Kinv * dK)
    return value, dvalue


mvn_logpdf.defjvp(_mvn_logpdf_jvp, symbolic_zeros=True)


# --- low-rank plus diagonal (Woodbury / matrix determinant lemma) ----------------------


def lowrank_cholesky(d: Float[Array, " n"], U: Float[Array, "n m"]) -> Float[Array, "m m"]:
    """Cholesky of the m x m capacitance matrix C = I + U^T D^{-1} U, D = diag(d)."""
    Ud = U / d[:, None]
    C = jnp.eye(U.shape[1], dtype=U.dtype) + U.T @ Ud
    return cholesky(C)


def woodbury_solve(d: Float[Array, " n"], U: Float[Array, "n m"], B: Float[Array, " n *k"],
                   Lc: Float[Array, "m m"] | None = None) -> Float[Array, " n *k"]:
    """(D + U U^T)^{-1} B = D^{-1}B - D^{-1}U C^{-1} U^T D^{-1} B  (Woodbury identity)."""
    if Lc is None:
        Lc = lowrank_cholesky(d, U)
    DB = B / (d if B.ndim == 1 else d[:, None])
    correction = U @ cho_solve(Lc, U.T @ DB)
    return DB - correction / (d if B.ndim == 1 else d[:, None])


def lowrank_logdet(d: Float[Array, " n"], U: Float[Array, "n m"],
                   Lc: Float[Array, "m m"] | None = None) -> Float[Array, ""]:
    """log|D + U U^T| = log|D| + log|I + U^T D^{-1} U|  (matrix determinant lemma)."""
    if Lc is None:
        Lc = lowrank_cholesky(d, U)
    return jnp.sum(jnp.log(d)) + logdet_chol(Lc)


# --- Gaussian sites: B = I + S K S, S = diag(sqrt(tau)) ------------------------------


def system_factor(K: Float[Array, "n n"], tau: Float[Array, " n"]
                  ) -> tuple[Float[Array, " n"], Float[Array, "n n"]]:
    """(sqrt_tau, L) with L = chol(I + S K S), S = diag(sqrt(tau)) (R&W eq. 3.26)."""
    s = jnp.sqrt(tau)
    B = jnp.eye(K.shape[0], dtype=K.dtype) + s[:, None] * K * s[None, :]
    return s, cholesky(B)


def site_alpha(s: Float[Array, " n"], L: Float[Array, "n n"], nu: Float[Array, " n"]
               ) -> Float[Array, " n"]:
    """alpha = (K + S^-2)^{-1} nu / tau = S B^{-1} (nu / s): no cancellation for tiny noise,
    unlike nu - S B^{-1} S K nu (R&W Alg. 3.6 line 4). Sites with tau = 0 have nu = 0."""
    return s * cho_solve(L, jnp.where(s > 0, nu / jnp.where(s > 0, s, 1.0), 0.0))


def site_factors(K: Float[Array, "n n"], tau: Float[Array, " n"], nu: Float[Array, " n"]
                 ) -> tuple[Float[Array, " n"], Float[Array, "n n"], Float[Array, " n"]]:
    """(sqrt_tau, L, alpha) of the Gaussian-site posterior q(f) ∝ p(f) Π N(f_i | nu_i/tau_i,
    1/tau_i) (R&W Algorithms 2.1, 3.2 and 3.6)."""
    s, L = system_factor(K, tau)
    return s, L, site_alpha(s, L, nu)
