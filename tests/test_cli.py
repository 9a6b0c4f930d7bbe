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


def test_version_prints_the_library_version():
    from augmentedgp.core.version import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"augmentedgp {__version__}\n"


def test_demo_writes_no_file_unless_asked(tmp_path, monkeypatch):
    """The default demo leaves the working directory empty and says how to get the figure;
    --plot into a missing directory fails before any fitting."""
    import typer.main

    plot = {p.name: p for p in typer.main.get_command(app).commands["demo"].params}["plot"]
    assert plot.default is None
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo", "--plot", "no_such_dir/demo.png"])
    assert result.exit_code == 2 and "directory no_such_dir does not exist" in result.output
    assert "test RMSE" not in result.output and list(tmp_path.iterdir()) == []


def test_demo_runs_and_reports_sensible_metrics(tmp_path, tmp_path_factory, monkeypatch):
    """One full demo run: the figure goes where --plot says (outside the working
    directory here) and nothing is written into the working directory."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    figure = tmp_path_factory.mktemp("figures") / "demo.png"
    result = CliRunner().invoke(app, ["demo", "--plot", str(figure)])
    assert result.exit_code == 0, result.output
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == []
    assert f"figure saved to {figure.resolve()}" in result.stdout
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
    assert reg.exit_code == 0, reg.output
    cls = invoke("fit", root / "cls_train.csv", "--target", "kind", "--likelihood", "logistic",
                 "--inducing", "30", "--max-iter", "150", "--out", root / "cls", "--quiet")
    assert cls.exit_code == 0, cls.output
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
    assert result.exit_code == 0, result.output
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
    assert result.exit_code == 0, result.output
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
        assert result.exit_code == 0, result.output
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
    before = sorted(files.iterdir())
    result = invoke("evaluate", files / "reg", files / "yacht_test.parquet")
    assert result.exit_code == 0 and "NLPD" in result.stdout
    assert "(held-out file; 40 rows)" in " ".join(result.stdout.split())
    assert sorted(files.iterdir()) == before  # no plot unless --plot is given


def _write(path, text):
    path.write_text(text)
    return path


def one_error_line(result) -> str:
    """The whole of a failed command's report: one line ``error: ...``, no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("content, args, messages", [
    (None, (), ["does not exist"]),
    ("", (), ["is empty"]),
    ("a,b,y\n", (), ["no data rows"]),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00", (), ["cannot read"]),  # not a CSV
    ("a,b,y\n1,2,3\n4,5,6,7,8\n", (), ["cannot read", "line 3"]),  # ragged: pandas's
    ("a,b,y\n1,2,3\n4,5,6\n", ("--target", "z"), ["no target column 'z'"]),
    ("a,b,y\n1,2,3\n4,x,6\n", (), ["column 'b' is not numeric (data row 2 (file line 3) "
                                     "holds 'x')"]),
    ("a,b,y\n1,2,3\n4,5,high\n", (), ["column 'y' is not numeric (data row 2 (file line 3)"]),
    ("a,b,y\n1,2,3\n4,5,6\n7,,9\n", (), ["column 'b' has a missing or non-finite value in "
                                           "data row 3 (file line 4)"]),
    ("a,b,y\n1,2,3\n\n4,5,6\n7,nan,9\n", (), ["column 'b'", "data row 3 (file line 5)"]),
    ('a,b,y\n1,2,"q\nr"\n4,x,6\n', ("--target", "a"),  # a quoted line break
     ["column 'b' is not numeric (data row 2 (file line 4) holds 'x')"]),
    ("a,b,y\n1,2,3\n4,5,nan\n", (), ["column 'y' has a missing", "data row 2 (file line 3)"]),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--likelihood", "cauchy"), ["unknown likelihood 'cauchy'"]),
    ("a,b,y\n1,2,3\n4,5,-6\n", ("--likelihood", "poisson"), ["non-negative"]),
    ("a,b,y\n1,2,0\n4,5,1\n7,8,0.25\n", ("--likelihood", "logistic"),
     ["column 'y' of ", "d.csv holds continuous values, not class labels (e.g. 0.25 in data "
      "row 3 (file line 4)); for a real-valued target use a regression likelihood: "
      "--likelihood gaussian"]),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--test-size", "1.5"), ["--test-size must be a fraction"]),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--test-size", "0.9"), ["leaves no training rows"]),
    ("a,b,y\n1,2,3\n4,5,6\n", ("--test-size", "0.5", "--split-seed", "-1"),
     ["--split-seed must be an integer in [0, 2**32), got -1"]),
])
def test_fit_input_errors_exit_2_with_one_clear_line(tmp_path, content, args, messages):
    path = tmp_path / "d.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        _write(path, content)
    args = args if "--target" in args else ("--target", "y") + args
    result = invoke("fit", path, *args, "--out", tmp_path / "m", "--quiet")
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    for message in messages:
        assert message in line
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
    result = invoke("evaluate", files / "cls", unseen)
    assert result.exit_code == 2 and "not seen in training" in result.output
    wrong = _write(tmp_path / "wrong.txt.json", "{}")
    result = invoke("predict", files / "cls", wrong)
    assert result.exit_code == 2 and "unsupported file type" in result.output


def test_predict_and_evaluate_error_paths_are_one_line(files, tmp_path):
    """Parquet rows are named by data row only; an unwritable output and a continuous
    column where labels are expected are one-line errors with exit code 2."""
    test = pd.read_parquet(files / "yacht_test.parquet")
    test.iloc[4, 2] = np.nan
    test.to_parquet(tmp_path / "nan.parquet", index=False)
    result = invoke("predict", files / "reg", tmp_path / "nan.parquet")
    line = one_error_line(result)
    assert result.exit_code == 2
    assert f"column {test.columns[2]!r} has a missing or non-finite value in data row 5 (1" in line
    assert "file line" not in line
    result = invoke("predict", files / "reg", files / "yacht_test.parquet", "--out",
                    tmp_path / "no_such_dir" / "p.csv")
    assert result.exit_code == 2 and "no_such_dir" in one_error_line(result)
    numbers = _write(tmp_path / "numbers.csv", "a,b,kind\n0,0,0.5\n1,1,2.5\n")
    result = invoke("evaluate", files / "cls", numbers)
    assert result.exit_code == 2 and "not seen in training" in one_error_line(result)
    result = invoke("evaluate", files / "reg", files / "yacht_test.parquet", "--plot",
                    tmp_path / "no_such_dir" / "p.png")
    assert result.exit_code == 2 and "no_such_dir does not exist" in one_error_line(result)
    from augmentedgp import persistence

    est = persistence.load(files / "reg")
    vars(est).pop("feature_names_in_", None)  # as if fitted on an array
    persistence.save(est, tmp_path / "array_model")
    result = invoke("predict", tmp_path / "array_model", files / "yacht_test.parquet")
    assert result.exit_code == 2 and "fitted without column names" in one_error_line(result)


def test_fit_test_size_holds_out_the_rows_evaluate_scores(files, tmp_path):
    """`fit --test-size` trains on scikit-learn's train_test_split of the rows and records
    it; `evaluate` on the same file scores exactly the held-out rows, refuses another split
    of it, and warns on the training file of a model fitted on every row."""
    from sklearn.model_selection import train_test_split

    from augmentedgp import persistence
    from augmentedgp.cli import evaluation_metrics
    from augmentedgp.sklearn import GPRegressor

    data = files / "yacht_train.csv"  # 80 rows
    result = invoke("fit", data, "--target", "resistance", "--test-size", "0.25",
                    "--split-seed", "3", "--out", tmp_path / "m", "--quiet")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "training rows │ 60" in out and "20 (--test-size 0.25 --split-seed 3)" in out
    frame = pd.read_csv(data)
    train, test = train_test_split(np.arange(80), test_size=20, random_state=3)
    est = persistence.load(tmp_path / "m")
    refit = GPRegressor(**est.get_params()).fit(  # the same settings on sklearn's split
        frame.drop(columns="resistance").iloc[np.sort(train)],
        frame["resistance"].iloc[np.sort(train)])
    X = frame.drop(columns="resistance")
    np.testing.assert_allclose(est.predict(X), refit.predict(X), rtol=1e-6)
    held = frame.iloc[np.sort(test)]
    expected = evaluation_metrics(est, held.drop(columns="resistance"),
                                  held["resistance"].to_numpy())
    for args in ((), ("--test-size", "0.25", "--split-seed", "3")):
        result = invoke("evaluate", tmp_path / "m", data, *args)
        assert result.exit_code == 0, result.output
        out = " ".join(result.stdout.split())
        assert "held out by fit: 20 of 80 rows" in out
        assert f"RMSE │ {expected['RMSE']:.4f}" in out and f"NLPD │ {expected['NLPD']:.4f}" in out
    result = invoke("evaluate", tmp_path / "m", data, "--split-seed", "4")
    assert result.exit_code == 2 and "would score training rows" in one_error_line(result)
    # the fixture's model was fitted on every row of this file
    result = invoke("evaluate", files / "reg", data)
    assert result.exit_code == 0
    assert result.stderr.startswith("warning: ") and len(result.stderr.splitlines()) == 1
    assert "not held out" in result.stderr and "training rows; 80 rows" in result.stdout
    result = invoke("evaluate", files / "reg", data, "--test-size", "0.5")
    assert result.exit_code == 2 and "any --test-size split" in one_error_line(result)


def test_evaluate_test_size_splits_another_file_stratified_by_class(files):
    from sklearn.model_selection import train_test_split

    from augmentedgp import persistence
    from augmentedgp.cli import evaluation_metrics

    test = pd.read_csv(files / "cls_test.csv")  # 30 rows, 3 classes: not the training file
    result = invoke("evaluate", files / "cls", files / "cls_test.csv", "--test-size", "0.5",
                    "--split-seed", "1")
    assert result.exit_code == 0, result.output
    assert "split: 15 of 30 rows, --test-size 0.5 --split-seed 1" in " ".join(
        result.stdout.split())
    _, rows = train_test_split(np.arange(30), test_size=15, random_state=1,
                               stratify=test["kind"])
    part = test.iloc[np.sort(rows)]
    metrics = evaluation_metrics(persistence.load(files / "cls"), part[["a", "b"]],
                                 part["kind"].to_numpy())
    assert f"{metrics['log loss']:.4f}" in result.stdout
    result = invoke("evaluate", files / "cls", files / "cls_test.csv", "--split-seed", "1")
    assert result.exit_code == 2 and "--split-seed needs --test-size" in one_error_line(result)


def test_warnings_are_one_line_and_quiet_silences_them(tmp_path):
    """A fit stopped by max_iter reports its ConvergenceWarning as one `warning:` line
    without the source line that raised it; --quiet prints none; the process's warning
    filters are left as they were."""
    import warnings

    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 2))
    pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "y": X[:, 0] + rng.standard_t(3, 20)}).to_csv(
        tmp_path / "t.csv", index=False)
    filters = list(warnings.filters)
    loud = invoke("fit", tmp_path / "t.csv", "--target", "y", "--likelihood", "student_t",
                  "--max-iter", "3", "--out", tmp_path / "m1")
    quiet = invoke("fit", tmp_path / "t.csv", "--target", "y", "--likelihood", "student_t",
                   "--max-iter", "3", "--out", tmp_path / "m2", "--quiet")
    assert loud.exit_code == 0 and quiet.exit_code == 0, loud.output + quiet.output
    lines = [line for line in loud.stderr.splitlines() if "warning" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith(
        "warning: GPRegressor stopped before converging ("), loud.stderr
    assert "warnings.warn" not in loud.output and ".py:" not in loud.output
    assert quiet.stderr == "" and "converging" not in quiet.output
    assert list(warnings.filters) == filters
