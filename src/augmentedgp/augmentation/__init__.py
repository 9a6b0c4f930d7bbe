"""Latent-variable augmentation: the protocol that turns a scale-mixture likelihood into a
conditionally conjugate Gaussian site, and the samplers of the auxiliary variables (exact ones
in ``samplers``; ``inversion`` draws the tilted mixing law of any phi numerically)."""

from augmentedgp.augmentation import inversion, samplers
from augmentedgp.augmentation.protocol import (
    Augmented,
    CountAux,
    PolyaGamma,
    ScaleMixture,
    SuperGaussianForm,
    Tilt,
    expected_h2,
    log_cosh,
    log_cosh_sqrt,
    log_polya_gamma_density,
    tanh_ratio,
)

__all__ = ["Augmented", "ScaleMixture", "PolyaGamma", "CountAux", "SuperGaussianForm", "Tilt",
           "expected_h2", "log_cosh", "log_cosh_sqrt", "log_polya_gamma_density", "tanh_ratio",
           "samplers", "inversion"]
