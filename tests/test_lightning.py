"""SVI under PyTorch Lightning: one process against our own loop, two processes (DDP over
gloo) against one process seeing the union of their batches."""

import functools

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pyrobnn
from pyrobnn.infer import SVITrainer
from pyrobnn.infer.core.starts import member_initializations
from pyrobnn.integrations.lightning import EndProcessGroup, EnsembleModule, SVIModule
from pyrobnn.infer.svi.objective import trainable_parameters
from pyrobnn.infer.core.potential import FlatPotential
from test_training import regression_data

N, PER_RANK_BATCH, EPOCHS = 64, 8, 2


def near_deterministic_bnn():
    """Mean-field VI whose posterior scales are ~1e-40 with the registered KL: the weight noise
    is below float64 rounding, so two runs that see the same data compute the same updates."""
    torch.manual_seed(0)
    net = pyrobnn.MLP(1, 1, hidden=(16,), activation="tanh").double()
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale="learned"), pyrobnn.NormalPrior(1.0))
    return model, pyrobnn.MeanFieldNormal(model, init_scale=1e-40)


def data():
    x, y = regression_data(N)
    return x.double(), y.double()


# SGD, not Adam: Adam's step does not depend on the gradient's overall scale, so it would
# hide a likelihood or a KL counted the wrong number of times
SGD = functools.partial(torch.optim.SGD, lr=2e-4)


def lightning_trainer(tmp_path, **kwargs):
    return L.Trainer(
        accelerator="cpu", max_epochs=EPOCHS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, **kwargs,
    )


def union_batches():
    """Per epoch, the union of the two ranks' batches as Lightning deals them (a shuffled
    DistributedSampler, seed 0, reseeded per epoch)."""
    samplers = [DistributedSampler(range(N), num_replicas=2, rank=r, shuffle=True, seed=0) for r in range(2)]
    for e in range(EPOCHS):
        for sampler in samplers:
            sampler.set_epoch(e)
        rank_indices = [list(sampler) for sampler in samplers]
        yield [
            torch.tensor(rank_indices[0][k : k + PER_RANK_BATCH] + rank_indices[1][k : k + PER_RANK_BATCH])
            for k in range(0, N // 2, PER_RANK_BATCH)
        ]


def union_reference():
    """One process, our own loop, each step on the union of what the two ranks see."""
    model, guide = near_deterministic_bnn()
    x, y = data()
    trainer = SVITrainer(model, guide, elbo="meanfield", optimizer=SGD)
    losses = []
    for epoch in union_batches():
        values = [trainer.step(x[idx], y[idx], dataset_size=N)[0] for idx in epoch]
        losses.append(sum(values) / len(values))
    return guide, model, losses


@pytest.mark.slow  # 18 s: two spawned DDP ranks (the default run keeps the one-process Lightning tests)
def test_two_ddp_processes_equal_one_process_on_the_union_of_their_batches(tmp_path):
    guide_ref, model_ref, ref_losses = union_reference()
    model, guide = near_deterministic_bnn()
    module = SVIModule(model, guide, elbo="meanfield", optimizer=SGD)
    x, y = data()
    trainer = lightning_trainer(tmp_path, devices=2, strategy="ddp_spawn", callbacks=[EndProcessGroup()])
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=PER_RANK_BATCH))
    for a, b in zip(guide.parameters(), guide_ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for (_, a), (_, b) in zip(model.point_parameters(), model_ref.point_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the logged loss of the last epoch, averaged over both ranks, is the union's: same scale
    assert float(trainer.callback_metrics["loss"]) == pytest.approx(ref_losses[-1], rel=1e-9)
    assert all(p.requires_grad for p in model.net.parameters())  # the random weights were given back their flag


def test_one_lightning_process_equals_our_fit_loop(tmp_path):
    x, y = data()
    model_ref, guide_ref = near_deterministic_bnn()
    trainer = SVITrainer(model_ref, guide_ref, elbo="meanfield", optimizer=SGD)
    for _ in range(EPOCHS):
        for k in range(0, N, 16):
            trainer.step(x[k : k + 16], y[k : k + 16], dataset_size=N)
    model, guide = near_deterministic_bnn()
    lightning_trainer(tmp_path, devices=1).fit(SVIModule(model, guide, elbo="meanfield", optimizer=SGD), DataLoader(TensorDataset(x, y), batch_size=16))
    for a, b in zip(guide.parameters(), guide_ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_lightning_checkpoint_restores_model_and_guide(tmp_path):
    x, y = regression_data(N)
    model, guide = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale="learned")), None
    guide = pyrobnn.MeanFieldNormal(model)
    trainer = lightning_trainer(tmp_path, devices=1)
    trainer.fit(SVIModule(model, guide, lr=1e-2), DataLoader(TensorDataset(x, y), batch_size=16))
    path = tmp_path / "svi.ckpt"
    trainer.save_checkpoint(path)
    fresh_model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale="learned"))
    fresh = SVIModule(fresh_model, pyrobnn.MeanFieldNormal(fresh_model))
    fresh.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    assert all(torch.equal(a, b) for a, b in zip(guide.parameters(), fresh.guide.parameters()))


def test_dataset_size_is_checked():
    model, guide = near_deterministic_bnn()
    with pytest.raises(ValueError, match="dataset_size must be a positive integer"):
        SVIModule(model, guide, dataset_size=0)


@pytest.mark.parametrize("make", [lambda m: SVIModule(m, pyrobnn.MeanFieldNormal(m)), lambda m: EnsembleModule(m, 2)], ids=["svi", "ensemble"])
def test_a_batch_of_the_wrong_width_is_refused_by_name(make, tmp_path):
    model = ensemble_model()
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x has shape \(8, 3\) but the network's first layer expects 1 features"):
        lightning_trainer(tmp_path, devices=1).fit(make(model), DataLoader(TensorDataset(x, y), batch_size=8))


def ensemble_model():
    torch.manual_seed(0)
    net = pyrobnn.MLP(1, 1, hidden=(16,), activation="tanh").double()
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.3), pyrobnn.NormalPrior(1.0))


@pytest.mark.slow  # 18 s: two spawned DDP ranks (the default run keeps the one-process Lightning tests)
def test_ensemble_members_under_two_ddp_processes_take_the_union_batchs_steps(tmp_path):
    """Three members, MAP objective: two gloo processes end where one process ends that takes
    every step on the union of the ranks' batches with deep_ensemble's loss."""
    x, y = data()
    model = ensemble_model()
    potential = FlatPotential(model)
    z = torch.nn.Parameter(member_initializations(model, potential, 3, seed=4))
    sgd = SGD([z])
    for epoch in union_batches():
        for idx in epoch:
            log_prior, log_lik = potential.log_joint_terms(z, x[idx], y[idx])
            loss = ((-(N / idx.numel()) * log_lik - log_prior) / N).sum()
            sgd.zero_grad()
            loss.backward()
            sgd.step()
    module = EnsembleModule(ensemble_model(), 3, seed=4, optimizer=SGD)
    start = module.members.detach().clone()
    trainer = lightning_trainer(tmp_path, devices=2, strategy="ddp_spawn", callbacks=[EndProcessGroup()])
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=PER_RANK_BATCH))
    assert not torch.allclose(start, module.members)
    torch.testing.assert_close(module.members.detach(), z.detach(), rtol=1e-10, atol=1e-12)
    result = module.result()
    assert result.num_chains == 3
    pred = pyrobnn.predict(module.model, result, x, num_samples=None)
    assert torch.isfinite(pred.mean).all()


def test_a_non_finite_step_under_lightning_is_skipped_and_reported_at_the_epoch_end(tmp_path):
    from pyrobnn.infer import NonFiniteLossError
    from test_training import model_that_breaks_after

    x, y = regression_data(N)
    _, model, guide = model_that_breaks_after(2)  # the third call, step 2, returns NaN
    module = SVIModule(model, guide, lr=1e-2)
    trainer = lightning_trainer(tmp_path, devices=1)
    with pytest.raises(NonFiniteLossError, match="the loss is nan at step 2 .*before step 2"):
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    optimizer = trainer.optimizers[0]
    assert all(int(optimizer.state[p]["step"]) == 2 for p in trainable_parameters(model, guide))
    assert all(torch.isfinite(p).all() for p in guide.parameters())


def test_ensemble_members_skip_a_non_finite_step_and_report_it(tmp_path):
    from pyrobnn.infer import NonFiniteLossError

    x, y = data()
    y = y.clone()
    y[20] = float("nan")  # in the second batch of 16
    module = EnsembleModule(ensemble_model(), 3, lr=1e-2)
    trainer = lightning_trainer(tmp_path, devices=1)
    with pytest.raises(NonFiniteLossError, match="the loss is nan at step 1 .*before step 1"):
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    assert int(trainer.optimizers[0].state[module.members]["step"]) == 1
    assert torch.isfinite(module.members).all()
