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


def test_demo_runs_and_reports_sensible_metrics(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.stdout
    assert (tmp_path / "augmentedgp-demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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


# --- fit / predict / evaluate on files -----------------------------------------------------

pd = pytest.importorskip("pandas")
RUN = CliRunner()


def invoke(*args):
    return RUN.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small CSV/Parquet tables: yacht regression (train/test) and a synthetic 3-class
    problem with string labels, plus the model directories fitted on them."""
    root = tmp_path_factory.mktemp("cli")
    assert invoke("datasets", "--export", root / "data").exit_code == 0
    yacht = pd.read_csv(root / "data" / "yacht.csv")
    yacht.iloc[:80].to_csv(root / "yacht_train.csv", index=False)
    yacht.iloc[80:120].to_parquet(root / "yacht_test.parquet", index=False)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    label = np.array(["low", "mid", "high"])[np.digitize(X[:, 0] + 0.3 * X[:, 1], [-0.5, 0.5])]
    frame = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "kind": label})
    frame.iloc[:60].to_csv(root / "cls_train.csv", index=False)
    frame.iloc[60:].to_csv(root / "cls_test.csv", index=False)
    reg = invoke("fit", root / "yacht_train.csv", "--target", "resistance", "--out",
                 root / "reg", "--quiet")
    assert reg.exit_code == 0, reg.stdout
    cls = invoke("fit", root / "cls_train.csv", "--target", "kind", "--likelihood", "logistic",
                 "--inducing", "30", "--max-iter", "150", "--out", root / "cls", "--quiet")
    assert cls.exit_code == 0, cls.stdout
    return root


def test_datasets_command_lists_and_exports(files):
    result = invoke("datasets")
    assert result.exit_code == 0 and "yacht" in result.stdout and "a9a_small_train" in result.stdout
    yacht = pd.read_csv(files / "data" / "yacht.csv")
    data = datasets.load("yacht")
    assert list(yacht.columns[:6]) == [str(c) for c in data["feature_names"]]
    np.testing.assert_array_equal(yacht["resistance"], data["y"])
    a9a = pd.read_csv(files / "data" / "a9a_small_test.csv")
    assert a9a.shape == (1000, 124)
    np.testing.assert_array_equal(a9a["label"], datasets.load("a9a_small")["y_test"])


def test_fit_saves_a_model_whose_predictions_the_cli_reproduces(files):
    from augmentedgp import persistence

    est = persistence.load(files / "reg")
    assert est.target_name_ == "resistance" and not est.sparse_
    test = pd.read_parquet(files / "yacht_test.parquet")
    out = files / "reg_preds.parquet"
    result = invoke("predict", files / "reg", files / "yacht_test.parquet", "--out", out,
                    "--level", "0.9")
    assert result.exit_code == 0, result.stdout
    preds = pd.read_parquet(out)
    X = test.drop(columns="resistance")
    mean, sd = est.predict(X, return_std=True)
    lower, upper = est.predict_interval(X, 0.9)
    np.testing.assert_allclose(preds["mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(preds["sd"], sd, rtol=1e-12)
    np.testing.assert_allclose(preds["lower_0.9"], lower, rtol=1e-12)
    np.testing.assert_allclose(preds["upper_0.9"], upper, rtol=1e-12)
    assert np.sqrt(np.mean((mean - test["resistance"]) ** 2)) < 0.3 * test["resistance"].std()


def test_classifier_predictions_on_stdout_and_string_labels(files):
    from augmentedgp import persistence

    est = persistence.load(files / "cls")
    assert list(est.classes_) == ["high", "low", "mid"] and est.sparse_
    result = invoke("predict", files / "cls", files / "cls_test.csv")
    assert result.exit_code == 0, result.stdout
    preds = pd.read_csv(__import__("io").StringIO(result.stdout))
    test = pd.read_csv(files / "cls_test.csv")
    proba = est.predict_proba(test[["a", "b"]])
    np.testing.assert_allclose(preds[["proba_high", "proba_low", "proba_mid"]], proba, rtol=1e-9)
    assert list(preds["prediction"]) == list(est.classes_[np.argmax(proba, 1)])
    assert np.mean(preds["prediction"] == test["kind"]) > 0.8


def test_evaluate_prints_metrics_and_saves_a_calibration_plot(files):
    pytest.importorskip("matplotlib")
    from augmentedgp import persistence
    from augmentedgp.cli import evaluation_metrics

    outputs = {}
    for model, data, plot in (("cls", "cls_test.csv", "c.png"),
                              ("reg", "yacht_test.parquet", "r.png")):
        result = invoke("evaluate", files / model, files / data, "--plot", files / plot)
        assert result.exit_code == 0, result.stdout
        assert (files / plot).read_bytes()[:4] == b"\x89PNG"
        outputs[model] = result.stdout
    test = pd.read_csv(files / "cls_test.csv")
    est = persistence.load(files / "cls")
    metrics = evaluation_metrics(est, test[["a", "b"]], test["kind"].to_numpy())
    proba = est.predict_proba(test[["a", "b"]])
    codes = np.searchsorted(est.classes_, test["kind"])
    np.testing.assert_allclose(metrics["log loss"],
                               -np.mean(np.log(proba[np.arange(len(codes)), codes])), rtol=1e-9)
    assert metrics["accuracy"] == np.mean(est.classes_[np.argmax(proba, 1)] == test["kind"])
    assert 0 <= metrics["ECE (10 bins)"] <= 1
    assert f"{metrics['accuracy']:.4f}" in outputs["cls"]
    assert f"{metrics['log loss']:.4f}" in outputs["cls"]
    reg = persistence.load(files / "reg")
    ytest = pd.read_parquet(files / "yacht_test.parquet")
    m = evaluation_metrics(reg, ytest.drop(columns="resistance"), ytest["resistance"].to_numpy())
    yv = ytest["resistance"].to_numpy()
    np.testing.assert_allclose(m["NLPD"], -np.mean(reg.log_predictive_density(
        ytest.drop(columns="resistance"), yv)))
    assert m["RMSE"] == pytest.approx(np.sqrt(np.mean((reg.predict(ytest.drop(
        columns="resistance")) - yv) ** 2)))
    result = invoke("evaluate", files / "reg", files / "yacht_test.parquet", "--no-plot")
    assert result.exit_code == 0 and "NLPD" in result.stdout


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("content, args, message", [
    (None, (), "does not exist"),
    ("", (), "is empty"),
    ("a,b,y\n", (), "no data rows"),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--target", "z"), "no target column 'z'"),
    ("a,b,y\n1,2,3\n4,x,6\n", (), "column 'b' is not numeric (row 2"),
    ("a,b,y\n1,2,3\n4,5,6\n7,,9\n", (), "column 'b' has a missing or non-finite value in row 3"),
    ("a,b,y\n1,2,3\n4,5,nan\n", (), "column 'y' has a missing"),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--likelihood", "cauchy"), "unknown likelihood 'cauchy'"),
    ("a,b,y\n1,2,3\n4,5,-6\n", ("--likelihood", "poisson"), "non-negative"),
])
def test_fit_input_errors_exit_2_with_a_clear_message(tmp_path, content, args, message):
    path = tmp_path / "d.csv"
    if content is not None:
        _write(path, content)
    args = args if "--target" in args else ("--target", "y") + args
    result = invoke("fit", path, *args, "--out", tmp_path / "m", "--quiet")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "m").exists()  # nothing written


def test_predict_and_evaluate_errors(files, tmp_path):
    bad = _write(tmp_path / "nofeat.csv", "a,c\n1,2\n")
    result = invoke("predict", files / "cls", bad)
    assert result.exit_code == 2 and "lacks the model's feature columns ['b']" in result.output
    result = invoke("predict", tmp_path / "missing_dir", files / "cls_test.csv")
    assert result.exit_code == 2 and "not a directory" in result.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    result = invoke("predict", broken, files / "cls_test.csv")
    assert result.exit_code == 2 and "not valid JSON" in result.output
    result = invoke("predict", files / "cls", files / "cls_test.csv", "--level", "1.5")
    assert result.exit_code == 2 and "--level" in result.output
    unseen = _write(tmp_path / "unseen.csv", "a,b,kind\n0,0,huge\n")
    result = invoke("evaluate", files / "cls", unseen, "--no-plot")
    assert result.exit_code == 2 and "not seen in training" in result.output
    wrong = _write(tmp_path / "wrong.txt.json", "{}")
    result = invoke("predict", files / "cls", wrong)
    assert result.exit_code == 2 and "unsupported file type" in result.output
