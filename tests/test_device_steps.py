"""GPU checks that run without a GPU: every training step, prediction and sampler step runs on
the ``meta`` device, whose tensors have shapes, dtypes and a device but no values.

On the meta device a tensor made on the CPU and mixed into a step (``torch.zeros(n)`` where
``torch.zeros(n, device=z.device)`` was meant) raises "Tensor on device cpu is not on the
expected device meta", as it would against a CUDA tensor, and every host synchronization
(``.item()``, ``bool(tensor)``, ``if tensor:``, ``.tolist()``, ``float(tensor)``) raises "cannot be
called on meta tensors". So these tests fail on exactly the two mistakes that make a step wrong
or slow on a GPU. A CPU scalar (0-d) may mix with device tensors on both.

Why meta and not ``FakeTensorMode`` with fake CUDA tensors: on a machine with no CUDA driver the
autograd engine refuses a fake CUDA backward ("hasPrimaryContext expects a valid device index")
and a CUDA ``torch.Generator`` cannot be made, so nothing with a gradient could be checked.
What neither can check: a generator on the wrong device (a meta tensor accepts a CPU generator;
a CUDA one would not), and the kernels' speed.

Where a step needs data-dependent control flow, it is said below and the rest is tested:
- the NUTS transition decides on the host whether a trajectory doubles again (the U-turn and
  divergence tests), by design; its leaf (the potential's value and gradient) and its random
  draws are tested here, and the compiled path runs the loop inside ``torch.while_loop``;
- ``predict`` checks its inputs for NaN (the model checks each new input tensor once), and a
  trainer's first step traces the model and guide once to set itself up, which checks that
  batch; the tests record those checks instead of running them and assert that they are the
  only synchronizations: none in sampling, none in a steady-state step.
- a non-fused optimizer cannot skip a step on a device flag, so :class:`SVITrainer` then checks
  the step on the host; on a GPU the default optimizer is PyTorch's fused Adam, which takes the
  flag (``found_inf``). Fused kernels do not exist on the meta device, so the test stands in an
  SGD with the fused contract (below).
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.infer.mcmc.mclmc_kernel import mclmc_step
from pyrobnn.infer.mcmc.nuts_kernel import transition_uniforms
from pyrobnn.infer.core.minibatch import minibatch_log_joint_value_and_grad, per_row_minibatch_log_joint_value_and_grad
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.sgmcmc.kernels import sghmc_step, sgld_step
from pyrobnn.infer.sgmcmc.smile_kernel import SMILESettings, smile_init, smile_step
from pyrobnn.infer.svi.trainer import SVITrainer

META = torch.device("meta")


class FoundInfSGD(torch.optim.SGD):
    """SGD that honours ``found_inf`` on the device, as PyTorch's fused optimizers do (a step is
    skipped where the flag is set), so that :func:`~pyrobnn.infer.core.failures.skips_on_device`
    takes it and the trainer's step needs no host check."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.defaults["fused"] = True

    @torch.no_grad()
    def step(self):
        keep = 1.0 - self.found_inf
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(group["lr"] * keep * p.grad)


def regression(scale=0.1, hidden=(8,)):
    return pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=hidden), pyrobnn.GaussianLikelihood(scale=scale), pyrobnn.NormalPrior(1.0))


def classifier():
    return pyrobnn.BayesianModel(pyrobnn.MLP(3, 4, hidden=(8,)), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))


def data(kind):
    x = torch.randn(16, 3, device=META)
    y = torch.randn(16, 1, device=META) if kind == "regression" else torch.randint(0, 4, (16,), device=META)
    return x, y


GUIDES = {
    "meanfield": pyrobnn.MeanFieldNormal,
    "variational_dropout": pyrobnn.VariationalDropout,
    "sparse_vd": pyrobnn.SparseVariationalDropout,
    "mc_dropout": pyrobnn.MCDropout,
    "concrete_dropout": pyrobnn.ConcreteDropout,
}


@pytest.mark.parametrize("kind", ["regression", "classification"])
@pytest.mark.parametrize("guide_name,estimator", [
    ("meanfield", None), ("meanfield", "local"), ("meanfield", "flipout"),
    ("variational_dropout", None), ("variational_dropout", "local"), ("sparse_vd", "local"),
    ("mc_dropout", None), ("concrete_dropout", None),
])
def test_training_step_stays_on_the_device(kind, guide_name, estimator):
    model = regression() if kind == "regression" else classifier()
    guide = GUIDES[guide_name](model)
    trainer = SVITrainer(model, guide, lr=1e-3, estimator=estimator, optimizer=lambda params: FoundInfSGD(params, lr=1e-3))
    model.to(META)
    guide.to(META)
    x, y = data(kind)
    for _ in range(2):  # the first step sets the trainer up; the second is the steady state
        loss, nll, kl, _ = trainer._step_tensors(x, y, 160, 0.5)
    assert loss.device == nll.device == kl.device == META
    assert all(p.device == META for p in guide.parameters())


def recorded_input_checks(monkeypatch):
    """Replace the NaN checks of inputs (a host synchronization each) by a record of them."""
    import pyrobnn.infer.results.predictive as predictive
    import pyrobnn.utils.validation as validation

    checked = []
    monkeypatch.setattr(validation, "check_finite", lambda t, name: checked.append(name))
    monkeypatch.setattr(predictive, "check_finite", lambda t, name: checked.append(name))
    return checked


def test_training_step_with_a_latent_noise_scale_stays_on_the_device(monkeypatch):
    model = regression(scale=dist.LogNormal(-2.0, 1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    trainer = SVITrainer(model, guide, lr=1e-3, optimizer=lambda params: FoundInfSGD(params, lr=1e-3))
    model.to(META)
    guide.to(META)
    x, y = data("regression")
    checked = recorded_input_checks(monkeypatch)
    trainer._step_tensors(x, y, 16, 0.0)
    assert set(checked) <= {"x", "y"}  # the set-up trace of the first batch
    checked.clear()
    loss, *_ = trainer._step_tensors(x[:8], y[:8], 16, 0.0)
    assert loss.device == META and checked == []


@pytest.mark.parametrize("kind", ["regression", "classification"])
def test_predict_synchronizes_only_to_check_its_inputs(kind, monkeypatch):
    model = regression() if kind == "regression" else classifier()
    guide = pyrobnn.MeanFieldNormal(model)
    model.to(META)
    guide.to(META)
    x, _ = data(kind)
    checked = recorded_input_checks(monkeypatch)
    pred = pyrobnn.predict(model, guide, x, num_samples=4, seed=0)
    assert checked and set(checked) == {"x"}
    out = pred.mean if kind == "regression" else pred.probs
    assert out.device == META and out.shape[0] == 16


def potential_on_meta(scale=dist.LogNormal(-2.0, 1.0)):
    model = regression(scale=scale)
    model.to(META)
    x, y = data("regression")
    return FlatPotential(model, x, y), x, y


def test_potential_and_minibatch_gradients_stay_on_the_device():
    # the samplers run with validation off (the runner's pyro.validation_enabled(False)): a support
    # check is a host synchronization per evaluation
    with pyro.validation_enabled(False):
        potential, x, y = potential_on_meta()
        z = torch.randn(4, potential.dim, device=META)
        energy, grad = potential.value_and_grad(z)
        assert energy.shape == (4,) and grad.shape == (4, potential.dim) and grad.device == META
        value, grad = minibatch_log_joint_value_and_grad(potential, z, x[:8], y[:8], 16)
        assert value.device == grad.device == META
        xb, yb = x[:8].expand(4, 8, 3), y[:8].expand(4, 8, 1)
        value, grad = per_row_minibatch_log_joint_value_and_grad(potential, z, xb, yb, 16)
        assert grad.shape == (4, potential.dim) and grad.device == META


def test_nuts_draws_its_uniforms_on_the_device():
    u = transition_uniforms(4, 10, dtype=torch.float32, device=META)
    tensors = u.values() if isinstance(u, dict) else (u if isinstance(u, (tuple, list)) else [u])
    assert all(t.device == META for t in tensors)


def test_mclmc_step_stays_on_the_device():
    with pyro.validation_enabled(False):
        potential, _, _ = potential_on_meta()
        chains, dim = 4, potential.dim
        z = torch.randn(chains, dim, device=META)
        energy, grad = potential.value_and_grad(z)
        u = torch.randn(chains, dim, device=META)
        step, L = torch.full((chains,), 0.1, device=META), torch.full((chains,), 1.0, device=META)
        out = mclmc_step(potential.value_and_grad, z, u, energy, grad, step, L, torch.ones(dim, device=META), torch.randn(2, chains, dim, device=META))
        assert all(t.device == META for t in out)


@pytest.mark.parametrize("precondition,tune,L", [(True, False, None), (False, True, None), (True, True, 1.0)])
def test_smile_step_stays_on_the_device(precondition, tune, L):
    with pyro.validation_enabled(False):
        potential, x, y = potential_on_meta()
        chains = 4

        def log_density_and_grad(z):
            return minibatch_log_joint_value_and_grad(potential, z, x[:8], y[:8], 16)

        state = smile_init(torch.randn(chains, potential.dim, device=META), log_density_and_grad, 1e-3)
        settings = SMILESettings(precondition=precondition, tune=tune, L=L)
        for warmup in (True, False):
            state, change, reset, finite = smile_step(state, log_density_and_grad, settings, warmup, torch.randn(chains, potential.dim, device=META))
        assert all(t.device == META for t in (state.z, state.u, state.step_size, change, reset, finite))


def test_sgld_and_sghmc_steps_stay_on_the_device():
    z = torch.randn(4, 10, device=META)
    grad = torch.randn(4, 10, device=META)
    assert sgld_step(z, grad, 1e-3, torch.randn(4, 10, device=META)).device == META
    z2, v2 = sghmc_step(z, torch.zeros_like(z), grad, 1e-3, 0.1, torch.randn(4, 10, device=META))
    assert z2.device == v2.device == META


def test_a_cpu_tensor_in_a_step_fails_here():
    """The check itself: a step that makes a tensor on the CPU fails on the meta device."""
    z = torch.randn(4, 10, device=META)
    with pytest.raises(RuntimeError, match="device"):
        z + torch.randn(4, 10)
    with pytest.raises(RuntimeError, match="meta"):
        bool(z.sum() > 0)
