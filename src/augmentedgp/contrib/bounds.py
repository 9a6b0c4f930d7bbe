"""PAC-Bayes generalisation bounds for GP classifiers ([Seeger2002], in the
Langford-Seeger kl form).

With probability at least 1 - delta over n i.i.d. training points, simultaneously for every
posterior Q over the latent function (the prior P fixed before seeing the data),

    kl(emp(Q) || gen(Q)) <= (KL[Q || P] + log((n + 1) / delta)) / n,

where emp and gen are the empirical and true 0-1 errors of the Gibbs classifier (draw
f ~ Q, predict sign f(x)) and kl(q || p) is the binary KL divergence. Hence
gen(Q) <= kl^-1(emp, eps) = sup{p in [emp, 1] : kl(emp || p) <= eps} (the "kl" form), or
the looser Pinsker form emp + sqrt(eps / 2). The Bayes (majority-vote) classifier's error is
at most twice the Gibbs error. Hyperparameters picked from a grid of G candidates on the
same data keep the bound valid with log G added to the numerator (a union bound).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Shaped

from augmentedgp.core import linalg
from augmentedgp.core.loop import minimize
from augmentedgp.core.params import Parameter
from augmentedgp.core.validation import check_int
from augmentedgp.likelihoods.binary import BayesianSVM, Logistic, Probit
from augmentedgp.models.sites import SitePosterior
from augmentedgp.models.sparse import SVGP, VGP, SparsePosterior


def binary_kl(q: Float[ArrayLike, "*s"], p: Float[ArrayLike, "*s"]) -> Float[Array, "*s"]:
    """kl(q || p) = q log(q / p) + (1 - q) log((1 - q) / (1 - p)), with 0 log 0 = 0."""
    q, p = jnp.asarray(q, float), jnp.asarray(p, float)

    def term(a, b):
        return jnp.where(a > 0, a * (jnp.log(jnp.where(a > 0, a, 1.0)) - jnp.log(b)), 0.0)

    return term(q, p) + term(1 - q, 1 - p)


def kl_inverse(q: Float[ArrayLike, "*s"], eps: Float[ArrayLike, "*s"]) -> Float[Array, "*s"]:
    """sup{p in [q, 1] : kl(q || p) <= eps}, elementwise, by 100 bisection steps on
    [q, 1] (kl(q || .) increases there), so to about 1e-16 whatever q and eps (near q the
    rounding of kl itself limits p to ~1e-8 when eps ~ 0). Differentiable: the derivative
    comes from the implicit function kl(q || p) = eps."""
    q, eps = jnp.broadcast_arrays(jnp.asarray(q, float), jnp.asarray(eps, float))
    return _kl_inverse(q, eps)


@jax.custom_jvp
def _kl_inverse(q, eps):
    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        ok = binary_kl(q, mid) <= eps
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = lax.fori_loop(0, 100, body, (q, jnp.ones_like(q)))
    return jnp.where(binary_kl(q, 1.0 - 1e-16) <= eps, 1.0, lo)


@_kl_inverse.defjvp
def _kl_inverse_jvp(primals, tangents):
    (q, eps), (dq, deps) = primals, tangents
    p = _kl_inverse(q, eps)
    inside = (p > q) & (p < 1.0) & (q > 0.0)
    ps, qs = jnp.where(inside, p, 0.5), jnp.where(inside, q, 0.25)
    dkl_dp = (ps - qs) / (ps * (1.0 - ps))
    dkl_dq = jnp.log(qs * (1.0 - ps)) - jnp.log(ps * (1.0 - qs))
    dp = jnp.where(inside, (deps - dkl_dq * dq) / dkl_dp, jnp.where(p >= 1.0, 0.0, dq))
    return p, dp


def pac_bayes_bound(emp: float, kl: float, n: int, delta: float = 0.05, form: str = "kl",
                    n_hypotheses: int = 1) -> float:
    """The bound on the Gibbs classifier's true error from its empirical error ``emp``,
    KL[Q || P] = ``kl`` and ``n`` training points; ``n_hypotheses`` > 1 for a choice among
    that many candidate priors (a grid of hyperparameters) made on the same data."""
    emp, kl = float(emp), float(kl)
    if not 0.0 <= emp <= 1.0:
        raise ValueError(f"emp must be an error rate in [0, 1], got {emp}")
    if not (kl >= 0.0 and math.isfinite(kl)):
        raise ValueError(f"kl must be finite and >= 0, got {kl}")
    check_int(n, "n")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    check_int(n_hypotheses, "n_hypotheses")
    eps = (kl + math.log((n + 1) / delta) + math.log(n_hypotheses)) / n
    if form == "kl":
        return float(kl_inverse(emp, eps))
    if form == "pinsker":
        return min(1.0, emp + math.sqrt(eps / 2))
    raise ValueError(f"form must be 'kl' or 'pinsker', got {form!r}")


class Bound(NamedTuple):
    """``bound`` on the Gibbs classifier's error, its empirical error ``gibbs_risk``, the
    ``kl`` KL[Q || P], ``n`` and ``delta``."""

    bound: float
    gibbs_risk: float
    kl: float
    n: int
    delta: float


def _signs(post, y):
    y = np.asarray(post.likelihood.targets(y, len(y)))
    return np.where(y > 0, 1.0, -1.0)


def gibbs_risk(post: SitePosterior | SparsePosterior, X: Float[ArrayLike, "n d"],
               y: Shaped[ArrayLike, " n"]) -> float:
    """The expected 0-1 error of the Gibbs classifier on (X, y): the mean over points of
    P_Q(t_i f(x_i) < 0) = Phi(-t_i mu_i / sigma_i) for the latent marginals N(mu_i, sigma_i^2)
    of ``post`` (labels in {0, 1} or {-1, +1})."""
    mean, var = post.predict_f(X)
    t = _signs(post, y)
    sd = np.sqrt(np.maximum(np.asarray(var), 1e-300))
    return float(np.mean(jax.scipy.stats.norm.cdf(-t * np.asarray(mean) / sd)))


def posterior_kl(post: SitePosterior | SparsePosterior) -> float:
    """KL[Q || P] between the fitted Gaussian posterior and the GP prior over the latent
    process: for a full GP (Laplace, EP) over f(X), KL = 1/2 (log|B| + tr B^-1 +
    a^T K a - n) with B = I + S K S and f - m = K a; for SVGP / VGP KL[q(u) || p(u)], which
    equals the process-level KL (Matthews et al. 2016)."""
    if isinstance(post, SparsePosterior):
        return float(post.model.prior_kl())
    if isinstance(post, SitePosterior):
        return float(_site_kl(post))
    raise TypeError(f"posterior_kl needs a fitted GP (SitePosterior or SparsePosterior), got "
                    f"{type(post).__name__}")


@jax.jit
def _site_kl(post):
    K = post.model.kernel(post.X)
    Linv = linalg.solve_lower(post.L, jnp.eye(post.L.shape[0], dtype=post.L.dtype))
    return 0.5 * (linalg.logdet_chol(post.L) + jnp.sum(Linv**2)
                  + post.alpha @ K @ post.alpha - post.L.shape[0])


_BINARY = (Logistic, Probit, BayesianSVM)


def bound(post: SitePosterior | SparsePosterior, X: Float[ArrayLike, "n d"] | None = None,
          y: Shaped[ArrayLike, " n"] | None = None, delta: float = 0.05, form: str = "kl",
          n_hypotheses: int = 1) -> Bound:
    """Seeger's PAC-Bayes bound for a fitted binary GP classifier (Laplace, EP, or a
    VGP / SVGP fitted by quadrature or augmented VI): the Gibbs risk on the training data
    (``X, y``; default: the data it was fitted on) and KL[Q || P]. Valid only when the
    prior (the hyperparameters) was not tuned on the same data -- otherwise pass the number
    of candidate hyperparameter settings as ``n_hypotheses``."""
    if not isinstance(post.likelihood, _BINARY):
        raise TypeError("the PAC-Bayes bound is for binary classifiers (Logistic, Probit, "
                        f"BayesianSVM likelihoods), not {type(post.likelihood).__name__}")
    X = post.X if X is None else X
    y = post.y if y is None else y
    risk, kl = gibbs_risk(post, X, y), posterior_kl(post)
    n = int(np.shape(X)[0])
    return Bound(pac_bayes_bound(risk, kl, n, delta, form, n_hypotheses), risk, kl, n, delta)


def _gibbs_bound(model, X, t, const, n):
    """The kl-form bound of an SVGP / VGP as a differentiable function of its q(u),
    inducing inputs and hyperparameters (``const`` = log((n + 1) / delta) + log G)."""
    p = model.project(X)
    emp = jnp.mean(jax.scipy.stats.norm.cdf(-t * p.mean / jnp.sqrt(jnp.maximum(p.var, 1e-300))))
    return kl_inverse(emp, (model.prior_kl() + const) / n)


def _round_prior(model, resolution, radius):
    """The model with every trainable kernel / mean parameter's raw value rounded to the
    grid k * resolution, |k * resolution| <= radius; and the grid's size G."""
    count = 0

    def snap(x):
        nonlocal count
        if isinstance(x, Parameter) and x.trainable:
            count += int(np.size(x.raw))
            raw = jnp.clip(jnp.round(x.raw / resolution) * resolution, -radius, radius)
            return dataclasses.replace(x, raw=raw)
        return x

    is_param = lambda x: isinstance(x, Parameter)  # noqa: E731
    prior = (model.kernel, model.mean)
    snapped = jax.tree_util.tree_map(snap, prior, is_leaf=is_param)
    model = eqx.tree_at(lambda m: (m.kernel, m.mean), model, snapped)
    return model, count * math.log(2 * round(radius / resolution) + 1)


def fit_bound(model: SVGP, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"],
              delta: float = 0.05, *, resolution: float = 0.1, radius: float = 10.0,
              max_iter: int = 1000, learning_rate: float = 0.01, optimizer: str = "adam",
              verbose: bool = False) -> tuple[SparsePosterior, Bound]:
    """Learn a binary SVGP / VGP classifier by minimising its PAC-Bayes bound (Reeb et al.
    2018) rather than maximising the ELBO: q(u), the inducing inputs (parts of the posterior
    Q, free) and the kernel and mean hyperparameters (parts of the prior P) are optimised
    together on the kl-form bound. The prior's raw hyperparameters are then rounded to a
    grid of spacing ``resolution`` on [-radius, radius], and the bound is evaluated there
    paying log G for the G grid points (a union bound), so the returned bound is valid.
    Returns (SparsePosterior, Bound)."""
    if not isinstance(model, SVGP):
        raise TypeError(f"fit_bound trains SVGP / VGP models, not {type(model).__name__}")
    if not isinstance(model.likelihood, _BINARY):
        raise TypeError("the PAC-Bayes bound is for binary classifiers (Logistic, Probit, "
                        f"BayesianSVM likelihoods), not {type(model.likelihood).__name__}")
    if not (resolution > 0 and radius > 0):
        raise ValueError("resolution and radius must be > 0")
    if isinstance(model, VGP):
        model = model.bind(X)
    Xa, ya = model.validate_data(X, y)
    n = int(Xa.shape[0])
    t = jnp.where(ya > 0, 1.0, -1.0)
    _, log_grid = _round_prior(model, resolution, radius)
    const = math.log((n + 1) / delta) + log_grid
    fitted, hist = minimize(_gibbs_bound, model, Xa, t, const, n, optimizer=optimizer,
                            max_iter=max_iter, learning_rate=learning_rate, tol=0.0,
                            verbose=verbose)
    fitted, _ = _round_prior(fitted, resolution, radius)
    post = SparsePosterior(fitted, Xa, ya, hist)
    risk, kl = gibbs_risk(post, Xa, ya), posterior_kl(post)
    return post, Bound(float(kl_inverse(risk, (kl + const) / n)), risk, kl, n, delta)


def select_by_bound(fit_candidate: Callable[[Any], SitePosterior | SparsePosterior],
                    candidates: Iterable[Any], X: Float[ArrayLike, "n d"],
                    y: Shaped[ArrayLike, " n"], delta: float = 0.05, form: str = "kl"
                    ) -> tuple[Any, SitePosterior | SparsePosterior, list[Bound]]:
    """Hyperparameter selection by the PAC-Bayes bound: ``fit_candidate(c)`` returns the
    fitted classifier for candidate ``c`` (hyperparameters held fixed while fitting); the one
    with the smallest bound wins, each bound paying log(len(candidates)) for the choice.
    Returns (best candidate, its posterior, the list of Bounds)."""
    candidates = list(candidates)
    if not candidates:
        raise ValueError("candidates must not be empty")
    posts = [fit_candidate(c) for c in candidates]
    bounds = [bound(p, X, y, delta, form, n_hypotheses=len(candidates)) for p in posts]
    i = int(np.argmin([b.bound for b in bounds]))
    return candidates[i], posts[i], bounds


__all__ = ["binary_kl", "kl_inverse", "pac_bayes_bound", "gibbs_risk", "posterior_kl",
           "bound", "select_by_bound", "fit_bound", "Bound"]
