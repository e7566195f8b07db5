"""The Laplace approximation on conjugate Bayesian linear regression, where it is exact.

For y = X w + e, e ~ N(0, s_n^2), w ~ N(0, s_p^2 I) the log joint is quadratic in w: its mode is
the posterior mean m = L^-1 X^T y / s_n^2, its Hessian the posterior precision
L = X^T X / s_n^2 + I / s_p^2, and the Laplace marginal likelihood equals the evidence
log N(y; 0, s_n^2 I + s_p^2 X X^T) exactly. For a single linear layer with one output the
Kronecker factors of the GGN are exact as well (the output factor is the constant 1 / s_n^2).
"""

import math

import pytest
import torch
from pyro.infer import Predictive
from torch import nn

import pyrobnn
from pyrobnn.infer.modes.laplace import TwoClassLogits, laplace, tune_prior_in_function_space, tune_prior_precisions
from pyrobnn.utils.runtime import tensor_defaults
from test_conjugate import NOISE, PRIOR, bayesian_linear_model, conjugate_problem


def evidence(X, y):
    cov = NOISE**2 * torch.eye(X.shape[0], dtype=X.dtype) + PRIOR**2 * X @ X.T
    return torch.distributions.MultivariateNormal(torch.zeros_like(y), cov).log_prob(y).item()


@pytest.mark.parametrize("hessian", ["full", "kron"])
def test_laplace_is_exact_on_the_conjugate_model(hessian):
    X, y, mean, precision = conjugate_problem()
    model = bayesian_linear_model()
    result = laplace(model, X, y.unsqueeze(-1), hessian=hessian, tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)},
                     num_samples=20000, seed=1)
    la = result.approximation
    exact_cov = torch.linalg.inv(precision)
    cov = la.posterior_covariance if hessian == "full" else torch.linalg.inv(la.posterior_precision.to_matrix())
    assert torch.allclose(cov, exact_cov, rtol=1e-10, atol=1e-14)  # exact up to rounding in the curvature sums
    assert result.log_marginal_likelihood == pytest.approx(evidence(X, y), abs=1e-6)
    # the draws land on the model's site with the posterior's moments (Monte Carlo error:
    # standard error sd / sqrt(S) of the mean, sqrt(2 / S) relative for a variance)
    w = result.samples["weight"].reshape(-1, 3)
    sd = exact_cov.diagonal().sqrt()
    assert ((w.mean(0) - mean).abs() < 5 * sd / math.sqrt(w.shape[0])).all()
    assert ((w.var(0) / sd**2 - 1).abs() < 5 * math.sqrt(2 / w.shape[0])).all()


def test_laplace_draws_in_function_space_with_fewer_points_than_weights():
    """Two points, three weights: the full GGN's draws come from Matheron's rule in function space
    (no P x P factor) and have the exact posterior's mean and covariance within Monte Carlo error
    (an entry of a sample covariance has standard error sqrt((S_ii S_jj + S_ij^2) / S))."""
    X, y, mean, precision = conjugate_problem(n=2)
    s = 40000
    result = laplace(bayesian_linear_model(), X, y.unsqueeze(-1), hessian="full", tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)},
                     num_samples=s, seed=2)
    exact = torch.linalg.inv(precision)
    w = result.samples["weight"].reshape(-1, 3)
    sd = exact.diagonal().sqrt()
    assert ((w.mean(0) - mean).abs() < 5 * sd / math.sqrt(s)).all()
    se = ((exact.diagonal()[:, None] * exact.diagonal()[None, :] + exact**2) / s).sqrt()
    assert ((torch.cov(w.T) - exact).abs() < 5 * se).all()
    assert result.log_marginal_likelihood == pytest.approx(evidence(X, y), abs=1e-9)


def test_laplace_trains_the_map_of_the_log_joint():
    """Without a given MAP, the mode of the model's log joint (prior included) is found; the
    optimizer's tolerance, not Monte Carlo error, bounds the difference."""
    X, y, mean, _ = conjugate_problem()
    model = bayesian_linear_model()
    result = laplace(model, X, y.unsqueeze(-1), hessian="full", tune_prior=False,
                     map_options={"lr": 0.05, "batch_size": None, "max_epochs": 2000})
    assert torch.allclose(result.map_values["weight"].reshape(-1), mean, atol=2e-4)


def test_tuning_the_prior_precision_raises_the_marginal_likelihood():
    X, y, mean, _ = conjugate_problem()
    fixed = laplace(bayesian_linear_model(), X, y.unsqueeze(-1), hessian="full", tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)})
    tuned = laplace(bayesian_linear_model(), X, y.unsqueeze(-1), hessian="full", tune_prior=True, map_estimate={"weight": mean.reshape(1, 3)})
    assert tuned.log_marginal_likelihood > fixed.log_marginal_likelihood + 1e-3
    assert not torch.allclose(tuned.prior_precision, fixed.prior_precision)


@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_prior_tuning_in_function_space_is_laplace_torchs(subset):
    """With fewer training values than weights, a full GGN's prior precisions are tuned with an
    N x N log determinant (FunctionSpaceLaplace): the same objective and Adam steps as
    laplace-torch's weight-space ``optimize_prior_precision``, so the same precisions up to
    rounding; one per site, or one for the last layer."""
    torch.manual_seed(0)
    x = torch.randn(12, 2, dtype=torch.float64)
    y = torch.sin(2 * x[:, :1]) + 0.05 * torch.randn(12, 1, dtype=torch.float64)
    net = pyrobnn.MLP(2, 1, hidden=(10,)).double()  # 41 weights > 12 values; the last layer's 11 > 8 values below
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.05), pyrobnn.NormalPrior(1.0, fan_in=subset == "all"))
    x_fit = x if subset == "all" else x[:8]
    result = laplace(model, x_fit, y[: x_fit.shape[0]], subset=subset, hessian="full", tune_prior=True, tune_steps=60, num_samples=4,
                     map_options={"max_epochs": 200, "lr": 1e-2, "batch_size": None})
    la = result.approximation
    ours = result.prior_precision
    start = torch.tensor([1.0 / model.site_prior(s).site_scale(s) ** 2 for s in model.sites], dtype=torch.float64)
    start = start if subset == "all" else start[-1:]
    la.optimize_prior_precision(method="marglik", pred_type="glm", init_prior_prec=start, prior_structure="layerwise" if subset == "all" else "scalar",
                                n_steps=60)
    assert ours.shape == start.shape and not torch.allclose(ours, start, rtol=1e-3)  # tuning moved them
    torch.testing.assert_close(ours, la.prior_precision, rtol=1e-8, atol=0)


def test_last_layer_laplace_keeps_the_other_sites_at_the_map_and_feeds_predictive():
    torch.manual_seed(0)
    x = torch.randn(40, 2)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(40, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    result = laplace(model, x, y, subset="last_layer", hessian="kron", num_samples=50, map_options={"max_epochs": 50})
    first = [s.name for s in model.sites][0]
    last = [s.name for s in model.sites][-1]
    assert (result.samples[first] == result.map_values[first]).all()
    assert result.samples[last].std(1).min() > 0
    prediction = pyrobnn.predict(model, result, x[:5])
    assert prediction.mean.shape == (5, 1) and prediction.epistemic_std.min() > 0
    out = Predictive(model, posterior_samples=result.flat_samples(), return_sites=["_RETURN"])(x[:5])["_RETURN"]
    assert out.shape == (50, 5, 1)
    glm = result.linearized_predict(x[:5])
    assert glm.loc_samples.shape == (50, 5, 1)


def _per_site_last_layer_problem(n):
    """A ``2-6-1`` tanh network whose last layer's weight and bias have different prior
    precisions (``fan_in``: 6 for the weights, 1 for the bias), and ``n`` noisy points."""
    torch.manual_seed(0)
    x = torch.randn(n, 2, dtype=torch.float64)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, dtype=torch.float64)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0, fan_in=True)), x, y


def test_last_layer_sites_keep_their_own_prior_precisions():
    """With ``subset="last_layer"`` and a full GGN, the last layer's weight and bias keep one
    precision each: the posterior over that layer is then Bayesian linear regression on the
    MAP's features phi = [tanh(W1 x + b1), 1], exactly (Phi^T Phi / s^2 + diag(prec))^-1."""
    model, x, y = _per_site_last_layer_problem(30)
    result = laplace(model, x, y, subset="last_layer", hessian="full", tune_prior=False, num_samples=4, map_options={"max_epochs": 100})
    torch.testing.assert_close(result.prior_precision, torch.tensor([6.0, 1.0], dtype=torch.float64))
    with torch.no_grad():
        phi = torch.cat([result.map_net[:2](x), torch.ones(30, 1, dtype=torch.float64)], -1)
    noise = float(model.likelihood.scale())  # 0.1 as the likelihood holds it (float32)
    exact = torch.linalg.inv(phi.T @ phi / noise**2 + torch.diag(torch.tensor([6.0] * 6 + [1.0], dtype=torch.float64)))
    torch.testing.assert_close(result.approximation.posterior_covariance, exact, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="hessian='kron' needs one prior precision for the last layer's sites, got"):
        laplace(model, x, y, subset="last_layer", hessian="kron", map_options={"max_epochs": 2})


@pytest.mark.parametrize("n", [5, 30])  # fewer training values than the layer's 7 weights, and more
def test_last_layer_per_site_tuning_in_either_space_is_one_objective(n):
    """The last layer's per-site precisions are tuned by the Laplace evidence with the log
    determinant in function space (N x N, J the features) or in weight space (P x P, the GGN):
    Sylvester's identity makes them one objective, so the same Adam steps give the same
    precisions up to rounding, and the tuned evidence is above the untuned one."""
    model, x, y = _per_site_last_layer_problem(n)
    fixed = laplace(model, x, y, subset="last_layer", hessian="full", tune_prior=False, num_samples=4, map_options={"max_epochs": 100})
    la = fixed.approximation
    with torch.no_grad():
        J = torch.cat([fixed.map_net[:2](x), torch.ones(n, 1, dtype=torch.float64)], -1)
    start = torch.tensor([6.0, 1.0], dtype=torch.float64)
    in_functions = tune_prior_in_function_space(la, J, [6, 1], start, 40)
    in_weights = tune_prior_precisions(la, [6, 1], start, 40)
    torch.testing.assert_close(in_functions, in_weights, rtol=1e-7, atol=0)
    tuned = laplace(model, x, y, subset="last_layer", hessian="full", tune_steps=40, num_samples=4, map_estimate=dict(fixed.map_values))
    torch.testing.assert_close(tuned.prior_precision, in_weights, rtol=1e-7, atol=0)
    assert tuned.log_marginal_likelihood > fixed.log_marginal_likelihood + 1e-3


@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_linearized_predictive_matches_laplace_torch_glm_moments(subset):
    """Our JVP-based GLM draws against laplace-torch's closed-form GLM mean and variance
    f(x, w_map), J Sigma J^T: Monte Carlo error of S draws (sd / sqrt(S), sqrt(2 / S) relative)."""
    torch.manual_seed(0)
    x = torch.randn(40, 2, dtype=torch.float64)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(40, 1, dtype=torch.float64)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(8,)).double(), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    s = 4000
    result = laplace(model, x, y, subset=subset, hessian="full", num_samples=s, map_options={"max_epochs": 100}, seed=3)
    glm = result.linearized_predict(x[:6])
    f_mu, f_var = result.approximation(x[:6], pred_type="glm")
    sd = f_var.reshape(6).sqrt()
    ours = glm.loc_samples.reshape(s, 6)
    assert ((ours.mean(0) - f_mu.reshape(6)).abs() < 5 * sd / math.sqrt(s)).all()
    assert ((ours.var(0) / sd**2 - 1).abs() < 5 * math.sqrt(2 / s)).all()


def test_laplace_refuses_what_it_cannot_represent():
    X, y, _, _ = conjugate_problem()
    mixture = pyrobnn.BayesianModel(nn.Linear(3, 1, bias=False).double(), pyrobnn.GaussianLikelihood(scale=NOISE), pyrobnn.ScaleMixturePrior())
    with pytest.raises(ValueError, match="laplace needs NormalPrior on every random site; site 'weight' has a ScaleMixturePrior"):
        laplace(mixture, X, y.unsqueeze(-1))
    with pytest.raises(ValueError, match="hessian must be one of"):
        laplace(bayesian_linear_model(), X, y.unsqueeze(-1), hessian="lowrank")
    with pytest.raises(ValueError, match="subset must be one of"):
        laplace(bayesian_linear_model(), X, y.unsqueeze(-1), subset="first_layer")


def test_a_noise_scale_with_a_prior_is_held_at_its_map():
    X, y, mean, _ = conjugate_problem()
    model = pyrobnn.BayesianModel(nn.Linear(3, 1, bias=False).double(),
                                  pyrobnn.GaussianLikelihood(scale=torch.distributions.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)),
                                  pyrobnn.NormalPrior(PRIOR))
    result = laplace(model, X, y.unsqueeze(-1), hessian="full", tune_prior=False, num_samples=10,
                     map_estimate={"weight": mean.reshape(1, 3), "noise_scale": torch.tensor(NOISE, dtype=torch.float64)})
    assert (result.samples["noise_scale"] == NOISE).all()
    assert float(result.approximation.sigma_noise) == pytest.approx(NOISE)
    # with the noise at the truth the curvature is the conjugate one
    _, _, _, precision = conjugate_problem()
    assert torch.allclose(result.approximation.posterior_precision, precision, rtol=1e-6)
    assert pyrobnn.predict(model, result, X[:3]).aleatoric_std.eq(NOISE).all()


def test_targets_of_shape_n_give_the_posterior_of_targets_n_by_1():
    X, y, mean, precision = conjugate_problem()
    options = dict(hessian="full", tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)}, num_samples=50, seed=1)
    flat = laplace(bayesian_linear_model(), X, y, **options)
    column = laplace(bayesian_linear_model(), X, y.unsqueeze(-1), **options)
    assert torch.equal(flat.samples["weight"], column.samples["weight"])
    assert flat.log_marginal_likelihood == pytest.approx(evidence(X, y), abs=1e-6)
    assert torch.allclose(flat.approximation.posterior_precision, precision, rtol=1e-6)


def test_a_bernoulli_network_is_the_two_class_network_with_logits_zero_and_f():
    """Laplace on a Bernoulli likelihood over f equals laplace-torch's categorical Laplace over
    the logits (0, f): the same curvature, marginal likelihood and draws."""
    torch.manual_seed(0)
    x = torch.randn(80, 2, dtype=torch.float64)
    labels = (x[:, 0] + 0.5 * torch.randn(80, dtype=torch.float64) > 0).long()
    net = nn.Linear(2, 1).double()
    bernoulli = pyrobnn.BayesianModel(net, pyrobnn.BernoulliLikelihood(), pyrobnn.NormalPrior(1.0))
    values = {"weight": torch.tensor([[1.5, -0.3]], dtype=torch.float64), "bias": torch.tensor([0.2], dtype=torch.float64)}
    ours = laplace(bernoulli, x, labels.double(), hessian="full", map_estimate=values, tune_prior=False, num_samples=5, seed=3)

    from laplace import Laplace

    two = TwoClassLogits(bernoulli.deterministic_net(values)).eval()
    ref = Laplace(two, "classification", subset_of_weights="all", hessian_structure="full", prior_precision=torch.ones(2, dtype=torch.float64))
    with tensor_defaults(torch.float64, "cpu"):  # laplace-torch forms a full GGN in the default dtype
        ref.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, labels), batch_size=80))
    # the GGN of the Bernoulli log-likelihood by hand: sum_n s_n (1 - s_n) phi_n phi_n^T, phi = (x, 1)
    phi = torch.cat([x, torch.ones(80, 1, dtype=torch.float64)], 1)
    s = torch.sigmoid(phi @ torch.tensor([1.5, -0.3, 0.2], dtype=torch.float64))
    ggn = (phi * (s * (1 - s)).unsqueeze(-1)).T @ phi + torch.eye(3, dtype=torch.float64)
    assert torch.allclose(ours.approximation.posterior_precision, ggn, rtol=1e-12, atol=0)
    assert torch.allclose(ours.approximation.posterior_precision, ref.posterior_precision, rtol=1e-12, atol=0)
    pred = ours.predict(x[:4])
    assert pred.probs.shape == (4, 1, 2) and torch.allclose(pred.probs.sum(-1), torch.ones(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="Bernoulli likelihood with one output"):
        two_outputs = pyrobnn.BayesianModel(nn.Linear(2, 2).double(), pyrobnn.BernoulliLikelihood(), pyrobnn.NormalPrior(1.0))
        laplace(two_outputs, x, torch.stack([labels, labels], -1).double())


def test_batch_normalization_uses_its_running_statistics_and_dropout_is_off():
    from pyrobnn.testing import build_case

    model, x, y, x_test, _ = build_case("batchnorm")
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    for subset in ("all", "last_layer"):
        result = laplace(model, x, y, subset=subset, num_samples=4, map_options={"max_epochs": 2, "progress": False})
        pred = result.predict(x_test)
        assert torch.isfinite(pred.probs).all()
    # the network's own statistics are the ones used, and left as they were
    after = model.net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "running" in k or "num_batches" in k)


def test_given_prior_precisions_are_used_and_checked():
    """``prior_precision`` replaces the model's: without tuning the approximation keeps it, and the
    posterior covariance is the conjugate one at that precision (exact for this model)."""
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    precision = 4.0
    lam = X.T @ X / NOISE**2 + precision * torch.eye(3, dtype=X.dtype)
    m = torch.linalg.solve(lam, X.T @ y / NOISE**2)
    result = laplace(model, X, y.unsqueeze(-1), hessian="full", tune_prior=False, prior_precision=[precision],
                     map_estimate={"weight": m.reshape(1, 3)}, num_samples=10)
    torch.testing.assert_close(result.prior_precision.reshape(-1), torch.tensor([precision], dtype=X.dtype))
    torch.testing.assert_close(result.approximation.posterior_covariance, torch.linalg.inv(lam), rtol=1e-6, atol=1e-12)
    tuned = laplace(model, X, y.unsqueeze(-1), hessian="full", tune_steps=5, prior_precision=[precision],
                    map_estimate={"weight": m.reshape(1, 3)}, num_samples=10)
    assert tuned.settings["tune_steps"] == 5
    with pytest.raises(ValueError, match="prior_precision must hold 1 positive"):
        laplace(model, X, y.unsqueeze(-1), prior_precision=[1.0, 2.0], map_estimate={"weight": m.reshape(1, 3)})
    with pytest.raises(ValueError, match="tune_steps"):
        laplace(model, X, y.unsqueeze(-1), tune_steps=0, map_estimate={"weight": m.reshape(1, 3)})


def test_a_float64_models_full_curvature_is_formed_in_float64():
    """laplace-torch forms the full GGN by multiplying its curvature operator with torch.eye in the
    default dtype: a float64 model's Hessian was float32-accurate (relative errors of 1e-7,
    indefinite precisions at a small noise scale). Under a float32 default the posterior
    precision of the conjugate model is X^T X / s_n^2 + I / s_p^2 to float64 rounding."""
    X, y, mean, precision = conjugate_problem()
    model = bayesian_linear_model()
    assert torch.get_default_dtype() == torch.float32 and model.dtype == torch.float64
    result = laplace(model, X, y.unsqueeze(-1), hessian="full", tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)},
                     num_samples=2, seed=1)
    torch.testing.assert_close(result.approximation.posterior_precision, precision, rtol=1e-12, atol=0)


def test_a_full_laplace_allocates_its_hessian_once(monkeypatch):
    """laplace-torch's full Laplace makes its zero P x P Hessian at construction and again at
    ``fit`` (``override=True``); a fresh one is fitted without the second (a P x P fill less),
    to the same exact posterior precision."""
    from laplace.baselaplace import FullLaplace

    made = []
    original = FullLaplace._init_H
    monkeypatch.setattr(FullLaplace, "_init_H", lambda self: (made.append(self.n_params), original(self))[1])
    X, y, mean, precision = conjugate_problem()
    result = laplace(bayesian_linear_model(), X, y.unsqueeze(-1), hessian="full", tune_prior=False, map_estimate={"weight": mean.reshape(1, 3)},
                     num_samples=2, seed=1)
    assert made == [3]
    torch.testing.assert_close(result.approximation.posterior_precision, precision, rtol=1e-12, atol=0)


@pytest.mark.parametrize("case", ["targets_1d", "targets_2d", "several_outputs", "float64", "noise_prior", "dropout", "custom_forward", "numpy",
                                  "cnn_regression"])
def test_function_space_path_on_the_conformance_cases(case):
    """Every Gaussian conformance case (and a user's CNN with batch normalization regressing one
    value per image), cut to fewer training values than weights so that the full GGN takes the
    function-space path: its tuned prior precisions equal laplace-torch's weight-space tuning of
    the same approximation, and its draws have the weight-space posterior's variances within
    Monte Carlo error (sqrt(2 / S) relative)."""
    from pyrobnn.testing import ConvNet, build_case

    if case == "cnn_regression":
        torch.manual_seed(0)
        x = torch.randn(12, 1, 8, 8)
        y = x[:, 0, :4].mean((1, 2)) - x[:, 0, 4:].mean((1, 2))
        model = pyrobnn.BayesianModel(ConvNet(batchnorm=True, classes=1), pyrobnn.GaussianLikelihood(0.1), pyrobnn.NormalPrior(1.0))
    else:
        model, x, y, _, _ = build_case(case, "laplace")
        x, y = x[:8], y[:8]  # 8 points (24 values with 3 outputs) against 33 weights and more
    s = 4000
    result = laplace(model, x, y, hessian="full", tune_prior=True, tune_steps=30, num_samples=s, seed=0,
                     map_options={"max_epochs": 30, "batch_size": None, "progress": False})
    la = result.approximation
    n_values = len(y) * (y.shape[-1] if getattr(y, "ndim", 1) == 2 else 1)
    assert n_values < la.n_params  # the function-space path
    ours = result.prior_precision
    start = torch.tensor([1.0 / model.site_prior(site).site_scale(site) ** 2 for site in model.sites], dtype=ours.dtype)
    la.optimize_prior_precision(method="marglik", pred_type="glm", init_prior_prec=start, prior_structure="layerwise", n_steps=30)
    # float32 cases round their N x N and P x P log determinants differently
    tolerance = 1e-9 if model.dtype == torch.float64 else 2e-4
    torch.testing.assert_close(ours, la.prior_precision, rtol=tolerance, atol=0)
    draws = torch.cat([result.samples[name].reshape(s, -1) for name in result.covered_names], -1).double()
    variances = la.posterior_covariance.diagonal().double()
    assert bool(((draws.var(0) / variances - 1).abs() < 5 * math.sqrt(2 / s)).all())
