import os

# One intra-op thread for the tests, here and in the processes they start: on the two-core
# machine with its other core busy, two threads made the suite two to three times slower
# (threads waiting for a descheduled sibling), and idle they were no faster on these small
# networks. The native kernels' thread groups are tested on two threads explicitly.
os.environ["OMP_NUM_THREADS"] = "1"

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


def normal_se(samples: torch.Tensor) -> torch.Tensor:
    """Standard error of the mean along dim 0."""
    return samples.std(0) / samples.shape[0] ** 0.5
