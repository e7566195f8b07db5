"""The rational float32 tanh used in compiled code: accuracy against float64 tanh, its
derivative, edge values, and that compiled tanh networks use it and agree with eager ones."""

import math

import torch

import pyrobnn
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.models.rational_tanh import rational_tanh, tanh_for

# torch.tanh's own float32 error is about 6e-8; a few ULP more is the documented budget
MAX_ERROR = 4e-7


def test_accuracy_over_the_float32_line():
    x = torch.linspace(-12.0, 12.0, 4_000_001, dtype=torch.float32)
    x = torch.cat([x, torch.logspace(-30, 1, 20001, dtype=torch.float32)])
    y = rational_tanh(x).double()
    exact = torch.tanh(x.double())
    assert (y - exact).abs().max().item() < MAX_ERROR
    nonzero = exact != 0
    assert ((y - exact)[nonzero] / exact[nonzero]).abs().max().item() < MAX_ERROR
    assert y.abs().max().item() <= 1.0
    assert torch.equal(rational_tanh(-x), -rational_tanh(x))


def test_edge_values():
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e30, -1e30, math.nan], dtype=torch.float32)
    y = rational_tanh(x)
    assert y[:6].tolist() == [0.0, 0.0, 1.0, -1.0, 1.0, -1.0]
    assert math.isnan(y[6].item())


def test_derivative_is_one_minus_square():
    x = torch.linspace(-10, 10, 1001, requires_grad=True)
    y = rational_tanh(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 1 - y.detach() ** 2, rtol=0, atol=0)
    torch.testing.assert_close(g, 1 - torch.tanh(x.detach()) ** 2, rtol=0, atol=1e-6)


def test_eager_and_float64_use_torch_tanh():
    x = torch.linspace(-3, 3, 101)
    assert torch.equal(tanh_for(x), torch.tanh(x))
    compiled = torch.compile(tanh_for, dynamic=False)
    x64 = x.double()
    torch.testing.assert_close(compiled(x64), torch.tanh(x64), rtol=0, atol=1e-15)


def test_compiled_potential_of_a_tanh_network_uses_it_and_agrees():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(20,), activation="tanh"), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    model.eval()
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    y = torch.sin(x)
    potential = FlatPotential(model, x, y)
    z = potential.initial(4, generator=torch.Generator().manual_seed(1))
    energy, grad = potential.value_and_grad(z)
    c_energy, c_grad = torch.compile(potential.value_and_grad_functional, dynamic=False)(z)
    # float32 sums of ~1e4-sized energies: agreement to a few float32 ULP of the terms
    torch.testing.assert_close(c_energy, energy, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(c_grad, grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item())

    # under torch.compile, tanh_for (what the network's Tanh layers call) is the rational form, not SLEEF's
    def hidden(h):
        return tanh_for(h)

    h = torch.linspace(-5, 5, 10001)
    got = torch.compile(hidden, dynamic=False)(h)
    torch.testing.assert_close(got, rational_tanh(h), rtol=0, atol=2e-7)
    assert not torch.equal(got, torch.tanh(h))
