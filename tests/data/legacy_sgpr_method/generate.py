"""Write this directory's fixtures with the code before the split of SGPR into one class per
model (SGPR's ``method`` argument, commit a458cd4):

    git archive a458cd4 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/legacy_sgpr_method/generate.py

Four unfitted models saved as that version saved them (an ``SGPR`` node with a ``method``
field) and ``reference.npz``: the data, the Taylor expansion points, and each model's
objective, ELBO and the predictions of its ``to_svgp`` made then.
"""

from pathlib import Path

import jax.numpy as jnp
import numpy as np

import augmentedgp as agp

HERE = Path(__file__).resolve().parent
rng = np.random.default_rng(7)
X = np.sort(rng.uniform(0.0, 6.0, 12))[:, None]
y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=12)
yb = (y > 0).astype(float)
Z = np.array([[0.5], [2.0], [3.5], [5.0]])
Xs = np.linspace(-0.5, 6.5, 7)[:, None]


def kernel():
    return agp.kernels.RBF(0.8, 1.3)


models = {
    f"sgpr_{m}": agp.SGPR(kernel(), Z, noise=0.2, mean=agp.means.Constant(0.3), method=m)
    for m in ("vfe", "dtc", "fitc")
}
models["sgpr_taylor"] = agp.SGPR(kernel(), Z, likelihood=agp.likelihoods.Logistic(),
                                 method="taylor")
ref = {"X": X, "y": y, "yb": yb, "Xs": Xs}
for name, model in models.items():
    agp.save(model, HERE / name)
    if name == "sgpr_taylor":
        q = model.update_aux(X, yb, model.initial_aux(X, yb))
        ref["xi"] = np.asarray(q.xi)
        args = (X, yb, q)
    else:
        args = (X, y)
    mean, var = model.to_svgp(*args).predict_f(Xs)
    ref[f"{name}_mean"], ref[f"{name}_var"] = np.asarray(mean), np.asarray(var)
    ref[f"{name}_objective"] = np.asarray(model.objective(*args))
    ref[f"{name}_elbo"] = np.asarray(model.elbo(*args))
np.savez(HERE / "reference.npz", **{k: jnp.asarray(v) for k, v in ref.items()})
