"""Research tools built on the library: PAC-Bayes bounds for GP classifiers, determinantal
point processes, Bayesian regression targets for the particle flows."""

from augmentedgp.contrib import bayesian, bounds, dpp

__all__ = ["bayesian", "bounds", "dpp"]
