"""Model directories saved by version 0.1.0 (the flat module layout) still load and predict
as they did when saved (tests/data/legacy_v0_1, with the predictions made then): to
rounding (rtol 1e-13), since a later change of the order of floating-point operations in the
solves moves predictions by ulps (3.6e-15 after the vmap-safe triangular solves) without
any change to the loaded model."""

from pathlib import Path

import numpy as np
import pytest

import augmentedgp as agp

DATA = Path(__file__).parent / "data" / "legacy_v0_1"
NAMES = ["svgp_logistic", "svgp_softmax", "gp_exact", "mcgp_studentt"]


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(DATA / "predictions.npz"))


@pytest.mark.parametrize("name", NAMES)
def test_legacy_model_loads_and_predicts_identically(name, reference):
    post = agp.load(DATA / name)
    mean, var = post.predict_f(reference["Xs"])
    np.testing.assert_allclose(np.asarray(mean), reference[f"{name}_mean"], rtol=1e-13)
    np.testing.assert_allclose(np.asarray(var), reference[f"{name}_var"], rtol=1e-13)
    if f"{name}_proba" in reference:
        np.testing.assert_allclose(np.asarray(post.predict_proba(reference["Xs"])),
                                   reference[f"{name}_proba"], rtol=1e-13)


def test_legacy_model_resaves_under_the_new_layout(tmp_path, reference):
    post = agp.load(DATA / "svgp_logistic")
    agp.save(post, tmp_path / "m")
    manifest = (tmp_path / "m" / "manifest.json").read_text()
    assert "augmentedgp.models.sparse:SparsePosterior" in manifest
    mean, _ = agp.load(tmp_path / "m").predict_f(reference["Xs"])
    np.testing.assert_allclose(np.asarray(mean), reference["svgp_logistic_mean"], rtol=1e-13)
