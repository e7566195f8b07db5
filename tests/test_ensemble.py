"""Deep ensembles: the batched members equal members trained alone, the MAP of the conjugate
model is its exact posterior mean, and an ensemble is a posterior that predict, Predictive,
ArviZ and the samplers take."""

import math

import pyro
import pytest
import torch

import pyrobnn
from pyrobnn.infer.results import diagnostics
from pyrobnn.infer.ensemble_sampling import ensemble_sampling
from pyrobnn.infer.core.starts import member_initializations
from pyrobnn.infer.modes.ensemble import EnsemblePosterior, deep_ensemble, train_members
from pyrobnn.infer.core.potential import FlatPotential
from test_conjugate import bayesian_linear_model, conjugate_problem


def small_problem(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(x[:, :1]) * x[:, 1:] + 0.2 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    net = pyrobnn.MLP(2, 2, hidden=(8,), activation="tanh").double()
    model = pyrobnn.BayesianModel(net, pyrobnn.HeteroscedasticGaussianLikelihood(), pyrobnn.NormalPrior(1.0))
    return model.double(), x, y


def test_batched_members_equal_members_trained_alone():
    """Three members trained as one (K, dim) tensor, with minibatches, weight decay and early
    stopping that stops them at different epochs, end exactly where each ends trained alone."""
    model, x, y = small_problem()
    model.eval()
    potential = FlatPotential(model, x[:90], y[:90])
    x_val, y_val = potential.check_data(x[90:], y[90:])
    z0 = member_initializations(model, potential, 3, seed=0)
    kwargs = dict(objective="map", lr=3e-2, weight_decay=1e-2, batch_size=16, max_epochs=60, patience=3, seed=5, progress=False)
    together, stats, history = train_members(potential, z0, x[:90], potential.y, x_val, y_val, **kwargs)
    assert history.shape[1] == 3
    assert len(set(stats["best_epoch"].tolist())) > 1  # the members stopped at different epochs
    for k in range(3):
        alone, stats_k, _ = train_members(potential, z0[k : k + 1], x[:90], potential.y, x_val, y_val, **kwargs)
        torch.testing.assert_close(together[k : k + 1], alone, rtol=1e-9, atol=1e-11)
        assert stats_k["best_epoch"].item() == stats["best_epoch"][k].item()


def test_member_k_is_initialized_under_seed_plus_k():
    model, x, y = small_problem()
    potential = FlatPotential(model.eval(), x, y)
    three = member_initializations(model, potential, 3, seed=10)
    for k in range(3):
        torch.testing.assert_close(three[k : k + 1], member_initializations(model, potential, 1, seed=10 + k))
    assert not torch.allclose(three[0], three[1])


def test_map_member_of_the_conjugate_model_is_the_exact_posterior_mean():
    """The posterior of the conjugate regression is Gaussian, so its mode is its mean m."""
    X, y, mean, _ = conjugate_problem()
    ensemble = deep_ensemble(bayesian_linear_model(), X, y, num_members=3, objective="map", lr=0.05, batch_size=None,
                             max_epochs=1500, progress=False)
    w = ensemble.samples["weight"].reshape(3, 3)
    torch.testing.assert_close(w, mean.expand(3, 3), rtol=0, atol=1e-5)


def test_a_warm_started_ensemble_continues_from_the_members_it_is_given():
    """Members started from a previous ensemble (``init``) start at its members (one Adam step of
    1e-12 moves each weight by about 1e-12) and go on from there to the posterior mode."""
    X, y, mean, _ = conjugate_problem()
    model = bayesian_linear_model()
    first = deep_ensemble(model, X, y, num_members=3, lr=0.05, batch_size=None, max_epochs=20, progress=False)
    again = deep_ensemble(model, X, y, num_members=3, lr=1e-12, batch_size=None, max_epochs=1, progress=False, init=first)
    torch.testing.assert_close(again.samples["weight"], first.samples["weight"], rtol=0, atol=1e-10)
    fresh = deep_ensemble(model, X, y, num_members=3, lr=1e-12, batch_size=None, max_epochs=1, progress=False)
    assert not torch.allclose(fresh.samples["weight"], first.samples["weight"], atol=1e-3)  # the check can fail
    on = deep_ensemble(model, X, y, num_members=3, lr=0.05, batch_size=None, max_epochs=1500, progress=False, init=first)
    torch.testing.assert_close(on.samples["weight"].reshape(3, 3), mean.expand(3, 3), rtol=0, atol=1e-5)
    assert again.settings["init"].startswith("EnsemblePosterior")
    with pytest.raises(ValueError, match="one per member"):
        deep_ensemble(model, X, y, num_members=2, max_epochs=1, progress=False, init=first)


def test_an_ensemble_predicts_the_equal_weight_mixture_everywhere():
    model, x, y = small_problem()
    ensemble = deep_ensemble(model, x, y, num_members=4, validation=0.2, lr=1e-2, max_epochs=40, progress=False)
    assert isinstance(ensemble, EnsemblePosterior) and ensemble.num_members == 4
    assert ensemble.samples["0.weight"].shape == (4, 1, 8, 2)
    # by hand: each member's network, then the mixture of their Gaussians
    locs = []
    for k in range(4):
        net = model.deterministic_net({name: v[k, 0] for name, v in ensemble.samples.items()})
        locs.append(net(x)[:, :1])
    pred = pyrobnn.predict(model, ensemble, x, num_samples=None)
    torch.testing.assert_close(pred.mean, torch.stack(locs).mean(0).detach())
    predictive = pyro.infer.Predictive(model, posterior_samples=ensemble.flat_samples(), return_sites=["_RETURN"])(x)
    assert predictive["_RETURN"].shape == (4, 120, 2)
    idata = diagnostics.inference_data(model, ensemble, x, y)
    assert idata.posterior.sizes["chain"] == 4 and idata.posterior.sizes["draw"] == 1


def test_early_stopping_keeps_each_members_best_validation_state():
    model, x, y = small_problem()
    ensemble = deep_ensemble(model, x, y, num_members=3, validation=0.25, lr=5e-2, max_epochs=200, patience=5, progress=False)
    best = ensemble.history.min(0).values
    torch.testing.assert_close(ensemble.stats["val_nll"], best)
    # a member stops `patience` epochs after its best one (or at max_epochs)
    stopped = ensemble.stats["epochs"]
    assert ((stopped - ensemble.stats["best_epoch"] == 5) | (stopped == 200)).all()


def test_ensemble_initialized_chains_start_at_the_members():
    """The samplers' starting positions are exactly the members (packed to unconstrained
    vectors), one chain per member, for MCLMC and NUTS alike."""
    from pyrobnn.infer.core.starts import initial_positions

    model, x, y = small_problem()
    ensemble = deep_ensemble(model, x, y, num_members=3, lr=1e-2, max_epochs=20, progress=False)
    potential = FlatPotential(model.eval(), x, y)
    start = initial_positions(potential, ensemble, None, 2.0, None)
    members = potential.unpack(start)
    for name, v in ensemble.samples.items():
        torch.testing.assert_close(members[name], v[:, 0], rtol=0, atol=0)
    result = ensemble_sampling(model, x, y, ensemble=ensemble, sampler="mclmc", num_samples=40, num_warmup=(40, 10, 10), thinning=2, backend="eager", progress=False)
    assert result.num_chains == 3 and result.num_draws == 20
    assert result.stats["energy"].shape == (3, 20)
    nuts_result = ensemble_sampling(model, x, y, ensemble=ensemble, sampler="nuts", num_samples=5, num_warmup=0, max_tree_depth=3, backend="eager", progress=False)
    assert nuts_result.num_chains == 3
    with pytest.raises(ValueError, match="sampler"):
        ensemble_sampling(model, x, y, ensemble=ensemble, sampler="hmc")


def test_deep_ensemble_refuses_bad_arguments():
    model, x, y = small_problem()
    with pytest.raises(ValueError, match="num_members"):
        deep_ensemble(model, x, y, num_members=0, progress=False)
    with pytest.raises(ValueError, match="objective"):
        deep_ensemble(model, x, y, num_members=2, objective="mle", progress=False)
    with pytest.raises(ValueError, match="validation"):
        deep_ensemble(model, x, y, num_members=2, validation=1.5, progress=False)
    with pytest.raises(ValueError, match="x_val"):
        deep_ensemble(model, x, y, num_members=2, x_val=x, progress=False)
    with pytest.raises(ValueError, match="backend"):
        deep_ensemble(model, x, y, num_members=2, backend="cuda", progress=False)
    learned = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)).double(), pyrobnn.GaussianLikelihood(scale="learned"))
    with pytest.raises(ValueError, match="deep_ensemble does not support GaussianLikelihood.*learned.*moves latent sites only"):
        deep_ensemble(learned, x, y, num_members=2, progress=False)


def test_ensemble_sampling_trains_its_ensemble_when_none_is_given():
    model, x, y = small_problem()
    options = dict(num_members=3, max_epochs=20, progress=False)
    given = ensemble_sampling(model, x, y, ensemble=deep_ensemble(model, x, y, seed=4, **options), sampler="nuts", num_samples=3,
                              num_warmup=3, max_tree_depth=3, seed=4, progress=False)
    trained = ensemble_sampling(model, x, y, sampler="nuts", ensemble_options=options, num_samples=3, num_warmup=3, max_tree_depth=3,
                                seed=4, progress=False)
    assert trained.num_chains == 3 and all(torch.equal(given.samples[k], trained.samples[k]) for k in given.samples)
    with pytest.raises(ValueError, match="give ensemble= or ensemble_options="):
        ensemble_sampling(model, x, y, ensemble=given, ensemble_options=options)


def test_within_chain_rhat_flags_a_drifting_chain_and_passes_stationary_ones():
    g = torch.Generator().manual_seed(0)
    n = 1000
    noise = torch.randn(3, n, generator=g, dtype=torch.float64)
    chain = torch.zeros_like(noise)
    for t in range(1, n):
        chain[:, t] = 0.5 * chain[:, t - 1] + noise[:, t]
    chain[2] += torch.linspace(0, 3, n, dtype=torch.float64)  # still drifting
    chain[1] += 5.0  # stationary, elsewhere: between-chain disagreement is not drift
    rhat = diagnostics.within_chain_rhat(chain)
    assert rhat[0] < 1.02 and rhat[1] < 1.02
    assert rhat[2] > 1.1


def test_within_chain_summary_reads_stationary_chains_in_different_places():
    """Two stationary chains far apart: each passes on its own, the between-chain R-hat is
    large, and the verdict says the chains are stationary and disagree, nothing more."""
    model, x, y = small_problem()
    potential = FlatPotential(model.eval(), x, y)
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(2, 1, potential.dim, generator=g, dtype=torch.float64)
    z = centres + 0.01 * torch.randn(2, 400, potential.dim, generator=g, dtype=torch.float64)
    values = potential.unpack(z.reshape(800, -1))
    result = pyrobnn.infer.results.posterior.Posterior({k: v.reshape((2, 400) + v.shape[1:]) for k, v in values.items()})
    summary = diagnostics.within_chain_summary(model, result, x, y)
    assert summary["worst_rhat"] < 1.1 and summary["drifting_chains"] == 0
    assert summary["between_chain_rhat"] > 1.1
    assert "stationary" in summary["verdict"] and "mode" not in summary["verdict"]
    assert summary["lppd"].shape == (2,)
    assert math.isfinite(summary["lppd_mixture"])


def test_pack_inverts_unpack_with_a_constrained_noise_site():
    import pyro.distributions as dist

    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(3,)).double(), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(0.0, 1.0)))
    x = torch.randn(10, 2, dtype=torch.float64)
    potential = FlatPotential(model.double().eval(), x, torch.randn(10, 1, dtype=torch.float64))
    z = torch.randn(4, potential.dim, dtype=torch.float64)
    torch.testing.assert_close(potential.pack(potential.unpack(z)), z)
    draws = torch.randn(2, 5, potential.dim, dtype=torch.float64)  # (chains, draws, dim), as a posterior's
    torch.testing.assert_close(potential.pack_draws(potential.unpack_draws(draws)), draws)
    with pytest.raises(ValueError, match="no values"):
        potential.pack({"0.weight": torch.zeros(4, 3, 2)})


def test_exp_link_heteroscedastic_likelihood_clips_the_scale():
    lik = pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=1e-6, max_scale=1e6, link="exp")
    out = torch.tensor([[0.3, 0.0], [0.0, -50.0], [0.0, 50.0]], dtype=torch.float64)
    loc, scale = lik.split(out)
    torch.testing.assert_close(scale[:, 0], torch.tensor([1.0, 1e-6, 1e6], dtype=torch.float64))
    with pytest.raises(ValueError, match="link"):
        pyrobnn.HeteroscedasticGaussianLikelihood(link="relu")
    with pytest.raises(ValueError, match="min_scale"):
        pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=-1)


@pytest.mark.slow  # 10-15 s: spawned processes
def test_members_trained_in_two_processes_follow_their_one_process_paths():
    """Four members with early stopping at different epochs, trained in two processes of two:
    the same members, statistics and loss history as in one process."""
    model, x, y = small_problem()
    kwargs = dict(num_members=4, validation=0.25, lr=5e-2, batch_size=16, max_epochs=60, patience=3, progress=False)
    one = deep_ensemble(model, x, y, **kwargs)
    two = deep_ensemble(model, x, y, num_processes=2, **kwargs)
    assert len(set(one.stats["epochs"].tolist())) > 1
    for name in one.samples:
        torch.testing.assert_close(two.samples[name], one.samples[name], rtol=1e-9, atol=1e-11)
    assert set(two.stats) == set(one.stats)
    for key, value in one.stats.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(two.stats[key], value, rtol=1e-9, atol=1e-11)
        else:  # the path and its reason
            assert two.stats[key] == value
    torch.testing.assert_close(two.history, one.history, rtol=1e-9, atol=1e-11)


@pytest.mark.slow  # 10-15 s: spawned processes
def test_chains_in_two_processes_are_the_groups_run_alone():
    """NUTS and MCLMC with num_processes=2: the starting positions are the one-process ones and
    group i is exactly the sampler run on its chains with the seed seed + i."""
    from pyrobnn.infer.core.starts import initial_positions
    from pyrobnn.infer.mcmc import mclmc, nuts

    _, x, y = small_problem()
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(8,), activation="tanh").double(), pyrobnn.GaussianLikelihood(scale=0.3))
    potential = FlatPotential(model, x, y)
    z0 = initial_positions(potential, None, 3, 2.0, torch.Generator().manual_seed(7))
    for sampler, options in ((nuts, dict(num_samples=6, num_warmup=6, max_tree_depth=4)), (mclmc, dict(num_samples=20, num_warmup=(20, 5, 5), thinning=2))):
        split = sampler(model, x, y, num_chains=3, seed=7, num_processes=2, backend="eager", progress=False, **options)
        assert split.method == f"pyrobnn {sampler.__name__.upper()}"
        groups = [(z0[:2], 7), (z0[2:], 8)]
        alone = [sampler(model, x, y, init=g, seed=s, backend="eager", progress=False, **options) for g, s in groups]
        for name, v in split.samples.items():
            torch.testing.assert_close(v, torch.cat([a.samples[name] for a in alone]), rtol=0, atol=0)
        for key, v in split.stats.items():
            if isinstance(v, str):  # the path and its reason, the same in every group
                assert all(a.stats[key] == v for a in alone), key
            else:
                torch.testing.assert_close(v, torch.cat([a.stats[key] for a in alone]), rtol=0, atol=0)
        assert split.stats["path"] == "eager"
    with pytest.raises(ValueError, match="num_processes must be a positive integer"):
        nuts(model, x, y, num_processes=0)


def integer_target_problem():
    """Twelve inputs, each repeated eight times with the same integer target (standardized), and
    test targets one unit off at every other input: a heteroscedastic Gaussian's density is
    unbounded at the repeated targets."""
    xs = torch.linspace(-1, 1, 12)
    x = xs.repeat_interleave(8).unsqueeze(-1)
    y = torch.round(2 * torch.sin(3 * x))
    x_test = xs.unsqueeze(-1)
    y_test = torch.round(2 * torch.sin(3 * x_test)) + torch.tensor([1.0, 0.0] * 6).unsqueeze(-1)
    mean, std = y.mean(), y.std()
    return x, (y - mean) / std, x_test, (y_test - mean) / std


@pytest.mark.parametrize("min_scale", [1e-6, pytest.param(0.07, marks=pytest.mark.slow)])
def test_a_degenerate_posterior_is_named_with_its_cause_not_called_unconverged(min_scale):
    """MILE's model (clip 1e-6) on integer targets: chains slide onto spikes at the repeated
    targets and their test LPPD falls far below the ensemble's; the verdict names the cause and
    the remedies and does not advise sampling longer. With a noise floor of a tenth of the
    targets' resolution (0.07 here) the same run is not degenerate."""
    x, y, x_test, y_test = integer_target_problem()
    torch.manual_seed(0)
    likelihood = pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=min_scale, max_scale=1e6, link="exp")
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 2, hidden=(16, 16), activation="relu"), likelihood)
    ensemble = deep_ensemble(model, x, y, num_members=4, objective="likelihood", lr=1e-2, max_epochs=300, batch_size=None, seed=0, progress=False)
    reference = pyrobnn.predict(model, ensemble, x_test, num_samples=None).log_likelihood(y_test)
    result = ensemble_sampling(model, x, y, ensemble=ensemble, sampler="mclmc", num_samples=2000, num_warmup=(2000, 300, 300), thinning=10, seed=0, progress=False)
    summary = diagnostics.within_chain_summary(model, result, x_test, y_test, x_train=x, y_train=y, reference_lppd=reference)
    assert summary["targets"]["lattice"] and summary["targets"]["repeated_share"] > 0.9
    if min_scale == 1e-6:
        assert summary["degenerate"]
        assert summary["collapsed_chains"] >= 2 and summary["lppd"].min() < reference - 100
        verdict = summary["verdict"]
        assert verdict.startswith("Degenerate posterior") and "repeating exactly" in verdict
        assert "min_scale=0.073" in verdict and "sample longer" not in verdict
    else:
        assert not summary["degenerate"] and summary["collapsed_chains"] == 0
        assert not summary["verdict"].startswith("Degenerate")


def test_degeneracy_refuses_training_data_it_cannot_read():
    model, x, y = small_problem()
    samples = {s.name: torch.zeros((1, 2) + s.shape, dtype=torch.float64) for s in model.sites}
    for kwargs, message in (
        (dict(x_train=x), "x_train and y_train go together"),
        (dict(x_train=x, y_train=y[:3]), "must be the same points"),
        (dict(x_train=x[:0], y_train=y[:0]), "x_train must be a non-empty tensor"),
        (dict(x_train=x, y_train=torch.full_like(y, float("nan"))), "y_train holds NaN"),
        (dict(reference_lppd=float("inf")), "reference_lppd must be a finite number"),
    ):
        with pytest.raises(ValueError, match=message):
            diagnostics.degeneracy(model, samples, **kwargs)


@pytest.mark.slow  # 2000 members, about 25 s: in .ci/run's -m slow; the MAP member's exactness stays in the default run
def test_anchored_members_are_exact_posterior_draws_of_a_linear_model():
    """Randomized MAP on conjugate Bayesian linear regression: member k minimizes
    |y + s_n e_k - X w|^2 / (2 s_n^2) + |w - a_k|^2 / (2 s_p^2), whose minimizer
    L^-1 (X^T (y + s_n e_k) / s_n^2 + a_k / s_p^2) is an exact posterior draw. 2000 members: their
    mean and covariance match the posterior's within Monte Carlo error (5 standard errors)."""
    X, y, mean, precision = conjugate_problem()
    cov = torch.linalg.inv(precision)
    members = 2000
    ens = pyrobnn.deep_ensemble(bayesian_linear_model(), X, y.unsqueeze(-1), num_members=members, objective="anchored", lr=0.05,
                                max_epochs=1000, batch_size=None, progress=False, seed=3)
    w = ens.samples["weight"].reshape(members, 3)
    sd = cov.diagonal().sqrt()
    assert ((w.mean(0) - mean).abs() < 5 * sd / math.sqrt(members)).all(), (w.mean(0), mean)
    assert ((w.var(0) / sd**2 - 1).abs() < 5 * math.sqrt(2 / members)).all(), (w.var(0), sd**2)
    corr = torch.corrcoef(w.T)[0, 1]
    exact = cov[0, 1] / (sd[0] * sd[1])
    assert abs(float(corr - exact)) < 5 * (1 - exact**2) / math.sqrt(members)
    # a MAP ensemble's members all sit at the mode: no spread at all
    map_members = pyrobnn.deep_ensemble(bayesian_linear_model(), X, y.unsqueeze(-1), num_members=4, objective="map", lr=0.05,
                                        max_epochs=1500, batch_size=None, progress=False, seed=3)
    assert float(map_members.samples["weight"].reshape(4, 3).std(0).max()) < 0.01 * float(sd.min())


def test_anchored_members_start_at_their_anchors():
    """Pearce et al.'s algorithm: member k starts at its own anchor a_k, a draw of the prior (not
    at the network's initialization, a fraction of a fan-in prior's scale). With a learning rate of
    1e-12 for one step each member is still where it started: its anchor, as anchored_draws gives
    it under the seed, whose per-site spread is the prior's (fan-in: 2 / sqrt(fan-in))."""
    from torch import nn

    from pyrobnn.infer.modes.ensemble import anchored_draws

    g = torch.Generator().manual_seed(4)
    x = torch.rand(12, 3, generator=g, dtype=torch.float64)
    y = x.sum(-1, keepdim=True)
    net = nn.Sequential(nn.Linear(3, 40), nn.ReLU(), nn.Linear(40, 1)).double()
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(2.0, fan_in=True))
    members = 64
    ens = deep_ensemble(model, x, y, num_members=members, objective="anchored", lr=1e-12, max_epochs=1, batch_size=None,
                        progress=False, seed=7)
    potential = FlatPotential(model)
    anchors, _ = anchored_draws(model, potential, y, members, 7)
    started = potential.pack({k: v[:, -1] for k, v in ens.samples.items()})
    assert float((started - anchors).abs().max()) < 1e-9
    hidden = ens.samples["0.weight"].reshape(members, -1)  # 40 x 3 weights per member, prior sd 2 / sqrt(3)
    sd, n = float(hidden.std()), hidden.numel()
    assert abs(sd / (2 / math.sqrt(3)) - 1) < 5 / math.sqrt(2 * n)
    # the network's own initialization (what a MAP member starts from) is a third of that scale
    assert float(member_initializations(model, potential, members, 7)[:, :120].std()) < 0.5 * sd


def test_anchored_objective_refuses_what_it_cannot_perturb():
    import pyro.distributions as dist
    from torch import nn

    X = torch.randn(20, 3, dtype=torch.float64)
    y = torch.randn(20, 1, dtype=torch.float64)
    noisy = pyrobnn.BayesianModel(nn.Linear(3, 1).double(), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)))
    with pytest.raises(ValueError, match="objective='anchored' perturbs the targets"):
        pyrobnn.deep_ensemble(noisy, X, y, objective="anchored", num_members=2, max_epochs=2, progress=False)
    mixture = pyrobnn.BayesianModel(nn.Linear(3, 1).double(), pyrobnn.GaussianLikelihood(scale=0.5), pyrobnn.ScaleMixturePrior())
    with pytest.raises(ValueError, match="zero-mean Gaussian priors"):
        pyrobnn.deep_ensemble(mixture, X, y, objective="anchored", num_members=2, max_epochs=2, progress=False)


@pytest.mark.parametrize("case", ["targets_1d", "several_outputs", "float64", "dropout", "custom_forward", "numpy", "noise_prior", "cnn",
                                  "scale_mixture_prior"])
def test_anchored_members_run_on_the_conformance_cases_or_are_refused_by_name(case):
    """The anchored objective on pyrobnn.testing's cases: it runs (finite predictions of the
    likelihood's shape) on every Gaussian fixed-noise one, a user's Dropout network and custom
    forward, NumPy data and float64 included, and refuses the others before training."""
    from pyrobnn import testing
    from pyrobnn.infer.modes.ensemble import anchored_refusal

    model, x, y, x_test, _ = testing.build_case(case, "deep_ensemble")
    reason = anchored_refusal(model)
    if reason is not None:
        assert case in ("noise_prior", "cnn", "scale_mixture_prior")
        with pytest.raises(ValueError, match="objective='anchored'"):
            pyrobnn.deep_ensemble(model, x, y, num_members=2, max_epochs=2, objective="anchored", progress=False)
        return
    result = pyrobnn.deep_ensemble(model, x, y, num_members=3, max_epochs=5, objective="anchored", progress=False)
    pred = result.predict(x_test, seed=0)
    assert torch.isfinite(torch.as_tensor(pred.mean)).all()
    assert result.method == "deep ensemble (anchored, randomized MAP)"
