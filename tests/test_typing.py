"""The package is typed (PEP 561 ``py.typed``) and its public signatures carry jaxtyping
shape annotations that resolve: ``typing.get_type_hints`` evaluates every annotation of the
public functions and methods, which also parses each shape string. Annotations are
documentation only -- nothing checks them at run time."""

from __future__ import annotations

import importlib
import inspect
import typing
from pathlib import Path

import jax
import numpy as np
import pytest

import augmentedgp as agp

ROOT = Path(__file__).resolve().parents[1]
ANNOTATED = [
    "augmentedgp.core.linalg", "augmentedgp.core.quadrature", "augmentedgp.core.validation",
    "augmentedgp.kernels.covariance",
    "augmentedgp.kernels.means", "augmentedgp.models.approximations", "augmentedgp.models.gp",
    "augmentedgp.models.inducing", "augmentedgp.models.mcgp", "augmentedgp.models.sites",
    "augmentedgp.models.sparse", "augmentedgp.inference.flow", "augmentedgp.inference.flow_gp",
    "augmentedgp.inference.gibbs", "augmentedgp.inference.vi", "augmentedgp.persistence",
    "augmentedgp.contrib.bayesian", "augmentedgp.contrib.bounds", "augmentedgp.contrib.dpp",
    "augmentedgp.launcher", "augmentedgp.training.fit", "augmentedgp.augmentation.protocol",
    "augmentedgp.augmentation.inversion", "augmentedgp.likelihoods.binary",
    "augmentedgp.likelihoods.counts", "augmentedgp.likelihoods.heteroscedastic",
    "augmentedgp.likelihoods.multiclass", "augmentedgp.likelihoods.positive",
    "augmentedgp.likelihoods.robust", "augmentedgp.likelihoods.super_gaussian",
    "augmentedgp.variational.families", "augmentedgp.variational.natgrad",
    "augmentedgp.variational.schedules", "augmentedgp.core.params", "augmentedgp.datasets",
    "augmentedgp.testing",
]


def test_py_typed_is_shipped():
    assert (ROOT / "src" / "augmentedgp" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


def _public_callables(module):
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr not in ("__init__", "__call__"):
                    continue
                if isinstance(member, property):
                    member = member.fget
                elif isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                if inspect.isfunction(member):
                    yield f"{name}.{attr}", member
        elif callable(obj):
            yield name, obj


@pytest.mark.parametrize("modname", ANNOTATED)
def test_annotations_resolve(modname):
    module = importlib.import_module(modname)
    checked, bad = 0, []
    for qual, fn in _public_callables(module):
        try:
            typing.get_type_hints(fn)  # NameError / TypeError on a bad annotation or shape
        except Exception as err:  # noqa: BLE001 -- report every failure at once
            bad.append(f"{modname}.{qual}: {err!r}")
        checked += 1
    assert checked and bad == []


def _hints(fn):
    return {k: str(v) for k, v in typing.get_type_hints(fn).items()}


def test_shapes_in_the_main_signatures():
    h = _hints(agp.GP.posterior)
    assert "'n d'" in h["X"] and "'n'" in h["y"]
    h = _hints(agp.SparsePosterior.predict_f)
    assert "'n d'" in h["Xnew"] and "'n *C'" in h["return"] and "'*C n n'" in h["return"]
    h = _hints(agp.SitePosterior.sample_f)
    assert "'S n *C'" in h["return"]
    assert "'n m'" in _hints(agp.kernels.RBF.__call__)["return"]
    assert "'n'" in _hints(agp.kernels.RBF.diag)["return"]


def test_annotations_are_not_checked_at_run_time():
    """A wrongly typed argument that the code accepts still works (no runtime checker)."""
    # (a 1-D X for a kernel, the former example here, is now refused by the kernels' own
    # input check: a ValueError from validation, not from a type checker)
    L = agp.linalg.cholesky(np.eye(3))  # a numpy array where the annotation says jax.Array
    assert isinstance(L, jax.Array)
