"""The likelihood protocol and its conformance suite (augmentedgp.testing.check_likelihood).

Every built-in likelihood passes check_likelihood; a new built-in fails
test_every_builtin_likelihood_is_covered until it is added to BUILTIN. Deliberately broken
likelihoods (a wrong derivative, an unnormalised density, a wrong E[w], ...) make it raise,
each on the check that targets the defect. The protocol's methods keep one signature in
every override.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import declared

import augmentedgp as agp  # noqa: F401  (enables float64)
from augmentedgp import likelihoods as L
from augmentedgp.augmentation import Augmented
from augmentedgp.augmentation.protocol import ScaleMixture
from augmentedgp.core.params import fixed, positive
from augmentedgp.likelihoods import Likelihood
from augmentedgp.testing import check_likelihood

# Each built-in with sensible parameters, and the accuracy of its own approximations where
# it is coarser than check_likelihood's default 1e-6 (measured worst error in brackets).
QMC = dict(num_samples=2**12, predict_samples=2**14)  # quasi-Monte Carlo points
BUILTIN = {
    L.Gaussian: (L.Gaussian(variance=0.3), 1e-6),
    L.StudentT: (L.StudentT(df=3.5, scale=0.8), 1e-6),
    L.Laplace: (L.Laplace(scale=0.6), 1e-6),
    L.Matern32: (L.Matern32(scale=0.9), 1e-6),
    L.Logistic: (L.Logistic(), 1e-6),
    L.Probit: (L.Probit(), 1e-6),
    L.BayesianSVM: (L.BayesianSVM(), 1e-6),
    # the generic 100-node Gauss-Hermite predictive density: 5e-6 at y = 5, var = 2
    L.Poisson: (L.Poisson(binsize=1.3), {"predictive_log_prob": 2e-5}),
    L.LogisticPoisson: (L.LogisticPoisson(rate=3.0), 1e-6),
    L.NegativeBinomial: (L.NegativeBinomial(r=1.5), 1e-6),
    L.Gamma: (L.Gamma(shape=2.0), 1e-6),
    L.Beta: (L.Beta(precision=10.0), 1e-6),
    # E log sum_c sigmoid(f_c) by 2^12 points: 4.7e-6; class probabilities by 2^14: 2.4e-6
    L.LogisticSoftmax: (L.LogisticSoftmax(3, **QMC), {"variational_expectations": 1e-5,
                                                       "predictive_log_prob": 5e-6}),
    # E log sum_c exp f_c by 2^12 points: 5.3e-5; class probabilities by 2^14: 2.9e-5 (log)
    L.Softmax: (L.Softmax(3, **QMC), {"variational_expectations": 1e-4,
                                       "predictive_log_prob": 6e-5, "predict_y": 4e-6,
                                       "predict_proba": 4e-6}),
    L.RobustMax: (L.RobustMax(3), 1e-6),
    L.HeteroscedasticGaussian: (L.HeteroscedasticGaussian(precision=2.0), 1e-6),
    L.HeteroscedasticStudentT: (L.HeteroscedasticStudentT(df=3.5, precision=2.0), 1e-6),
    # declared by its pieces: the generalised Gaussian, shape 1.5 (mixing law by inversion)
    L.SuperGaussian: (declared("GeneralisedGaussian", scale=0.8, shape=fixed(positive(1.5))),
                      1e-6),
}


def _concrete_builtins():
    found = (getattr(L, name) for name in L.__all__)
    return {c for c in found if isinstance(c, type) and issubclass(c, Likelihood)
            and not inspect.isabstract(c)}


def test_every_builtin_likelihood_is_covered():
    assert _concrete_builtins() == set(BUILTIN)
    for cls, (lik, _) in BUILTIN.items():
        assert type(lik) is cls


@pytest.mark.parametrize("cls", list(BUILTIN), ids=lambda c: c.__name__)
def test_builtin_likelihood_passes_check_likelihood(cls):
    lik, tol = BUILTIN[cls]
    names = {c.name for c in check_likelihood(lik, tol=tol)}
    # the checks that ran: the distribution and expectations always, the augmentation's
    # when there is one, the derivatives for one latent function
    assert "variational_expectations = int log p(y | f) N(f | mean, var) df" in names
    assert ("log_prob is normalised over y" in names) == lik.normalised
    assert ("grad_log_prob = autodiff of log_prob" in names) == (lik.num_latent == 1)
    assert any(n.startswith("aux_sites") for n in names) == isinstance(lik, Augmented)
    assert ("omega_mean(y, t) = E[w] under the tilted mixing law" in names) == (
        isinstance(lik, ScaleMixture) and not isinstance(lik, L.Gaussian))


def test_check_likelihood_takes_targets_in_the_users_encoding():
    lik = L.RobustMax(["cat", "dog", "emu"])  # labels -> codes 0, 1, 2
    names = {c.name for c in check_likelihood(lik, y=["emu", "cat"],
                                              f=[[0.2, -1.0, 0.5], [1.5, 0.3, -0.4]],
                                              only=["distribution", "expectations"])}
    assert "predictive_log_prob = log int p(y | f) N(f | mean, var) df" in names
    check_likelihood(L.Logistic(), y=[0, 1, 1, 0], f=[2.2, -0.4])  # {0, 1} -> {-1, +1}


# --- the suite fails on broken likelihoods ------------------------------------------------


class WrongGradient(L.Probit):
    def grad_log_prob(self, y, f):
        return 1.01 * super().grad_log_prob(y, f)


class Unnormalised(L.Gamma):
    def log_prob(self, y, f):
        return super().log_prob(y, f) + 0.01


class WrongConditionalVariance(L.HeteroscedasticGaussian):
    def conditional_variance(self, f):
        return 1.0 / (self.precision.value * jax.nn.sigmoid(-f[..., 1]))


class WrongExpectation(L.Poisson):
    def variational_expectations(self, y, mean, var, n=None, key=None):
        return super().variational_expectations(y, mean, 1.01 * var, n, key)


class WrongPredictive(L.Gaussian):
    def predictive_log_prob(self, y, mean, var):
        return super().predictive_log_prob(y, mean, var + 1e-3)


class WrongPredictY(L.Beta):
    def predict_y(self, mean, var, n=None):
        m, v = super().predict_y(mean, var, n)
        return m, 1.001 * v


class WrongOmegaMean(L.StudentT):
    def omega_mean(self, y, t):
        return 1.001 * super().omega_mean(y, t)


class WrongPhi(L.BayesianSVM):
    def log_phi(self, y, t):
        return 1.001 * super().log_phi(y, t)


class WrongMixingDensity(L.Matern32):
    def log_mixing_density(self, y, w):
        return super().log_mixing_density(y, 1.01 * w) + jnp.log(1.01)  # still normalised


class WrongSampler(L.Laplace):
    def sample_omega(self, key, y, t):
        return super().sample_omega(key, y, 2.0 * t)


class NotCompletelyMonotone(L.Laplace):
    def log_phi(self, y, t):  # exp(-t^1.5): phi'' < 0 near 0, no mixing law
        return -jnp.power(t, 1.5)


class WrongSites(L.LogisticSoftmax):
    def aux_sites(self, y, q_aux):
        beta, gamma = super().aux_sites(y, q_aux)
        return beta, 1.01 * gamma


class WrongBound(L.LogisticPoisson):
    def augmented_expectations(self, y, mean, var, q_aux=None):
        return super().augmented_expectations(y, mean, var, q_aux) + 1e-3 * var


class WrongCounts(L.LogisticPoisson):
    def sample_aux(self, key, y, f):
        aux = super().sample_aux(key, y, f)
        return aux._replace(n=aux.n + (aux.n > 2))


# (broken likelihood, the group of checks that targets the defect, the check that fails);
# only that group runs, as each new class compiles its methods anew
BROKEN = [
    (WrongGradient(), "derivatives", "grad_log_prob = autodiff"),
    (Unnormalised(shape=2.0), "distribution", "log_prob is normalised"),
    (WrongConditionalVariance(precision=2.0), "distribution", "conditional_variance = Var"),
    (WrongExpectation(), "expectations", "variational_expectations = int"),
    (WrongPredictive(variance=0.3), "expectations", "predictive_log_prob = log int"),
    (WrongPredictY(precision=10.0), "predictions", "predict_y variance"),
    (WrongOmegaMean(df=3.5, scale=0.8), "mixture", "omega_mean\\(y, t\\) = E\\[w\\]"),
    (WrongPhi(), "augmentation", "augmented_expectations at var = 0 = log_prob"),
    (WrongMixingDensity(scale=0.9), "mixture",
     "int exp\\(log C \\+ g f - w h\\^2\\) p\\(w\\) dw"),
    (WrongSampler(scale=0.6), "mixture", "sample_aux draws follow the tilted mixing law"),
    (NotCompletelyMonotone(), "mixture", "log_phi is admissible"),
    (WrongSites(3), "augmentation", "aux_sites: -gamma / 2 = d bound / d var"),
    (WrongBound(rate=3.0), "augmentation", "aux_sites: -gamma / 2 = d bound / d var"),
    (WrongCounts(rate=3.0), "gibbs", "sites\\(beta\\) averaged over sample_aux"),
]


@pytest.mark.parametrize("lik, group, check", BROKEN,
                         ids=[type(case[0]).__name__ for case in BROKEN])
def test_check_likelihood_fails_on_a_broken_likelihood(lik, group, check):
    with pytest.raises(AssertionError, match=check):
        check_likelihood(lik, only=[group])


def test_a_full_run_lists_every_failed_check():
    with pytest.raises(AssertionError) as info:
        check_likelihood(WrongGradient())
    message = str(info.value)
    assert "check_likelihood(WrongGradient): 1 of " in message
    assert "- grad_log_prob = autodiff of log_prob: y = " in message


# --- the protocol ---------------------------------------------------------------------------


def test_a_likelihood_missing_a_required_method_cannot_be_created():
    class NoMoments(Likelihood):
        def log_prob(self, y, f):
            return -0.5 * (y - f) ** 2

    with pytest.raises(TypeError, match="conditional_mean"):
        NoMoments()

    class NoDensity(L.StudentT):
        pass

    class OnlyPieces(Likelihood, ScaleMixture):
        def log_prob(self, y, f):
            return -0.5 * (y - f) ** 2

        def conditional_mean(self, f):
            return f

        def conditional_variance(self, f):
            return jnp.ones_like(f)

        def super_gaussian(self, y):
            raise AssertionError

    NoDensity()  # inherits everything
    with pytest.raises(TypeError, match="log_phi"):  # the sampler and p(w) have defaults
        OnlyPieces()


PROTOCOL = {Likelihood: ["log_prob", "conditional_mean", "conditional_variance",
                         "grad_log_prob", "hess_log_prob", "check_targets", "targets",
                         "predictive_log_prob", "variational_expectations", "predict_y"],
            Augmented: ["aux_posterior", "aux_sites", "augmented_expectations", "sample_aux",
                        "sites"],
            ScaleMixture: ["super_gaussian", "log_phi", "log_mixing_density", "sample_omega",
                           "omega_mean"],
            L.Bernoulli: ["predict_proba"], L.Categorical: ["predict_proba"]}


@pytest.mark.parametrize("base", list(PROTOCOL), ids=lambda c: c.__name__)
def test_every_override_keeps_the_protocol_signature(base):
    classes = {c for c in (getattr(L, n) for n in L.__all__)
               if isinstance(c, type) and issubclass(c, base)}
    assert classes
    # names, kinds and defaults; the shape annotations may be narrower (a multi-latent
    # likelihood's f is (n, C))
    form = lambda f: [(p.name, p.kind, p.default)
                      for p in inspect.signature(f).parameters.values()]
    for name in PROTOCOL[base]:
        want = form(getattr(base, name))
        for cls in classes:
            got = form(getattr(cls, name))
            assert got == want, f"{cls.__name__}.{name}{got} != {base.__name__}.{name}{want}"


def test_num_latent_is_part_of_the_protocol():
    assert L.Logistic().num_latent == 1 and L.Softmax(4).num_latent == 4
    assert L.HeteroscedasticGaussian().num_latent == 2
    np.testing.assert_allclose(L.Softmax(3).conditional_mean(jnp.zeros((2, 3))), 1.0 / 3.0)
