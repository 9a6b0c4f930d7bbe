"""Training: ``fit`` for every model and inference method, dispatched by
(model type, inference type) (``training.dispatch``: ``register`` plugs in a new pair), the
one variational iteration it shares with the distributed executors
(``augmentedgp.training.distributed``, loaded on first use because it needs Dask for
clusters)."""

from augmentedgp.training.collapsed import fit_collapsed
from augmentedgp.training.dispatch import FitSettings, register, register_default
from augmentedgp.training.fit import fit, perturb

__all__ = ["fit", "perturb", "fit_collapsed", "FitSettings", "register", "register_default"]
