"""Work recorded once as a CUDA graph and replayed, for steps whose kernels are launched from
Python: an eager step of a small network is hundreds of tiny kernels, and on a GPU the host's
work of launching them, not the arithmetic, sets its time. Replayed, the whole step is one launch.

PyTorch's recipe (``torch.cuda.graphs``): a few eager runs on a side stream first (lazy
initializations, workspace allocations), then one recording with inputs in fixed buffers; from
then on each call copies its inputs into the buffers and replays. What is recorded must read no
value on the host, decide nothing on a value, and hold no Python value that changes between
calls: those live in tensors that are refilled in place.

:class:`CUDAGraph` is the recording itself; :class:`RecordedFunction` applies it to a pure
function of tensors (on CUDA: the step of :class:`~pyrobnn.infer.mcmc.mclmc_kernel.MCLMC`, a leaf
of :class:`~pyrobnn.infer.mcmc.nuts_kernel.NUTS`, the step of
:class:`~pyrobnn.infer.sgmcmc.smile_kernel.SMILE` with its batches as inputs); the SVI step, which
also updates parameters in place, has its own wrapper
(:class:`~pyrobnn.infer.svi.capture.CapturedStep`).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["CUDAGraph", "RecordedFunction", "RecordingFailed", "WARMUP_CALLS"]

#: eager runs on a side stream before the recording (PyTorch's recipe uses three)
WARMUP_CALLS = 3


class RecordingFailed(RuntimeError):
    """The work could not be recorded (nothing of it ran); its caller runs it eagerly."""


class CUDAGraph:
    """What a recording needs of CUDA: a side stream for the warm-up runs, and a graph that
    records a function once and replays it."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self.graph = torch.cuda.CUDAGraph()

    @contextlib.contextmanager
    def warm_up(self):
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def record(self, body) -> None:
        """Record ``body()`` (it does not run: :meth:`replay` runs it); :class:`RecordingFailed`
        where CUDA refuses one of its operations."""
        try:
            with torch.cuda.graph(self.graph):
                body()
        except Exception as e:  # an operation stream capture refuses: nothing ran
            raise RecordingFailed(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}") from e

    def replay(self) -> None:
        self.graph.replay()


class RecordedFunction:
    """``fn(*tensors) -> tuple of tensors``, a pure function (no host read, no decision on a
    value, nothing kept between calls), run eagerly for :data:`WARMUP_CALLS` calls, then recorded
    for its inputs' shapes, dtypes and device and replayed; inputs of other shapes run eagerly.
    Each call returns outputs of its own (copies of the graph's). Where the recording fails,
    every call runs eagerly and ``status`` says why.

    ``graph``: a function of the device giving the recorder (default :class:`CUDAGraph`)."""

    def __init__(self, fn, graph=None):
        self.fn = fn
        self.make_graph = graph
        self.graph = None
        self.inputs = self.outputs = self.key = None
        self.calls = 0
        self.status = "not yet recorded"

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.dtype, a.device) for a in args)
        if self.status.startswith("not recorded") or (self.key is not None and key != self.key):
            return self.fn(*args)
        if self.inputs is None:
            self.key, self.graph = key, (self.make_graph or CUDAGraph)(args[0].device)
            self.inputs = tuple(torch.empty_like(a) for a in args)
        for buffer, a in zip(self.inputs, args):
            buffer.copy_(a)
        if self.calls < WARMUP_CALLS:
            self.calls += 1
            with self.graph.warm_up():
                return self.fn(*self.inputs)
        if self.outputs is None:
            try:
                self.graph.record(self._body)
            except RecordingFailed as e:
                self.status = f"not recorded: recording it failed ({e})"
                return self.fn(*args)
            self.status = "recorded as a CUDA graph"
        self.graph.replay()
        return tuple(o.clone() for o in self.outputs)

    def _body(self):
        self.outputs = tuple(self.fn(*self.inputs))
