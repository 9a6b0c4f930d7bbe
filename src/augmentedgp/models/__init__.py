"""GP models and their posteriors: the exact/Laplace/EP ``GP`` (with its site
approximations), ``SGPR``, ``SVGP``/``VGP``, the Gibbs-sampled ``MCGP``; inducing-point
selection."""

from augmentedgp.models import inducing
from augmentedgp.models.approximations import EP, Exact, Laplace
from augmentedgp.models.gp import GP
from augmentedgp.models.mcgp import MCGP, MCPosterior
from augmentedgp.models.sites import Predictive, SitePosterior
from augmentedgp.models.sparse import SGPR, SVGP, VGP, SparsePosterior, TaylorPoint

__all__ = ["GP", "SGPR", "SVGP", "VGP", "MCGP", "Exact", "Laplace", "EP", "Predictive",
           "SitePosterior", "SparsePosterior", "MCPosterior", "TaylorPoint", "inducing"]
