"""Latent-variable augmentation: the protocol that turns a scale-mixture likelihood into a
conditionally conjugate Gaussian site, and the samplers of the auxiliary variables."""

from augmentedgp.augmentation import samplers
from augmentedgp.augmentation.protocol import (
    Augmented,
    CountAux,
    PolyaGamma,
    SuperGaussian,
    Tilt,
    log_cosh,
    log_cosh_sqrt,
    tanh_ratio,
)

__all__ = ["Augmented", "CountAux", "PolyaGamma", "SuperGaussian", "Tilt", "log_cosh",
           "log_cosh_sqrt", "tanh_ratio", "samplers"]
