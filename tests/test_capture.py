"""The SVI step recorded once and replayed (pyrobnn.infer.svi.capture).

On a machine without CUDA the recording is exercised with a stand-in graph that records the
step's function and replays it by calling it again (``ReplayingGraph`` in ``conftest.py``): the
fixed buffers, the learning rate held as a tensor, the failure record written in place and the
eager short batch then run as on CUDA, and the parameters must equal those of the eager step. The step's traced part must also
compile with ``fullgraph=True`` (no graph break, so no host synchronization, in the weight noise,
forward pass and ELBO). On CUDA the real graph is compared with the eager step.
"""

import contextlib

import pytest
import torch

import pyrobnn
from pyrobnn.infer.core import graphs
from pyrobnn.infer.core.failures import InvalidBatchError
from pyrobnn.infer.svi import capture
from pyrobnn.infer.svi import trainer as trainer_module


def problem(device="cpu", n=70):
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 2, hidden=(16,), activation="tanh"), pyrobnn.GaussianLikelihood(0.3), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model, init_scale=0.05)
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(n, 3, generator=g, device="cpu")
    y = torch.cat([x[:, :1].sin(), x[:, 1:2].cos()], 1)
    return model.to(device), guide.to(device), x.to(device), y.to(device)


def parameters(guide):
    return torch.cat([p.detach().reshape(-1) for p in guide.parameters()])


@pytest.fixture
def recorded_on_cpu(monkeypatch, replaying_graphs):
    """The recorded step on the CPU: the device rule lifted and the stand-in graph used."""
    monkeypatch.setattr(trainer_module, "capture_refusal", lambda trainer, device: None if trainer.capture else "capture=False")
    return replaying_graphs


def test_on_the_cpu_the_step_is_not_recorded_and_says_why():
    model, guide, x, y = problem()
    vi = pyrobnn.fit(model, guide, x, y, epochs=1, batch_size=32, progress=False)
    assert vi.settings["capture"] == "not recorded: CUDA graphs need a CUDA device; the model is on cpu"
    assert "\n  the step: not recorded: CUDA graphs need a CUDA device; the model is on cpu\n" in vi.summary()
    # what would refuse it on a CUDA device
    cuda = torch.device("cuda")
    assert capture.capture_refusal(pyrobnn.SVITrainer(model, guide), cuda) is None
    assert "Pyro's traces" in capture.capture_refusal(pyrobnn.SVITrainer(model, guide, elbo="trace", num_particles=2), cuda)
    assert "user's optimizer" in capture.capture_refusal(pyrobnn.SVITrainer(model, guide, optimizer=lambda p: torch.optim.SGD(p, lr=0.1)), cuda)
    assert capture.capture_refusal(pyrobnn.SVITrainer(model, guide, capture=False), cuda) == "capture=False"


def test_a_recorded_step_trains_as_the_eager_one(recorded_on_cpu):
    # 70 points in batches of 32: two recorded-shape batches and a short one each epoch; a
    # schedule and KL annealing change the rate and the KL weight at every step
    options = dict(epochs=4, batch_size=32, lr=1e-2, seed=3, progress=False, lr_schedule=lambda t: 1.0 / (1.0 + t), kl_annealing=(0, 2))
    runs = {}
    for capture_it in (False, True):
        model, guide, x, y = problem()
        vi = pyrobnn.fit(model, guide, x, y, capture=capture_it, **options)
        runs[capture_it] = (parameters(guide), vi.history)
    graph = recorded_on_cpu[0]
    # 4 epochs x 2 full batches = 8 steps of the recorded shape: 3 warm-up steps, then replays
    assert graph.replays == 8 - graphs.WARMUP_CALLS
    # the same arithmetic in the same order; the rate is a float32 tensor in the recorded step
    # and a Python float in the eager one, which differ by at most 3e-8 relatively: Adam's steps
    # then differ by that relative amount: 3e-8 at most here (measured), after 16 steps of 1e-2
    assert torch.allclose(runs[True][0], runs[False][0], rtol=0, atol=1e-6)
    assert runs[True][1].loss == pytest.approx(runs[False][1].loss, rel=1e-5)


def test_a_bad_batch_in_a_recorded_step_is_refused_and_the_parameters_kept(recorded_on_cpu):
    model, guide, x, y = problem()
    trainer = pyrobnn.SVITrainer(model, guide, lr=1e-2)
    for _ in range(graphs.WARMUP_CALLS + 2):  # warm-up, recording and one replay
        trainer.step(x[:32], y[:32], dataset_size=70)
    assert recorded_on_cpu[0].replays == 2
    before = parameters(guide).clone()
    bad = x[:32].clone()
    bad[5, 1] = float("nan")
    with pytest.raises(InvalidBatchError, match="step 5 .*x holds NaN"):
        trainer.step(bad, y[:32], dataset_size=70)
    assert recorded_on_cpu[0].replays == 3
    assert torch.equal(parameters(guide), before)
    trainer.step(x[:32], y[:32], dataset_size=70)  # the record was cleared in place: training goes on
    assert recorded_on_cpu[0].replays == 4 and not torch.equal(parameters(guide), before)


def test_the_step_compiles_whole_with_fullgraph():
    # weight noise, forward pass, ELBO and the loss's finiteness flag in one graph: a host
    # synchronization (a .item(), a branch on a value) would break it, and fullgraph refuses breaks
    model, guide, x, y = problem()
    trainer = pyrobnn.SVITrainer(model, guide, lr=1e-2)
    trainer.step(x, y)

    def loss_and_flag(x, y, kl_weight):
        loss, nll, kl = trainer.objective(x, y, 70, kl_weight)
        return loss, ~torch.isfinite(loss.detach()), nll, kl

    compiled = torch.compile(loss_and_flag, fullgraph=True, dynamic=False)
    eager_loss = loss_and_flag(x, y, torch.tensor(0.5))[0]
    loss, bad, _, _ = compiled(x, y, torch.tensor(0.5))
    loss.backward()
    assert not bool(bad)
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in guide.parameters())
    # a different weight draw, so the same order of magnitude only
    assert 0.1 < float(loss.detach()) / float(eager_loss.detach()) < 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA graph itself is checked on a GPU machine (benchmarks/gpu_check.sh)")
def test_on_cuda_the_recorded_step_trains_as_the_eager_one():
    options = dict(epochs=4, batch_size=32, lr=1e-2, seed=3, progress=False)
    runs = {}
    for capture_it in (False, True):
        model, guide, x, y = problem("cuda")
        vi = pyrobnn.fit(model, guide, x, y, capture=capture_it, **options)
        runs[capture_it] = parameters(guide)
        assert vi.settings["capture"] == ("recorded as a CUDA graph" if capture_it else "not recorded: capture=False")
    # the graph draws its weight noise from the generator's graph-safe offsets, the stream the
    # eager steps draw; the rest is the same arithmetic (the tolerance as on the CPU)
    assert torch.allclose(runs[True], runs[False], rtol=0, atol=1e-5)


def test_a_step_that_cannot_be_recorded_runs_eagerly_and_says_why(recorded_on_cpu, monkeypatch):
    class Refusing:
        def __init__(self, device):
            self.warm_up = contextlib.nullcontext

        def record(self, body):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(capture, "CUDAGraph", Refusing)
    model, guide, x, y = problem()
    trainer = pyrobnn.SVITrainer(model, guide, lr=1e-2)
    for _ in range(graphs.WARMUP_CALLS + 3):
        trainer.step(x[:32], y[:32], dataset_size=70)
    assert trainer.capture_status == "not recorded: recording it failed (RuntimeError: operation not permitted when stream is capturing)"
    assert trainer.history.steps == graphs.WARMUP_CALLS + 3 and bool(torch.isfinite(parameters(guide)).all())
