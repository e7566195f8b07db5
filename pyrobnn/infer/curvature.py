"""The largest curvature of a posterior's potential, for choosing a gradient method's step size."""

from __future__ import annotations

import torch

__all__ = ["largest_curvature"]


def largest_curvature(potential, z, iterations: int = 50, generator=None) -> torch.Tensor:
    r"""Per chain, the largest absolute eigenvalue of the Hessian of :math:`U(z) = -\log p(z \mid
    \mathcal D)` (full data) at ``z`` ``(C, D)``, by power iteration on Hessian-vector products.
    Gradient methods are stable only for step sizes below a constant over it (SGLD on a
    Gaussian: :math:`\epsilon \lambda_{\max} < 4`; SGD with momentum :math:`\beta` on the
    per-point loss: :math:`\text{lr}\, \lambda_{\max} / N < 2(1 + \beta)`): the ``"auto"``
    step sizes of :mod:`pyrobnn.infer.sgmcmc` and :mod:`pyrobnn.infer.modes.swag` are set from it."""
    v = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    v = v / v.norm(dim=-1, keepdim=True)
    estimate = torch.zeros(z.shape[0], dtype=z.dtype, device=z.device)
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(potential(zz).sum(), zz, create_graph=True)
        for _ in range(iterations):
            (hv,) = torch.autograd.grad((grad * v).sum(), zz, retain_graph=True)
            hv = hv.detach()
            estimate = (hv * v).sum(-1).abs()
            norm = hv.norm(dim=-1, keepdim=True)
            if not torch.isfinite(norm).all():
                raise FloatingPointError("the Hessian-vector product is not finite at the starting point")
            v = hv / norm.clamp_min(torch.finfo(z.dtype).tiny)
    return estimate
