"""Observation models p(y | f). Every likelihood implements :class:`Likelihood`; those that
also implement :class:`~augmentedgp.augmentation.Augmented` are conditionally conjugate
(AnalyticVI, AnalyticSVI, Gibbs sampling)."""

from augmentedgp.augmentation import Augmented
from augmentedgp.likelihoods.base import Likelihood, MultiLatent
from augmentedgp.likelihoods.binary import BayesianSVM, Bernoulli, Logistic, Probit
from augmentedgp.likelihoods.counts import LogisticPoisson, NegativeBinomial, Poisson, PoissonTilt
from augmentedgp.likelihoods.heteroscedastic import (
    HeteroscedasticGaussian,
    HeteroscedasticStudentT,
    HeteroStudentTilt,
    HeteroTilt,
)
from augmentedgp.likelihoods.multiclass import (
    Categorical,
    LogisticSoftmax,
    RobustMax,
    Softmax,
    SoftmaxTilt,
)
from augmentedgp.likelihoods.positive import Beta, Gamma
from augmentedgp.likelihoods.robust import Gaussian, Laplace, Matern32, StudentT
from augmentedgp.likelihoods.super_gaussian import SuperGaussian

__all__ = ["Likelihood", "MultiLatent", "Gaussian", "StudentT", "Laplace", "Matern32",
           "Bernoulli", "Logistic", "Probit", "BayesianSVM", "Poisson", "LogisticPoisson",
           "NegativeBinomial", "Gamma", "Beta", "Categorical", "LogisticSoftmax", "Softmax",
           "RobustMax", "HeteroscedasticGaussian", "HeteroscedasticStudentT", "PoissonTilt",
           "SoftmaxTilt", "HeteroTilt", "HeteroStudentTilt", "SuperGaussian", "augmentable"]


def augmentable() -> tuple[type[Likelihood], ...]:
    """The built-in likelihoods with an augmentation, i.e. the subclasses of both
    :class:`Likelihood` and :class:`~augmentedgp.augmentation.Augmented` in this package
    (a user's own augmented likelihood qualifies the same way, by its type)."""
    return tuple(c for c in map(globals().get, __all__)
                 if isinstance(c, type) and issubclass(c, Likelihood) and issubclass(c, Augmented))
