"""Device placement: the guide must sit with the model, and on CUDA (when present) fit,
predict, resume and the samplers give the CPU's numbers without a host sync per step."""

import warnings

import pytest
import torch

import pyrobnn
from pyrobnn.infer import SVITrainer
from test_training import mlp_model, regression_data

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the GPU path is tested where one is present")


def test_a_guide_left_behind_by_model_to_is_refused_by_name():
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = regression_data()
    model.double()  # moves the model only
    for call in (
        lambda: SVITrainer(model, guide),
        lambda: pyrobnn.predict(model, guide, x.double(), num_samples=2),
        lambda: guide(x.double(), y.double()),
    ):
        with pytest.raises(ValueError, match="guide's parameters are torch.float32 on cpu but the model's weights are torch.float64"):
            call()
    guide.double()
    pyrobnn.predict(model, guide, x.double(), num_samples=2)


def deterministic_fit(device, epochs=30):
    """Mean-field VI whose posterior scales are ~1e-40: the weight noise is below float64
    rounding, so CPU and GPU runs compute the same function and must agree to rounding."""
    torch.manual_seed(0)
    model = mlp_model().double()
    guide = pyrobnn.MeanFieldNormal(model, init_scale=1e-40)
    model.to(device), guide.to(device)
    x, y = regression_data()
    history = pyrobnn.fit(model, guide, x.double(), y.double(), epochs=epochs, batch_size=16, lr=0.01, elbo="meanfield", progress=False, seed=0).history
    return model, guide, history


@cuda
def test_fit_and_predict_on_cuda_equal_the_cpu_run():
    cpu_model, cpu_guide, cpu_history = deterministic_fit("cpu")
    gpu_model, gpu_guide, gpu_history = deterministic_fit("cuda")
    assert gpu_history.loss == pytest.approx(cpu_history.loss, rel=1e-9)
    for a, b in zip(cpu_guide.parameters(), gpu_guide.parameters()):
        assert b.device.type == "cuda"
        torch.testing.assert_close(b.cpu(), a, rtol=1e-9, atol=1e-12)
    x, _ = regression_data()
    p_cpu = pyrobnn.predict(cpu_model, cpu_guide, x.double(), method="mean")
    p_gpu = pyrobnn.predict(gpu_model, gpu_guide, x.double(), method="mean")
    torch.testing.assert_close(p_gpu.mean.cpu(), p_cpu.mean, rtol=1e-9, atol=1e-12)


@cuda
def test_resume_on_cuda_repeats_the_uninterrupted_run_exactly(tmp_path):
    x, y = regression_data()

    def run(epochs, checkpoint=None):
        torch.manual_seed(0)
        model = mlp_model().cuda()
        guide = pyrobnn.MeanFieldNormal(model, init_scale=0.05).cuda()
        pyrobnn.fit(model, guide, x, y, epochs=epochs, batch_size=16, lr=0.01, progress=False, seed=0, checkpoint=checkpoint, resume=True)
        return guide

    straight = run(6)
    run(3, tmp_path / "c.pt")
    resumed = run(6, tmp_path / "c.pt")  # the weight noise is drawn on the GPU: its generator is restored
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))


@cuda
def test_fit_does_not_synchronize_per_step_on_cuda():
    x, y = regression_data()
    model = mlp_model().cuda()
    guide = pyrobnn.MeanFieldNormal(model).cuda()
    trainer = SVITrainer(model, guide, lr=0.01)
    trainer.fit(x, y, epochs=1, batch_size=4, progress=False, seed=0)  # set-up and first-use syncs

    def syncs(batch_size):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer.fit(x, y, epochs=trainer.epoch + 2, batch_size=batch_size, progress=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    assert syncs(4) == syncs(64)  # 16 steps per epoch or 1: the same syncs


@cuda
@pytest.mark.parametrize("method", ["nuts", "mclmc", "deep_ensemble", "laplace", "swag", "sgld", "smile"])
def test_samplers_and_baselines_run_on_cuda_and_return_draws_there(method):
    x, y = regression_data()
    model = mlp_model().cuda()
    x, y = x.cuda(), y.cuda()
    if method == "nuts":
        result = pyrobnn.infer.mcmc.samplers.nuts(model, x, y, num_samples=20, num_warmup=20, num_chains=2, progress=False)
    elif method == "mclmc":
        result = pyrobnn.infer.mcmc.samplers.mclmc(model, x, y, num_samples=100, num_warmup=(100, 50, 50), num_chains=2, progress=False)
    elif method == "deep_ensemble":
        result = pyrobnn.deep_ensemble(model, x, y, num_members=3, max_epochs=5, progress=False)
    elif method == "laplace":
        result = pyrobnn.laplace(model, x, y, hessian="diag", num_samples=10, map_options={"max_epochs": 5, "progress": False})
    elif method == "swag":
        result = pyrobnn.swag(model, x, y, num_epochs=3, num_samples=10, map_options={"max_epochs": 5}, progress=False)
    elif method == "sgld":
        result = pyrobnn.sgld(model, x, y, num_steps=50, num_chains=2, progress=False)
    else:
        result = pyrobnn.smile(model, x, y, num_samples=20, num_warmup=20, batch_size=16, num_chains=2, progress=False)
    draws = result.flat_samples()
    assert all(v.device.type == "cuda" and torch.isfinite(v).all() for v in draws.values())
    pred = pyrobnn.predict(model, result, x, num_samples=None)
    assert pred.mean.device.type == "cuda" and torch.isfinite(pred.mean).all()


@cuda
@pytest.mark.parametrize("kernel", ["mclmc", "nuts", "smile"])
def test_steps_recorded_as_cuda_graphs_draw_as_the_eager_ones_on_cuda(kernel, monkeypatch):
    """MCLMC's step, each NUTS leaf and SMILE's step recorded once and replayed on CUDA, against
    the same run with nothing recorded: the same kernels on the same inputs, so the same draws
    (to the last bits that a kernel's choice of algorithm may move)."""
    import functools
    import importlib

    from pyrobnn.infer.mcmc import mclmc_kernel, nuts_kernel
    from pyrobnn.infer.sgmcmc import smile_kernel

    x, y = regression_data()
    runs = []
    for graphs in (False, True):
        model = mlp_model().cuda()
        if kernel == "mclmc":
            monkeypatch.setattr(importlib.import_module("pyrobnn.infer.mcmc.samplers"), "MCLMC", functools.partial(mclmc_kernel.MCLMC, graphs=graphs))
            result = pyrobnn.mclmc(model, x.cuda(), y.cuda(), num_samples=50, num_warmup=(60, 20, 20), num_chains=3, thinning=1, backend="eager",
                                   progress=False)
        elif kernel == "nuts":
            monkeypatch.setattr(importlib.import_module("pyrobnn.infer.mcmc.samplers"), "NUTS",
                                functools.partial(nuts_kernel.NUTS, host_checks="few", graphs=graphs))
            result = pyrobnn.nuts(model, x.cuda(), y.cuda(), num_samples=20, num_warmup=20, num_chains=3, max_tree_depth=5, backend="eager",
                                  progress=False)
        else:
            monkeypatch.setattr(importlib.import_module("pyrobnn.infer.sgmcmc.smile"), "SMILE", functools.partial(smile_kernel.SMILE, graphs=graphs))
            result = pyrobnn.smile(model, x.cuda(), y.cuda(), num_samples=20, num_warmup=20, batch_size=16, num_chains=3, progress=False)
        runs.append(result.flat_samples())
    for k in runs[0]:
        torch.testing.assert_close(runs[1][k], runs[0][k], rtol=1e-5, atol=1e-6)
