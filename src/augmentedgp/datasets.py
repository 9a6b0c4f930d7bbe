"""Small real datasets shipped with the package, for demos, docs and smoke tests.

- ``yacht``: UCI Yacht Hydrodynamics (308 x 6, regression; CC BY 4.0).
- ``a9a_small``: 1,000 training and 1,000 test rows drawn at random (seed 0) from the
  LIBSVM a9a encoding of UCI Adult (123 binary features, income > 50K; CC BY 4.0).
"""

from __future__ import annotations

from importlib import resources

import numpy as np

NAMES = ("yacht", "a9a_small")


def load(name: str) -> dict[str, np.ndarray]:
    """The arrays of a built-in dataset by name (see ``NAMES``)."""
    if name not in NAMES:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(NAMES)}")
    with resources.files(__package__).joinpath(f"data/{name}.npz").open("rb") as fh:
        with np.load(fh) as data:
            return {k: data[k] for k in data.files}


def train_test_split(X, y, test_fraction: float = 0.2, seed: int = 0):
    """A random split: (X_train, y_train, X_test, y_test)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    idx = np.random.default_rng(seed).permutation(len(y))
    n_test = max(1, int(round(test_fraction * len(y))))
    te, tr = idx[:n_test], idx[n_test:]
    return X[tr], y[tr], X[te], y[te]


class Standardizer:
    """Column-wise standardisation fitted on training data; zero-variance columns are
    centred but not scaled (so constant columns never produce NaN)."""

    def __init__(self, data):
        data = np.asarray(data, dtype=float)
        self.mean = data.mean(axis=0)
        sd = data.std(axis=0)
        self.scale = np.where(sd > 0, sd, 1.0)

    def transform(self, data):
        return (np.asarray(data, dtype=float) - self.mean) / self.scale

    def inverse(self, data):
        return np.asarray(data, dtype=float) * self.scale + self.mean
