"""Running an ordinary network with some of its parameters replaced by sampled tensors.

Sampled weights may carry leading *sample* dimensions (from ``Predictive(parallel=True)``,
vectorized ELBO particles, or any ``pyro.plate`` outside the model). ``F.linear`` and the
convolutions take no batch of weights, so those are mapped with :func:`torch.func.vmap`:
one batched pass over all samples, whatever the network's ``forward`` does.

Pyro's convention for a site sampled outside the data plate is batch shape
``sample_dims + (1,) * data_plate_dims``: the trailing singleton dimensions are the slots of
the model's own plates. :func:`sample_shape_of` strips them (``Predictive`` also passes
values without the slots, which are read as sample dimensions).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import vmap

from pyrobnn.models.estimators import SUPPORTED_LAYERS, apply_layer, estimator_active
from pyrobnn.models.rational_tanh import tanh_for

__all__ = ["swap_parameters", "route_layers", "sample_shape_of", "call_with_weights"]


class swap_parameters:
    """Context manager that puts tensors in place of module parameters and restores them.

    Writes ``module._parameters[name]`` directly: ``torch.func.functional_call`` does the
    same job but costs tens of microseconds per call in generic bookkeeping, which shows on
    small networks where a training step takes a few hundred.
    """

    __slots__ = ("_items", "_saved")

    def __init__(self, items):
        # items: iterable of (module, param_name, tensor)
        self._items = items
        self._saved = []

    def __enter__(self):
        saved = self._saved
        for module, name, value in self._items:
            params = module._parameters
            saved.append((params, name, params[name]))
            params[name] = value
        return self

    def __exit__(self, *exc):
        for params, name, old in reversed(self._saved):
            params[name] = old
        self._saved.clear()
        return False


class route_layers:
    """Context manager that sends each random layer's forward through the
    ``"pyrobnn_layer"`` effect (see :mod:`pyrobnn.models.estimators`), by giving the module
    instance its own ``forward`` for the duration. Only the model's own modules change;
    nothing global is patched."""

    __slots__ = ("_layers",)

    def __init__(self, sites, values):
        layers = {}
        for site, value in zip(sites, values):
            entry = layers.setdefault(id(site.module), (site.module, {}, {}))
            entry[1][site.param_name] = site
            entry[2][site.param_name] = value
        for module, _, _ in layers.values():
            if not isinstance(module, SUPPORTED_LAYERS):
                raise ValueError(
                    f"the estimator supports random parameters in "
                    f"{', '.join(t.__name__ for t in SUPPORTED_LAYERS)} layers; "
                    f"{type(module).__name__} has random parameters"
                )
        self._layers = list(layers.values())

    def __enter__(self):
        for module, sites, values in self._layers:
            module.forward = lambda x, m=module, s=sites, v=values: apply_layer(m, x, s, v)
        return self

    def __exit__(self, *exc):
        for module, _, _ in self._layers:
            del module.__dict__["forward"]
        return False


def sample_shape_of(value: torch.Tensor, site, data_dims: int = 1) -> torch.Size:
    """The leading sample dimensions of a sampled parameter, without the plate slots."""
    extra = value.dim() - len(site.shape)
    if extra < 0 or value.shape[extra:] != site.shape:
        raise ValueError(
            f"site {site.name!r}: a value of shape {tuple(value.shape)} does not end with the "
            f"parameter's shape {tuple(site.shape)}"
        )
    batch = value.shape[:extra]
    if len(batch) <= data_dims:
        # Pyro's Predictive conditions on samples of shape (S,) + event shape without the
        # plate slots; weights never vary along the data plate, so these are sample dims
        return batch
    slots = batch[len(batch) - data_dims:]
    if any(s != 1 for s in slots):
        raise ValueError(
            f"site {site.name!r}: sample dimensions {tuple(batch)} put a size other than 1 in "
            "the data plate's slot; sample weights outside the model's plates"
        )
    return batch[: len(batch) - data_dims]


def broadcast_sizes(*shapes) -> torch.Size:
    """``torch.broadcast_shapes`` for plain shapes (which costs tens of microseconds there)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    raise ValueError(f"sample shapes {shapes} do not broadcast")
                out[i] = size
    return torch.Size(out)


#: modules that act element-wise (or as the identity in eval mode), so that a stack of
#: them and Linear layers can run on a leading sample dimension with batched products
_ELEMENTWISE = (
    nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU, nn.SiLU, nn.Softplus,
    nn.Identity, nn.Dropout, nn.Mish, nn.Hardtanh, nn.CELU, nn.SELU,
)


def batched_stack(net):
    """For a ``Linear`` layer, or an ``nn.Sequential`` of ``Linear`` layers and element-wise
    modules, the list of its layers; ``None`` for anything else."""
    if type(net) is nn.Linear:
        return [net]
    if not isinstance(net, nn.Sequential):
        return None
    layers = list(net)
    if not layers or not all(type(m) is nn.Linear or isinstance(m, _ELEMENTWISE) for m in layers):
        return None
    return layers


def _run_stack(layers, sites, weights, x):
    # weights: {(id(module), param_name): (S, *shape)}; x: (N, in) -> (S, N, out)
    h = x
    for module in layers:
        if type(module) is nn.Tanh:
            h = tanh_for(h)  # the rational form in compiled float32 code: see rational_tanh
            continue
        if type(module) is not nn.Linear:
            h = module(h)
            continue
        w = weights.get((id(module), "weight"), module.weight)
        b = weights.get((id(module), "bias"), module.bias)
        h = torch.matmul(h, w.transpose(-1, -2))
        if b is not None:
            h = h + (b.unsqueeze(-2) if b.dim() > 1 else b)
    return h


def call_with_weights(net, sites, values, x, data_dims: int = 1, batched_inputs: bool = False):
    """``net(x)`` with each site's parameter replaced by ``values[site.name]``.

    With ``batched_inputs``, ``x`` carries the values' (one) sample dimension first: sample
    ``s`` runs on ``x[s]`` (a minibatch of its own per chain).

    While an estimator handler is active the random layers route through it
    (:class:`route_layers`). Values without sample dimensions are swapped in and the network
    runs once. Otherwise the
    sample dimensions of all values are broadcast together, flattened, and the network is
    vmapped over them (``randomness="different"``, so any noise drawn inside the network is
    independent per sample). The output has shape ``sample_shape + net(x).shape``.
    """
    shapes = [sample_shape_of(values[s.name], s, data_dims) for s in sites]
    sample_shape = broadcast_sizes(*shapes) if shapes else torch.Size()
    route = estimator_active()
    if batched_inputs and (len(sample_shape) != 1 or x.shape[0] != sample_shape[0]):
        raise ValueError(f"batched inputs need one sample dimension matching x's first ({x.shape[0]}), got {tuple(sample_shape)}")
    if not sample_shape:
        weights = [values[s.name].reshape(s.shape) for s in sites]
        with swap_parameters([(s.module, s.param_name, w) for s, w in zip(sites, weights)]):
            if route:
                with route_layers(sites, weights):
                    return net(x)
            return net(x)

    flat = []
    for site, shape in zip(sites, shapes):
        v = values[site.name].reshape(shape + site.shape)
        flat.append(v.expand(sample_shape + site.shape).reshape((-1,) + site.shape))

    layers = None if route or x.dim() != (3 if batched_inputs else 2) else batched_stack(net)
    if layers is not None:
        # Linear layers with a sample dimension are batched products: no vmap needed
        out = _run_stack(layers, sites, {(id(s.module), s.param_name): w for s, w in zip(sites, flat)}, x)
        return out.reshape(sample_shape + out.shape[1:])

    if torch.compiler.is_compiling():
        # Dynamo refuses to trace a module's parameter dict being mutated inside a higher-order
        # operator (the samplers' compiled while_loop); functional_call is what it supports
        names = [s.name for s in sites]

        def compiled_sample(x_s, *weights):
            return torch.func.functional_call(net, dict(zip(names, weights)), (x_s,))

        if batched_inputs:
            return vmap(compiled_sample, randomness="different")(x, *flat)
        out = vmap(compiled_sample, in_dims=(None,) + (0,) * len(flat), randomness="different")(x, *flat)
        return out.reshape(sample_shape + out.shape[1:])

    norms = updating_norms(net)
    if norms and not route:
        out = _vmap_with_norm_statistics(net, sites, flat, x, norms, batched_inputs)
        return out if batched_inputs else out.reshape(sample_shape + out.shape[1:])

    def one_sample(*weights):
        with swap_parameters([(s.module, s.param_name, w) for s, w in zip(sites, weights)]):
            if route:
                with route_layers(sites, weights):
                    return net(x)
            return net(x)

    if batched_inputs:
        def one_sample_on_its_inputs(x_s, *weights):
            with swap_parameters([(s.module, s.param_name, w) for s, w in zip(sites, weights)]):
                if route:
                    with route_layers(sites, weights):
                        return net(x_s)
                return net(x_s)

        return vmap(one_sample_on_its_inputs, randomness="different")(x, *flat)
    out = vmap(one_sample, randomness="different")(*flat)
    return out.reshape(sample_shape + out.shape[1:])


def updating_norms(net) -> list:
    """The batch-normalization layers of ``net`` that update running statistics when called
    (training mode with ``track_running_stats``)."""
    return [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats]


def _vmap_with_norm_statistics(net, sites, flat, x, norms, batched_inputs):
    """The vmapped pass of :func:`call_with_weights` through a network whose batch
    normalization updates running statistics: each weight draw normalizes its own activations by
    their batch statistics (as it would alone) and updates a copy of the running statistics; the
    network's own statistics then take the mean of the copies (the update of one call with the
    draws' average batch statistics). ``vmap`` cannot update one shared buffer from every draw."""
    names = [s.name for s in sites]
    owners = {id(m) for m in norms}
    buffers = {n: b for n, b in net.named_buffers() if id(net.get_submodule(n.rsplit(".", 1)[0] if "." in n else "")) in owners}
    rows = flat[0].shape[0] if flat else x.shape[0]
    copies = {n: b.detach().unsqueeze(0).expand((rows,) + tuple(b.shape)).clone() for n, b in buffers.items()}

    def one(x_s, *tensors):
        weights, stats = tensors[: len(names)], tensors[len(names):]
        return torch.func.functional_call(net, {**dict(zip(names, weights)), **dict(zip(copies, stats))}, (x_s,))

    in_x = 0 if batched_inputs else None
    out = vmap(one, in_dims=(in_x,) + (0,) * (len(flat) + len(copies)), randomness="different")(x, *flat, *copies.values())
    with torch.no_grad():
        for name, buffer in buffers.items():
            updated = copies[name]
            buffer.copy_(updated[0] if not buffer.is_floating_point() else updated.mean(0))
    return out
