"""Memory budgets: full-data and full-test-set computations in chunks that give the one-pass
numbers, and chunks asked for that cannot fit refused by name."""

import math

import pytest
import torch
from torch import nn

import pyrobnn
from pyrobnn.utils import memory
from pyrobnn.infer.core.curvature import largest_curvature
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.testing import ConvNet, TensorMemory, build_case


def test_the_budget_comes_from_the_setting_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("PYROBNN_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 << 30)
    assert memory.budget() == memory.DEFAULT_BUDGET
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 30)
    assert memory.budget() == (1 << 30) // 4
    monkeypatch.setenv("PYROBNN_MEMORY_BUDGET", "1.5GB")
    assert memory.budget() == int(1.5 * (1 << 30))
    with memory.limit(12345):
        assert memory.budget() == 12345
    assert memory.budget() == int(1.5 * (1 << 30))
    monkeypatch.setenv("PYROBNN_MEMORY_BUDGET", "lots")
    with pytest.raises(ValueError, match="PYROBNN_MEMORY_BUDGET must be a size"):
        memory.budget()
    with pytest.raises(ValueError, match="memory budget must be a positive number of bytes"):
        memory.set_budget(-1)


def test_activation_bytes_count_every_module_output():
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    # the input, the two linear outputs and the tanh: (3 + 5 + 5 + 2) float32 numbers
    assert memory.activation_bytes(net, torch.randn(7, 3)) == (3 + 5 + 5 + 2) * 4
    assert memory.points_per_chunk(1000, rows=4, per_point=100, factor=2) == 1000
    with memory.limit(4 * 100 * 2 * 10):
        assert memory.points_per_chunk(1000, rows=4, per_point=100, factor=2) == 10


def test_a_predictive_in_chunks_gives_the_one_pass_predictive():
    model, x, y, _, _ = build_case("cnn")
    vi = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model, init_scale=0.1), x, y, epochs=2, progress=False, seed=0)
    x_test = torch.randn(40, 1, 8, 8)
    whole = vi.predict(x_test, seed=0)
    with memory.limit(64 << 10):  # a few points per pass
        chunked = vi.predict(x_test, seed=0)
    # the same weight draws for every chunk of points: each draw is one function of the inputs
    assert torch.allclose(whole.sample_probs, chunked.sample_probs, atol=1e-6)


def test_a_chunk_asked_for_that_cannot_fit_is_refused_naming_its_arguments(monkeypatch):
    model, x, y, x_test, _ = build_case("cnn")
    vi = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=1, progress=False)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 16)
    with pytest.raises(memory.MemoryBudgetError, match="lower batch_size or sample_batch_size"):
        vi.predict(x_test, 500, batch_size=len(x_test))
    vi.predict(x_test, 2)  # unset chunks are picked within the budget: no refusal


def test_the_full_data_potential_in_chunks_gives_the_one_pass_value_and_gradient():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(ConvNet().double(), pyrobnn.CategoricalLikelihood())
    x = torch.randn(60, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 3, (60,))
    z = FlatPotential(model).initial(3, 0.3, torch.Generator().manual_seed(1))
    whole = FlatPotential(model, x, y)
    value, grad = whole.value_and_grad(z)
    with memory.limit(32 << 10):
        chunked = FlatPotential(model, x, y)
        assert len(chunked.chunks(3)) > 4
        value_c, grad_c = chunked.value_and_grad(z)
        value_f, grad_f = chunked.value_and_grad_functional(z)
        energy = chunked(z)
    for v, g in ((value_c, grad_c), (value_f, grad_f)):
        assert torch.allclose(v, value, rtol=1e-12) and torch.allclose(g, grad, rtol=1e-10, atol=1e-10)
    assert torch.allclose(energy, value, rtol=1e-12)


def test_the_curvature_in_chunks_and_on_a_subset():
    torch.manual_seed(0)
    n = 4000
    x = torch.randn(n, 3, dtype=torch.float64) * torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64)  # well-separated eigenvalues
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.1 * torch.randn(n, 1, dtype=torch.float64)
    # a noise scale exact in float32 (the likelihood keeps a fixed scale as a float32 buffer)
    model = pyrobnn.BayesianModel(nn.Linear(3, 1, bias=False).double(), pyrobnn.GaussianLikelihood(0.125), pyrobnn.NormalPrior(1.0))
    potential = FlatPotential(model, x, y)
    z = torch.zeros(1, 3, dtype=torch.float64)
    # Bayesian linear regression: the Hessian is X^T X / sigma^2 + I
    exact = float(torch.linalg.eigvalsh(x.T @ x / 0.125**2 + torch.eye(3, dtype=torch.float64)).max())
    full = largest_curvature(potential, z, points=None, rtol=0.0)
    with memory.limit(16 << 10):
        chunked = largest_curvature(potential, z, points=None, rtol=0.0)
    assert full.item() == pytest.approx(exact, rel=1e-8) and chunked.item() == pytest.approx(exact, rel=1e-8)
    # on 1000 of the 4000 points, scaled by 4: the top eigenvalue is about 4 sum_S x_1^2 / sigma^2, whose
    # relative standard error is sqrt(2 / 1000) for a normal first input
    subset = largest_curvature(potential, z, points=1000, generator=torch.Generator().manual_seed(0), rtol=0.0)
    assert subset.item() == pytest.approx(exact, rel=5 * math.sqrt(2 / 1000))
    # the default stopping rule: within its tolerance of the converged value
    assert largest_curvature(potential, z, points=None).item() == pytest.approx(exact, rel=1e-2)


def test_fitting_with_default_arguments_takes_the_batch_the_budget_allows():
    model, x, y, _, _ = build_case("cnn")
    with memory.limit(64 << 10):
        vi = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=1, progress=False)
    assert vi.settings["batch_size"] < x.shape[0]
    assert pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=1, progress=False).settings["batch_size"] == x.shape[0]


def test_peak_tensor_memory_of_the_full_data_gradient_grows_with_the_chunk():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(ConvNet(), pyrobnn.CategoricalLikelihood())
    x, y = torch.randn(384, 1, 8, 8), torch.randint(0, 3, (384,))
    z = FlatPotential(model).initial(2, 0.3, torch.Generator().manual_seed(1))
    peaks = []
    for limit in (1 << 30, 64 << 10):
        with memory.limit(limit):
            potential = FlatPotential(model, x, y)
            with TensorMemory() as used:
                potential.value_and_grad(z)
        peaks.append(used.peak)
    assert peaks[1] < peaks[0] / 3
