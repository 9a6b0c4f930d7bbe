"""augmentedgp: Gaussian processes with non-Gaussian likelihoods, in JAX.

Importing the package enables float64 in JAX (set AUGMENTEDGP_DISABLE_X64=1 to opt out).
"""

from . import (
    _x64,  # noqa: F401  (must run before any array is created)
    augmentation,
    bayesian,
    bounds,
    diagnostics,
    dpp,
    flow,
    inducing,
    inference,
    kernels,
    likelihoods,
    linalg,
    means,
    natgrad,
    params,
    persistence,
    samplers,
    schedules,
    variational,
)
from .errors import AugmentedGPError, ConvergenceError, NotPositiveDefiniteError
from .fit import fit
from .flow import ADVI, SVGD, GaussianFlow, ParticleFlow, VariationalGaussian, fit_gaussian
from .gibbs import MCGP, GibbsSampling, MCPosterior, sample
from .inference import EP, AnalyticSVI, AnalyticVI, Exact, Laplace, QuadratureSVI, QuadratureVI
from .models import GP
from .persistence import load, save
from .posterior import SitePosterior
from .sparse import SGPR, SVGP, VGP, SparsePosterior
from .training import History

__version__ = "0.1.0"


def __getattr__(name):
    """``agp.sklearn``, ``agp.plotting`` and ``agp.distributed`` load on first use (they
    import scikit-learn estimator machinery, matplotlib and Dask)."""
    if name in ("sklearn", "plotting", "distributed"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GP", "SGPR", "SVGP", "VGP", "MCGP", "fit", "sample", "Exact", "Laplace", "EP",
    "QuadratureVI", "QuadratureSVI", "AnalyticVI", "AnalyticSVI", "GibbsSampling",
    "ParticleFlow", "GaussianFlow", "ADVI", "SVGD", "fit_gaussian", "VariationalGaussian",
    "SitePosterior", "SparsePosterior", "MCPosterior", "History", "save", "load", "augmentation",
    "diagnostics", "distributed", "dpp", "flow", "inducing", "kernels", "likelihoods", "means",
    "natgrad",
    "inference",
    "linalg", "bayesian", "bounds", "params", "persistence", "plotting", "samplers", "schedules",
    "sklearn", "variational",
    "AugmentedGPError", "ConvergenceError", "NotPositiveDefiniteError",
]
