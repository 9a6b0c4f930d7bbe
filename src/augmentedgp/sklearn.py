"""scikit-learn estimators: ``GPRegressor``, ``GPClassifier`` and ``GPCountRegressor``.

The estimators translate scikit-learn's conventions (labels, standardisation, constructor
parameters, ``ConvergenceWarning``) onto the library: each standardises the inputs (and a
regressor's targets), builds an ARD kernel and the likelihood, and fits
``agp.VGP(kernel, likelihood)`` with :func:`augmentedgp.fit` and a
:class:`~augmentedgp.Plan`, which chooses the model (full or sparse), the inference and the
budget from the data size. The fitted model is ``posterior_``; ``history_`` and
``n_iter_`` describe the training, ``sparse_`` says whether the model is sparse.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import warnings

import equinox as eqx
import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import d2_tweedie_score
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as err:
    raise ImportError(f"augmentedgp.sklearn needs scikit-learn >= 1.6 ({err}): "
                      'pip install "augmentedgp[sklearn]"', name=err.name or "sklearn") from err

from augmentedgp import kernels as _kernels
from augmentedgp import likelihoods as _lik
from augmentedgp.core.errors import user_stacklevel
from augmentedgp.core.params import fixed, positive
from augmentedgp.core.validation import check_finite, check_int, check_vector, check_y
from augmentedgp.datasets import Standardizer
from augmentedgp.inference.plan import Plan
from augmentedgp.likelihoods.quantiles import check_levels
from augmentedgp.models.sparse import VGP
from augmentedgp.training.fit import fit

KERNELS = {"rbf": _kernels.RBF, "matern12": _kernels.Matern12, "matern32": _kernels.Matern32,
           "matern52": _kernels.Matern52, "rq": _kernels.RationalQuadratic}


def _choice(value, options, name):
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")
    return value


def _named(name, check, *args, **kwargs):
    """``check(*args, **kwargs)`` (scikit-learn's input validation), its ValueError or
    TypeError naming the argument ``name`` ("Found array with dim 3 ..." becomes "X is not
    valid: Found array with dim 3 ...")."""
    try:
        return check(*args, **kwargs)
    except (ValueError, TypeError) as err:
        if re.search(rf"\b{name}\b", str(err)):
            raise
        kind = ValueError if isinstance(err, ValueError) else TypeError
        raise kind(f"{name} is not valid: {err}") from err


def _check_finite_output(values, what):
    """Predictions that are finite (a ValueError otherwise: never a NaN or inf returned)."""
    if not np.all(np.isfinite(values)):
        raise ValueError(f"the {what} are not finite in float64: the targets' scale is too "
                         "close to the float range (rescale y)")
    return values


def _store_params(estimator, params):
    """Keep every constructor argument as an attribute of the same name, as scikit-learn
    requires of ``__init__`` (no validation here: ``fit`` validates)."""
    for name, value in params.items():
        if name != "self":
            setattr(estimator, name, value)


# The likelihood's predictive integrals as one compiled program per input shape: run op by
# op, each of their dozens of primitives would compile for every new shape (scikit-learn's
# checks predict at many shapes).
@eqx.filter_jit
def _likelihood_moments(likelihood, mean, var, what):
    return likelihood.predict_y(mean, var) if what == "y" else likelihood.predict_proba(mean,
                                                                                         var)


@eqx.filter_jit
def _predictive_log_prob(likelihood, y, mean, var):
    return likelihood.predictive_log_prob(y, mean, var)


class _GPEstimator(BaseEstimator):
    """The shared fitting path; subclasses choose the likelihood and the target encoding."""

    _likelihoods: dict = {}
    posterior_: eqx.Module  # set by fit; declared so that a loaded model file is type-checked

    def _seed(self):
        try:
            state = check_random_state(self.random_state)
        except ValueError as err:  # scikit-learn's message does not name the argument
            raise ValueError(f"random_state must be None, an integer in [0, 2**32) or a "
                             f"numpy RandomState, got {self.random_state!r}") from err
        return int(state.randint(2**31 - 1))

    def _kernel(self, d):
        if not isinstance(self.kernel, str):
            if not isinstance(self.kernel, _kernels.Kernel):
                raise ValueError("kernel must be one of "
                                 f"{sorted(KERNELS)} or an augmentedgp kernel, got {self.kernel!r}")
            return self.kernel
        cls = KERNELS[_choice(self.kernel, KERNELS, "kernel")]
        # standardised inputs: pairwise distances are ~sqrt(2 d)
        scale = np.sqrt(max(d, 1))
        return cls(lengthscale=np.full(d, scale) if self.ard else scale, variance=1.0)

    def _fit_latent(self, X, y, likelihood, frozen=False):
        """Standardise X and fit the model :class:`~augmentedgp.Plan` chooses; sets the
        fitted attributes. ``frozen``: keep the hyperparameters at their initial values and
        fit q(u) alone (a constant target, whose likelihood grows without bound as the
        noise shrinks to 0)."""
        import jax

        self._scaler = Standardizer(X, "X")
        Xs = self._scaler.transform(X)
        plan = Plan(n_inducing=self.n_inducing, batch_size=self.batch_size,
                    inference=getattr(self, "inference", "auto"), fixed_hyperparameters=frozen)
        max_iter = check_int(self.max_iter, "max_iter", allow_none=True)
        key = jax.random.key(self._seed())
        spec = VGP(self._kernel(X.shape[1]), likelihood)
        self.posterior_ = fit(spec, Xs, y, plan, max_iter=max_iter, key=key,
                              verbose=bool(self.verbose))
        history = self.posterior_.history
        if frozen:
            history = dataclasses.replace(history, message=history.message + (
                "; constant target: the hyperparameters were kept at their initial values"))
        self.history_ = history
        self.n_iter_ = max(1, len(history.objective))
        if history.status not in ("converged", "early_stopped", "budget"):
            # scikit-learn's convention: a max_iter the user set was too small
            warnings.warn(f"{type(self).__name__} stopped before converging "
                          f"({history.message}); raise max_iter", ConvergenceWarning,
                          stacklevel=user_stacklevel())
        self.sparse_ = plan.choose(likelihood, X.shape[0], max_iter).sparse
        return self

    def _fit_data(self, X, y, numeric):
        """X (n >= 2, d) and y (n,) validated by scikit-learn (sets ``n_features_in_``); a
        ValueError names the argument at fault. ``numeric``: y as float64."""
        with np.errstate(over="ignore", invalid="ignore"):  # scikit-learn's finiteness test
            # sums the array first: y = (-1e308, 1e308) warns before its clear ValueError
            # X alone first, so that its errors name X; then X and y from the caller's X
            # (a DataFrame keeps its column names as feature_names_in_)
            _named("X", validate_data, self, X, dtype=np.float64, ensure_min_samples=2)
            X, y = _named("y", validate_data, self, X, y, dtype=np.float64, y_numeric=numeric,
                          ensure_min_samples=2)
        return X, (check_finite(y, "y") if numeric else y)

    def _check_X(self, X):
        """X validated against the fitted estimator (NotFittedError before ``fit``)."""
        check_is_fitted(self, "posterior_")
        return _named("X", validate_data, self, X, reset=False, dtype=np.float64)

    def _score_data(self, X, y, sample_weight):
        """(X, y, sample_weight) of ``score``: y one finite target per row of X (labels for
        a classifier), sample_weight None or finite, non-negative, not all 0. X is returned
        as given (checked): ``predict`` checks it again with its column names."""
        n = self._check_X(X).shape[0]
        if isinstance(self, ClassifierMixin):
            y = check_vector(y, n, "y")
            if y.dtype.kind in "fc" or (y.dtype.kind == "O" and any(
                    isinstance(v, float) and not np.isfinite(v) for v in y)):
                check_finite(y, "y")
        else:
            y = check_y(y, n, "y")
            if n < 2:  # R^2 and D^2 divide by the spread of y: undefined (NaN) on one row
                raise ValueError("score needs at least 2 rows of X and y (R^2 / D^2 compare "
                                 "with the spread of y), got 1")
        if sample_weight is not None:
            sample_weight = check_finite(sample_weight, "sample_weight")
            if sample_weight.shape != (n,):
                raise ValueError(f"sample_weight must have shape ({n},) (one weight per row of "
                                 f"X), got {sample_weight.shape}")
            if np.any(sample_weight < 0) or not np.any(sample_weight > 0):
                raise ValueError("sample_weight must be non-negative and not all 0")
        return X, y, sample_weight

    @property
    def input_scaler_(self) -> Standardizer:
        """The standardisation of X learnt in ``fit``: the posterior works on its scale."""
        return self._scaler

    def _latent(self, X, what="f"):
        """Mean and variance of the latent function(s) at X ("f"), or of y ("y"), or the
        class probabilities ("proba")."""
        X = self._check_X(X)
        post = self.posterior_
        mean, var = post.predict_f(self._scaler.transform(X))
        out = (mean, var) if what == "f" else _likelihood_moments(post.likelihood, mean, var,
                                                                   what)
        return tuple(np.asarray(a) for a in out) if isinstance(out, tuple) else np.asarray(out)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class _Regressor(RegressorMixin, _GPEstimator):
    """Regression-type estimators: predictive mean, sd and quantiles of y."""

    @property
    def target_scale_(self) -> tuple[float, float]:
        """(shift, scale) with y = shift + scale * (the target the model was fitted on)."""
        return getattr(self, "_y_shift", 0.0), getattr(self, "_y_scale_", 1.0)

    def predict(self, X, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean of y at X; with ``return_std`` also its standard deviation."""
        ey, vy = self._latent(X, "y")
        shift, scale = self.target_scale_
        ey = _check_finite_output(np.asarray(ey) * scale + shift, "predictions")
        if return_std:
            if isinstance(self.posterior_.likelihood, _lik.StudentT):
                self.posterior_.likelihood.check_variance("return_std")
            return ey, _check_finite_output(np.sqrt(np.maximum(np.asarray(vy), 0.0)) * scale,
                                            "predictive standard deviations")
        return ey

    def score(self, X, y, sample_weight=None) -> float:
        """R^2 of ``predict(X)`` against y (scikit-learn's RegressorMixin.score)."""
        X, y, sample_weight = self._score_data(X, y, sample_weight)
        return super().score(X, y, sample_weight=sample_weight)

    def log_predictive_density(self, X, y) -> np.ndarray:
        """log p(y_i | training data) at each row of X, integrated over q(f) (the mean of
        its negative is the NLPD)."""
        mean, var = self._latent(X)
        y = check_y(y, mean.shape[0], "y")
        shift, scale = self.target_scale_
        lik = self.posterior_.likelihood
        yy = lik.check_targets(y / scale - shift / scale)  # no overflow of y - shift
        return np.asarray(_predictive_log_prob(lik, yy, mean, var)) - np.log(scale)

    def predict_quantiles(self, X, quantiles=(0.025, 0.5, 0.975)) -> np.ndarray:
        """Quantiles of the predictive distribution of y at X, shape (n, len(quantiles)):
        the fitted posterior's ``predict_quantiles`` (see the likelihoods'
        ``predictive_quantile``), on the original scale of y."""
        q = check_levels(quantiles)
        X = self._check_X(X)
        out = self.posterior_.predict_quantiles(self._scaler.transform(X), q)
        shift, scale = self.target_scale_
        return _check_finite_output(out * scale + shift, "predictive quantiles")

    def predict_interval(self, X, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval of y at X with coverage ``level``: (lower, upper)."""
        if (not isinstance(level, numbers.Real) or isinstance(level, bool | np.bool_)
                or not 0.0 < level < 1.0):
            raise ValueError(f"level must lie strictly inside (0, 1), got {level!r}")
        qs = self.predict_quantiles(X, (0.5 - level / 2, 0.5 + level / 2))
        return qs[:, 0], qs[:, 1]


class GPRegressor(_Regressor):
    """Gaussian-process regression with a Gaussian, Student-t or Laplace likelihood.

    Parameters
    ----------
    likelihood : "gaussian" (exact GP, or SGPR when sparse), "student_t" or "laplace"
        (robust; by default augmented conjugate VI, then tight sites from its result:
        ``AnalyticVI(objective="tight")``, which predicted better than the augmented fit
        alone).
    kernel : "rbf", "matern12", "matern32", "matern52", "rq", or an augmentedgp kernel
        (its lengthscales act on standardised inputs).
    ard : one lengthscale per input dimension.
    n_inducing : the size threshold of the sparse model: with more training points than
        ``n_inducing``, the model is sparse (SGPR for a Gaussian likelihood, SVGP otherwise)
        with that many k-means inducing inputs; with fewer, it is the full model (exact GP or
        full variational GP). ``"auto"`` (default) is 100 for the variational models and,
        for a Gaussian likelihood, the exact GP up to 2000 points and 500 above. ``None``
        never uses a sparse model.
    batch_size : minibatches of stochastic VI (non-Gaussian likelihoods). ``"auto"``
        (default): full batch up to 2000 points; above, minibatches of 1000 points for
        30 epochs (600 to 5000 iterations; the stopping rule compares epoch averages of the
        objective), then 10 full-batch iterations from that solution (the constants of
        :mod:`augmentedgp.inference.plan`, which this estimator fits with). None: full
        batch; an int: minibatches of that size, no full-batch finish.
    df : Student-t degrees of freedom (fixed).
    inference : "auto" (augmented VI), "analytic" or "quadrature".
    normalize_y : standardise the targets before fitting (moments computed from y / 2^k,
        2^k >= max|y|, so any finite scale works, 1e-300 to 1e300; a constant y keeps the
        hyperparameters at their initial values, as its likelihood has no maximum, and has
        scale max|y|). The inputs are standardised the same way, always.
    max_iter : iterations of the optimiser (default 200 for L-BFGS, 500 full-batch VI,
        2000 minibatch VI with an explicit ``batch_size``, the epoch budget above with
        ``"auto"``). A ``max_iter`` that stops the fit before it converges raises
        scikit-learn's ``ConvergenceWarning``, except the VI defaults without
        ``batch_size="auto"``'s minibatches (500 full-batch, 2000 with an int
        ``batch_size``), which are budgets: ``history_.message`` then says so, with the
        objective's last relative change.
    random_state : seeds the k-means inducing points and minibatches.
    verbose : show a progress bar.
    """

    _likelihoods = {"gaussian": lambda s: _lik.Gaussian(0.1),
                    "student_t": lambda s: _lik.StudentT(fixed(positive(s.df, "df")), 0.1),
                    "laplace": lambda s: _lik.Laplace(0.1)}

    def __init__(self, likelihood="gaussian", kernel="rbf", *, ard=True, n_inducing="auto",
                 batch_size="auto", df=4.0, inference="auto",
                 normalize_y=True, max_iter=None, random_state=None, verbose=False):
        _store_params(self, locals())

    def fit(self, X, y) -> GPRegressor:
        """Fit to inputs X (n, d) and real targets y (n,)."""
        name = _choice(self.likelihood, self._likelihoods, "likelihood")
        if name == "student_t" and not (
                isinstance(self.df, numbers.Real) and not isinstance(self.df, bool)
                and np.isfinite(self.df) and self.df > 0):
            raise ValueError(f"df must be finite and > 0 (a real number), got {self.df!r}")
        X, y = self._fit_data(X, y, numeric=True)
        if self.normalize_y:  # overflow-safe: y ~ 1e300 and y ~ 1e-300 alike
            scaler = Standardizer(y, "y")
            z, self._y_shift, self._y_scale_ = (scaler.transform(y), float(scaler.mean),
                                                float(scaler.scale))
            if not np.any(z):  # a constant y sets no scale of its own: its magnitude
                self._y_scale_ = float(np.max(np.abs(y))) or 1.0
        else:
            z, self._y_shift, self._y_scale_ = y, 0.0, 1.0
        return self._fit_latent(X, z, self._likelihoods[name](self), frozen=not np.any(z))


class GPCountRegressor(_Regressor):
    """Gaussian-process regression of counts: Poisson (log link, quadrature VI, whose
    expectations are closed-form) or negative binomial (logistic link, augmented VI, then
    tight sites from its result: ``AnalyticVI(objective="tight")``, whose test NLL on large
    counts was far better than the augmented fit's).

    Targets are non-negative; as in scikit-learn's PoissonRegressor, non-integer values
    are accepted (the same log density extended by gamma functions). ``predict`` is the
    predictive mean E[y]; ``score`` is the fraction of Poisson deviance explained (D^2).
    ``r`` is the initial negative-binomial dispersion (learnt). Other parameters as in
    :class:`GPRegressor`.
    """

    _likelihoods = {"poisson": lambda s: _lik.Poisson(integer=False),
                    "negative_binomial": lambda s: _lik.NegativeBinomial(s.r, integer=False)}

    def __init__(self, likelihood="poisson", kernel="rbf", *, ard=True, n_inducing="auto",
                 batch_size="auto", r=1.0, inference="auto",
                 max_iter=None, random_state=None, verbose=False):
        _store_params(self, locals())

    def fit(self, X, y) -> GPCountRegressor:
        """Fit to inputs X (n, d) and non-negative counts y (n,)."""
        name = _choice(self.likelihood, self._likelihoods, "likelihood")
        X, y = self._fit_data(X, y, numeric=True)
        if np.any(y < 0):
            raise ValueError(f"y must hold non-negative counts ({type(self).__name__}), got "
                             f"minimum {y.min()}")
        return self._fit_latent(X, y, self._likelihoods[name](self))

    def score(self, X, y, sample_weight=None) -> float:
        """D^2: the fraction of Poisson deviance explained (1 is perfect)."""
        X, y, sample_weight = self._score_data(X, y, sample_weight)
        if np.any(y < 0):
            raise ValueError(f"y must hold non-negative counts, got minimum {y.min()}")
        return d2_tweedie_score(y, self.predict(X), sample_weight=sample_weight, power=1)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        return tags


class GPClassifier(ClassifierMixin, _GPEstimator):
    """Gaussian-process classification, binary or multi-class, with any label set.

    ``likelihood``: "logistic" (default; Pólya-Gamma augmented: the logistic likelihood for
    two classes, the logistic-softmax for more), "probit" (two classes), "softmax" or
    "robustmax" (any number of classes). ``inference``: "auto" (augmented conjugate VI
    where the likelihood allows it, quadrature VI otherwise), "analytic" or "quadrature"; the
    augmented multi-class fit learns its hyperparameters on the plain ELBO: full batch at
    its optimum (``objective="tight"``: on letter and digits its test NLL was 0.5-0.6x that
    of the augmented bound's, within 6% of the softmax's), with minibatches at the augmented
    q(u) (``objective="exact"``); a full-batch quadrature fit of several latent functions
    takes natural steps of 0.5. Other parameters as in :class:`GPRegressor`.
    ``predict_proba`` integrates the class probabilities over the posterior of the latent
    functions.
    """

    def __init__(self, likelihood="logistic", kernel="rbf", *, ard=True, n_inducing="auto",
                 batch_size="auto", inference="auto", max_iter=None,
                 random_state=None, verbose=False):
        _store_params(self, locals())

    def _make_likelihood(self, n_classes):
        name = _choice(self.likelihood, ("logistic", "probit", "softmax", "robustmax"),
                       "likelihood")
        if n_classes == 2 and name in ("logistic", "probit"):
            return _lik.Logistic() if name == "logistic" else _lik.Probit()
        if name == "probit":
            raise ValueError(f"likelihood='probit' is binary; y has {n_classes} classes (use "
                             "'logistic', 'softmax' or 'robustmax')")
        cls = {"logistic": _lik.LogisticSoftmax, "softmax": _lik.Softmax,
               "robustmax": _lik.RobustMax}[name]
        return cls(n_classes)

    def fit(self, X, y) -> GPClassifier:
        """Fit to inputs X (n, d) and class labels y (n,) of any type."""
        X, y = self._fit_data(X, y, numeric=False)
        _named("y", check_classification_targets, y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 classes; y has 1 class "
                             f"({self.classes_[0]!r})")
        return self._fit_latent(X, codes.astype(np.float64 if len(self.classes_) == 2
                                                else np.int64),
                                self._make_likelihood(len(self.classes_)))

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, (n, n_classes), columns in the order of ``classes_``."""
        p = self._latent(X, "proba")
        if p.ndim == 1:
            p = np.stack([1.0 - p, p], axis=1)
        return p / p.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X) -> np.ndarray:
        return np.log(self.predict_proba(X))

    def predict(self, X) -> np.ndarray:
        """The most probable class of each row of X."""
        check_is_fitted(self, "posterior_")
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy of ``predict(X)`` against the labels y (scikit-learn's
        ClassifierMixin.score)."""
        X, y, sample_weight = self._score_data(X, y, sample_weight)
        return _named("y", super().score, X, y, sample_weight=sample_weight)


__all__ = ["GPRegressor", "GPClassifier", "GPCountRegressor", "KERNELS"]
