"""Data sets: toy problems generated in code, and the benchmark data read from disk
(MNIST, UCI regression splits). Nothing here downloads unless asked to."""

from __future__ import annotations

import math
import os
import shutil

import torch

__all__ = ["blundell_curve", "blundell_regression", "gap_regression", "two_moons", "data_dir", "cache_dir", "mnist"]


def blundell_curve(x: torch.Tensor, eps: torch.Tensor | float = 0.0) -> torch.Tensor:
    r"""The curve of Blundell et al. 2015, sec. 5.2:
    :math:`y = x + 0.3 \sin(2\pi(x + \epsilon)) + 0.3 \sin(4\pi(x + \epsilon)) + \epsilon`."""
    return x + 0.3 * torch.sin(2 * math.pi * (x + eps)) + 0.3 * torch.sin(4 * math.pi * (x + eps)) + eps


def blundell_regression(n: int = 100, noise: float = 0.02, x_range=(0.0, 0.5), seed: int = 0, dtype=torch.float32):
    """``n`` noisy points of :func:`blundell_curve` with ``x`` uniform on ``x_range`` and
    :math:`\\epsilon \\sim N(0, \\text{noise}^2)`, as ``(x, y)`` of shapes ``(n, 1)``.
    The paper trains on ``x`` in [0, 0.5] and shows the fit on a wider range, where a BNN's
    uncertainty should grow."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = x_range
    x = lo + (hi - lo) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    eps = noise * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return x.to(dtype), blundell_curve(x, eps).to(dtype)


def gap_regression(n: int = 100, noise: float = 0.1, seed: int = 0, dtype=torch.float32):
    """1-D regression with a gap in the inputs, for *in-between* uncertainty (Foong et al.
    2019): ``x`` uniform on [-1, -0.35] and [0.35, 1], ``y = sin(3 x) + 0.3 x^2 + noise``.
    A good posterior is more uncertain inside the gap than on the data; mean-field VI is
    known to fail at this. Returns ``(x, y)`` of shapes ``(n, 1)``."""
    g = torch.Generator().manual_seed(seed)
    half = n // 2
    left = -1 + 0.65 * torch.rand(half, 1, generator=g, dtype=torch.float64)
    right = 0.35 + 0.65 * torch.rand(n - half, 1, generator=g, dtype=torch.float64)
    x = torch.cat([left, right])
    y = torch.sin(3 * x) + 0.3 * x**2 + noise * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def two_moons(n: int = 400, noise: float = 0.15, seed: int = 0, dtype=torch.float32):
    """Two interleaving half circles, a 2-D binary classification set: ``(x, y)`` with ``x``
    of shape ``(n, 2)`` and integer labels ``y`` of shape ``(n,)``."""
    g = torch.Generator().manual_seed(seed)
    half = n // 2
    t1 = math.pi * torch.rand(half, generator=g, dtype=torch.float64)
    t2 = math.pi * torch.rand(n - half, generator=g, dtype=torch.float64)
    upper = torch.stack([torch.cos(t1), torch.sin(t1)], 1)
    lower = torch.stack([1 - torch.cos(t2), 0.5 - torch.sin(t2)], 1)
    x = torch.cat([upper, lower]) + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)
    y = torch.cat([torch.zeros(half, dtype=torch.long), torch.ones(n - half, dtype=torch.long)])
    perm = torch.randperm(n, generator=g)
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


def mnist(root=None, train: bool = True, subset=None, seed: int = 0, cache=None, download: bool = False):
    """MNIST through ``torchvision.datasets.MNIST``, as tensors ``(x, y)``: images of shape
    ``(N, 1, 28, 28)`` scaled to [0, 1] and integer labels.

    :param root: the folder that holds ``MNIST/raw`` (torchvision's layout), default
        :func:`data_dir`. Its gzipped files are copied to ``cache`` and extracted there, so
        ``root`` is never written to (it may be read-only or shared).
    :param subset: keep this many examples, chosen with a generator seeded by ``seed``
        (e.g. the 1,000-image training set of the dropout experiments).
    :param download: let torchvision download the files when they are not found (needs
        internet; off by default, and never used by the tests or the demo).
    """
    import torchvision

    target = os.path.join(cache_dir(cache), "torchvision")
    raw = os.path.join(target, "MNIST", "raw")
    have = all(os.path.exists(os.path.join(raw, f)) for f in _MNIST_FILES)
    if not have:
        source = None
        try:
            source = os.path.join(data_dir(root), "MNIST", "raw")
        except FileNotFoundError:
            if not download:
                raise
        if source is not None and os.path.isdir(source):
            os.makedirs(raw, exist_ok=True)
            for name in _MNIST_FILES:
                gz = os.path.join(source, name + ".gz")
                if not os.path.exists(gz):
                    raise FileNotFoundError(f"MNIST file {gz} is missing")
                if not os.path.exists(os.path.join(raw, name + ".gz")):
                    shutil.copyfile(gz, os.path.join(raw, name + ".gz"))
        elif not download:
            raise FileNotFoundError(f"no MNIST files in {source} (expected MNIST/raw/*.gz under the data folder)")
    dataset = torchvision.datasets.MNIST(target, train=train, download=True)
    x = dataset.data.unsqueeze(1).to(torch.get_default_dtype()) / 255.0
    y = dataset.targets.long()
    if subset is not None:
        if not 0 < subset <= x.shape[0]:
            raise ValueError(f"subset must be between 1 and {x.shape[0]}, got {subset}")
        idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:subset]
        x, y = x[idx], y[idx]
    return x, y
