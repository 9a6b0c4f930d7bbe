"""augmentedgp: Gaussian processes with non-Gaussian likelihoods, in JAX.

Importing the package enables float64 in JAX (set AUGMENTEDGP_DISABLE_X64=1 to opt out)
and changes nothing else; the BLAS thread limit and the compilation cache apply inside
the library's own calls (``augmentedgp.core.runtime``).

Layers, from the bottom (each imports only from those above it in this list):
``core`` -> ``kernels`` -> ``augmentation`` -> ``likelihoods`` -> ``variational`` ->
``models`` -> ``inference`` -> ``training`` -> front ends (``persistence``, ``datasets``,
``sklearn``, ``plotting``, ``cli``) -> ``contrib`` -> ``testing``.
"""

import augmentedgp.core.precision  # noqa: F401  (first: float64 before any array is created)
import augmentedgp.core.runtime  # noqa: F401  (reads the BLAS policy; applies nothing)
from augmentedgp import (
    augmentation,
    contrib,
    core,
    datasets,
    inference,
    kernels,
    likelihoods,
    models,
    persistence,
    training,
    variational,
)
from augmentedgp.core import diagnostics, linalg, params
from augmentedgp.core.errors import AugmentedGPError, ConvergenceError, NotPositiveDefiniteError
from augmentedgp.core.loop import History
from augmentedgp.core.version import __version__
from augmentedgp.inference import (
    ADVI,
    SVGD,
    AnalyticSVI,
    AnalyticVI,
    Collapsed,
    CollapsedVI,
    GaussianFlow,
    GibbsSampling,
    ParticleFlow,
    Plan,
    QuadratureSVI,
    QuadratureVI,
    fit_gaussian,
    sample,
)
from augmentedgp.inference.flow import VariationalGaussian
from augmentedgp.kernels import means
from augmentedgp.models import (
    DTC,
    EP,
    FITC,
    GP,
    MCGP,
    SGPR,
    SVGP,
    VGP,
    CollapsedSparseGP,
    Exact,
    Laplace,
    MCPosterior,
    SitePosterior,
    SparsePosterior,
    TaylorSGPR,
    inducing,
)
from augmentedgp.persistence import load, save
from augmentedgp.training import fit
from augmentedgp.variational import schedules

_LAZY = {"sklearn": "augmentedgp.sklearn", "plotting": "augmentedgp.plotting",
         "distributed": "augmentedgp.training.distributed", "testing": "augmentedgp.testing"}


def __getattr__(name):
    """``agp.sklearn``, ``agp.plotting``, ``agp.distributed`` and ``agp.testing`` load on
    first use (they import scikit-learn, matplotlib, Dask and the test oracles)."""
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GP", "SGPR", "DTC", "FITC", "TaylorSGPR", "CollapsedSparseGP", "SVGP", "VGP", "MCGP",
    "fit", "sample", "Exact", "Laplace", "EP", "Collapsed", "CollapsedVI", "Plan",
    "QuadratureVI", "QuadratureSVI", "AnalyticVI", "AnalyticSVI", "GibbsSampling",
    "ParticleFlow", "GaussianFlow", "ADVI", "SVGD", "fit_gaussian", "VariationalGaussian",
    "SitePosterior", "SparsePosterior", "MCPosterior", "History", "save", "load",
    "core", "kernels", "means", "augmentation", "likelihoods", "variational", "models",
    "inference", "training", "contrib", "datasets", "persistence", "diagnostics", "linalg",
    "params", "inducing", "schedules", "sklearn", "plotting", "distributed", "testing",
    "AugmentedGPError", "ConvergenceError", "NotPositiveDefiniteError", "__version__",
]
