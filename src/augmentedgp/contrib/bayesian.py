"""Parametric Bayesian models as :class:`~augmentedgp.inference.flow.Target` s for the Gaussian
flows ([Galy-Fajou2021, Secs. 4.5-4.6]): logistic regression and a small multi-layer perceptron
classifier. Their ``data`` are (X, y), so ``batch_size`` minibatches work; predictions
average the model over draws from the fitted Gaussian,
p(y = k | x*) ~ (1/S) sum_s p(y = k | x*, w_s), w_s ~ q(w).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, Shaped

from augmentedgp.core.validation import check_binary, check_key, check_vector, check_X
from augmentedgp.inference.flow import Target, VariationalGaussian


def _check_prior_var(prior_var):
    if not (isinstance(prior_var, int | float) and math.isfinite(prior_var) and prior_var > 0):
        raise ValueError(f"prior_var must be a positive number, got {prior_var!r}")
    return float(prior_var)


def _normal_log_prior(x, var):
    return -0.5 * (jnp.sum(x**2) / var + x.shape[0] * math.log(2 * math.pi * var))


class LogisticRegression(Target):
    """y_i ~ Bernoulli(sigmoid(w^T x_i)), y in {-1, 1} (or {0, 1}), w ~ N(0, prior_var I)
    ([Galy-Fajou2021, Sec. 4.5]: prior_var = 10). ``intercept=True`` appends a constant feature."""

    prior_var: float = eqx.field(static=True, default=10.0)
    intercept: bool = eqx.field(static=True, default=False)

    def __init__(self, X: Float[ArrayLike, "n d"], y: Shaped[ArrayLike, " n"], *,
                 prior_var: float = 10.0, intercept: bool = False):
        X = check_X(X)
        y = check_binary(check_vector(y, X.shape[0]))
        self.prior_var, self.intercept = _check_prior_var(prior_var), bool(intercept)
        self.data = (jnp.asarray(self._features(X)), jnp.asarray(y))

    def _features(self, X):
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.intercept else X

    @property
    def dim(self) -> int:
        return int(self.data[0].shape[1])

    def init(self) -> Float[Array, " D"]:
        """The starting point w = 0."""
        return jnp.zeros(self.dim)

    def log_prior(self, w: Float[Array, " D"]) -> Float[Array, ""]:
        return _normal_log_prior(w, self.prior_var)

    def log_likelihood(self, w: Float[Array, " D"], X: Float[Array, "b D"],
                       y: Float[Array, " b"]) -> Float[Array, " b"]:
        return jax.nn.log_sigmoid(y * (X @ w))

    def potentials(self, W: Float[Array, "N D"], batch: tuple[ArrayLike, ...],
                   scale: float | Float[Array, ""]
                   ) -> Float[Array, " N"]:  # all particles in one matrix product
        X, y = batch
        lik = jnp.sum(jax.nn.log_sigmoid(y * (W @ X.T)), axis=1)
        prior = -0.5 * (jnp.sum(W**2, axis=1) / self.prior_var
                        + W.shape[1] * math.log(2 * math.pi * self.prior_var))
        return -(prior + scale * lik)

    def predict_proba(self, q: VariationalGaussian, Xnew: Float[ArrayLike, "n d"],
                      key: PRNGKeyArray, n_samples: int = 200) -> Float[Array, " n"]:
        """p(y = 1 | x*) averaged over ``n_samples`` draws of w ~ q, (n*,)."""
        Xn = jnp.asarray(self._features(check_X(Xnew, "Xnew", d=self.dim - self.intercept)))
        W = q.sample(key, n_samples)
        return jnp.mean(jax.nn.sigmoid(W @ Xn.T), axis=0)


class BayesianMLP(Target):
    """A classifier network with ``hidden`` tanh layers (two layers of 200 in
    [Galy-Fajou2021, Sec. 4.6]), softmax output over ``num_classes`` and weights
    ~ N(0, prior_var I); labels are the integers 0, ..., num_classes - 1. :meth:`init` draws
    Glorot-scaled starting weights as a list of (W, b) per layer, so ``blocks="leaves"`` gives
    per-array blocks and :meth:`layer_blocks` the per-layer ones ("GPF (Layers)")."""

    sizes: tuple = eqx.field(static=True, default=())
    prior_var: float = eqx.field(static=True, default=1.0)

    def __init__(self, X: Float[ArrayLike, "n d"], y: Int[ArrayLike, " n"], *,
                 hidden: Sequence[int] = (50,), num_classes: int | None = None,
                 prior_var: float = 1.0):
        X = check_X(X)
        y = np.asarray(y)
        if y.shape != (X.shape[0],) or not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise ValueError(f"y must be ({X.shape[0]},) integer labels 0..C-1")
        C = int(y.max()) + 1 if num_classes is None else int(num_classes)
        if C < 2 or y.max() >= C:
            raise ValueError(f"need num_classes >= 2 covering the labels, got {num_classes!r}")
        hidden = tuple(int(h) for h in hidden)
        if any(h < 1 for h in hidden):
            raise ValueError(f"hidden layer sizes must be positive, got {hidden}")
        self.sizes = (X.shape[1], *hidden, C)
        self.prior_var = _check_prior_var(prior_var)
        self.data = (jnp.asarray(X), jnp.asarray(y))

    @property
    def dim(self) -> int:
        return sum(a * b + b for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True))

    def layer_blocks(self) -> tuple[int, ...]:
        """Block sizes with one block per layer (weights and bias together)."""
        return tuple(a * b + b for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True))

    def init(self, key: PRNGKeyArray) -> list[tuple[Float[Array, "a b"], Float[Array, " b"]]]:
        """Starting weights [(W1, b1), ...], W ~ N(0, 1 / fan_in), b = 0."""
        out = []
        for k, (a, b) in zip(jax.random.split(check_key(key), len(self.sizes) - 1),
                             zip(self.sizes[:-1], self.sizes[1:], strict=True), strict=True):
            out.append((jax.random.normal(k, (a, b)) / math.sqrt(a), jnp.zeros(b)))
        return out

    def _unflatten(self, w):
        layers, i = [], 0
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            layers.append((w[i:i + a * b].reshape(a, b), w[i + a * b:i + a * b + b]))
            i += a * b + b
        return layers

    def logits(self, w: Float[Array, " D"], X: Float[Array, "n d"]) -> Float[Array, "n C"]:
        """Output logits (n, C) for the flat weight vector w."""
        h = X
        layers = self._unflatten(w)
        for W, b in layers[:-1]:
            h = jnp.tanh(h @ W + b)
        W, b = layers[-1]
        return h @ W + b

    def log_prior(self, w: Float[Array, " D"]) -> Float[Array, ""]:
        return _normal_log_prior(w, self.prior_var)

    def log_likelihood(self, w: Float[Array, " D"], X: Float[Array, "b d"],
                       y: Int[Array, " b"]) -> Float[Array, " b"]:
        logp = jax.nn.log_softmax(self.logits(w, X))
        return jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]

    def predict_proba(self, q: VariationalGaussian, Xnew: Float[ArrayLike, "n d"],
                      key: PRNGKeyArray, n_samples: int = 100) -> Float[Array, "n C"]:
        """Class probabilities (n*, C) averaged over ``n_samples`` draws of w ~ q."""
        Xn = jnp.asarray(check_X(Xnew, "Xnew", d=self.sizes[0]))
        W = q.sample(key, n_samples)
        return jnp.mean(jax.vmap(lambda w: jax.nn.softmax(self.logits(w, Xn)))(W), axis=0)


__all__ = ["LogisticRegression", "BayesianMLP"]
