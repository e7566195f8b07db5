"""Data sets generated in code (no downloads)."""

from __future__ import annotations

import math

import torch

__all__ = ["blundell_curve", "blundell_regression", "gap_regression", "two_moons"]


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
