"""Kernel matrices against scikit-learn and closed forms, PSD-ness, gradients, bad input."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import sklearn.gaussian_process.kernels as sk
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.flatten_util import ravel_pytree

import augmentedgp as agp

K = agp.kernels

ARD3 = np.array([0.5, 1.2, 2.0])


def _inputs(seed=0, n=7, m=5, d=3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=(m, d))


# (id, our kernel, scikit-learn kernel, input dimension). Periodic is compared in 1-D only:
# scikit-learn's ExpSineSquared uses the Euclidean distance, which is not PSD for d >= 2
# (scikit-learn issue #19343); ours is the product over dimensions (test_periodic_*).
SKLEARN_CASES = [
    ("rbf", K.RBF(0.7, 1.3), sk.ConstantKernel(1.3) * sk.RBF(0.7), 3),
    ("rbf_ard", K.RBF(ARD3, 0.8), sk.ConstantKernel(0.8) * sk.RBF(ARD3), 3),
    ("se_alias", K.SquaredExponential(1.1), sk.RBF(1.1), 3),
    ("matern12", K.Matern12(0.7, 1.3), sk.ConstantKernel(1.3) * sk.Matern(0.7, nu=0.5), 3),
    ("matern32", K.Matern32(0.9, 0.6), sk.ConstantKernel(0.6) * sk.Matern(0.9, nu=1.5), 3),
    ("matern52", K.Matern52(1.4, 2.1), sk.ConstantKernel(2.1) * sk.Matern(1.4, nu=2.5), 3),
    ("matern12_ard", K.Matern12(ARD3, 0.9), sk.ConstantKernel(0.9) * sk.Matern(ARD3, nu=0.5), 3),
    ("matern32_ard", K.Matern32(ARD3, 1.1), sk.ConstantKernel(1.1) * sk.Matern(ARD3, nu=1.5), 3),
    ("matern52_ard", K.Matern52(ARD3), sk.Matern(ARD3, nu=2.5), 3),
    (
        "rq",
        K.RationalQuadratic(0.9, 1.1, alpha=0.6),
        sk.ConstantKernel(1.1) * sk.RationalQuadratic(length_scale=0.9, alpha=0.6),
        3,
    ),
    (
        "periodic",
        K.Periodic(0.8, 1.2, period=1.7),
        sk.ConstantKernel(1.2) * sk.ExpSineSquared(length_scale=0.8, periodicity=1.7),
        1,
    ),
    ("poly1", K.Polynomial(1, variance=1.0, offset=0.3), sk.DotProduct(math.sqrt(0.3)), 3),
    ("poly3", K.Polynomial(3, variance=1.0, offset=0.5), sk.DotProduct(math.sqrt(0.5)) ** 3, 3),
    ("constant", K.Constant(1.7), sk.ConstantKernel(1.7), 3),
    ("white", K.White(0.3), sk.WhiteKernel(0.3), 3),
    ("linear", K.Linear(0.6), sk.ConstantKernel(0.6) * sk.DotProduct(sigma_0=0.0), 3),
    (
        "sum",
        K.RBF(0.7) + K.Matern32(1.5, 0.5),
        sk.RBF(0.7) + sk.ConstantKernel(0.5) * sk.Matern(1.5, nu=1.5),
        3,
    ),
    (
        "product",
        K.RBF(ARD3, 1.5) * K.Polynomial(2, offset=1.0),
        sk.ConstantKernel(1.5) * sk.RBF(ARD3) * sk.DotProduct(1.0) ** 2,
        3,
    ),
    ("lscale", 2.0 * K.Matern52(0.8), sk.ConstantKernel(2.0) * sk.Matern(0.8, nu=2.5), 3),
    ("rscale", K.Matern52(0.8) * 0.25, sk.ConstantKernel(0.25) * sk.Matern(0.8, nu=2.5), 3),
    (
        "nested",
        (K.RBF(1.3) + K.Linear(0.2)) * K.Constant(0.7) + K.White(0.05),
        (sk.RBF(1.3) + sk.ConstantKernel(0.2) * sk.DotProduct(0.0)) * sk.ConstantKernel(0.7)
        + sk.WhiteKernel(0.05),
        3,
    ),
    (
        "periodic_product",
        K.Periodic(1.1, period=0.9) * K.RBF(2.0, 0.8),
        sk.ExpSineSquared(1.1, 0.9) * sk.ConstantKernel(0.8) * sk.RBF(2.0),
        1,
    ),
]


def _check_against(ours, ref, X, Z):
    np.testing.assert_allclose(np.asarray(ours(X)), ref(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours(X, Z)), ref(X, Z), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours(Z, X)), ref(Z, X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours.diag(X)), ref.diag(X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "ours, ref, d", [c[1:] for c in SKLEARN_CASES], ids=[c[0] for c in SKLEARN_CASES]
)
def test_matches_sklearn(ours, ref, d):
    X, Z = _inputs(seed=1, d=d)
    out = ours(jnp.asarray(X), jnp.asarray(Z))
    assert out.shape == (7, 5) and out.dtype == jnp.float64
    _check_against(ours, ref, X, Z)


def test_white_cross_covariance_is_zero():
    X, Z = _inputs(seed=2)
    k = K.White(0.4)
    np.testing.assert_array_equal(np.asarray(k(X, Z)), np.zeros((7, 5)))
    np.testing.assert_allclose(np.asarray(k(X)), 0.4 * np.eye(7), rtol=1e-14, atol=0)


def test_linear_ard_matches_sklearn_on_scaled_inputs():
    X, Z = _inputs(seed=3)
    v = np.array([0.3, 1.0, 2.5])
    ours, ref = K.Linear(v), sk.DotProduct(sigma_0=0.0)
    Xs, Zs = X * np.sqrt(v), Z * np.sqrt(v)
    np.testing.assert_allclose(np.asarray(ours(X)), ref(Xs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours(X, Z)), ref(Xs, Zs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours.diag(X)), ref.diag(Xs), rtol=1e-12, atol=1e-12)


def test_polynomial_variance_scales_dot_product():
    # (v x.z + c)^p == DotProduct(sqrt c)^p on sqrt(v)-scaled inputs
    X, Z = _inputs(seed=4)
    ours = K.Polynomial(2, variance=0.4, offset=0.9)
    ref = sk.DotProduct(math.sqrt(0.9)) ** 2
    s = math.sqrt(0.4)
    np.testing.assert_allclose(np.asarray(ours(X, Z)), ref(s * X, s * Z), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ours.diag(X)), ref.diag(s * X), rtol=1e-12)


@pytest.mark.parametrize(
    "ours, ref",
    [
        (K.Matern12(0.7, 1.3), sk.ConstantKernel(1.3) * sk.Matern(0.7, nu=0.5)),
        (K.Matern32(0.7, 1.3), sk.ConstantKernel(1.3) * sk.Matern(0.7, nu=1.5)),
        (K.Matern52(ARD3), sk.Matern(ARD3, nu=2.5)),
        (K.RBF(0.7), sk.RBF(0.7)),
        (K.RationalQuadratic(0.7, alpha=2.0), sk.RationalQuadratic(0.7, alpha=2.0)),
    ],
    ids=["matern12", "matern32", "matern52_ard", "rbf", "rq"],
)
def test_coincident_points_match_sklearn(ours, ref):
    """Predicting at training inputs: Z shares rows with X, X has duplicated rows.

    k(x, x) must equal the variance to 1e-12 whichever way it is evaluated.
    """
    rng = np.random.default_rng(5)
    X = 2.0 * rng.normal(size=(5, 3))
    X = np.concatenate([X, X[[1, 4]]])  # duplicated rows inside X
    Z = X[[4, 0, 2, 3, 1]]  # every row of Z is a row of X
    _check_against(ours, ref, X, Z)


# --- closed forms ---------------------------------------------------------------------


def _bessel_matern(X, Z, nu, lengthscale, variance):
    diff = (X[:, None, :] - Z[None, :, :]) / lengthscale
    r = np.sqrt(np.sum(diff**2, -1))
    s = np.sqrt(2 * nu) * r
    with np.errstate(invalid="ignore"):
        k = 2 ** (1 - nu) / scipy.special.gamma(nu) * s**nu * scipy.special.kv(nu, s)
    return variance * np.where(r == 0, 1.0, k)


@pytest.mark.parametrize(
    "cls, nu", [(K.Matern12, 0.5), (K.Matern32, 1.5), (K.Matern52, 2.5)], ids=["12", "32", "52"]
)
@pytest.mark.parametrize("lengthscale", [0.8, ARD3], ids=["iso", "ard"])
def test_matern_equals_bessel_formula(cls, nu, lengthscale):
    X, Z = _inputs(seed=6)
    Z[0] = X[3]  # one exactly coincident pair (r = 0)
    k = cls(lengthscale, 1.7)
    expected = _bessel_matern(X, Z, nu, lengthscale, 1.7)
    assert expected[3, 0] == pytest.approx(1.7)
    np.testing.assert_allclose(np.asarray(k(X, Z)), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(k(X)), _bessel_matern(X, X, nu, lengthscale, 1.7),
                               rtol=0, atol=1e-12)


def test_rational_quadratic_large_alpha_is_rbf():
    """RQ -> RBF as alpha -> inf with a rigorous bound.

    With x = r^2/(2 alpha): x - x^2/2 <= log(1+x) <= x, so
    RBF <= RQ <= RBF * exp(r^4 / (8 alpha)); for alpha = 1e6 the gap is at most
    max_r r^4 e^{-r^2/2} / (8 alpha) = 2 e^{-2} / alpha ~ 2.7e-7. We check the pointwise
    bound (plus 1e-14 for rounding) and that the gap is not identically zero.
    """
    X, Z = _inputs(seed=7)
    alpha, ell, v = 1e6, 0.9, 1.3
    rq = np.asarray(K.RationalQuadratic(ell, v, alpha=alpha)(X, Z))
    rbf = np.asarray(K.RBF(ell, v)(X, Z))
    r2 = np.sum((X[:, None, :] - Z[None, :, :]) ** 2, -1) / ell**2
    gap = rq - rbf
    upper = rbf * np.expm1(r2**2 / (8 * alpha))
    assert np.all(gap >= -1e-14)
    assert np.all(gap <= upper + 1e-14)
    assert np.max(np.abs(gap)) < 2 * math.exp(-2) / alpha * v + 1e-14
    assert np.max(gap) > 1e-9  # the two kernels really are different functions


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern32, K.Matern52,
                                 K.RationalQuadratic])
def test_ard_with_equal_lengthscales_equals_isotropic(cls):
    X, Z = _inputs(seed=8)
    iso, ard = cls(0.8, 1.4), cls(np.full(3, 0.8), 1.4)
    np.testing.assert_allclose(np.asarray(ard(X, Z)), np.asarray(iso(X, Z)), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(ard(X)), np.asarray(iso(X)), rtol=0, atol=1e-14)


def test_ard_lengthscale_scales_each_input_dimension():
    # Independent oracle for ARD: l_d rescales column d.
    X, Z = _inputs(seed=9)
    ard = K.Matern32(ARD3, 0.9)(X, Z)
    iso = K.Matern32(1.0, 0.9)(X / ARD3, Z / ARD3)
    np.testing.assert_allclose(np.asarray(ard), np.asarray(iso), rtol=0, atol=1e-13)


# --- positive semi-definiteness -------------------------------------------------------

# Hypothesis draws n <= 15 points in d <= 3 dimensions. To compile each kernel once (not
# once per shape) the points are zero-padded to 15 x 3 and the leading n x n block is
# tested: zero columns add exactly 0 to distances and dot products, and the leading block
# of k(padded) is k(X) up to rounding (the inputs are centred on the padded mean).
PSD_FACTORIES = {
    "rbf": lambda: K.RBF(0.6, 1.2),
    "rbf_ard": lambda: K.RBF(np.array([0.3, 0.9, 1.5])),
    "matern12": lambda: K.Matern12(0.5, 0.9),
    "matern32_ard": lambda: K.Matern32(np.array([0.4, 0.7, 1.1]), 1.1),
    "matern52": lambda: K.Matern52(0.7, 1.5),
    "rq": lambda: K.RationalQuadratic(0.5, 1.0, alpha=0.3),
    "periodic": lambda: K.Periodic(0.7, 1.0, period=0.9),
    "periodic_ard": lambda: K.Periodic(np.array([0.3, 0.7, 1.2]), period=np.array([0.5, 1, 2])),
    "linear": lambda: K.Linear(0.8),
    "polynomial": lambda: K.Polynomial(3, variance=0.5, offset=0.2),
    "constant": lambda: K.Constant(1.3),
    "white": lambda: K.White(0.2),
    "sum": lambda: K.Matern32(0.4) + K.Linear(0.3) + K.Periodic(0.8, period=1.3),
    "product": lambda: K.RBF(1.1) * K.Polynomial(2) * (0.5 * K.Matern12(0.9)),
}

_X_STRATEGY = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 15), st.integers(1, 3)),
    elements=st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False),
)


@functools.cache
def _psd_kernel(name):
    return PSD_FACTORIES[name]()


@eqx.filter_jit
def _gram_and_diag(k, X):
    return k(X), k.diag(X)


def _assert_psd(Kmat):
    Kmat = np.asarray(Kmat)
    assert np.all(np.isfinite(Kmat))
    scale = max(1.0, np.abs(Kmat).max())
    np.testing.assert_allclose(Kmat, Kmat.T, rtol=0, atol=1e-14 * scale)
    eig = np.linalg.eigvalsh(Kmat)
    assert eig.min() >= -1e-9 * max(1.0, np.trace(Kmat)), eig.min()


@pytest.mark.parametrize("name", list(PSD_FACTORIES))
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(X=_X_STRATEGY)
def test_kernel_matrix_is_psd(name, X):
    n, d = X.shape
    padded = np.zeros((15, 3))
    padded[:n, :d] = X
    Kfull, diag = _gram_and_diag(_psd_kernel(name), padded)
    Kmat = np.asarray(Kfull)[:n, :n]
    _assert_psd(Kmat)
    np.testing.assert_allclose(np.diag(Kmat), np.asarray(diag)[:n], rtol=1e-12)


def test_padding_used_by_psd_test_is_exact_enough():
    # The padded evaluation of the PSD test agrees with the direct one.
    X = np.random.default_rng(21).uniform(-3, 3, size=(7, 3))
    padded = np.zeros((15, 3))
    padded[:7] = X
    for name in ["matern12", "polynomial", "periodic"]:
        k = PSD_FACTORIES[name]()
        np.testing.assert_allclose(np.asarray(_gram_and_diag(k, padded)[0])[:7, :7],
                                   np.asarray(k(X)), rtol=1e-12, atol=1e-12)


def test_periodic_multidimensional_is_psd():
    """exp(-2 sin^2(pi ||x - z|| / p) / l^2) with a Euclidean distance is not PSD for d >= 2
    (min eigenvalue about -1.66 on this 3 x 5 grid); the product form is."""
    a, b = np.meshgrid(np.linspace(0.0, 1.0, 3), np.linspace(0.0, 1.0, 5))
    X = np.stack([a.ravel(), b.ravel()], -1)  # 15 points in [0, 1]^2
    assert np.linalg.eigvalsh(sk.ExpSineSquared()(X)).min() < -1.0  # the counterexample
    padded = np.zeros((15, 3))
    padded[:, :2] = X
    _assert_psd(_gram_and_diag(K.Periodic(), padded)[0])


def test_periodic_is_product_of_1d_exp_sine_squared():
    X, Z = _inputs(seed=22)
    ell, period, v = ARD3, np.array([1.7, 0.9, 2.5]), 1.3
    k = K.Periodic(ell, v, period=period)
    for A, B in [(X, Z), (X, X)]:
        expected = v * np.prod(
            [sk.ExpSineSquared(ell[j], period[j])(A[:, j : j + 1], B[:, j : j + 1])
             for j in range(3)], axis=0)
        out = k(A, B) if A is not B else k(A)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)
    # scalar lengthscale/period broadcast over dimensions
    np.testing.assert_allclose(
        np.asarray(K.Periodic(0.8, period=1.1)(X, Z)),
        np.asarray(K.Periodic(np.full(3, 0.8), period=np.full(3, 1.1))(X, Z)),
        rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(k.diag(X)), np.full(7, v), rtol=1e-14)


# --- gradients ------------------------------------------------------------------------

# Kernels are grouped into sums (one compilation per group): each component has its own
# hyperparameters, so a wrong hyperparameter gradient in any component still shows up in
# its own entries of the raw gradient.
GRAD_CASES = {
    "stationary": lambda: (
        K.RBF(ARD3, 0.8) + K.Matern12(0.7, 1.2) + K.Matern12(ARD3, 0.5)
        + K.Matern32(ARD3, 0.9) + K.Matern52(0.6, 1.1) + K.RationalQuadratic(0.9, 1.1, alpha=0.6)
    ),
    "periodic": lambda: (
        K.Periodic(0.8, 1.2, period=1.7) + K.Periodic(ARD3, 0.7, period=np.array([1.7, 0.9, 2.5]))
    ),
    "dot_product": lambda: (
        K.Linear(np.array([0.3, 1.0, 2.0])) + K.Polynomial(3, variance=0.7, offset=0.5)
        + K.Constant(1.7) + K.White(0.3)
    ),
    "product_scaled": lambda: 1.5 * (K.RBF(0.7) + K.Linear(0.4)) * K.Matern32(2.0) * 0.5,
}


def _fd_grad(f, x, h=1e-6):
    x = np.asarray(x, dtype=float)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (float(f(x + e)) - float(f(x - e))) / (2 * h)
    return g


def _assert_close_to_fd(g, fd):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(fd).max()))


def _dvalue_draw(p):
    """d value / d raw of a scalar Parameter (the derivative of exp or softplus)."""
    return float(jax.grad(p.transform.forward)(p.raw))


def _split(k):
    params, static = eqx.partition(k, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(params)
    return np.asarray(flat), lambda raw: eqx.combine(unravel(raw), static)


def _duplicated_inputs(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(5, 3))
    X = np.concatenate([X, X[[0, 2]]])  # duplicated rows
    Z = np.concatenate([X[[1, 2]], rng.normal(size=(3, 3))])  # shares rows with X
    return X, Z


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradient_matches_fd(name):
    """Reverse-mode gradient of a weighted sum of k(X, Z), k(X) and k.diag(X) w.r.t. the
    raw hyperparameters, X and Z, against central differences (step 1e-6); and finite
    gradients when X has duplicated rows and Z shares rows with X."""
    X, Z = _inputs(seed=10)
    rng = np.random.default_rng(11)
    W, Ws, w = rng.normal(size=(7, 5)), rng.normal(size=(7, 7)), rng.normal(size=7)
    raw0, build = _split(GRAD_CASES[name]())
    assert raw0.size >= 1

    def f(raw, x, z):
        k = build(raw)
        return jnp.sum(W * k(x, z)) + jnp.sum(Ws * k(x)) + jnp.sum(w * k.diag(x))

    vg = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))  # one compilation for both
    value = lambda *args: vg(*args)[0]
    g_raw, g_x, g_z = vg(raw0, X, Z)[1]
    _assert_close_to_fd(np.asarray(g_raw), _fd_grad(lambda r: value(r, X, Z), raw0))
    _assert_close_to_fd(np.asarray(g_x), _fd_grad(lambda x: value(raw0, x, Z), X))
    _assert_close_to_fd(np.asarray(g_z), _fd_grad(lambda z: value(raw0, X, z), Z))

    for g in vg(raw0, *_duplicated_inputs(seed=17))[1]:
        assert np.all(np.isfinite(np.asarray(g))), g


def test_filter_grad_applies_the_transform_chain_rule():
    # eqx.filter_grad w.r.t. the kernel gives d/d raw = d/d value * d value/d raw
    X, Z = _inputs(seed=12)
    W = np.random.default_rng(13).normal(size=(7, 5))
    k = K.RationalQuadratic(0.8, 1.1, alpha=0.6)
    g = eqx.filter_jit(eqx.filter_grad(lambda k: jnp.sum(W * k(X, Z))))(k)
    dvalue = _fd_grad(
        lambda e: np.sum(W * np.asarray(K.RationalQuadratic(float(e), 1.1, alpha=0.6)(X, Z))),
        np.asarray(0.8),
    )
    np.testing.assert_allclose(float(g.lengthscale.raw),
                               dvalue * _dvalue_draw(k.lengthscale), rtol=1e-6)


def test_matern12_gradient_at_coincident_points():
    """k(X) with duplicated rows: finite gradients equal to the analytic ones (entries at
    r = 0 contribute d v / d raw_v, nothing to raw_l and nothing to X)."""
    X, _ = _duplicated_inputs(seed=18)
    ell, v = 0.9, 1.4
    k = K.Matern12(ell, v)
    gX = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(k(x))))(jnp.asarray(X)))
    g = eqx.filter_jit(eqx.filter_grad(lambda k: jnp.sum(k(X))))(k)
    r = np.sqrt(np.sum((X[:, None, :] - X[None, :, :]) ** 2, -1))
    e = np.exp(-r / ell)
    np.testing.assert_allclose(float(g.variance.raw), _dvalue_draw(k.variance) * e.sum(),
                               rtol=1e-12)
    np.testing.assert_allclose(float(g.lengthscale.raw),
                               _dvalue_draw(k.lengthscale) * np.sum(v * r / ell**2 * e),
                               rtol=1e-10)
    # d/dx_i sum_jk k(x_j, x_k) = 2 sum_j dk(x_i, x_j)/dx_i, zero for x_j == x_i
    with np.errstate(invalid="ignore", divide="ignore"):
        unit = np.where(r[..., None] > 0, (X[:, None, :] - X[None, :, :]) / r[..., None], 0.0)
    expected = -2 * v / ell * np.sum(e[..., None] * unit, axis=1)
    assert np.all(np.isfinite(gX))
    np.testing.assert_allclose(gX, expected, rtol=1e-9, atol=1e-12)


# --- bad input ------------------------------------------------------------------------

PARAM_CASES = [
    (K.RBF, "lengthscale"), (K.RBF, "variance"),
    (K.Matern12, "lengthscale"), (K.Matern32, "variance"), (K.Matern52, "lengthscale"),
    (K.RationalQuadratic, "lengthscale"), (K.RationalQuadratic, "variance"),
    (K.RationalQuadratic, "alpha"),
    (K.Periodic, "lengthscale"), (K.Periodic, "variance"), (K.Periodic, "period"),
    (K.Linear, "variance"), (K.Polynomial, "variance"), (K.Polynomial, "offset"),
    (K.Constant, "variance"), (K.White, "variance"),
]


@pytest.mark.parametrize("cls, pname", PARAM_CASES,
                         ids=[f"{c.__name__}-{p}" for c, p in PARAM_CASES])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), -0.0],
                         ids=["zero", "neg", "nan", "inf", "negzero"])
def test_bad_parameter_raises_value_error(cls, pname, bad):
    with pytest.raises(ValueError, match=pname):
        cls(**{pname: bad})


@pytest.mark.parametrize("bad", [[1.0, -0.5, 2.0], [1.0, float("nan"), 2.0], [0.0, 1.0, 1.0]])
def test_bad_ard_entry_raises(bad):
    with pytest.raises(ValueError, match="lengthscale"):
        K.Matern32(lengthscale=bad)
    with pytest.raises(ValueError, match="variance"):
        K.Linear(variance=bad)


def test_nonpositive_scale_raises():
    with pytest.raises(ValueError, match="scale"):
        _ = 0.0 * K.RBF()
    with pytest.raises(ValueError, match="scale"):
        _ = K.RBF() * -2.0


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern52, K.RationalQuadratic])
def test_ard_lengthscale_wrong_length_raises(cls):
    X, Z = _inputs(seed=19)
    k = cls(lengthscale=[1.0, 2.0])  # X has 3 columns
    with pytest.raises(ValueError, match="lengthscale"):
        k(X)
    with pytest.raises(ValueError, match="lengthscale"):
        k(X, Z)


def test_periodic_ard_wrong_length_raises():
    X, Z = _inputs(seed=19)
    for kw in [{"lengthscale": [1.0, 2.0]}, {"period": [1.0, 2.0]}]:
        k = K.Periodic(**kw)
        with pytest.raises(ValueError):
            k(X)
        with pytest.raises(ValueError):
            k(X, Z)


def test_lengthscale_must_be_at_most_1d():
    with pytest.raises(ValueError, match="lengthscale"):
        K.RBF(lengthscale=np.ones((2, 2)))
    with pytest.raises(ValueError, match="lengthscale"):
        K.Periodic(lengthscale=np.ones((2, 2)))
    with pytest.raises(ValueError, match="period"):
        K.Periodic(period=np.ones((3, 1)))


@pytest.mark.parametrize("degree", [0, 2.5, -1, 0.5])
def test_polynomial_bad_degree_raises(degree):
    with pytest.raises(ValueError, match="degree"):
        K.Polynomial(degree)


def test_polynomial_integer_valued_float_degree_accepted():
    X, Z = _inputs(seed=20)
    a, b = K.Polynomial(3.0, offset=0.5), K.Polynomial(3, offset=0.5)
    assert a.degree == 3 and isinstance(a.degree, int)
    np.testing.assert_array_equal(np.asarray(a(X, Z)), np.asarray(b(X, Z)))


# --- the kernel hooks: one abstract method ----------------------------------------------


def test_a_kernel_without_evaluate_fails_at_construction():
    class NoHook(K.Kernel):
        pass

    with pytest.raises(TypeError, match="abstract.*evaluate"):
        NoHook()


def test_a_stationary_kernel_without_profile_fails_at_construction():
    class NoProfile(K.Stationary):
        pass

    with pytest.raises(TypeError, match="abstract.*profile"):
        NoProfile()


def test_a_kernel_defining_evaluate_works_and_gets_its_diagonal():
    class Scaled2(K.Kernel):
        def evaluate(self, X, Z, symmetric):
            return 2.0 * (X @ Z.T)

    k = Scaled2()
    X = jnp.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(k(X), 2.0 * X @ X.T)
    np.testing.assert_allclose(k(X, X[:2]), 2.0 * X @ X[:2].T)
    np.testing.assert_allclose(k.diag(X), 2.0 * jnp.sum(X**2, -1))  # default evaluate_diag
    assert k.diag(jnp.zeros((0, 2))).shape == (0,)
    with pytest.raises(ValueError, match="columns"):
        k(X, jnp.ones((2, 3)))  # the base class validates for it
    np.testing.assert_allclose((k + K.Linear())(X), 3.0 * X @ X.T)


@pytest.mark.parametrize("name", ["RBF", "Matern12", "Matern32", "Matern52",
                                  "RationalQuadratic", "Periodic", "Linear", "Polynomial",
                                  "Constant", "White"])
def test_the_closed_form_diagonals_match_the_default(name):
    k = getattr(K, name)()
    X = jnp.linspace(-1.0, 2.0, 8).reshape(4, 2)
    np.testing.assert_allclose(k.diag(X), K.Kernel.evaluate_diag(k, X), rtol=1e-12)
