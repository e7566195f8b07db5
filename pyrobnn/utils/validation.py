"""Checks on user data, so that bad input fails with a message naming the problem.

Full-data checks (finite values, label range) run once where data enters: :func:`pyrobnn.fit`
and :func:`pyrobnn.predict`. The model itself re-checks only shapes and dtypes, which cost
nothing, so that direct use with ``pyro.infer.SVI`` cannot broadcast targets silently.
"""

from __future__ import annotations

import math
import numbers
import weakref

import numpy as np
import torch
from torch import nn

from pyrobnn.utils.modes import eval_mode

__all__ = [
    "as_tensor",
    "check_positive_int",
    "check_positive_number",
    "check_finite",
    "FiniteOnce",
    "check_label_dtype",
    "check_label_range",
    "check_inputs",
    "check_forward",
    "expected_input",
    "check_same_placement",
    "validate_training_data",
    "loader_pair",
]


def as_tensor(value, name: str, dtype=None) -> torch.Tensor:
    """``value`` as a tensor, or a ``ValueError``. A NumPy array is accepted: a floating one
    becomes a tensor of ``dtype`` where given (the model's: NumPy's float64 default is no choice of
    a torch dtype), any other keeps its dtype (integer labels stay integers). A tensor is
    returned as it is (its dtype is the user's choice, and checked against the model's)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object or not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
            raise ValueError(f"{name} must hold numbers, got a numpy array of dtype {value.dtype}")
        tensor = torch.from_numpy(np.array(value, copy=not value.flags.writeable or not value.flags.c_contiguous, order="C"))
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        return tensor
    raise ValueError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")


def check_positive_int(name: str, value) -> None:
    """Refuse anything but a positive integer (a Python or NumPy integer, not a bool) for the
    argument ``name``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_positive_number(name: str, value) -> None:
    """Refuse anything but a finite positive real number (not a bool) for the argument ``name``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def check_label_dtype(y: torch.Tensor) -> None:
    """Class labels must be an integer tensor (not float, complex or bool)."""
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"class labels must be an integer tensor, got dtype {y.dtype}")


def check_label_range(y: torch.Tensor, num_classes: int, context: str = "") -> None:
    """Class labels must lie in ``[0, num_classes)``; ``context`` is added to the message."""
    if y.numel() and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"class labels must lie in [0, {num_classes}){context}, "
            f"got labels from {int(y.min())} to {int(y.max())}"
        )


def check_finite(t: torch.Tensor, name: str) -> None:
    if t.is_floating_point() and not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).nonzero()
        kinds = []
        if torch.isnan(t).any():
            kinds.append("NaN")
        if torch.isinf(t).any():
            kinds.append("infinite")
        raise ValueError(
            f"{name} contains {' and '.join(kinds)} values ({bad.shape[0]} entries, the first "
            f"at index {tuple(bad[0].tolist())})"
        )


class FiniteOnce:
    """:func:`check_finite` once per tensor *object* (and in-place version) seen: the same
    ``x`` passed on every step of full-batch training or to every prediction chunk is read
    once, a new minibatch each time it is new. Remembers the last ``size`` tensors (weakly).
    Skipped while ``torch.jit.trace`` or ``torch.compile`` runs the caller (a check there would
    be baked in as a constant or break the graph)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._seen = {}

    def __call__(self, t: torch.Tensor, name: str) -> None:
        if not t.is_floating_point() or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return
        # a tensor's _version counts its in-place changes: a reused tensor whose values were
        # overwritten is checked again
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            return
        check_finite(t, name)
        if len(self._seen) >= self.size:
            self._seen.pop(next(iter(self._seen)))
        self._seen[id(t)] = (weakref.ref(t), t._version)

    def __getstate__(self):
        return {"size": self.size, "_seen": {}}  # weak references do not pickle (nor matter elsewhere)


def expected_input(net: nn.Module):
    """What the first layer of ``net`` reads, when that can be known without running it: for
    an ``nn.Sequential`` (nested ones too) whose first layers are flatten, linear or
    convolution layers. Returns ``("features", n)`` (last dimension), ``("flattened", n)``
    (all but the first), ``("channels", c, ndim)`` (dimension 1 of an ``ndim``-dimensional
    batch), or ``None`` when a custom ``forward`` decides (see :func:`check_forward`)."""
    flatten = False
    module = net
    while isinstance(module, nn.Sequential):
        children = list(module.children())
        if not children:
            return None
        if isinstance(children[0], nn.Flatten) and len(children) > 1:
            flatten = True
            children = children[1:]
        module = children[0]
    if isinstance(module, nn.Linear):
        return ("flattened" if flatten else "features", module.in_features)
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and not flatten:
        return ("channels", module.in_channels, module.weight.dim())
    return None


def check_forward(net: nn.Module, x: torch.Tensor, name: str = "x") -> torch.Size:
    """Run ``net`` on one example and return the output shape; a shape error inside the
    network becomes a ``ValueError`` naming the input's shape. Runs in eval mode, so that
    batch-norm statistics are not touched."""
    try:
        with torch.no_grad(), eval_mode(net):
            out = net(x[:1])
    except RuntimeError as e:
        raise ValueError(
            f"the network cannot take {name} of shape {tuple(x.shape)}: {str(e).splitlines()[0]}"
        ) from e
    return out.shape


def check_inputs(expected, x: torch.Tensor, dtype: torch.dtype, name: str = "x") -> None:
    """Dtype, emptiness and feature dimension of a batch of network inputs.

    :param expected: what the network reads, from :func:`expected_input`.
    """
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {x.dtype} but the network's parameters are {dtype}; convert the "
            f"data (x.to({dtype})) or the network"
        )
    if x.dim() == 0 or x.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    if expected is None:
        return
    if expected[0] == "features":
        if x.dim() != 2 or x.shape[-1] != expected[1]:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but the network's first layer expects "
                f"{expected[1]} features per example: pass shape (N, {expected[1]})"
            )
    elif expected[0] == "flattened":
        n = math.prod(x.shape[1:])
        if x.dim() < 2 or n != expected[1]:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} ({n} values per example) but the network "
                f"flattens its input into {expected[1]} features"
            )
    else:
        _, channels, ndim = expected
        if x.dim() != ndim or x.shape[1] != channels:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but the network's first convolution expects "
                f"a {ndim}-dimensional batch with {channels} channels in dimension 1"
            )


def check_same_placement(weights: torch.Tensor, guide) -> None:
    """Refuse a guide whose parameters are on another device or in another dtype than the
    model's ``weights`` (``model.to(...)`` moves the model only: move the guide the same way)."""
    if not isinstance(guide, nn.Module):
        return
    for p in guide.parameters():
        if p.device != weights.device or (p.is_floating_point() and p.dtype != weights.dtype):
            raise ValueError(
                f"the guide's parameters are {p.dtype} on {p.device} but the model's weights are "
                f"{weights.dtype} on {weights.device}: move both, e.g. model.to(device); guide.to(device)"
            )


def validate_training_data(model, x, y):
    """Convert and check ``x, y`` once, over the whole data set: types, dtypes, lengths,
    finite values, target shapes and label ranges. Returns the tensors (floating targets in the
    model's dtype)."""
    x = as_tensor(x, "x", model.dtype)
    model.check_x(x)
    check_finite(x, "x")
    if y is None:
        raise ValueError("y is required for training")
    y = as_tensor(y, "y", model.dtype)
    if y.dim() == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} examples but y has shape {tuple(y.shape)}")
    check_finite(y, "y")
    if y.is_floating_point() and y.dtype != model.dtype:
        y = y.to(model.dtype)  # float64 targets for a float32 network, as fit always allowed
    output_shape = check_forward(model.net, x.to(model.device))
    if len(output_shape) != 2:
        raise ValueError(f"the network must output (N, D); it gave shape {tuple(output_shape)}")
    y_checked = model.likelihood.check_targets(y, (x.shape[0], output_shape[-1]))
    model.likelihood.check_target_values(y_checked, output_shape[-1])
    return x, y


def loader_pair(batch, who: str = "fit"):
    """``(x, y)`` from a batch a ``DataLoader`` yielded to ``who``, or a ``ValueError`` that says
    what a loader must yield and what this one yielded."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, dict):
        got = f"a dict with keys {sorted(map(str, batch))[:6]}"
    elif isinstance(batch, (tuple, list)):
        got = f"a {type(batch).__name__} of {len(batch)} items"
    else:
        got = f"a {type(batch).__name__}"
    raise ValueError(
        f"a DataLoader for {who} must yield (x, y) pairs (a tuple or list of two tensors or arrays: inputs, targets); it yielded "
        f"{got}. Wrap its dataset so that each item is (x, y), e.g. TensorDataset(x, y)"
    )
