"""Covariance functions. ``k(X, Z)`` gives the (n, m) matrix, ``k(X)`` the symmetric (n, n)
one, ``k.diag(X)`` its diagonal in O(n). Kernels are equinox Modules whose hyperparameters
are :class:`~augmentedgp.params.Parameter` nodes (positive ones through exp); they add
(``k1 + k2``), multiply (``k1 * k2``) and scale (``2.0 * k``).

Formulas: Rasmussen & Williams [Rasmussen2006], ch. 4.
Stationary kernels use ARD lengthscales when ``lengthscale`` is an array of shape (d,).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from augmentedgp.core.params import Parameter, positive
from augmentedgp.core.validation import check_int


class Kernel(eqx.Module):
    """Base class: subclasses implement ``_matrix(X, Z, symmetric)`` and ``diag(X)``."""

    def __call__(self, X: Float[ArrayLike, "n d"], Z: Float[ArrayLike, "m d"] | None = None
                 ) -> Float[Array, "n m"]:
        """Covariance matrix k(X, Z): X (n, d), Z (m, d) -> (n, m); Z=None means Z=X."""
        if Z is None:
            return self._matrix(X, X, True)
        return self._matrix(X, Z, False)

    def _matrix(self, X, Z, symmetric: bool):
        raise NotImplementedError

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        """diag k(X, X), shape (n,)."""
        raise NotImplementedError

    def __add__(self, other: Kernel) -> Kernel:
        return Sum(self, other)

    def __mul__(self, other) -> Kernel:
        if isinstance(other, Kernel):
            return Product(self, other)
        return Scaled(self, other)

    __rmul__ = __mul__


class Sum(Kernel):
    """k1 + k2 (also written ``k1 + k2``)."""

    k1: Kernel
    k2: Kernel

    def _matrix(self, X, Z, symmetric):
        return self.k1._matrix(X, Z, symmetric) + self.k2._matrix(X, Z, symmetric)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return self.k1.diag(X) + self.k2.diag(X)


class Product(Kernel):
    """k1 * k2 (also written ``k1 * k2``)."""

    k1: Kernel
    k2: Kernel

    def _matrix(self, X, Z, symmetric):
        return self.k1._matrix(X, Z, symmetric) * self.k2._matrix(X, Z, symmetric)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return self.k1.diag(X) * self.k2.diag(X)


class Scaled(Kernel):
    """c * k with a positive, trainable scale c."""

    kernel: Kernel
    scale: Parameter

    def __init__(self, kernel: Kernel, scale: float | Parameter = 1.0):
        self.kernel = kernel
        self.scale = positive(scale, "scale")

    def _matrix(self, X, Z, symmetric):
        return self.scale.value * self.kernel._matrix(X, Z, symmetric)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return self.scale.value * self.kernel.diag(X)


# --- stationary kernels ------------------------------------------------------------------


def _scaled_sqdist(X, Z, lengthscale, symmetric):
    """Squared distances between rows of X/l and Z/l, by one matrix product (BLAS speed).

    Inputs are centred first to limit cancellation; coinciding rows give exactly 0.
    """
    if lengthscale.ndim == 1 and lengthscale.shape[0] not in (1, X.shape[-1]):
        raise ValueError(
            f"ARD lengthscale has {lengthscale.shape[0]} entries but X has {X.shape[-1]} columns"
        )
    Xs = X / lengthscale
    Zs = Xs if symmetric else Z / lengthscale
    centre = jnp.mean(Xs, axis=0)
    Xs = Xs - centre
    Zs = Xs if symmetric else Zs - centre
    x2, z2 = jnp.sum(Xs**2, -1)[:, None], jnp.sum(Zs**2, -1)[None, :]
    r2 = x2 + z2 - 2.0 * Xs @ Zs.T
    # below the rounding error of the expansion (~eps (|x|^2 + |z|^2)) the rows coincide:
    # return exactly 0, else Matern-1/2 sees r ~ 1e-8 at coincident inputs
    r2 = jnp.where(r2 > 16.0 * jnp.finfo(r2.dtype).eps * (x2 + z2), r2, 0.0)
    if symmetric:
        r2 = 0.5 * (r2 + r2.T) * (1.0 - jnp.eye(X.shape[0], dtype=r2.dtype))
    return r2


def _safe_sqrt(r2):
    """sqrt with a zero (not NaN/inf) derivative at 0."""
    positive_ = r2 > 0
    return jnp.where(positive_, jnp.sqrt(jnp.where(positive_, r2, 1.0)), 0.0)


class Stationary(Kernel):
    """variance * profile(r^2), r^2 = sum_d (x_d - z_d)^2 / l_d^2."""

    lengthscale: Parameter
    variance: Parameter

    def __init__(self, lengthscale: float | Float[ArrayLike, " d"] | Parameter = 1.0,
                 variance: float | Parameter = 1.0):
        self.lengthscale = positive(lengthscale, "lengthscale")
        self.variance = positive(variance, "variance")
        if jnp.ndim(self.lengthscale.raw) > 1:
            raise ValueError("lengthscale must be a scalar or a 1-D array (one per input dim)")

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        raise NotImplementedError

    def _matrix(self, X, Z, symmetric):
        r2 = _scaled_sqdist(X, Z, self.lengthscale.value, symmetric)
        return self.variance.value * self.profile(r2)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return jnp.broadcast_to(self.variance.value, X.shape[:1]).astype(X.dtype)


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
        s = math.sqrt(3.0) * _safe_sqrt(r2)
        return (1.0 + s) * jnp.exp(-s)


class Matern52(Stationary):
    """Matern nu=5/2: v (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)."""

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        s = math.sqrt(5.0) * _safe_sqrt(r2)
        return (1.0 + s + 5.0 * r2 / 3.0) * jnp.exp(-s)


class RationalQuadratic(Stationary):
    """v (1 + r^2 / (2 alpha))^(-alpha)."""

    alpha: Parameter

    def __init__(self, lengthscale: float | Float[ArrayLike, " d"] | Parameter = 1.0,
                 variance: float | Parameter = 1.0, alpha: float | Parameter = 1.0):
        super().__init__(lengthscale, variance)
        self.alpha = positive(alpha, "alpha")

    def profile(self, r2: Float[Array, "n m"]) -> Float[Array, "n m"]:
        a = self.alpha.value
        return jnp.exp(-a * jnp.log1p(r2 / (2.0 * a)))


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
        self.lengthscale = positive(lengthscale, "lengthscale")
        self.variance = positive(variance, "variance")
        self.period = positive(period, "period")
        if jnp.ndim(self.lengthscale.raw) > 1 or jnp.ndim(self.period.raw) > 1:
            raise ValueError("lengthscale and period must be scalars or 1-D arrays")

    def _features(self, X):
        ls = jnp.broadcast_to(self.lengthscale.value, X.shape[-1:])
        angle = 2.0 * math.pi * X / self.period.value
        return jnp.cos(angle) / ls, jnp.sin(angle) / ls, jnp.sum(1.0 / ls**2)

    def _matrix(self, X, Z, symmetric):
        # 2 sin^2((a - b)/2) = 1 - cos a cos b - sin a sin b: one matrix product per term
        cx, sx, total = self._features(X)
        cz, sz, _ = (cx, sx, total) if symmetric else self._features(Z)
        e = jnp.maximum(total - cx @ cz.T - sx @ sz.T, 0.0)
        if symmetric:
            e = 0.5 * (e + e.T) * (1.0 - jnp.eye(X.shape[0], dtype=e.dtype))
        return self.variance.value * jnp.exp(-e)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return jnp.broadcast_to(self.variance.value, X.shape[:1]).astype(X.dtype)


# --- dot-product and degenerate kernels -------------------------------------------------


class Linear(Kernel):
    """sum_d v_d x_d z_d (ARD when ``variance`` is an array of shape (d,))."""

    variance: Parameter

    def __init__(self, variance: float | Float[ArrayLike, " d"] | Parameter = 1.0):
        self.variance = positive(variance, "variance")

    def _matrix(self, X, Z, symmetric):
        return (X * self.variance.value) @ Z.T

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return jnp.sum(X**2 * self.variance.value, axis=-1)


class Polynomial(Kernel):
    """(v x.z + c)^degree with an integer degree >= 1 (``offset`` c > 0)."""

    variance: Parameter
    offset: Parameter
    degree: int = eqx.field(static=True)

    def __init__(self, degree: int = 2, variance: float | Parameter = 1.0,
                 offset: float | Parameter = 1.0):
        self.degree = check_int(degree, "degree")
        self.variance = positive(variance, "variance")
        self.offset = positive(offset, "offset")

    def _matrix(self, X, Z, symmetric):
        return (self.variance.value * (X @ Z.T) + self.offset.value) ** self.degree

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return (self.variance.value * jnp.sum(X**2, -1) + self.offset.value) ** self.degree


class Constant(Kernel):
    """k(x, z) = v for all pairs."""

    variance: Parameter

    def __init__(self, variance: float | Parameter = 1.0):
        self.variance = positive(variance, "variance")

    def _matrix(self, X, Z, symmetric):
        return jnp.full((X.shape[0], Z.shape[0]), self.variance.value, dtype=X.dtype)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return jnp.full(X.shape[:1], self.variance.value, dtype=X.dtype)


class White(Kernel):
    """White noise v * delta: v I on k(X, X); zero between distinct input sets (as in
    scikit-learn's WhiteKernel), so it models observation noise, not a latent function."""

    variance: Parameter

    def __init__(self, variance: float | Parameter = 1.0):
        self.variance = positive(variance, "variance")

    def _matrix(self, X, Z, symmetric):
        if symmetric:
            return self.variance.value * jnp.eye(X.shape[0], dtype=X.dtype)
        return jnp.zeros((X.shape[0], Z.shape[0]), dtype=X.dtype)

    def diag(self, X: Float[ArrayLike, "n d"]) -> Float[Array, " n"]:
        return jnp.full(X.shape[:1], self.variance.value, dtype=X.dtype)


__all__ = [
    "Kernel", "Sum", "Product", "Scaled", "Stationary", "RBF", "SquaredExponential",
    "Matern12", "Matern32", "Matern52", "RationalQuadratic", "Periodic", "Linear",
    "Polynomial", "Constant", "White",
]
