"""GP models and their posteriors: the exact/Laplace/EP ``GP`` (with its site
approximations), the collapsed sparse GPs (``SGPR``, ``DTC``, ``FITC``, ``TaylorSGPR``; base
``CollapsedSparseGP``), ``SVGP``/``VGP``, the Gibbs-sampled ``MCGP``; inducing-point
selection."""

from augmentedgp.models import inducing
from augmentedgp.models.approximations import EP, Exact, Laplace
from augmentedgp.models.gp import GP
from augmentedgp.models.mcgp import MCGP, MCPosterior
from augmentedgp.models.sites import Predictive, SitePosterior
from augmentedgp.models.sparse import (
    DTC,
    FITC,
    SGPR,
    SVGP,
    VGP,
    CollapsedSparseGP,
    SparsePosterior,
    TaylorPoint,
    TaylorSGPR,
)

__all__ = ["GP", "SGPR", "DTC", "FITC", "TaylorSGPR", "CollapsedSparseGP", "SVGP", "VGP", "MCGP",
           "Exact", "Laplace", "EP", "Predictive", "SitePosterior", "SparsePosterior",
           "MCPosterior", "TaylorPoint", "inducing"]
