"""Conformance checks for likelihoods, including a user's own: :func:`check_likelihood`.

Every check compares a method with an independent computation (numerical integration,
autodiff or Monte Carlo), at a few targets y and latent values f. What is checked:

For every likelihood (``num_latent`` C = 1, or each latent in turn when C > 1: the others
fixed, variance 0):

- ``log_prob`` sums (discrete ``support``) or integrates (continuous) to 1 over y at each
  f, unless the class says ``normalised = False``; ``conditional_mean`` and
  ``conditional_variance`` are the mean and variance of y (of its indicators for binary and
  class labels) under that distribution (skipped where the likelihood returns inf);
- ``grad_log_prob`` and ``hess_log_prob`` equal autodiff of ``log_prob`` (C = 1 only: the
  multi-latent likelihoods have no derivatives);
- ``variational_expectations``, ``predictive_log_prob``, ``predict_y`` and
  ``predict_proba`` (binary and class likelihoods) equal adaptive Gauss-Kronrod
  integration over f ~ N(mean, var), within ``tol`` (the accuracy expected of the
  likelihood's own quadrature or Monte Carlo).

For an :class:`~augmentedgp.augmentation.Augmented` likelihood:

- the augmented bound equals ``log_prob`` when var = 0 (it is tight), equals itself at
  ``q_aux = aux_posterior(...)``, does not increase when ``q_aux`` moves away from the
  optimum (every field scaled by 1/2 and by 2), and lies below the numerical
  E_q[log p(y | f)] (Jensen);
- the sites ``aux_sites(y, aux_posterior(y, mean, var))`` are the gradient of the bound
  in (E f, E f^2): beta - gamma mean = d/d mean and -gamma / 2 = d/d var;
- Gibbs: the mean of ``sites(y, sample_aux(key, y, f))`` over ``n_draws`` draws equals
  the sites of the optimal q at var = 0 (which is p(w | y, f)), within 5 standard errors
  (a point whose draws all coincide, a rare event unseen, is drawn afresh 50 times as
  often).

For a :class:`~augmentedgp.augmentation.ScaleMixture`, also (w integrated numerically on
(0, inf) against ``log_mixing_density``):

- phi is admissible (``augmentation.inversion.check_phi``): phi(0) = 1 and completely
  monotone to sixth order on a grid, and, where ``sample_omega`` is the generic sampler,
  ``log_phi`` is analytic at complex t;
- the mixing density integrates to 1, and int exp(log C + g f - w h^2) p(w) dw = p(y | f)
  (the scale mixture integrates back to the likelihood);
- ``log_phi(y, t)`` = log int e^{-t w} p(w) dw and ``omega_mean(y, t)`` = E[w] under the
  tilted law, at the tilts c^2 = E[h^2] of the optimal q(w), and ``aux_sites`` are the
  sites at that numerical E[w];
- Gibbs: the draws of ``sample_aux`` follow the tilted law (Kolmogorov-Smirnov against its
  numerical CDF, threshold at p = 1e-6); for a point mass (``log_mixing_density`` None)
  every draw equals ``omega_mean``.

A check fails with an :class:`AssertionError` that names the method, the point (y, f or
mean and var) and the two values. The tolerances of the exact identities are fixed, set
by the accuracy of the numerical references (1e-12 to 1e-8); ``tol`` applies where the
likelihood itself approximates (quadrature, Monte Carlo).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from augmentedgp.augmentation import Augmented, inversion
from augmentedgp.augmentation.protocol import ScaleMixture
from augmentedgp.likelihoods import Likelihood, SuperGaussian

__all__ = ["check_likelihood", "Check", "GROUPS", "integrate"]

# --- vectorised adaptive Gauss-Kronrod (7-15) quadrature -------------------------------------

_XK = np.array([0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
                0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
                0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
                0.207784955007898467600689403773245, 0.0])
_WK = np.array([0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
                0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
                0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
                0.204432940075298892414161999234649, 0.209482141084727828012999174891714])
_WG = np.array([0.129484966168869693270611432679082, 0.279705391489276667901467771423780,
                0.381830050505118944950369775488975, 0.417959183673469387755102040816327])
XK = np.concatenate([-_XK[:-1], _XK[::-1]])  # 15 nodes, ascending
WK = np.concatenate([_WK[:-1], _WK[::-1]])
WG = np.zeros(15)
WG[1::2] = np.concatenate([_WG[:-1], _WG[::-1]])  # Gauss-7 nodes are the odd Kronrod ones
CHUNK = 4096  # fixed evaluation size: one compiled program per primitive, shared by calls


def _evaluate(fn, idx, x):
    """fn on (idx, x) in fixed-size chunks (the last one padded)."""
    out = []
    for start in range(0, idx.size, CHUNK):
        i, xx = idx[start:start + CHUNK], x[start:start + CHUNK]
        k = i.size
        if k < CHUNK:
            i = np.concatenate([i, np.zeros(CHUNK - k, i.dtype)])
            xx = np.concatenate([xx, np.full(CHUNK - k, xx[0])])
        out.append(np.asarray(fn(i, xx))[:k])
    return np.concatenate(out, 0)


def integrate(fn: Callable, lo, hi, n: int, *, rtol=1e-12, atol=1e-15, panels=32, rounds=60
             ) -> tuple[np.ndarray, np.ndarray]:
    """int_lo^hi fn(i, x) dx for problems i = 0..n-1, and the error estimates.

    ``fn(i, x)`` maps integer and float arrays of one length k to values (k,) or (k, d).
    Gauss-Kronrod 7-15 on panels, halving every panel whose error estimate exceeds both
    its share, (b - a) / (hi - lo), of max(atol, rtol |integral|) and 1e-3 of that
    tolerance (a floor that stops the refinement at jumps of a few ulps, as where a series
    is cut off); panels narrower than 1e-14 (hi - lo) are accepted as they are (a jump
    contributes at most its size times that width)."""
    edges = np.linspace(lo, hi, panels + 1)
    idx = np.repeat(np.arange(n), panels)
    a, b = np.tile(edges[:-1], n), np.tile(edges[1:], n)
    total = err = None
    for r in range(rounds):
        c, h = 0.5 * (a + b), 0.5 * (b - a)
        x = (c[:, None] + h[:, None] * XK).ravel()
        vals = _evaluate(fn, np.repeat(idx, 15), x)
        vals = vals.reshape(idx.size, 15, -1)
        kron = h[:, None] * np.einsum("q,kqd->kd", WK, vals)
        e = np.max(np.abs(kron - h[:, None] * np.einsum("q,kqd->kd", WG, vals)), -1)
        if total is None:
            total, err = np.zeros((n, kron.shape[1])), np.zeros(n)
        estimate = total.copy()
        np.add.at(estimate, idx, kron)
        scale = np.max(np.abs(estimate), -1)[idx]
        allowed = np.maximum(atol, rtol * scale)
        ok = ((e <= allowed * np.maximum((b - a) / (hi - lo), 1e-3))
              | (b - a < 1e-14 * (hi - lo)) | (r == rounds - 1))
        np.add.at(total, idx[ok], kron[ok])
        np.add.at(err, idx[ok], e[ok])
        keep = ~ok
        if not keep.any():
            break
        idx, a, b, c = idx[keep], a[keep], b[keep], c[keep]
        idx, a, b = np.repeat(idx, 2), np.stack([a, c], 1).ravel(), np.stack([c, b], 1).ravel()
    return total, err


# --- calls into the likelihood: compiled (one XLA program per method, likelihood type and
# shapes; running the many small ops eagerly would compile each of them separately) --------


@eqx.filter_jit
def _method(lik, method, *args):
    return getattr(lik, method)(*args)


@eqx.filter_jit
def _autodiff_jit(lik, y, f):
    d1 = jax.vmap(jax.grad(lik.log_prob, argnums=1))(y, f)
    d2 = jax.vmap(jax.grad(jax.grad(lik.log_prob, argnums=1), argnums=1))(y, f)
    return d1, d2


@eqx.filter_jit
def _bound_gradient_jit(lik, y, m, v):
    return jax.grad(lambda a, b: jnp.sum(lik.augmented_expectations(y, a, b)), (0, 1))(m, v)


def _padded(fn, *args):
    """fn(*args) with the arrays of n rows (the leading axis; not PRNG keys) padded to a
    power of 2 >= 128 by repeating their first row, and the rows of the output cut back:
    the likelihood's methods act row by row, and the calls of a check then share a few
    compiled shapes."""
    rows = [a for a in jax.tree.leaves(args) if isinstance(a, (jax.Array, np.ndarray))
            and a.ndim >= 1 and a.dtype != jnp.uint32]
    if not rows:
        return fn(*args)
    n = rows[0].shape[0]
    size = 128 if n <= 128 else CHUNK if n <= CHUNK else 1 << (n - 1).bit_length()
    is_row = lambda a: (isinstance(a, (jax.Array, np.ndarray)) and a.ndim >= 1
                        and a.shape[0] == n and a.dtype != jnp.uint32)
    pad = lambda a: jnp.concatenate([jnp.asarray(a), jnp.repeat(jnp.asarray(a)[:1], size - n, 0)])
    out = fn(*jax.tree.map(lambda a: pad(a) if is_row(a) and size > n else a, args))
    return jax.tree.map(lambda o: o[:n] if isinstance(o, jax.Array) and o.ndim >= 1
                        and o.shape[0] == size else o, out)


def _call(lik, method, *args):
    return _padded(_method, lik, method, *args)


def _draw(lik, key, y, f):
    """sample_aux, not compiled as a whole: the samplers it calls are compiled functions of
    their own, then shared by every likelihood that draws the same shapes."""
    return _padded(lambda *a: lik.sample_aux(*a), key, y, f)


def _autodiff(lik, y, f):
    return _padded(_autodiff_jit, lik, y, f)


def _bound_gradient(lik, y, m, v):
    return _padded(_bound_gradient_jit, lik, y, m, v)


# --- the report --------------------------------------------------------------------------


class Check(NamedTuple):
    """One check of :func:`check_likelihood`: the largest discrepancy found, in units of
    its tolerance (``worst`` <= 1 passes), and where it occurred."""

    name: str
    worst: float
    detail: str

    @property
    def passed(self) -> bool:
        """Whether the discrepancy is within the tolerance."""
        return bool(self.worst <= 1.0)


class _Report:
    def __init__(self, lik):
        self.lik, self.checks = lik, []

    def compare(self, name, got, want, where, *, rtol, atol=0.0, below=False):
        """got against want elementwise: |got - want| <= atol + rtol |want|, or with
        ``below``, got <= want + atol + rtol |want|. ``where`` labels the points."""
        got, want = np.broadcast_arrays(np.asarray(got, float), np.asarray(want, float))
        allowed = atol + rtol * np.abs(want)
        diff = got - want if below else np.abs(got - want)
        bad_value = ~np.isfinite(got) & ~(got == want)
        ratio = np.where(bad_value, np.inf, np.maximum(diff, 0.0) / np.where(
            allowed > 0, allowed, 1e-300))
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
        k = int(np.argmax(ratio)) if ratio.size else 0
        worst = float(ratio.ravel()[k]) if ratio.size else 0.0
        row = int(np.unravel_index(k, ratio.shape)[0]) if ratio.ndim else 0
        label = where(row) if callable(where) else where
        relation = "<=" if below else "=="
        detail = (f"{label}: got {got.ravel()[k]:.12g}, expected {relation} "
                  f"{want.ravel()[k]:.12g} (tolerance {allowed.ravel()[k]:.2g})")
        self.checks.append(Check(name, worst, detail))

    def statistic(self, name, value, limit, detail):
        self.checks.append(Check(name, float(value) / limit, f"{detail} (limit {limit:g})"))

    def raise_failures(self):
        failed = [c for c in self.checks if not c.passed]
        if failed:
            lines = "\n".join(f"- {c.name}: {c.detail}" for c in failed)
            raise AssertionError(f"check_likelihood({type(self.lik).__name__}): {len(failed)} "
                                 f"of {len(self.checks)} checks failed\n{lines}")


# --- points ------------------------------------------------------------------------------

_DEFAULT_Y = {"real": (-1.9, -0.45, 0.35, 2.3), "positive": (0.2, 0.9, 2.7),
              "unit": (0.07, 0.4, 0.85), "binary": (-1.0, 1.0), "counts": (0.0, 1.0, 2.0, 5.0)}
_DEFAULT_F = (-1.7, -0.6, 0.3, 1.1)
SUPPORTS = ("real", "positive", "unit", "binary", "counts", "classes")


def _default_f(C):
    if C == 1:
        return np.asarray(_DEFAULT_F)
    # rows of distinct latent values: each row has a different largest latent
    base = np.asarray(_DEFAULT_F)
    return np.stack([np.roll(base, i)[np.arange(C) % base.size] + 0.23 * np.arange(C)
                     for i in range(base.size)])


def _fmt(v):
    a = np.asarray(v)
    return f"{float(a):.4g}" if a.ndim == 0 else np.array2string(a, precision=4)


# --- numerical references ----------------------------------------------------------------


def _std_normal(z):
    return np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)


def _latent_integral(kernel, mean, var, k, C):
    """int kernel(i, f) N(f | mean_i, var_i) df for each problem i, f varying in latent k
    only (mean (P, C), var (P,)); kernel(i, F) gets F (m, C) (or (m,) for C = 1)."""
    sd = np.sqrt(var)

    def fn(i, z):
        F = mean[i].copy()
        F[:, k] = mean[i, k] + sd[i] * z
        w = _std_normal(z)
        vals = np.asarray(kernel(i, F if C > 1 else F[:, 0]))
        return vals * (w if vals.ndim == 1 else w[:, None])

    return integrate(fn, -12.0, 12.0, mean.shape[0])[0]


def _y_values(support, lik, F, y_hint):
    """For the discrete supports: the values of y over which p(y | f) is summed."""
    if support == "binary":
        return np.array([-1.0, 1.0])
    if support == "classes":
        return np.arange(lik.num_latent)
    # counts: up to far beyond the largest mean (checked: the last terms are negligible)
    mean = np.asarray(_call(lik, "conditional_mean", jnp.asarray(F)), float)
    var = np.asarray(_call(lik, "conditional_variance", jnp.asarray(F)), float)
    spread = np.where(np.isfinite(var), np.sqrt(np.abs(var)), 10.0 * (1.0 + np.abs(mean)))
    top = np.max(np.where(np.isfinite(mean), mean, 0.0) + 40.0 * spread) + 40.0
    top = max(top, float(np.max(y_hint)) + 40.0)
    return np.arange(min(int(math.ceil(top)), 100_000) + 1, dtype=float)


def _indicator(support, y, C):
    """The statistic whose mean is conditional_mean: y, (y + 1) / 2, or class indicators."""
    if support == "binary":
        return ((y + 1.0) / 2.0)[:, None]
    if support == "classes":
        return (y[:, None] == np.arange(C)).astype(float)
    return y[:, None]


def _continuous_map(support, centre, scale):
    """y(u) and log dy/du of the map from u in [-U, U] onto the support, and U."""
    if support == "real":
        return (lambda u, i: centre[i] + scale[i] * np.sinh(u),
                lambda u, i: np.log(scale[i] * np.cosh(u)), 40.0)
    if support == "positive":
        return (lambda u, i: scale[i] * np.exp(u), lambda u, i: np.log(scale[i]) + u, 60.0)
    if support == "unit":
        return (lambda u, i: 1.0 / (1.0 + np.exp(-u)),
                lambda u, i: -np.logaddexp(0.0, u) - np.logaddexp(0.0, -u), 40.0)
    raise ValueError(f"unknown support {support!r}; use one of {SUPPORTS}")


# --- the checks --------------------------------------------------------------------------


def _check_distribution(rep, lik, support, F, C):
    """log_prob normalised over y; conditional mean and variance its moments."""
    Fj = jnp.asarray(F)
    cmean = np.asarray(_call(lik, "conditional_mean", Fj), float).reshape(F.shape[0], -1)
    cvar = np.asarray(_call(lik, "conditional_variance", Fj), float).reshape(F.shape[0], -1)
    n = F.shape[0]
    if support in ("binary", "classes", "counts"):
        ys = _y_values(support, lik, F, np.zeros(1))
        Y = np.repeat(ys[None, :], n, 0)
        FF = np.repeat(F[:, None], ys.size, 1)
        logp = np.asarray(_call(lik, "log_prob", jnp.asarray(Y.ravel().astype(
            int if support == "classes" else float)), jnp.asarray(FF.reshape(-1, *F.shape[1:]))),
            float).reshape(n, ys.size)
        p = np.exp(logp)
        t = _indicator(support, ys, C)
        total = p.sum(1)
        m1, m2 = p @ t, p @ t**2
        if support == "counts":
            tail = p[:, -5:].sum(1) / total
            rep.compare("log_prob: the counts summed cover the distribution", tail, 0.0,
                        lambda k: f"f = {_fmt(F[k])}, y up to {ys[-1]:.0f}", rtol=0.0,
                        atol=1e-14)
        ref_tol = 1e-12
    else:
        finite_mean = np.all(np.isfinite(cmean), 1)
        centre = np.where(finite_mean, cmean[:, 0], F if C == 1 else F[:, 0])
        sd = np.sqrt(np.where(np.isfinite(cvar[:, 0]) & (cvar[:, 0] > 0), cvar[:, 0], 1.0))
        if support == "positive":
            sd = np.where(finite_mean & (cmean[:, 0] > 0), cmean[:, 0], 1.0)
        ymap, logjac, U = _continuous_map(support, centre, sd)

        def fn(i, u):
            y = ymap(u, i)
            lp = np.asarray(_call(lik, "log_prob", jnp.asarray(y), jnp.asarray(F[i])), float)
            w = np.exp(lp + logjac(u, i))
            return np.stack([w, w * y, w * y * y], 1)

        out = integrate(fn, -U, U, n)[0]
        total, m1, m2 = out[:, 0], out[:, 1:2], out[:, 2:3]
        ref_tol = 1e-10
    where = lambda k: f"f = {_fmt(F[k])}"
    if lik.normalised:
        rep.compare("log_prob is normalised over y", total, 1.0, where, rtol=0.0,
                    atol=100 * ref_tol)
    mean = m1 / total[:, None]
    rep.compare("conditional_mean = E[y | f] under log_prob", cmean, mean, where,
                rtol=1e-8, atol=1e3 * ref_tol)
    var = m2 / total[:, None] - mean**2
    finite = np.isfinite(cvar)
    if finite.all():
        rep.compare("conditional_variance = Var[y | f] under log_prob", cvar, var, where,
                    rtol=1e-7, atol=1e3 * ref_tol)
    elif finite.any():
        rep.compare("conditional_variance = Var[y | f] under log_prob", cvar[finite],
                    var[finite], "a finite conditional variance", rtol=1e-7,
                    atol=1e3 * ref_tol)


def _check_derivatives(rep, lik, Yp, Fp):
    y, f = jnp.asarray(Yp), jnp.asarray(Fp)
    d1, d2 = _autodiff(lik, y, f)
    where = lambda k: f"y = {_fmt(Yp[k])}, f = {_fmt(Fp[k])}"
    rep.compare("grad_log_prob = autodiff of log_prob", _call(lik, "grad_log_prob", y, f), d1,
                where, rtol=1e-8, atol=1e-10)
    rep.compare("hess_log_prob = autodiff of log_prob", _call(lik, "hess_log_prob", y, f), d2,
                where, rtol=1e-7, atol=1e-10)


class _Points(NamedTuple):
    """Expectation points (y, mean, var) with var in latent k only (k = -1: all)."""

    y: np.ndarray
    mean: np.ndarray  # (P,) or (P, C)
    var: np.ndarray  # like mean
    k: np.ndarray  # (P,) the latent whose variance is non-zero

    def label(self, i):
        return f"y = {_fmt(self.y[i])}, mean = {_fmt(self.mean[i])}, var = {_fmt(self.var[i])}"


def _expectation_points(Y, F, variances, C):
    ys, ms, vs, ks = [], [], [], []
    for k in range(C):
        for v in variances:
            for f in F:
                for y in Y:
                    var = np.zeros(C)
                    var[k] = v
                    ys.append(y)
                    ms.append(np.atleast_1d(f))
                    vs.append(var)
                    ks.append(k)
    mean, var = np.asarray(ms, float), np.asarray(vs, float)
    if C == 1:
        mean, var = mean[:, 0], var[:, 0]
    return _Points(np.asarray(ys), mean, var, np.asarray(ks))


def _by_latent(pts, C, kernel):
    """int kernel(i, F) N(f_k) df_k for every point, the latent k of each point."""
    out = None
    mean = pts.mean.reshape(len(pts.y), C)
    var = pts.var.reshape(len(pts.y), C)
    for k in range(C):
        sel = np.flatnonzero(pts.k == k)
        vals = _latent_integral(lambda i, F, sel=sel: kernel(sel[i], F), mean[sel],
                                var[sel, k], k, C)
        if out is None:
            out = np.zeros((len(pts.y), vals.shape[1]))
        out[sel] = vals
    return out


def _jy(lik, y):
    return jnp.asarray(y, int if lik.support == "classes" else float)


_APPROXIMATE = ("variational_expectations", "predictive_log_prob", "predict_y", "predict_proba")


def _tolerances(tol):
    """{method: tolerance} from a float or a partial dict (the rest 1e-6)."""
    if isinstance(tol, dict):
        unknown = set(tol) - set(_APPROXIMATE)
        if unknown:
            raise ValueError(f"tol has unknown methods {sorted(unknown)}; use {_APPROXIMATE}")
        return {name: float(tol.get(name, 1e-6)) for name in _APPROXIMATE}
    return dict.fromkeys(_APPROXIMATE, float(tol))


def _check_expectations(rep, lik, pts, C, tol, support, compare=True):
    """variational_expectations (without a key: deterministic) and predictive_log_prob
    against numerical integration (if ``compare``); returns the numerical E_q[log p(y | f)].
    For a
    pseudo-likelihood (``normalised = False``) on a discrete support the predictive
    density is that of p(y | f) normalised over y."""
    yj = _jy(lik, pts.y)
    values = (_y_values(support, lik, np.atleast_2d(pts.mean[:1]), np.zeros(1))
              if not lik.normalised and support in ("binary", "classes") else None)

    def logp(i, F):
        return np.asarray(_call(lik, "log_prob", _jy(lik, pts.y[i]), jnp.asarray(F)), float)

    def kernel(i, F):
        lp = logp(i, F)
        lq = lp
        if values is not None:
            Fj = jnp.asarray(F)
            lq = lp - np.logaddexp.reduce(np.stack([np.asarray(_call(
                lik, "log_prob", _jy(lik, np.full(len(i), u)), Fj), float) for u in values]), 0)
        return np.stack([lp, np.exp(lq)], 1)

    ref = _by_latent(pts, C, kernel)
    ve_ref, pred_ref = ref[:, 0], np.log(ref[:, 1])
    if not compare:
        return ve_ref
    m, v = jnp.asarray(pts.mean), jnp.asarray(pts.var)
    ve = _call(lik, "variational_expectations", yj, m, v)
    t = tol["variational_expectations"]
    rep.compare("variational_expectations = int log p(y | f) N(f | mean, var) df", ve, ve_ref,
                pts.label, rtol=t, atol=t)
    rep.compare("predictive_log_prob = log int p(y | f) N(f | mean, var) df",
                _call(lik, "predictive_log_prob", yj, m, v), pred_ref, pts.label, rtol=0.0,
                atol=tol["predictive_log_prob"])
    return ve_ref


def _check_predictions(rep, lik, pts, C, tol):
    """predict_y (and predict_proba) against numerical integration of the conditional
    moments over f."""
    first = np.flatnonzero(pts.y == pts.y[0])  # each (mean, var) once
    sub = _Points(pts.y[first], pts.mean[first], pts.var[first], pts.k[first])

    def moments(i, F):
        Fj = jnp.asarray(F)
        cm = np.asarray(_call(lik, "conditional_mean", Fj), float).reshape(len(i), -1)
        cv = np.asarray(_call(lik, "conditional_variance", Fj), float).reshape(len(i), -1)
        return np.concatenate([cm, cv + cm**2], 1)

    ref = _by_latent(sub, C, moments)
    d = ref.shape[1] // 2
    ey, ey2 = ref[:, :d], ref[:, d:]
    vy = ey2 - ey**2
    m, v = jnp.asarray(sub.mean), jnp.asarray(sub.var)
    got_m, got_v = (np.asarray(a, float).reshape(len(first), -1)
                    for a in _call(lik, "predict_y", m, v))
    label = lambda i: f"mean = {_fmt(sub.mean[i])}, var = {_fmt(sub.var[i])}"
    t = tol["predict_y"]
    rep.compare("predict_y mean = int E[y | f] N(f) df", got_m, ey, label, rtol=t, atol=t)
    if np.all(np.isfinite(vy)):
        rep.compare("predict_y variance = total variance over N(f)", got_v, vy, label,
                    rtol=t, atol=t)
    if hasattr(lik, "predict_proba"):
        p = np.asarray(_call(lik, "predict_proba", m, v), float).reshape(len(first), -1)
        rep.compare("predict_proba = int p(y | f) N(f) df", p, ey, label, rtol=0.0,
                    atol=tol["predict_proba"])


def _check_bound(rep, lik, pts, Yp, Fp, ve_ref, C):
    """The augmented bound: tight at var = 0, the optimal q, Jensen, sites = gradient."""
    yj, m, v = _jy(lik, pts.y), jnp.asarray(pts.mean), jnp.asarray(pts.var)
    label = pts.label
    lp = _call(lik, "log_prob", _jy(lik, Yp), jnp.asarray(Fp))
    at0 = _call(lik, "augmented_expectations", _jy(lik, Yp), jnp.asarray(Fp),
                jnp.zeros(np.shape(Fp)))
    rep.compare("augmented_expectations at var = 0 = log_prob", at0, lp,
                lambda k: f"y = {_fmt(Yp[k])}, f = {_fmt(Fp[k])}", rtol=1e-10, atol=1e-10)
    best = _call(lik, "augmented_expectations", yj, m, v)
    q = _call(lik, "aux_posterior", yj, m, v)
    rep.compare("augmented_expectations(q_aux=aux_posterior) = at the optimum",
                _call(lik, "augmented_expectations", yj, m, v, q), best, label, rtol=1e-10,
                atol=1e-10)
    for s in (0.5, 2.0):
        moved = jax.tree.map(lambda a, s=s: a * s, q)
        rep.compare(f"augmented_expectations at q_aux scaled by {s} <= at the optimum",
                    _call(lik, "augmented_expectations", yj, m, v, moved), best, label, rtol=1e-10,
                    atol=1e-10, below=True)
    rep.compare("augmented_expectations <= E_q[log p(y | f)] (Jensen)", best, ve_ref, label,
                rtol=1e-9, atol=1e-9, below=True)
    # sites = gradient in (E f, E f^2): all latents with variance here
    vv = jnp.asarray(np.where(pts.var > 0, pts.var, pts.var.max()))
    gm, gv = _bound_gradient(lik, yj, m, vv)
    beta, gamma = _call(lik, "aux_sites", yj, _call(lik, "aux_posterior", yj, m, vv))
    rep.compare("aux_sites: beta - gamma mean = d bound / d mean", beta - gamma * m, gm, label,
                rtol=1e-8, atol=1e-10)
    rep.compare("aux_sites: -gamma / 2 = d bound / d var", -0.5 * gamma, gv, label, rtol=1e-8,
                atol=1e-10)


def _site_draws(lik, key, Yg, Fg, n_draws):
    """(beta, gamma) of ``sites(y, sample_aux(key, y, f))``, n_draws per point, each
    (n_draws, P, C')."""
    P = len(Yg)
    y = _jy(lik, np.tile(Yg, n_draws))
    f = jnp.asarray(np.tile(Fg, (n_draws,) + (1,) * (np.ndim(Fg) - 1)))
    beta, gamma = _call(lik, "sites", y, _draw(lik, key, y, f))
    return tuple(np.asarray(jnp.broadcast_to(a, f.shape), float).reshape(n_draws, P, -1)
                 for a in (beta, gamma))


def _check_gibbs(rep, lik, Yg, Fg, n_draws, key):
    """Monte Carlo mean of the sites given Gibbs draws = the sites of p(w | y, f).

    A point where all draws of a site coincide yet differ from the expected site holds a
    rare event (e.g. a Poisson count of mean below 1 / n_draws, none drawn): its spread is
    unknown from those draws, so that point is drawn afresh, 50 n_draws times, and judged
    on the new draws alone (the first draws only decide to draw more)."""
    P = len(Yg)
    k1, k2 = jax.random.split(key)
    draws = _site_draws(lik, k1, Yg, Fg, n_draws)
    yg = _jy(lik, Yg)
    want = _call(lik, "aux_sites", yg, _call(lik, "aux_posterior", yg, jnp.asarray(Fg),
                                             jnp.zeros(np.shape(Fg))))
    want = [np.asarray(jnp.broadcast_to(w, np.shape(Fg)), float).reshape(P, -1) for w in want]
    stats = [(d.mean(0), d.std(0) / math.sqrt(n_draws)) for d in draws]
    flat = np.zeros(P, bool)
    for (mean, se), w in zip(stats, want, strict=True):
        flat |= np.any((se == 0.0) & (np.abs(mean - w) > 1e-12 * (1.0 + np.abs(w))), 1)
    counts = np.full(P, n_draws)
    if flat.any():
        more = _site_draws(lik, k2, Yg[flat], Fg[flat], 50 * n_draws)
        counts[flat] = 50 * n_draws
        for (mean, se), d in zip(stats, more, strict=True):
            mean[flat], se[flat] = d.mean(0), d.std(0) / math.sqrt(50 * n_draws)
    for name, (mean, se), w in zip(("beta", "gamma"), stats, want, strict=True):
        z = np.abs(mean - w) / np.maximum(se, 1e-12 * (1.0 + np.abs(w)))
        k = int(np.argmax(z))
        i = k // z.shape[1]
        rep.statistic(f"sites({name}) averaged over sample_aux draws = sites of the optimal q "
                      "at var = 0", z.ravel()[k], 5.0,
                      f"y = {_fmt(Yg[i])}, f = {_fmt(Fg[i])}: mean of {counts[i]} draws "
                      f"{mean.ravel()[k]:.8g} +- {se.ravel()[k]:.2g}, expected "
                      f"{w.ravel()[k]:.8g}, |z| = {z.ravel()[k]:.3g}")


_S_LO, _S_HI = -45.0, 95.0  # log w range of the mixing integrals
# their accuracy: 1% of the checks' 1e-8 (a mixing density obtained by numerical inversion
# of phi is itself accurate to ~1e-8, and refining to 1e-12 took 15 million evaluations)
_S_RTOL = 1e-10


def _check_mixture(rep, lik, Yp, Fp, pts, Yg, Fg, n_draws, key):
    """The mixing density against phi, E[w] and the likelihood; Gibbs draws of w."""
    ys = np.unique(Yp)
    yj = jnp.asarray(ys)
    if jax.eval_shape(lik.log_mixing_density, yj, yj) is None:  # a point mass: e^{-w0 t}
        t = jnp.asarray([0.0, 0.3, 2.0])
        w0 = _call(lik, "omega_mean", jnp.full(3, ys[0]), t)
        rep.compare("point mass: log_phi(y, t) = -t E[w]",
                    _call(lik, "log_phi", jnp.full(3, ys[0]), t), -t * w0, "t = 0, 0.3, 2",
                    rtol=1e-12, atol=1e-14)
        rep.compare("point mass: omega_mean independent of t", w0, w0[0], "t = 0, 0.3, 2",
                    rtol=1e-12)
        s = _call(lik, "super_gaussian", _jy(lik, Yg))
        t = (s.a + s.b * jnp.asarray(Fg)) ** 2
        draws = _draw(lik, key, _jy(lik, Yg), jnp.asarray(Fg))
        rep.compare("point mass: sample_aux draws = omega_mean", draws,
                    _call(lik, "omega_mean", _jy(lik, Yg), jnp.broadcast_to(t, np.shape(Yg))),
                    "the Gibbs points", rtol=1e-12)
        return

    # phi admissible: phi(0) = 1, completely monotone; analytic at complex t where the
    # generic sampler inverts it (sample_omega not overridden)
    generic = (type(lik).sample_omega is ScaleMixture.sample_omega
               or (isinstance(lik, SuperGaussian) and lik.sampler is None))
    for yv in ys:
        try:
            inversion.check_phi(lambda t, yv=yv: lik.log_phi(jnp.asarray(yv), t),
                                what=f"y = {_fmt(yv)}", complex_step=generic)
            failure = None
        except ValueError as err:
            failure = str(err)
        rep.statistic("log_phi is admissible (phi(0) = 1, completely monotone"
                      + (", analytic)" if generic else ")"), 0.0 if failure is None else np.inf,
                      1.0, failure or f"y = {_fmt(yv)}")

    def log_prior(i, s, yv):
        out = _call(lik, "log_mixing_density", jnp.asarray(yv[i]), jnp.asarray(np.exp(s)))
        return np.asarray(out, float) + s  # p(w) dw = p(e^s) e^s ds

    # the mixing density is a probability density
    z = integrate(lambda i, s: np.exp(log_prior(i, s, ys)), _S_LO, _S_HI, ys.size,
                  rtol=_S_RTOL)[0][:, 0]
    rep.compare("log_mixing_density integrates to 1", z, 1.0, lambda k: f"y = {_fmt(ys[k])}",
                rtol=0.0, atol=1e-8)
    # the scale mixture integrates back to the likelihood
    sg = _call(lik, "super_gaussian", _jy(lik, Yp))
    log_c, g, a, b = (np.broadcast_to(np.asarray(x, float), np.shape(Yp)) for x in sg)
    h2 = (a + b * Fp) ** 2
    base = log_c + g * Fp

    def mix(i, s):
        return np.exp(base[i] - np.exp(s) * h2[i] + log_prior(i, s, Yp))

    back = integrate(mix, _S_LO, _S_HI, len(Yp), rtol=_S_RTOL)[0][:, 0]
    lp = np.asarray(_call(lik, "log_prob", _jy(lik, Yp), jnp.asarray(Fp)), float)
    rep.compare("int exp(log C + g f - w h^2) p(w) dw = p(y | f)", np.log(back), lp,
                lambda k: f"y = {_fmt(Yp[k])}, f = {_fmt(Fp[k])}", rtol=0.0, atol=1e-8)
    # log phi and E[w] at the tilts of the optimal q(w)
    yt = _jy(lik, pts.y)
    s = _call(lik, "super_gaussian", yt)
    t = np.asarray((s.a + s.b * jnp.asarray(pts.mean)) ** 2 + s.b**2 * jnp.asarray(pts.var),
                   float)
    t = np.broadcast_to(t, pts.y.shape)

    def tilted(i, s):
        w = np.exp(log_prior(i, s, pts.y) - np.exp(s) * t[i])
        return np.stack([w, w * np.exp(s)], 1)

    zt = integrate(tilted, _S_LO, _S_HI, len(pts.y), rtol=_S_RTOL)[0]
    rep.compare("log_phi(y, t) = log int e^{-t w} p(w) dw",
                _call(lik, "log_phi", yt, jnp.asarray(t)), np.log(zt[:, 0]), pts.label,
                rtol=0.0, atol=1e-8)
    ew = zt[:, 1] / zt[:, 0]
    rep.compare("omega_mean(y, t) = E[w] under the tilted mixing law",
                _call(lik, "omega_mean", yt, jnp.asarray(t)), ew, pts.label, rtol=1e-8, atol=1e-12)
    q = _call(lik, "aux_posterior", yt, jnp.asarray(pts.mean), jnp.asarray(pts.var))
    got = _call(lik, "aux_sites", yt, q)
    want = _call(lik, "sites", yt, jnp.asarray(ew))
    rep.compare("aux_sites at aux_posterior: beta at the numerical E[w]", got[0], want[0],
                pts.label, rtol=1e-8, atol=1e-10)
    rep.compare("aux_sites at aux_posterior: gamma at the numerical E[w]", got[1], want[1],
                pts.label, rtol=1e-8, atol=1e-10)
    # Gibbs: the draws of w follow the tilted law (Kolmogorov-Smirnov)
    draws = np.asarray(_draw(lik, key, _jy(lik, np.repeat(Yg, n_draws)),
                                      jnp.asarray(np.repeat(Fg, n_draws))), float)
    draws = draws.reshape(len(Yg), n_draws)
    sg = _call(lik, "super_gaussian", _jy(lik, Yg))
    tg = np.broadcast_to(np.asarray((sg.a + sg.b * jnp.asarray(Fg)) ** 2, float), np.shape(Yg))
    limit = math.sqrt(-0.5 * math.log(0.5e-6) / n_draws)  # P(D > limit) ~ 1e-6
    worst, detail = 0.0, ""
    for i in range(len(Yg)):
        d = np.sort(draws[i])
        if not np.all(np.isfinite(d)) or d[0] <= 0.0:
            worst, detail = np.inf, f"y = {_fmt(Yg[i])}, f = {_fmt(Fg[i])}: draws not in (0, inf)"
            break
        grid = np.linspace(math.log(d[0]) - 8.0, math.log(d[-1]) + 8.0, 4001)
        logq = log_prior(np.zeros(grid.size, int), grid, np.full(1, Yg[i])) - np.exp(grid) * tg[i]
        dens = np.exp(logq - np.max(logq))
        cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
        cdf /= cdf[-1]
        F_at = np.interp(np.log(d), grid, cdf)
        n = d.size
        D = max(np.max(np.arange(1, n + 1) / n - F_at), np.max(F_at - np.arange(n) / n))
        if D > worst:
            worst, detail = D, (f"y = {_fmt(Yg[i])}, f = {_fmt(Fg[i])}: Kolmogorov-Smirnov "
                                f"distance {D:.3g} of {n_draws} draws")
    rep.statistic("sample_aux draws follow the tilted mixing law", worst, limit, detail)


GROUPS = ("distribution", "derivatives", "expectations", "predictions", "augmentation",
          "gibbs", "mixture")


def check_likelihood(lik, y=None, *, f=None, var=(0.05, 0.6, 2.0), support=None,
                     tol: float | dict = 1e-6, n_draws: int = 2000, key=None,
                     only=None) -> list[Check]:
    """Check ``lik`` against numerical integration, autodiff and Monte Carlo (see the module
    docstring for the list); raises AssertionError naming every failed check.

    ``y``: targets in the likelihood's encoding (default: a few values of its ``support``);
    ``f``: latent values, (k,) or (k, C) with ``num_latent`` C > 1 (default: four values in
    [-1.7, 1.1]); the checks use every pair (y, f), and every (y, f, var) for the
    expectations. ``support`` overrides ``lik.support`` ("real", "positive", "unit",
    "binary", "counts" or "classes"). ``tol``: the accuracy required of the likelihood's
    own approximations, relative to 1 + |value| (absolute for the log predictive density
    and the class probabilities): a float, or a dict giving it per method among
    "variational_expectations", "predictive_log_prob", "predict_y" and "predict_proba" (the
    others 1e-6); the exact identities use fixed tolerances. ``n_draws`` Gibbs
    draws per point, from ``key`` (default ``PRNGKey(0)``). ``only``: run these groups of
    checks only, among "distribution" (normalisation, conditional moments), "derivatives",
    "expectations", "predictions", "augmentation" (the bound and its sites), "gibbs" and
    "mixture" (the scale mixture, its E[w] and the draws of w); default all. Returns the
    checks that ran (each with its worst discrepancy relative to its tolerance).

    Pick y and f where the methods are smooth enough to integrate (a kink exactly at a
    node, such as f = y for the Laplace likelihood, makes a derivative undefined).
    """
    if not isinstance(lik, Likelihood):
        raise TypeError(f"check_likelihood needs a Likelihood, got {type(lik).__name__}")
    support = support or lik.support
    if support not in SUPPORTS:
        raise ValueError(f"unknown support {support!r}; use one of {SUPPORTS}")
    C = int(lik.num_latent)
    key = jax.random.PRNGKey(0) if key is None else key
    if y is None:
        Y = (np.arange(C, dtype=float) if support == "classes"
             else np.asarray(_DEFAULT_Y[support], float))
    else:
        Y = np.asarray(lik.check_targets(np.asarray(y).ravel()), float)
    F = _default_f(C) if f is None else np.asarray(f, float).reshape((-1,) if C == 1 else (-1, C))
    groups = GROUPS if only is None else tuple(only)
    if set(groups) - set(GROUPS):
        raise ValueError(f"unknown checks {sorted(set(groups) - set(GROUPS))}; use {GROUPS}")
    rep = _Report(lik)
    tol = _tolerances(tol)
    k_gibbs, k_mix = jax.random.split(key)
    # pairs (y, f) and expectation points (y, mean, var)
    Yp = np.repeat(Y, len(F))
    Fp = np.tile(F, (len(Y),) + (1,) * (F.ndim - 1))
    pts = _expectation_points(Y, F, var, C)
    augmented = isinstance(lik, Augmented)
    if "distribution" in groups:
        _check_distribution(rep, lik, support, F, C)
    if "derivatives" in groups and C == 1:
        _check_derivatives(rep, lik, Yp, Fp)
    if "expectations" in groups or (augmented and "augmentation" in groups):
        ve_ref = _check_expectations(rep, lik, pts, C, tol, support,
                                     compare="expectations" in groups)
    if "predictions" in groups:
        _check_predictions(rep, lik, pts, C, tol)
    if augmented:
        pick = np.linspace(0, len(Yp) - 1, min(4, len(Yp))).round().astype(int)
        if "augmentation" in groups:
            _check_bound(rep, lik, pts, Yp, Fp, ve_ref, C)
        if "gibbs" in groups:
            _check_gibbs(rep, lik, Yp[pick], Fp[pick], n_draws, k_gibbs)
        if isinstance(lik, ScaleMixture) and "mixture" in groups:
            _check_mixture(rep, lik, Yp, Fp, pts, Yp[pick], Fp[pick], n_draws, k_mix)
    rep.raise_failures()
    return rep.checks
