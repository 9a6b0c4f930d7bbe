"""Covariance functions (``augmentedgp.kernels``) and mean functions
(``augmentedgp.kernels.means``), as ``equinox`` modules with constrained parameters."""

from augmentedgp.kernels import means
from augmentedgp.kernels.covariance import (
    RBF,
    Constant,
    Kernel,
    Linear,
    Matern12,
    Matern32,
    Matern52,
    Periodic,
    Polynomial,
    Product,
    RationalQuadratic,
    Scaled,
    SquaredExponential,
    Stationary,
    Sum,
    White,
)

__all__ = ["Kernel", "Sum", "Product", "Scaled", "Stationary", "RBF", "SquaredExponential",
           "Matern12", "Matern32", "Matern52", "RationalQuadratic", "Periodic", "Linear",
           "Polynomial", "Constant", "White", "means"]
