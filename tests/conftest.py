import os

import pyro
import pytest
import torch


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
