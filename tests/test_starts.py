"""Where the full-batch samplers' chains start (pyrobnn.infer.core.starts): ``init="prior"`` draws
each chain's start from the model's prior (Pyro's ``init_to_sample``), at its scale in every
layer, repeatably under the run's seed and without touching the caller's random stream."""

import math

import pytest
import torch

import pyrobnn
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.starts import initial_positions, prior_draws
from pyrobnn.infer.mcmc.samplers import mclmc, nuts


def fan_in_model(noise_prior=None, dtype=torch.float64, hidden=(50,)):
    net = pyrobnn.MLP(3, 1, hidden=hidden, activation="relu").to(dtype)
    likelihood = pyrobnn.GaussianLikelihood(scale=noise_prior if noise_prior is not None else 0.1)
    return pyrobnn.BayesianModel(net, likelihood, pyrobnn.NormalPrior(1.5, fan_in=True))


def test_prior_draws_have_each_sites_prior_scale():
    """Per site, the draws' standard deviation is the prior's (1.5 / sqrt(fan-in) for weights, 1.5
    for biases) within 5 standard errors of a sample sd (sd / sqrt(2 N)); a HalfNormal noise
    scale's draws have its mean sqrt(2/pi) s within 5 standard errors."""
    noise = torch.distributions.HalfNormal(torch.tensor(0.3, dtype=torch.float64))
    model = fan_in_model(noise)
    potential = FlatPotential(model)
    chains = 400
    z = prior_draws(potential, chains, torch.Generator().manual_seed(0))
    assert z.shape == (chains, potential.dim) and z.dtype == torch.float64 and z.device == model.device
    values = potential.unpack(z)
    for site in model.sites:
        expected = 1.5 / math.sqrt(site.fan_in) if not site.is_bias else 1.5
        n = values[site.name][0].numel() * chains
        sd = float(values[site.name].std())
        assert abs(sd - expected) < 5 * expected / math.sqrt(2 * n), (site.name, sd, expected)
    (name,) = model.likelihood.latent_sites()
    scales = values[name].reshape(-1)
    mean, se = 0.3 * math.sqrt(2 / math.pi), 0.3 * math.sqrt(1 - 2 / math.pi) / math.sqrt(chains)
    assert (scales > 0).all() and abs(float(scales.mean()) - mean) < 5 * se


def test_prior_draws_repeat_under_the_runs_seed_and_leave_the_global_stream_alone():
    potential = FlatPotential(fan_in_model())
    state = torch.get_rng_state()
    a = prior_draws(potential, 4, torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)
    b = initial_positions(potential, "prior", 4, 2.0, torch.Generator().manual_seed(3))
    c = prior_draws(potential, 4, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])  # each chain its own draw


def test_a_prior_start_is_at_the_priors_scale_where_the_box_is_not():
    """The reason for ``init="prior"``: a fan-in network started in Stan's box computes a function
    many times larger than its prior's. In the BO surrogates' shape, 3-50-50-1 with ReLU (positively
    homogeneous, so the layers' scale ratios multiply): the box's weight sd 1.155 against the
    prior's 1.5/sqrt(3) and 1.5/sqrt(50) is 1.3 x 5.4 x 5.4, about 40x in the output, where a
    draw from the prior is at its scale; asserted: more than 10x the prior draws' median output
    sd."""
    model = fan_in_model(hidden=(50, 50))
    potential = FlatPotential(model)
    x = torch.rand(64, 3, dtype=torch.float64)

    def output_sd(z):
        values = potential.unpack(z)
        sds = [torch.func.functional_call(model.net, {k: v[i] for k, v in values.items()}, (x,)).std() for i in range(z.shape[0])]
        return torch.stack(sds).median()

    prior = output_sd(prior_draws(potential, 16, torch.Generator().manual_seed(0)))
    box = output_sd(potential.initial(16, 2.0, torch.Generator().manual_seed(0)))
    assert box > 10 * prior


@pytest.mark.parametrize("sampler", [nuts, mclmc])
def test_the_samplers_start_from_the_prior_and_say_so(sampler):
    model = fan_in_model()
    x = torch.rand(12, 3, dtype=torch.float64)
    y = x.sum(-1)
    options = dict(num_samples=4, num_chains=3, init="prior", seed=5, progress=False)
    options.update(num_warmup=6) if sampler is nuts else options.update(num_warmup=(4, 2, 2), thinning=1)
    first, again = sampler(model, x, y, **options), sampler(model, x, y, **options)
    assert first.method == f"pyrobnn {'NUTS' if sampler is nuts else 'MCLMC'} (prior-initialized)"
    assert first.settings["init"] == "prior"
    for name in first.samples:
        assert first.samples[name].shape[:2] == (3, 4)
        assert torch.equal(first.samples[name], again.samples[name])


def test_an_unknown_init_name_is_refused_naming_the_argument():
    potential = FlatPotential(fan_in_model())
    with pytest.raises(ValueError, match=r"init must be 'prior', a Posterior or a tensor of positions, got 'sample'"):
        initial_positions(potential, "sample", 2, 2.0, torch.Generator().manual_seed(0))
