"""Inference methods: the full GP's Exact, Laplace and EP (defined with the model), the
variational methods for SVGP/VGP, augmented Gibbs sampling and Gaussian particle flows."""

from augmentedgp.inference import flow
from augmentedgp.inference.flow import (
    ADVI,
    PARTICLE_FLOWS,
    SVGD,
    FlowMethod,
    GaussianFlow,
    ParticleFlow,
    fit_gaussian,
)
from augmentedgp.inference.gibbs import GibbsSampling, sample
from augmentedgp.inference.vi import AnalyticSVI, AnalyticVI, QuadratureSVI, QuadratureVI
from augmentedgp.models.approximations import EP, Exact, Laplace

__all__ = ["Exact", "Laplace", "EP", "QuadratureVI", "QuadratureSVI", "AnalyticVI",
           "AnalyticSVI", "GibbsSampling", "sample", "ParticleFlow", "GaussianFlow", "ADVI",
           "SVGD", "FlowMethod", "PARTICLE_FLOWS", "fit_gaussian", "flow"]
