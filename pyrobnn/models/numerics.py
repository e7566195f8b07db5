"""Numerical building blocks shared by eager and compiled code."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["softplus"]


def softplus(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\log(1 + e^x)`.

    Eagerly this is ``torch.nn.functional.softplus``. Under ``torch.compile`` it is written as
    :math:`\max(x, 0) + \log(w) \, u / (w - 1)` with :math:`u = e^{-|x|}`, :math:`w = 1 + u`
    (Kahan's accurate ``log1p``; exactly :math:`u` where :math:`w` rounds to 1), because the
    CPU kernel generated for ``log1p`` is a scalar library call about five times slower than
    the vectorized ``exp`` and ``log``. The two agree to a few units in the last place.
    """
    if torch.compiler.is_compiling():
        u = torch.exp(-x.abs())
        w = 1.0 + u
        return x.clamp_min(0.0) + torch.where(w == 1.0, u, torch.log(w) * (u / (w - 1.0)))
    return F.softplus(x)
