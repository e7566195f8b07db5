"""The last bad inputs: numpy arrays given to Pyro's own SVI and Predictive, a DataLoader that
yields something other than (x, y) pairs, and a learning rate whose update overflows. Each is
answered by name, and nothing is left half-changed."""

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from torch.utils.data import DataLoader, Dataset, TensorDataset

import pyrobnn
from fault_cases import data, model
from pyrobnn.infer.core.failures import NonFiniteLossError


@pytest.mark.fault(
    fault="numpy arrays (float64, float32) given to Pyro's own SVI.step and Predictive with our model and guide",
    survives="the same rule as fit: a floating array becomes a tensor of the model's dtype; the step and the prediction agree with the tensor call",
    bound="-",
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pyro_svi_and_predictive_take_numpy_as_fit_does(dtype):
    x, y = data()
    xs, ys = x.numpy().astype(dtype), y.numpy().astype(dtype)
    results = []
    for xi, yi in ((x, y), (xs, ys)):
        pyro.clear_param_store()
        m = model()
        guide = pyrobnn.MeanFieldNormal(m)
        svi = SVI(m, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
        pyro.set_rng_seed(0)
        losses = [svi.step(xi, yi) for _ in range(3)]
        pyro.set_rng_seed(1)
        predicted = Predictive(m, guide=guide, num_samples=4)(xi)["obs"]
        results.append((losses, predicted))
    (l1, p1), (l2, p2) = results
    assert p2.dtype == torch.float32 and p2.shape == p1.shape == (4, 32, 1)
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="x must be a torch.Tensor or numpy array, got list"):
        svi.step(x.tolist(), y)


class Dicts(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


@pytest.mark.fault(
    fault="a DataLoader yielding dicts, or (x, y, w) triples, given to fit and to the Lightning SVIModule",
    survives="the guide untouched; an error saying what a loader must yield and what this one yielded",
    bound="-",
)
@pytest.mark.parametrize("kind", ["dicts", "triples"])
@pytest.mark.parametrize("where", ["fit", "lightning"])
def test_a_loader_of_the_wrong_items_is_answered_by_name(kind, where, tmp_path):
    x, y = data()
    loader = DataLoader(Dicts(x, y) if kind == "dicts" else TensorDataset(x, y, torch.ones_like(y)), batch_size=8)
    got = "a dict with keys \\['x', 'y'\\]" if kind == "dicts" else "a list of 3 items"
    m = model()
    guide = pyrobnn.MeanFieldNormal(m)
    guide(x)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    if where == "fit":
        with pytest.raises(ValueError, match=f"a DataLoader for fit must yield \\(x, y\\) pairs .* it yielded {got}"):
            pyrobnn.fit(m, guide, loader=loader, epochs=1, progress=False)
    else:
        import lightning as L

        from pyrobnn.integrations.lightning import SVIModule

        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        with pytest.raises(ValueError, match=f"a DataLoader for SVIModule must yield \\(x, y\\) pairs .* it yielded {got}"):
            trainer.fit(SVIModule(m, guide), loader)
    for n, p in guide.named_parameters():
        assert torch.equal(p, before[n]), n


@pytest.mark.fault(
    fault="fit(lr=1e39): finite, but the first float32 update overflows",
    survives="the parameters from before the overflowing update, bit for bit (it is undone); a NonFiniteLossError saying so",
    bound="-",
)
@pytest.mark.parametrize("path", ["host read (CPU)", "on the device (accelerators)"])
def test_an_overflowing_learning_rate_leaves_the_last_finite_parameters(path, monkeypatch):
    from pyrobnn.infer.core.failures import OverflowGuard

    if path != "host read (CPU)":
        monkeypatch.setattr(OverflowGuard, "HOST_READ_DEVICES", ())
    x, y = data()
    m = model()
    guide = pyrobnn.MeanFieldNormal(m)
    pyrobnn.fit(m, guide, x, y, epochs=2, progress=False, seed=0)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="made the parameters non-finite \\(it overflowed\\) and was undone"):
        pyrobnn.fit(m, guide, x, y, epochs=3, lr=1e39, progress=False)
    for n, p in guide.named_parameters():
        assert torch.equal(p, before[n]), n
