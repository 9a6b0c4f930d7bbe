"""Bad input fails early with a ValueError that names the argument; never a NaN result."""

import jax
import numpy as np
import pytest

import augmentedgp as agp

rng = np.random.default_rng(0)
X = rng.normal(size=(20, 2))
y = np.sin(X[:, 0])


def model():
    return agp.GP(agp.kernels.RBF(1.0), noise=0.1)


@pytest.mark.parametrize("bad_X,match", [
    (np.where(np.arange(40).reshape(20, 2) == 3, np.nan, X), "X contains NaN"),
    (np.where(np.arange(40).reshape(20, 2) == 3, np.inf, X), "X contains NaN or inf"),
    (X[:, 0], "X must be 2-D"),
    (np.zeros((0, 2)), "at least one row"),
    ([["a", "b"]] * 20, "X must be a numeric array"),
    (X + 1e-3j, "X must be real-valued, got complex numbers"),  # not a silent X.real
])
def test_bad_inputs(bad_X, match):
    with pytest.raises(ValueError, match=match):
        model().posterior(bad_X, y)
    with pytest.raises(ValueError, match=match):
        agp.fit(model(), bad_X, y)


@pytest.mark.parametrize("bad_y,match", [
    (np.where(np.arange(20) == 5, np.nan, y), "y contains NaN"),
    (y[:-1], "y has 19 entries but X has 20 rows"),
    (np.stack([y, y], 1), "y must be 1-D"),
    (y + 0j, "y must be real-valued, got complex numbers"),
])
def test_bad_targets(bad_y, match):
    with pytest.raises(ValueError, match=match):
        model().log_marginal_likelihood(X, bad_y)
    with pytest.raises(ValueError, match=match):
        agp.fit(model(), X, bad_y)


def test_column_vector_targets_are_accepted():
    a = model().log_marginal_likelihood(X, y)
    assert a == model().log_marginal_likelihood(X, y[:, None])


@pytest.mark.parametrize("make,match", [
    (lambda: agp.GP(agp.kernels.RBF(1.0), noise=0.0), "noise variance must be > 0"),
    (lambda: agp.GP(agp.kernels.RBF(1.0), noise=-1.0), "noise variance must be > 0"),
    (lambda: agp.GP(agp.kernels.RBF(-1.0)), "lengthscale must be > 0"),
    (lambda: agp.GP(agp.kernels.RBF([1.0, 0.0])), "lengthscale must be > 0"),
    (lambda: agp.GP(agp.kernels.RBF(np.nan)), "lengthscale must be finite"),
    (lambda: agp.GP(agp.kernels.RBF(1.0, 0.0)), "variance must be > 0"),
    (lambda: agp.GP(agp.kernels.RBF(1.0), agp.likelihoods.Gaussian(0.1), noise=0.1), "not both"),
    (lambda: agp.GP("rbf"), "kernel must be"),
])
def test_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_prediction_inputs_are_checked():
    post = model().posterior(X, y)
    with pytest.raises(ValueError, match="Xnew must have 2 columns"):
        post.predict_f(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="Xnew contains NaN"):
        post.predict_y(np.full((3, 2), np.nan))
    with pytest.raises(ValueError, match="ynew has 2 entries"):
        post.predict_log_density(np.zeros((3, 2)), np.zeros(2))
    with pytest.raises(TypeError, match="classification likelihood"):
        post.predict_proba(np.zeros((3, 2)))


def test_ard_lengthscale_of_wrong_length():
    with pytest.raises(ValueError, match=r"ARD lengthscale has 3 entries \(one per input "
                       r"column\) but X has 2 columns"):
        agp.GP(agp.kernels.RBF([1.0, 1.0, 1.0]), noise=0.1).posterior(X, y)


def test_duplicated_inputs_with_zero_noise_kernel_raise_not_nan():
    """Duplicates with ~zero noise stay finite; a matrix jitter cannot rescue raises."""
    Xd = np.repeat(X[:5], 4, axis=0)
    post = agp.GP(agp.kernels.RBF(1.0), noise=1e-12).posterior(Xd, np.repeat(y[:5], 4))
    mean, var = post.predict_f(X[:3])  # B = I + S K S stays >= I: finite predictions
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var))
    with pytest.raises(agp.NotPositiveDefiniteError, match="not positive definite"):
        agp.linalg.check_cholesky(agp.linalg.cholesky(-np.eye(3)))


def test_restart_options_are_checked():
    with pytest.raises(ValueError, match="n_restarts must be an integer >= 0"):
        agp.fit(model(), X, y, n_restarts=-1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="optimizer must be"):
        agp.fit(model(), X, y, optimizer="sgdx")
    with pytest.raises(ValueError, match="max_iter must be an integer >= 0"):
        agp.fit(model(), X, y, max_iter=-1)


@pytest.mark.parametrize("setting", [{"chunk_size": 0}, {"window": 0}, {"patience": -1},
                                     {"chunk_size": 2.5}, {"window": True}])
def test_training_loop_settings_are_checked(setting):
    """The variational loop's chunk, window and patience are positive integers: a clear
    ValueError naming the argument (chunk_size=0 was an IndexError, window=0 and
    patience=-1 were accepted)."""
    svgp = agp.SVGP(agp.kernels.RBF(1.0), agp.likelihoods.Logistic(), X[:5], q="natural_whitened")
    name = next(iter(setting))
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        agp.fit(svgp, X, (y > 0).astype(float), agp.inference.AnalyticSVI(10), max_iter=5,
                **setting)


def test_exact_inference_needs_gaussian_likelihood():
    clf = agp.GP(agp.kernels.RBF(1.0), agp.likelihoods.Logistic())
    with pytest.raises(ValueError, match="Exact inference needs a Gaussian likelihood"):
        clf.posterior(X, (y > 0).astype(int), agp.Exact())


@pytest.mark.parametrize("power", [0, 200, -300])
def test_standardizer_is_exact_at_any_scale(power):
    """The power-of-two scaled moments: numpy's own on ordinary data, and the same
    standardised values from 1e-300 to 1e200 (numpy's std overflows at 1e200)."""
    data = np.c_[X, np.full(20, 3.0)]
    ref = agp.datasets.Standardizer(data)
    np.testing.assert_array_equal(ref.mean, data.mean(0))
    np.testing.assert_array_equal(ref.scale[:2], data[:, :2].std(0))
    assert ref.scale[2] == 1.0  # a constant column is centred, not scaled
    scaled = agp.datasets.Standardizer(data * 10.0**power)
    np.testing.assert_allclose(scaled.transform(data * 10.0**power), ref.transform(data),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scaled.inverse(ref.transform(data)), data * 10.0**power,
                               rtol=1e-12)


@pytest.mark.parametrize("bad, match", [
    (np.array([[1.0], [np.nan]]), "data contains NaN"), (np.zeros((0, 2)), "at least one row"),
    (np.float64(1.0), r"1-D or 2-D array .* shape \(\)"),
    (np.array([1.0, 2.0 + 1j]), "data must be real-valued"),
    (np.array([-1e308, 1e308]), "data spans more than the float64 range"),
    (np.c_[np.ones(2), [-1e308, 1e308]], "data column 1 spans more than the float64 range")])
def test_standardizer_refuses_data_it_cannot_scale(bad, match):
    with pytest.raises(ValueError, match=match):
        agp.datasets.Standardizer(bad)
