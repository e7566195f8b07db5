"""Data sets: toy problems generated in code, and the benchmark data read from disk
(MNIST, UCI regression splits). Nothing here downloads unless asked to."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "blundell_curve", "blundell_regression", "gap_regression", "two_moons",
    "data_dir", "cache_dir", "mnist", "UCISplit", "uci", "uci_num_splits", "uci_shuffled",
]


def blundell_curve(x: torch.Tensor, eps: torch.Tensor | float = 0.0) -> torch.Tensor:
    r"""The curve of Blundell et al. 2015, sec. 5.2:
    :math:`y = x + 0.3 \sin(2\pi(x + \epsilon)) + 0.3 \sin(4\pi(x + \epsilon)) + \epsilon`."""
    return x + 0.3 * torch.sin(2 * math.pi * (x + eps)) + 0.3 * torch.sin(4 * math.pi * (x + eps)) + eps


def blundell_regression(n: int = 100, noise: float = 0.02, x_range=(0.0, 0.5), seed: int = 0, dtype=torch.float32):
    """``n`` noisy points of :func:`blundell_curve` with ``x`` uniform on ``x_range`` and
    :math:`\\epsilon \\sim N(0, \\text{noise}^2)`, as ``(x, y)`` of shapes ``(n, 1)``.
    The paper trains on ``x`` in [0, 0.5] and shows the fit on a wider range, where a BNN's
    uncertainty should grow."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lo, hi = x_range
    x = lo + (hi - lo) * torch.rand(n, 1, generator=g, dtype=torch.float64, device="cpu")
    eps = noise * torch.randn(n, 1, generator=g, dtype=torch.float64, device="cpu")
    return x.to(dtype), blundell_curve(x, eps).to(dtype)


def gap_regression(n: int = 100, noise: float = 0.1, seed: int = 0, dtype=torch.float32):
    """1-D regression with a gap in the inputs, for *in-between* uncertainty (Foong et al.
    2019): ``x`` uniform on [-1, -0.35] and [0.35, 1], ``y = sin(3 x) + 0.3 x^2 + noise``.
    A good posterior is more uncertain inside the gap than on the data; mean-field VI is
    known to fail at this. Returns ``(x, y)`` of shapes ``(n, 1)``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    half = n // 2
    left = -1 + 0.65 * torch.rand(half, 1, generator=g, dtype=torch.float64, device="cpu")
    right = 0.35 + 0.65 * torch.rand(n - half, 1, generator=g, dtype=torch.float64, device="cpu")
    x = torch.cat([left, right])
    y = torch.sin(3 * x) + 0.3 * x**2 + noise * torch.randn(n, 1, generator=g, dtype=torch.float64, device="cpu")
    return x.to(dtype), y.to(dtype)


def two_moons(n: int = 400, noise: float = 0.15, seed: int = 0, dtype=torch.float32):
    """Two interleaving half circles, a 2-D binary classification set: ``(x, y)`` with ``x``
    of shape ``(n, 2)`` and integer labels ``y`` of shape ``(n,)``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    half = n // 2
    t1 = math.pi * torch.rand(half, generator=g, dtype=torch.float64, device="cpu")
    t2 = math.pi * torch.rand(n - half, generator=g, dtype=torch.float64, device="cpu")
    upper = torch.stack([torch.cos(t1), torch.sin(t1)], 1)
    lower = torch.stack([1 - torch.cos(t2), 0.5 - torch.sin(t2)], 1)
    x = torch.cat([upper, lower]) + noise * torch.randn(n, 2, generator=g, dtype=torch.float64, device="cpu")
    y = torch.cat([torch.zeros(half, dtype=torch.long, device="cpu"), torch.ones(n - half, dtype=torch.long, device="cpu")])
    perm = torch.randperm(n, generator=g, device="cpu")
    return x[perm].to(dtype), y[perm]


# --------------------------------------------------------------------------- data on disk
def data_dir(path=None) -> str:
    """The benchmark data folder: ``path``, else ``$PYROBNN_DATA``. It holds ``MNIST/raw``
    (torchvision's layout) and ``uci/<name>/`` (the standard splits)."""
    path = path or os.environ.get("PYROBNN_DATA")
    if not path:
        raise FileNotFoundError(
            "no data folder given: pass a path or set PYROBNN_DATA to the folder that holds "
            "MNIST/raw and uci/"
        )
    return os.path.abspath(os.path.expanduser(path))


def cache_dir(path=None) -> str:
    """A writable folder for extracted data: ``path``, else ``$PYROBNN_CACHE``, else
    ``~/.cache/pyrobnn``."""
    path = path or os.environ.get("PYROBNN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pyrobnn")
    os.makedirs(path, exist_ok=True)
    return path


_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
#: the IDX magic number of MNIST's image and label files
_IDX_MAGIC = {"images": 2051, "labels": 2049}


def _idx_problem(path) -> Optional[str]:
    """Why the extracted MNIST file at ``path`` cannot be used (absent, not an IDX file of its
    kind, or of another length than its header says), or ``None``."""
    if not os.path.isfile(path):
        return "it is missing"
    kind = "images" if "images" in os.path.basename(path) else "labels"
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(16 if kind == "images" else 8)
    if len(header) < (16 if kind == "images" else 8):
        return f"it holds {size} bytes, fewer than an IDX header"
    magic, count = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:8], "big")
    if magic != _IDX_MAGIC[kind]:
        return f"it is not an MNIST {kind} file (IDX magic number {magic}, expected {_IDX_MAGIC[kind]})"
    expected = 16 + count * int.from_bytes(header[8:12], "big") * int.from_bytes(header[12:16], "big") if kind == "images" else 8 + count
    if size != expected:
        return f"it holds {size} bytes where its header says {expected} (a partial write)"
    return None


def _same_file(a, b) -> bool:
    """Whether ``a`` and ``b`` have the same size and SHA-256."""
    import hashlib

    if os.path.getsize(a) != os.path.getsize(b):
        return False
    digests = []
    for path in (a, b):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digests.append(h.digest())
    return digests[0] == digests[1]


def _rebuild_mnist_file(name, source, raw) -> None:
    """Copy the data folder's ``name.gz`` into the cache (unless an identical copy is there)
    and extract it, each through a temporary file and a rename."""
    import gzip

    from pyrobnn.utils.io import atomic_write_bytes

    gz = os.path.join(source, name + ".gz")
    if not os.path.isfile(gz):
        raise FileNotFoundError(f"MNIST file {gz} is missing")
    cached_gz = os.path.join(raw, name + ".gz")
    if not (os.path.isfile(cached_gz) and _same_file(gz, cached_gz)):
        with open(gz, "rb") as f:
            atomic_write_bytes(f.read(), cached_gz)
    try:
        with gzip.open(cached_gz, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"the data folder's MNIST file {gz} is not a readable gzip file ({e})") from e
    atomic_write_bytes(data, os.path.join(raw, name))
    problem = _idx_problem(os.path.join(raw, name))
    if problem is not None:
        raise ValueError(f"the data folder's MNIST file {gz} does not hold MNIST: extracted, {problem}")


def mnist(root=None, train: bool = True, subset=None, seed: int = 0, cache=None, download: bool = False):
    """MNIST through ``torchvision.datasets.MNIST``, as tensors ``(x, y)``: images of shape
    ``(N, 1, 28, 28)`` scaled to [0, 1] and integer labels.

    :param root: the folder that holds ``MNIST/raw`` (torchvision's layout), default
        :func:`data_dir`. Its gzipped files are copied to ``cache`` and extracted there, so
        ``root`` is never written to (it may be read-only or shared). Every call checks the
        cache: an extracted file must be a whole IDX file of its kind, and a cached ``.gz``
        must have the size and SHA-256 of the data folder's; a file that fails is rebuilt
        from the data folder, with a warning that names it and what was wrong.
    :param subset: keep this many examples, chosen with a generator seeded by ``seed``
        (e.g. the 1,000-image training set of the dropout experiments).
    :param download: let torchvision download the files when they are not found (needs
        internet; off by default, and never used by the tests or the demo).
    """
    import warnings

    import torchvision

    target = os.path.join(cache_dir(cache), "torchvision")
    raw = os.path.join(target, "MNIST", "raw")
    source = None
    try:
        source = os.path.join(data_dir(root), "MNIST", "raw")
    except FileNotFoundError:
        if not download:
            raise
    if source is not None and not os.path.isdir(source):
        if not download:
            raise FileNotFoundError(f"no MNIST files in {source} (expected MNIST/raw/*.gz under the data folder)")
        source = None
    os.makedirs(raw, exist_ok=True)
    for name in _MNIST_FILES:
        extracted, cached_gz = os.path.join(raw, name), os.path.join(raw, name + ".gz")
        problem = _idx_problem(extracted)
        if problem is None and source is not None and os.path.isfile(cached_gz) and not _same_file(cached_gz, os.path.join(source, name + ".gz")):
            problem = f"its cached archive {cached_gz} differs from the data folder's (size or SHA-256)"
        if problem is None:
            continue
        if source is None:
            # torchvision downloads what is missing; a bad file would stop it
            for path in (extracted, cached_gz):
                if os.path.exists(path):
                    os.unlink(path)
            continue
        if os.path.exists(extracted) or os.path.exists(cached_gz):
            warnings.warn(f"the cached MNIST file {extracted} was not usable ({problem}): rebuilt from {source}", stacklevel=2)
        _rebuild_mnist_file(name, source, raw)
    dataset = torchvision.datasets.MNIST(target, train=train, download=download)
    x = dataset.data.unsqueeze(1).to(torch.get_default_dtype()) / 255.0
    y = dataset.targets.long()
    if subset is not None:
        if not 0 < subset <= x.shape[0]:
            raise ValueError(f"subset must be between 1 and {x.shape[0]}, got {subset}")
        idx = torch.randperm(x.shape[0], generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")[:subset]
        x, y = x[idx], y[idx]
    return x, y


# --------------------------------------------------------------------------- UCI regression
@dataclass
class UCISplit:
    """One train/test split of a UCI regression data set, standardized with the training
    split's statistics (inputs and target). ``y_mean`` and ``y_std`` map predictions back to
    the original units (:meth:`pyrobnn.evaluation.predictions.RegressionPrediction.rescale`).

    Feature columns that are constant on the training split (naval-propulsion-plant has two;
    rounding in the mean can give one a standard deviation of 1e-13 rather than 0) get a
    standard deviation of 1, so that they are centred and not divided by (almost) zero."""

    name: str
    split: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor
    y_std: torch.Tensor
    meta: dict
    x_val: Optional[torch.Tensor] = None  # a validation part, where the split has one
    y_val: Optional[torch.Tensor] = None

    @property
    def y_test_original(self) -> torch.Tensor:
        return self.y_test * self.y_std + self.y_mean


def _uci_folder(name, data_path):
    base = data_dir(data_path)
    folder = os.path.join(base, "uci", name) if os.path.isdir(os.path.join(base, "uci")) else os.path.join(base, name)
    if not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        available = sorted(os.listdir(parent)) if os.path.isdir(parent) else []
        raise FileNotFoundError(f"no UCI data set {name!r} in {parent}" + (f"; available: {available}" if available else ""))
    return folder


def _read_numbers(path, dtype, what):
    import numpy as np

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file {path} is missing")
    try:
        return np.loadtxt(path, dtype=dtype, ndmin=1)
    except ValueError as e:
        raise ValueError(f"{path} is malformed ({what}): {e}") from e


def _read_table(folder):
    """``data.txt`` (a finite table) and its feature and target column indices."""
    import numpy as np

    data = _read_numbers(os.path.join(folder, "data.txt"), np.float64, "data")
    if data.ndim != 2:
        raise ValueError(f"{os.path.join(folder, 'data.txt')} is malformed: expected a table of numbers")
    if not np.isfinite(data).all():
        raise ValueError(f"{os.path.join(folder, 'data.txt')} contains non-finite values")
    features = _read_numbers(os.path.join(folder, "index_features.txt"), np.int64, "feature index")
    target = _read_numbers(os.path.join(folder, "index_target.txt"), np.int64, "target index")
    return data, features, target


def uci_num_splits(name: str, data_path=None) -> int:
    """Number of standard splits of a UCI data set (20, or 5 for protein)."""
    folder = _uci_folder(name, data_path)
    path = os.path.join(folder, "n_splits.txt")
    if os.path.isfile(path):
        return int(_read_numbers(path, float, "split count")[0])
    return len([f for f in os.listdir(folder) if f.startswith("index_train_")])


def uci(name: str, split: int = 0, data_path=None, dtype=torch.float32) -> UCISplit:
    """Split ``split`` of the UCI regression set ``name`` in the layout of Hernández-Lobato &
    Adams 2015 / Gal & Ghahramani 2016 (``data.txt``, ``index_features.txt``,
    ``index_target.txt``, ``index_train_<i>.txt``, ``index_test_<i>.txt``).

    :param data_path: the data folder holding ``uci/<name>`` (default ``$PYROBNN_DATA``).
    """
    import numpy as np

    folder = _uci_folder(name, data_path)
    n_splits = uci_num_splits(name, data_path)
    if not 0 <= split < n_splits:
        raise ValueError(f"{name} has splits 0 to {n_splits - 1}, not {split}")
    data, features, target = _read_table(folder)
    train = _read_numbers(os.path.join(folder, f"index_train_{split}.txt"), np.int64, "training index")
    test = _read_numbers(os.path.join(folder, f"index_test_{split}.txt"), np.int64, "test index")
    rows, cols = data.shape
    for what, idx, bound in (("feature", features, cols), ("target", target, cols), ("training", train, rows), ("test", test, rows)):
        if idx.size == 0:
            raise ValueError(f"{name}: the {what} index file is empty")
        if idx.min() < 0 or idx.max() >= bound:
            raise ValueError(f"{name}: {what} indices out of range [0, {bound})")
    if np.intersect1d(train, test).size:
        raise ValueError(f"{name} split {split}: training and test rows overlap")
    x, y = data[:, features], data[:, target[:1]]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    x_mean, x_std = x_train.mean(0), x_train.std(0)
    # a constant column can have a standard deviation of 1e-13 from rounding in its mean
    constant = (x_train.max(0) == x_train.min(0)) | (x_std <= 1e-12 * np.maximum(1.0, np.abs(x_mean)))
    x_std = np.where(constant, 1.0, x_std)
    y_mean, y_std = y_train.mean(0), y_train.std(0)
    y_std = np.where(y_std > 0, y_std, 1.0)
    meta = {}
    for key in ("n_hidden", "n_epochs"):
        path = os.path.join(folder, f"{key}.txt")
        if os.path.isfile(path):
            meta[key] = int(_read_numbers(path, float, key)[0])
    for key in ("dropout_rates", "tau_values"):
        path = os.path.join(folder, f"{key}.txt")
        if os.path.isfile(path):
            meta[key] = _read_numbers(path, float, key).tolist()

    def t(a):
        return torch.as_tensor(np.asarray(a), dtype=dtype, device="cpu")

    return UCISplit(
        name, split,
        t((x_train - x_mean) / x_std), t((y_train - y_mean) / y_std),
        t((x_test - x_mean) / x_std), t((y_test - y_mean) / y_std),
        t(x_mean), t(x_std), t(y_mean), t(y_std), meta,
    )


def uci_shuffled(name: str, seed: int, fractions=(0.7, 0.1, 0.2), data_path=None, dtype=torch.float32) -> UCISplit:
    """The UCI set ``name`` split train/validation/test in ``fractions`` from a shuffle seeded by
    ``seed`` (the protocol of Sommer et al. 2024/2025, 70/10/20), inputs and target z-scored with
    the training part's statistics; ``split`` is the seed."""
    import numpy as np

    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9 or fractions[0] == 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1 with a training part, got {fractions}")
    data, features, target = _read_table(_uci_folder(name, data_path))
    for what, idx in (("feature", features), ("target", target)):
        if idx.size == 0 or idx.min() < 0 or idx.max() >= data.shape[1]:
            raise ValueError(f"{name}: {what} indices empty or out of range [0, {data.shape[1]})")
    x, y = data[:, features], data[:, target[:1]]
    n = x.shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(round(fractions[0] * n))
    n_val = int(round(fractions[1] * n))
    train, val, test = perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std = np.where(x_std > 1e-12 * np.maximum(1.0, np.abs(x_mean)), x_std, 1.0)
    y_mean, y_std = y[train].mean(0), y[train].std(0)
    y_std = np.where(y_std > 0, y_std, 1.0)

    def t(a):
        return torch.as_tensor(np.asarray(a), dtype=dtype, device="cpu")

    return UCISplit(
        name, seed,
        t((x[train] - x_mean) / x_std), t((y[train] - y_mean) / y_std),
        t((x[test] - x_mean) / x_std), t((y[test] - y_mean) / y_std),
        t(x_mean), t(x_std), t(y_mean), t(y_std), {"fractions": tuple(fractions)},
        x_val=t((x[val] - x_mean) / x_std), y_val=t((y[val] - y_mean) / y_std),
    )

