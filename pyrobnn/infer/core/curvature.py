"""The largest curvature of a posterior's potential, for choosing a gradient method's step size."""

from __future__ import annotations

import torch

from pyrobnn.utils import memory

__all__ = ["largest_curvature", "curvature_points", "CURVATURE_POINTS", "CURVATURE_BYTES"]

#: the most and the fewest training points the estimate uses (a seeded random subset of a larger
#: data set, its likelihood scaled by N / points), so that the cost of an ``"auto"`` step size does
#: not grow with the data set: :func:`curvature_points`
CURVATURE_POINTS = (256, 2048)
#: the activations (bytes, over all chains) the subset may produce in one pass: a network's size
#: sets how many points the estimate reads, by a rule on the network, not on the machine
CURVATURE_BYTES = 64 << 20


def curvature_points(potential, chains: int) -> int:
    r"""How many training points :func:`largest_curvature` reads by default: as many as produce
    :data:`CURVATURE_BYTES` of activations over ``chains`` chains, within :data:`CURVATURE_POINTS`,
    and at most the data set. A subset's top eigenvalue overestimates the full data's a little
    (:math:`E[\lambda_{\max}(\hat H)] \ge \lambda_{\max}(H)`), which gives a slightly smaller step;
    the 1-50-1 network of the UCI protocol reads 2,048 points, a CNN on 28x28 images 256."""
    per_point = memory.activation_bytes(potential.model.net, potential.x) * max(chains, 1)
    low, high = CURVATURE_POINTS
    return int(min(potential.x.shape[0], max(low, min(high, CURVATURE_BYTES // max(per_point, 1)))))


def _hvp(potential, z, v, x, y, scale, prior):
    """Per chain, the Hessian of ``-(prior + scale * log-likelihood on (x, y))`` at ``z``
    applied to ``v``; the graph is freed when it returns."""
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        log_prior, log_lik = potential.log_joint_terms(zz, x, y)
        energy = -(scale * log_lik + (log_prior if prior else 0.0))
        (grad,) = torch.autograd.grad(energy.sum(), zz, create_graph=True)
        (hv,) = torch.autograd.grad((grad * v).sum(), zz)
    return hv.detach()


def largest_curvature(potential, z, iterations: int = 50, generator=None, points="auto", rtol: float = 1e-2) -> torch.Tensor:
    r"""Per chain, the largest absolute eigenvalue of the Hessian of :math:`U(z) = -\log p(z \mid
    \mathcal D)` at ``z`` ``(C, D)``, by power iteration on Hessian-vector products. Gradient
    methods are stable only for step sizes below a constant over it (SGLD on a Gaussian:
    :math:`\epsilon \lambda_{\max} < 4`; SGD with momentum :math:`\beta` on the per-point loss:
    :math:`\text{lr}\, \lambda_{\max} / N < 2(1 + \beta)`): the ``"auto"`` step sizes of
    :mod:`pyrobnn.infer.sgmcmc` and :mod:`pyrobnn.infer.modes.swag` are set from it.

    The likelihood's Hessian is estimated on ``points`` training points (``"auto"``:
    :func:`curvature_points`; a random subset drawn with ``generator``, scaled by
    :math:`N / \text{points}`; ``None``: all of them), each product accumulated over chunks of them
    within the memory budget (:mod:`pyrobnn.utils.memory`), so that neither time nor memory grows with
    the data set. The iteration stops after ``iterations`` products, or once every chain's estimate
    changes by less than ``rtol`` (relative) from one product to the next: the ``"auto"`` steps are
    a tenth or less of the stability limit, so a percent does not matter."""
    x, y = potential.x, potential.y
    n = x.shape[0]
    scale = 1.0
    if points == "auto":
        points = curvature_points(potential, z.shape[0])
    if points is not None and n > points:
        chosen = torch.randperm(n, generator=generator, device="cpu")[:points].to(x.device)
        x, y, scale = x[chosen], y[chosen], n / points
    step = memory.points_per_chunk(x.shape[0], z.shape[0], memory.activation_bytes(potential.model.net, x), memory.GRADIENT_FACTOR + 1)
    chunks = [(x[i : i + step], y[i : i + step]) for i in range(0, x.shape[0], step)]
    v = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    v = v / v.norm(dim=-1, keepdim=True)
    estimate = torch.zeros(z.shape[0], dtype=z.dtype, device=z.device)
    with torch.enable_grad():
        if len(chunks) == 1:  # the gradient's graph fits the budget: built once, differentiated per product
            zz = z.detach().requires_grad_(True)
            log_prior, log_lik = potential.log_joint_terms(zz, *chunks[0])
            (grad,) = torch.autograd.grad(-(scale * log_lik + log_prior).sum(), zz, create_graph=True)

            def product(v):
                return torch.autograd.grad((grad * v).sum(), zz, retain_graph=True)[0].detach()
        else:

            def product(v):
                return sum(_hvp(potential, z, v, xc, yc, scale, prior=i == 0) for i, (xc, yc) in enumerate(chunks))

        for _ in range(iterations):
            hv = product(v)
            previous, estimate = estimate, (hv * v).sum(-1).abs()
            norm = hv.norm(dim=-1, keepdim=True)
            if not torch.isfinite(norm).all():
                raise FloatingPointError("the Hessian-vector product is not finite at the starting point")
            v = hv / norm.clamp_min(torch.finfo(z.dtype).tiny)
            if bool(((estimate - previous).abs() <= rtol * estimate).all()):
                break
    return estimate
