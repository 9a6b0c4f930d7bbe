"""Small real datasets shipped with the package, for demos, docs and smoke tests.

- ``yacht``: UCI Yacht Hydrodynamics (308 x 6, regression; CC BY 4.0).
- ``a9a_small``: 1,000 training and 1,000 test rows drawn at random (seed 0) from the
  LIBSVM a9a encoding of UCI Adult (123 binary features, income > 50K; CC BY 4.0).
"""

from __future__ import annotations

from importlib import resources

import numpy as np
from jaxtyping import ArrayLike

from augmentedgp.core.validation import check_finite

NAMES = ("yacht", "a9a_small")


def load(name: str) -> dict[str, np.ndarray]:
    """The arrays of a built-in dataset by name (see ``NAMES``)."""
    if name not in NAMES:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(NAMES)}")
    with resources.files(__package__).joinpath(f"data/{name}.npz").open("rb") as fh:
        with np.load(fh) as data:
            return {k: data[k] for k in data.files}


def train_test_split(X: np.ndarray, y: np.ndarray, test_fraction: float = 0.2, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random split: (X_train, y_train, X_test, y_test)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    idx = np.random.default_rng(seed).permutation(len(y))
    n_test = max(1, int(round(test_fraction * len(y))))
    te, tr = idx[:n_test], idx[n_test:]
    return X[tr], y[tr], X[te], y[te]


class Standardizer:
    """Column-wise standardisation fitted on training data (a 1-D array is one column);
    zero-variance columns are centred but not scaled (so constant columns never produce
    NaN).

    The moments are those of U = data / 2^k, 2^k the power of two just above each
    column's max |value| (|U| < 1: no square overflows for data ~ 1e300, nothing
    underflows for data ~ 1e-300); scaling by a power of two is exact, so for ordinary
    data they are numpy's mean and sd to the last bit. A ValueError names ``name`` if the
    data are not finite real numbers, or a column's spread exceeds float64 or its sd is
    below the smallest normal float64."""

    def __init__(self, data, name: str = "data"):
        data = check_finite(data, name)
        if data.ndim not in (1, 2) or data.shape[0] == 0:
            raise ValueError(f"{name} must be a 1-D or 2-D array with at least one row, got "
                             f"shape {data.shape}")
        hi, lo = np.max(data, axis=0), np.min(data, axis=0)
        k = np.frexp(np.maximum(np.abs(hi), np.abs(lo)))[1]
        U = np.ldexp(data, -k)
        constant = hi == lo
        # a constant column: its value exactly (the mean of equal numbers may round)
        mean = np.where(constant, data[0], np.ldexp(U.mean(axis=0), k))
        sd = np.ldexp(U.std(axis=0), k)
        with np.errstate(over="ignore"):
            spread = np.ldexp(hi * 0.5 - lo * 0.5, 1)
        bad = np.atleast_1d(~np.isfinite(spread) | (~constant & (sd < np.finfo(float).tiny)))
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0])
            col = data[:, j] if data.ndim == 2 else data
            where = f"{name} column {j}" if data.ndim == 2 else name
            raise ValueError(f"{where} spans more than the float64 range or less than its "
                             f"smallest normal number (min {col.min():.3g}, max "
                             f"{col.max():.3g}): rescale {name}")
        self.mean = mean
        self.scale = np.where(constant, 1.0, sd)

    def transform(self, data: ArrayLike) -> np.ndarray:
        return (np.asarray(data, dtype=float) - self.mean) / self.scale

    def inverse(self, data: ArrayLike) -> np.ndarray:
        return np.asarray(data, dtype=float) * self.scale + self.mean
