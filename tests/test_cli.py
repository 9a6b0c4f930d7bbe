"""The command-line interface and the built-in datasets."""

import numpy as np
import pytest
from typer.testing import CliRunner

from augmentedgp import datasets
from augmentedgp.cli import app


def test_info():
    result = CliRunner().invoke(app, ["info"])
    assert result.exit_code == 0
    assert "x64 True" in result.stdout


def test_demo_runs_and_reports_sensible_metrics():
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.stdout
    out = result.stdout
    rmse = float(out.split("test RMSE")[1].split()[1])
    acc = float(out.split("test accuracy")[1].split()[1])
    assert rmse < 2.0  # yacht: y has sd 15; a GP reaches ~1
    assert acc > 0.8  # a9a: 76% majority class
    augmented = out.split("AnalyticSVI")[1]
    assert float(augmented.split("test accuracy")[1].split()[1]) > 0.8
    elbo = float(augmented.split("train ELBO")[1].split()[1])
    assert float(augmented.split("augmented ELBO")[1].split()[1]) <= elbo  # Jensen
    gibbs = out.split("Gibbs sampling")[1]
    assert float(gibbs.split("test RMSE")[1].split()[1]) < 2.0
    assert float(gibbs.split("max split R-hat")[1].split()[1]) < 1.05
    assert float(gibbs.split("min bulk ESS")[1].split()[1]) > 100
    flow = out.split("particle flow")[1]
    assert float(flow.split("test accuracy")[1].split()[1]) > 0.8
    assert float(flow.split("test NLL")[1].split()[1]) < 0.4  # majority class: 0.55


def test_datasets():
    yacht = datasets.load("yacht")
    assert yacht["X"].shape == (308, 6) and yacht["y"].shape == (308,)
    a9a = datasets.load("a9a_small")
    assert a9a["X_train"].shape == (1000, 123)
    assert set(np.unique(a9a["y_train"])) == {0, 1}
    with pytest.raises(ValueError, match="unknown dataset"):
        datasets.load("mnist")
    Xtr, ytr, Xte, yte = datasets.train_test_split(yacht["X"], yacht["y"], 0.25, seed=1)
    assert len(yte) == 77 and len(ytr) == 231
    s = datasets.Standardizer(np.c_[yacht["X"], np.ones(308)])
    Z = s.transform(np.c_[yacht["X"], np.ones(308)])
    assert np.all(np.isfinite(Z)) and np.allclose(Z[:, :6].std(0), 1.0)
    np.testing.assert_allclose(s.inverse(Z), np.c_[yacht["X"], np.ones(308)])
