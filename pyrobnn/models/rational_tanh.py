"""tanh as a rational function, for compiled float32 code.

Inductor compiles ``torch.tanh`` to a call of SLEEF's vectorized tanh (1-ULP accurate), which
is most of the time of a small tanh network's potential and gradient: on the 1-50-1 network of
``benchmarks/hmc_speed.py`` it is about 60% of the compiled kernel (measured by putting a
piecewise-linear activation in its place). XLA, which NumPyro compiles to, evaluates float32
tanh as a rational function instead. This module does the same, so that our compiled NUTS path
is not slower for the choice of the special-function library:

.. math::

    \\tanh x \\approx x \\, \\frac{P(x^2)}{Q(x^2)}, \\qquad |x| \\le 9,

with :math:`P` of degree 6 and :math:`Q` of degree 3 in :math:`x^2` (coefficients fitted here
by iteratively reweighted least squares on the relative error, at most 3e-8 in exact
arithmetic), the result clamped to :math:`[-1, 1]`, and :math:`\\operatorname{sign} x` for
:math:`|x| \\ge 9` (where float32 ``tanh`` has rounded to :math:`\\pm 1`). Evaluated in
float32 by Horner's rule its error is at most about 3.4e-7 absolute and relative
(``tests/test_rational_tanh.py``), against about 6e-8 for ``torch.tanh``: a few units in the
last place. The derivative is the exact identity
:math:`1 - \\tanh^2 x` of the approximated value, as ``torch.tanh``'s backward computes it.

It is all multiply-adds and one division, which Inductor fuses and vectorizes: the compiled
potential and gradient of the 1-50-1 network take about 1.6-1.9 times less time. Eager code
would pay a kernel launch per operation, so :func:`tanh_for` uses it only while
``torch.compile`` traces float32 code, and ``torch.tanh`` otherwise.
"""

from __future__ import annotations

import torch

__all__ = ["rational_tanh", "tanh_for", "P", "Q", "CLAMP"]

#: beyond this, float32 tanh has rounded to +-1
CLAMP = 9.0
#: the coefficients of P and Q, from the lowest power of x^2 up (the native kernels take them too)
P = (
    0.9999999997236085, 0.13102931855860095, 0.003125033264506323, 1.1372937157985115e-05,
    -2.1099844969436203e-08, 5.691654019772252e-11, -9.530483637674602e-14,
)
Q = (1.0, 0.4643626377785265, 0.024579278621952944, 0.00025767339118658116)


def _horner(coefficients, s):
    acc = torch.full_like(s, coefficients[-1])
    for c in coefficients[-2::-1]:
        acc = acc * s + c
    return acc


def _rational(x):
    inner = x.clamp(-CLAMP, CLAMP)
    s = inner * inner
    y = (inner * _horner(P, s) / _horner(Q, s)).clamp(-1.0, 1.0)
    return torch.where(x.abs() >= CLAMP, torch.sign(x), y)  # NaN stays NaN


class _RationalTanh(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return _rational(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1.0 - y * y)


def rational_tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x)`` by the rational approximation above, with the derivative ``1 - y^2``."""
    return _RationalTanh.apply(x)


def tanh_for(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x)``: the rational form while ``torch.compile`` traces float32 code, else
    ``torch.tanh``."""
    if x.dtype == torch.float32 and torch.compiler.is_compiling():
        return rational_tanh(x)
    return torch.tanh(x)
