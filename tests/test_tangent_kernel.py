"""The perceptron's tangent kernel in closed form (pyrobnn.infer.modes.tangent_kernel) against
the Jacobians it replaces: J Sigma_0 J^T from a reverse pass per point, its gradient in the
inputs, the function-space Laplace posterior built on it, and the networks it must refuse."""

import pytest
import torch
from torch import nn

from pyrobnn.infer.modes.laplace import FunctionSpaceLaplace, parameter_jacobians
from pyrobnn.infer.modes.tangent_kernel import MLPTangentKernel, TangentKernelLaplace
from pyrobnn.models.infinite_width import Cos, Erf, InputScaling, OutputMean


def perceptron(activation, d=3, width=7, outputs=1, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(InputScaling(torch.full((d,), 0.5), torch.linspace(0.5, 2.0, d)),
                        nn.Linear(d, width), activation(), nn.Linear(width, width), activation(),
                        nn.Linear(width, outputs), OutputMean(torch.full((outputs,), 3.0)))
    return net.to(dtype)


def point_and_variances(net, names=None, seed=1):
    """The covered parameters (all, or ``names``) and a different prior variance per tensor."""
    g = torch.Generator().manual_seed(seed)
    point = {n: p.detach().clone() for n, p in net.named_parameters() if names is None or n in names}
    variances = torch.cat([torch.full((v.numel(),), float(torch.rand((), generator=g)) + 0.1, dtype=v.dtype) for v in point.values()])
    return point, variances


def jacobian_kernel(net, point, variances, xa, xb, outputs):
    _, Ja = parameter_jacobians(net, point, xa)
    _, Jb = parameter_jacobians(net, point, xb)
    Ja, Jb = Ja[:, :outputs].reshape(-1, Ja.shape[-1]), Jb[:, :outputs].reshape(-1, Jb.shape[-1])
    return (Ja * variances) @ Jb.T


@pytest.mark.parametrize("activation", [Erf, nn.ReLU, Cos, nn.Tanh, nn.SiLU])
@pytest.mark.parametrize("outputs", [1, 3])
def test_the_closed_form_is_the_jacobians_kernel_and_so_is_its_gradient(activation, outputs):
    net = perceptron(activation, outputs=outputs)
    point, variances = point_and_variances(net)
    kernel = MLPTangentKernel.of(net, point, variances)
    assert kernel is not None
    g = torch.Generator().manual_seed(2)
    xa = torch.rand(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    xb = torch.rand(4, 3, generator=g, dtype=torch.float64)
    mean, fa = kernel.features(xa)
    _, fb = kernel.features(xb)
    closed = kernel.kernel(fa, fb)
    expected = jacobian_kernel(net, point, variances, xa, xb, outputs)
    torch.testing.assert_close(mean, net(xa), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(closed, expected, rtol=1e-10, atol=1e-12)
    weights = torch.randn(closed.shape, generator=g, dtype=torch.float64)
    grad, = torch.autograd.grad((closed * weights).sum(), xa)
    grad_expected, = torch.autograd.grad((expected * weights).sum(), xa)
    torch.testing.assert_close(grad, grad_expected, rtol=1e-9, atol=1e-11)


def test_a_subset_of_layers_and_the_first_outputs_float32():
    """The last layer's weights alone (Laplace's ``subset="last_layer"``), the first of two outputs
    (a heteroscedastic network's location), in single precision."""
    net = perceptron(Erf, outputs=2, dtype=torch.float32)
    point, variances = point_and_variances(net, names={"5.weight", "5.bias"})
    kernel = MLPTangentKernel.of(net, point, variances)
    x = torch.rand(6, 3)
    _, f = kernel.features(x, outputs=1)
    torch.testing.assert_close(kernel.kernel(f, f), jacobian_kernel(net, point, variances, x, x, 1), rtol=1e-5, atol=1e-6)
    point, variances = point_and_variances(net, names={"1.weight", "3.bias"})  # a weight without its bias, and a bias alone
    kernel = MLPTangentKernel.of(net, point, variances)
    _, f = kernel.features(x)
    torch.testing.assert_close(kernel.kernel(f, f), jacobian_kernel(net, point, variances, x, x, 2), rtol=1e-5, atol=1e-6)


def test_the_closed_form_posterior_is_the_function_space_laplace():
    net = perceptron(nn.ReLU, outputs=2)
    point, variances = point_and_variances(net)
    g = torch.Generator().manual_seed(3)
    train = torch.rand(9, 3, generator=g, dtype=torch.float64)
    x = torch.rand(4, 3, 3, generator=g, dtype=torch.float64)  # 4 batches of q = 3
    noise = 0.05
    closed = TangentKernelLaplace(MLPTangentKernel.of(net, point, variances), train, noise, outputs=2)
    mean, cov = closed.predict(x)
    _, J = parameter_jacobians(net, point, train)
    _, Js = parameter_jacobians(net, point, x.reshape(-1, 3))
    expected = FunctionSpaceLaplace(J.reshape(-1, J.shape[-1]), variances, noise).posterior_covariance(Js.reshape(4, 6, -1))
    torch.testing.assert_close(mean, net(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cov, expected, rtol=1e-9, atol=1e-12)
    assert torch.linalg.eigvalsh(cov).min() > -1e-10


def test_networks_without_the_form_are_refused():
    """``of`` returns None, so the Jacobians are formed, for anything it cannot factor."""
    d = 3
    cases = {
        "dropout between layers": nn.Sequential(nn.Linear(d, 5), nn.ReLU(), nn.Dropout(0.1), nn.Linear(5, 1)),
        "batch norm": nn.Sequential(nn.Linear(d, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 1)),
        "softmax (not elementwise)": nn.Sequential(nn.Linear(d, 5), nn.Softmax(-1), nn.Linear(5, 1)),
        "a CNN": nn.Sequential(nn.Unflatten(1, (1, d)), nn.Conv1d(1, 2, 2), nn.Flatten(), nn.Linear(2 * (d - 1), 1)),
        "not a Sequential": nn.Linear(d, 1),
        "a module after the output": nn.Sequential(nn.Linear(d, 5), nn.Tanh(), nn.Linear(5, 1), nn.Tanh()),
    }
    for name, net in cases.items():
        point, variances = point_and_variances(net.double())
        assert MLPTangentKernel.of(net, point, variances) is None, name
    net = perceptron(Erf)
    point, variances = point_and_variances(net)
    variances[0] *= 2  # one weight of the first layer with its own prior variance
    assert MLPTangentKernel.of(net, point, variances) is None
    assert MLPTangentKernel.of(net, point, variances[:-1]) is None  # a variance missing


def test_a_relu_temperature_makes_the_variance_continuous_and_tends_to_the_steps():
    """With ReLU's slope a sigmoid at temperature tau the kernel's diagonal along a segment has no
    jumps (the steps' jumps where a unit turns on or off are gone), and as tau -> 0 it is the
    steps' kernel again."""
    net = perceptron(nn.ReLU)
    point, variances = point_and_variances(net)
    steps = MLPTangentKernel.of(net, point, variances)
    t = torch.linspace(0, 1, 4001, dtype=torch.float64)[:, None]
    x = torch.tensor([[-1.0, -0.5, -1.0]], dtype=torch.float64) * (1 - t) + torch.tensor([[2.0, 1.5, 2.0]], dtype=torch.float64) * t

    def diagonal(kernel):  # K(x, x) at each point: each point its own batch of one
        _, f = kernel.features(x)
        batched = [(u.unsqueeze(1), g.unsqueeze(1), s_w, s_b) for u, g, s_w, s_b in f]
        return kernel.kernel(batched, batched)[:, 0, 0]

    jumps = diagonal(steps).diff().abs()
    smooth = diagonal(MLPTangentKernel.of(net, point, variances, relu_temperature=0.1)).diff().abs()
    # the steps' largest jump is a unit's contribution; the smooth kernel's neighbours differ by its slope times 1/4000
    assert jumps.max() > 20 * smooth.max()
    g = torch.Generator().manual_seed(5)
    xa = torch.rand(6, 3, generator=g, dtype=torch.float64)
    _, fa = steps.features(xa)
    _, fc = MLPTangentKernel.of(net, point, variances, relu_temperature=1e-9).features(xa)
    torch.testing.assert_close(MLPTangentKernel.kernel(fc, fc), MLPTangentKernel.kernel(fa, fa), rtol=1e-10, atol=1e-12)
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="relu_temperature"):
            MLPTangentKernel.of(net, point, variances, relu_temperature=bad)


def test_bad_inputs_are_refused_naming_the_argument():
    net = perceptron(Erf)
    point, variances = point_and_variances(net)
    kernel = MLPTangentKernel.of(net, point, variances)
    with pytest.raises(ValueError, match=r"x must be \(n, 3\)"):
        kernel.features(torch.rand(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x must be \(n, 3\)"):
        kernel.features(torch.rand(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="outputs must be an int from 1"):
        kernel.features(torch.rand(4, 3, dtype=torch.float64), outputs=2)
    train = torch.rand(5, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="train_x has NaN"):
        TangentKernelLaplace(kernel, torch.cat([train, torch.full((1, 3), float("nan"), dtype=torch.float64)]), 0.1, outputs=1)
    for noise in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="noise_variance must be positive"):
            TangentKernelLaplace(kernel, train, noise, outputs=1)
    closed = TangentKernelLaplace(kernel, train, 0.1, outputs=1)
    with pytest.raises(ValueError, match=r"x must be \(c, q, d\)"):
        closed.predict(torch.rand(4, 3, dtype=torch.float64))
    # no training points: the posterior is the prior, K(x, x)
    empty = TangentKernelLaplace(kernel, train[:0], 0.1, outputs=1)
    x = torch.rand(2, 3, 3, dtype=torch.float64)
    _, f = kernel.features(x.reshape(6, 3))
    batched = [(u.reshape(2, 3, -1), g.reshape(2, 3, *g.shape[1:]), a, b) for u, g, a, b in f]
    torch.testing.assert_close(empty.predict(x)[1], kernel.kernel(batched, batched), rtol=1e-12, atol=1e-14)
