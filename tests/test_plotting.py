"""augmentedgp.plotting, rendered headless (Agg): the drawn data are checked against the
models' predictions, the diagnostics and brute-force / scikit-learn calibration curves.

Fitted objects are cached per module (JAX compile time dominates): an exact GP fitted by
agp.fit, a GPRegressor (the same compiled graphs), a sparse posterior and a Gibbs-sampled
MCGP. The class-probability maps and the hyperparameter traces use small stand-in
objects with the same interface (a real classifier's predict_proba would add seconds of
compilation)."""

import importlib
import sys
import types

import matplotlib

matplotlib.use("Agg")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.contour import ContourSet  # noqa: E402
from scipy import stats  # noqa: E402
from scipy.interpolate import RegularGridInterpolator  # noqa: E402
from sklearn.calibration import calibration_curve as sk_calibration_curve  # noqa: E402

import augmentedgp as agp  # noqa: E402
from augmentedgp import plotting  # noqa: E402
from augmentedgp.core import diagnostics  # noqa: E402
from augmentedgp.core.params import fixed, real  # noqa: E402
from augmentedgp.sklearn import GPRegressor  # noqa: E402

RNG = np.random.default_rng(0)
X1 = np.sort(RNG.uniform(-3.0, 3.0, 30))[:, None]
Y1 = np.sin(X1[:, 0]) + 0.2 * RNG.normal(size=30)
X1S = (X1 - X1.mean(0)) / X1.std(0)  # what GPRegressor fits on: shares compiled graphs
X2 = RNG.normal(size=(30, 2))
YB = (X2[:, 0] + 0.5 * X2[:, 1] + 0.3 * RNG.normal(size=30) > 0).astype(float)
Z1 = np.linspace(-1.5, 1.5, 6)[:, None]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def reg():
    return GPRegressor(n_inducing=None, max_iter=30).fit(X1, Y1)


@pytest.fixture(scope="module")
def gp(reg):
    kernel = agp.kernels.RBF(lengthscale=[1.0], variance=1.0)
    return agp.fit(agp.GP(kernel, noise=0.1), X1S, Y1, max_iter=30)


@pytest.fixture(scope="module")
def sparse():
    """A sparse posterior (q(u) at its prior: only its inducing inputs matter here)."""
    model = agp.SVGP(agp.kernels.RBF(lengthscale=[1.0]), agp.likelihoods.Gaussian(0.1), Z1)
    return agp.SparsePosterior(model, X1S, Y1)


@pytest.fixture(scope="module")
def mc():
    """Gibbs-sampled GP regression (the Gaussian likelihood compiles 2x faster than
    Student-t or logistic samplers)."""
    model = agp.MCGP(agp.kernels.RBF(), agp.likelihoods.Gaussian(0.1))
    settings = agp.GibbsSampling(n_samples=50, n_chains=2, burn_in=10)
    return agp.sample(model, X1, Y1, settings, key=jax.random.key(0))


class Logistic2:
    """A stand-in binary classifier: p(y = 1) as a JAX vector, as the posteriors return."""

    def predict_proba(self, X):
        X = np.asarray(X)
        return jax.nn.sigmoid(jnp.asarray(2.0 * X[:, 0] - X[:, 1] ** 2 + 0.5))


class Softmax3:
    """A stand-in 3-class classifier on 2-D inputs with sklearn's interface."""

    classes_ = np.array(["a", "b", "c"])
    W = np.array([[2.0, -1.0, 0.0], [0.0, 1.5, -2.0]])

    def predict_proba(self, X):
        logits = np.asarray(X) @ self.W
        e = np.exp(logits - logits.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)


def lines(ax):
    return {line.get_label(): line for line in ax.lines}


def band(ax, label):
    """(x, lower, upper) of a fill_between band from its polygon's vertices."""
    (coll,) = [c for c in ax.collections if c.get_label() == label]
    v = coll.get_paths()[0].vertices
    n = (len(v) - 3) // 2
    return v[1 : n + 1, 0], v[1 : n + 1, 1], v[n + 2 : 2 * n + 2, 1][::-1]


def default_grid(x):
    lo, hi = x.min(), x.max()
    return np.linspace(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo), 300)


# --- posterior_1d ----------------------------------------------------------------------


def test_posterior_1d_draws_the_predictive_band_and_latent(gp):
    ax = plotting.posterior_1d(gp, X1S, Y1, latent=True)
    grid = default_grid(X1S[:, 0])
    mean_y, var_y = (np.asarray(a) for a in gp.predict_y(grid[:, None]))
    mean_f, var_f = (np.asarray(a) for a in gp.predict_f(grid[:, None]))
    z = stats.norm.ppf(0.975)
    x, lower, upper = band(ax, "95% of y")
    np.testing.assert_allclose(x, grid)
    np.testing.assert_allclose(lower, mean_y - z * np.sqrt(var_y), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(upper, mean_y + z * np.sqrt(var_y), rtol=1e-10, atol=1e-12)
    x, lower, upper = band(ax, "95% of f")
    np.testing.assert_allclose(upper - lower, 2 * z * np.sqrt(var_f), rtol=1e-10, atol=1e-12)
    drawn = lines(ax)
    np.testing.assert_allclose(drawn["mean"].get_xdata(), grid)
    np.testing.assert_allclose(drawn["mean"].get_ydata(), mean_f, rtol=1e-10)  # Gaussian
    np.testing.assert_allclose(drawn["latent mean"].get_ydata(), mean_f, rtol=1e-10)
    assert "inducing inputs" not in drawn  # a full GP
    (data,) = [c for c in ax.collections if c.get_label() == "data"]
    np.testing.assert_allclose(data.get_offsets(), np.column_stack([X1S[:, 0], Y1]))
    assert np.all(var_y > var_f)  # the y band is the wider one


def test_posterior_1d_sklearn_regressor_uses_its_intervals(reg):
    X_plot = np.linspace(-4.0, 4.0, 40)  # a vector, in original units
    fig, ax0 = plt.subplots()
    ax = plotting.posterior_1d(reg, X1[:, 0], Y1, ax=ax0, X_plot=X_plot, level=0.8, latent=True)
    assert ax is ax0
    f_mean = np.asarray(reg.posterior_.predict_f(reg._scaler.transform(X_plot[:, None]))[0])
    np.testing.assert_allclose(lines(ax)["latent mean"].get_ydata(),
                               f_mean * Y1.std() + Y1.mean())  # normalize_y undone
    lo, hi = reg.predict_interval(X_plot[:, None], 0.8)
    x, lower, upper = band(ax, "80% of y")
    np.testing.assert_allclose(x, X_plot)
    np.testing.assert_allclose(lower, lo)
    np.testing.assert_allclose(upper, hi)
    np.testing.assert_allclose(lines(ax)["mean"].get_ydata(), reg.predict(X_plot[:, None]))


def test_posterior_1d_marks_inducing_inputs(sparse, reg):
    drawn = lines(plotting.posterior_1d(sparse, X1S, Y1))
    ticks = drawn["inducing inputs"]
    np.testing.assert_allclose(ticks.get_xdata(), Z1[:, 0])
    np.testing.assert_allclose(ticks.get_ydata(), 0.0)  # the bottom of the axes
    assert "inducing inputs" not in lines(plotting.posterior_1d(sparse, X1S, inducing=False))
    # an estimator's inducing inputs are drawn in the original units of X
    est = GPRegressor()
    est.__dict__.update(reg.__dict__, posterior_=sparse)
    ticks = lines(plotting.posterior_1d(est, X1, Y1))["inducing inputs"]
    np.testing.assert_allclose(ticks.get_xdata(), Z1[:, 0] * X1.std() + X1.mean())
    # a VGP's "inducing inputs" are its training inputs: not drawn
    vgp = agp.VGP(agp.kernels.RBF(), agp.likelihoods.Gaussian(0.1))
    vgp = eqx.tree_at(lambda m: m.inducing, vgp, fixed(real(X1S)), is_leaf=lambda x: x is None)
    assert plotting._inducing_inputs(agp.SparsePosterior(vgp, X1S, Y1)) is None
    assert plotting._inducing_inputs(sparse).shape == (6, 1)


def test_posterior_1d_rejects_bad_input(gp):
    with pytest.raises(ValueError, match=r"shape \(30, 2\)"):
        plotting.posterior_1d(gp, X2, YB)
    with pytest.raises(ValueError, match="y must have shape"):
        plotting.posterior_1d(gp, X1S, Y1[:-1])
    with pytest.raises(ValueError, match="level"):
        plotting.posterior_1d(gp, X1S, level=1.5)
    with pytest.raises(ValueError, match="predict_f"):
        plotting.posterior_1d(object(), X1S)
    two = types.SimpleNamespace(predict_f=lambda X: (np.zeros((len(X), 2)),) * 2)
    with pytest.raises(ValueError, match="single latent"):
        plotting.posterior_1d(two, X1S)


def test_figure_saves_as_png(gp, tmp_path):
    path = tmp_path / "posterior.png"
    plotting.posterior_1d(gp, X1S, Y1).figure.savefig(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


# --- proba_2d --------------------------------------------------------------------------


def test_proba_2d_binary_contours_match_predict_proba():
    clf = Logistic2()
    ax = plotting.proba_2d(clf, X2, YB, resolution=30)
    g0 = np.linspace(X2[:, 0].min(), X2[:, 0].max(), 30)
    g1 = np.linspace(X2[:, 1].min(), X2[:, 1].max(), 30)
    pad0, pad1 = 0.1 * (g0[-1] - g0[0]), 0.1 * (g1[-1] - g1[0])
    g0 = np.linspace(g0[0] - pad0, g0[-1] + pad0, 30)
    g1 = np.linspace(g1[0] - pad1, g1[-1] + pad1, 30)
    xx, yy = np.meshgrid(g0, g1)
    P = np.asarray(clf.predict_proba(np.column_stack([xx.ravel(), yy.ravel()]))).reshape(30, 30)
    assert P.min() < 0.5 < P.max()
    sets = [c for c in ax.collections if isinstance(c, ContourSet)]
    (filled,) = [c for c in sets if c.filled]
    (line,) = [c for c in sets if not c.filled]
    assert (filled.zmin, filled.zmax) == (P.min(), P.max())
    np.testing.assert_allclose(line.levels, [0.5])
    # every vertex of the 0.5 contour lies where the grid's P interpolates to 0.5
    verts = np.concatenate([p.vertices for p in line.get_paths()])
    assert len(verts) > 5
    interp = RegularGridInterpolator((g1, g0), P)
    np.testing.assert_allclose(interp(verts[:, ::-1]), 0.5, atol=1e-9)
    assert len(ax.figure.axes) == 2  # the colorbar
    assert ax.get_xlim() == (g0[0], g0[-1])
    (points,) = [c for c in ax.collections if not isinstance(c, ContourSet)]
    cmap = plt.get_cmap("RdBu_r")
    np.testing.assert_allclose(points.get_facecolors(), cmap(YB))


def test_proba_2d_multiclass_colours_by_argmax_with_alpha():
    clf = Softmax3()
    y = clf.classes_[np.argmax(clf.predict_proba(X2), 1)]
    ax = plotting.proba_2d(clf, X2, y, resolution=20, padding=0.0)
    g0 = np.linspace(X2[:, 0].min(), X2[:, 0].max(), 20)
    g1 = np.linspace(X2[:, 1].min(), X2[:, 1].max(), 20)
    xx, yy = np.meshgrid(g0, g1)
    p = clf.predict_proba(np.column_stack([xx.ravel(), yy.ravel()]))
    image = np.asarray(ax.images[0].get_array())
    assert image.shape == (20, 20, 4)
    np.testing.assert_allclose(image[..., 3].ravel(), p.max(1))
    tab10 = plt.get_cmap("tab10")
    np.testing.assert_allclose(image[..., :3].reshape(-1, 3), tab10(p.argmax(1))[:, :3])
    (points,) = ax.collections
    codes = np.searchsorted(clf.classes_, y)
    np.testing.assert_allclose(points.get_facecolors(), tab10(codes))


def test_proba_2d_two_column_proba_and_errors():
    two = types.SimpleNamespace(predict_proba=lambda X: np.column_stack(
        [1 - 1 / (1 + np.exp(-X[:, 0])), 1 / (1 + np.exp(-X[:, 0]))]))
    ax = plotting.proba_2d(two, X2, resolution=10)
    (filled,) = [c for c in ax.collections if isinstance(c, ContourSet) and c.filled]
    x_hi = X2[:, 0].max() + 0.1 * np.ptp(X2[:, 0])
    assert filled.zmax == pytest.approx(1 / (1 + np.exp(-x_hi)))  # the p(y = 1) column
    with pytest.raises(ValueError, match=r"shape \(30, 1\)"):
        plotting.proba_2d(two, X1, resolution=10)
    with pytest.raises(ValueError, match="resolution"):
        plotting.proba_2d(two, X2, resolution=1)
    with pytest.raises(ValueError, match="y must have shape"):
        plotting.proba_2d(two, X2, YB[:-2], resolution=10)
    with pytest.raises(ValueError, match="predict_proba returned"):
        plotting.proba_2d(types.SimpleNamespace(predict_proba=lambda X: np.zeros((3, 3, 3))),
                          X2, resolution=10)


# --- history ---------------------------------------------------------------------------


def test_history_plots_minus_objective(gp, reg):
    ax = plotting.history(gp)
    (line,) = ax.lines
    h = gp.history
    assert h.n_iter > 1
    np.testing.assert_allclose(line.get_ydata(), -h.objective)
    np.testing.assert_allclose(line.get_xdata(), np.arange(1, h.n_iter + 1))
    assert ax.get_ylabel() == "ELBO / log marginal likelihood"
    ax = plotting.history(reg.history_, x="time", label="exact")
    np.testing.assert_allclose(ax.lines[0].get_xdata(), reg.history_.wall_time)
    assert ax.get_xlabel() == "wall time (s)"
    ax = plotting.history([gp, reg])  # a posterior's .history and an estimator's .history_
    assert [line.get_label() for line in ax.lines] == ["run 0", "run 1"]
    assert len(ax.figure.axes) == 1  # no held-out metric: no twin axis


def test_history_held_out_metric_on_twin_axis():
    h = agp.History(objective=np.linspace(10.0, 1.0, 100), wall_time=np.linspace(0.01, 1, 100),
                    validation=np.array([3.0, 2.0, 1.5, 1.4]))
    ax = plotting.history(h)
    twin = [a for a in ax.figure.axes if a is not ax]
    assert len(twin) == 1
    np.testing.assert_allclose(twin[0].lines[0].get_xdata(), [25, 50, 75, 100])
    np.testing.assert_allclose(twin[0].lines[0].get_ydata(), h.validation)
    ax = plotting.history(h, x="time")
    twin = [a for a in ax.figure.axes if a is not ax][0]
    np.testing.assert_allclose(twin.lines[0].get_xdata(), h.wall_time[[24, 49, 74, 99]])
    ax = plotting.history(h, validation=False)
    assert len(ax.figure.axes) == 1
    with pytest.raises(ValueError, match="History"):
        plotting.history(object())
    with pytest.raises(ValueError, match="x must be"):
        plotting.history(h, x="epoch")
    with pytest.raises(ValueError, match="label"):
        plotting.history([h, h], label=["one"])


# --- calibration -----------------------------------------------------------------------


def brute_force(conf, hit, n_bins):
    """Per bin (lo, hi] (the first [0, hi]): mean confidence, accuracy, count; and the ECE."""
    rows = []
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        inside = [i for i in range(len(conf)) if (lo < conf[i] or b == 0) and conf[i] <= hi]
        if inside:
            rows.append((np.mean(conf[inside]), np.mean(hit[inside]), len(inside)))
    conf_b, acc_b, count = (np.array(col) for col in zip(*rows, strict=True))
    return conf_b, acc_b, count, np.sum(count * np.abs(acc_b - conf_b)) / len(conf)


def test_calibration_curve_binary_matches_brute_force_and_sklearn():
    rng = np.random.default_rng(1)
    p = np.concatenate([rng.uniform(size=497), [0.0, 0.5, 1.0]])  # edges included
    y = (rng.uniform(size=500) < p**1.5).astype(int)
    for n_bins in (5, 10, 13):
        cal = plotting.calibration_curve(y, p, n_bins)
        conf, acc, count, ece = brute_force(p, y.astype(float), n_bins)
        np.testing.assert_allclose(cal["confidence"], conf, rtol=1e-12)
        np.testing.assert_allclose(cal["accuracy"], acc, rtol=1e-12)
        np.testing.assert_array_equal(cal["count"], count)
        assert cal["ece"] == pytest.approx(ece, rel=1e-12)
        prob_true, prob_pred = sk_calibration_curve(y, p, n_bins=n_bins, strategy="uniform")
        np.testing.assert_allclose(cal["accuracy"], prob_true, rtol=1e-12)
        np.testing.assert_allclose(cal["confidence"], prob_pred, rtol=1e-12)
    assert cal["count"].sum() == 500
    # boolean, {-1, +1} and labelled targets give the same curve
    for labels, classes in ((y.astype(bool), None), (2 * y - 1, None),
                            (np.where(y == 1, "yes", "no"), ["no", "yes"])):
        other = plotting.calibration_curve(labels, p, 13, classes=classes)
        np.testing.assert_allclose(other["accuracy"], cal["accuracy"])
    # a calibrated predictor has a small ECE, a confidently wrong one a large one
    q = rng.uniform(size=20000)
    assert plotting.calibration_curve(rng.uniform(size=20000) < q, q)["ece"] < 0.02
    assert plotting.calibration_curve(q < 0.5, q)["ece"] > 0.4


def test_calibration_curve_multiclass_top_label():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(400, 4)) * 2
    proba = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.array([rng.choice(4, p=row) for row in proba])
    cal = plotting.calibration_curve(y, proba, 8)
    conf, acc, count, ece = brute_force(proba.max(1), (proba.argmax(1) == y) * 1.0, 8)
    np.testing.assert_allclose(cal["confidence"], conf, rtol=1e-12)
    np.testing.assert_allclose(cal["accuracy"], acc, rtol=1e-12)
    np.testing.assert_array_equal(cal["count"], count)
    assert cal["ece"] == pytest.approx(ece, rel=1e-12)
    names = np.array(["w", "x", "y", "z"])
    labelled = plotting.calibration_curve(names[y], proba, 8, classes=names)
    np.testing.assert_allclose(labelled["accuracy"], cal["accuracy"])


@pytest.mark.parametrize("y, proba, match", [
    ([0, 1, 1], [0.1, 0.5], "y_true must have shape"),
    ([0, 1], [[0.1], [0.2]], "shape"),
    ([0, 1], np.full((2, 2, 2), 0.5), "shape"),
    ([0, 1], [0.1, 1.2], "outside"),
    ([0, 1], [-0.1, 0.5], "outside"),
    ([0, 1], [np.nan, 0.5], "NaN"),
    ([0, 2], [0.1, 0.5], "binary"),
    ([0, 3], [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], "codes"),
    ([0.5, 1], [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], "codes"),
])
def test_calibration_curve_rejects_bad_input(y, proba, match):
    with pytest.raises(ValueError, match=match):
        plotting.calibration_curve(y, proba)


def test_calibration_curve_rejects_bad_bins_and_classes():
    with pytest.raises(ValueError, match="n_bins"):
        plotting.calibration_curve([0, 1], [0.2, 0.7], 0)
    with pytest.raises(ValueError, match="classes has 3"):
        plotting.calibration_curve([0, 1], [0.2, 0.7], classes=[0, 1, 2])
    with pytest.raises(ValueError, match="not among the classes"):
        plotting.calibration_curve(["a", "c"], [0.2, 0.7], classes=["a", "b"])


def test_calibration_plot_draws_the_curve_and_counts():
    rng = np.random.default_rng(3)
    p = rng.uniform(size=300)
    y = rng.uniform(size=300) < p
    cal = plotting.calibration_curve(y, p, 10)
    ax = plotting.calibration(y, p)
    (line,) = [ln for ln in ax.lines if ln.get_label().startswith("model")]
    np.testing.assert_allclose(line.get_xdata(), cal["confidence"])
    np.testing.assert_allclose(line.get_ydata(), cal["accuracy"])
    assert f"{cal['ece']:.3f}" in ax.get_title() and f"{cal['ece']:.3f}" in line.get_label()
    (inset,) = ax.child_axes
    np.testing.assert_allclose([bar.get_height() for bar in inset.patches], cal["count"])


# --- interval calibration --------------------------------------------------------------


def test_interval_coverage_matches_a_direct_count(reg):
    levels = np.array([0.2, 0.5, 0.9])
    cover = plotting.interval_coverage(reg, X1, Y1, levels)
    for level, c in zip(levels, cover, strict=True):
        lo, hi = reg.predict_interval(X1, level)
        assert c == np.mean((lo <= Y1) & (Y1 <= hi))
    assert np.all(np.diff(cover) >= 0) and cover[-1] > 0.5
    ax = plotting.interval_calibration(reg, X1, Y1, levels=levels)
    (line,) = [ln for ln in ax.lines if ln.get_label() == "observed"]
    np.testing.assert_allclose(line.get_xdata(), levels)
    np.testing.assert_allclose(line.get_ydata(), cover)
    with pytest.raises(ValueError, match="predict_interval"):
        plotting.interval_coverage(object(), X1, Y1)
    with pytest.raises(ValueError, match="levels"):
        plotting.interval_coverage(reg, X1, Y1, [0.5, 1.0])
    with pytest.raises(ValueError, match="y must have shape"):
        plotting.interval_coverage(reg, X1, Y1[:5])


# --- MCMC ------------------------------------------------------------------------------


def test_trace_lines_are_the_chains(mc):
    f = np.asarray(mc.f)
    ax = plotting.trace(mc, index=3)
    assert len(ax.lines) == 2
    for c, line in enumerate(ax.lines):
        np.testing.assert_allclose(line.get_xdata(), np.arange(50))
        np.testing.assert_allclose(line.get_ydata(), f[c, :, 3])
    assert f"{float(diagnostics.split_rhat(f[:, :, 3])):.3f}" in ax.get_title()
    with pytest.raises(ValueError, match="index"):
        plotting.trace(mc, index=30)
    with pytest.raises(ValueError, match="latent must be 0"):
        plotting.trace(mc, latent=1)
    with pytest.raises(ValueError, match="hyper"):
        plotting.trace(mc, hyper=True)


def test_trace_multilatent_and_hyperparameters():
    rng = np.random.default_rng(4)
    f = rng.normal(size=(2, 20, 5, 3))
    hyper = {"kernel": {"variance": rng.normal(size=(2, 20)),
                        "lengthscale": rng.normal(size=(2, 20, 2))}}
    chain = types.SimpleNamespace(f=f, hyper=hyper)
    ax = plotting.trace(chain, index=4, latent=2)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), f[1, :, 4, 2])
    axes = plotting.trace(chain, index=1, latent=0, hyper=True)
    assert len(axes) == 4
    np.testing.assert_allclose(axes[0].lines[0].get_ydata(), f[0, :, 1, 0])
    by_name = {a.get_ylabel(): a for a in axes[1:]}
    assert set(by_name) == {"['kernel']['lengthscale'][0]", "['kernel']['lengthscale'][1]",
                            "['kernel']['variance']"}
    np.testing.assert_allclose(by_name["['kernel']['lengthscale'][1]"].lines[1].get_ydata(),
                               hyper["kernel"]["lengthscale"][1, :, 1])
    np.testing.assert_allclose(by_name["['kernel']['variance']"].lines[0].get_ydata(),
                               hyper["kernel"]["variance"][0])
    with pytest.raises(ValueError, match="latent 3"):
        plotting.trace(chain, latent=3)
    with pytest.raises(ValueError, match="ax=None"):
        plotting.trace(chain, hyper=True, ax=plt.subplots()[1])
    with pytest.raises(ValueError, match="shape"):
        plotting.trace(types.SimpleNamespace(f=np.zeros((2, 5))))


def test_autocorrelation_stems_match_diagnostics(mc):
    f = np.asarray(mc.f)
    ax = plotting.autocorrelation(mc, index=2, max_lag=20)
    stems = ax.collections
    assert len(stems) == 2
    for c, stem in enumerate(stems):
        expected = diagnostics.autocorrelation(f[c : c + 1, :, 2], 20)
        heights = np.array([seg[1, 1] for seg in stem.get_segments()])
        np.testing.assert_allclose(heights, expected, rtol=1e-12)
        assert heights[0] == pytest.approx(1.0)
    assert f"bulk ESS = {float(diagnostics.ess_bulk(f[:, :, 2])):.0f} of 100" in ax.get_title()
    ax = plotting.autocorrelation(mc, max_lag=500)  # clipped to n_samples - 1
    assert len(ax.collections[0].get_segments()) == 50
    with pytest.raises(ValueError, match="max_lag"):
        plotting.autocorrelation(mc, max_lag=-1)


# --- matplotlib is optional ------------------------------------------------------------


def test_missing_matplotlib_raises_a_helpful_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    importlib.reload(plotting)  # importing the module needs no matplotlib
    h = agp.History(objective=np.arange(3.0), wall_time=np.arange(3.0))
    with pytest.raises(ImportError, match=r"augmentedgp\[plot\]"):
        plotting.history(h)
    with pytest.raises(ImportError, match=r"augmentedgp\[plot\]"):
        plotting.calibration([0, 1], [0.2, 0.7])
