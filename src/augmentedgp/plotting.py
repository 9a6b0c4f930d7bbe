"""Plots of fitted models, training and diagnostics (matplotlib, an optional dependency).

- :func:`posterior_1d`: mean and ``level`` band of y (and of f) over 1-D inputs, with the
  data and the inducing inputs (ticks at the bottom).
- :func:`proba_2d`: class-probability map over 2-D inputs (binary: p(y = 1) contours;
  multi-class: the most probable class, shaded by its probability).
- :func:`history`: ELBO / log marginal likelihood per iteration (or wall time), and the
  held-out metric per chunk on a twin axis.
- :func:`calibration_curve`, :func:`calibration`: reliability diagram and expected
  calibration error (binary or top-label); :func:`interval_coverage`,
  :func:`interval_calibration`: coverage of the predictive intervals of a regressor.
- :func:`trace`, :func:`autocorrelation`: MCMC traces and autocorrelations of an
  :class:`~augmentedgp.MCPosterior` per chain.

Every plotting function takes ``ax`` (a new figure when None) and returns the Axes it drew
on; matplotlib is imported only when a plot is made, and ``plt.show`` is never called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from jaxtyping import ArrayLike
from scipy import stats

from augmentedgp.core import diagnostics
from augmentedgp.core.validation import check_finite, check_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["posterior_1d", "proba_2d", "history", "calibration_curve", "calibration",
           "interval_coverage", "interval_calibration", "trace", "autocorrelation"]

_ELBO = "ELBO / log marginal likelihood"
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # nominal interval levels


# --- shared helpers ----------------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'augmentedgp[plot]'") from None
    return plt


def _axes(ax):
    return _pyplot().subplots()[1] if ax is None else ax


_finite = check_finite


def _inputs(X, d, name="X"):
    """Inputs as an (n, d) float array; a vector counts as one column when d = 1."""
    arr = _finite(X, name)
    if d == 1 and arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] != d or arr.shape[0] == 0:
        need = "(n,) or (n, 1)" if d == 1 else f"(n, {d})"
        raise ValueError(f"{name} must have {d}-D inputs of shape {need}, got shape "
                         f"{np.shape(X)}")
    return arr


def _vector(y, n, name="y"):
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match the inputs, got shape "
                         f"{np.shape(y)}")
    return arr


def _grid(x, padding, num):
    """``num`` points over the range of ``x`` padded by ``padding`` of its span each side."""
    lo, hi = float(np.min(x)), float(np.max(x))
    pad = padding * ((hi - lo) or 1.0)
    return np.linspace(lo - pad, hi + pad, num)


def _level(level):
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly inside (0, 1), got {level!r}")
    return float(level)


def _inducing_inputs(post):
    """Inducing inputs (M, d) of a sparse model, or None (full models; a VGP's are its data)."""
    from augmentedgp.models.sparse import VGP

    model = getattr(post, "model", None)
    Z = getattr(model, "inducing", None)
    if Z is None or isinstance(model, VGP):
        return None
    return np.asarray(getattr(Z, "value", Z))


# --- fitted models ---------------------------------------------------------------------


def posterior_1d(model, X, y=None, *, ax: Axes | None = None, X_plot=None, level=0.95,
                 inducing=True, latent=False) -> Axes:
    """Predictive mean and central ``level`` band of y over 1-D inputs, the data and (for
    sparse models) the inducing inputs as ticks at the bottom; ``latent=True`` adds the band
    and mean of the latent f.

    ``model``: a fitted posterior (``SitePosterior``, ``SparsePosterior``, ``MCPosterior``;
    the y band is the predictive mean +- z sd) or a fitted ``GPRegressor`` /
    ``GPCountRegressor`` (its ``predict_interval``). ``X_plot`` defaults to 300 points over
    the range of X padded by 10%. For a binary classifier the mean is p(y = 1) and the band
    p +- z sqrt(p (1 - p)); ``latent=True`` shows the more useful band of f.
    """
    level = _level(level)
    x = _inputs(X, 1)
    y = None if y is None else _finite(_vector(y, len(x)), "y")
    grid = (_grid(x, 0.1, 300)[:, None] if X_plot is None else
            np.sort(_inputs(X_plot, 1, "X_plot"), axis=0))
    z = stats.norm.ppf(0.5 + level / 2)
    if hasattr(model, "predict_interval"):  # scikit-learn regressor (original units)
        mean = np.asarray(model.predict(grid))
        lower, upper = (np.asarray(b) for b in model.predict_interval(grid, level))
        post, to_x = model.posterior_, model.input_scaler_.inverse
        shift, scale = model.target_scale_
        f_mean, f_var = (np.asarray(a)
                         for a in post.predict_f(model.input_scaler_.transform(grid)))
        f_mean, f_sd = f_mean * scale + shift, np.sqrt(np.maximum(f_var, 0)) * scale
    elif hasattr(model, "predict_f"):
        post, to_x = model, lambda Z: Z
        f_mean, f_var = (np.asarray(a) for a in model.predict_f(grid))
        if f_mean.ndim != 1:
            raise ValueError(f"posterior_1d needs a single latent function; this model has "
                             f"{f_mean.shape[-1]}")
        mean, var = (np.asarray(a) for a in model.predict_y(grid))
        sd = np.sqrt(np.maximum(var, 0))
        lower, upper = mean - z * sd, mean + z * sd
        f_sd = np.sqrt(np.maximum(f_var, 0))
    else:
        raise ValueError("posterior_1d needs a fitted posterior (with predict_f) or a fitted "
                         f"GPRegressor / GPCountRegressor, got {type(model).__name__}")
    ax = _axes(ax)
    g = grid[:, 0]
    ax.fill_between(g, lower, upper, color="C0", alpha=0.25, lw=0, label=f"{100 * level:g}% of y")
    if latent:
        ax.fill_between(g, f_mean - z * f_sd, f_mean + z * f_sd, color="C1", alpha=0.3, lw=0,
                        label=f"{100 * level:g}% of f")
        ax.plot(g, f_mean, color="C1", ls="--", label="latent mean")
    ax.plot(g, mean, color="C0", label="mean")
    if y is not None:
        ax.scatter(x[:, 0], y, s=12, color="k", zorder=3, label="data")
    Z = _inducing_inputs(post) if inducing else None
    if Z is not None:  # ticks at the bottom: x in data, y in axes coordinates
        Z = to_x(Z)[:, 0]
        ax.plot(Z, np.zeros_like(Z), "|", color="C3", ms=10, mew=1.5, clip_on=False,
                transform=ax.get_xaxis_transform(), label="inducing inputs")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(loc="best", fontsize="small")
    return ax


def proba_2d(model, X, y=None, *, ax: Axes | None = None, resolution=100, padding=0.1) -> Axes:
    """Class probabilities over 2-D inputs on a ``resolution`` x ``resolution`` grid over the
    range of X (padded by ``padding``). Binary (``predict_proba`` of shape (n,) = p(y = 1),
    or (n, 2)): filled contours of p(y = 1), its 0.5 contour and a colorbar; multi-class
    ((n, C)): each cell coloured by its most probable class with alpha = that probability.
    With ``y`` the points are drawn coloured by class."""
    plt = _pyplot()
    X = _inputs(X, 2)
    resolution = check_int(resolution, "resolution", 2)
    g0, g1 = _grid(X[:, 0], padding, resolution), _grid(X[:, 1], padding, resolution)
    xx, yy = np.meshgrid(g0, g1)
    p = np.asarray(model.predict_proba(np.column_stack([xx.ravel(), yy.ravel()])))
    if p.ndim == 2 and p.shape[1] == 2:
        p = p[:, 1]
    if p.ndim not in (1, 2) or p.shape[0] != xx.size:
        raise ValueError(f"predict_proba returned shape {p.shape}; expected ({xx.size},) or "
                         f"({xx.size}, C)")
    ax = _axes(ax)
    C = 2 if p.ndim == 1 else p.shape[1]
    colours = plt.get_cmap("RdBu_r" if C == 2 else "tab10" if C <= 10 else "tab20")
    colour_of = (lambda k: colours(np.asarray(k, float))) if C == 2 else colours
    if p.ndim == 1:
        P = p.reshape(xx.shape)
        cs = ax.contourf(xx, yy, P, levels=np.linspace(0, 1, 11), cmap=colours, vmin=0, vmax=1)
        ax.contour(xx, yy, P, levels=[0.5], colors="k", linewidths=1.5)
        ax.figure.colorbar(cs, ax=ax, label="p(y = 1)")
    else:
        k = np.argmax(p, axis=1)
        rgba = colours(k)
        rgba[:, 3] = p[np.arange(len(k)), k]
        ax.imshow(rgba.reshape(*xx.shape, 4), origin="lower", aspect="auto",
                  interpolation="nearest", extent=(g0[0], g0[-1], g1[0], g1[-1]))
    if y is not None:
        codes = _class_codes(_vector(y, len(X)), _model_classes(model))
        ax.scatter(X[:, 0], X[:, 1], c=colour_of(codes), s=18, edgecolors="k", linewidths=0.5)
    ax.set_xlim(g0[0], g0[-1])
    ax.set_ylim(g1[0], g1[-1])
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    return ax


def _model_classes(model):
    """The class labels of a classifier (``classes_`` or its likelihood's), or None."""
    classes = getattr(model, "classes_", None)
    if classes is None:
        classes = getattr(getattr(model, "likelihood", None), "classes", None)
    return classes


def _class_codes(y, classes):
    """Class indices of labels y: in the order of ``classes``, or sorted when None."""
    if classes is None:
        return np.unique(y, return_inverse=True)[1]
    code = {label: k for k, label in enumerate(np.asarray(classes).tolist())}
    try:
        return np.array([code[label] for label in y.tolist()], dtype=int)
    except (KeyError, TypeError):
        raise ValueError(f"y has labels not among the classes {list(code)[:10]}") from None


# --- training --------------------------------------------------------------------------


def _as_history(h):
    for attr in ("objective", "history", "history_"):
        if hasattr(h, attr):
            return h if attr == "objective" else _as_history(getattr(h, attr))
    raise ValueError("history needs an augmentedgp History, a fitted posterior (.history) "
                     f"or a fitted estimator (.history_), got {type(h).__name__}")


def history(h, *, ax: Axes | None = None, x="iteration", label=None, validation=True) -> Axes:
    """The training trace: -objective (the ELBO or log marginal likelihood being maximised)
    per iteration (``x="iteration"``) or against wall time (``x="time"``), one line per
    history if ``h`` is a list (``label``: one string, or one per history); the held-out
    metric per chunk (``History.validation``, the NLPD) on a twin axis, dashed."""
    if x not in ("iteration", "time"):
        raise ValueError(f"x must be 'iteration' or 'time', got {x!r}")
    runs = [_as_history(r) for r in (h if isinstance(h, list | tuple) else [h])]
    labels = label if isinstance(label, list | tuple) else [label] * len(runs)
    if len(labels) != len(runs):
        raise ValueError(f"label has {len(labels)} entries for {len(runs)} histories")
    if label is None and len(runs) > 1:
        labels = [f"run {i}" for i in range(len(runs))]
    ax = _axes(ax)
    twin = None
    for i, (run, lab) in enumerate(zip(runs, labels, strict=True)):
        obj = np.asarray(run.objective, dtype=float)
        n = len(obj)
        xs = np.arange(1, n + 1) if x == "iteration" else np.asarray(run.wall_time, float)
        ax.plot(xs, -obj, color=f"C{i}", label=lab)
        val = getattr(run, "validation", None)
        if validation and val is not None and len(val):
            # one value per chunk, recorded after it: evenly spaced chunk ends
            ends = np.clip(np.round(np.linspace(n / len(val), n, len(val))).astype(int), 1, n)
            twin = ax.twinx() if twin is None else twin
            twin.plot(xs[ends - 1], val, color=f"C{i}", ls="--", marker="o", ms=3,
                      label=None if lab is None else f"{lab} (held-out)")
    ax.set_xlabel("iteration" if x == "iteration" else "wall time (s)")
    ax.set_ylabel(_ELBO)
    if twin is not None:
        twin.set_ylabel("held-out NLPD (dashed)")
    if any(lab is not None for lab in labels):
        ax.legend(loc="best", fontsize="small")
    return ax


# --- calibration -----------------------------------------------------------------------


def calibration_curve(y_true: ArrayLike, proba: ArrayLike, n_bins: int = 10, *, classes=None
                     ) -> dict[str, np.ndarray | float]:
    """Reliability-diagram statistics over ``n_bins`` equal-width bins of [0, 1].

    Binary: ``proba`` (n,) is p(positive) and ``y_true`` in {0, 1}, {-1, +1} or bool (or
    labels mapped by ``classes = [negative, positive]``); the bins are over p(positive) and
    ``accuracy`` is the observed frequency of positives (as
    ``sklearn.calibration.calibration_curve(strategy="uniform")``). Multi-class: ``proba``
    (n, C) and ``y_true`` codes 0..C-1 (or labels in the order of ``classes``); top-label
    confidence max_k p_k and accuracy [argmax_k p_k = y]. Returns a dict with, per
    non-empty bin, ``confidence`` (mean predicted value), ``accuracy`` and ``count``, and
    ``ece`` = sum_b count_b / n |accuracy_b - confidence_b|.
    """
    n_bins = check_int(n_bins, "n_bins")
    p = _finite(proba, "proba")
    if p.ndim not in (1, 2) or p.shape[0] == 0 or (p.ndim == 2 and p.shape[1] < 2):
        raise ValueError(f"proba must have shape (n,) (binary) or (n, C) with C >= 2, got "
                         f"shape {p.shape}")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("proba has values outside [0, 1]")
    y = _vector(y_true, p.shape[0], "y_true")
    C = 2 if p.ndim == 1 else p.shape[1]
    if classes is not None:
        if len(classes) != C:
            raise ValueError(f"classes has {len(classes)} labels but proba has {C} classes")
        codes = _class_codes(y, classes)
    elif p.ndim == 1:
        values = set(np.unique(y).tolist())
        if not (values <= {0, 1} or values <= {-1, 1}):
            raise ValueError(f"binary y_true must hold labels in {{0, 1}} or {{-1, +1}} (or "
                             f"give classes=), got {sorted(values)[:6]}")
        codes = (y > 0).astype(int)
    else:
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= C:
            raise ValueError(f"y_true must hold integer codes 0..{C - 1} (or give classes=)")
        codes = y
    if p.ndim == 1:
        conf, hit = p, codes.astype(float)
    else:
        conf, hit = p.max(axis=1), (np.argmax(p, axis=1) == codes).astype(float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.searchsorted(edges[1:-1], conf)  # right-closed bins, as scikit-learn
    count = np.bincount(bins, minlength=n_bins)
    keep = count > 0
    confidence = np.bincount(bins, conf, n_bins)[keep] / count[keep]
    accuracy = np.bincount(bins, hit, n_bins)[keep] / count[keep]
    ece = float(np.sum(count[keep] * np.abs(accuracy - confidence)) / len(conf))
    return {"confidence": confidence, "accuracy": accuracy, "count": count[keep], "ece": ece}


def calibration(y_true, proba, *, n_bins=10, ax: Axes | None = None, classes=None) -> Axes:
    """Reliability diagram: observed frequency (binary) or top-label accuracy per bin
    against the mean predicted value, the diagonal, the ECE in the legend and the bin counts
    as an inset histogram."""
    cal = calibration_curve(y_true, proba, n_bins, classes=classes)
    binary = np.ndim(proba) == 1
    ax = _axes(ax)
    ax.plot([0, 1], [0, 1], "k:", label="perfectly calibrated")
    ax.plot(cal["confidence"], cal["accuracy"], "o-", color="C0",
            label=f"model (ECE = {cal['ece']:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted probability" if binary else "confidence (top-label)")
    ax.set_ylabel("observed frequency" if binary else "accuracy")
    ax.set_title(f"Reliability diagram, ECE = {cal['ece']:.3f}")
    ax.legend(loc="upper left", fontsize="small")
    inset = ax.inset_axes([0.6, 0.07, 0.37, 0.22])
    inset.bar(cal["confidence"], cal["count"], width=0.8 / n_bins, color="C0", alpha=0.6)
    inset.set_xlim(0, 1)
    inset.set_title("count", fontsize="x-small")
    inset.tick_params(labelsize="x-small")
    return ax


def interval_coverage(model, X: ArrayLike, y: ArrayLike, levels=LEVELS) -> np.ndarray:
    """Observed fraction of y inside the central predictive interval at each nominal level
    (``model.predict_interval(X, level)`` of a fitted GPRegressor / GPCountRegressor)."""
    if not hasattr(model, "predict_interval"):
        raise ValueError("interval_coverage needs a fitted regressor with predict_interval "
                         f"(GPRegressor, GPCountRegressor), got {type(model).__name__}")
    levels = np.atleast_1d(np.asarray(levels, dtype=float))
    if levels.ndim != 1 or not np.all((levels > 0) & (levels < 1)):
        raise ValueError(f"levels must lie strictly inside (0, 1), got {levels}")
    y = _finite(_vector(y, len(X)), "y")
    out = []
    for level in levels:
        lower, upper = model.predict_interval(X, float(level))
        out.append(np.mean((np.asarray(lower) <= y) & (y <= np.asarray(upper))))
    return np.asarray(out)


def interval_calibration(model, X, y, *, levels=LEVELS, ax: Axes | None = None) -> Axes:
    """Observed coverage of the central predictive intervals against their nominal level."""
    levels = np.atleast_1d(np.asarray(levels, dtype=float))
    cover = interval_coverage(model, X, y, levels)
    ax = _axes(ax)
    ax.plot([0, 1], [0, 1], "k:", label="nominal")
    ax.plot(levels, cover, "o-", color="C0", label="observed")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("nominal level of the central interval")
    ax.set_ylabel("observed coverage")
    ax.legend(loc="upper left", fontsize="small")
    return ax


# --- MCMC ------------------------------------------------------------------------------


def _draws(chain, index, latent):
    """(n_chains, n_samples) draws of f at training input ``index`` (and ``latent``)."""
    f = np.asarray(getattr(chain, "f", chain))
    if f.ndim not in (3, 4):
        raise ValueError(f"chain.f must have shape (n_chains, n_samples, n) or (n_chains, "
                         f"n_samples, n, C), got shape {f.shape}")
    if not -f.shape[2] <= index < f.shape[2]:
        raise ValueError(f"index {index} is out of range for {f.shape[2]} training inputs")
    if f.ndim == 3:
        if latent != 0:
            raise ValueError(f"latent must be 0 for a single latent function, got {latent}")
        return f[:, :, index]
    if not -f.shape[3] <= latent < f.shape[3]:
        raise ValueError(f"latent {latent} is out of range for {f.shape[3]} latent functions")
    return f[:, :, index, latent]


def trace(chain, *, index=0, latent=0, ax: Axes | None = None, hyper=None) -> Axes:
    """Trace of the samples of f at training input ``index`` (latent ``latent``), one line
    per chain, with the split R-hat in the title. ``hyper=True`` (chains run with
    ``GibbsSampling(hyper_every=k)``) also traces every scalar of ``chain.hyper`` (raw,
    unconstrained values) in a column of subplots below, on a new figure; it then returns
    the array of Axes."""
    draws = _draws(chain, index, latent)
    if hyper:
        import jax

        if getattr(chain, "hyper", None) is None:
            raise ValueError("hyper=True needs hyperparameter samples: "
                             "GibbsSampling(hyper_every=k)")
        if ax is not None:
            raise ValueError("hyper=True draws its own figure; leave ax=None")
        series = []
        for path, leaf in jax.tree_util.tree_leaves_with_path(chain.hyper):
            leaf = np.asarray(leaf).reshape(*draws.shape, -1)
            name = jax.tree_util.keystr(path)
            series += [(f"{name}[{j}]" if leaf.shape[2] > 1 else name, leaf[:, :, j])
                       for j in range(leaf.shape[2])]
        fig, axes = _pyplot().subplots(1 + len(series), 1, sharex=True, squeeze=False,
                                       figsize=(6.4, 2.0 * (1 + len(series))))
        axes = axes[:, 0]
        for a, (name, s) in zip(axes[1:], series, strict=True):
            _trace_lines(a, s)
            a.set_ylabel(name, fontsize="small")
        _trace_f(axes[0], draws, index, latent, chain)
        axes[-1].set_xlabel("sample")
        return axes
    ax = _axes(ax)
    _trace_f(ax, draws, index, latent, chain)
    ax.set_xlabel("sample")
    return ax


def _trace_lines(ax, draws):
    for c, d in enumerate(draws):
        ax.plot(np.arange(len(d)), d, color=f"C{c}", lw=0.8, alpha=0.8, label=f"chain {c}")


def _trace_f(ax, draws, index, latent, chain):
    _trace_lines(ax, draws)
    name = f"f{'' if np.ndim(getattr(chain, 'f', chain)) == 3 else f'_{latent}'}(x_{index})"
    title = name
    if draws.shape[1] >= 4:
        title += f": split R-hat = {float(diagnostics.split_rhat(draws)):.3f}"
    ax.set_ylabel(name)
    ax.set_title(title)
    if len(draws) > 1:
        ax.legend(loc="upper right", fontsize="x-small")


def autocorrelation(chain, *, index=0, latent=0, max_lag=50, ax: Axes | None = None) -> Axes:
    """Autocorrelation of the samples of f at training input ``index`` per chain
    (``diagnostics.autocorrelation``), as stems up to ``max_lag`` (at most n_samples - 1),
    with the bulk ESS of all chains in the title."""
    draws = _draws(chain, index, latent)
    max_lag = check_int(max_lag, "max_lag", 0)
    if draws.shape[1] < 4:
        raise ValueError(f"autocorrelation needs at least 4 samples per chain, got "
                         f"{draws.shape[1]}")
    max_lag = min(int(max_lag), draws.shape[1] - 1)
    ax = _axes(ax)
    lags = np.arange(max_lag + 1)
    width = 0.8 / len(draws)
    for c, d in enumerate(draws):  # stems side by side, one colour per chain
        acf = diagnostics.autocorrelation(d[None], max_lag)
        x = lags + (c - (len(draws) - 1) / 2) * width
        ax.vlines(x, 0, acf, color=f"C{c}", lw=1.2, label=f"chain {c}")
        ax.plot(x, acf, "o", color=f"C{c}", ms=2.5)
    ax.axhline(0, color="k", lw=0.6)
    ess = float(diagnostics.ess_bulk(draws))
    ax.set_title(f"bulk ESS = {ess:.0f} of {draws.size} draws")
    ax.set_xlabel("lag")
    ax.set_ylabel("autocorrelation")
    if len(draws) > 1:
        ax.legend(loc="upper right", fontsize="x-small")
    return ax
