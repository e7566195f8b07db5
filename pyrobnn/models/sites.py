"""Which parameters of a network become random, and what a guide needs to know about them.

A :class:`WeightSite` is one parameter tensor of the network that the model samples instead
of optimizing. Its ``name`` is the parameter's path in the network (``"0.weight"``,
``"fc1.bias"``) and is also the name of the Pyro sample site.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Union

import torch
from torch import nn

__all__ = ["WeightSite", "select_sites", "DEFAULT_EXCLUDE"]

#: module types whose parameters stay point estimates unless selected explicitly
DEFAULT_EXCLUDE = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
)

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True, eq=False)
class WeightSite:
    """One random parameter tensor of the network.

    :ivar name: parameter path in the network; also the Pyro sample site name.
    :ivar module_name: path of the module that owns it (``""`` for the root).
    :ivar param_name: attribute name on that module (``"weight"``, ``"bias"``).
    :ivar module: the owning module.
    :ivar shape: shape of the parameter.
    :ivar fan_in: inputs feeding one output unit of the owning layer (in_features for
        ``Linear``, in_channels / groups * kernel size for convolutions, else the product of
        the trailing dimensions of the weight).
    :ivar unit_shape: shape of one noise variable per *input unit* broadcast against the
        parameter, used by dropout-style guides: ``(1, in)`` for a ``Linear`` weight,
        ``(1, in, 1, 1)`` for a ``Conv2d`` weight, ``()`` for a bias (no input unit), or
        ``None`` where the input-unit axis is unknown.
    """

    name: str
    module_name: str
    param_name: str
    module: nn.Module
    shape: torch.Size
    fan_in: int
    unit_shape: Union[torch.Size, None]

    @property
    def value(self) -> torch.Tensor:
        """The network's own tensor of this parameter (its initial value once it is random)."""
        return self.module._parameters[self.param_name]

    @property
    def is_bias(self) -> bool:
        return self.param_name == "bias"

    @property
    def numel(self) -> int:
        return self.shape.numel()


def _fan_in(module: nn.Module, param_name: str, shape: torch.Size) -> int:
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, _CONV):
        return (module.in_channels // module.groups) * math.prod(module.kernel_size)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() >= 2:
        return math.prod(weight.shape[1:])
    return max(1, math.prod(shape[1:])) if len(shape) > 1 else 1


def _unit_shape(module: nn.Module, param_name: str, shape: torch.Size):
    if param_name == "bias" and isinstance(module, (nn.Linear,) + _CONV):
        return torch.Size()
    if param_name != "weight":
        return None
    if isinstance(module, nn.Linear):
        return torch.Size((1, shape[1]))
    if isinstance(module, _CONV) and module.groups == 1:
        return torch.Size((1, shape[1]) + (1,) * (len(shape) - 2))
    return None


Selection = Union[str, Callable, Iterable]


def _matches(spec, name: str, module_name: str, module: nn.Module) -> bool:
    if isinstance(spec, nn.Module):
        return module is spec
    if isinstance(spec, type):
        return isinstance(module, spec)
    if isinstance(spec, str):
        return fnmatch.fnmatchcase(name, spec) or (spec != "" and module_name == spec)
    raise TypeError(f"cannot select parameters with {spec!r}: use module objects, types or names")


def select_sites(net: nn.Module, random: Selection = "all", exclude=DEFAULT_EXCLUDE):
    """The parameters of ``net`` that become random, as a tuple of :class:`WeightSite`.

    :param random: which parameters:

        - ``"all"``: every parameter (default);
        - ``"weights"``: parameters named ``weight`` (biases stay point estimates);
        - ``"last_layer"``: the parameters of the last module that owns any;
        - a callable ``(name, parameter, module) -> bool``;
        - an iterable of module objects, module types, parameter names or glob patterns
          over parameter names (``"fc*.weight"``) or module names (``"fc1"``).
    :param exclude: module types left deterministic by ``"all"``, ``"weights"``,
        ``"last_layer"``, callables and wildcard patterns (normalization layers by default).
        Exact names, module objects and types listed explicitly are always selected.
    """
    modules = dict(net.named_modules())
    candidates = []
    for module_name, module in modules.items():
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            candidates.append((name, module_name, param_name, module, param))

    def excluded(module):
        return isinstance(module, tuple(exclude))

    if isinstance(random, str) and random in ("all", "weights", "last_layer"):
        chosen = [c for c in candidates if not excluded(c[3])]
        if random == "weights":
            chosen = [c for c in chosen if c[2] == "weight"]
        elif random == "last_layer":
            if not chosen:
                raise ValueError("the network has no parameters to make random")
            last = chosen[-1][3]
            chosen = [c for c in chosen if c[3] is last]
    elif callable(random) and not isinstance(random, (nn.Module, type)):
        chosen = [c for c in candidates if not excluded(c[3]) and random(c[0], c[4], c[3])]
    else:
        specs = [random] if isinstance(random, (str, nn.Module, type)) else list(random)

        def chosen_by(spec, c):
            if not _matches(spec, c[0], c[1], c[3]):
                return False
            # a wildcard pattern is a broad selection: it respects the exclusions; exact
            # names, module objects and types are explicit requests
            return not (isinstance(spec, str) and any(ch in spec for ch in "*?[") and excluded(c[3]))

        chosen = [c for c in candidates if any(chosen_by(s, c) for s in specs)]
        for spec in specs:
            if isinstance(spec, str) and not any(_matches(spec, *c[:2], c[3]) for c in candidates):
                raise ValueError(
                    f"{spec!r} matches no parameter of the network; its parameters are "
                    f"{[c[0] for c in candidates]}"
                )
    if not chosen:
        raise ValueError(f"the selection {random!r} chose no parameter of the network")
    for name, _, _, module, _ in chosen:
        if isinstance(module, nn.RNNBase):
            raise ValueError(
                f"{name}: recurrent modules cache their weights and cannot be made random"
            )
    return tuple(
        WeightSite(
            name=name,
            module_name=module_name,
            param_name=param_name,
            module=module,
            shape=param.shape,
            fan_in=_fan_in(module, param_name, param.shape),
            unit_shape=_unit_shape(module, param_name, param.shape),
        )
        for name, module_name, param_name, module, param in chosen
    )
