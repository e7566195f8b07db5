r"""The potential of the common Bayesian MLP and the samplers' leaf in native code, compiled once per machine.

For the common Bayesian MLP (a stack of ``nn.Linear`` layers with tanh, ReLU, GELU, sigmoid or erf
activations, optionally behind a fixed input map and ahead of a constant output offset, as the
Bayesian-optimization surrogates' calibrated networks are; Normal priors on the random weights,
and a likelihood that declares a native form,
:meth:`~pyrobnn.models.likelihoods.Likelihood.native_form`: a Gaussian with a fixed or latent
noise scale, heteroscedastic Gaussian, categorical or Bernoulli) the potential
:math:`U(z) = -\log p(y \mid x, w) - \log p(w) - \log|J|` of
:class:`~pyrobnn.infer.core.potential.FlatPotential` and its gradient are written out by hand in
``mlp_kernels.cpp`` (backpropagation by hand, checked against ``torch.autograd`` in
``tests/test_native.py``), together with the NUTS transition and the MCLMC step around them.
The samplers take them (:mod:`pyrobnn.infer.mcmc.backend`), and so does a deep ensemble's
full-batch MAP (:func:`pyrobnn.infer.modes.ensemble.gradient_path`): they live in the shared core
because two method families use them. Each chain runs start to end in one pass over feature-major activations, so a chain whose NUTS
trajectory ends early costs nothing more, and groups of chains run on threads at once (ctypes
releases the GIL during a call).

**Why by hand.** Per leapfrog step of the 1-50-1 benchmark network, ``torch.compile``'s kernel
took 27-33 us for four chains, and compiling it took 10-16 s in every run and every spawned
process, because Inductor's cache does not store graphs with a ``while_loop``
(``docs/logs/benchmarks.md``). This file compiles in about 2 s with the system's C++ compiler, for every
shape, chain count and data set at once, and the library is kept in the user's cache folder:
a machine compiles it once.

**One source.** The codes, coefficients and thresholds the C++ shares with Python are written
in Python only: :mod:`.constants` renders them as the header the build compiles with.

**The cache.** :mod:`.build` compiles the file once per machine into the user's cache folder and
loads only a library it can trust (its checksum, owner and permissions checked). A user who
never takes the native path needs no compiler: without one, every sampler runs its torch code.

Models outside this family, other dtypes than float32/float64, and tensors on a GPU keep the
``torch`` path (:func:`unsupported_reason` says why).
"""

from __future__ import annotations

import ctypes
import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Optional

import torch
from torch import nn
from torch.distributions import biject_to
from torch.distributions.transforms import ExpTransform

from pyrobnn.infer.core.native.build import NativeUnavailable, build_info, is_cached, library, library_folder
from pyrobnn.infer.core.native.constants import ACTIVATIONS, LIKELIHOODS, NOISE_PRIORS
from pyrobnn.models.infinite_width import InputScaling, OutputMean
from pyrobnn.models.likelihoods import Likelihood
from pyrobnn.models.priors import NormalPrior

__all__ = ["NativeMLP", "unsupported_reason", "native_form", "multiply_adds", "library", "library_folder", "is_cached", "build_info", "NativeUnavailable",
           "native_refusal", "loading_note"]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", ctypes.c_int64), ("layers", ctypes.c_void_p), ("layer_prec", ctypes.c_void_p),
        ("constants", ctypes.c_void_p), ("num_points", ctypes.c_int64), ("x_t", ctypes.c_void_p),
        ("y_t", ctypes.c_void_p), ("labels", ctypes.c_void_p), ("likelihood", ctypes.c_int64),
        ("target_dim", ctypes.c_int64), ("lik_a", ctypes.c_double), ("lik_b", ctypes.c_double),
        ("noise_off", ctypes.c_int64), ("noise_prior", ctypes.c_int64), ("noise_a", ctypes.c_double),
        ("noise_b", ctypes.c_double), ("constant", ctypes.c_double), ("dim", ctypes.c_int64),
        ("max_width", ctypes.c_int64), ("out_offset", ctypes.c_void_p),
    ]



# ----------------------------------------------------------------------------- the model
class _Stack(NamedTuple):
    """A network the kernels take: an optional fixed input map first (``scaling``, an
    :class:`~pyrobnn.models.infinite_width.InputScaling`), the ``[linear, activation or None]``
    layers, and an optional fixed output offset last (``mean``, an
    :class:`~pyrobnn.models.infinite_width.OutputMean`)."""

    scaling: Optional[InputScaling]
    layers: list
    mean: Optional[OutputMean]


def _stack(net):
    """``net`` as a :class:`_Stack`: Linear layers each followed by at most one supported
    activation (dropout modules anywhere, the identity in eval mode), an ``InputScaling`` only
    first and an ``OutputMean`` only last, straight after a Linear layer; ``None`` for any other
    network."""
    if type(net) is nn.Linear:
        return _Stack(None, [[net, None]], None)
    if not isinstance(net, nn.Sequential):
        return None
    modules = [module for module in net if not isinstance(module, nn.modules.dropout._DropoutNd)]
    # the samplers evaluate the network in eval mode, where dropout is the identity
    scaling = modules.pop(0) if modules and type(modules[0]) is InputScaling else None
    mean = modules.pop() if modules and type(modules[-1]) is OutputMean else None
    out = []
    for module in modules:
        if type(module) is nn.Linear:
            out.append([module, None])
        elif type(module) in ACTIVATIONS and out and out[-1][1] is None:
            if type(module) is nn.GELU and module.approximate != "none":
                return None
            out[-1][1] = module
        else:
            return None
    if not out:
        return None
    if mean is not None and (out[-1][1] is not None or mean.mean.numel() not in (1, out[-1][0].out_features)):
        return None
    return _Stack(scaling, out, mean)


def _is_exp(transform) -> bool:
    """Whether ``transform`` is ``sigma = exp(u)`` (``ExpTransform``, or composed with the
    identity affine map that ``greater_than(0)`` adds), the map the kernels assume."""
    if isinstance(transform, ExpTransform):
        return True
    u = torch.tensor([-3.0, 0.0, 2.0], dtype=torch.float64, device="cpu")  # a probe of the transform
    try:
        value = transform(u)
        return bool(torch.allclose(value, u.exp()) and torch.allclose(transform.log_abs_det_jacobian(u, value), u))
    except (NotImplementedError, RuntimeError, TypeError):
        return False


def _noise_prior_code(prior):
    """``(code, a, b)`` of a supported noise-scale prior, else ``None``."""
    d = torch.distributions
    if prior.batch_shape != torch.Size() or not _is_exp(biject_to(prior.support)):
        return None
    for cls, a, b in ((d.LogNormal, "loc", "scale"), (d.HalfNormal, "scale", None), (d.HalfCauchy, "scale", None),
                      (d.Gamma, "concentration", "rate"), (d.Exponential, "rate", None)):
        if isinstance(prior, cls):
            return NOISE_PRIORS[cls.__name__], float(getattr(prior, a)), float(getattr(prior, b)) if b else 0.0
    return None


def native_form(likelihood):
    """The likelihood's :class:`~pyrobnn.models.likelihoods.NativeForm`, checked: a subclass that
    changes ``distribution`` without declaring its own form has none (the form it inherits
    describes another density)."""
    form = likelihood.native_form()
    declares = next(c for c in type(likelihood).__mro__ if "native_form" in vars(c))
    if declares is not Likelihood and type(likelihood).distribution is not declares.distribution:
        return type(form)(None, why=f"the likelihood {type(likelihood).__name__} changes the distribution of {declares.__name__} "
                                    "and declares no native form of its own")
    return form


def multiply_adds(model, x) -> int:
    """Multiply-adds of one forward pass of a supported network on ``x``: points times the sum
    of in x out over the linear layers."""
    return int(x.shape[0]) * sum(linear.in_features * linear.out_features for linear, _ in _stack(model.net).layers)


def unsupported_reason(model, x=None):
    """Why the native path does not apply to ``model`` (on inputs ``x``), or ``None`` if it
    does."""
    stack = _stack(model.net)
    if stack is None:
        return ("the network is not an nn.Linear or an nn.Sequential of nn.Linear layers with tanh, ReLU, GELU, sigmoid or erf "
                "activations (and dropout; an InputScaling first, an OutputMean last)")
    layers = stack.layers
    if model.dtype not in (torch.float32, torch.float64):
        return f"dtype {model.dtype} (the native kernels are float32 and float64)"
    if model.device.type != "cpu":
        return f"the model is on {model.device} (the native kernels run on the CPU)"
    for site in model.sites:
        if not isinstance(model.site_prior(site), NormalPrior):
            return f"site {site.name!r} has a {type(model.site_prior(site)).__name__} prior (the native kernels take NormalPrior)"
    form = native_form(model.likelihood)
    if form.kind is None:
        return form.why
    if form.kind == "gaussian_latent" and _noise_prior_code(form.params["prior"]) is None:
        return f"the noise-scale prior {type(form.params['prior']).__name__} (native: {', '.join(NOISE_PRIORS)})"
    if x is not None and (x.dim() != 2 or x.shape[1] != layers[0][0].in_features):
        return f"inputs of shape {tuple(x.shape)} (the native kernels take (N, {layers[0][0].in_features}))"
    return None



def native_refusal(model, x=None):
    """Why the native kernels cannot run ``model`` (on inputs ``x``) on this machine, as far as
    can be told without loading them (``None``: they can): :func:`unsupported_reason`, else a
    missing C++ compiler. Loading may still fail (:class:`NativeUnavailable`)."""
    reason = unsupported_reason(model, x)
    if reason is None and build_info()["compiler"] is None:
        reason = "no C++ compiler was found"
    return reason


def loading_note(record) -> str:
    """What :func:`library` did to give its ``record``, in words for a path's reason: built (and
    why an entry was refused), or loaded from this machine's cache."""
    if record["event"] != "built":
        return "loaded from this machine's cache"
    note = f"built them in {record['build_seconds']:.1f} s (once per machine, kept in {library_folder()})"
    if "rebuilt_because" in record:
        note += f"; the cached library was refused: {record['rebuilt_because']}"
    return note

class NativeMLP:
    """The potential of ``potential`` (a :class:`~pyrobnn.infer.core.potential.FlatPotential` holding
    its data) in native code: :meth:`value_and_grad`, :meth:`nuts` and :meth:`mclmc` for a batch
    of chains, each chain group on its own thread.

    :param threads: chain groups run at once (default ``torch.get_num_threads()``).
    """

    def __init__(self, potential, threads=None):
        model, x, y = potential.model, potential.x, potential.y
        reason = unsupported_reason(model, x)
        if reason is not None:
            raise ValueError(f"the native kernels do not apply: {reason}")
        self.lib, self.record = library()
        self.dtype = model.dtype
        self.suffix = "f32" if self.dtype == torch.float32 else "f64"
        self.dim = potential.dim
        self.threads = max(1, int(threads if threads is not None else torch.get_num_threads()))
        self._pool = None
        starts = {name: start for name, start, _, _ in potential.blocks}
        sites = {(id(s.module), s.param_name): s for s in model.sites}
        rows, prec, constants, constant = [], [], [], 0.0
        offset = 0
        stack = _stack(model.net)
        for linear, act in stack.layers:
            row = [linear.in_features, linear.out_features, ACTIVATIONS[type(act)][0] if act is not None else 0, -1, -2, 0, 0]
            row_prec = [0.0, 0.0]
            for k, name in ((0, "weight"), (1, "bias")):
                value = getattr(linear, name)
                if value is None:
                    continue
                site = sites.get((id(linear), name))
                if site is not None:
                    row[3 + k] = starts[site.name]
                    scale = model.site_prior(site).site_scale(site)
                    row_prec[k] = 1.0 / scale**2
                    constant += site.numel * (math.log(scale) + 0.5 * math.log(2 * math.pi))
                else:
                    row[3 + k] = -1
                    row[5 + k] = offset
                    constants.append(value.detach().reshape(-1))
                    offset += value.numel()
            rows.append(row)
            prec.append(row_prec)
        self._layers = torch.tensor(rows, dtype=torch.int64, device="cpu")
        self._prec = torch.tensor(prec, dtype=self.dtype, device="cpu")
        self._constants = (torch.cat(constants) if constants else torch.zeros(1, device="cpu")).to(self.dtype).contiguous()
        with torch.no_grad():  # the fixed input map applied once: the data do not change during a run
            x_in = x.detach() if stack.scaling is None else stack.scaling(x.detach())
        self._x_t = x_in.to(self.dtype).T.contiguous()
        out_last = rows[-1][1]
        self._offset = None if stack.mean is None else stack.mean.mean.detach().to(device="cpu", dtype=self.dtype).expand(out_last).contiguous()
        spec = _Model()
        spec.num_layers = len(rows)
        spec.num_points = x.shape[0]
        spec.dim = self.dim
        spec.max_width = max(max(r[0], r[1]) for r in rows)
        spec.noise_off = -1
        form = native_form(model.likelihood)
        spec.likelihood = LIKELIHOODS[form.kind]
        self._labels = torch.zeros(1, dtype=torch.int64, device="cpu")
        self._y_t = torch.zeros(1, dtype=self.dtype, device="cpu")
        if form.kind == "categorical":
            spec.target_dim = rows[-1][1]
            self._labels = y.detach().to(torch.int64).reshape(-1).contiguous()
            if self._labels.numel() != x.shape[0] or (self._labels.numel() and not (0 <= int(self._labels.min()) and int(self._labels.max()) < spec.target_dim)):
                raise ValueError(f"y must hold {x.shape[0]} class labels in [0, {spec.target_dim}) for the native kernels")
        else:
            self._y_t = y.detach().to(self.dtype).T.contiguous()
            spec.target_dim = y.shape[1]
            if form.kind == "gaussian_latent":
                spec.noise_off = starts[form.params["site"]]
                spec.noise_prior, spec.noise_a, spec.noise_b = _noise_prior_code(form.params["prior"])
            elif form.kind == "gaussian":
                spec.lik_a = form.params["scale"]
            elif form.kind in ("exp", "softplus"):
                spec.lik_a, spec.lik_b = form.params["min_scale"], form.params["max_scale"]
        spec.constant = constant
        spec.layers = self._layers.data_ptr()
        spec.layer_prec = self._prec.data_ptr()
        spec.constants = self._constants.data_ptr()
        spec.x_t = self._x_t.data_ptr()
        spec.y_t = self._y_t.data_ptr()
        spec.labels = self._labels.data_ptr()
        spec.out_offset = None if self._offset is None else self._offset.data_ptr()
        self._spec = spec
        self._work = multiply_adds(model, x)  # per chain and evaluation: decides the threading

    # ------------------------------------------------------------------ calls
    def _fn(self, name):
        return getattr(self.lib, f"pyrobnn_{name}_{self.suffix}")

    def _check(self, *tensors):
        for t in tensors:
            if t.dtype != self.dtype or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"native kernels take contiguous {self.dtype} CPU tensors, got {t.dtype} on {t.device}")

    def _run(self, fn, chains, work_per_chain):
        """``fn(start, stop)`` over chain groups: one group per thread where the work is worth a
        thread's start (about 20 us), else all chains in this thread."""
        groups = min(chains, self.threads)
        if groups <= 1 or work_per_chain * chains < 2e5:
            fn(0, chains)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pyrobnn-native")
        bounds = [round(chains * k / groups) for k in range(groups + 1)]
        futures = [self._pool.submit(fn, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for f in futures:
            f.result()

    def value_and_grad(self, z):
        """``(U(z), dU/dz)`` for ``z`` of shape ``(chains, dim)``."""
        z = z.detach().to(self.dtype).contiguous()
        chains = z.shape[0]
        u = torch.empty(chains, dtype=self.dtype, device="cpu")
        g = torch.empty_like(z)
        fn, spec, D = self._fn("value_and_grad"), ctypes.byref(self._spec), self.dim
        size = z.element_size()

        def part(a, b):
            fn(spec, b - a, z.data_ptr() + a * D * size, u.data_ptr() + a * size, g.data_ptr() + a * D * size)

        self._run(part, chains, self._work)
        return u, g

    __call__ = value_and_grad

    def nuts(self, z, energy, grad, r0, inv_mass, step, max_depth, uniforms):
        """One NUTS transition of every chain, in place on ``z``, ``energy`` and ``grad``; the
        arguments as in :func:`pyrobnn.infer.mcmc.nuts_kernel.nuts_step` with its random numbers given
        (``r0`` the initial momenta, ``uniforms`` from
        :func:`~pyrobnn.infer.mcmc.nuts_kernel.transition_uniforms`). Returns per-chain ``(C, 4)``:
        mean acceptance, tree depth, leapfrog steps, divergence."""
        self._check(z, energy, grad, r0, inv_mass, step, uniforms)
        chains = z.shape[0]
        stats = torch.empty(chains, 4, dtype=self.dtype, device="cpu")
        fn, spec, D, row = self._fn("nuts"), ctypes.byref(self._spec), self.dim, uniforms.shape[1]
        size = z.element_size()

        def part(a, b):
            fn(spec, b - a, z.data_ptr() + a * D * size, energy.data_ptr() + a * size, grad.data_ptr() + a * D * size,
               r0.data_ptr() + a * D * size, inv_mass.data_ptr() + a * D * size, step.data_ptr() + a * size, max_depth,
               uniforms.data_ptr() + a * row * size, stats.data_ptr() + 4 * a * size)

        self._run(part, chains, self._work * 2 ** min(max_depth, 6))
        return stats

    def mclmc(self, z, u, energy, grad, step, L, sqrt_inv_mass, noise):
        """One MCLMC step of every chain, in place on ``z``, ``u``, ``energy`` and ``grad``, as
        :func:`pyrobnn.infer.mcmc.mclmc_kernel.mclmc_step` (``noise``: ``(2, C, D)``, as the kernel
        draws it). Returns the energy changes and whether each step was finite (``(C,)`` each)."""
        self._check(z, u, energy, grad, step, L, sqrt_inv_mass, noise)
        chains = z.shape[0]
        if tuple(noise.shape) != (2, chains, self.dim):
            raise ValueError(f"noise must have shape (2, {chains}, {self.dim}), got {tuple(noise.shape)}")
        d_energy = torch.empty(chains, dtype=self.dtype, device="cpu")
        finite = torch.empty(chains, dtype=self.dtype, device="cpu")
        fn, spec, D = self._fn("mclmc"), ctypes.byref(self._spec), self.dim
        size = z.element_size()

        def part(a, b):
            fn(spec, b - a, z.data_ptr() + a * D * size, u.data_ptr() + a * D * size, energy.data_ptr() + a * size,
               grad.data_ptr() + a * D * size, step.data_ptr() + a * size, L.data_ptr() + a * size,
               sqrt_inv_mass.data_ptr() + a * D * size, noise.data_ptr() + a * D * size, chains * D, d_energy.data_ptr() + a * size,
               finite.data_ptr() + a * size)

        self._run(part, chains, 2 * self._work)
        return d_energy, finite.bool()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
