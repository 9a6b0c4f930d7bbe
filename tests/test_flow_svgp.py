"""Gaussian flows on SVGP models: ``fit(SVGP(...), X, y, ParticleFlow | GaussianFlow)``, the
particles in the whitened inducing space and the likelihood term averaged over p(f | v)
(``flow_gp.GPTarget``), against oracles that share no code with the flows:

- Gaussian likelihood (40 points, M = 8 fixed inducing inputs): the target is Gaussian, so
  GPF with N = M + 1 particles converges to the optimal q(u) (Theorem 1 of
  [Galy-Fajou2021]): its predictions and ELBO are those of the collapsed SGPR (Titsias'
  bound, closed form), and so is its particle free energy; with a trainable kernel the
  flow + Adam reaches SGPR's L-BFGS maximiser of that bound.
- Logistic classification (same inputs): the optimum of the SVGP ELBO from
  ``QuadratureVI`` (the optimum ``QuadratureSVI`` targets, reached on the full batch):
  full-batch Gaussian flow (GF) and GPF with many particles match it; GPF on minibatches
  of 10 comes within the noise of its constant step. The minibatch potentials average to
  the full-batch ones over a partition of the data.
- Multi-class softmax with per-latent kernels: one particle block per latent, normalised
  probabilities that classify a separable toy.

Tolerances are 2-5 times the measured discrepancies (quoted at each check; seeded runs).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import augmentedgp as agp
from augmentedgp.core.params import fixed, positive, real
from augmentedgp.inference.flow_gp import GPTarget

LIK = agp.likelihoods
KEY = jax.random.key(1)
N = 40
RNG = np.random.default_rng(0)
X = np.sort(RNG.uniform(-3.0, 3.0, N))[:, None]
F = np.sin(1.2 * X[:, 0])
Z = np.linspace(-3.0, 3.0, 8)[:, None]
NOISE = 0.5
Y_REG = F + np.sqrt(NOISE) * RNG.standard_normal(N)
Y_CLS = np.where(RNG.uniform(size=N) < 1.0 / (1.0 + np.exp(-3.0 * F)), 1.0, -1.0)
XS = np.linspace(-4.0, 4.0, 9)[:, None]  # inside and beyond the data


def fp(value):
    return fixed(positive(value))


def kern(trainable=False):
    return agp.kernels.RBF(1.0, 2.0) if trainable else agp.kernels.RBF(fp(1.0), fp(2.0))


def flow_fit(model, y, method, max_iter, **kw):
    """A flow fit in one compiled chunk."""
    return agp.fit(model, X, y, method, max_iter=max_iter, key=KEY, chunk_size=max_iter, **kw)


def compare(post, ref):
    """(ELBO(ref) - ELBO(post), max |mean difference|, max |sd ratio - 1|) of f(XS)."""
    (m, v), (mr, vr) = post.predict_f(XS), ref.predict_f(XS)
    return (ref.elbo() - post.elbo(), float(np.max(np.abs(m - mr))),
            float(np.max(np.abs(np.sqrt(v / vr) - 1.0))))


# --- Gaussian likelihood: exact ----------------------------------------------------------------


def test_particle_flow_on_gaussian_svgp_is_titsias_optimum():
    """Measured: ELBO, predictions and the particle free energy equal SGPR's to 1e-14."""
    gauss = LIK.Gaussian(fp(NOISE))
    post = flow_fit(agp.SVGP(kern(), gauss, fixed(real(Z))), Y_REG,
                    agp.ParticleFlow(learning_rate=0.01), 3000)
    assert post.model.q.factor.value.shape == (8, 9)  # the default M + 1 particles
    sgpr = agp.SGPR(kern(), fixed(real(Z)), likelihood=gauss)
    np.testing.assert_allclose(post.elbo(), sgpr.elbo(X, Y_REG), rtol=1e-10)
    np.testing.assert_allclose(post.history.objective[-1], -sgpr.elbo(X, Y_REG), rtol=1e-10)
    for a, b in zip(post.predict_f(XS), sgpr.to_svgp(X, Y_REG).predict_f(XS), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_particle_flow_learns_the_sgpr_hyperparameters():
    """Trainable RBF, fixed Z: GPF is exact at every kernel, so Adam on the free energy
    climbs Titsias' bound; measured: lengthscale and variance within 2e-5 (relative) of
    SGPR's L-BFGS fit, free energy within 3e-10 of minus its bound."""
    gauss = LIK.Gaussian(fp(NOISE))
    sgpr = agp.fit(agp.SGPR(kern(True), fixed(real(Z)), likelihood=gauss), X, Y_REG)
    post = flow_fit(agp.SVGP(kern(True), gauss, fixed(real(Z))), Y_REG,
                    agp.ParticleFlow(learning_rate=0.01), 3000, learning_rate=0.02)
    for name in ("lengthscale", "variance"):
        np.testing.assert_allclose(getattr(post.model.kernel, name).value,
                                   getattr(sgpr.model.kernel, name).value, rtol=2e-4)
    np.testing.assert_allclose(post.history.objective[-1], -sgpr.elbo(), rtol=1e-8)
    assert abs(float(post.model.kernel.lengthscale.value) - 1.0) > 0.02  # it moved


# --- classification: the optimum of the ELBO ---------------------------------------------------


@pytest.fixture(scope="module")
def optimum():
    """QuadratureVI on the full batch (its bound is constant to 1e-14 after 100 steps)."""
    ref = agp.fit(agp.SVGP(kern(), LIK.Logistic(), fixed(real(Z)), q="cholesky"), X, Y_CLS,
                  agp.QuadratureVI(), max_iter=100, chunk_size=100)
    assert np.ptp(ref.history.objective[-10:]) < 1e-10
    return ref


def logistic_svgp():
    return agp.SVGP(kern(), LIK.Logistic(), fixed(real(Z)))


@pytest.mark.parametrize("method, measured", [
    (agp.GaussianFlow(n_samples=100, learning_rate=0.003), (0.0009, 0.0072, 0.012)),
    (agp.ParticleFlow(n_particles=160, learning_rate=0.1), (0.0029, 0.0079, 0.043)),
], ids=["GaussianFlow", "ParticleFlow"])
def test_full_batch_flows_match_the_elbo_optimum(optimum, method, measured):
    """GF is unbiased; GPF with N = 20 M particles has a small particle bias. Both q's
    are bounds (gap >= 0). ``measured``: ELBO gap, |dm|, sd ratio."""
    gap, dm, dsd = compare(flow_fit(logistic_svgp(), Y_CLS, method, 3000), optimum)
    assert -1e-9 <= gap < 4 * measured[0], gap
    assert dm < 4 * measured[1] and dsd < 3 * measured[2], (dm, dsd)


def test_minibatch_particle_flow_reaches_the_optimum_within_its_noise(optimum):
    """Batches of 10 of the 40 points, scaled by 4: with its constant step the flow ends
    within the minibatch noise of the optimum (measured: gap 0.023, |dm| 0.11, sd 3.0%;
    QuadratureSVI(10) with its default constant natural step: 0.0011, 0.027, 0.4%)."""
    method = agp.ParticleFlow(n_particles=160, learning_rate=0.005, batch_size=10)
    gap, dm, dsd = compare(flow_fit(logistic_svgp(), Y_CLS, method, 4000), optimum)
    assert -1e-9 <= gap < 0.07, gap
    assert dm < 0.3 and dsd < 0.09, (dm, dsd)


def test_minibatch_potentials_average_to_the_full_batch():
    """Over a partition of the rows into 4 batches of 10 (scale 4), the minibatch
    potentials and their gradients average to the full-batch ones (to rounding)."""
    model = logistic_svgp()
    target = GPTarget(data=(jnp.arange(N), jnp.asarray(Y_CLS)), X=jnp.asarray(X),
                      model=model)
    V = jax.random.normal(KEY, (5, 8))

    @jax.jit
    def potentials(V, rows, scale):
        return target.potentials(V, (rows, jnp.asarray(Y_CLS)[rows]), scale)

    full = potentials(V, jnp.arange(N), 1.0)
    parts = jnp.arange(N).reshape(4, 10)
    mean = sum(potentials(V, rows, 4.0) for rows in parts) / 4
    np.testing.assert_allclose(mean, full, rtol=1e-12)
    g = jax.jit(jax.grad(lambda V, rows, s: jnp.sum(potentials(V, rows, s))))
    np.testing.assert_allclose(sum(g(V, rows, 4.0) for rows in parts) / 4,
                               g(V, jnp.arange(N), 1.0), rtol=1e-10, atol=1e-12)
    assert float(jnp.std(full)) > 1.0  # the particles differ


def test_inputs_on_inducing_points_give_finite_gradients():
    """At an inducing input the residual variance k_ii - a_i^T a_i is clamped at 0: its
    Gauss-Hermite nodes then pass a zero gradient (not 0 * inf = NaN) to the kernel
    (a flow with a trainable RBF on such data went non-finite after 605 steps)."""
    model = agp.SVGP(kern(True), LIK.Logistic(), fixed(real(Z)))
    Xz = np.concatenate([Z, X[:8]])  # 8 rows exactly on inducing inputs
    target = GPTarget(data=(jnp.arange(16), jnp.asarray(Y_CLS[:16])), X=jnp.asarray(Xz),
                      model=model)
    V = jax.random.normal(KEY, (3, 8))
    grad = jax.grad(lambda m: jnp.sum(eqx.tree_at(lambda t: t.model, target, m).potentials(
        V, target.data, 1.0)))(model)
    leaves = [np.asarray(g) for g in jax.tree_util.tree_leaves(grad.kernel)]
    assert all(np.all(np.isfinite(g)) for g in leaves) and any(np.any(g != 0) for g in leaves)
    assert float(jax.grad(lambda v: LIK.Logistic().variational_expectations(
        jnp.ones(()), jnp.zeros(()), v))(0.0)) == 0.0


# --- several latent functions --------------------------------------------------------------


def test_particle_flow_multiclass_svgp_blocks_and_predictions():
    """Softmax, 3 classes on a line (separable), a kernel per latent, 6 shared inducing
    inputs: one particle block per latent, so q keeps each latent's own (M, N) block of the
    factor, of full rank M; probabilities are normalised and classify test points away from
    the class boundaries (measured: all right)."""
    Xm = np.linspace(-3.0, 3.0, 30)[:, None]
    ym = np.digitize(Xm[:, 0], [-1.0, 1.0])
    kernels = [agp.kernels.RBF(fp(1.0), fp(4.0)), agp.kernels.RBF(fp(0.8), fp(4.0)),
               agp.kernels.RBF(fp(1.2), fp(4.0))]
    Zm = np.linspace(-3.0, 3.0, 6)[:, None]
    post = agp.fit(agp.SVGP(kernels, LIK.Softmax(3), fixed(real(Zm))), Xm, ym,
                   agp.ParticleFlow(learning_rate=0.05), max_iter=1000, key=KEY,
                   chunk_size=1000)
    q = post.model.q
    M, C = 6, 3
    assert q.mean.value.shape == (C, M)
    W = np.asarray(q.factor.value)
    assert W.shape == (C, M, M * C + 1)
    for c in range(C):
        assert np.linalg.matrix_rank(W[c], tol=1e-8) == M
    Xs = np.linspace(-3.0, 3.0, 49)[:, None]
    Xs = Xs[np.min(np.abs(Xs - np.array([-1.0, 1.0])), axis=1) > 0.3]
    P = np.asarray(post.predict_proba(Xs))
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-10)
    assert (P.argmax(1) == np.digitize(Xs[:, 0], [-1.0, 1.0])).mean() == 1.0
