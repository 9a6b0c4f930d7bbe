"""Gaussian particle flow: the variational Gaussian approximation (VGA) of any
differentiable log density by linear flows ([Galy-Fajou2021]; equation, algorithm and theorem
numbers below are the paper's, and the corrections to its printed formulas are listed).

With the potential phi(x) = -log p(x, y) and q = N(m, C), the free energy is
F[q] = E_q[phi] - H[q]. Moving x by the linear flow dx/dt = -A (x - m) - b with
A = E_q[g (x - m)^T] - I and b = E_q[g], g = grad phi(x), gives
dF/dt = -tr(A A^T) - |b|^2 <= 0 (eqs. 5-9), with fixed points E[g] = 0 and
E[g (x - m)^T] = I: the optimal VGA. No Hessians and no matrix inverses.

- ``ParticleFlow`` (GPF, Algorithm 2): N particles x_i move by that flow with the
  expectations over the particles themselves (deterministic given the particles):
  x_i <- x_i - eta1 g_bar - eta2 A (x_i - m), A = (1/N) sum g_j (x_j - m)^T - I, computed as
  (A Z^T)^T = (Z Z^T) G / N - Z without forming A (O(N^2 D)). q is the particles' Gaussian,
  C = Z^T Z / N; N >= D + 1 particles give a full-rank C (exact for Gaussian targets,
  Theorem 1), fewer a rank N - 1 approximation along the leading directions (Theorem 3).
- ``GaussianFlow`` (GF, Algorithm 1 corrected: the gradient, not phi, in the mean update;
  Gamma^T Gamma, not Gamma Gamma^T; A with its -I): x = m + Gamma x0, x0 ~ N(0, I_K) fresh
  each step, m <- m - eta1 g_bar, Gamma <- Gamma - eta2 (E[g x0^T] Gamma^T Gamma - Gamma).
- ``ADVI``: reparameterised-gradient Gaussian VI (full-rank Cholesky or mean-field) with an
  optax optimiser; ``SVGD``: Stein variational gradient descent (RBF kernel with the median
  heuristic, linear, or centred linear -- the last has GPF's dynamics,
  [Galy-Fajou2021, Sec. 3.6]).

Shared options: step sizes eta1 (mean) and eta2 (covariance); the mean step preconditioned by
C (``natural_mean``); the dimension-wise optimisers of [Galy-Fajou2021, Sec. 4.4] (Adam,
AdaGrad, RMSProp with the second moment shared across particles, which keeps the flow
linear -- element-wise ones twist the particle cloud); structured mean field (``blocks``:
independent Gaussians on contiguous blocks of x, e.g. the layers of a network, or on every
coordinate); minibatches.

Entry points: :func:`fit_gaussian` for a log density (a callable, or a :class:`Target` with a
prior and per-example likelihood terms for minibatches), and ``augmentedgp.fit(VGP(...), X,
y, ParticleFlow())`` for GP models with any likelihood (the particles live in the whitened
latent space). Trainable :class:`~augmentedgp.params.Parameter` fields of a target (a GP's
hyperparameters) are learnt by an optax step on the same free energy at every iteration.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from augmentedgp.core import linalg
from augmentedgp.core.loop import History, Minibatches, minibatch, optax_optimizer, run_steps
from augmentedgp.core.params import log_prior, partition_trainable
from augmentedgp.core.runtime import limits
from augmentedgp.core.validation import check_int, check_key

_LOG2PI = math.log(2 * math.pi)
_LOG2PIE = _LOG2PI + 1.0

# --- targets --------------------------------------------------------------------------


class Target(eqx.Module):
    """log p(x) = log_prior(x) + sum_i log_likelihood(x, *data_i): ``data`` is a tuple of
    arrays sharing their leading axis (the examples), which minibatches subsample with the
    n / batch scaling. ``x`` is the flat parameter vector; subclasses may override
    :meth:`potentials` to evaluate all particles at once."""

    data: tuple = ()

    def log_prior(self, x: Float[Array, " D"]) -> Float[Array, ""]:
        raise NotImplementedError

    def log_likelihood(self, x: Float[Array, " D"], *batch: ArrayLike) -> Float[Array, " b"]:
        """Per-example log-likelihood terms (b,)."""
        raise NotImplementedError

    @property
    def num_data(self) -> int:
        return int(self.data[0].shape[0]) if self.data else 0

    def potentials(self, X: Float[Array, "N D"], batch: tuple[ArrayLike, ...],
                   scale: float | Float[Array, ""]) -> Float[Array, " N"]:
        """phi(x_i) = -(log_prior(x_i) + scale * sum log_likelihood(x_i, batch)), (N,)."""
        def phi(x):
            lik = jnp.sum(self.log_likelihood(x, *batch)) if batch else 0.0
            return -(self.log_prior(x) + scale * lik)

        return jax.vmap(phi)(X)


class LogDensity(Target):
    """A :class:`Target` from one callable ``log_density(x)``; ``unravel`` maps the flat
    vector to the pytree the callable takes (identity when None)."""

    fn: Callable = eqx.field(static=True, default=None)
    unravel: Callable | None = eqx.field(static=True, default=None)

    def log_prior(self, x: Float[Array, " D"]) -> Float[Array, ""]:
        return self.fn(x if self.unravel is None else self.unravel(x))


def _as_target(target, unravel=None) -> Target:
    if isinstance(target, Target):
        return target
    if callable(target):
        return LogDensity(fn=target, unravel=unravel)
    raise TypeError(f"the target must be a callable log density or a Target, got {target!r}")


# --- the Gaussian result ----------------------------------------------------------------


class VariationalGaussian(eqx.Module):
    """q(x) = N(mean, diag(sd^2) + factor factor^T) over the flat vector x (``unravel``
    maps a flat vector to the initial pytree's structure). ``particles`` (N, D) for particle
    methods. ``history.objective`` is the free energy at each iteration (the particle
    estimate for GPF and SVGD, the Monte Carlo one for GF and ADVI)."""

    mean: jax.Array
    factor: jax.Array
    sd: jax.Array | None = None
    particles: jax.Array | None = None
    unravel: Callable = eqx.field(static=True, default=None)
    history: History | None = eqx.field(static=True, default=None)

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def cov(self) -> Float[Array, "D D"]:
        """The (D, D) covariance."""
        C = self.factor @ self.factor.T
        return C if self.sd is None else C + jnp.diag(self.sd**2)

    def var(self) -> Float[Array, " D"]:
        """The marginal variances (D,)."""
        v = jnp.sum(self.factor**2, axis=1)
        return v if self.sd is None else v + self.sd**2

    @limits
    def sample(self, key: PRNGKeyArray, n: int = 1) -> Float[Array, "n D"]:
        """(n, D) draws x = mean + sd * e + factor xi (eq. 16 with scalar xi per particle:
        ``factor`` is a square root of C, not a Cholesky factor)."""
        k1, k2 = jax.random.split(check_key(key))
        n = check_int(n, "n")
        x = self.mean + jax.random.normal(k1, (n, self.factor.shape[1])) @ self.factor.T
        if self.sd is not None:
            x = x + self.sd * jax.random.normal(k2, (n, self.dim))
        return x

    @limits
    def sample_tree(self, key: PRNGKeyArray, n: int = 1) -> PyTree[Float[Array, "n ..."]]:
        """Draws as pytrees shaped like ``init`` (stacked along a leading axis of size n)."""
        return jax.vmap(self.unravel)(self.sample(key, n))

    def entropy(self) -> Float[Array, ""]:
        """H[q] with the null directions of a low-rank covariance at unit variance (the
        regularised entropy of [Galy-Fajou2021, Sec. 3.4.1])."""
        if self.sd is None:
            lam = jnp.linalg.eigvalsh(self.factor.T @ self.factor)
            logdet = _logdet_positive(lam)
        else:
            s2 = self.sd**2
            F = self.factor / s2[:, None]
            B = jnp.eye(self.factor.shape[1]) + self.factor.T @ F
            logdet = jnp.sum(jnp.log(s2)) + jnp.linalg.slogdet(B)[1]
        return 0.5 * logdet + 0.5 * self.dim * _LOG2PIE

    def free_energy(self, target: Target | Callable[[PyTree], Float[Array, ""]],
                    key: PRNGKeyArray, n_samples: int = 1000) -> float:
        """Monte Carlo estimate of F[q] = E_q[phi] - H[q] (= -ELBO) from ``n_samples``
        fresh draws (as the experiment code of [Galy-Fajou2021] evaluates it)."""
        t = _as_target(target, self.unravel)
        X = self.sample(key, n_samples)
        data = tuple(jnp.asarray(a) for a in t.data)
        return float(jnp.mean(t.potentials(X, data, 1.0)) - self.entropy())


def _logdet_positive(lam):
    """Sum of the logs of the nonzero eigenvalues (relative threshold)."""
    pos = lam > 1e-10 * jnp.max(lam)
    return jnp.sum(jnp.where(pos, jnp.log(jnp.where(pos, lam, 1.0)), 0.0))


# --- structured mean field ---------------------------------------------------------------


def _block_slices(blocks, D: int, sizes_of_leaves):
    """None -> one block; "diagonal" -> every coordinate; "leaves" -> the leaves of the
    initial pytree; a sequence of sizes -> contiguous blocks. Returns a tuple of
    (start, stop) pairs or the string "diagonal"."""
    if blocks is None:
        return ((0, D),)
    if isinstance(blocks, str):
        if blocks == "diagonal":
            return "diagonal"
        if blocks == "leaves":
            blocks = sizes_of_leaves
        else:
            raise ValueError(f"blocks must be None, 'diagonal', 'leaves' or a sequence of sizes, "
                             f"got {blocks!r}")
    sizes = [int(b) for b in blocks]
    if any(b < 1 for b in sizes) or sum(sizes) != D:
        raise ValueError(f"block sizes {sizes} must be positive and sum to the dimension {D}")
    edges = np.cumsum([0, *sizes])
    return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True))


def _slices(blocks):
    """Blocks are (start, stop) pairs (hashable, so static under jit) -> slices."""
    return [slice(*b) for b in blocks]


# --- dimension-wise optimisers ([Galy-Fajou2021, App. H]) ------------------------------------

_OPTIMIZERS = ("gd", "adam", "adagrad", "rmsprop")


class _Moments(NamedTuple):
    m: jax.Array
    v: jax.Array
    t: jax.Array


def _opt_init(shape, dimensionwise):
    v_shape = shape[-1:] if dimensionwise else shape
    return _Moments(jnp.zeros(shape), jnp.zeros(v_shape), jnp.zeros((), jnp.int32))


def _opt_step(kind, lr, dimensionwise, d, st: _Moments):
    """The step for the flow direction d (rows: particles, or columns of Gamma): plain
    (``gd``) or scaled per dimension by a second moment averaged over the rows
    (``dimensionwise``), which keeps every update an affine map of the particles."""
    if kind == "gd":
        return lr * d, st
    t = st.t + 1
    sq = jnp.mean(d**2, axis=0) if dimensionwise else d**2
    eps = 1e-8
    if kind == "adam":
        b1, b2 = 0.9, 0.999
        m = b1 * st.m + (1 - b1) * d
        v = b2 * st.v + (1 - b2) * sq
        step = lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps)
        return step, _Moments(m, v, t)
    if kind == "adagrad":
        v = st.v + sq
    else:  # rmsprop
        v = 0.9 * st.v + 0.1 * sq
    return lr * d / (jnp.sqrt(v) + eps), _Moments(st.m, v, t)


# --- methods ---------------------------------------------------------------------------


class FlowMethod(eqx.Module):
    """Base class of the flow methods (:class:`ParticleFlow`, :class:`GaussianFlow`,
    :class:`ADVI`, :class:`SVGD`): the value passed as ``method`` to :func:`fit_gaussian`
    or as ``inference`` to ``augmentedgp.fit`` for a flow.

    A method is an equinox Module of static settings (``learning_rate``, ``batch_size``,
    ``init_scale``, ...; checked at construction by ``_check_common``) and implements five
    abstract hooks, which the training loop calls in order (a subclass missing one fails at
    construction):

    - ``_init(key, x0, blocks) -> state``: the method's state (particles, or a mean and a
      factor) around the initial point x0 (D,);
    - ``_points(state, key, blocks) -> (X, noise)``: the (N, D) points whose potentials
      and gradients G (N, D) the step evaluates, and any noise drawn for them;
    - ``_entropy(state, noise, blocks) -> scalar``: the entropy H[q] of the free energy;
    - ``_update(state, X, noise, G, blocks) -> state``: one step of the flow;
    - ``_gaussian(state, blocks) -> (mean, sd, factor, particles)``: the Gaussian the state
      represents (a diagonal ``sd`` or a ``factor`` with C = factor factor^T; the particles,
      if any), from which the result's :class:`VariationalGaussian` is built.

    ``blocks`` is the structured mean field's partition of the D coordinates (a tuple of
    block sizes, or "diagonal").
    """

    @abc.abstractmethod
    def _init(self, key: PRNGKeyArray, x0: Float[Array, " D"], blocks: tuple | str
              ) -> tuple:
        """The initial state."""

    @abc.abstractmethod
    def _points(self, state: tuple, key: PRNGKeyArray, blocks: tuple | str
                ) -> tuple[Float[Array, "N D"], object]:
        """The points of this step and their noise."""

    @abc.abstractmethod
    def _entropy(self, state: tuple, noise: object, blocks: tuple | str) -> Float[Array, ""]:
        """H[q]."""

    @abc.abstractmethod
    def _update(self, state: tuple, X: Float[Array, "N D"], noise: object,
                G: Float[Array, "N D"], blocks: tuple | str) -> tuple:
        """The state after one step, given the gradients G of the potentials at X."""

    @abc.abstractmethod
    def _gaussian(self, state: tuple, blocks: tuple | str) -> tuple:
        """(mean, sd or None, factor or None, particles or None)."""

    def _check_common(self) -> None:
        lr = self.learning_rate
        lrs = tuple(lr) if isinstance(lr, tuple | list) else (lr, lr)
        if len(lrs) != 2 or not all(isinstance(v, numbers.Real) and math.isfinite(v) and v > 0
                                    for v in lrs):
            raise ValueError("learning_rate must be a positive number or a pair (mean, "
                             f"covariance) of them, got {lr!r}")
        object.__setattr__(self, "learning_rate", tuple(float(v) for v in lrs))
        blocks = getattr(self, "blocks", None)
        if blocks is not None and not isinstance(blocks, str):
            object.__setattr__(self, "blocks", tuple(int(b) for b in blocks))  # hashable
        if getattr(self, "optimizer", "gd") not in _OPTIMIZERS and not isinstance(self, ADVI):
            raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {self.optimizer!r}")
        for name in ("batch_size",):
            check_int(getattr(self, name), name, allow_none=True)
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")

    def _n(self, value, D, name, low):
        return check_int(D + 1 if value is None else value, name, low)


class _GaussianFlowMethod(FlowMethod):
    """The settings ParticleFlow and GaussianFlow share (documented on ParticleFlow)."""

    learning_rate: float | tuple = eqx.field(static=True, default=0.01)
    optimizer: str = eqx.field(static=True, default="gd")
    dimensionwise: bool = eqx.field(static=True, default=True)
    natural_mean: bool = eqx.field(static=True, default=False)
    blocks: object = eqx.field(static=True, default=None)
    batch_size: int | None = eqx.field(static=True, default=None)
    init_scale: float = eqx.field(static=True, default=1.0)


class _ParticleState(NamedTuple):
    X: jax.Array
    mean_opt: _Moments
    cov_opt: _Moments


def _particle_entropy(X, blocks):
    """H of the particles' Gaussian C = Z^T Z / N per block, regularised: the log-det of
    its min(N - 1, D_b) nonzero eigenvalues, from a Cholesky factor of the smaller of
    Z^T Z / N and Z Z^T / N + J / N ([Galy-Fajou2021, App. D]); collapsed particles get the
    Cholesky's jitter, a large but finite entropy deficit, not a NaN."""
    N, D = X.shape
    Z = X - jnp.mean(X, axis=0)
    if blocks == "diagonal":
        logdet = jnp.sum(jnp.log(jnp.mean(Z**2, axis=0)))
    else:
        logdet = 0.0
        for s in _slices(blocks):
            Zb = Z[:, s]
            if N > Zb.shape[1]:
                R = Zb.T @ Zb / N
            else:  # R = Z Z^T / N + J / N: the constant vector's zero eigenvalue becomes 1
                R = Zb @ Zb.T / N + 1.0 / N
            logdet = logdet + linalg.logdet_chol(linalg.cholesky(R))
    return 0.5 * logdet + 0.5 * D * _LOG2PIE


def _gpf_directions(X, G, blocks, natural_mean):
    """(mean direction (D,), per-particle covariance directions (N, D)):
    -g_bar (or -C g_bar) and -A (x_i - m) = z_i - (1/N) sum_j (z_i . z_j) g_j, per block."""
    N = X.shape[0]
    Z = X - jnp.mean(X, axis=0)
    g_bar = jnp.mean(G, axis=0)
    if blocks == "diagonal":
        psi = jnp.mean(Z * G, axis=0)
        mean_dir = -(jnp.mean(Z**2, axis=0) * g_bar if natural_mean else g_bar)
        return mean_dir, Z * (1.0 - psi)
    mean_parts, cov_parts = [], []
    for s in _slices(blocks):
        Zb, Gb = Z[:, s], G[:, s]
        if N > Zb.shape[1]:
            AZ = Zb @ (Zb.T @ Gb) / N  # = (Z Z^T G) / N at O(N D^2)
        else:
            AZ = (Zb @ Zb.T) @ Gb / N
        cov_parts.append(Zb - AZ)
        gb = g_bar[s]
        mean_parts.append(-(Zb.T @ (Zb @ gb) / N if natural_mean else gb))
    return jnp.concatenate(mean_parts), jnp.concatenate(cov_parts, axis=1)


def _check_natural_mean(natural_mean, blocks, rank, name):
    """C g_bar lies in the span of C: with a rank-deficient C the mean could never leave
    the particles' span, so the preconditioned mean step needs full rank in every block."""
    if natural_mean and blocks != "diagonal":
        widest = max(b - a for a, b in blocks)
        if rank < widest:
            raise ValueError(f"natural_mean=True needs a full-rank covariance: {name} = {rank} "
                             f"< {widest} (the largest block); the mean would stay in the "
                             "span of the particles")


def _initial_particles(key, x0, N, scale):
    """N particles with mean x0 and Gaussian covariance scale^2 I made exact: the centred
    draws E = U S V^T (rank r = min(N - 1, D)) become Z = sqrt(N) scale U_r V_r^T, so
    Z^T Z / N = scale^2 I when N > D (hence zero cross-block covariance, which the
    block-wise flow keeps: each block moves by its own linear map) and the N - 1 nonzero
    eigenvalues all equal scale^2 otherwise (a randomly rotated regular simplex)."""
    D = x0.shape[0]
    E = jax.random.normal(key, (N, D))
    E = E - jnp.mean(E, axis=0)
    U, _, Vt = jnp.linalg.svd(E, full_matrices=False)
    r = min(N - 1, D)
    return x0 + math.sqrt(N) * scale * (U[:, :r] @ Vt[:r])


class ParticleFlow(_GaussianFlowMethod):
    """Gaussian Particle Flow (GPF, [Galy-Fajou2021, Algorithm 2]).

    ``n_particles`` (default D + 1: full rank, exact for Gaussian targets; fewer give a
    rank N - 1 approximation); ``learning_rate`` eta or (eta1, eta2) for the mean and the
    covariance part; ``optimizer`` "gd" (plain flow), "adam", "adagrad" or "rmsprop", applied
    separately to the mean and covariance parts, with the second moment shared across
    particles unless ``dimensionwise=False``; ``natural_mean`` preconditions the mean step
    by C; ``blocks`` for structured mean field (None, "diagonal", "leaves" or block sizes);
    ``batch_size`` for minibatches of a :class:`Target`'s data; the initial particles are
    ``init + init_scale * N(0, I)``."""

    n_particles: int | None = eqx.field(static=True, default=None)

    def __post_init__(self):
        self._check_common()
        if self.n_particles is not None:
            self._n(self.n_particles, 0, "n_particles", 2)

    def _init(self, key, x0, blocks):
        N = self._n(self.n_particles, x0.shape[0], "n_particles", 2)
        _check_natural_mean(getattr(self, "natural_mean", False), blocks, N - 1,
                            "n_particles - 1")
        X = _initial_particles(key, x0, N, self.init_scale)
        return _ParticleState(X, _opt_init((1, x0.shape[0]), self.dimensionwise),
                              _opt_init(X.shape, self.dimensionwise))

    def _points(self, state, key, blocks):
        return state.X, None

    def _entropy(self, state, noise, blocks):
        return _particle_entropy(state.X, blocks)

    def _update(self, state, X, noise, G, blocks):
        mean_dir, cov_dir = _gpf_directions(X, G, blocks, self.natural_mean)
        lr1, lr2 = self.learning_rate
        d1, mean_opt = _opt_step(self.optimizer, lr1, self.dimensionwise, mean_dir[None],
                                 state.mean_opt)
        d2, cov_opt = _opt_step(self.optimizer, lr2, self.dimensionwise, cov_dir, state.cov_opt)
        return _ParticleState(X + d1 + d2, mean_opt, cov_opt)

    def _gaussian(self, state, blocks):
        return _particles_gaussian(state.X, blocks)


def _particles_gaussian(X, blocks):
    """(mean, sd, factor, particles) of the particles' (block-diagonal) Gaussian."""
    N, D = X.shape
    m = jnp.mean(X, axis=0)
    Z = X - m
    if blocks == "diagonal":
        return m, jnp.sqrt(jnp.mean(Z**2, axis=0)), jnp.zeros((D, 0)), X
    if len(blocks) == 1:
        return m, None, Z.T / jnp.sqrt(N), X
    factor = jnp.zeros((D, N * len(blocks)))
    for b, s in enumerate(_slices(blocks)):
        factor = factor.at[s, b * N:(b + 1) * N].set(Z[:, s].T / jnp.sqrt(N))
    return m, None, factor, X


class _FlowState(NamedTuple):
    m: jax.Array
    Gt: tuple  # per block Gamma_b^T (K_b, D_b); "diagonal": one (1, D) row
    mean_opt: _Moments
    cov_opt: tuple


class GaussianFlow(_GaussianFlowMethod):
    """Gaussian Flow (GF, [Galy-Fajou2021, Algorithm 1], corrected): x = m + Gamma x0 with
    ``n_samples`` fresh x0 ~ N(0, I_K) per step (default D + 1); ``rank`` K of Gamma (per
    block; default full). Other options as :class:`ParticleFlow`; with ``blocks`` Gamma is
    block diagonal ("diagonal": a vector of standard deviations)."""

    n_samples: int | None = eqx.field(static=True, default=None)
    rank: int | None = eqx.field(static=True, default=None)

    def __post_init__(self):
        self._check_common()
        if self.n_samples is not None:
            self._n(self.n_samples, 0, "n_samples", 1)
        if self.rank is not None:
            self._n(self.rank, 0, "rank", 1)

    def _init(self, key, x0, blocks):
        D = x0.shape[0]
        if self.rank is not None:
            _check_natural_mean(self.natural_mean, blocks, self.rank, "rank")
        if blocks == "diagonal":
            Gt = (jnp.full((1, D), self.init_scale, dtype=x0.dtype),)
        else:
            Gt = []
            for i, s in enumerate(_slices(blocks)):
                Db = s.stop - s.start
                K = Db if self.rank is None else min(self.rank, Db)
                if K == Db:
                    Gt.append(self.init_scale * jnp.eye(Db))
                else:  # random orthonormal directions
                    Q, _ = jnp.linalg.qr(jax.random.normal(jax.random.fold_in(key, i), (Db, K)))
                    Gt.append(self.init_scale * Q.T)
            Gt = tuple(Gt)
        return _FlowState(x0, Gt, _opt_init((1, D), self.dimensionwise),
                          tuple(_opt_init(g.shape, self.dimensionwise) for g in Gt))

    def _points(self, state, key, blocks):
        S = self._n(self.n_samples, state.m.shape[0], "n_samples", 1)
        if blocks == "diagonal":
            x0 = jax.random.normal(key, (S, state.m.shape[0]))
            return state.m + x0 * state.Gt[0][0], (x0,)
        keys = jax.random.split(key, len(blocks))
        x0 = tuple(jax.random.normal(k, (S, g.shape[0])) for k, g in zip(keys, state.Gt,
                                                                        strict=True))
        return state.m + jnp.concatenate([e @ g for e, g in zip(x0, state.Gt, strict=True)],
                                         axis=1), x0

    def _entropy(self, state, noise, blocks):
        if blocks == "diagonal":
            logdet = jnp.sum(jnp.log(state.Gt[0] ** 2))
        else:
            logdet = sum(jnp.linalg.slogdet(g @ g.T)[1] for g in state.Gt)  # |Gamma^T Gamma|
        return 0.5 * logdet + 0.5 * state.m.shape[0] * _LOG2PIE

    def _update(self, state, X, x0, G, blocks):
        g_bar = jnp.mean(G, axis=0)
        S = X.shape[0]
        if blocks == "diagonal":
            sd = state.Gt[0][0]
            mean_dir = -(sd**2 * g_bar if self.natural_mean else g_bar)
            dirs = ((sd - jnp.mean(G * x0[0], axis=0) * sd**2)[None],)
        else:
            mean_parts, dirs = [], []
            for s, g, e in zip(_slices(blocks), state.Gt, x0, strict=True):
                # d Gamma^T = Gamma^T - (Gamma^T Gamma) E[x0 g^T]   (eq. 11, corrected)
                dirs.append(g - (g @ g.T) @ (e.T @ G[:, s]) / S)
                mean_parts.append(-(g.T @ (g @ g_bar[s]) if self.natural_mean else g_bar[s]))
            mean_dir = jnp.concatenate(mean_parts)
        lr1, lr2 = self.learning_rate
        d1, mean_opt = _opt_step(self.optimizer, lr1, self.dimensionwise, mean_dir[None],
                                 state.mean_opt)
        steps = [_opt_step(self.optimizer, lr2, self.dimensionwise, d, o)
                 for d, o in zip(dirs, state.cov_opt, strict=True)]
        Gt = tuple(g + st for g, (st, _) in zip(state.Gt, steps, strict=True))
        return _FlowState(state.m + d1[0], Gt, mean_opt, tuple(o for _, o in steps))

    def _gaussian(self, state, blocks):
        m = state.m
        if blocks == "diagonal":
            return m, jnp.abs(state.Gt[0][0]), jnp.zeros((m.shape[0], 0)), None
        if len(blocks) == 1:
            return m, None, state.Gt[0].T, None
        K = sum(g.shape[0] for g in state.Gt)
        factor, k = jnp.zeros((m.shape[0], K)), 0
        for s, g in zip(_slices(blocks), state.Gt, strict=True):
            factor = factor.at[s, k:k + g.shape[0]].set(g.T)
            k += g.shape[0]
        return m, None, factor, None


class _ADVIState(NamedTuple):
    params: tuple  # (m, L) or (m, log sd)
    opt_state: object


class ADVI(FlowMethod):
    """Reparameterised-gradient Gaussian VI (Kucukelbir et al. 2017; Titsias &
    Lazaro-Gredilla 2014): q = N(m, L L^T) with L lower triangular (or mean field,
    ``mean_field=True``: L = diag(exp(s))), the free energy's gradient estimated from
    ``n_samples`` draws per step (default 1) and applied by ``optimizer`` (an optax name or
    transformation, default Adam) at ``learning_rate``."""

    n_samples: int | None = eqx.field(static=True, default=1)
    mean_field: bool = eqx.field(static=True, default=False)
    learning_rate: float | tuple = eqx.field(static=True, default=0.01)
    optimizer: object = eqx.field(static=True, default="adam")
    batch_size: int | None = eqx.field(static=True, default=None)
    init_scale: float = eqx.field(static=True, default=1.0)

    def __post_init__(self):
        self._check_common()
        self._n(self.n_samples, 0, "n_samples", 1)
        if self.learning_rate[0] != self.learning_rate[1]:
            raise ValueError("ADVI takes one learning rate")

    def _opt(self):
        return optax_optimizer(self.optimizer, self.learning_rate[0])

    def _init(self, key, x0, blocks):
        D = x0.shape[0]
        scale = (jnp.full(D, math.log(self.init_scale), dtype=x0.dtype) if self.mean_field
                 else self.init_scale * jnp.eye(D))
        params = (x0, scale)
        return _ADVIState(params, self._opt().init(params))

    def _points(self, state, key, blocks):
        m, s = state.params
        eps = jax.random.normal(key, (self.n_samples, m.shape[0]))
        return m + (eps * jnp.exp(s) if self.mean_field else eps @ jnp.tril(s).T), eps

    def _entropy(self, state, noise, blocks):
        m, s = state.params
        logdet = 2 * (jnp.sum(s) if self.mean_field
                      else jnp.sum(jnp.log(jnp.abs(jnp.diagonal(s)))))
        return 0.5 * logdet + 0.5 * m.shape[0] * _LOG2PIE

    def _update(self, state, X, eps, G, blocks):
        m, s = state.params
        S = X.shape[0]
        if self.mean_field:  # d/ds of E[phi(m + e exp(s))] - sum s
            gs = jnp.mean(G * eps, axis=0) * jnp.exp(s) - 1.0
        else:  # d/dL of E[phi(m + L e)] - sum log|L_dd|
            gs = jnp.tril(G.T @ eps / S) - jnp.diag(1.0 / jnp.diagonal(s))
        grads = (jnp.mean(G, axis=0), gs)
        updates, opt_state = self._opt().update(grads, state.opt_state, state.params)
        import optax

        return _ADVIState(optax.apply_updates(state.params, updates), opt_state)

    def _gaussian(self, state, blocks):
        m, s = state.params
        if self.mean_field:
            return m, jnp.exp(s), jnp.zeros((m.shape[0], 0)), None
        return m, None, jnp.tril(s), None


class SVGD(FlowMethod):
    """Stein variational gradient descent (Liu & Wang 2016) with ``kernel`` "rbf"
    (bandwidth by the median heuristic), "linear" (x^T x' + 1) or "centred" ((x - m)^T
    (x' - m) + 1, whose dynamics are GPF's, [Galy-Fajou2021, Sec. 3.6]). Not a Gaussian
    approximation: the result summarises the particles by their mean and covariance."""

    n_particles: int | None = eqx.field(static=True, default=None)
    kernel: str = eqx.field(static=True, default="rbf")
    learning_rate: float | tuple = eqx.field(static=True, default=0.01)
    optimizer: str = eqx.field(static=True, default="gd")
    dimensionwise: bool = eqx.field(static=True, default=False)
    batch_size: int | None = eqx.field(static=True, default=None)
    init_scale: float = eqx.field(static=True, default=1.0)

    def __post_init__(self):
        self._check_common()
        if self.kernel not in ("rbf", "linear", "centred"):
            raise ValueError(f"kernel must be 'rbf', 'linear' or 'centred', got {self.kernel!r}")
        if self.n_particles is not None:
            self._n(self.n_particles, 0, "n_particles", 2)

    _init = ParticleFlow._init
    _points = ParticleFlow._points
    _entropy = ParticleFlow._entropy
    _gaussian = ParticleFlow._gaussian

    def _direction(self, X, G):
        """phi(x_i) = (1/N) sum_j [-k(x_j, x_i) g_j + grad_{x_j} k(x_j, x_i)]."""
        N = X.shape[0]
        if self.kernel == "rbf":
            sq = jnp.sum(X**2, axis=1)
            d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0)
            h = jnp.median(d2) / math.log(N + 1.0)
            h = jnp.where(h > 0, h, 1.0)
            K = jnp.exp(-d2 / h)
            return (-(K @ G) + (2 / h) * (jnp.sum(K, axis=1)[:, None] * X - K @ X)) / N
        Y = X - jnp.mean(X, axis=0) if self.kernel == "centred" else X
        return -((Y @ Y.T + 1.0) @ G) / N + Y

    def _update(self, state, X, noise, G, blocks):
        d, cov_opt = _opt_step(self.optimizer, self.learning_rate[1], self.dimensionwise,
                               self._direction(X, G), state.cov_opt)
        return _ParticleState(X + d, state.mean_opt, cov_opt)


#: The flow methods this module implements (the concrete :class:`FlowMethod` subclasses).
PARTICLE_FLOWS = (ParticleFlow, GaussianFlow, ADVI, SVGD)


# --- the loop ---------------------------------------------------------------------------


class FlowCarry(NamedTuple):
    """The carry of a flow's training loop."""

    method: object  # the method's state (particles, or mean and factor, ...)
    hyper: object  # the target's trainable parameters
    opt_state: object  # their optimizer's state
    t: jax.Array  # iteration count
    batches: Minibatches  # the key stream (points and minibatches) over the target's data


def _step(carry, args):
    """One iteration: the method's points, their potentials and gradients (one minibatch
    shared by all points), the free energy before the update, the method's update and an
    optax step on the target's trainable parameters (if any)."""
    method, static, data, blocks, opt = args
    state, hyp = carry.method, carry.hyper
    key, k_batch, k_points = jax.random.split(carry.batches.key, 3)
    rows, _, scale = minibatch(carry.batches._replace(key=k_batch), carry.t, method.batch_size,
                               replace=True)
    batch = data if rows is None else tuple(a[rows] for a in data)
    X, noise = method._points(state, k_points, blocks)

    def total(h, X):
        target = eqx.combine(h, static)
        values = target.potentials(X, batch, scale)
        return jnp.sum(values) - X.shape[0] * log_prior(target), values

    (_, values), (g_hyp, G) = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(hyp, X)
    free_energy = jnp.mean(values) - log_prior(eqx.combine(hyp, static)) - method._entropy(
        state, noise, blocks)
    state = method._update(state, X, noise, G, blocks)
    g_hyp = jax.tree_util.tree_map(lambda g: g / X.shape[0], g_hyp)
    updates, opt_state = opt.update(g_hyp, carry.opt_state, hyp)
    return FlowCarry(state, eqx.apply_updates(hyp, updates), opt_state, carry.t + 1,
                     carry.batches._replace(key=key)), (free_energy, jnp.nan)


def _run(target: Target, x0, method, key, blocks, *, max_iter, tol, learning_rate, optimizer,
         callback, verbose, chunk_size, window, unravel):
    if not isinstance(method, FlowMethod):
        raise TypeError("method must be a FlowMethod (ParticleFlow, GaussianFlow, ADVI or "
                        f"SVGD), got {method!r}")
    max_iter = check_int(max_iter, "max_iter")
    data = tuple(jnp.asarray(a) for a in target.data)
    if method.batch_size is not None and method.batch_size > target.num_data:
        raise ValueError(f"batch_size {method.batch_size} exceeds the {target.num_data} "
                         "examples of the target's data")
    k_init, k_run = jax.random.split(key)
    state = method._init(k_init, x0, blocks)
    hyp, static = partition_trainable(target)
    opt = optax_optimizer(optimizer, learning_rate)
    n = data[0].shape[0] if data else 0
    carry = FlowCarry(state, hyp, opt.init(hyp), jnp.asarray(0), Minibatches.start(k_run, n))

    def to_result(c):
        m, sd, factor, particles = method._gaussian(c.method, blocks)
        return (VariationalGaussian(m, factor, sd, particles, unravel),
                eqx.combine(c.hyper, static))

    carry, hist = run_steps(_step, carry, (method, static, data, blocks, opt), to_result,
                            max_iter=int(max_iter), tol=tol, chunk_size=chunk_size,
                            window=window, callback=callback, verbose=verbose)
    q, fitted = to_result(carry)
    return dataclasses.replace(q, history=hist), fitted


@limits
def fit_gaussian(target: Target | Callable[[PyTree], Float[Array, ""]],
                 init: PyTree[Float[ArrayLike, " ..."]],
                 method: FlowMethod | None = None, *,
                 key: PRNGKeyArray | None = None, max_iter: int = 1000, tol: float = 0.0,
                 learning_rate: float = 0.01, optimizer: str = "adam",
                 callback: Callable | None = None, verbose: bool = False,
                 chunk_size: int = 50, window: int = 20) -> VariationalGaussian:
    """The Gaussian approximation of ``target`` -- a callable log density of a pytree like
    ``init``, or a :class:`Target` (minibatches, trainable parameters) -- by ``method``
    (:class:`ParticleFlow` by default; :class:`GaussianFlow`, :class:`ADVI`, :class:`SVGD`),
    started around ``init``. ``max_iter`` iterations, or fewer when the relative change of the
    mean free energy over two ``window``s falls below ``tol``; ``callback(iteration,
    free_energy, (q, target))`` between chunks of ``chunk_size`` iterations (True stops).
    A :class:`Target`'s trainable parameters are fitted by ``optimizer`` at
    ``learning_rate`` on the same free energy (``fit_gaussian(...).history``; the fitted
    target is returned by :func:`fit_gaussian_target`)."""
    return fit_gaussian_target(target, init, method, key=key, max_iter=max_iter, tol=tol,
                               learning_rate=learning_rate, optimizer=optimizer,
                               callback=callback, verbose=verbose, chunk_size=chunk_size,
                               window=window)[0]


@limits
def fit_gaussian_target(target: Target | Callable[[PyTree], Float[Array, ""]],
                        init: PyTree[Float[ArrayLike, " ..."]],
                        method: FlowMethod | None = None, *,
                        key: PRNGKeyArray | None = None, max_iter: int = 1000,
                        tol: float = 0.0, learning_rate: float = 0.01, optimizer: str = "adam",
                        callback: Callable | None = None, verbose: bool = False,
                        chunk_size: int = 50, window: int = 20
                        ) -> tuple[VariationalGaussian, Target]:
    """:func:`fit_gaussian` returning ``(q, target with its fitted parameters)``."""
    x0, unravel = ravel_pytree(init)
    target = _as_target(target, unravel)
    x0 = jnp.asarray(x0, dtype=jnp.float64)
    if x0.ndim != 1 or x0.shape[0] < 1:
        raise ValueError("init must be a non-empty array or pytree of arrays")
    if not bool(jnp.all(jnp.isfinite(x0))):
        raise ValueError("init contains NaN or inf")
    method = ParticleFlow() if method is None else method
    sizes = [int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(init)]
    blocks = _block_slices(getattr(method, "blocks", None), x0.shape[0], sizes)
    key = jax.random.key(0) if key is None else key
    return _run(target, x0, method, key, blocks, max_iter=max_iter, tol=tol,
                learning_rate=learning_rate, optimizer=optimizer, callback=callback,
                verbose=verbose, chunk_size=chunk_size, window=window, unravel=unravel)


__all__ = ["ParticleFlow", "GaussianFlow", "ADVI", "SVGD", "Target", "LogDensity",
           "VariationalGaussian", "fit_gaussian", "fit_gaussian_target", "FlowMethod",
           "PARTICLE_FLOWS"]
