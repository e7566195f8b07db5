import os
import subprocess

# One intra-op thread for the tests, here and in the processes they start: on the two-core
# machine with its other core busy, two threads made the suite two to three times slower
# (threads waiting for a descheduled sibling), and idle they were no faster on these small
# networks. The native kernels' thread groups are tested on two threads explicitly. The
# benchmarks' smoke runs set their own thread count from PYROBNN_THREADS (default 2, which beside
# the other pytest-xdist worker oversubscribed the two cores: the UCI sampling smoke run took
# 502 s in CI's run against 179 s alone on two threads), so that is held at one as well.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["PYROBNN_THREADS"] = "1"

import pyro  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_clean():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


@pytest.fixture
def shared_data_dir():
    """The benchmark data folder: $PYROBNN_DATA, else ../shared/data beside the checkout."""
    path = os.environ.get("PYROBNN_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    return os.path.abspath(path)


@pytest.fixture
def run_command(tmp_path):
    """``run_command(args) -> stdout``: a command run in ``tmp_path``, which must exit 0 (its
    stderr's tail is the failure's message)."""

    def run(args):
        # a guard against a hang, not a speed test (benchmarks/ time things): a busy machine may
        # be many times slower than an idle one
        out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


class ReplayingGraph:
    """A stand-in for a CUDA graph (``pyrobnn.infer.core.graphs.CUDAGraph``) on the CPU: it records
    the function it is given and replays it by calling it, so that the fixed buffers, copies,
    warm-up calls and fallbacks around a recording run as they do on CUDA."""

    def __init__(self, device=None):
        self.body, self.replays = None, 0

    def warm_up(self):
        import contextlib

        return contextlib.nullcontext()

    def record(self, body):
        self.body = body

    def replay(self):
        self.replays += 1
        self.body()


@pytest.fixture
def replaying_graphs(monkeypatch):
    """Every CUDA graph pyrobnn makes in the test is a :class:`ReplayingGraph`; returns the list of
    those made."""
    from pyrobnn.infer.core import graphs
    from pyrobnn.infer.svi import capture

    made = []

    def make(device):
        made.append(ReplayingGraph(device))
        return made[-1]

    monkeypatch.setattr(graphs, "CUDAGraph", make)
    monkeypatch.setattr(capture, "CUDAGraph", make)
    return made
