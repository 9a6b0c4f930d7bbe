"""Model directories saved by version 0.1.0 (the flat module layout) still load and predict
as they did when saved (tests/data/legacy_v0_1, with the predictions made then): to
rounding (rtol 1e-13), since a later change of the order of floating-point operations in the
solves moves predictions by ulps (3.6e-15 after the vmap-safe triangular solves) without
any change to the loaded model. Unfitted SGPR models saved with the `method` field of the
versions before SGPR, DTC, FITC and TaylorSGPR were one class each load as their class
(tests/data/legacy_sgpr_method).

The predictions are made in a process with XLA's default compilation settings, those that
made the reference (the suite compiles for speed, tests/conftest.py, which reorders some
sums: 1.1e-13 on the Student-t MCGP's mean)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST_COMPILE

import augmentedgp as agp

DATA = Path(__file__).parent / "data" / "legacy_v0_1"
NAMES = ["svgp_logistic", "svgp_softmax", "gp_exact", "mcgp_studentt"]


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(DATA / "predictions.npz"))


_PREDICT = """
import json, sys
import numpy as np
import augmentedgp as agp
data, out = sys.argv[1], {}
ref = np.load(data + "/predictions.npz")
Xs = ref["Xs"]
for name in sys.argv[2:]:
    post = agp.load(data + "/" + name)
    mean, var = post.predict_f(Xs)
    out[name] = {"mean": np.asarray(mean).tolist(), "var": np.asarray(var).tolist()}
    if name + "_proba" in ref:
        out[name]["proba"] = np.asarray(post.predict_proba(Xs)).tolist()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded():
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
    res = subprocess.run([sys.executable, "-c", _PREDICT, str(DATA), *NAMES], text=True,
                         capture_output=True, env={**os.environ, "XLA_FLAGS": " ".join(flags)},
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", NAMES)
def test_legacy_model_loads_and_predicts_identically(name, reference, loaded):
    got = loaded[name]
    np.testing.assert_allclose(got["mean"], reference[f"{name}_mean"], rtol=1e-13)
    np.testing.assert_allclose(got["var"], reference[f"{name}_var"], rtol=1e-13)
    if f"{name}_proba" in reference:
        np.testing.assert_allclose(got["proba"], reference[f"{name}_proba"], rtol=1e-13)


def test_legacy_model_resaves_under_the_new_layout(tmp_path, reference):
    post = agp.load(DATA / "svgp_logistic")
    agp.save(post, tmp_path / "m")
    manifest = (tmp_path / "m" / "manifest.json").read_text()
    assert "augmentedgp.models.sparse:SparsePosterior" in manifest
    mean, _ = agp.load(tmp_path / "m").predict_f(reference["Xs"])
    np.testing.assert_allclose(np.asarray(mean), reference["svgp_logistic_mean"], rtol=1e-13)


# --- SGPR with a method field: the models before the one-class-per-model split ------------
# (tests/data/legacy_sgpr_method, written by its generate.py with SGPR's method argument)

SPLIT = Path(__file__).parent / "data" / "legacy_sgpr_method"
SPLIT_CLASSES = {"sgpr_vfe": agp.SGPR, "sgpr_dtc": agp.DTC, "sgpr_fitc": agp.FITC,
                 "sgpr_taylor": agp.TaylorSGPR}


@pytest.mark.parametrize("name", sorted(SPLIT_CLASSES))
def test_sgpr_saved_with_a_method_loads_as_its_class_and_predicts_identically(name, tmp_path):
    ref = dict(np.load(SPLIT / "reference.npz"))
    assert f'"method": "{name.removeprefix("sgpr_")}"' in (SPLIT / name / "manifest.json"
                                                           ).read_text()
    model = agp.load(SPLIT / name)
    assert type(model) is SPLIT_CLASSES[name]
    args = ((ref["X"], ref["yb"], agp.models.TaylorPoint(ref["xi"])) if name == "sgpr_taylor"
            else (ref["X"], ref["y"]))
    mean, var = model.to_svgp(*args).predict_f(ref["Xs"])
    np.testing.assert_allclose(np.asarray(mean), ref[f"{name}_mean"], rtol=1e-13)
    np.testing.assert_allclose(np.asarray(var), ref[f"{name}_var"], rtol=1e-13)
    np.testing.assert_allclose(model.objective(*args), ref[f"{name}_objective"], rtol=1e-13)
    np.testing.assert_allclose(model.elbo(*args), ref[f"{name}_elbo"], rtol=1e-13)
    agp.save(model, tmp_path / "m")  # saved again: the new class, no method field
    manifest = (tmp_path / "m" / "manifest.json").read_text()
    assert f"augmentedgp.models.sparse:{type(model).__name__}" in manifest
    assert '"method"' not in manifest
    assert type(agp.load(tmp_path / "m")) is SPLIT_CLASSES[name]
