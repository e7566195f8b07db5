"""The conformance suite: every registered method held to one contract, on the inputs users bring.

As scikit-learn's ``check_estimator`` does for estimators, this module runs each method of the
registry (:mod:`pyrobnn.methods`, a method of one's own included once registered) through the
same checks on the same cases:

- **cases** (:data:`CASES`): regression targets of shape ``(N,)`` and ``(N, 1)``, several outputs,
  a float64 model and data, a noise scale with a prior, a learned noise scale, a heteroscedastic
  Gaussian, integer class labels, Bernoulli targets, a user's CNN (``Conv2d``, pooling,
  ``Flatten``), a CNN with ``BatchNorm2d``, an MLP with ``nn.Dropout``, a custom ``forward`` with a
  skip connection, NumPy arrays for the data, and a scale-mixture prior;
- **the contract** (:func:`check_method`): on a case the method's declaration supports, it runs
  and returns a :class:`~pyrobnn.infer.results.protocol.Result` of its family whose ``predict`` is finite and
  shaped as the likelihood says, whose ``to_arviz`` holds the draws and the network's output,
  which ``save`` then ``load(path, model)`` restores to identical predictions, and whose
  ``summary()`` names it; on a case it does not support, it is refused at the call with an
  :class:`~pyrobnn.methods.UnsupportedModelError` that names the method, what it lacks and the
  methods that take the case, and the model is left as it was;
- **determinism** (:func:`check_determinism`): the same call with the same seed gives identical
  draws twice in one process (and, with :func:`check_fresh_process`, in a fresh process);
- **budgets** (:func:`check_budgets`): every declared smallest budget runs, and one below it is
  refused at the call naming the argument;
- **declaration** (:func:`check_declaration`): every argument the method's declaration names (its
  constraints, Bayesian-optimization options, quick options, warm start) is a parameter of the
  method, so a renamed option fails here and not in a user's refit;
- **memory** (:func:`check_memory`): on a CNN, the peak of live tensor memory
  (:class:`TensorMemory`) of fitting and of predicting grows with the batch, not with the number
  of training or test points.

:func:`parametrize_with_checks` turns all of it into a ``pytest`` parametrization, and
:func:`conformance_matrix` into the table of the documentation.

Example::

    from pyrobnn.testing import parametrize_with_checks

    @parametrize_with_checks()
    def test_conformance(check):
        check()
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass
from typing import Callable

import pyro.distributions as dist
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pyrobnn import methods
from pyrobnn.evaluation.predictions import ClassificationPrediction, RegressionPrediction
from pyrobnn.infer.loading import load_posterior
from pyrobnn.infer.results.protocol import FAMILIES, STATS, Result
from pyrobnn.models import MLP, BayesianModel
from pyrobnn.models.likelihoods import BernoulliLikelihood, CategoricalLikelihood, GaussianLikelihood, HeteroscedasticGaussianLikelihood
from pyrobnn.models.priors import LogUniformPrior, NormalPrior, ScaleMixturePrior
from pyrobnn.utils import memory
from pyrobnn.utils.validation import as_tensor, check_forward

__all__ = [
    "Case", "CASES", "build_case", "method_prior", "check_method", "check_refusal", "check_determinism", "check_fresh_process", "check_budgets",
    "check_declaration", "check_memory", "TensorMemory", "HostReads", "parametrize_with_checks", "conformance_matrix", "checks",
]

N_TRAIN, N_TEST = 48, 9


@dataclass(frozen=True)
class Case:
    """One kind of input: ``build(prior)`` returns a fresh ``(model, x, y, x_test, y_test)``, the
    weights under ``prior`` (a case about priors keeps its own).

    :ivar features: what the case exercises, by the names the support table uses."""

    name: str
    description: str
    build: Callable
    features: tuple = ()


def _regression(n, d=2, outputs=1, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype, device="cpu")
    y = torch.sin(x.sum(-1, keepdim=True)).repeat(1, outputs) + 0.1 * torch.randn(n, outputs, generator=g, dtype=dtype, device="cpu")
    return x, y


def _images(n, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g, device="cpu")
    y = (x[:, 0, :4].mean((1, 2)) > 0).long() + (x[:, 0, 4:].mean((1, 2)) > 0).long()
    return x, y


class ConvNet(nn.Module):
    """A user's small CNN: two convolutions with pooling, flattened into a linear layer; optionally
    batch normalization after the first convolution."""

    def __init__(self, batchnorm: bool = False, classes: int = 3, width: int = 4, size: int = 8):
        super().__init__()
        layers = [nn.Conv2d(1, width, 3, padding=1)]
        if batchnorm:
            layers.append(nn.BatchNorm2d(width))
        layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width * (size // 4) ** 2, classes)

    def forward(self, x):
        return self.head(self.features(x))


class SkipNet(nn.Module):
    """A custom ``forward``: a residual block between two linear layers."""

    def __init__(self, d: int = 2, width: int = 8):
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(d, width), nn.Linear(width, width), nn.Linear(width, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(h + torch.tanh(self.block(h)))


def _split(x, y):
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def _gaussian_case(scale=0.1, outputs=1, one_d=False, dtype=torch.float32, net=None, own_prior=None, as_numpy=False):
    def build(prior):
        torch.manual_seed(0)
        x, y = _regression(N_TRAIN + N_TEST, outputs=outputs, dtype=dtype)
        if one_d:
            y = y[:, 0]
        network = net() if net is not None else MLP(2, outputs, hidden=(8,), activation="tanh")
        network = network.to(dtype)
        model = BayesianModel(network, GaussianLikelihood(scale), own_prior if own_prior is not None else prior)
        x, y, xt, yt = _split(x, y)
        if as_numpy:
            x, y, xt, yt = (t.double().numpy() for t in (x, y, xt, yt))
        return model, x, y, xt, yt

    return build


def _heteroscedastic(prior):
    torch.manual_seed(0)
    x, y = _regression(N_TRAIN + N_TEST)
    return (BayesianModel(MLP(2, 2, hidden=(8,), activation="tanh"), HeteroscedasticGaussianLikelihood(), prior), *_split(x, y))


def _labels(prior):
    torch.manual_seed(0)
    x, _ = _regression(N_TRAIN + N_TEST)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return (BayesianModel(MLP(2, 3, hidden=(8,), activation="tanh"), CategoricalLikelihood(), prior), *_split(x, y))


def _bernoulli(prior):
    torch.manual_seed(0)
    x, _ = _regression(N_TRAIN + N_TEST)
    y = (x[:, 0] > 0).float()
    return (BayesianModel(MLP(2, 1, hidden=(8,), activation="tanh"), BernoulliLikelihood(), prior), *_split(x, y))


def _cnn(batchnorm):
    def build(prior):
        torch.manual_seed(0)
        x, y = _images(N_TRAIN + N_TEST)
        return (BayesianModel(ConvNet(batchnorm), CategoricalLikelihood(), prior), *_split(x, y))

    return build


def _dropout_net():
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 1))


#: the cases every method is checked on, by name
CASES = {c.name: c for c in (
    Case("targets_1d", "regression, targets of shape (N,)", _gaussian_case(one_d=True), ("gaussian",)),
    Case("targets_2d", "regression, targets of shape (N, 1)", _gaussian_case(), ("gaussian",)),
    Case("several_outputs", "regression with 3 outputs, targets (N, 3)", _gaussian_case(outputs=3), ("gaussian",)),
    Case("float64", "a float64 network and data", _gaussian_case(one_d=True, dtype=torch.float64), ("gaussian", "float64")),
    Case("noise_prior", "a LogNormal prior on the noise scale", _gaussian_case(dist.LogNormal(-2.0, 1.0), one_d=True), ("gaussian_prior",)),
    Case("learned_noise", "a learned noise scale (a point parameter)", _gaussian_case("learned", one_d=True), ("gaussian_learned",)),
    Case("heteroscedastic", "a heteroscedastic Gaussian (mean and scale per point)", _heteroscedastic, ("heteroscedastic",)),
    Case("integer_labels", "3 classes, integer labels", _labels, ("categorical",)),
    Case("bernoulli", "binary targets, one logit", _bernoulli, ("bernoulli",)),
    Case("cnn", "a user's CNN: Conv2d, MaxPool2d, Flatten, Linear, on 8x8 images", _cnn(False), ("categorical", "convolution")),
    Case("batchnorm", "the CNN with BatchNorm2d, in training mode", _cnn(True), ("categorical", "convolution", "batchnorm")),
    Case("dropout", "an MLP with nn.Dropout, in training mode", _gaussian_case(one_d=True, net=_dropout_net), ("gaussian", "dropout")),
    Case("custom_forward", "a custom forward with a skip connection", _gaussian_case(one_d=True, net=SkipNet), ("gaussian", "custom_forward")),
    Case("numpy", "NumPy float64 arrays for a float32 model", _gaussian_case(one_d=True, as_numpy=True), ("gaussian", "numpy")),
    Case("scale_mixture_prior", "a scale-mixture prior on the weights", _gaussian_case(one_d=True, own_prior=ScaleMixturePrior(0.5, 1.0, 0.1)),
         ("gaussian", "other")),
)}


def method_prior(key: str):
    """The weight prior the cases use for method ``key``: a ``NormalPrior(1.0)``, or a
    ``LogUniformPrior`` for a method that takes that prior only (Gaussian dropout)."""
    priors = methods.spec(key).support.priors if key is not None else ("normal",)
    return NormalPrior(1.0) if "normal" in priors or "other" in priors else LogUniformPrior()


def build_case(name: str, key: str = None, device=None):
    """A fresh ``(model, x, y, x_test, y_test)`` of the case ``name``, with the weight prior the
    cases use for method ``key`` (:func:`method_prior`), the model and the tensors moved to
    ``device`` when one is given (NumPy data stays NumPy)."""
    if name not in CASES:
        raise KeyError(f"no case {name!r}; cases: {sorted(CASES)}")
    model, *data = CASES[name].build(method_prior(key))
    if device is None:
        return (model, *data)
    device = torch.device(device)
    return (model.to(device), *(t.to(device) if isinstance(t, torch.Tensor) else t for t in data))


def _fail(key, case, what):
    raise AssertionError(f"{key} on {case}: {what}")


def _run(key, model, x, y, seed=0, **overrides):
    spec = methods.spec(key)
    return spec.run(model, x, y, **{**spec.quick, spec.seeded: seed, **overrides})


def _draws(result, seed=0):
    return result.as_draws(4, seed=seed).samples


def _expected_shape(model, x_test) -> tuple:
    """The shape of a prediction's mean (regression) or probabilities (classification) at
    ``x_test``, as the likelihood defines it from the network's outputs."""
    outputs = check_forward(model.net, as_tensor(x_test, "x", model.dtype).to(model.device))[-1]
    m, lik = len(x_test), model.likelihood
    if isinstance(lik, HeteroscedasticGaussianLikelihood):
        return (m, outputs // 2)
    if isinstance(lik, BernoulliLikelihood):
        return (m, outputs, 2)
    return (m, outputs)


def _check_prediction(key, case, model, pred, x_test):
    lik = model.likelihood
    shape = _expected_shape(model, x_test)
    where = (pred.loc_samples if isinstance(pred, RegressionPrediction) else pred.sample_probs).device
    if where != model.device:
        _fail(key, case, f"predict's values are on {where}, the model on {model.device}")
    if isinstance(lik, (GaussianLikelihood, HeteroscedasticGaussianLikelihood)):
        if not isinstance(pred, RegressionPrediction):
            _fail(key, case, f"predict gave a {type(pred).__name__} for a {type(lik).__name__}")
        for name in ("mean", "std", "epistemic_std", "aleatoric_std"):
            value = getattr(pred, name)
            if tuple(value.shape) != shape or not torch.isfinite(value).all():
                _fail(key, case, f"predict's {name} has shape {tuple(value.shape)} (expected {shape}) or non-finite values")
    else:
        if not isinstance(pred, ClassificationPrediction):
            _fail(key, case, f"predict gave a {type(pred).__name__} for a {type(lik).__name__}")
        probs = pred.probs
        if tuple(probs.shape) != shape or not torch.isfinite(probs).all() or not torch.allclose(probs.sum(-1), torch.ones_like(probs[..., 0]), atol=1e-4):
            _fail(key, case, f"predict's probabilities have shape {tuple(probs.shape)} (expected {shape}), non-finite values or do not sum to 1")


def _same_prediction(a, b) -> bool:
    if isinstance(a, RegressionPrediction):
        return torch.equal(a.loc_samples, b.loc_samples) and torch.equal(a.scale_samples.expand_as(a.loc_samples), b.scale_samples.expand_as(b.loc_samples))
    return torch.equal(a.sample_probs, b.sample_probs)


def _same_plain(a, b) -> bool:
    """Equal settings: the same keys, lists and values, tensors equal element for element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_plain(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_plain(u, v) for u, v in zip(a, b))
    return type(a) is type(b) and a == b


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_refusal(key: str, case: str, device=None) -> None:
    """On a case its declaration does not support, the method is refused at the call, by name,
    with the alternatives, and the model is left as it was."""
    model, x, y, _, _ = build_case(case, key, device)
    before = _state(model)
    try:
        _run(key, model, x, y)
    except methods.UnsupportedModelError as e:
        text = str(e)
        if "Methods that take" not in text:
            _fail(key, case, f"the refusal does not name the methods that take the case: {text}")
    else:
        _fail(key, case, "ran, but its declaration says it does not support this case")
    after = _state(model)
    if before.keys() != after.keys() or any(not torch.equal(before[k], after[k]) for k in before):
        _fail(key, case, "a refused call changed the model")


def check_method(key: str, case: str, verbs: bool = True, device=None) -> None:
    """The contract on one case: refused by declaration (:func:`check_refusal`), or run, with a
    :class:`~pyrobnn.infer.results.protocol.Result` of the method's family, a finite ``predict`` of the
    likelihood's shape, and with ``verbs`` a ``to_arviz`` holding every draw and the outputs, a
    ``save`` to one file of plain tensors (it loads with ``weights_only=True``) then
    ``load(path, model)`` with identical predictions, and a ``summary`` that names the method.
    With ``device``, the case is built there (:func:`build_case`) and the predictions must be
    there too."""
    spec = methods.spec(key)
    model, x, y, x_test, y_test = build_case(case, key, device)
    if not methods.supports(key, model):
        check_refusal(key, case, device)
        return
    result = _run(key, model, x, y)
    if not isinstance(result, Result):
        _fail(key, case, f"returned a {type(result).__name__}, not a pyrobnn Result")
    if result.family != spec.family or result.family not in FAMILIES:
        _fail(key, case, f"its result's family is {result.family!r}; the registry declares {spec.family!r}")
    if not isinstance(result.settings, dict) or any(k not in STATS for k in result.stats):
        _fail(key, case, f"settings must be a dict and stats keys in the schema, got stats {sorted(result.stats)}")
    _check_prediction(key, case, model, result.predict(x_test, seed=0), x_test)
    if not verbs:
        return
    idata = result.to_arviz(x_test, y_test, seed=0)
    if "f" not in idata.posterior or "log_likelihood" not in idata.groups():
        _fail(key, case, "to_arviz lacks the network's output 'f' or the log-likelihood")
    draws = result.as_draws()
    if (idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]) != (draws.num_chains, draws.num_draws):
        _fail(key, case, f"to_arviz holds {idata.posterior.sizes['chain']} chain(s) x {idata.posterior.sizes['draw']} draw(s), "
                         f"the result {draws.num_chains} x {draws.num_draws}")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.pt")
        result.save(path)
        if os.listdir(folder) != ["result.pt"]:
            _fail(key, case, f"save left other files beside its file: {sorted(os.listdir(folder))}")
        try:
            torch.load(path, weights_only=True)
        except Exception as e:  # a file that needs code run to load it is a defect
            _fail(key, case, f"the saved file does not load with weights_only=True: {e}")
        loaded = load_posterior(path, model)
        if type(loaded) is not type(result):
            _fail(key, case, f"load gave a {type(loaded).__name__}, saved a {type(result).__name__}")
        again, restored = result.predict(x_test, seed=1), loaded.predict(x_test, seed=1)
        if not _same_prediction(again, restored):
            _fail(key, case, "the loaded result predicts differently from the saved one")
        if not _same_plain(loaded.settings, result.settings):
            _fail(key, case, f"the loaded result's settings {loaded.settings} differ from the saved {result.settings}")
    text = result.summary()
    if not isinstance(text, str) or result.method not in text:
        _fail(key, case, f"summary() does not name the result ({result.method!r})")


def check_determinism(key: str, case: str = "targets_1d", device=None) -> None:
    """The same call with the same seed gives bit-identical draws twice in one process."""
    draws = []
    for _ in range(2):
        model, x, y, _, _ = build_case(case, key, device)
        draws.append(_draws(_run(key, model, x, y, seed=3)))
    if draws[0].keys() != draws[1].keys() or any(not torch.equal(draws[0][k], draws[1][k]) for k in draws[0]):
        _fail(key, case, "the same call with the same seed gave different draws")


_FRESH = """
import torch
torch.set_num_threads(1)
from pyrobnn import testing
model, x, y, _, _ = testing.build_case({case!r}, {key!r})
result = testing._run({key!r}, model, x, y, seed=3)
torch.save({{k: v.cpu() for k, v in testing._draws(result).items()}}, {out!r})
"""


def check_fresh_process(key: str, case: str = "targets_1d", env=None) -> None:
    """The same call with the same seed in two fresh processes (with ``env``, e.g. empty caches)
    gives the draws of this process, bit for bit."""
    model, x, y, _, _ = build_case(case, key)
    here = _draws(_run(key, model, x, y, seed=3))
    with tempfile.TemporaryDirectory() as folder:
        for i in range(2):
            out = os.path.join(folder, f"draws{i}.pt")
            code = _FRESH.format(case=case, key=key, out=out)
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
            if run.returncode != 0:
                _fail(key, case, f"the fresh process failed: {run.stderr.strip().splitlines()[-1:]}")
            there = torch.load(out, weights_only=True)
            if any(not torch.equal(here[k].cpu(), there[k]) for k in here):
                _fail(key, case, f"a fresh process (run {i + 1}) gave other draws than this one")


def check_budgets(key: str, case: str = "targets_1d", device=None) -> None:
    """Every declared smallest budget runs; one below it is refused at the call, naming the
    argument."""
    spec = methods.spec(key)
    model, x, y, x_test, _ = build_case(case, key, device)
    result = _run(key, model, x, y, **spec.budgets)
    _check_prediction(key, case, model, result.predict(x_test, seed=0), x_test)
    for name, least in spec.budgets.items():
        model, x, y, _, _ = build_case(case, key, device)
        try:
            _run(key, model, x, y, **{**spec.budgets, name: least - 1})
        except (ValueError, TypeError) as e:
            if name not in str(e):
                _fail(key, case, f"{name}={least - 1} was refused without naming {name}: {e}")
        else:
            _fail(key, case, f"{name}={least - 1}, below the declared smallest {least}, was not refused")


def check_declaration(key: str) -> None:
    """Every option the declaration of ``key`` names (constraints, rules aside; ``bo_options``;
    ``quick``; its :class:`~pyrobnn.methods.WarmStart`) is a parameter of the method, and its
    ``bo_options`` pass its own constraints."""
    import inspect

    spec = methods.spec(key)
    parameters = inspect.signature(spec.run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    named = {"constraints": set(spec.constraints), "bo_options": set(spec.bo_options), "quick": set(spec.quick)}
    if spec.warm_start is not None:
        named["warm_start"] = spec.warm_start.option_names()
    for where, names in named.items():
        unknown = sorted(n for n in names if n not in parameters)
        if unknown and not takes_any:
            _fail(key, "declaration", f"its {where} name {unknown}, which are not parameters of {spec.run.__name__}")
    for name, value in spec.bo_options.items():
        constraint = spec.constraints.get(name)
        message = constraint.error(key, name, value) if constraint is not None else None
        if message is not None:
            _fail(key, "declaration", f"its bo_options are refused by its own constraints: {message}")


def _storage(t):
    """``(storage, data pointer)`` of a tensor with a plain storage, else ``(None, None)``
    (a non-tensor, or a wrapper without one)."""
    if not isinstance(t, torch.Tensor):
        return None, None
    try:
        storage = t.untyped_storage()
        return storage, storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None, None


class HostReads(TorchFunctionMode):
    """Counts the reads of a tensor's values on the host (``.item()``, ``.tolist()``, ``bool()``,
    ``int()``, ``float()``, ``.numpy()`` of a tensor: each a synchronization on an accelerator),
    which on the CPU cost nothing and are counted here instead (``count``)."""

    READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", None) in self.READS
        return func(*args, **(kwargs or {}))


class TensorMemory(TorchDispatchMode):
    """The peak bytes of live tensor storage created inside the block (``peak``): every
    operation's new output storage counts from its creation until it is freed. Counts what torch
    allocates through its operators (eager code: not native kernels or compiled graphs), the same
    on every machine."""

    def __init__(self):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0

    def _free(self, key):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(t)[1] for t in tree_flatten((args, kwargs))[0]}
        for t in tree_flatten(out)[0]:
            storage, key = _storage(t)
            if storage is None or key in self.live or key in inputs or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._free, key)
        return out


#: the memory budget of :func:`check_memory`: small enough that its data sets need chunks
MEMORY_CHECK_BUDGET = 1 << 18


def check_memory(key: str, small: int = 128, large: int = 512, ratio: float = 1.5) -> None:
    """On the CNN case, the peak live tensor memory (:class:`TensorMemory`) of fitting on
    ``large`` training points is at most ``ratio`` times that on ``small`` points (plus the
    data themselves), and so is predicting on ``large`` test points against ``small`` (plus the
    per-draw outputs the prediction holds): both grow with the batch (chosen from the memory
    budget), not with the data. Fitting is not checked for a method declared without bounded
    memory (``bounded_memory=False``). Runs the eager code of the samplers (``backend="eager"``),
    whose tensors the count sees."""
    spec = methods.spec(key)
    extra = {"backend": "eager"} if key in ("nuts", "mclmc") else {}
    peaks = {}
    with memory.limit(MEMORY_CHECK_BUDGET):
        for n in (small, large):
            torch.manual_seed(0)
            model = BayesianModel(ConvNet(), CategoricalLikelihood(), method_prior(key))
            if not methods.supports(key, model):
                return
            x, y = _images(n, 0)
            xt, _ = _images(n, 1)
            gc.collect()
            with TensorMemory() as fitting:
                result = _run(key, model, x, y, **extra)
            gc.collect()
            with TensorMemory() as predicting:
                pred = result.predict(xt, seed=0)
            # what a prediction must hold: the per-draw outputs, their probabilities
            held = 3 * sum(v.nbytes for v in vars(pred).values() if isinstance(v, torch.Tensor))
            peaks[n] = (fitting.peak, predicting.peak, held)
    data = (large - small) * 64 * 4 * 2  # the inputs and their first copy
    for i, what in enumerate(("fitting", "predicting")):
        if i == 0 and not spec.bounded_memory:
            continue
        allowed = ratio * peaks[small][i] + data + (peaks[large][2] if i == 1 else 0)
        if peaks[large][i] > allowed:
            _fail(key, "cnn", f"{what}'s peak tensor memory grew from {peaks[small][i] / 2**20:.2f} MiB on {small} points to "
                              f"{peaks[large][i] / 2**20:.2f} MiB on {large}: it grows with the data, not with the batch")


def checks(method_keys=None, case_names=None, device=None) -> list:
    """``[(id, function)]``: every check of the suite for the methods ``method_keys`` (default:
    every registered method) on the cases ``case_names`` (default: all), on ``device`` (default:
    where the cases are built, the default device), each a function of no arguments that raises
    ``AssertionError`` on a failure."""
    keys = list(methods.METHODS) if method_keys is None else list(method_keys)
    names = list(CASES) if case_names is None else list(case_names)
    out = []
    for key in keys:
        for name in names:
            out.append((f"{key}-{name}", lambda key=key, name=name: check_method(key, name, device=device)))
        out.append((f"{key}-determinism", lambda key=key: check_determinism(key, device=device)))
        out.append((f"{key}-budgets", lambda key=key: check_budgets(key, device=device)))
        out.append((f"{key}-declaration", lambda key=key: check_declaration(key)))
    return out


def parametrize_with_checks(method_keys=None, case_names=None, device=None):
    """A ``pytest.mark.parametrize`` over :func:`checks`: the decorated test takes ``check`` and
    calls it."""
    import pytest

    found = checks(method_keys, case_names, device)
    return pytest.mark.parametrize("check", [f for _, f in found], ids=[i for i, _ in found])


def conformance_matrix(method_keys=None, case_names=None, device=None) -> dict:
    """``{method: {case: "passes" | "refused by design" | "fails: ..."}}`` over the registry and
    the cases (the documentation's conformance table), on ``device`` (default: where the cases
    are built)."""
    out = {}
    for key in methods.METHODS if method_keys is None else method_keys:
        row = {}
        for name in CASES if case_names is None else case_names:
            model = build_case(name, key)[0]
            supported = methods.supports(key, model)
            try:
                check_method(key, name, device=device)
                row[name] = "passes" if supported else "refused by design"
            except Exception as e:  # the matrix records a failure instead of stopping
                row[name] = f"fails: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        out[key] = row
    return out


def main(argv=None) -> int:
    """``python -m pyrobnn.testing [--out FILE] [--device DEVICE] [--methods KEY ...] [--cases NAME ...]``:
    the conformance matrix as JSON; exits 1 where a check fails."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pyrobnn.testing", description=main.__doc__)
    parser.add_argument("--out", help="write the matrix here (JSON) instead of printing it")
    parser.add_argument("--device", help="run every case on this device (e.g. cuda); default: where the cases are built, the CPU")
    parser.add_argument("--methods", nargs="+", metavar="KEY", help=f"only these methods (of {', '.join(methods.METHODS)})")
    parser.add_argument("--cases", nargs="+", metavar="NAME", help=f"only these cases (of {', '.join(CASES)})")
    args = parser.parse_args(argv)
    if args.device is not None:
        try:
            torch.empty(0, device=args.device)
        except Exception as e:  # no such device type, no driver, a build without it
            parser.error(f"--device {args.device}: {type(e).__name__}: {e}")
    unknown = sorted(set(args.methods or ()) - set(methods.METHODS))
    if unknown:
        parser.error(f"--methods: no method {unknown}; the registry has {sorted(methods.METHODS)}")
    unknown = sorted(set(args.cases or ()) - set(CASES))
    if unknown:
        parser.error(f"--cases: no case {unknown}; the cases are {sorted(CASES)}")
    torch.set_num_threads(1)
    matrix = conformance_matrix(args.methods, args.cases, device=args.device)
    text = json.dumps({"cases": {k: c.description for k, c in CASES.items()}, "matrix": matrix}, indent=1) + "\n"
    if args.out:
        from pyrobnn.utils.io import atomic_write_text

        atomic_write_text(text, args.out)
    else:
        print(text, end="")
    return 1 if any(v.startswith("fails") for row in matrix.values() for v in row.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
