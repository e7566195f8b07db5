"""Bad input fails with a ValueError that names the problem."""

import numpy as np
import pyro
import pytest
import torch
from torch import nn

import pyrobnn


def regression():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=(4,)), pyrobnn.GaussianLikelihood())
    return model, pyrobnn.MeanFieldNormal(model)


def classifier():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 4, hidden=(4,)), pyrobnn.CategoricalLikelihood())
    return model, pyrobnn.MeanFieldNormal(model)


X = torch.randn(10, 3)
Y = torch.randn(10)
LABELS = torch.randint(0, 4, (10,))


def fit(model, guide, x, y):
    return pyrobnn.fit(model, guide, x, y, epochs=1, progress=False)


@pytest.mark.parametrize(
    "x,y,message",
    [
        (torch.randn(10, 5), Y, "expects 3 features"),
        (X, torch.randn(9), "x has 10 examples but y has shape"),
        (torch.where(torch.arange(30).reshape(10, 3) == 7, float("nan"), X), Y, "x contains NaN"),
        (X, torch.where(torch.arange(10) == 2, float("inf"), Y), "y contains infinite"),
        (torch.empty(0, 3), torch.empty(0), "x is empty"),
        (X.double(), Y, "dtype torch.float64 but the network's parameters are torch.float32"),
        (torch.ones(10, 3, dtype=torch.long), Y, "must be a floating-point tensor"),
        (X, torch.randn(10, 2), r"targets of shape \(10, 2\) do not match"),
        (X, torch.ones(10, dtype=torch.long), "must be floating point"),
        ([[1.0, 2.0, 3.0]], Y, "must be a torch.Tensor or numpy array"),
    ],
)
def test_regression_inputs(x, y, message):
    model, guide = regression()
    with pytest.raises(ValueError, match=message):
        fit(model, guide, x, y)


@pytest.mark.parametrize(
    "y,message",
    [
        (torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 0]), r"must lie in \[0, 4\)"),
        (torch.tensor([0, 1, 2, 3, -1, 0, 1, 2, 3, 0]), r"must lie in \[0, 4\)"),
        (LABELS.float(), "must be an integer tensor"),
        (LABELS.unsqueeze(-1), r"labels of shape \(10, 1\)"),
    ],
)
def test_classification_labels(y, message):
    model, guide = classifier()
    with pytest.raises(ValueError, match=message):
        fit(model, guide, X, y)


def test_numpy_inputs_are_accepted():
    model, guide = regression()
    fit(model, guide, X.numpy(), Y.numpy())


def test_numpy_float64_arrays_work_in_fit_and_in_pyros_own_svi_and_predictive():
    model, guide = regression()  # a float32 model: NumPy's float64 default is no choice of a dtype
    x, y = X.double().numpy(), Y.double().numpy()
    fit(model, guide, x, y)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    assert np.isfinite(svi.step(x, y))
    draws = pyro.infer.Predictive(model, guide=guide, num_samples=3, parallel=True)(x)
    assert draws["obs"].shape == (3, 10, 1) and draws["obs"].dtype == torch.float32
    labels_model, labels_guide = classifier()
    fit(labels_model, labels_guide, x, LABELS.numpy())
    with pytest.raises(ValueError, match="x must hold numbers, got a numpy array of dtype object"):
        fit(model, guide, np.array([["a"] * 3] * 10, dtype=object), y)
    with pytest.raises(ValueError, match="x has dtype torch.float64 but the network's parameters are torch.float32"):
        fit(model, guide, X.double(), Y)  # a tensor's dtype is the user's choice: refused, not converted


@pytest.mark.parametrize("dataset,yielded", [
    (lambda x, y: [{"x": a, "y": b} for a, b in zip(x, y)], r"it yielded a dict with keys \['x', 'y'\]"),
    (lambda x, y: torch.utils.data.TensorDataset(x, y, torch.ones(len(x))), "it yielded a list of 3 items"),
    (lambda x, y: x, "it yielded a Tensor"),
])
def test_a_loader_that_does_not_yield_pairs_is_told_what_to_yield(dataset, yielded):
    model, guide = regression()
    loader = torch.utils.data.DataLoader(dataset(X, Y), batch_size=5)
    with pytest.raises(ValueError, match=r"a DataLoader for fit must yield \(x, y\) pairs .*" + yielded):
        pyrobnn.fit(model, guide, loader=loader, epochs=1, progress=False)


def test_direct_pyro_use_never_broadcasts_targets():
    model, guide = regression()
    elbo = pyro.infer.Trace_ELBO()
    # y of shape (10, 10) would broadcast against outputs (10, 1) without the check
    for bad in (torch.randn(10, 10), torch.randn(1), torch.randn(10, 1, 1)):
        with pytest.raises(ValueError, match="do not match the network's output"):
            elbo.loss(model, guide, X, bad)
    elbo.loss(model, guide, X, Y)  # (N,) is accepted for one output
    elbo.loss(model, guide, X, Y.unsqueeze(-1))


def test_prediction_inputs():
    model, guide = regression()
    with pytest.raises(ValueError, match="x contains NaN"):
        pyrobnn.predict(model, guide, torch.full((2, 3), float("nan")))
    with pytest.raises(ValueError, match="expects 3 features"):
        pyrobnn.predict(model, guide, torch.randn(2, 4))
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        pyrobnn.predict(model, guide, X, 0)


def test_custom_forward_shape_errors_name_the_input():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 1)

        def forward(self, x):
            return self.fc(torch.cat([x, x], -1))

    model = pyrobnn.BayesianModel(Custom(), pyrobnn.GaussianLikelihood())
    with pytest.raises(ValueError, match=r"cannot take x of shape \(10, 4\)"):
        fit(model, pyrobnn.MeanFieldNormal(model), torch.randn(10, 4), Y)
    fit(model, pyrobnn.MeanFieldNormal(model), X, Y)


def test_configuration_errors():
    with pytest.raises(ValueError, match="positive"):
        pyrobnn.GaussianLikelihood(scale=-1.0)
    with pytest.raises(ValueError, match="positive support"):
        pyrobnn.GaussianLikelihood(scale=pyro.distributions.Normal(0.0, 1.0))
    model, _ = regression()
    with pytest.raises(ValueError, match="zero-mean Normal prior"):
        pyrobnn.MCDropout(pyrobnn.BayesianModel(pyrobnn.MLP(3, 1), pyrobnn.GaussianLikelihood(), pyrobnn.LogUniformPrior()))
    with pytest.raises(ValueError, match="only against the log-uniform prior"):
        pyrobnn.VariationalDropout(model, alpha="unit")
    with pytest.raises(ValueError, match="dropout rate"):
        pyrobnn.MCDropout(model, p=1.0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), X, Y, batch_size=0, progress=False)
    with pytest.raises(TypeError, match="nn.Module"):
        pyrobnn.BayesianModel(lambda x: x, pyrobnn.GaussianLikelihood())


def test_predict_refuses_bad_sizes_and_inconsistent_samples():
    import pyrobnn

    torch.manual_seed(0)
    x = torch.randn(6, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(scale=0.1))
    samples = {s.name: torch.randn((4,) + tuple(s.shape)) for s in model.sites}
    assert pyrobnn.predict(model, samples, x).mean.shape == (6, 1)
    for kwargs in ({"batch_size": 0}, {"sample_batch_size": 0}, {"batch_size": 2.5}):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"{name} must be a positive integer or None"):
            pyrobnn.predict(model, samples, x, **kwargs)
    missing = dict(samples)
    first = next(iter(missing))
    del missing[first]
    with pytest.raises(ValueError, match=rf"lack the sites \['{first}'\]"):
        pyrobnn.predict(model, missing, x)
    uneven = dict(samples)
    uneven[first] = uneven[first][:2]
    with pytest.raises(ValueError, match="different numbers of draws per site"):
        pyrobnn.predict(model, uneven, x)


def test_fit_refuses_fractional_epochs_and_zero_particles_or_checkpoint_interval():
    import pyrobnn

    x, y = torch.randn(8, 1), torch.randn(8, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(scale=0.1))
    guide = pyrobnn.MeanFieldNormal(model)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match="epochs must be a non-negative integer, got 2.5"):
        pyrobnn.fit(model, guide, x, y, epochs=2.5, progress=False)
    with pytest.raises(ValueError, match="num_particles must be a positive integer, got 0"):
        pyrobnn.fit(model, guide, x, y, epochs=1, num_particles=0, progress=False)
    with pytest.raises(ValueError, match="every must be a positive integer, got 0"):
        pyrobnn.fit(model, guide, x, y, epochs=1, checkpoint=pyrobnn.Checkpointing("run.ckpt", every=0), progress=False)
    with pytest.raises(TypeError, match="checkpoint must be a file path or a Checkpointing"):
        pyrobnn.fit(model, guide, x, y, epochs=1, checkpoint=5, progress=False)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch):
    """A folder, a path below a file, or a folder without write permission: refused at the call
    by every method that checkpoints, naming the path and why; nothing trains, nothing is
    written. (A failure that arises during the run, a full disk, only warns: tests/faults.)"""
    import os

    import pyrobnn
    from pyrobnn.utils import io

    x, y = torch.randn(8, 1), torch.randn(8)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(scale=0.1))
    guide = pyrobnn.MeanFieldNormal(model)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    (tmp_path / "a_file").write_text("")
    cases = [(tmp_path, "it is a folder"), (tmp_path / "a_file" / "run.ckpt", "a_file is a file, not a folder")]
    calls = [
        lambda path: pyrobnn.fit(model, guide, x, y, epochs=1, checkpoint=path, progress=False),
        lambda path: pyrobnn.nuts(model, x, y, num_samples=2, num_warmup=2, checkpoint=path, progress=False),
        lambda path: pyrobnn.sgld(model, x, y, num_steps=4, thinning=1, checkpoint=path, progress=False),
        lambda path: pyrobnn.deep_ensemble(model, x, y, num_members=2, max_epochs=1, checkpoint=path, progress=False),
    ]
    for path, reason in cases:
        for call in calls:
            with pytest.raises(ValueError, match=f"checkpoint {path} cannot be written: .*{reason}"):
                call(path)
    # a folder without write permission (os.access is what decides; as root it always allows)
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(io.os, "access", lambda p, mode: os.fspath(p) != os.fspath(locked))
    with pytest.raises(ValueError, match=f"the folder {locked} is not writable"):
        calls[0](locked / "run.ckpt")
    with pytest.raises(ValueError, match=f"the folder {locked} is not writable \\(to create {locked}/new in\\)"):
        calls[2](locked / "new" / "run.ckpt")
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "locked"]


def test_a_failed_write_names_its_own_cause(tmp_path):
    """Free space is advised only where the disk is full (tests/faults fills one); another failure
    says what it was."""
    from pyrobnn.utils.io import WriteError, atomic_save

    (tmp_path / "a_file").write_text("")
    path = tmp_path / "a_file" / "run.pt"
    with pytest.raises(WriteError) as e:
        atomic_save({"x": torch.zeros(2)}, path)
    text = str(e.value)
    assert text.startswith(f"could not write {path}: ") and text.endswith("(no file was written; write elsewhere)"), text
    assert "free space" not in text


def test_mlp_names_the_activations_it_knows():
    import pyrobnn

    with pytest.raises(ValueError, match=r"activation must be one of \['elu', 'gelu', 'relu', 'sigmoid', 'tanh'\] or an nn.Module class, got 'foo'"):
        pyrobnn.MLP(1, 1, activation="foo")
    with pytest.raises(TypeError, match="activation must be one of"):
        pyrobnn.MLP(1, 1, activation=3)
    assert isinstance(pyrobnn.MLP(1, 1, activation=nn.SiLU)[1], nn.SiLU)


def test_the_model_refuses_non_finite_data_under_pyros_own_svi_and_predictive(monkeypatch):
    import pyro

    import pyrobnn.utils.validation as validation

    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=0.1))
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = torch.randn(8, 1), torch.randn(8, 1)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    for bad_x, bad_y, match in (
        (x.clone().index_fill_(0, torch.tensor([3]), float("nan")), y, "x contains NaN"),
        (x.clone().index_fill_(0, torch.tensor([3]), float("inf")), y, "x contains infinite"),
        (x, y.clone().index_fill_(0, torch.tensor([5]), float("nan")), "y contains NaN"),
    ):
        with pytest.raises(ValueError, match=match):
            svi.step(bad_x, bad_y)
    with pytest.raises(ValueError, match="x contains NaN"):
        pyro.infer.Predictive(model, guide=guide, num_samples=3)(x.clone().index_fill_(0, torch.tensor([0]), float("nan")))
    # one check per tensor object: the same x is read once over many steps ...
    calls = []
    original = validation.check_finite
    monkeypatch.setattr(validation, "check_finite", lambda t, name: (calls.append(name), original(t, name)))
    x, y = x.clone(), y.clone()
    for _ in range(5):
        svi.step(x, y)
    assert calls == ["x", "y"]
    # ... and again once it was changed in place
    x[2, 0] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN"):
        svi.step(x, y)


@pytest.mark.parametrize("call, message", [
    (lambda m, g, x, y: pyrobnn.fit(m, g, x, y, epochs=1, batch_size=2.5, progress=False), "batch_size must be a positive integer, got 2.5"),
    (lambda m, g, x, y: pyrobnn.fit(m, g, x, y, epochs=1, clip_grad_norm=-1.0, progress=False), "clip_grad_norm must be a finite positive number"),
    (lambda m, g, x, y: pyrobnn.fit(m, g, x, y, epochs=1, lr=float("inf"), progress=False), "lr must be a finite positive number"),
    (lambda m, g, x, y: pyrobnn.predict(m, g, x, num_samples=2.5), "num_samples must be a positive integer, got 2.5"),
    (lambda m, g, x, y: pyrobnn.KLAnnealing(float("nan"), 1.0), "KL annealing needs 0 <= start <= end"),
    (lambda m, g, x, y: pyrobnn.deep_ensemble(m, x, y, num_members=2, lr=-1.0, max_epochs=1, progress=False), "lr must be a finite positive number"),
    (lambda m, g, x, y: pyrobnn.deep_ensemble(m, x, y, num_members=2, weight_decay=-1.0, max_epochs=1, progress=False), "weight_decay must be a finite non-negative"),
    (lambda m, g, x, y: pyrobnn.deep_ensemble(m, x, y, num_members=2, batch_size=1.5, max_epochs=1, progress=False), "deep_ensemble: batch_size must be an integer >= 1 or None, got 1.5"),
    (lambda m, g, x, y: pyrobnn.infer.mcmc.samplers.mclmc(m, x, y, num_samples=4, num_warmup=(2, 1, 1), step_size=-1.0, progress=False), "step_size must be a finite positive number"),
    (lambda m, g, x, y: pyrobnn.infer.mcmc.samplers.mclmc(m, x, y, num_samples=4, num_warmup=(2, 1, 1), L=0.0, progress=False), "L must be a finite positive number"),
    (lambda m, g, x, y: pyrobnn.deep_ensemble(m, x, y, num_members=2, num_processes=0, progress=False), "num_processes must be a positive integer"),
])
def test_arguments_are_refused_where_given_naming_the_argument_and_its_range(call, message):
    import pyrobnn.infer.mcmc.samplers  # noqa: F401 (the samplers' module)

    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(scale=0.1))
    guide = pyrobnn.MeanFieldNormal(model)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call(model, guide, torch.randn(8, 1), torch.randn(8, 1))
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())
