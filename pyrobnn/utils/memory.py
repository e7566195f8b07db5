r"""How much of a computation over many points and weight draws goes through the network at once.

Anything pyrobnn computes on the full data or a full test set (the posterior predictive, the
full-batch samplers' potential and gradient, a curvature estimate, a diagnostic) runs the
network on ``rows x points`` inputs, ``rows`` being weight draws or chains. Its memory is about

.. math:: \text{rows} \times \text{points} \times a \times k

where :math:`a` is the bytes of activations one input produces in the network (measured once
per network and input shape by :func:`activation_bytes`: the outputs of every module on one
input) and :math:`k` a factor for what a pass keeps besides the module outputs (2 without
gradients; 3 with them, the saved activations and their gradients). The points are split into
chunks so that each chunk fits the *budget* (:func:`budget`: 1 GiB, or a quarter of the memory
the machine has free, whichever is smaller; :func:`set_budget` or the environment variable
``PYROBNN_MEMORY_BUDGET`` changes it). Peak memory then grows with the chunk, not with the data
set or the number of test points, on a user's CNN as on an MLP.

The chunks decide the order in which a full-data sum (a potential, its gradient) adds its parts,
so draws repeat bit for bit where the budget is the same: with 4 GiB or more free it is the fixed
:data:`DEFAULT_BUDGET` on every machine; set ``PYROBNN_MEMORY_BUDGET`` to fix it where less is
free (a network small enough to take the data in one chunk is not affected).

A chunk the user asks for explicitly (``batch_size``, ``sample_batch_size``) that would need
more memory than the machine has free is refused before it runs, naming those arguments
(:func:`check_fits`), instead of being killed by the operating system.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import weakref
from typing import Optional

import torch
from torch import nn

from pyrobnn.utils.modes import eval_mode

__all__ = [
    "budget", "set_budget", "limit", "available_bytes", "activation_bytes", "points_per_chunk", "check_fits",
    "MemoryBudgetError", "DEFAULT_BUDGET", "FORWARD_FACTOR", "GRADIENT_FACTOR",
]

#: the budget where neither :func:`set_budget` nor ``PYROBNN_MEMORY_BUDGET`` sets one
DEFAULT_BUDGET = 1 << 30
#: memory of a pass without gradients, in multiples of its module outputs
FORWARD_FACTOR = 2
#: memory of a pass with gradients (saved activations, their gradients), in the same unit
GRADIENT_FACTOR = 3

_budget: Optional[int] = None
_activation_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class MemoryBudgetError(MemoryError):
    """A chunk asked for explicitly needs more memory than the machine has free."""


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def _parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"PYROBNN_MEMORY_BUDGET must be a size such as '512MB' or '2GB', got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _read_number(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text in ("max", "") else int(text)
    except (OSError, ValueError):
        return None


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> Optional[int]:
    """What the process's memory cgroup (a container's or a batch job's limit) leaves: its limit
    less its usage (cgroup v2, else v1), or ``None`` without a limit."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_number(limit_path), _read_number(usage_path)
        if limit is not None and usage is not None and limit < 1 << 60:
            return max(limit - usage, 0)
    return None


def _address_space_available() -> Optional[int]:
    """What ``RLIMIT_AS`` (``ulimit -v``) leaves this process: the limit less its virtual size."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return None


def available_bytes() -> Optional[int]:
    """The memory free for this process's new allocations: the least of what the machine has
    free (``MemAvailable`` of ``/proc/meminfo``), what its memory cgroup's limit leaves (a
    container, a batch job) and what its address-space limit (``ulimit -v``) leaves; ``None``
    where none can be read."""
    values = [v for v in (_meminfo_available(), _cgroup_available(), _address_space_available()) if v is not None]
    return min(values) if values else None


def budget() -> int:
    """Bytes one pass of the network may take: :func:`set_budget`'s value, else
    ``PYROBNN_MEMORY_BUDGET``, else the smaller of :data:`DEFAULT_BUDGET` and a quarter of the
    free memory."""
    if _budget is not None:
        return _budget
    env = os.environ.get("PYROBNN_MEMORY_BUDGET")
    if env:
        return _parse_bytes(env)
    free = available_bytes()
    return DEFAULT_BUDGET if free is None else max(min(DEFAULT_BUDGET, free // 4), 1 << 24)


def set_budget(nbytes: Optional[int]) -> None:
    """Set the budget of :func:`budget` for this process (``None``: back to the default)."""
    global _budget
    if nbytes is not None and (not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1):
        raise ValueError(f"the memory budget must be a positive number of bytes or None, got {nbytes!r}")
    _budget = nbytes


@contextlib.contextmanager
def limit(nbytes: int):
    """The budget set to ``nbytes`` inside the block."""
    global _budget
    before = _budget
    set_budget(nbytes)
    try:
        yield
    finally:
        _budget = before


def activation_bytes(net: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the outputs of every module of ``net`` (and its input) for one input, measured
    on ``x[:1]`` without gradients and in evaluation mode; remembered per network, input shape
    and dtype."""
    key = (tuple(x.shape[1:]), x.dtype, x.device.type)
    cache = _activation_cache.setdefault(net, {})
    if key in cache:
        return cache[key]
    total = [x[:1].numel() * x.element_size()]

    def count(module, inputs, output):
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor):
                total[0] += t.numel() * t.element_size()

    modules = [m for m in net.modules() if m is not net] or [net]
    handles = [m.register_forward_hook(count) for m in modules]
    try:
        with torch.no_grad(), eval_mode(net):
            net(x[:1])
    finally:
        for h in handles:
            h.remove()
    cache[key] = int(total[0])
    return cache[key]


def points_per_chunk(points: int, rows: int, per_point: int, factor: int = FORWARD_FACTOR, fixed: int = 0) -> int:
    """How many of ``points`` inputs go through at once when each of ``rows`` weight draws or
    chains runs on all of them, each input costing ``per_point`` bytes of activations (times
    ``factor``), besides ``fixed`` bytes (the draws themselves): at least 1, at most ``points``."""
    room = budget() - fixed
    per = max(rows, 1) * max(per_point, 1) * factor
    return int(min(points, max(1, room // per)))


def check_fits(nbytes: int, what: str, knobs: str, chunks: bool = True) -> None:
    """Refuse (:class:`MemoryBudgetError`) a computation estimated at ``nbytes`` when the machine
    has less free memory, naming ``what`` it is and the ``knobs`` that bound it (``chunks``: they
    are chunk sizes pyrobnn would otherwise choose itself, and the message says so)."""
    free = available_bytes()
    if free is not None and nbytes > free:
        hint = f" (or leave them unset: pyrobnn then picks chunks within pyrobnn.utils.memory.budget(), now {_gib(budget())})" if chunks else ""
        raise MemoryBudgetError(f"{what} needs about {_gib(nbytes)} at once and this process has {_gib(free)} free: lower {knobs}{hint}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{math.ceil(n / (1 << 20))} MiB"
