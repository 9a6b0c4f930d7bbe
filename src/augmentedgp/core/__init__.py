"""Infrastructure without GP concepts: linear algebra, parameters and priors, validation at
the public boundary, quadrature, errors, the compiled optimisation loop and MCMC
diagnostics."""

from augmentedgp.core import (
    diagnostics,
    linalg,
    loop,
    params,
    precision,
    quadrature,
    validation,
)
from augmentedgp.core.errors import AugmentedGPError, ConvergenceError, NotPositiveDefiniteError
from augmentedgp.core.loop import History

__all__ = ["diagnostics", "linalg", "loop", "params", "precision", "quadrature", "validation",
           "AugmentedGPError", "ConvergenceError", "NotPositiveDefiniteError", "History"]
