import os
from pathlib import Path

import numpy as np
import pytest

import augmentedgp  # noqa: F401  (enables float64 before any test builds arrays)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FULL = os.environ.get("AGP_FULL_SLOW", "0") == "1"


def load_shared(name):
    path = DATA / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"shared dataset {path} not available")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def standardise(A):
    A = np.asarray(A, dtype=float)
    sd = A.std(0)
    return (A - A.mean(0)) / np.where(sd > 0, sd, 1.0)
