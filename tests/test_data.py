"""Data from disk: MNIST through torchvision, without writing into the data folder."""

import os

import pytest
import torch

from pyrobnn.data import blundell_regression, gap_regression, mnist, two_moons


@pytest.fixture
def mnist_root(shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "MNIST", "raw")):
        pytest.skip(f"MNIST not found under {shared_data_dir} (set PYROBNN_DATA to the folder holding MNIST/raw)")
    return shared_data_dir


def _listing(folder):
    return sorted((f, os.path.getmtime(os.path.join(folder, f))) for f in os.listdir(folder))


def test_mnist_loads_from_a_copy_and_leaves_the_source_untouched(mnist_root, tmp_path):
    raw = os.path.join(mnist_root, "MNIST", "raw")
    before = _listing(raw)
    x, y = mnist(mnist_root, train=False, cache=tmp_path)
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == torch.get_default_dtype()
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert y.dtype == torch.long and set(y.unique().tolist()) == set(range(10))
    assert _listing(raw) == before
    sub1, lab1 = mnist(mnist_root, train=True, subset=1000, seed=3, cache=tmp_path)
    sub2, lab2 = mnist(mnist_root, train=True, subset=1000, seed=3, cache=tmp_path)
    assert sub1.shape == (1000, 1, 28, 28) and torch.equal(lab1, lab2) and torch.equal(sub1, sub2)
    assert not torch.equal(lab1, mnist(mnist_root, train=True, subset=1000, seed=4, cache=tmp_path)[1])


def test_missing_data_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("PYROBNN_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="PYROBNN_DATA"):
        mnist(cache=tmp_path)
    with pytest.raises(FileNotFoundError, match="no MNIST files"):
        mnist(tmp_path / "nowhere", cache=tmp_path)


def test_generated_data_are_reproducible():
    for make in (blundell_regression, gap_regression, two_moons):
        a, b = make(seed=5), make(seed=5)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, _ = gap_regression(200)
    assert ((x.abs() >= 0.35) & (x.abs() <= 1)).all()  # nothing inside the gap
