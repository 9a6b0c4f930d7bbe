"""Infrastructure without GP concepts: linear algebra, parameters and priors, validation at
the public boundary, quadrature, errors, the compiled optimisation loop, MCMC
diagnostics and the process-wide runtime settings (BLAS threads, compilation cache)."""

from augmentedgp.core import (
    diagnostics,
    linalg,
    loop,
    params,
    precision,
    quadrature,
    runtime,
    validation,
)
from augmentedgp.core.errors import AugmentedGPError, ConvergenceError, NotPositiveDefiniteError
from augmentedgp.core.loop import History

__all__ = ["diagnostics", "linalg", "loop", "params", "precision", "quadrature", "runtime",
           "validation", "AugmentedGPError", "ConvergenceError", "NotPositiveDefiniteError",
           "History"]
