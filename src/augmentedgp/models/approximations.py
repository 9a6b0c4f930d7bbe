"""The full GP's own approximations: exact conditioning, Laplace and expectation propagation.

Each method's ``approximate(model, X, y)`` returns Gaussian sites (tau, nu) on g = f - m(X)
(stop-gradient) and the (approximate) log marginal likelihood, written so that ``jax.grad``
of it is the exact gradient of the method's marginal likelihood with respect to all
hyperparameters.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from augmentedgp.core import linalg
from augmentedgp.core.linalg import site_alpha, system_factor
from augmentedgp.likelihoods.binary import Probit
from augmentedgp.likelihoods.robust import Gaussian

sg = lax.stop_gradient


class Exact(eqx.Module):
    """Exact GP regression (Gaussian likelihood)."""

    def check(self, model):
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


class Laplace(eqx.Module):
    """Laplace approximation at the posterior mode ([Rasmussen2006], Algorithms 3.1-3.2,
    Sec. 5.5.1).

    Newton's method with step halving finds the mode; the marginal likelihood
    log q(y) = -1/2 a^T g + log p(y | g + m) - sum log diag L, with |B| = |I + W^1/2 K W^1/2|
    ([Rasmussen2006], eq. 3.32). Its gradient includes the implicit
    dependence of the mode on the hyperparameters: one differentiable Newton step from the
    (stop-gradient) mode has, at the fixed point, the implicit-function derivative.
    """

    max_iter: int = eqx.field(static=True, default=100)
    tol: float = eqx.field(static=True, default=1e-10)

    def check(self, model):
        pass

    def _newton_step(self, lik, K, m, y, g):
        """One Newton update from g: returns (g_new, a_new) with g_new = K a_new."""
        f = g + m
        W = -lik.hess_log_prob(y, f)
        b = W * g + lik.grad_log_prob(y, f)
        s, L = system_factor(K, W)
        a = b - s * linalg.cho_solve(L, s * (K @ b))  # R&W Alg. 3.1 lines 6-7
        return K @ a, a

    def _psi(self, lik, m, y, g, a):
        return -0.5 * a @ g + jnp.sum(lik.log_prob(y, g + m))  # R&W eq. 3.12 at f = K a

    def mode(self, model, X: Float[Array, "n d"], y: Float[Array, " n"]
             ) -> tuple[Float[Array, " n"], Int[Array, ""]]:
        """The posterior mode g = f - m (stop-gradient) and the number of Newton steps."""
        lik = model.likelihood
        K, m = sg(model.kernel(X)), sg(model.mean(X))

        def body(state):
            g, a, psi, _, it = state
            g_new, a_new = self._newton_step(lik, K, m, y, g)

            def halve(carry):  # backtrack along the Newton direction until psi improves
                t, _ = carry
                t = 0.5 * t
                return t, self._psi(lik, m, y, g + t * (g_new - g), a + t * (a_new - a))

            t, psi_new = lax.while_loop(
                lambda c: (c[1] < psi) & (c[0] > 1e-4),
                halve,
                (1.0, self._psi(lik, m, y, g_new, a_new)),
            )
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
        g, a = self._newton_step(lik, K, m, y, g_hat)  # = g_hat in value, IFT in derivative
        f = g + m
        W = -lik.hess_log_prob(y, f)
        _, L = system_factor(K, W)
        lml = self._psi(lik, m, y, g, a) - jnp.sum(jnp.log(jnp.diagonal(L)))  # R&W eq. 3.32
        return sg(W), sg(W * g + lik.grad_log_prob(y, f)), lml

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

    def check(self, model):
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
