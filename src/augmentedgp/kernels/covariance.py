"""Covariance functions. ``k(X, Z)`` gives the (n, m) matrix, ``k(X)`` the symmetric (n, n)
one, ``k.diag(X)`` its diagonal in O(n). Kernels are equinox Modules whose hyperparameters
are :class:`~augmentedgp.params.Parameter` nodes (positive ones through exp); they add
(``k1 + k2``), multiply (``k1 * k2``) and scale (``2.0 * k``).

Formulas: Rasmussen & Williams [Rasmussen2006], ch. 4.
Stationary kernels use ARD lengthscales when ``lengthscale`` is an array of shape (d,).
"""

from __future__ import annotations

import abc
import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.validation import check_inputs, check_int, is_concrete

# --- the boundary: one validation for every kernel, composite or not ---------------------


def _check_length(p: Parameter, name: str, d: int):
    """An ARD parameter has one entry per input column (or one for all)."""
    shape = jnp.shape(p.raw)
    if len(shape) == 1 and shape[0] not in (1, d):
        raise ValueError(
            f"ARD {name} has {shape[0]} entries (one per input column) but X has {d} columns"
        )


def _hyperparameters(kernel: Kernel, prefix: str = "") -> list[str]:
    """``name=value`` for every hyperparameter of ``kernel`` (for error messages)."""
    out = []
    for field in (f.name for f in dataclasses.fields(kernel)):
        leaf = getattr(kernel, field)
        if isinstance(leaf, Parameter) and is_concrete(leaf.raw):
            out.append(f"{prefix}{field}={np.asarray(leaf.value).tolist()}")
        elif isinstance(leaf, int):  # a static setting: Polynomial's degree
            out.append(f"{prefix}{field}={leaf}")
        elif isinstance(leaf, Kernel):
            out.extend(_hyperparameters(leaf, f"{prefix}{field}."))
    return out


def _finite(kernel: Kernel, K: Array, X: Array, Z: Array | None) -> Array:
    """``K`` unchanged if finite (or traced), else a ValueError naming X: finite inputs
    whose scale overflows the kernel (Polynomial at |X| ~ 1e150, say)."""
    if is_concrete(K) and not bool(jnp.all(jnp.isfinite(K))):
        scale = max(float(jnp.max(jnp.abs(A), initial=0.0)) for A in (X, Z) if A is not None)
        raise ValueError(
            f"X's scale overflows the kernel: {type(kernel).__name__} is not finite at these "
            f"inputs (max |X|{', |Z|' if Z is not None else ''} = {scale:.3g}; "
            f"{', '.join(_hyperparameters(kernel)) or 'no hyperparameters'}); standardise the "
            f"inputs or reduce the hyperparameters"
        )
    return K


class Kernel(eqx.Module):
    """Base class. ``k(X, Z)`` and ``k.diag(X)`` validate their inputs once, for every
    kernel (composites included), then call the subclass's hooks on 2-D float arrays with
    matching columns. A new kernel implements one abstract method,
    ``evaluate(X, Z, symmetric) -> (n, m)`` (a subclass without it fails at construction
    with a TypeError naming it); it may override ``evaluate_diag(X) -> (n,)`` (default:
    the diagonal of ``evaluate`` row by row) and, with per-column hyperparameters,
    ``check_columns(d)``. A stationary kernel subclasses :class:`Stationary` and implements
    ``profile(r2)`` instead.

    Bad inputs raise a TypeError / ValueError naming ``X`` or ``Z``: not 2-D, no columns,
    different column counts, non-real dtypes (strings, complex, objects), an ARD
    hyperparameter whose length is not d; and, when the values are concrete (not traced
    under ``jit`` / ``vmap`` / ``grad``), NaN or inf in the inputs or a kernel matrix that
    overflows. Lists and integer or boolean arrays are converted to float.
    """

    def __call__(self, X: Float[ArrayLike, "n d"], Z: Float[ArrayLike, "m d"] | None = None
                 ) -> Float[Array, "n m"]:
        """Covariance matrix k(X, Z): X (n, d), Z (m, d) -> (n, m); Z=None means Z=X."""
        X = check_inputs(X, "X")
        if Z is None:
            self.check_columns(X.shape[1])
            return _finite(self, self.evaluate(X, X, True), X, None)
        Z = check_inputs(Z, "Z")
        if Z.shape[1] != X.shape[1]:
            raise ValueError(f"Z must have as many columns as X: X has {X.shape[1]}, Z has "
                             f"{Z.shape[1]}")
        self.check_columns(X.shape[1])
        return _finite(self, self.evaluate(X, Z, False), X, Z)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        """diag k(X, X), shape (n,)."""
        X = check_inputs(X, "X")
        self.check_columns(X.shape[1])
        return _finite(self, self.evaluate_diag(X), X, None)

    @abc.abstractmethod
    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        """The hook every kernel implements: the (n, m) matrix k(X, Z) on validated inputs
        (2-D float arrays with the same columns, hyperparameters checked by
        :meth:`check_columns`). ``symmetric`` is True when ``Z`` is ``X`` (the call
        ``k(X)``), so a kernel may exploit the symmetry; the result must not depend on it
        beyond rounding. Called by ``k(X, Z)``, which validates first; call that instead."""

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        """diag k(X, X) on validated inputs. Optional: by default k(x_i, x_i) row by row
        through :meth:`evaluate` (O(n) work); kernels override it with a closed form."""
        return jax.vmap(lambda x: self.evaluate(x[None], x[None], True)[0, 0])(X)

    def check_columns(self, d: int) -> None:
        """Raise a ValueError if a per-column hyperparameter does not match d columns.
        Optional: kernels without per-column (ARD) hyperparameters accept any d."""

    def __add__(self, other: Kernel) -> Kernel:
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(self, other)

    def __mul__(self, other: Kernel | float | Parameter) -> Kernel:
        if isinstance(other, Kernel):
            return Product(self, other)
        return Scaled(self, other)

    __rmul__ = __mul__


def _check_kernels(*pairs):
    for name, k in pairs:
        if not isinstance(k, Kernel):
            raise TypeError(f"{name} must be a Kernel, got {type(k).__name__}")


class Sum(Kernel):
    """k1 + k2 (also written ``k1 + k2``)."""

    k1: Kernel
    k2: Kernel

    def __check_init__(self):
        _check_kernels(("k1", self.k1), ("k2", self.k2))

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return self.k1.evaluate(X, Z, symmetric) + self.k2.evaluate(X, Z, symmetric)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return self.k1.evaluate_diag(X) + self.k2.evaluate_diag(X)

    def check_columns(self, d: int) -> None:
        self.k1.check_columns(d)
        self.k2.check_columns(d)


class Product(Kernel):
    """k1 * k2 (also written ``k1 * k2``)."""

    k1: Kernel
    k2: Kernel

    def __check_init__(self):
        _check_kernels(("k1", self.k1), ("k2", self.k2))

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return self.k1.evaluate(X, Z, symmetric) * self.k2.evaluate(X, Z, symmetric)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return self.k1.evaluate_diag(X) * self.k2.evaluate_diag(X)

    def check_columns(self, d: int) -> None:
        self.k1.check_columns(d)
        self.k2.check_columns(d)


class Scaled(Kernel):
    """c * k with a positive, trainable scale c."""

    kernel: Kernel
    scale: Parameter

    def __init__(self, kernel: Kernel, scale: float | Parameter = 1.0):
        _check_kernels(("kernel", kernel))
        self.kernel = kernel
        self.scale = positive(scale, "scale", max_ndim=0)

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return self.scale.value * self.kernel.evaluate(X, Z, symmetric)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return self.scale.value * self.kernel.evaluate_diag(X)

    def check_columns(self, d: int) -> None:
        self.kernel.check_columns(d)


# --- stationary kernels ------------------------------------------------------------------


def _power_of_two(m):
    """A power of two s with m / s in [1, 2) (clipped to the normal range; 1 if m is 0 or
    not finite): dividing by s is exact, so rescaling changes no rounding."""
    info = jnp.finfo(m.dtype)
    _, e = jnp.frexp(jnp.where(jnp.isfinite(m) & (m > 0), m, 1.0))
    return jnp.ldexp(jnp.ones((), m.dtype), jnp.clip(e - 1, info.minexp + 1, info.maxexp - 1))


def _scaled_sqdist(X, Z, lengthscale, symmetric):
    """Squared distances between rows of X/l and Z/l, by one matrix product (BLAS speed).

    The scaled inputs are divided by a power of two s ~ max |X/l| (exact) and centred, so
    neither the squares nor the mean overflow at |X/l| up to 1e308; the result is
    multiplied back by s^2 (inf beyond the float range, where every profile is 0).
    Coinciding rows give exactly 0.
    """
    Xs = X / lengthscale
    Zs = Xs if symmetric else Z / lengthscale
    m = jnp.max(jnp.abs(Xs), initial=0.0)
    if not symmetric:
        m = jnp.maximum(m, jnp.max(jnp.abs(Zs), initial=0.0))
    s = jax.lax.stop_gradient(_power_of_two(m))  # r^2 does not depend on s
    Xs = Xs / s
    Zs = Xs if symmetric else Zs / s
    centre = jnp.mean(Xs, axis=0)
    Xs = Xs - centre
    Zs = Xs if symmetric else Zs - centre
    x2, z2 = jnp.sum(Xs**2, -1)[:, None], jnp.sum(Zs**2, -1)[None, :]
    r2 = x2 + z2 - 2.0 * Xs @ Zs.T
    # below the rounding error of the expansion (~eps (|x|^2 + |z|^2)) the rows coincide:
    # return exactly 0, else Matern-1/2 sees r ~ 1e-8 at coincident inputs (a NaN from a
    # traced NaN input stays NaN: the comparison is written so that NaN fails it)
    r2 = jnp.where(r2 <= 16.0 * jnp.finfo(r2.dtype).eps * (x2 + z2), 0.0, r2)
    if symmetric:
        r2 = 0.5 * (r2 + r2.T) * (1.0 - jnp.eye(X.shape[0], dtype=r2.dtype))
    return r2 * s * s  # (r2 * s) * s: 0 stays 0, large values overflow to inf


def _safe_sqrt(r2):
    """sqrt with a zero (not NaN/inf) derivative at 0 (NaN stays NaN)."""
    positive_ = r2 > 0
    return jnp.where(positive_, jnp.sqrt(jnp.where(positive_, r2, 1.0)), 0.0 * r2)


# beyond r^2 = 1e6 (r = 1000) every Matern profile is below the smallest float (e^-1000);
# clamping there keeps (1 + s) e^-s from becoming inf * 0 = NaN at r = inf
_R2_MAX = 1e6


class Stationary(Kernel):
    """variance * profile(r^2), r^2 = sum_d (x_d - z_d)^2 / l_d^2."""

    lengthscale: Parameter
    variance: Parameter

    def __init__(self, lengthscale: float | Float[ArrayLike, " d"] | Parameter = 1.0,
                 variance: float | Parameter = 1.0):
        self.lengthscale = positive(lengthscale, "lengthscale", max_ndim=1)
        self.variance = positive(variance, "variance", max_ndim=0)

    @abc.abstractmethod
    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        """The hook a stationary kernel implements: the correlation as a function of the
        scaled squared distance r^2 (0 <= r^2 <= inf), 1 at r^2 = 0."""

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        r2 = _scaled_sqdist(X, Z, self.lengthscale.value, symmetric)
        return self.variance.value * self.profile(r2)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return jnp.broadcast_to(self.variance.value, X.shape[:1]).astype(X.dtype)

    def check_columns(self, d: int) -> None:
        _check_length(self.lengthscale, "lengthscale", d)


class RBF(Stationary):
    """Squared exponential: v exp(-r^2 / 2)."""

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        return jnp.exp(-0.5 * r2)


SquaredExponential = RBF


class Matern12(Stationary):
    """Matern nu=1/2 (exponential): v exp(-r)."""

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        return jnp.exp(-_safe_sqrt(r2))


class Matern32(Stationary):
    """Matern nu=3/2: v (1 + sqrt(3) r) exp(-sqrt(3) r)."""

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        s = math.sqrt(3.0) * _safe_sqrt(jnp.minimum(r2, _R2_MAX))
        return (1.0 + s) * jnp.exp(-s)


class Matern52(Stationary):
    """Matern nu=5/2: v (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)."""

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        r2 = jnp.minimum(r2, _R2_MAX)
        s = math.sqrt(5.0) * _safe_sqrt(r2)
        return (1.0 + s + 5.0 * r2 / 3.0) * jnp.exp(-s)


class RationalQuadratic(Stationary):
    """v (1 + r^2 / (2 alpha))^(-alpha)."""

    alpha: Parameter

    def __init__(self, lengthscale: float | Float[ArrayLike, " d"] | Parameter = 1.0,
                 variance: float | Parameter = 1.0, alpha: float | Parameter = 1.0):
        super().__init__(lengthscale, variance)
        self.alpha = positive(alpha, "alpha", max_ndim=0)

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        a = self.alpha.value
        t = r2 / (2.0 * a)
        # log1p(t) = log(r^2) - log(2 alpha) where t overflows (tiny alpha, large r^2)
        big = t > 1e300
        log_term = jnp.where(big, jnp.log(jnp.where(big, r2, 1.0)) - jnp.log(2.0 * a),
                             jnp.log1p(jnp.where(big, 0.0, t)))
        return jnp.exp(-a * log_term)


class Periodic(Kernel):
    """MacKay's periodic kernel, one factor per input dimension:

        v exp(-2 sum_d sin^2(pi (x_d - z_d) / p_d) / l_d^2)

    In 1-D this is scikit-learn's ExpSineSquared. For d > 1, ExpSineSquared applies the sine
    to the Euclidean distance, which is not positive semi-definite; the product form is.
    ``lengthscale`` and ``period`` may be scalars or arrays of shape (d,).
    """

    lengthscale: Parameter
    variance: Parameter
    period: Parameter

    def __init__(self, lengthscale: float | Float[ArrayLike, " d"] | Parameter = 1.0,
                 variance: float | Parameter = 1.0,
                 period: float | Float[ArrayLike, " d"] | Parameter = 1.0):
        self.lengthscale = positive(lengthscale, "lengthscale", max_ndim=1)
        self.variance = positive(variance, "variance", max_ndim=0)
        self.period = positive(period, "period", max_ndim=1)

    def _features(self, X, w):
        angle = 2.0 * math.pi * X / self.period.value
        return jnp.cos(angle) * w, jnp.sin(angle) * w

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        # 2 sin^2((a - b)/2) = 1 - cos a cos b - sin a sin b: one matrix product per term.
        # The weights 1/l_d are divided by a power of two c ~ max_d 1/l_d (exact), so a tiny
        # lengthscale gives exponents of inf (correlation 0), not inf - inf = NaN.
        w = jnp.broadcast_to(1.0 / self.lengthscale.value, X.shape[-1:])
        c = jax.lax.stop_gradient(_power_of_two(jnp.max(w)))
        w = w / c
        cx, sx = self._features(X, w)
        cz, sz = (cx, sx) if symmetric else self._features(Z, w)
        e = jnp.maximum(jnp.sum(w**2) - cx @ cz.T - sx @ sz.T, 0.0)
        if symmetric:
            e = 0.5 * (e + e.T) * (1.0 - jnp.eye(X.shape[0], dtype=e.dtype))
        return self.variance.value * jnp.exp(-(e * c * c))

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return jnp.broadcast_to(self.variance.value, X.shape[:1]).astype(X.dtype)

    def check_columns(self, d: int) -> None:
        _check_length(self.lengthscale, "lengthscale", d)
        _check_length(self.period, "period", d)


# --- dot-product and degenerate kernels -------------------------------------------------


class Linear(Kernel):
    """sum_d v_d x_d z_d (ARD when ``variance`` is an array of shape (d,))."""

    variance: Parameter

    def __init__(self, variance: float | Float[ArrayLike, " d"] | Parameter = 1.0):
        self.variance = positive(variance, "variance", max_ndim=1)

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return (X * self.variance.value) @ Z.T

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return jnp.sum(X**2 * self.variance.value, axis=-1)

    def check_columns(self, d: int) -> None:
        _check_length(self.variance, "variance", d)


class Polynomial(Kernel):
    """(v x.z + c)^degree with an integer degree >= 1 (``offset`` c > 0)."""

    variance: Parameter
    offset: Parameter
    degree: int = eqx.field(static=True)

    def __init__(self, degree: int = 2, variance: float | Parameter = 1.0,
                 offset: float | Parameter = 1.0):
        self.degree = check_int(degree, "degree")
        self.variance = positive(variance, "variance", max_ndim=0)
        self.offset = positive(offset, "offset", max_ndim=0)

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return (self.variance.value * (X @ Z.T) + self.offset.value) ** self.degree

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return (self.variance.value * jnp.sum(X**2, -1) + self.offset.value) ** self.degree


class Constant(Kernel):
    """k(x, z) = v for all pairs."""

    variance: Parameter

    def __init__(self, variance: float | Parameter = 1.0):
        self.variance = positive(variance, "variance", max_ndim=0)

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        return jnp.full((X.shape[0], Z.shape[0]), self.variance.value, dtype=X.dtype)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return jnp.full(X.shape[:1], self.variance.value, dtype=X.dtype)


class White(Kernel):
    """White noise v * delta: v I on k(X, X); zero between distinct input sets (as in
    scikit-learn's WhiteKernel), so it models observation noise, not a latent function."""

    variance: Parameter

    def __init__(self, variance: float | Parameter = 1.0):
        self.variance = positive(variance, "variance", max_ndim=0)

    def evaluate(self, X: Float[Array, "n d"], Z: Float[Array, "m d"], symmetric: bool
                 ) -> Float[Array, "n m"]:
        if symmetric:
            return self.variance.value * jnp.eye(X.shape[0], dtype=X.dtype)
        return jnp.zeros((X.shape[0], Z.shape[0]), dtype=X.dtype)

    def evaluate_diag(self, X: Float[Array, "n d"]) -> Float[Array, " n"]:
        return jnp.full(X.shape[:1], self.variance.value, dtype=X.dtype)


__all__ = [
    "Kernel", "Sum", "Product", "Scaled", "Stationary", "RBF", "SquaredExponential",
    "Matern12", "Matern32", "Matern52", "RationalQuadratic", "Periodic", "Linear",
    "Polynomial", "Constant", "White",
]
