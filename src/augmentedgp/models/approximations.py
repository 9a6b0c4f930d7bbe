"""The full GP's own approximations: exact conditioning, Laplace and expectation propagation.

Each method's ``approximate(model, X, y)`` returns Gaussian sites (tau, nu) on g = f - m(X)
(stop-gradient) and the (approximate) log marginal likelihood, written so that ``jax.grad``
of it is the exact gradient of the method's marginal likelihood with respect to all
hyperparameters.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from augmentedgp.core import linalg
from augmentedgp.core.linalg import site_alpha, system_factor
from augmentedgp.core.validation import check_int, check_real
from augmentedgp.likelihoods.binary import Probit
from augmentedgp.likelihoods.robust import Gaussian

sg = lax.stop_gradient


def _frozen(tree):
    """``tree`` with every inexact array leaf under stop_gradient: a likelihood whose
    trainable parameters may enter a while_loop (not reverse-differentiable) as constants."""
    return jax.tree_util.tree_map(lambda x: sg(x) if eqx.is_inexact_array(x) else x, tree)


def check_settings(approximation: eqx.Module, **settings: float) -> None:
    """Check an approximation's iteration count and tolerance at construction (a positive
    integer, a real >= 0; ValueErrors name the setting) and store them as plain Python
    numbers (they are static fields)."""
    for name, value in settings.items():
        value = (check_int(value, name) if name != "tol"
                 else check_real(value, name, low=0.0))
        object.__setattr__(approximation, name, value)


class Exact(eqx.Module):
    """Exact GP regression (Gaussian likelihood)."""

    def check(self, model) -> None:
        if not isinstance(model.likelihood, Gaussian):
            raise ValueError(
                "Exact inference needs a Gaussian likelihood; use Laplace() or EP() for "
                f"{type(model.likelihood).__name__}"
            )

    def log_marginal_likelihood(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                                ) -> Float[Array, ""]:
        K = model.kernel(X) + model.likelihood.variance.value * jnp.eye(X.shape[0], dtype=X.dtype)
        return linalg.mvn_logpdf(y - model.mean(X), K)  # R&W eq. 2.30

    def approximate(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                    ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, ""]]:
        s2 = sg(model.likelihood.variance.value)
        tau = jnp.full(y.shape, 1.0 / s2, dtype=X.dtype)
        nu = sg(y - model.mean(X)) / s2
        return tau, nu, self.log_marginal_likelihood(model, X, y)


class WhitenedFactors(NamedTuple):
    """The Gaussian-site posterior for sites with negative precisions W (the Laplace
    approximation of a likelihood that is not log-concave): Lk = chol(K) and
    L = chol(A), A = I + Lk^T W Lk, which is positive definite at a posterior mode
    (K^-1 + W is), and alpha = (K + W^-1)^-1 (nu / tau) = K^-1 E[g]. Then
    Sigma = Lk A^-1 Lk^T, log|I + K W| = log|A|, and the predictive variance is
    k** - |Lk^-1 k*|^2 + |L^-1 Lk^-1 k*|^2 ([Rasmussen2006], eq. 3.24 with
    (K + W^-1)^-1 = K^-1 - K^-1 Sigma K^-1)."""

    prior_factor: Float[Array, "n n"]
    L: Float[Array, "n n"]
    alpha: Float[Array, " n"]


def _whitened_system(Lk: Float[Array, "n n"], tau: Float[Array, " n"]) -> Float[Array, "n n"]:
    """chol(I + Lk^T diag(tau) Lk): the system matrix of :class:`WhitenedFactors`."""
    return linalg.cholesky(jnp.eye(Lk.shape[0], dtype=Lk.dtype) + Lk.T @ (tau[:, None] * Lk))


def whitened_factors(K: Float[Array, "n n"], tau: Float[Array, " n"], nu: Float[Array, " n"]
                     ) -> WhitenedFactors:
    """:class:`WhitenedFactors` of the sites (tau, nu) on g = f - m, any sign of tau."""
    Lk = linalg.cholesky(K)
    L = _whitened_system(Lk, tau)
    alpha = linalg.solve_upper_t(Lk, linalg.cho_solve(L, Lk.T @ nu))  # K^-1 Sigma nu
    return WhitenedFactors(Lk, L, alpha)


class Laplace(eqx.Module):
    """Laplace approximation at the posterior mode ([Rasmussen2006], Algorithms 3.1-3.2,
    Sec. 5.5.1).

    Newton's method with step halving finds the mode, with W = -d^2 log p / df^2 clipped
    at 0 in the search (an ascent direction for any likelihood); the marginal likelihood
    log q(y) = -1/2 a^T g + log p(y | g + m) - 1/2 log|I + K W| ([Rasmussen2006],
    eq. 3.32). Its gradient with respect to every hyperparameter (kernel, mean and
    likelihood) includes the implicit dependence of the mode on them: one differentiable
    Newton step (unclipped W) from the (stop-gradient) mode has, at the fixed point, the
    implicit-function derivative. A likelihood that is not log-concave (Student-t,
    Beta, LogisticPoisson) can have W < 0 at the mode; then |I + K W| and the Newton step
    use :class:`WhitenedFactors` instead of chol(I + W^1/2 K W^1/2). A likelihood with
    a kink (``twice_differentiable`` False: Laplace, BayesianSVM) has W = 0 almost
    everywhere and no Newton fixed point: refused, use variational inference.
    """

    max_iter: int = eqx.field(static=True, default=100)
    tol: float = eqx.field(static=True, default=1e-10)

    def __post_init__(self):
        check_settings(self, max_iter=self.max_iter, tol=self.tol)

    def check(self, model) -> None:
        lik = model.likelihood
        if not getattr(lik, "twice_differentiable", True):
            raise ValueError(
                f"the Laplace approximation needs a likelihood twice differentiable in f; "
                f"{type(lik).__name__} has a kink (zero curvature almost everywhere): fit it "
                "with variational inference instead (VGP or SVGP, e.g. AnalyticVI())")

    def _newton_step(self, lik, K, m, y, g, clip: bool = False):
        """One Newton update from g: returns (g_new, a_new) with g_new = K a_new; with
        ``clip`` W is clipped at 0 (chol(I + S K S) always exists)."""
        f = g + m
        W = -lik.hess_log_prob(y, f)
        if clip:
            W = jnp.maximum(W, 0.0)
        b = W * g + lik.grad_log_prob(y, f)
        s, L = system_factor(K, W)
        a = b - s * linalg.cho_solve(L, s * (K @ b))  # R&W Alg. 3.1 lines 6-7
        return K @ a, a

    def _psi(self, lik, m, y, g, a):
        return -0.5 * a @ g + jnp.sum(lik.log_prob(y, g + m))  # R&W eq. 3.12 at f = K a

    def mode(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
             ) -> tuple[Float[Array, " n"], Int[Array, ""]]:
        """The posterior mode g = f - m (stop-gradient) and the number of Newton steps."""
        lik = _frozen(model.likelihood)  # kernel, mean and likelihood all constant here
        K, m = sg(model.kernel(X)), sg(model.mean(X))

        def body(state):
            g, a, psi, _, it = state
            g_new, a_new = self._newton_step(lik, K, m, y, g, clip=True)

            def halve(carry):  # backtrack along the Newton direction until psi improves
                t, _ = carry
                t = 0.5 * t
                return t, self._psi(lik, m, y, g + t * (g_new - g), a + t * (a_new - a))

            # down to t = 2^-60: from g = 0 the first step for counts ~ 1e6 under a log link
            # is ~ 1e6 long (W = 1 there), the mode ~ 14 away; psi NaN or -inf is no gain
            t, psi_new = lax.while_loop(
                lambda c: ~(c[1] >= psi) & (c[0] > 2.0**-60),
                halve,
                (1.0, self._psi(lik, m, y, g_new, a_new)),
            )
            t = jnp.where(psi_new >= psi, t, 0.0)  # no gain anywhere: stay (and stop)
            psi_new = jnp.where(psi_new >= psi, psi_new, psi)
            g_next, a_next = g + t * (g_new - g), a + t * (a_new - a)
            return g_next, a_next, psi_new, jnp.abs(psi_new - psi), it + 1

        def cond(state):
            return (state[3] > self.tol) & (state[4] < self.max_iter)

        g0 = jnp.zeros_like(m)
        init = (g0, g0, self._psi(lik, m, y, g0, g0), jnp.inf, 0)
        g, _, _, _, it = lax.while_loop(cond, body, init)
        return g, it

    def approximate(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                    ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, ""]]:
        lik = model.likelihood
        K, m = model.kernel(X), model.mean(X)
        g_hat, _ = self.mode(model, X, y)
        W_hat = -_frozen(lik).hess_log_prob(y, g_hat + sg(m))

        def cholesky_form():  # W >= 0: R&W Alg. 3.1 (clipping changes nothing then; it keeps
            # the branch finite where vmap evaluates both)
            g, a = self._newton_step(lik, K, m, y, g_hat, clip=True)  # = g_hat; IFT derivative
            W = jnp.maximum(-lik.hess_log_prob(y, g + m), 0.0)
            _, L = system_factor(K, W)
            return g, a, self._psi(lik, m, y, g, a) - jnp.sum(jnp.log(jnp.diagonal(L)))

        def whitened_form():  # some W < 0: the same with Sigma = Lk A^-1 Lk^T
            f = g_hat + m
            W = -lik.hess_log_prob(y, f)
            Lk = linalg.cholesky(K)
            b = W * g_hat + lik.grad_log_prob(y, f)
            c = linalg.cho_solve(_whitened_system(Lk, W), Lk.T @ b)  # A^-1 Lk^T b
            g, a = Lk @ c, linalg.solve_upper_t(Lk, c)  # = g_hat in value, IFT derivative
            L = _whitened_system(Lk, -lik.hess_log_prob(y, g + m))
            return g, a, self._psi(lik, m, y, g, a) - jnp.sum(jnp.log(jnp.diagonal(L)))

        if getattr(lik, "log_concave", False):  # W >= 0 for every y: one form to compile
            g, a, lml = cholesky_form()
        else:
            g, a, lml = lax.cond(jnp.any(W_hat < 0.0), whitened_form, cholesky_form)
        f = g + m
        W = -lik.hess_log_prob(y, f)
        return sg(W), sg(W * g + lik.grad_log_prob(y, f)), lml  # R&W eq. 3.32

    def log_marginal_likelihood(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                                ) -> Float[Array, ""]:
        return self.approximate(model, X, y)[2]


class EP(eqx.Module):
    """Expectation propagation for the probit likelihood (R&W Algorithm 3.5).

    Sequential site updates with rank-one covariance updates, the covariance recomputed
    from a Cholesky factor after each sweep. The gradient of log Z_EP at convergence is
    that of log N(mu_tilde | m, K + S^-1) with the sites held fixed (R&W eq. 5.27).
    """

    max_sweeps: int = eqx.field(static=True, default=100)
    tol: float = eqx.field(static=True, default=1e-8)

    def __post_init__(self):
        check_settings(self, max_sweeps=self.max_sweeps, tol=self.tol)

    def check(self, model) -> None:
        if not isinstance(model.likelihood, Probit):
            name = type(model.likelihood).__name__
            raise ValueError(f"EP supports the Probit likelihood, not {name}")

    @staticmethod
    def _tilted(y, m, mu_c, var_c):
        """Moments of Phi(y (g + m)) N(g | mu_c, var_c): log Z, mean, variance (R&W 3.58)."""
        denom = jnp.sqrt(1.0 + var_c)
        z = y * (mu_c + m) / denom
        log_z = jax.scipy.special.log_ndtr(z)
        r = jnp.exp(jax.scipy.stats.norm.logpdf(z) - log_z)  # N(z) / Phi(z)
        mean = mu_c + y * var_c * r / denom
        var = var_c - var_c**2 * r * (z + r) / (1.0 + var_c)
        return log_z, mean, var

    @staticmethod
    def _posterior(K, tau, nu):
        """Sigma = (K^-1 + S^2)^-1, mu = Sigma nu, and (s, L) of B = I + S K S."""
        s, L = system_factor(K, tau)
        V = linalg.solve_lower(L, s[:, None] * K)
        Sigma = K - V.T @ V
        return Sigma, Sigma @ nu, s, L

    def fit_sites(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                  ) -> tuple[Float[Array, " n"], Float[Array, " n"], Int[Array, ""]]:
        """Converged site parameters (tau, nu) (stop-gradient) and the number of sweeps."""
        K, m = sg(model.kernel(X)), sg(model.mean(X))
        n = y.shape[0]

        def site_update(i, state):
            tau, nu, Sigma, mu = state
            tau_c = 1.0 / Sigma[i, i] - tau[i]
            nu_c = mu[i] / Sigma[i, i] - nu[i]
            _, mean, var = self._tilted(y[i], m[i], nu_c / tau_c, 1.0 / tau_c)
            tau_i = jnp.maximum(1.0 / var - tau_c, 0.0)
            dtau = tau_i - tau[i]
            nu = nu.at[i].set(mean / var - nu_c)
            tau = tau.at[i].set(tau_i)
            col = Sigma[:, i]
            Sigma = Sigma - (dtau / (1.0 + dtau * col[i])) * jnp.outer(col, col)
            return tau, nu, Sigma, Sigma @ nu

        def sweep(state):
            tau, nu, _, it = state
            Sigma, mu, _, _ = self._posterior(K, tau, nu)
            tau_new, nu_new, _, _ = lax.fori_loop(0, n, site_update, (tau, nu, Sigma, mu))
            delta = jnp.maximum(jnp.max(jnp.abs(tau_new - tau)), jnp.max(jnp.abs(nu_new - nu)))
            return tau_new, nu_new, delta, it + 1

        zeros = jnp.zeros(n, dtype=K.dtype)
        tau, nu, _, it = lax.while_loop(lambda s: (s[2] > self.tol) & (s[3] < self.max_sweeps),
                                        sweep, (zeros, zeros, jnp.inf, 0))
        return tau, nu, it

    def approximate(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                    ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, ""]]:
        K, m = model.kernel(X), model.mean(X)
        tau, nu, _ = self.fit_sites(model, X, y)
        Sigma, mu, s, L = self._posterior(sg(K), tau, nu)
        # cavities from the final posterior, then log Z_EP (R&W eq. 3.65, rewritten in natural
        # parameters with (K + S^-1)^-1 = S - S Sigma S so that no 1/tau_site appears)
        d = jnp.diagonal(Sigma)
        tau_c = 1.0 / d - tau
        nu_c = mu / d - nu
        log_z, _, _ = self._tilted(y, sg(m), nu_c / tau_c, 1.0 / tau_c)
        value = (
            jnp.sum(log_z)
            - jnp.sum(jnp.log(jnp.diagonal(L)))
            + 0.5 * jnp.sum(jnp.log1p(tau / tau_c))
            + 0.5 * nu @ Sigma @ nu
            + jnp.sum((nu_c**2 * tau / tau_c - 2.0 * nu_c * nu - nu**2) / (2.0 * (tau_c + tau)))
        )
        # exact gradient at the fixed point: d/dK = (alpha alpha^T - S B^-1 S)/2, d/dm = alpha
        alpha = site_alpha(s, L, nu)
        R = s[:, None] * linalg.cho_solve(L, jnp.diag(s))
        G = 0.5 * (jnp.outer(alpha, alpha) - R)
        return tau, nu, sg(value) + jnp.sum(G * (K - sg(K))) + alpha @ (m - sg(m))

    def log_marginal_likelihood(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
                                ) -> Float[Array, ""]:
        return self.approximate(model, X, y)[2]
