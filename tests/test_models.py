"""Which parameters become random, and what the model is as a Pyro callable."""

import pytest
import torch
from pyro import poutine
from pyro.poutine.util import prune_subsample_sites
from torch import nn

import pyrobnn
from pyrobnn.models import select_sites


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 4 * 4, 10)
        self.head = nn.Linear(10, 2)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.head(torch.relu(self.fc1(h)))


def names(sites):
    return [s.name for s in sites]


def test_selection_options():
    net = Net()
    assert names(select_sites(net)) == ["conv.weight", "conv.bias", "fc1.weight", "fc1.bias", "head.weight", "head.bias"]
    assert names(select_sites(net, "weights")) == ["conv.weight", "fc1.weight", "head.weight"]
    assert names(select_sites(net, "last_layer")) == ["head.weight", "head.bias"]
    assert names(select_sites(net, [nn.Linear])) == ["fc1.weight", "fc1.bias", "head.weight", "head.bias"]
    assert names(select_sites(net, [net.fc1])) == ["fc1.weight", "fc1.bias"]
    assert names(select_sites(net, ["head"])) == ["head.weight", "head.bias"]
    assert names(select_sites(net, ["*.bias"])) == ["conv.bias", "fc1.bias", "head.bias"]
    assert names(select_sites(net, lambda name, p, m: p.dim() > 2)) == ["conv.weight"]
    # batch norm only when asked for by name
    assert names(select_sites(net, ["bn.weight"])) == ["bn.weight"]
    with pytest.raises(ValueError, match="matches no parameter"):
        select_sites(net, ["fc9"])
    with pytest.raises(ValueError, match="recurrent"):
        select_sites(nn.LSTM(2, 3))


def test_site_geometry():
    sites = {s.name: s for s in select_sites(Net())}
    assert sites["conv.weight"].fan_in == 9 and sites["fc1.weight"].fan_in == 64
    assert sites["conv.weight"].unit_shape == (1, 1, 1, 1)
    assert sites["fc1.weight"].unit_shape == (1, 64)
    assert sites["fc1.bias"].unit_shape == ()


def test_ready_architectures_have_the_published_sizes():
    assert sum(p.numel() for p in pyrobnn.LeNet300100().parameters()) == 266_610
    assert sum(p.numel() for p in pyrobnn.LeNet5().parameters()) == 431_080
    assert pyrobnn.LeNet5()(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert pyrobnn.LeNet300100()(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert [m.out_features for m in pyrobnn.MLP(13, 1) if isinstance(m, nn.Linear)] == [50, 1]


def test_model_is_a_pyro_model_with_weight_sites_and_point_parameters():
    net = Net()
    model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), random="last_layer")
    x, y = torch.randn(3, 1, 6, 6), torch.tensor([0, 1, 1])
    trace = prune_subsample_sites(poutine.trace(model).get_trace(x, y))
    samples = [n for n, s in trace.nodes.items() if s["type"] == "sample"]
    params = {n for n, s in trace.nodes.items() if s["type"] == "param"}
    assert samples == ["head.weight", "head.bias", "obs"]
    assert {"net.conv.weight", "net.bn.weight", "net.fc1.bias"} <= params
    assert not any(p.startswith("net.head") for p in params)
    out = trace.nodes["_RETURN"]["value"]
    assert isinstance(out, torch.Tensor) and out.shape == (3, 2)
    # the returned output used the sampled head, not the network's own weights
    w, b = trace.nodes["head.weight"]["value"], trace.nodes["head.bias"]["value"]
    assert not torch.equal(w, net.head.weight)
    net.eval()
    with torch.no_grad():
        h = torch.relu(net.fc1(torch.relu(net.bn(net.conv(x))).flatten(1)))
    model.eval()
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, {"head.weight": w, "head.bias": b})).get_trace(x, y)
    assert torch.allclose(trace.nodes["_RETURN"]["value"], h @ w.T + b, atol=1e-6)


def test_per_site_priors_by_pattern():
    net = pyrobnn.MLP(2, 1, hidden=(4,))
    model = pyrobnn.BayesianModel(
        net, pyrobnn.GaussianLikelihood(), prior={"*.bias": pyrobnn.NormalPrior(10.0), "*": pyrobnn.NormalPrior(0.1, fan_in=True)}
    )
    d = model.prior_distribution(model.site("0.bias")).base_dist
    assert torch.allclose(d.scale, torch.tensor(10.0))
    d = model.prior_distribution(model.site("0.weight")).base_dist
    assert torch.allclose(d.scale, torch.tensor(0.1 / 2**0.5))


def test_guides_hold_at_most_two_tensors_per_weight_tensor():
    net = pyrobnn.LeNet300100()
    n_weights = sum(p.numel() for p in net.parameters())
    for prior, make in [
        (pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.MeanFieldNormal(m)),
        (pyrobnn.LogUniformPrior(), lambda m: pyrobnn.SparseVariationalDropout(m)),
        (pyrobnn.LogUniformPrior(), lambda m: pyrobnn.VariationalDropout(m, alpha="unit")),
        (pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.MCDropout(m)),
        (pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.ConcreteDropout(m)),
    ]:
        guide = make(pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), prior))
        weight_sized = [p for p in guide.parameters() if p.dim() and p.numel() >= 10]
        n_guide = sum(p.numel() for p in guide.parameters())
        assert len(weight_sized) <= 2 * 6
        # per-unit and per-layer extras are small next to the weights
        assert 2 * n_weights >= n_guide - 1200, type(guide).__name__


@pytest.mark.parametrize("scale", [0.1, "learned"])
def test_the_likelihood_takes_the_networks_precision(scale):
    """A likelihood built apart from a float64 network (its noise scale made in torch's default
    float32, as nn.Linear's parameters are) is moved to float64 by the model, as model.double()
    would move it: a fixed scale is a float64 buffer, a learned one a float64 point parameter."""
    net = pyrobnn.MLP(2, 1, hidden=(4,)).double()
    likelihood = pyrobnn.GaussianLikelihood(scale, init_scale=0.1)
    model = pyrobnn.BayesianModel(net, likelihood)
    assert model.likelihood is likelihood
    noise = model.likelihood.scale()
    assert noise.dtype == torch.float64 and abs(noise.item() - 0.1) < 1e-8  # float32's rounding of 0.1
    assert all(p.dtype == torch.float64 for _, p in model.point_parameters())


@pytest.mark.parametrize("scale", [0.1, "learned"])
def test_the_likelihood_goes_to_the_networks_device(scale):
    """The device half of the same move, caught on a CPU-only machine: a network on the meta
    device takes a likelihood made on the CPU there (on a GPU, a scale left on the CPU fails at
    the first step)."""
    net = pyrobnn.MLP(2, 1, hidden=(4,)).to("meta")
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale))
    assert model.device.type == "meta"
    assert model.likelihood.scale().device.type == "meta"
    assert all(p.device.type == "meta" for _, p in model.point_parameters())
