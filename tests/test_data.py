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


# ------------------------------------------------------------------------------------- UCI
from pyrobnn.data import uci, uci_num_splits  # noqa: E402

UCI_SIZES = {  # rows in the standard splits (data README; Hernández-Lobato & Adams 2015)
    "bostonHousing": (455, 51, 13, 20),
    "concrete": (927, 103, 8, 20),
    "energy": (691, 77, 8, 20),
    "yacht": (277, 31, 6, 20),
    "naval-propulsion-plant": (10741, 1193, 16, 20),
    "protein-tertiary-structure": (41157, 4573, 9, 5),
}


@pytest.fixture
def uci_root(shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "uci")):
        pytest.skip(f"UCI data not found under {shared_data_dir} (set PYROBNN_DATA to the folder holding uci/)")
    return shared_data_dir


@pytest.mark.parametrize("name", list(UCI_SIZES))
def test_uci_split_sizes_and_standardization(uci_root, name):
    import numpy as np

    n_train, n_test, d, n_splits = UCI_SIZES[name]
    assert uci_num_splits(name, uci_root) == n_splits
    s = uci(name, 1, uci_root, dtype=torch.float64)
    assert s.x_train.shape == (n_train, d) and s.x_test.shape == (n_test, d)
    assert s.y_train.shape == (n_train, 1) and s.y_test.shape == (n_test, 1)
    folder = os.path.join(uci_root, "uci", name)
    data = np.loadtxt(os.path.join(folder, "data.txt"))
    train = np.loadtxt(os.path.join(folder, "index_train_1.txt"), dtype=int)
    test = np.loadtxt(os.path.join(folder, "index_test_1.txt"), dtype=int)
    features = np.loadtxt(os.path.join(folder, "index_features.txt"), dtype=int)
    target = int(np.loadtxt(os.path.join(folder, "index_target.txt")))
    x_train = data[train][:, features]
    mean, std = x_train.mean(0), x_train.std(0)
    constant = np.ptp(x_train, 0) == 0
    std[constant] = 1
    assert np.allclose(s.x_test.numpy(), (data[test][:, features] - mean) / std)
    assert np.allclose(s.y_test_original.numpy()[:, 0], data[test, target])
    # the training split is standardized exactly; the test split with the training statistics
    assert np.allclose(s.y_train.mean().item(), 0, atol=1e-10) and np.isclose(s.y_train.std(unbiased=False).item(), 1)
    assert np.allclose(s.x_std.numpy()[constant], 1.0)
    if name == "naval-propulsion-plant":
        assert constant.sum() == 2


def test_uci_bad_paths_and_malformed_files(tmp_path, uci_root):
    with pytest.raises(FileNotFoundError, match="no UCI data set 'nope'.*available"):
        uci("nope", 0, uci_root)
    with pytest.raises(ValueError, match="splits 0 to 19"):
        uci("yacht", 20, uci_root)
    folder = tmp_path / "uci" / "broken"
    folder.mkdir(parents=True)
    (folder / "data.txt").write_text("1 2 3\n4 five 6\n")
    for f, text in (("index_features.txt", "0\n1\n"), ("index_target.txt", "2\n"), ("index_train_0.txt", "0\n"), ("index_test_0.txt", "1\n")):
        (folder / f).write_text(text)
    with pytest.raises(ValueError, match="data.txt is malformed"):
        uci("broken", 0, tmp_path)
    (folder / "data.txt").write_text("1 2 3\n4 5 6\n")
    (folder / "index_test_0.txt").write_text("7\n")
    with pytest.raises(ValueError, match="test indices out of range"):
        uci("broken", 0, tmp_path)
    (folder / "index_test_0.txt").write_text("0\n")
    with pytest.raises(ValueError, match="overlap"):
        uci("broken", 0, tmp_path)
    (folder / "index_train_0.txt").unlink()
    with pytest.raises(ValueError, match="splits 0 to -1|missing"):
        uci("broken", 0, tmp_path)


def test_uci_shuffled_splits_are_a_seeded_partition_standardized_by_training(uci_root):
    """MILE's protocol: 70/10/20 from a shuffle seeded by the seed, z-scored with the training
    part's statistics; the three parts partition the rows, and another seed gives another split."""
    import numpy as np

    from pyrobnn.data import uci_shuffled

    a = uci_shuffled("yacht", 1, data_path=uci_root, dtype=torch.float64)
    n = 308
    assert a.x_train.shape[0] == round(0.7 * n) and a.x_val.shape[0] == round(0.1 * n)
    assert a.x_train.shape[0] + a.x_val.shape[0] + a.x_test.shape[0] == n
    assert np.isclose(a.y_train.mean().item(), 0, atol=1e-10) and np.isclose(a.y_train.std(unbiased=False).item(), 1)
    rows = torch.cat([a.y_train, a.y_val, a.y_test]) * a.y_std + a.y_mean
    data = np.loadtxt(os.path.join(uci_root, "uci", "yacht", "data.txt"))
    assert np.allclose(np.sort(rows.numpy()[:, 0]), np.sort(data[:, -1]))
    again = uci_shuffled("yacht", 1, data_path=uci_root, dtype=torch.float64)
    assert torch.equal(a.x_test, again.x_test)
    assert not torch.equal(a.y_test, uci_shuffled("yacht", 2, data_path=uci_root, dtype=torch.float64).y_test)
    with pytest.raises(ValueError, match="fractions"):
        uci_shuffled("yacht", 1, fractions=(0.5, 0.5, 0.5), data_path=uci_root)


def test_a_bad_mnist_cache_is_named_and_rebuilt_from_the_data_folder(mnist_root, tmp_path):
    x, y = mnist(mnist_root, train=False, cache=tmp_path)
    raw = tmp_path / "torchvision" / "MNIST" / "raw"
    labels = raw / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:5000])  # a partial write
    with pytest.warns(UserWarning, match="t10k-labels-idx1-ubyte was not usable .*5000 bytes where its header says 10008"):
        again = mnist(mnist_root, train=False, cache=tmp_path)
    assert torch.equal(again[1], y)
    # a foreign archive, with nothing extracted: the old code asked torchvision to download
    (raw / "t10k-images-idx3-ubyte").unlink()
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(b"not a gzip file")
    with pytest.warns(UserWarning, match="t10k-images-idx3-ubyte was not usable \\(it is missing\\)"):
        again = mnist(mnist_root, train=False, cache=tmp_path)
    assert torch.equal(again[0], x)
    # an extracted file of the wrong kind
    (raw / "t10k-labels-idx1-ubyte").write_bytes((raw / "t10k-images-idx3-ubyte").read_bytes()[:100])
    with pytest.warns(UserWarning, match="not an MNIST labels file"):
        mnist(mnist_root, train=False, cache=tmp_path)
