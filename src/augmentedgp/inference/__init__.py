"""Inference methods: the full GP's Exact, Laplace and EP (defined with the model), the
collapsed sparse models' Collapsed and CollapsedVI, the variational methods for SVGP/VGP,
augmented Gibbs sampling, Gaussian particle flows, and ``Plan`` (the library's choice of
model, inference and budget from the data size)."""

from augmentedgp.inference import flow
from augmentedgp.inference.collapsed import Collapsed, CollapsedVI
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
from augmentedgp.inference.plan import Plan
from augmentedgp.inference.vi import AnalyticSVI, AnalyticVI, QuadratureSVI, QuadratureVI
from augmentedgp.models.approximations import EP, Exact, Laplace

__all__ = ["Exact", "Laplace", "EP", "Collapsed", "CollapsedVI", "Plan", "QuadratureVI",
           "QuadratureSVI", "AnalyticVI", "AnalyticSVI", "GibbsSampling", "sample",
           "ParticleFlow", "GaussianFlow", "ADVI", "SVGD", "FlowMethod", "PARTICLE_FLOWS",
           "fit_gaussian", "flow"]
