"""NUTS: the exact conjugate posterior, and the fast path against pyro.infer.MCMC."""

import math

import arviz as az
import numpy as np
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from pyro.infer.mcmc.util import initialize_model

import pyrobnn
from pyrobnn.infer.mcmc.samplers import nuts, pyro_nuts
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.results.posterior import Posterior
from test_conjugate import bayesian_linear_model, conjugate_problem


def ess(samples):
    """Bulk ESS per coordinate of (chains, draws, ...) samples."""
    a = samples.detach().double().reshape(samples.shape[0], samples.shape[1], -1).numpy()
    return np.array([az.ess(a[..., i]) for i in range(a.shape[-1])])


def check_exact_posterior(samples, mean, cov):
    """Mean and covariance within 5 Monte Carlo standard errors, from the effective sample size."""
    w = samples.reshape(-1, samples.shape[-1]).double()
    n_eff = torch.tensor(ess(samples), dtype=torch.float64)
    sd = cov.diag().sqrt()
    assert torch.all((w.mean(0) - mean).abs() < 5 * sd / n_eff.sqrt()), ((w.mean(0) - mean) / (sd / n_eff.sqrt()))
    sample_cov = torch.cov(w.T)
    # SE of a covariance entry: sqrt((s_ii s_jj + s_ij^2) / n_eff) for Gaussian draws
    se = ((cov.diag().unsqueeze(0) * cov.diag().unsqueeze(1) + cov**2) / n_eff.min()).sqrt()
    assert torch.all((sample_cov - cov).abs() < 5 * se), ((sample_cov - cov) / se)


# the eager path (20-30 s) and the compiled one (12-28 s, most of it compiling) are the slow ones:
# .ci/run's -m slow runs them; the native path stays in the default run
@pytest.mark.parametrize("path", [pytest.param("eager", marks=pytest.mark.slow), "native", pytest.param("torch.compile", marks=pytest.mark.slow)])
def test_fast_nuts_reaches_the_exact_conjugate_posterior(path):
    X, y, mean, precision = conjugate_problem()
    model = bayesian_linear_model()
    if path == "torch.compile":
        # the same model behind a dropout layer (the identity when sampling), which the native
        # kernels do not take: compile=True compiles the torch code
        net = torch.nn.Sequential(model.net, torch.nn.Dropout(0.0))
        model = pyrobnn.BayesianModel(net, model.likelihood, pyrobnn.NormalPrior(model.site_prior(model.sites[0]).scale))
    backend = {"eager": "eager", "native": "native", "torch.compile": "compile"}[path]
    result = nuts(model, X, y, num_samples=800, num_warmup=400, num_chains=4, backend=backend, progress=False)
    assert result.stats["path"] == path, result.stats["path_reason"]
    assert result.samples["weight" if path != "torch.compile" else "0.weight"].shape == (4, 800, 1, 3)
    assert result.num_divergences == 0
    check_exact_posterior(next(iter(result.samples.values())).reshape(4, 800, 3), mean, torch.linalg.inv(precision))


@pytest.mark.slow  # Pyro's own NUTS is the slow reference; the fast paths' exact-posterior tests stay in the default run
def test_pyro_nuts_reaches_the_exact_conjugate_posterior():
    X, y, mean, precision = conjugate_problem(seed=4)
    result = pyro_nuts(bayesian_linear_model(), X, y, num_samples=400, num_warmup=300, num_chains=2, progress=False)
    check_exact_posterior(result.samples["weight"].reshape(2, 400, 3), mean, torch.linalg.inv(precision))


def test_nuts_with_a_held_mass_matrix_reaches_the_exact_conjugate_posterior():
    """A given inverse mass matrix held through the warm-up (``adapt_mass_matrix=False``: only
    the step size adapts) keeps sampling exact: per chain, one matrix a hundred times the posterior's
    variances and one a hundredth of them, each chain's step size started where the other
    chain's would be wrong."""
    X, y, mean, precision = conjugate_problem(seed=2)
    cov = torch.linalg.inv(precision)
    inv_mass = torch.stack([100 * cov.diag(), cov.diag() / 100])
    result = nuts(bayesian_linear_model(), X, y, num_samples=800, num_warmup=150, num_chains=2, step_size=torch.tensor([1e-3, 5.0]),
                  inv_mass=inv_mass, adapt_mass_matrix=False, progress=False)
    assert torch.equal(result.stats["inv_mass"], inv_mass)
    assert result.num_divergences == 0
    check_exact_posterior(result.samples["weight"].reshape(2, 800, 3), mean, cov)


def test_a_given_step_size_is_kept_without_a_warm_up_and_starts_the_warm_up_otherwise():
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    kept = nuts(model, X, y, num_samples=5, num_warmup=0, num_chains=2, step_size=torch.tensor([0.01, 0.02], dtype=torch.float64), inv_mass=0.5,
                progress=False)
    torch.testing.assert_close(kept.stats["step_size"], torch.tensor([0.01, 0.02], dtype=torch.float64), rtol=0, atol=0)
    assert torch.equal(kept.stats["inv_mass"], torch.full((2, 3), 0.5, dtype=torch.float64))
    # adapted in windows, a given matrix is only the start: 150 iterations replace it
    windows = nuts(model, X, y, num_samples=5, num_warmup=150, num_chains=2, inv_mass=100.0, progress=False).stats["inv_mass"]
    assert torch.all(windows < 1.0), windows
    # a warm-up from a step size a thousandth of the adapted one ends near the adapted one
    adapted = nuts(model, X, y, num_samples=5, num_warmup=100, num_chains=2, progress=False).stats["step_size"]
    tuned = nuts(model, X, y, num_samples=5, num_warmup=100, num_chains=2, step_size=1e-3 * adapted.mean().item(), progress=False)
    assert torch.all((tuned.stats["step_size"] / adapted).log().abs() < math.log(3)), (tuned.stats["step_size"], adapted)


def test_nuts_adaptation_of_a_run_is_its_step_sizes_and_its_draws_regularized_variance():
    """What a refit on more data starts from: each chain's final step size, and the variance of
    its draws in unconstrained coordinates (the noise scale's on the log scale), shrunk as Stan's
    windows shrink theirs: n / (n + 5) var + 1e-3 * 5 / (n + 5)."""
    from pyrobnn.infer.mcmc.samplers import nuts_adaptation_of

    model, x, y = small_bnn(noise_prior=True)
    result = nuts(model, x, y, num_samples=30, num_warmup=30, num_chains=3, max_tree_depth=4, progress=False)
    carried = nuts_adaptation_of(result)
    assert torch.equal(carried["step_size"], result.stats["step_size"])
    weights = result.samples["0.weight"].reshape(3, 30, -1)
    log_noise = result.samples["noise_scale"].reshape(3, 30, 1).log()
    n = 30
    blocks = FlatPotential(model).blocks
    for block, (_, start, stop, _) in ((weights, blocks[0]), (log_noise, blocks[-1])):
        expected = n / (n + 5) * block.var(1) + 1e-3 * 5 / (n + 5)
        torch.testing.assert_close(carried["inv_mass"][:, start:stop], expected, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match=r"posterior must be a NUTS result with one step size per chain"):
        nuts_adaptation_of(Posterior(result.samples, {}, model=model))  # no step sizes: not a NUTS run's


def small_bnn(noise_prior=False):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 1, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(x) + 0.2 * torch.randn(20, 1, generator=g, dtype=torch.float64)
    scale = dist.LogNormal(math.log(0.2), 0.5) if noise_prior else 0.2
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,), activation="tanh").double(), pyrobnn.GaussianLikelihood(scale=scale), pyrobnn.NormalPrior(1.0))
    return model.double(), x, y


def test_flat_potential_equals_pyros_potential():
    """The fast path's potential (including the noise site's log-Jacobian) is Pyro's own
    potential_fn on the same unconstrained values."""
    model, x, y = small_bnn(noise_prior=True)
    model.eval()
    flat = FlatPotential(model, x, y)
    _, potential_fn, _, _ = initialize_model(model, model_args=(x, y))
    z = flat.initial(3, generator=torch.Generator().manual_seed(1))
    energies = flat(z)
    for c in range(3):
        params = {}
        for name, start, stop, shape in flat.blocks:
            params[name] = z[c, start:stop].reshape(shape)
        assert energies[c].item() == pytest.approx(potential_fn(params).item(), rel=1e-10)


@pytest.mark.slow  # about 25-45 s: a statistical check, run by .ci/run's -m slow
def test_fast_path_and_pyro_mcmc_agree_on_a_small_bnn():
    """Both samplers with trees capped at depth 5 (a valid MCMC kernel; at the default depth 10
    Pyro's NUTS takes a quarter of an hour on this posterior, whose trajectories never turn
    within 1023 steps). Tolerances come from each run's effective sample sizes."""
    model, x, y = small_bnn(noise_prior=True)
    grid = torch.linspace(-2.5, 2.5, 6, dtype=torch.float64).unsqueeze(-1)
    fast = nuts(model, x, y, num_samples=500, num_warmup=300, num_chains=4, max_tree_depth=5, progress=False)
    ref = pyro_nuts(model, x, y, num_samples=150, num_warmup=150, num_chains=2, max_tree_depth=5, progress=False)
    f = {}
    for name, result in (("fast", fast), ("pyro", ref)):
        model.eval()
        out = Predictive(model, posterior_samples=result.flat_samples(), return_sites=["_RETURN"])(grid)["_RETURN"]
        f[name] = out.reshape(result.num_chains, result.num_draws, -1)
    for name in f:  # both samplers mixed on the function values
        rhat = np.array([az.rhat(f[name][..., i].numpy()) for i in range(grid.shape[0])])
        assert rhat.max() < 1.1, (name, rhat)
    n_fast, n_ref = ess(f["fast"]), ess(f["pyro"])
    flat_f = {k: v.reshape(-1, v.shape[-1]) for k, v in f.items()}
    mean_diff = (flat_f["fast"].mean(0) - flat_f["pyro"].mean(0)).abs()
    sd_fast, sd_ref = flat_f["fast"].std(0), flat_f["pyro"].std(0)
    se_mean = torch.sqrt(sd_fast**2 / torch.tensor(n_fast) + sd_ref**2 / torch.tensor(n_ref))
    assert torch.all(mean_diff < 5 * se_mean), mean_diff / se_mean
    # SE of a standard deviation: sd / sqrt(2 n_eff)
    se_sd = torch.sqrt(sd_fast**2 / (2 * torch.tensor(n_fast)) + sd_ref**2 / (2 * torch.tensor(n_ref)))
    assert torch.all((sd_fast - sd_ref).abs() < 5 * se_sd), (sd_fast - sd_ref) / se_sd
    noise = {k: r.samples["noise_scale"].reshape(-1) for k, r in (("fast", fast), ("pyro", ref))}
    assert noise["fast"].mean().item() == pytest.approx(noise["pyro"].mean().item(), rel=0.1)


def test_samples_feed_predictive_and_predict():
    model, x, y = small_bnn()
    result = nuts(model, x, y, num_samples=50, num_warmup=50, num_chains=2, progress=False)
    pred = pyrobnn.predict(model, result, x, num_samples=None)
    assert pred.loc_samples.shape == (100, 20, 1)
    assert pred.rmse(y) < 0.35  # the noise is 0.2 and sd(y) is 0.7
    with pytest.raises(ValueError, match="fixed noise scale or a prior"):
        nuts(pyrobnn.BayesianModel(pyrobnn.MLP(1, 1), pyrobnn.GaussianLikelihood(scale="learned")), x.float(), y.float(), progress=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_samples": 0}, "num_samples must be an integer >= 1, got 0"),
    ({"num_warmup": -1}, "num_warmup must be an integer >= 0"),
    ({"max_tree_depth": 0}, "max_tree_depth must be an integer >= 1"),
    ({"target_accept": 1.5}, r"target_accept must be in \(0, 1\), got 1.5"),
    ({"num_chains": 0}, "nuts: num_chains must be an integer >= 1, got 0"),
    ({"step_size": 0.0}, r"step_size must be a finite positive number or an array of them of shape \(num_chains,\) or None, got 0.0"),
    ({"step_size": torch.tensor([0.1, float("nan")])}, r"step_size must be .* got an array with 1 of its 2 entries not finite and positive \(the first: nan\)"),
    ({"inv_mass": torch.ones(2, 3, 4)}, r"inv_mass must be .* of shape \(D,\) or \(num_chains, D\) or None, got a torch.float32 array of shape \(2, 3, 4\)"),
    ({"inv_mass": "unit"}, r"inv_mass must be .* got 'unit'"),
    ({"step_size": [0.1, 0.1], "num_processes": 2}, r"nuts: step_size per chain cannot be split over num_processes=2"),
    ({"inv_mass": torch.ones(3)}, r"inv_mass must be a number or have shape \(13,\) or \(4, 13\) \(the chains, the model's unconstrained parameters\), got shape \(3,\)"),
    ({"step_size": torch.ones(3)}, r"step_size must be a number or have shape \(4,\) \(one per chain\), got shape \(3,\)"),
])
def test_nuts_refuses_arguments_out_of_range(kwargs, message):
    model, x, y = small_bnn(noise_prior=False)
    with pytest.raises(ValueError, match=message):
        nuts(model, x, y, progress=False, **kwargs)


def test_priors_refuse_what_later_misleads():
    with pytest.raises(ValueError, match="prior scale must be a positive finite number, got inf"):
        pyrobnn.NormalPrior(float("inf"))
    with pytest.raises(ValueError, match=r"sample_range must be \(low, high\) with 0 < low < high"):
        pyrobnn.LogUniformPrior(sample_range=(1, 0.1))


def test_samplers_take_float64_targets_for_a_float32_network():
    """fit converted float64 targets; nuts failed inside the potential with a dtype error."""
    torch.manual_seed(0)
    x = torch.randn(10, 1)
    y = torch.randn(10, 1, dtype=torch.float64)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(scale=0.1))
    result = nuts(model, x, y, num_samples=2, num_warmup=2, num_chains=1, backend="eager", progress=False)
    assert all(v.dtype == torch.float32 for v in result.samples.values())


@pytest.mark.slow
def test_a_custom_forward_with_dropout_compiles_and_samples_the_network_without_it():
    """nn.Dropout is the identity when the samplers evaluate the network (eval mode); under
    torch.compile the network runs through functional_call (Dynamo refuses a module's parameter
    dict mutated inside the NUTS loop's while_loop), so no eager fallback happens."""
    import warnings

    class WithDropout(torch.nn.Module):
        def __init__(self, drop):
            super().__init__()
            self.a, self.drop, self.b = torch.nn.Linear(2, 6), torch.nn.Dropout(drop), torch.nn.Linear(6, 1)

        def forward(self, x):
            return self.b(self.drop(torch.tanh(self.a(x))))

    torch.manual_seed(0)
    x, y = torch.randn(30, 2), torch.randn(30)
    results = []
    for drop in (0.5, 0.0):
        torch.manual_seed(1)
        model = pyrobnn.BayesianModel(WithDropout(drop), pyrobnn.GaussianLikelihood(0.5))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to eager code would warn
            results.append(nuts(model, x, y, num_samples=5, num_warmup=5, num_chains=2, max_tree_depth=3, backend="compile", progress=False))
    assert all(r.stats["path"] == "torch.compile" for r in results)
    assert all(torch.equal(results[0].samples[k], results[1].samples[k]) for k in results[0].samples)


def curve_bnn():
    """benchmarks/hmc_speed.py's problem, where Stan's short-warm-up schedule left chains stuck:
    a 1-50-1 tanh network on 100 standardized points of Blundell et al.'s curve."""
    from pyrobnn.data import blundell_regression

    x, y = blundell_regression(100, seed=0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    return model, (x - x.mean()) / x.std(), (y - y.mean()) / y.std()


@pytest.mark.parametrize("num_warmup,seeds", [(30, (1, 2, 3)), (50, (0,)), pytest.param(30, (0, 4, 5, 6), marks=pytest.mark.slow),
                                              pytest.param(50, (1, 2, 3, 4), marks=pytest.mark.slow)])
def test_a_short_warm_up_leaves_no_chain_stuck(num_warmup, seeds):
    """With 30 warm-up iterations, Stan's schedule (a 3-iteration terminal buffer after the last
    window's step-size search) left every draw of one or two chains divergent at seeds 1-3 and
    12% of one chain's at 50 iterations, seed 0; the schedule's terminal buffer of at least 15
    iterations leaves every chain below 5% of divergent draws."""
    model, x, y = curve_bnn()
    for seed in seeds:
        result = nuts(model, x, y, num_samples=50, num_warmup=num_warmup, num_chains=4, seed=seed, progress=False)
        share = result.stats["diverging"].float().mean(1)
        assert (share < 0.05).all(), (seed, share.tolist())
        assert "stuck" not in result.summary()


def test_a_stuck_chain_is_named_in_the_summary_with_the_remedy():
    from pyrobnn.infer.results.posterior import Posterior

    model = bayesian_linear_model()
    samples = {s.name: torch.zeros((3, 10) + tuple(s.shape), dtype=torch.float64) for s in model.sites}
    diverging = torch.zeros(3, 10, dtype=torch.bool)
    diverging[1] = True
    diverging[2, :3] = True
    stats = {"diverging": diverging, "step_size": torch.tensor([0.01, 0.05, 0.012])}
    text = Posterior(samples, stats, 1.0, "pyrobnn NUTS", "mcmc", {}, model).summary()
    assert "divergent transitions: 13 of 30" in text
    assert "stuck chains, their draws mostly divergent (chain 1: 100%; step size 0.05 against 0.01-0.012 for the others)" in text
    assert "longer warm-up (num_warmup >= 150), a higher target_accept (0.9-0.95), or from a deep ensemble's members" in text


def test_nuts_in_single_precision_on_a_float64_model_reaches_the_exact_posterior_and_hands_back_float64_draws():
    """``dtype=torch.float32`` runs the chains on a float32 copy of a float64 model (the native
    kernels' single-precision functions): the draws are the exact posterior's within Monte Carlo
    error, they come back in float64 for the model the call was given, and that model is left as
    it was (float64 parameters, no copy attached)."""
    X, y, mean, precision = conjugate_problem(seed=3)
    model = bayesian_linear_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = nuts(model, X, y, num_samples=800, num_warmup=400, num_chains=4, dtype=torch.float32, progress=False)
    assert result.stats["path"] == "native", result.stats["path_reason"]
    assert result.model is model and result.settings["dtype"] == "float32"
    assert all(v.dtype == torch.float64 for v in result.samples.values())
    assert result.stats["step_size"].dtype == torch.float64 and result.stats["inv_mass"].dtype == torch.float64
    # the draws were made in float32: each is a float32 number, cast
    w = result.samples["weight"]
    assert torch.equal(w, w.float().double())
    assert all(torch.equal(v, before[k]) and v.dtype == torch.float64 for k, v in model.state_dict().items())
    assert result.num_divergences == 0
    check_exact_posterior(w.reshape(4, 800, 3), mean, torch.linalg.inv(precision))
    # and its predictive is the float64 model's, from the cast draws
    assert result.predict(X[:3]).mean.dtype == torch.float64


def test_nuts_in_the_models_own_dtype_is_the_run_without_dtype():
    X, y, _, _ = conjugate_problem()
    plain = nuts(bayesian_linear_model(), X, y, num_samples=20, num_warmup=20, num_chains=2, progress=False)
    same = nuts(bayesian_linear_model(), X, y, num_samples=20, num_warmup=20, num_chains=2, dtype=torch.float64, progress=False)
    assert torch.equal(plain.samples["weight"], same.samples["weight"])
    assert same.settings["dtype"] == "float64" and plain.settings["dtype"] is None


def test_a_float32_refit_goes_on_from_a_float64_posterior():
    """A warm refit's chains start from the previous (float64) result's last draws, cast."""
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    first = nuts(model, X, y, num_samples=10, num_warmup=20, num_chains=2, progress=False)
    again = nuts(model, X, y, num_samples=10, num_warmup=0, num_chains=2, init=first, dtype=torch.float32, step_size=0.05,
                 max_tree_depth=1, progress=False)
    assert again.samples["weight"].dtype == torch.float64 and again.num_chains == 2


def test_samplers_refuse_a_dtype_that_is_not_float32_or_float64():
    X, y, _, _ = conjugate_problem()
    for sampler in (nuts, pyrobnn.mclmc):
        with pytest.raises(ValueError, match=r"dtype must be .*torch.float32, torch.float64.*got torch.float16"):
            sampler(bayesian_linear_model(), X, y, num_samples=2, num_warmup=2, dtype=torch.float16, progress=False)
    model = bayesian_linear_model()
    with pytest.raises(ValueError, match="dtype"):
        nuts(model, X, y, num_samples=2, num_warmup=2, dtype="float32", progress=False)
    assert next(model.parameters()).dtype == torch.float64
