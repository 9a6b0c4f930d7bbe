"""Command-line interface (typer): ``augmentedgp [--version] demo | datasets | fit | predict |
evaluate | info``.

Exit codes follow the click convention: 0 success, 1 a failure while fitting or
predicting (a numerical error), 2 bad usage or bad input (missing files or columns,
non-numeric or missing values, a corrupted or incompatible model directory). Every failure
is one line ``error: ...`` on standard error, never a traceback; warnings raised while a
command runs are reported as one line ``warning: ...`` each (none with ``fit --quiet``).
Rows of a table are named as ``data row N (file line L)`` for CSV files (the header is
file line 1) and ``data row N`` for Parquet files.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import math
import re
import time
import warnings
from pathlib import Path

import numpy as np

try:
    import typer
except ImportError as err:  # the console script (augmentedgp.launcher) reports this
    raise ImportError('the command line needs typer: pip install "augmentedgp[cli]"',
                      name=err.name or "typer") from err
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from augmentedgp import inference, kernels, likelihoods
from augmentedgp.contrib import bayesian
from augmentedgp.core import params, tables
from augmentedgp.core.version import __version__
from augmentedgp.models import GP, MCGP, SVGP, inducing
from augmentedgp.training import fit as fit_model

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Gaussian processes with non-Gaussian likelihoods (augmentedgp).")
console = Console()


@functools.lru_cache(maxsize=4)
def _yacht_gp(seed: int):
    """The yacht split, its standardisations and the exact GP fitted to it (type-II ML),
    shared by the regression and Gibbs demos: (sx, sy, split, posterior, fit seconds)."""
    from augmentedgp.datasets import Standardizer, load, train_test_split

    data = load("yacht")
    split = train_test_split(data["X"], data["y"], 0.2, seed)
    sx, sy = Standardizer(split[0]), Standardizer(split[1])
    model = GP(kernels.RBF(lengthscale=np.ones(split[0].shape[1])), noise=0.1)
    t0 = time.perf_counter()
    post = fit_model(model, sx.transform(split[0]), sy.transform(split[1]))
    return sx, sy, split, post, time.perf_counter() - t0


def _regression_demo(seed: int):
    sx, sy, (Xtr, ytr, Xte, yte), post, secs = _yacht_gp(seed)
    mean, var = post.predict_y(sx.transform(Xte))
    mean = sy.inverse(np.asarray(mean))
    rmse = float(np.sqrt(np.mean((mean - yte) ** 2)))
    nll = float(-np.mean(post.predict_log_density(sx.transform(Xte), sy.transform(yte)))
                + np.log(sy.scale))
    return ("Exact GP regression", "yacht (308 x 6)", "ARD RBF, type-II ML (L-BFGS)",
            {"test RMSE": rmse, "test NLL": nll, "train LML": post.log_marginal_likelihood(),
             "fit seconds": secs}, {})


def _classification_demo(seed: int):
    from augmentedgp.datasets import load

    data = load("a9a_small")
    model = GP(kernels.RBF(lengthscale=4.0, variance=2.0), likelihoods.Logistic())
    t0 = time.perf_counter()
    # tol: L-BFGS stops when an iteration gains less than 1e-6 of the objective (the LML
    # then moves by < 0.01 nats; the default 1e-9 adds iterations of O(n^3) Newton solves)
    post = fit_model(model, data["X_train"], data["y_train"], inference.Laplace(), tol=1e-6)
    secs = time.perf_counter() - t0
    p = np.asarray(post.predict_proba(data["X_test"]))
    yte = data["y_test"]
    acc = float(np.mean((p > 0.5) == (yte == 1)))
    nll = float(-np.mean(post.predict_log_density(data["X_test"], yte)))
    return ("Laplace GP classification", "a9a (1000 train / 1000 test, 123 features)",
            "RBF + logistic, type-II ML (L-BFGS)",
            {"test accuracy": acc, "test NLL": nll, "train LML": post.log_marginal_likelihood(),
             "fit seconds": secs}, {})


def _augmented_demo(seed: int):
    import jax

    from augmentedgp.datasets import load

    data = load("a9a_small")
    X, y = data["X_train"], data["y_train"]
    key = jax.random.key(seed)
    Z = params.fixed(params.real(inducing.kmeans(X, 50, key), "inducing"))
    model = SVGP(kernels.RBF(lengthscale=4.0, variance=2.0), likelihoods.Logistic(),
                     Z, q="natural_whitened")
    t0 = time.perf_counter()
    post = fit_model(model, X, y, inference.AnalyticSVI(batch_size=100), max_iter=1000, key=key)
    secs = time.perf_counter() - t0
    p = np.asarray(post.predict_proba(data["X_test"]))
    yte = data["y_test"]
    return ("Augmented SVGP classification (Polya-Gamma, AnalyticSVI)",
            "a9a (1000 train / 1000 test, 123 features)",
            "RBF + logistic, M = 50 k-means inducing points, batch 100, 1000 iterations",
            {"test accuracy": float(np.mean((p > 0.5) == (yte == 1))),
             "test NLL": float(-np.mean(post.predict_log_density(data["X_test"], yte))),
             "train ELBO": post.elbo(), "augmented ELBO": post.elbo(augmented=True),
             "fit seconds": secs}, {"history": post.history, "y_test": yte, "proba": p})


def _gibbs_demo(seed: int):
    import jax

    sx, sy, (Xtr, ytr, Xte, yte), gp, _ = _yacht_gp(seed)  # the regression demo's GP
    Xtr, Xte, ytr = sx.transform(Xtr), sx.transform(Xte), sy.transform(ytr)
    t0 = time.perf_counter()
    noise_sd = float(np.sqrt(gp.likelihood.variance.value))
    model = MCGP(gp.kernel, likelihoods.StudentT(df=4.0, scale=noise_sd))
    settings = inference.GibbsSampling(n_samples=300, n_chains=4, burn_in=100)
    chain = inference.sample(model, Xtr, ytr, settings, key=jax.random.key(seed))
    secs = time.perf_counter() - t0
    mean = sy.inverse(np.asarray(chain.predict_y(Xte)[0]))
    nll = float(-np.mean(chain.predict_log_density(Xte, sy.transform(yte))) + np.log(sy.scale))
    summary = chain.summary()
    return ("Augmented Gibbs sampling, Student-t GP regression", "yacht (308 x 6)",
            "kernel from the exact GP's type-II ML above; 4 chains x 300 samples after 100 "
            "burn-in",
            {"test RMSE": float(np.sqrt(np.mean((mean - yte) ** 2))), "test NLL": nll,
             "max split R-hat": float(np.max(summary["rhat"])),
             "min bulk ESS": float(np.min(summary["ess_bulk"])), "seconds": secs}, {})


def _flow_demo(seed: int):
    import jax

    from augmentedgp.datasets import load

    data = load("a9a_small")
    target = bayesian.LogisticRegression(data["X_train"], data["y_train"], prior_var=10.0,
                                             intercept=True)
    method = inference.ParticleFlow(n_particles=20, learning_rate=1e-3, optimizer="rmsprop",
                              batch_size=100)
    key = jax.random.key(seed)
    t0 = time.perf_counter()
    q = inference.fit_gaussian(target, target.init(), method, key=key, max_iter=2000)
    secs = time.perf_counter() - t0
    p = np.asarray(target.predict_proba(q, data["X_test"], key))
    yte = data["y_test"] == 1
    return ("Gaussian particle flow, Bayesian logistic regression",
            "a9a (1000 train / 1000 test, 123 features + intercept)",
            "20 particles (rank 19 of 124), dimension-wise RMSProp, batch 100, 2000 steps",
            {"test accuracy": float(np.mean((p > 0.5) == yte)),
             "test NLL": float(-np.mean(np.log(np.where(yte, p, 1 - p)))),
             "free energy": float(q.free_energy(target, key, 500)), "fit seconds": secs}, {})


# --- shared helpers -------------------------------------------------------------------------

REGRESSION = ("gaussian", "student_t", "laplace")
CLASSIFICATION = ("logistic", "probit", "softmax", "robustmax")
COUNTS = ("poisson", "negative_binomial")
err_console = Console(stderr=True)


class InputError(ValueError):
    """Bad input from the command line: reported without a traceback, exit code 2."""


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _fail(message: str, code: int):
    err_console.print(f"[bold red]error:[/] {escape(_one_line(message))}", highlight=False,
                      soft_wrap=True)
    raise typer.Exit(code)


def _report_warnings(caught) -> None:
    """Each distinct warning once, as one line without the source line that raised it."""
    seen = set()
    for w in caught:
        text = _one_line(w.message)
        if text not in seen:
            seen.add(text)
            err_console.print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False,
                              soft_wrap=True)


def _run(fn, quiet: bool = False):
    """Run a command body: library errors become one-line messages and exit codes, and
    warnings one-line reports (none when ``quiet``). Warnings are recorded only for the
    duration of the command (``warnings.catch_warnings``), not silenced for the process."""
    from augmentedgp.core.errors import AugmentedGPError
    from augmentedgp.persistence import ModelFileError

    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # whatever the process's filters; deduplicated
            for noise in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
                warnings.simplefilter("ignore", noise)  # about the code, not the user's data
            return fn()
    except (typer.Exit, ImportError):  # a missing extra: the launcher names it
        raise
    except (InputError, ModelFileError) as err:
        failure = (str(err), 2)
    except AugmentedGPError as err:
        failure = (f"{type(err).__name__}: {err}", 1)
    except (ValueError, TypeError) as err:  # the library's validation of the data/settings
        failure = (str(err), 2)
    except OSError as err:  # a file that cannot be read or written
        failure = (str(err), 2)
    except Exception as err:  # noqa: BLE001 -- a bug: still one line, no traceback
        failure = (f"unexpected {type(err).__name__}: {err} (a bug in augmentedgp; please "
                   "report it)", 1)
    finally:
        if not quiet:
            _report_warnings(caught)
    _fail(*failure)


ROW = re.compile(r"\brow (\d+)\b")


def _csv_file_line(path: Path, row: int) -> int | None:
    """The 1-based file line on which data row ``row`` (1-based, header excluded) of a CSV
    file starts: blank lines (skipped by pandas) and quoted line breaks are counted."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        end, record = 0, 0  # record 0 is the header
        for fields in reader:
            start, end = end + 1, reader.line_num
            if not fields:
                continue
            if record == row:
                return start
            record += 1
    return None


def _name_rows(message: str, path: Path) -> str:
    """``row N`` in a message about the table ``path`` as ``data row N (file line L)`` for
    CSV files, ``data row N`` for Parquet files."""
    csv_file = tables.SUFFIXES.get(path.suffix.lower()) == "csv"

    def where(match):
        row = int(match.group(1))
        line = _csv_file_line(path, row) if csv_file else None
        return f"data row {row}" + (f" (file line {line})" if line is not None else "")

    return ROW.sub(where, message)


def _from_table(path: Path, read, *args, **kwargs):
    """``read(*args, **kwargs)`` (a ``tables`` reader of the file ``path``), its errors with
    the rows named by data row and file line."""
    try:
        return read(*args, **kwargs)
    except ValueError as err:
        raise InputError(_name_rows(str(err), path)) from None


def _digest(path: Path) -> str:
    """SHA-256 of a file's bytes: recognises a model's training file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _holdout(n: int, test_size: float, seed: int, labels=None):
    """Indices (train, test) of a reproducible split of ``n`` rows with ``ceil(test_size *
    n)`` test rows, as scikit-learn's ``train_test_split(test_size=, random_state=seed)``;
    stratified by ``labels`` (classifiers) when every class has two rows or more."""
    from sklearn.model_selection import train_test_split

    if not (isinstance(test_size, float) and 0.0 < test_size < 1.0):
        raise InputError(f"--test-size must be a fraction of the rows strictly inside (0, 1), "
                         f"got {test_size}")
    if not 0 <= seed < 2**32:
        raise InputError(f"--split-seed must be an integer in [0, 2**32), got {seed}")
    n_test = math.ceil(test_size * n)
    if n_test >= n:
        raise InputError(f"--test-size {test_size:g} of {n} rows leaves no training rows")
    stratify = None
    if labels is not None:
        classes, counts = np.unique(np.asarray(labels).astype(str), return_counts=True)
        if counts.min() >= 2 and len(classes) <= min(n_test, n - n_test):
            stratify = np.asarray(labels).astype(str)
    train, test = train_test_split(np.arange(n), test_size=n_test, random_state=seed,
                                   stratify=stratify)
    return np.sort(train), np.sort(test)


def _check_labels(y, column: str, path: Path) -> None:
    """Class labels, not a real-valued column (scikit-learn's ``type_of_target``)."""
    from sklearn.utils.multiclass import type_of_target

    if type_of_target(y) == "continuous":
        values = np.asarray(y, dtype=float)
        row = int(np.argmax(values != np.round(values)))
        raise InputError(_name_rows(
            f"column {column!r} of {path} holds continuous values, not class labels (e.g. "
            f"{values[row]:g} in row {row + 1}); for a real-valued target use a regression "
            f"likelihood: --likelihood {' / '.join(REGRESSION)}", path))


def _load_estimator(model_dir: Path):
    from augmentedgp import persistence
    from augmentedgp.sklearn import GPClassifier, GPCountRegressor, GPRegressor

    est = persistence.load(model_dir)
    if not isinstance(est, GPRegressor | GPClassifier | GPCountRegressor):
        raise InputError(f"{model_dir} holds a {type(est).__name__}, not a model written by "
                         "`augmentedgp fit` (a scikit-learn estimator)")
    if not hasattr(est, "feature_names_in_"):  # fitted on an array: columns unknown
        raise InputError(f"{model_dir} holds a {type(est).__name__} fitted without column "
                         "names (on an array, not a table): the command line needs a model "
                         "fitted on a DataFrame, such as one written by `augmentedgp fit`")
    return est


def _predictions(est, X, level: float):
    import pandas as pd

    from augmentedgp.sklearn import GPClassifier

    if isinstance(est, GPClassifier):
        proba = est.predict_proba(X)
        out = {"prediction": est.classes_[np.argmax(proba, 1)]}
        out.update({f"proba_{c}": proba[:, k] for k, c in enumerate(est.classes_)})
        return pd.DataFrame(out, index=X.index)
    mean, sd = est.predict(X, return_std=True)
    lower, upper = est.predict_interval(X, level)
    return pd.DataFrame({"mean": mean, "sd": sd, f"lower_{level:g}": lower,
                         f"upper_{level:g}": upper}, index=X.index)


def _write_table(frame, out: Path | None):
    if out is None:
        typer.echo(frame.to_csv(index=False), nl=False)
    elif out.suffix.lower() in (".parquet", ".pq"):
        frame.to_parquet(out, index=False)
    else:
        frame.to_csv(out, index=False)


def _print_metrics(title: str, metrics: dict, caption: str | None = None):
    table = Table(title=title, caption=caption, min_width=48)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.items():
        table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)


def _check_plot(plot: Path | None) -> None:
    """A figure asked for with ``--plot``: matplotlib (Agg) present and the file's directory
    existing, checked before any work."""
    if plot is None:
        return
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib, which is not installed: pip install "
                         "'augmentedgp[plot]'") from None
    matplotlib.use("Agg")
    if not plot.parent.is_dir():
        raise InputError(f"--plot {plot}: the directory {plot.parent} does not exist")


def _demo_figure(artefacts: dict, plot: Path) -> None:
    """The augmented SVGP classifier's reliability diagram and training ELBO, saved to
    ``plot``."""
    import matplotlib.pyplot as plt

    from augmentedgp import plotting

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    plotting.calibration(artefacts["y_test"], artefacts["proba"], ax=ax1)
    ax1.set_title("Augmented SVGP on a9a: reliability (test)\n" + ax1.get_title())
    plotting.history(artefacts["history"], ax=ax2)
    ax2.set_title("Augmented SVGP on a9a: training ELBO (minibatch)")
    fig.tight_layout()
    fig.savefig(plot, dpi=120)
    plt.close(fig)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"augmentedgp {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version,
                                          is_eager=True, help="print the version and exit")):
    """Gaussian processes with non-Gaussian likelihoods (augmentedgp)."""


# --- commands ---------------------------------------------------------------------------


@app.command()
def demo(seed: int = typer.Option(0, help="seed of the train/test split"),
         plot: Path = typer.Option(None, help="save the augmented classifier's reliability "
                                              "diagram and ELBO trace to this PNG file "
                                              "(default: no figure)"),
         no_plot: bool = typer.Option(False, "--no-plot", hidden=True,
                                      help="no figure even with --plot (once the default; "
                                           "kept for scripts)")
        ) -> None:
    """Fit the built-in examples and print test metrics (and, with --plot FILE, save a
    figure: calibration and ELBO trace of the augmented classifier). Writes no file
    unless --plot is given."""

    figure = None if no_plot else plot

    def body():
        _check_plot(figure)
        artefacts = {}
        for run in (_regression_demo, _classification_demo, _augmented_demo, _gibbs_demo,
                    _flow_demo):
            title, data, method, metrics, extra = run(seed)
            artefacts.update(extra)
            _print_metrics(f"{title}\n{data}", metrics, method)
        if figure is None:
            console.print("no figure written: add --plot FILE.png to save the augmented "
                          "classifier's reliability diagram and ELBO trace")
        else:
            _demo_figure(artefacts, figure)
            console.print(f"figure saved to {figure.resolve()}", soft_wrap=True)

    _run(body)


def _dataset_frames():
    """The built-in datasets as named DataFrames: (file stem, frame, target column, task)."""
    import pandas as pd

    from augmentedgp.datasets import load

    yacht = load("yacht")
    frame = pd.DataFrame(yacht["X"], columns=[str(c) for c in yacht["feature_names"]])
    frame["resistance"] = yacht["y"]
    yield "yacht", frame, "resistance", "regression (UCI Yacht Hydrodynamics)"
    a9a = load("a9a_small")
    for split in ("train", "test"):
        frame = pd.DataFrame(a9a[f"X_{split}"], columns=[f"x{j + 1}" for j in range(123)])
        frame["label"] = a9a[f"y_{split}"].astype(int)
        yield f"a9a_small_{split}", frame, "label", "binary classification (UCI Adult, a9a)"


@app.command()
def datasets(export: Path = typer.Option(None, help="write each dataset as CSV into this "
                                                    "directory")
            ) -> None:
    """List the built-in datasets (and export them as CSV files)."""

    def body():
        table = Table(title="Built-in datasets")
        for col in ("name", "task", "rows", "features", "target column"):
            table.add_column(col)
        for name, frame, target, task in _dataset_frames():
            table.add_row(name, task, str(len(frame)), str(frame.shape[1] - 1), target)
            if export is not None:
                export.mkdir(parents=True, exist_ok=True)
                frame.to_csv(export / f"{name}.csv", index=False)
        console.print(table)
        if export is not None:
            console.print(f"written to {export}/")

    _run(body)


@app.command()
def fit(data: Path = typer.Argument(..., help="training data (.csv or .parquet)"),
        target: str = typer.Option(..., help="name of the target column"),
        out: Path = typer.Option(..., help="model directory to write"),
        likelihood: str = typer.Option(
            "gaussian", help="gaussian, student_t, laplace (regression); logistic, probit, "
            "softmax, robustmax (classification); poisson, negative_binomial (counts)"),
        inducing: int = typer.Option(None, help="inducing points of a sparse model (default: "
                                                "automatic by size)"),
        kernel: str = typer.Option("rbf", help="rbf, matern12, matern32, matern52 or rq"),
        max_iter: int = typer.Option(None, help="optimiser iterations (default by model)"),
        batch_size: int = typer.Option(None, help="minibatch size (stochastic VI)"),
        seed: int = typer.Option(0, help="seed of the inducing points and minibatches"),
        test_size: float = typer.Option(
            None, help="hold out this fraction of the rows (stratified by class for "
            "classifiers; scikit-learn's train_test_split) and fit on the rest; `evaluate` "
            "on the same file then scores exactly the held-out rows"),
        split_seed: int = typer.Option(0, help="seed of the --test-size split"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar and no warnings")
       ) -> None:
    """Fit a GP model to a table and save it to a model directory."""
    from augmentedgp import persistence
    from augmentedgp.sklearn import GPClassifier, GPCountRegressor, GPRegressor

    def body():
        if likelihood not in REGRESSION + CLASSIFICATION + COUNTS:
            raise InputError(f"unknown likelihood {likelihood!r}; choose from "
                             f"{', '.join(REGRESSION + CLASSIFICATION + COUNTS)}")
        frame = tables.read_table(data)
        cls = (GPClassifier if likelihood in CLASSIFICATION else
               GPCountRegressor if likelihood in COUNTS else GPRegressor)
        y = _from_table(data, tables.target, frame, target, data,
                        numeric=cls is not GPClassifier)
        if cls is GPClassifier:
            _check_labels(y, target, data)
        X = _from_table(data, tables.features, frame, data, exclude=(target,))
        rows = len(y)
        if test_size is not None:
            train, _ = _holdout(rows, test_size, split_seed,
                                y if cls is GPClassifier else None)
            X, y = X.iloc[train], y[train]
        est = cls(likelihood=likelihood, kernel=kernel,
                  n_inducing="auto" if inducing is None else inducing, batch_size=batch_size,
                  max_iter=max_iter, random_state=seed, verbose=not quiet)
        t0 = time.perf_counter()
        est.fit(X, y)
        secs = time.perf_counter() - t0
        est.target_name_ = target
        # the training file, recognised by `evaluate` (held-out rows, or a warning)
        est.training_file_ = {"name": data.name, "sha256": _digest(data), "rows": rows,
                              "test_size": test_size, "split_seed": split_seed}
        persistence.save(est, out)
        model = est.posterior_.model
        metrics = {"training rows": len(y), "features": X.shape[1],
                   "model": type(model).__name__ + (f" (M = {model.inducing.value.shape[0]})"
                                                    if est.sparse_ else ""),
                   "iterations": est.n_iter_, "final objective": float(est.history_.objective[-1]),
                   ("training accuracy" if cls is GPClassifier else "training R^2"
                    if cls is GPRegressor else "training D^2"): float(est.score(X, y)),
                   "fit seconds": secs}
        if test_size is not None:
            metrics["held-out rows"] = f"{rows - len(y)} (--test-size {test_size:g} " \
                                       f"--split-seed {split_seed})"
        _print_metrics(f"{cls.__name__}({likelihood}) on {data.name}", metrics,
                       f"saved to {out}")

    _run(body, quiet)


@app.command()
def predict(model_dir: Path = typer.Argument(..., help="a directory written by `fit`"),
            data: Path = typer.Argument(..., help="rows to predict (.csv or .parquet)"),
            out: Path = typer.Option(None, help="output file (.csv or .parquet); default: "
                                                "CSV on standard output"),
            level: float = typer.Option(0.95, help="coverage of the predictive intervals")) -> None:
    """Predict: classes and class probabilities, or the predictive mean, sd and interval."""

    def body():
        if not 0.0 < level < 1.0:
            raise InputError(f"--level must lie strictly inside (0, 1), got {level}")
        est = _load_estimator(model_dir)
        frame = tables.read_table(data)
        X = _from_table(data, tables.features, frame, data, names=list(est.feature_names_in_),
                        role="model's feature")
        _write_table(_predictions(est, X, level), out)
        if out is not None:
            console.print(f"{len(X)} predictions written to {out}")

    _run(body)


def evaluation_metrics(est, X, y, level: float = 0.95) -> dict:
    """Held-out metrics of a fitted estimator: accuracy, log loss, Brier score and
    expected calibration error for classifiers; RMSE, MAE, R^2 (D^2 for counts), mean
    negative log predictive density and interval coverage for regressors."""
    from sklearn import metrics as skm

    from augmentedgp.plotting import calibration_curve
    from augmentedgp.sklearn import GPClassifier, GPCountRegressor

    if isinstance(est, GPClassifier):
        unknown = sorted(set(np.unique(y).tolist()) - set(est.classes_.tolist()))
        if unknown:
            raise InputError(f"the test labels {unknown[:5]} were not seen in training "
                             f"(classes {est.classes_.tolist()[:10]})")
        proba = est.predict_proba(X)
        codes = np.searchsorted(est.classes_, y)
        binary = len(est.classes_) == 2
        return {"accuracy": float(np.mean(est.classes_[np.argmax(proba, 1)] == y)),
                "log loss": float(skm.log_loss(codes, proba, labels=range(proba.shape[1]))),
                # scikit-learn's convention: the positive class only for two classes
                "Brier score": float(np.mean((proba[:, 1] - codes) ** 2) if binary else np.mean(
                    np.sum((proba - np.eye(proba.shape[1])[codes]) ** 2, 1))),
                "ECE (10 bins)": float(calibration_curve(codes, proba[:, 1] if binary else proba,
                                                         10)["ece"])}
    y = np.asarray(y, dtype=float)
    mean = est.predict(X)
    lower, upper = est.predict_interval(X, level)
    out = {"RMSE": float(np.sqrt(np.mean((mean - y) ** 2))),
           "MAE": float(np.mean(np.abs(mean - y))),
           ("D^2 (Poisson deviance)" if isinstance(est, GPCountRegressor) else "R^2"):
               float(est.score(X, y)),
           "NLPD": float(-np.mean(est.log_predictive_density(X, y))),
           f"coverage of the {level:g} interval": float(np.mean((y >= lower) & (y <= upper)))}
    return out


def _held_out(est, data: Path, test_size, split_seed):
    """The split to score in ``data`` as (test_size, split_seed, label), test_size None for
    every row. On the model's training file (same SHA-256) it is the split `fit` held out:
    another split, or all rows of a file fitted whole, would score training rows."""
    record = getattr(est, "training_file_", None)
    if record is None or record["sha256"] != _digest(data):
        if test_size is None and split_seed is not None:
            raise InputError("--split-seed needs --test-size (the fraction of rows to score)")
        return test_size, split_seed or 0, "held-out file" if test_size is None else "split"
    held, seed = record["test_size"], record["split_seed"]
    if held is None:
        if test_size is not None:
            raise InputError(f"{data} is the file the model was fitted on (all of its rows): "
                             f"any --test-size split of it holds training rows; fit with "
                             f"--test-size to hold rows out, or evaluate another file")
        warnings.warn(f"{data} is the file the model was fitted on: these metrics are on "
                      "training rows, not held out (fit with --test-size to hold rows out, "
                      "or evaluate another file)", stacklevel=1)
        return None, 0, "training rows"
    test_size = held if test_size is None else test_size
    split_seed = seed if split_seed is None else split_seed
    if (test_size, split_seed) != (held, seed):
        raise InputError(f"{data} is the file the model was fitted on with --test-size "
                         f"{held:g} --split-seed {seed}; --test-size {test_size:g} "
                         f"--split-seed {split_seed} would score training rows: give the "
                         "fit's split (the default) or evaluate another file")
    return test_size, split_seed, "held out by fit"


@app.command()
def evaluate(model_dir: Path = typer.Argument(..., help="a directory written by `fit`"),
             data: Path = typer.Argument(..., help="labelled test rows (.csv or .parquet)"),
             target: str = typer.Option(None, help="target column (default: the training "
                                                   "target's name)"),
             test_size: float = typer.Option(
                 None, help="score only the test part of this split of the rows (as `fit "
                 "--test-size`). Default: on the file `fit` split, the rows it held out; on "
                 "any other file, every row"),
             split_seed: int = typer.Option(
                 None, help="seed of the --test-size split (default: the fit's on its file, "
                 "else 0)"),
             plot: Path = typer.Option(None, help="save a calibration plot to this PNG file "
                                                  "(default: no plot)"),
             no_plot: bool = typer.Option(False, "--no-plot", hidden=True,
                                          help="no plot even with --plot (once the default; "
                                               "kept for scripts)"),
             level: float = typer.Option(0.95, help="coverage of the predictive intervals")
            ) -> None:
    """Held-out metrics (and, with --plot FILE, a calibration plot: reliability diagram for
    classifiers, interval coverage for regressors). Given the model's own training file,
    it scores the rows `fit --test-size` held out, and warns when there are none."""
    from augmentedgp.sklearn import GPClassifier

    figure = None if no_plot else plot

    def body():
        if not 0.0 < level < 1.0:
            raise InputError(f"--level must lie strictly inside (0, 1), got {level}")
        _check_plot(figure)
        est = _load_estimator(model_dir)
        frame = tables.read_table(data)
        name = target or getattr(est, "target_name_", None)
        if name is None:
            raise InputError("give --target: the model directory does not record it")
        classifier = isinstance(est, GPClassifier)
        y = _from_table(data, tables.target, frame, name, data, numeric=not classifier)
        X = _from_table(data, tables.features, frame, data, names=list(est.feature_names_in_),
                        role="model's feature")
        split, seed, rows = _held_out(est, data, test_size, split_seed)
        if split is not None:
            _, test = _holdout(len(y), split, seed, y if classifier else None)
            X, y = X.iloc[test], y[test]
            rows = (f"{rows}: {len(y)} of {len(frame)} rows, --test-size {split:g} "
                    f"--split-seed {seed}")
        if classifier and est.classes_.dtype.kind in "iuf":
            y = y.astype(est.classes_.dtype)
        _print_metrics(f"{type(est).__name__} on {data.name}\n({rows}; {len(y)} rows)"
                       if split is None else f"{type(est).__name__} on {data.name}\n({rows})",
                       evaluation_metrics(est, X, y, level))
        if figure is not None:
            import matplotlib.pyplot as plt

            from augmentedgp import plotting

            if classifier:
                proba = est.predict_proba(X)
                codes = np.searchsorted(est.classes_, y)
                ax = plotting.calibration(codes, proba[:, 1] if proba.shape[1] == 2 else proba)
            else:
                ax = plotting.interval_calibration(est, X, y)
            ax.figure.savefig(figure, dpi=120)
            plt.close(ax.figure)
            console.print(f"calibration plot saved to {figure.resolve()}", soft_wrap=True)

    _run(body)


@app.command()
def info() -> None:
    """Versions, JAX backend and dtype."""
    import jax

    console.print(f"augmentedgp {__version__}, jax {jax.__version__}, "
                  f"backend {jax.default_backend()}, x64 {jax.config.jax_enable_x64}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
