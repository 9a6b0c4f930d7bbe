"""The kernel / mean / parameter boundary under adversarial input (issue 24): every bad
input is a TypeError / ValueError naming the argument, every valid input a finite result
equal to the closed form, eagerly and under jit / vmap / grad."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import augmentedgp as agp
from augmentedgp import kernels as K
from augmentedgp.core import params as P
from augmentedgp.kernels import means as M

RNG = np.random.default_rng(2024)
X = RNG.normal(size=(7, 2))
Z = RNG.normal(size=(4, 2))


# --- closed forms, pairwise in numpy (no matrix-product expansion) ------------------------


def _r2(A, B, ls):
    D = (A[:, None, :] - B[None, :, :]) / ls
    return np.sum(D**2, -1)


def _matern(r, nu):
    if nu == 0.5:
        return np.exp(-r)
    if nu == 1.5:
        return (1 + math.sqrt(3) * r) * np.exp(-math.sqrt(3) * r)
    return (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)


def _reference(name, A, B, ls=1.3, v=0.8):
    """k(A, B) in closed form [Rasmussen2006, eqs. 4.9, 4.14, 4.19, 4.31]."""
    ls = np.asarray(ls)
    if name == "RBF":
        return v * np.exp(-0.5 * _r2(A, B, ls))
    if name.startswith("Matern"):
        nu = {"Matern12": 0.5, "Matern32": 1.5, "Matern52": 2.5}[name]
        return v * _matern(np.sqrt(_r2(A, B, ls)), nu)
    if name == "RationalQuadratic":
        return v * (1 + _r2(A, B, ls) / (2 * 0.6)) ** -0.6
    if name == "Periodic":
        s = np.sin(math.pi * (A[:, None, :] - B[None, :, :]) / 0.9) / ls
        return v * np.exp(-2 * np.sum(s**2, -1))
    if name == "Linear":
        return (A * ls) @ B.T
    if name == "Polynomial":
        return (v * A @ B.T + 0.5) ** 3
    if name == "Constant":
        return np.full((len(A), len(B)), v)
    raise KeyError(name)


def _kernel(name, ls=1.3, v=0.8):
    return {"RBF": lambda: K.RBF(ls, v), "Matern12": lambda: K.Matern12(ls, v),
            "Matern32": lambda: K.Matern32(ls, v), "Matern52": lambda: K.Matern52(ls, v),
            "RationalQuadratic": lambda: K.RationalQuadratic(ls, v, 0.6),
            "Periodic": lambda: K.Periodic(ls, v, 0.9), "Linear": lambda: K.Linear(ls),
            "Polynomial": lambda: K.Polynomial(3, v, 0.5),
            "Constant": lambda: K.Constant(v)}[name]()


NAMES = ["RBF", "Matern12", "Matern32", "Matern52", "RationalQuadratic", "Periodic", "Linear",
         "Polynomial", "Constant"]
ARD = [1.3, np.array([0.7, 2.1])]


# --- 1. inputs: one validation in Kernel.__call__ / diag ---------------------------------

BAD_INPUTS = [
    # (id, X, Z, exception, message pattern)
    ("X 1-D", X[:, 0], None, ValueError, r"X must be 2-D .*reshape\(-1, 1\)"),
    ("X 0-d", np.float64(1.0), None, ValueError, r"X must be 2-D .*shape \(\)"),
    ("X 3-D", X[:, :, None], None, ValueError, r"X must be 2-D .*\(7, 2, 1\)"),
    ("Z 1-D", X, Z[:, 0], ValueError, r"Z must be 2-D"),
    ("Z columns", X, Z[:, :1], ValueError, r"Z must have as many columns as X: X has 2, Z "
                                           r"has 1"),
    ("X no columns", np.zeros((3, 0)), None, ValueError, r"X must have at least one column"),
    ("X str", X.astype(str), None, TypeError, r"X must be real-valued"),
    ("Z complex", X, Z + 1j, TypeError, r"Z must be real-valued"),
    ("X object of str", np.array([["a", 1.0]], dtype=object), None, TypeError,
     r"X must be a real numeric array"),
    ("X ragged list", [[1.0, 2.0], [1.0]], None, TypeError, r"X must be a real numeric array"),
    ("X datetime", np.array([["2020-01-01"]], dtype="datetime64[D]"), None, TypeError,
     r"X must be real-valued"),
    ("X nan", np.where(X > 1.0, np.nan, X), None, ValueError, r"X contains NaN or inf"),
    ("X inf", np.where(X > 1.0, np.inf, X), None, ValueError, r"X contains NaN or inf"),
    ("Z -inf", X, np.where(Z > 0.5, -np.inf, Z), ValueError, r"Z contains NaN or inf"),
]


@pytest.mark.parametrize("name", NAMES + ["White", "Sum", "Product", "Scaled"])
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_a_typed_error_naming_the_argument(name, case):
    _, A, B, exc, pattern = case
    k = {"White": lambda: K.White(), "Sum": lambda: K.RBF() + K.Linear(),
         "Product": lambda: K.Matern32() * K.Periodic(),
         "Scaled": lambda: 2.0 * K.Polynomial()}.get(name, lambda: _kernel(name, ls=1.0))()
    with pytest.raises(exc, match=pattern):
        k(A, B)
    if B is None:  # diag validates the same way
        with pytest.raises(exc, match=pattern):
            k.diag(A)


ARD_MISMATCH = [
    ("RBF lengthscale", lambda: K.RBF([1.0, 2.0, 3.0]), r"ARD lengthscale has 3 entries"),
    ("Matern52 in a sum", lambda: K.Linear() + K.Matern52([1.0, 2.0, 3.0]),
     r"ARD lengthscale has 3 entries"),
    ("Periodic period", lambda: K.Periodic(period=[1.0, 2.0, 3.0]), r"ARD period has 3"),
    ("Periodic lengthscale", lambda: 3.0 * K.Periodic([1.0, 2.0, 3.0]), r"ARD lengthscale"),
    ("Linear variance", lambda: K.Linear([1.0, 2.0, 3.0]) * K.RBF(), r"ARD variance has 3"),
]


@pytest.mark.parametrize("make, pattern", [c[1:] for c in ARD_MISMATCH],
                         ids=[c[0] for c in ARD_MISMATCH])
def test_ard_length_is_checked_against_the_columns(make, pattern):
    k = make()
    for call in (lambda: k(X), lambda: k(X, Z), lambda: k.diag(X)):
        with pytest.raises(ValueError, match=pattern + r".* but X has 2 columns"):
            call()


CONVERTED = [("list", X.tolist()), ("int", np.round(3 * X).astype(np.int64)),
             ("bool", X > 0), ("object of floats", X.astype(object)),
             ("float32", X.astype(np.float32))]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind, A", CONVERTED, ids=[c[0] for c in CONVERTED])
def test_lists_and_integer_inputs_are_converted(name, kind, A):
    k = _kernel(name)
    ref = _reference(name, np.asarray(A, dtype=float), Z)
    rtol = 1e-5 if kind == "float32" else 1e-12
    np.testing.assert_allclose(np.asarray(k(A, Z)), ref, rtol=rtol, atol=rtol * 1e-2)


def test_no_rows_gives_an_empty_matrix():
    E = np.zeros((0, 2))
    assert K.RBF()(E, Z).shape == (0, 4) and K.Matern32()(E).shape == (0, 0)
    assert K.Linear().diag(E).shape == (0,)


# --- valid inputs: unchanged values, eagerly and compiled ---------------------------------


@pytest.mark.parametrize("ls", ARD, ids=["iso", "ard"])
@pytest.mark.parametrize("name", NAMES)
def test_valid_calls_match_the_closed_form(name, ls):
    k = _kernel(name, ls)
    for got, ref in ((k(X, Z), _reference(name, X, Z, ls)),
                     (k(X), _reference(name, X, X, ls)),
                     (k.diag(X), np.diag(_reference(name, X, X, ls)))):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-13)
    jitted = jax.jit(lambda k, A, B: (k(A, B), k(A), k.diag(A)))(k, X, Z)
    for got, want in zip(jitted, (k(X, Z), k(X), k.diag(X)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)


def test_vmap_over_a_batch_of_inputs_matches_the_loop():
    batch = RNG.normal(size=(3, 5, 2))
    k = K.Matern52([0.8, 1.7]) + K.Linear(0.3)
    out = jax.vmap(lambda A: k(A, Z))(batch)
    for b in range(3):
        np.testing.assert_allclose(np.asarray(out[b]), np.asarray(k(batch[b], Z)), rtol=1e-13)


def test_static_checks_fire_under_jit_and_value_checks_are_skipped():
    f = jax.jit(lambda A, B: K.RBF()(A, B))
    with pytest.raises(ValueError, match="Z must have as many columns as X"):
        f(X, Z[:, :1])
    with pytest.raises(ValueError, match="X must be 2-D"):
        f(X[:, 0], Z)
    # a traced NaN is not inspected (no ConcretizationTypeError, no host sync): the compiled
    # function propagates it
    out = f(np.where(X > 1.0, np.nan, X), Z)
    assert np.isnan(np.asarray(out)).any()


def test_gradient_wrt_inputs_matches_finite_differences():
    k = K.Matern32([0.9, 1.4], 1.2)
    g = np.asarray(jax.grad(lambda A: jnp.sum(k(A, Z) ** 2))(X))
    h = 1e-6
    for i, j in [(0, 0), (3, 1), (6, 0)]:
        E = np.zeros_like(X)
        E[i, j] = h
        fd = (np.sum(np.asarray(k(X + E, Z)) ** 2) - np.sum(np.asarray(k(X - E, Z)) ** 2)) / 2 / h
        np.testing.assert_allclose(g[i, j], fd, rtol=1e-7)


def test_training_through_a_jitted_loss_still_works():
    """The marginal likelihood's gradient is finite and matches finite differences: the
    boundary adds nothing inside the trace (an oracle on the kernel's gradient)."""
    y = np.sin(X[:, 0]) + 0.1 * RNG.normal(size=len(X))

    def nll(raw):
        k = K.RBF(P.Parameter(raw, P.Exp()), 1.0)
        C = k(X) + 0.1 * jnp.eye(len(X))
        L = jnp.linalg.cholesky(C)
        a = jax.scipy.linalg.cho_solve((L, True), y)
        return 0.5 * y @ a + jnp.sum(jnp.log(jnp.diag(L)))

    raw = jnp.log(jnp.array(1.3))
    g = float(jax.jit(jax.grad(nll))(raw))
    fd = (nll(raw + 1e-6) - nll(raw - 1e-6)) / 2e-6
    assert np.isfinite(g) and g == pytest.approx(float(fd), rel=1e-6)


# --- 1b. huge but finite inputs: computed stably, or a typed error naming X --------------

SCALE = 2.0**900  # a power of two: k(c X; c l) == k(X; l) exactly in exact arithmetic


@pytest.mark.parametrize("name", ["RBF", "Matern12", "Matern32", "Matern52",
                                  "RationalQuadratic"])
def test_stationary_kernels_are_scale_invariant_up_to_1e300(name):
    ls = np.array([0.7, 2.1])
    want = np.asarray(_kernel(name, ls)(X, Z))
    k_big = _kernel(name, ls * SCALE)
    np.testing.assert_allclose(np.asarray(k_big(X * SCALE, Z * SCALE)), want, rtol=1e-12,
                               atol=1e-15)
    np.testing.assert_allclose(np.asarray(k_big(X * SCALE)), np.asarray(_kernel(name, ls)(X)),
                               rtol=1e-12, atol=1e-15)
    # gradient wrt the inputs scales by 1/c (the rescaling is outside the derivative)
    g = jax.grad(lambda A: jnp.sum(_kernel(name, ls)(A, Z)))(X)
    g_big = jax.grad(lambda A: jnp.sum(k_big(A, Z * SCALE)))(X * SCALE)
    np.testing.assert_allclose(np.asarray(g_big) * SCALE, np.asarray(g), rtol=1e-10,
                               atol=1e-14)


FAR = np.array([[0.0, 0.0], [1e307, -1e307], [-1e307, 0.3]])  # pairs ~1e307 apart
NEAR = np.array([[0.3, 0.1], [0.2, 0.4], [0.25, 0.45]])  # distinct, not whole periods apart
UNCORRELATED = [
    ("rbf", lambda: K.RBF(), FAR), ("m12", lambda: K.Matern12(), FAR),
    ("m32", lambda: K.Matern32(), FAR), ("m52", lambda: K.Matern52(), FAR),
    ("rq", lambda: K.RationalQuadratic(), FAR),
    ("rbf-tiny-l", lambda: K.RBF(lengthscale=1e-300), NEAR),
    ("m52-tiny-l", lambda: K.Matern52(lengthscale=1e-300), NEAR),
    ("periodic-tiny-l", lambda: K.Periodic(lengthscale=1e-300), NEAR),
]


@pytest.mark.parametrize("make, pts", [c[1:] for c in UNCORRELATED],
                         ids=[c[0] for c in UNCORRELATED])
def test_points_beyond_the_float_range_apart_are_uncorrelated(make, pts):
    """r^2 beyond the float range: the closed form is exactly v on the diagonal and 0 off it
    (previously r^2 = inf - inf = NaN was clipped to 0, correlation 1, or became NaN)."""
    out = np.asarray(make()(pts))
    np.testing.assert_array_equal(out, np.eye(len(pts)))
    np.testing.assert_array_equal(np.asarray(make()(pts, pts[:1])), np.eye(len(pts))[:, :1])


def test_rational_quadratic_with_tiny_alpha_tends_to_one():
    """(1 + r^2 / (2 alpha))^-alpha -> 1 as alpha -> 0; r^2 / (2 alpha) overflows."""
    out = np.asarray(K.RationalQuadratic(alpha=1e-300)(X * 100.0))
    np.testing.assert_allclose(out, 1.0, rtol=0, atol=1e-14)


OVERFLOW = [
    ("Polynomial 1e150", lambda: K.Polynomial(), X * 1e150, r"X's scale overflows the "
     r"kernel: Polynomial .*max \|X\|(, \|Z\|)? = \d"),
    ("Linear 1e200", lambda: K.Linear(), X * 1e200, r"X's scale overflows the kernel: Linear"),
    ("Polynomial degree 1000", lambda: K.Polynomial(1000), X * 10, r"X's scale overflows.*"
     r"degree=1000"),
    ("in a sum", lambda: K.RBF() + K.Polynomial(), X * 1e200, r"X's scale .*k2\.offset=1\.0"),
]


@pytest.mark.parametrize("make, A, pattern", [c[1:] for c in OVERFLOW],
                         ids=[c[0] for c in OVERFLOW])
def test_overflow_of_a_finite_input_names_x(make, A, pattern):
    k = make()
    with pytest.raises(ValueError, match=pattern):
        k(A)
    with pytest.raises(ValueError, match=pattern):
        k(A, A[:2])
    with pytest.raises(ValueError, match=pattern):
        k.diag(A)
    assert np.all(np.isfinite(np.asarray(k(A[:, :1] * 0.0 + 0.1))))  # the kernel itself is fine


# --- 2 and 3. hyperparameter values and shapes --------------------------------------------

BAD_VALUES = [
    (1 + 1j, TypeError, "real-valued"), ("0.1", TypeError, "real number"),
    (None, TypeError, "real number"), (True, TypeError, "real number"),
    (np.array(["a"]), TypeError, "real-valued"), ([1.0, "a"], TypeError, "real-valued"),
    ([[1.0], [1.0, 2.0]], TypeError, "real number or array"),
    (float("nan"), ValueError, "must be finite"), (float("-inf"), ValueError, "must be finite"),
    (np.zeros(0), ValueError, "must not be empty"),
]


@pytest.mark.parametrize("make", [P.positive, P.real], ids=["positive", "real"])
@pytest.mark.parametrize("bad, exc, pattern", BAD_VALUES,
                         ids=[repr(b[0])[:20] for b in BAD_VALUES])
def test_parameter_values_are_checked_and_named(make, bad, exc, pattern):
    with pytest.raises(exc, match=f"my_param must .*{pattern}|my_param {pattern}"):
        make(bad, "my_param")
    with pytest.raises(exc, match="a parameter value"):  # callers that pass no name
        make(bad)


@pytest.mark.parametrize("make", [P.positive, P.real], ids=["positive", "real"])
def test_max_ndim_limits_the_shape(make):
    assert make(2.0, "s", max_ndim=0).raw.shape == ()
    assert make([1.0, 2.0], "v", max_ndim=1).raw.shape == (2,)
    with pytest.raises(ValueError, match=r"s must be a scalar, got shape \(2,\)"):
        make([1.0, 2.0], "s", max_ndim=0)
    with pytest.raises(ValueError, match=r"v must be a scalar or an array of at most 1 "
                                         r"dimension, got shape \(2, 2\)"):
        make(np.ones((2, 2)), "v", max_ndim=1)
    given = make(np.ones(3), "v")
    assert make(given, "v", max_ndim=1) is given
    with pytest.raises(ValueError, match=r"s must be a scalar, got shape \(3,\)"):
        make(given, "s", max_ndim=0)  # a Parameter passed as is: its shape is checked too


SCALARS = [
    (K.RBF, "variance"), (K.Matern12, "variance"), (K.Matern32, "variance"),
    (K.Matern52, "variance"), (K.RationalQuadratic, "variance"), (K.RationalQuadratic, "alpha"),
    (K.Periodic, "variance"), (K.Polynomial, "variance"), (K.Polynomial, "offset"),
    (K.Constant, "variance"), (K.White, "variance"), (M.Constant, "c"),
]


@pytest.mark.parametrize("cls, pname", SCALARS, ids=[f"{c.__name__}-{p}" for c, p in SCALARS])
def test_scalar_hyperparameters_reject_vectors_at_construction(cls, pname):
    with pytest.raises(ValueError, match=rf"{pname} must be a scalar, got shape \(2,\)"):
        cls(**{pname: [0.1, 0.2]})
    with pytest.raises(TypeError, match=rf"{pname} must be real-valued"):
        cls(**{pname: 1 + 1j})
    with pytest.raises(ValueError, match=rf"{pname} must be a scalar"):
        cls(**{pname: P.positive(np.ones(2), pname)})


def test_other_scalars_and_vectors():
    with pytest.raises(ValueError, match=r"scale must be a scalar"):
        _ = K.RBF() * [1.0, 2.0]
    with pytest.raises(TypeError, match="scale must be a real number"):
        _ = "2" * K.RBF()
    with pytest.raises(ValueError, match=r"bias must be a scalar"):
        M.Linear([1.0, 2.0], bias=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"lengthscale must be a scalar or an array of at "
                                         r"most 1 dimension"):
        K.Matern32(lengthscale=np.ones((2, 2)))
    with pytest.raises(TypeError, match="k2 must be a Kernel"):
        K.Sum(K.RBF(), 3.0)
    with pytest.raises(TypeError, match="kernel must be a Kernel"):
        K.Scaled("rbf", 2.0)
    with pytest.raises(TypeError, match="unsupported operand"):
        _ = K.RBF() + 1.0
    # ARD vectors of any length are accepted at construction (checked against d at call)
    assert K.Linear([1.0, 2.0, 3.0]).variance.raw.shape == (3,)
    assert K.Periodic(period=[1.0, 2.0, 3.0, 4.0]).period.raw.shape == (4,)


# --- mean functions share the input checks -----------------------------------------------

MEANS = [("zero", M.Zero()), ("constant", M.Constant(0.4)),
         ("linear", M.Linear([0.5, -1.0], 0.2))]


@pytest.mark.parametrize("mean", [m for _, m in MEANS], ids=[n for n, _ in MEANS])
@pytest.mark.parametrize("case", [c for c in BAD_INPUTS if c[2] is None],
                         ids=[c[0] for c in BAD_INPUTS if c[2] is None])
def test_mean_functions_validate_x(mean, case):
    _, A, _, exc, pattern = case
    with pytest.raises(exc, match=pattern):
        mean(A)


def test_mean_functions_values_and_overflow():
    m = M.Linear([0.5, -1.0], 0.2)
    np.testing.assert_allclose(np.asarray(m(X.tolist())), X @ [0.5, -1.0] + 0.2, rtol=1e-14)
    jitted = jax.jit(lambda A: m(A))(X)
    np.testing.assert_allclose(np.asarray(jitted), X @ [0.5, -1.0] + 0.2, rtol=1e-14)
    assert np.asarray(M.Constant(0.4)(X > 0)).tolist() == [0.4] * len(X)
    with pytest.raises(ValueError, match="X's scale overflows the mean function Linear"):
        M.Linear([1e300, 1e300])(np.full((2, 2), 1e300))


def test_gp_fit_through_the_public_api_is_unaffected():
    """End to end: an exact GP's predictive mean on a noiseless grid equals the closed form
    K*(K + s I)^-1 y (the validated kernel is used inside the model's compiled code)."""
    Xt = np.linspace(-2, 2, 9)[:, None]
    y = np.sin(Xt[:, 0])
    k = K.RBF(P.fixed(P.positive(0.8)), P.fixed(P.positive(1.0)))
    model = agp.GP(k, noise=P.fixed(P.positive(0.01)))
    Xs = np.array([[0.25], [1.1]])
    Kxx = _reference("RBF", Xt, Xt, 0.8, 1.0) + 0.01 * np.eye(9)
    want = _reference("RBF", Xs, Xt, 0.8, 1.0) @ np.linalg.solve(Kxx, y)
    mean = model.posterior(Xt, y).predict_f(Xs)[0]
    np.testing.assert_allclose(np.asarray(mean), want, rtol=1e-9)
