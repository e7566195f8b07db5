r"""The prior-weighted tangent kernel of a multilayer perceptron, in closed form.

For a network :math:`f(x, w)` built as an ``nn.Sequential`` of fixed input maps (no weights), then
``Linear`` layers :math:`l = 1 \dots L` with one elementwise activation :math:`\phi_l` between
each two, then fixed output offsets (:class:`~pyrobnn.models.infinite_width.OutputMean`), and a
Gaussian prior whose variance is one number per weight matrix and per bias (:math:`s^W_l`,
:math:`s^b_l`), the kernel of the linearized network,

.. math:: K\big((a, k), (b, k')\big) = J_{a k}\, \Sigma_0\, J_{b k'}^\top
          = \sum_l \big(g_l(a)_k \cdot g_l(b)_{k'}\big)\,\big(s^W_l\, u_l(a) \cdot u_l(b) + s^b_l\big),

where :math:`u_l(x)` is layer :math:`l`'s input, :math:`z_l = W_l u_l + b_l` its output and
:math:`g_l(x)_k = \partial f_k / \partial z_l` the gradient of output :math:`k` there, by the
chain rule :math:`g_L = I`, :math:`g_l = (g_{l+1} W_{l+1}) \odot \phi_l'(z_l)`: the Jacobian in
layer :math:`l`'s weights is the outer product :math:`g_l(x)_k\, u_l(x)^\top`, so the inner products
of two Jacobians factor into inner products of the layer's inputs and of its gradients (Jacot,
Gabriel & Hongler 2018, "Neural Tangent Kernel"; Novak et al. 2022, "Fast Finite Width Neural
Tangent Kernel", their structured-derivatives form). The numbers are those of
:math:`J \Sigma_0 J^\top` from the Jacobians, at :math:`O(n h)` memory for ``n`` points and width
``h`` where the Jacobians take :math:`O(n P)`, and differentiable in the inputs without a
reverse pass per point.

:class:`TangentKernelLaplace` is :class:`~pyrobnn.infer.modes.laplace.FunctionSpaceLaplace`'s
predictive (a full GGN's Laplace posterior under a Gaussian likelihood, as a GP with this kernel,
Khan et al. 2019, Immer et al. 2021) with the kernel taken in closed form.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from pyrobnn.models.infinite_width import Cos, Erf, InputScaling, OutputMean

__all__ = ["MLPTangentKernel", "TangentKernelLaplace"]

#: the activations whose derivative is taken elementwise (each output depends on its own input)
ELEMENTWISE = (Erf, Cos, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.ELU, nn.Softplus, nn.LeakyReLU)

#: the derivatives written out (autograd's values: ReLU's slope 0 at 0), for the activations of
#: pyrobnn's surrogates; the others' by forward-mode differentiation (slower: a functorch transform per call)
DERIVATIVES = {
    Erf: lambda z: (2.0 / math.sqrt(math.pi)) * torch.exp(-z * z),
    nn.ReLU: lambda z: (z > 0).to(z.dtype),
    Cos: lambda z: -torch.sin(z),
    nn.Tanh: lambda z: 1.0 - torch.tanh(z) ** 2,
}


class MLPTangentKernel:
    """The closed-form tangent kernel (module docstring) of ``net`` at ``point`` (``{name: value}``
    of the covered parameters; the others as they are in ``net``), each covered parameter tensor
    with one prior variance. Build it with :meth:`of`, which says whether ``net`` has the form."""

    def __init__(self, inputs, layers, steps, outputs):
        self._inputs, self._layers, self._steps, self._outputs = inputs, layers, steps, outputs

    @classmethod
    def of(cls, net: nn.Module, point: dict, prior_variance: torch.Tensor, *,
           relu_temperature: Optional[float] = None) -> Optional["MLPTangentKernel"]:
        r"""The kernel of ``net`` at ``point`` under the prior variances ``prior_variance`` (one per
        weight, in ``point``'s order, flattened), or ``None`` when ``net`` is not such a perceptron
        (another module, a parameter outside the ``Linear`` layers, a layer's weights with several
        prior variances): then the Jacobians are the way.

        ``relu_temperature`` :math:`\tau`: a ReLU's slope is taken as :math:`\mathrm{sigmoid}(z /
        \tau)`, the slope of :math:`\tau \log(1 + e^{z/\tau})`, instead of its step: the kernel of
        the network with that smooth ReLU in its Jacobian (the network's values unchanged),
        continuous in the inputs where the step makes it jump wherever a unit turns on or off."""
        if relu_temperature is not None and not (float(relu_temperature) > 0 and math.isfinite(float(relu_temperature))):
            raise ValueError(f"relu_temperature must be positive and finite, got {relu_temperature!r}")
        if not isinstance(net, nn.Sequential):
            return None
        modules = list(net.named_children())
        linear = [i for i, (_, m) in enumerate(modules) if isinstance(m, nn.Linear)]
        if not linear:
            return None
        first, last = linear[0], linear[-1]
        if not all(isinstance(m, (InputScaling, nn.Identity)) for _, m in modules[:first]):
            return None
        if not all(isinstance(m, (OutputMean, nn.Identity)) for _, m in modules[last + 1 :]):
            return None
        between = [m for i, (_, m) in enumerate(modules[first : last + 1], first) if i not in linear]
        if [b - a for a, b in zip(linear, linear[1:])] != [2] * (len(linear) - 1) or not all(isinstance(m, ELEMENTWISE) for m in between):
            return None
        names = [n for n, _ in net.named_parameters()]
        if not set(point) <= set(names):
            return None
        variances, offset = {}, 0
        for name, value in point.items():
            block = prior_variance[offset : offset + value.numel()]
            offset += value.numel()
            if block.numel() == 0 or not bool((block == block[0]).all()):
                return None
            variances[name] = block[0]
        if offset != prior_variance.numel():
            return None
        layers = []
        for i in linear:
            prefix, layer = modules[i]
            w_name, b_name = f"{prefix}.weight", f"{prefix}.bias"
            weight = point.get(w_name, layer.weight).detach()
            bias_covered = layer.bias is not None and b_name in variances
            layers.append((weight, point.get(b_name, layer.bias).detach() if layer.bias is not None else None,
                           variances.get(w_name), variances.get(b_name) if bias_covered else None))
        steps = [_value_and_slope(m, None if relu_temperature is None else float(relu_temperature)) for m in between]
        return cls([m for _, m in modules[:first]], layers, steps, [m for _, m in modules[last + 1 :]])

    def features(self, x, outputs: Optional[int] = None):
        """``f(x)`` ``(n, m_all)`` and, per layer with covered weights, its inputs ``u_l`` ``(n, h_in)``,
        gradients ``g_l`` ``(n, m, h_out)`` for the first ``outputs`` outputs (all by default) and
        prior variances: the factors of :meth:`kernel`, differentiable in ``x``."""
        d = self._layers[0][0].shape[1]
        if x.dim() != 2 or x.shape[-1] != d:
            raise ValueError(f"x must be (n, {d}): points by the network's {d} inputs, got shape {tuple(x.shape)}")
        total = self._layers[-1][0].shape[0]
        if outputs is not None and not (isinstance(outputs, int) and 1 <= outputs <= total):
            raise ValueError(f"outputs must be an int from 1 to the network's {total} outputs, got {outputs!r}")
        for module in self._inputs:
            x = module(x)
        inputs, slopes = [], []
        u = x
        for i, (weight, bias, _, _) in enumerate(self._layers):
            inputs.append(u)
            z = torch.nn.functional.linear(u, weight, bias)
            if i < len(self._steps):
                u, slope = self._steps[i](z)
                slopes.append(slope)
            else:
                u = z
        mean = u
        for module in self._outputs:
            mean = module(mean)
        m = mean.shape[-1] if outputs is None else outputs
        g = torch.eye(m, self._layers[-1][0].shape[0], dtype=x.dtype, device=x.device).expand(x.shape[0], m, -1)
        factors = []
        for i in reversed(range(len(self._layers))):
            weight, _, s_w, s_b = self._layers[i]
            if s_w is not None or s_b is not None:
                factors.append((inputs[i], g, s_w, s_b))
            if i > 0:
                g = (g @ weight) * slopes[i - 1].unsqueeze(-2)
        return mean, factors[::-1]

    @staticmethod
    def kernel(a, b) -> torch.Tensor:
        """:math:`J_a \\Sigma_0 J_b^\\top` from two points' sets of :meth:`features` factors, batched
        over leading dimensions: ``a``'s ``(..., n_a, ...)`` and ``b``'s ``(..., n_b, ...)`` give
        ``(..., n_a m, n_b m)``, rows ordered point-major (point ``i``'s output ``k`` at
        ``i m + k``), as the Jacobians ``(n m, P)`` are."""
        total = None
        for (u_a, g_a, s_w, s_b), (u_b, g_b, _, _) in zip(a, b):
            *batch, n_a, m, h = g_a.shape
            n_b = g_b.shape[-3]
            # one matrix product per factor (an einsum's parsing and permutes cost as much at these sizes)
            grads = g_a.reshape(*batch, n_a * m, h) @ g_b.reshape(*g_b.shape[:-3], n_b * m, h).transpose(-1, -2)
            scale = None  # (..., n_a, n_b) where the weights are covered, else the bias's variance alone
            if s_w is not None:
                scale = s_w * (u_a @ u_b.transpose(-1, -2))
            if s_b is not None:
                scale = s_b if scale is None else scale + s_b
            if m > 1 and s_w is not None:  # each point's m x m block by its pair's scale
                *shape, _, _ = grads.shape
                term = (grads.reshape(*shape, n_a, m, n_b, m) * scale[..., :, None, :, None]).reshape(grads.shape)
            else:
                term = grads * scale
            total = term if total is None else total + term
        return total


def _value_and_slope(activation, relu_temperature):
    """``z -> (activation(z), its slope at z)`` for an elementwise activation, chosen once: a ReLU's
    smooth step at ``relu_temperature`` when given, a written-out derivative
    (:data:`DERIVATIVES`), else forward-mode differentiation."""
    if relu_temperature is not None and type(activation) is nn.ReLU:
        def slope(z):
            return torch.sigmoid(z / relu_temperature)
    elif type(activation) in DERIVATIVES:
        slope = DERIVATIVES[type(activation)]
    else:
        return lambda z: torch.func.jvp(activation, (z,), (torch.ones_like(z),))

    def step(z):
        s = slope(z)  # before the activation, which may act in place
        return activation(z), s

    return step


class TangentKernelLaplace:
    r""":class:`~pyrobnn.infer.modes.laplace.FunctionSpaceLaplace`'s posterior with the kernel
    in closed form (:class:`MLPTangentKernel`): from the training inputs ``train_x`` ``(N, d)``
    and the noise variance :math:`\sigma^2`,
    :math:`\mathrm{Cov} = K_{**} - K_{*X}(K_{XX} + \sigma^2 I)^{-1} K_{X*}` for each batch of
    points, the mean the network's output at the MAP. ``outputs``: the first outputs covered (a
    heteroscedastic network's location half)."""

    def __init__(self, kernel: MLPTangentKernel, train_x, noise_variance, outputs: int):
        if not bool(torch.isfinite(train_x).all()):
            raise ValueError("train_x has NaN or infinite values")
        noise = float(noise_variance)
        if not (noise > 0 and math.isfinite(noise)):
            raise ValueError(f"noise_variance must be positive and finite, got {noise_variance!r}")
        self.tangent, self.outputs = kernel, outputs
        with torch.no_grad():
            _, self.train = kernel.features(train_x, outputs)
            k = kernel.kernel(self.train, self.train)
        eye = torch.eye(k.shape[0], dtype=k.dtype, device=k.device)
        self.cholesky = torch.linalg.cholesky(k + torch.as_tensor(noise_variance, dtype=k.dtype, device=k.device) * eye)

    def predict(self, x):
        """For ``x`` ``(c, q, d)``: the network's outputs ``(c, q, m_all)`` and each batch's joint
        covariance over its ``q`` points' covered outputs ``(c, q m, q m)``."""
        if x.dim() != 3:
            raise ValueError(f"x must be (c, q, d): batches of q points, got shape {tuple(x.shape)}")
        c, q, d = x.shape
        mean, factors = self.tangent.features(x.reshape(c * q, d), self.outputs)
        batched = [(u.reshape(c, q, -1), g.reshape(c, q, *g.shape[1:]), s_w, s_b) for u, g, s_w, s_b in factors]
        prior = self.tangent.kernel(batched, batched)  # (c, q m, q m)
        cross = self.tangent.kernel(factors, self.train)  # (c q m, N m)
        v = torch.linalg.solve_triangular(self.cholesky, cross.T, upper=False)  # (N m, c q m)
        v = v.reshape(v.shape[0], c, q * self.outputs).permute(1, 0, 2)  # (c, N m, q m)
        return mean.reshape(c, q, -1), prior - v.transpose(-1, -2) @ v
