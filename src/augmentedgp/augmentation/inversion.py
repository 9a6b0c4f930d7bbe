"""The tilted mixing law pi(w | c) of any super-Gaussian likelihood, from phi alone.

[Galy-Fajou2020, Sec. 3.3.2] sample the Gibbs conditional of w, pi(w | c) = e^{-c^2 w} p(w) /
phi(c^2), where p(w) is the inverse Laplace transform of phi and has no closed form in
general, by numerical inversion ([Ridout2009]):

- the CDF F(x) and the density f(x) of pi(w | c) are the inverse Laplace transforms of
  phi(s + c^2) / (s phi(c^2)) and phi(s + c^2) / phi(c^2), computed by the Euler algorithm
  of [Abate2000] (trapezoid rule on the Bromwich contour, Re s = A / (2x), and Euler
  summation of the alternating tail): ``tilted_cdf``;
- a draw solves F(w) = u, u ~ U(0, 1), by Newton's method safeguarded by bisection
  ([Ridout2009]), here in log w (the laws span many decades as c varies): ``sample``.

Accuracy ([Abate2000]): the discretisation error of the CDF is below
e^{-A} / (1 - e^{-A}) = 1.0e-8 with A = 18.4, and the Euler summation of n + m + 1 = 39 terms
leaves errors of the same order (tests/test_super_gaussian.py: < 6e-8 against the exact
Gamma, Levy, inverse-Gaussian, GIG and exponential CDFs; 15 terms instead of 27 left 5e-6 on
the inverse Gaussian at c = 30). The root is found to 1e-8 in log w or |F - u| < 1e-12, so
the draws follow a law whose CDF is within ~1e-7 of the exact one. Cost: 39 complex
evaluations of log phi per Newton step, 3-4 steps per draw on average; about 1e4-8e4 draws
per second on one CPU core, 12-360x slower than the exact samplers of the built-in
likelihoods (benchmarks/tilted.py, RESULTS.md).

phi must be given as ``log_phi(t)``, written so that it also evaluates at complex t with
Re t > 0 (jnp.sqrt, jnp.log1p, jnp.power, ...: the analytic continuation of phi, which the
Bromwich integral needs); :func:`check_phi` tests that, and that phi is admissible
(phi(0) = 1, completely monotone).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.jet import jet
from jax.scipy.special import ndtri
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from augmentedgp.core.quadrature import euler_inversion_rule

__all__ = ["check_phi", "log_mixing_density", "sample", "tilted_cdf"]

# [Abate2000]: A sets the discretisation error e^{-A}; n terms then Euler (binomial)
# averaging of the next m partial sums.
_A, _N, _M = 18.4, 27, 11
_TOL_LOG_W = 1e-8  # the accuracy of the root in log w (module doc),
_TOL_CDF = 1e-12  # or |F(w) - u| is (the CDF itself is accurate to ~1e-8)
_MAX_STEPS = 100
# the signed weights and imaginary parts (pi k) of the terms a_0..a_{n+m} of the Euler sum;
# numpy constants: a JAX array here would start JAX's backend and compile at import
_WEIGHTS, _IM = euler_inversion_rule(_N, _M)


def tilted_cdf(log_phi: Callable, c2: Float[ArrayLike, "*batch"], x: Float[ArrayLike, "*batch"]
              ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
    """(F(x), f(x)): the CDF and density at x > 0 of pi(w | c) ~ e^{-c^2 w} p(w), where phi
    (``log_phi``, elementwise and analytic for Re t > 0) is the Laplace transform of p(w)
    ([Abate2000] Euler inversion; module doc). ``c2`` = c^2 >= 0 and ``x`` broadcast."""
    c2, x = jnp.broadcast_arrays(jnp.asarray(c2, float), jnp.asarray(x, float))
    s = (_A + 2j * _IM) / (2.0 * x[..., None])  # the Bromwich contour, Re s = A / (2x)
    ratio = jnp.exp(log_phi(s + c2[..., None]) - log_phi(c2)[..., None])  # L{f}(s)
    scale = math.exp(0.5 * _A) / x
    density = scale * jnp.sum(_WEIGHTS * jnp.real(ratio), -1)
    cdf = scale * jnp.sum(_WEIGHTS * jnp.real(ratio / s), -1)  # L{F}(s) = L{f}(s) / s
    return cdf, density


def log_mixing_density(log_phi: Callable, w: Float[ArrayLike, ""]) -> Float[Array, ""]:
    """log p(w) at w > 0 (scalar), p the inverse Laplace transform of phi. The inversion's
    error is absolute (~1e-8 of the density's peak), so in the left tail p(w) is computed
    through the tilted law whose mean is w: p(w) = phi(t0) e^{t0 w} pi(w | t0) with
    -d log phi / dt (t0) = w (t0 = 0 right of the mean of p), which keeps the error
    relative. -inf where the estimate is not positive."""
    return _log_mixing_density(log_phi, w)  # one program (its loop and ops; cf. ``sample``)


@functools.partial(jax.jit, static_argnums=0)
def _log_mixing_density(log_phi, w):
    mean_at = jax.grad(lambda t: -log_phi(t))

    def bisect(_, bounds):  # E[w | t] decreases in t: bisection in log t
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        above = mean_at(jnp.exp(mid)) > w
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = lax.fori_loop(0, 80, bisect, (jnp.asarray(-40.0), jnp.asarray(40.0)))
    t0 = jnp.where(mean_at(jnp.exp(-40.0)) > w, jnp.exp(0.5 * (lo + hi)), 0.0)
    _, dens = tilted_cdf(log_phi, t0, w)
    ok = dens > 0.0
    return jnp.where(ok, log_phi(t0) + t0 * w + jnp.log(jnp.where(ok, dens, 1.0)), -jnp.inf)


def _newton(log_phi: Callable, c2, u, state, args):
    """One step, on every entry, of Newton's method for F(e^z) = u in z = log w,
    safeguarded by bisection once a bracket [lo, hi] of the root is known and by steps of at
    most 3 in z before ([Ridout2009]); an entry stops when its Newton step is below
    sqrt(``_TOL_LOG_W``) (the step is taken) or |F - u| below ``_TOL_CDF``."""
    z, lo, hi, done = state
    cdf_pdf = lambda c, x, *a: tilted_cdf(lambda t: log_phi(t, *a), c, x)
    cdf, dens = jax.vmap(cdf_pdf)(c2, jnp.exp(z), *args)
    val, slope = cdf - u, jnp.exp(z) * dens
    lo, hi = jnp.where(val < 0.0, z, lo), jnp.where(val < 0.0, hi, z)
    newton = z - val / slope
    ok = (slope > 0.0) & (newton > lo) & (newton < hi) & (jnp.abs(newton - z) <= 3.0)
    bracketed = jnp.isfinite(lo) & jnp.isfinite(hi)
    fallback = jnp.where(bracketed, 0.5 * (lo + hi), jnp.where(val < 0.0, z + 3.0, z - 3.0))
    z_new = jnp.where(ok, newton, fallback)
    # Newton converges quadratically: after a step below sqrt(_TOL_LOG_W) the next one would
    # be below _TOL_LOG_W, so that step is taken and the entry stops
    converged = ok & (jnp.abs(newton - z) < math.sqrt(_TOL_LOG_W))
    hit = jnp.abs(val) < _TOL_CDF
    z_out = jnp.where(done | (hit & ~converged), z, z_new)
    return z_out, lo, hi, done | converged | hit


def _start(mean, var, k3, u):
    """A first guess of log w at the quantile u: w^lam taken as normal, with lam = 1 - r/3
    (r = skewness / coefficient of variation) making its skewness vanish to first order
    (lam = 1/3 for a gamma law: Wilson-Hilferty; lam -> 0, log-normal, for an inverse
    Gaussian), mean and sd by the delta method. 0 where the moments are not finite (the Levy
    law has no mean)."""
    cv2 = var / mean**2
    r = k3 / (var * mean)  # skewness / CV = k3 / var^1.5 * mean / sqrt(var)
    lam = jnp.clip(1.0 - r / 3.0, -1.0, 1.0)
    q = ndtri(u)
    log_normal = jnp.log(mean) - 0.5 * jnp.log1p(cv2) + jnp.sqrt(jnp.log1p(cv2)) * q
    small = jnp.abs(lam) < 0.05
    lam_s = jnp.where(small, 1.0, lam)
    y = 1.0 + 0.5 * lam_s * (lam_s - 1.0) * cv2 + jnp.abs(lam_s) * jnp.sqrt(cv2) * q  # (w/mean)^lam
    power = jnp.log(mean) + jnp.log(jnp.where(y > 0.0, y, 1.0)) / lam_s
    z = jnp.where(small | (y <= 0.0), log_normal, power)
    return jnp.where(jnp.isfinite(z), z, 0.0)


def sample(key: PRNGKeyArray, log_phi: Callable, c2: Float[ArrayLike, "*batch"], *args
          ) -> Float[Array, "*batch"]:
    """Draws of w ~ pi(w | c), one per entry of ``c2`` = c^2, by inverse-CDF sampling with
    the numerical CDF (module doc). ``log_phi(t, *args)`` is log phi for one entry, ``args``
    its parameters (arrays broadcast against ``c2``). Where the law is a point mass
    (Var w = d^2 log phi / dt^2 = 0, e.g. phi(t) = e^{-t}) the draw is its mean. Newton
    starts from ``_start`` (w's first three cumulants by autodiff of log phi); once at most
    1/4 of the entries are unfinished they are gathered into a buffer of 1/4 the size (and
    so on), so that the few slow ones do not cost full-size steps."""
    # one compiled program per log_phi and shapes: run eagerly, its ops and loops compiled
    # one by one (a test's three eager calls of 20000 draws: 227 compilations, now 7)
    return _sample(key, log_phi, c2, *args)


@functools.partial(jax.jit, static_argnums=1)
def _sample(key, log_phi, c2, *args):
    c2 = jnp.asarray(c2, float)
    shape = jnp.broadcast_shapes(c2.shape, *(jnp.shape(a) for a in args))
    c2, *args = (jnp.broadcast_to(a, shape).reshape(-1) for a in (c2, *args))
    n = c2.size
    u = jax.random.uniform(key, (n,), float)

    def cumulants(c, *a):  # kappa_k = (-1)^k d^k log phi / dt^k ([Galy-Fajou2020, App. A.2])
        d1 = jax.grad(lambda t: log_phi(t, *a))
        d2 = jax.grad(d1)
        return -d1(c), d2(c), -jax.grad(d2)(c)

    mean, var, k3 = jax.vmap(cumulants)(c2, *args)
    point = jnp.isfinite(mean) & (var <= 1e-14 * mean**2)  # a point mass: w = its mean
    z = jnp.where(point, 0.0, _start(mean, var, k3, u))
    inf = jnp.full(n, jnp.inf)
    state = (z, -inf, inf, point)
    sizes = [n]  # buffers of 1/4 the size once at most 1/4 of the entries are left
    while sizes[-1] // 4 >= 64:
        sizes.append(sizes[-1] // 4)
    steps = jnp.zeros((), jnp.int32)
    for level, size in enumerate(sizes):
        limit = 0 if level == len(sizes) - 1 else sizes[level + 1]
        idx = (jnp.arange(n) if level == 0 else
               jnp.nonzero(~state[3], size=size, fill_value=n)[0])
        safe = jnp.minimum(idx, n - 1)
        sub = tuple(q[safe] for q in state[:3]) + (jnp.where(idx < n, state[3][safe], True),)
        data = (c2[safe], u[safe], tuple(a[safe] for a in args))

        def cond(carry, limit=limit):
            i, st = carry
            return (i < _MAX_STEPS) & (jnp.sum(~st[3]) > limit)

        def body(carry, data=data):
            i, st = carry
            return i + 1, _newton(log_phi, data[0], data[1], st, data[2])

        steps, sub = lax.while_loop(cond, body, (steps, sub))
        state = tuple(q.at[idx].set(v, mode="drop") for q, v in zip(state, sub, strict=True))
    w = jnp.where(point, mean, jnp.exp(state[0]))
    return w.reshape(shape)


def _derivatives(fn: Callable, ts: Array, order: int) -> list[np.ndarray]:
    """[fn(ts), fn'(ts), ..., fn^(order)(ts)] for a scalar ``fn``, by Taylor-mode
    differentiation (``jax.experimental.jet``: one pass whose cost grows as order^2, where
    nested reverse-mode ``grad`` grows exponentially: the 6th order of a negative-binomial
    phi took 5-24 s eagerly, 10 s to compile, against 0.03-3 s by jet, equal to 2e-10);
    nested ``grad`` when jet fails (it has no rule for some primitives), which also
    raises whatever ``fn`` itself raises."""
    series = (jnp.ones(()),) + (jnp.zeros(()),) * (max(order, 1) - 1)
    try:
        primal, terms = jax.vmap(lambda t: jet(fn, (t,), (series,)))(ts)
        return [np.asarray(primal)] + [np.asarray(d) for d in terms][:order]
    except Exception:  # noqa: BLE001 -- no jet rule for a primitive of fn: nested grad
        out = []
        for _ in range(order + 1):
            out.append(np.asarray(jax.vmap(fn)(ts)))
            fn = jax.grad(fn)
        return out


def check_phi(log_phi: Callable, *, what: str = "phi", max_order: int = 6,
              complex_step: bool = True) -> None:
    """Raise a ValueError unless ``log_phi`` is the log of an admissible phi
    ([Galy-Fajou2020, footnote 3]): phi(0) = 1 and phi completely monotone,
    (-1)^k phi^(k)(t) >= 0 for k = 0..``max_order`` on a grid of t in [1e-4, 1e4] (to
    1e-8 k! / t^k, the size of phi^(k) for a phi bounded by 1); and, for the numerical
    inversion (``complex_step``), that log_phi evaluates at complex t as the analytic
    continuation of phi (its complex-step derivative equals its derivative)."""
    try:
        at0 = float(log_phi(jnp.asarray(0.0)))
    except Exception as err:  # noqa: BLE001 -- the user's code: report whatever it raised
        raise ValueError(f"{what}: log_phi(0.0) raised {type(err).__name__}: {err}") from err
    if not abs(at0) <= 1e-10:
        raise ValueError(f"{what}: phi(0) must be 1 (the mixing law is a probability law), "
                         f"got log_phi(0) = {at0:.6g}")
    ts = jnp.asarray(np.geomspace(1e-4, 1e4, 33))
    phi = lambda t: jnp.exp(log_phi(t))
    derivs = _derivatives(phi, ts, max_order)
    t_np = np.asarray(ts)
    for k, d in enumerate(derivs):
        signed = (-1.0) ** k * d
        bad = ~(signed >= -1e-8 * math.factorial(k) / t_np**k)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"{what}: phi is not completely monotone: (-1)^{k} d^{k}phi/dt^{k} = "
                f"{signed[i]:.4g} < 0 at t = {t_np[i]:.4g} (a super-Gaussian likelihood needs "
                "phi(t) = E e^{-t w} for a law of w >= 0, [Galy-Fajou2020, eq. 8])")
    if not complex_step:
        return
    h = 1e-20
    try:
        step = np.asarray(jnp.imag(phi(ts + 1j * h * (1.0 + ts)))) / (h * (1.0 + t_np))
    except Exception as err:  # noqa: BLE001
        raise ValueError(
            f"{what}: log_phi must accept complex t (the Gibbs sampler inverts phi's Laplace "
            f"transform on a complex contour); it raised {type(err).__name__}: {err}. Write it "
            "with jnp functions analytic for Re t > 0 (jnp.sqrt, jnp.log1p, jnp.power), not "
            "jnp.abs, jnp.maximum or comparisons of t") from err
    if not np.allclose(step, derivs[1], rtol=1e-6, atol=1e-12):
        i = int(np.argmax(np.abs(step - derivs[1])))
        raise ValueError(
            f"{what}: log_phi is not analytic at complex t: its complex-step derivative at "
            f"t = {t_np[i]:.4g} is {step[i]:.6g}, its derivative {derivs[1][i]:.6g}. Write it "
            "with jnp functions analytic for Re t > 0 (jnp.sqrt, jnp.log1p, jnp.power), not "
            "jnp.abs, jnp.maximum, jnp.where on t or real casts")
