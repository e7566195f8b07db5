"""The native kernels (pyrobnn.infer.core.native): the hand-derived potential and gradient against
torch.autograd, the NUTS transition and MCLMC step against the torch code on the same random
numbers, the library cache refusing what it cannot trust, and the budget's choice of path."""

import copy
import json
import os

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.infer.core import native
from pyrobnn.infer.modes.ensemble import deep_ensemble
from pyrobnn.infer.mcmc.samplers import nuts
from pyrobnn.infer.mcmc.mclmc_kernel import MCLMC, MCLMCState, MCLMCTuning, native_mclmc_step
from pyrobnn.infer.mcmc.nuts_kernel import NUTS, NUTSSettings, NUTSState, native_nuts_step, nuts_step
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.models.infinite_width import Cos, Erf, InfiniteWidthMLP, InputScaling, OutputMean

if native.build_info()["compiler"] is None:
    if os.environ.get("PYROBNN_REQUIRE_NATIVE") == "1":  # .ci/run sets it: CI must run these tests
        raise RuntimeError("PYROBNN_REQUIRE_NATIVE=1 but no C++ compiler was found (CXX, c++, g++, clang++): install one")
    pytestmark = pytest.mark.skip(reason="no C++ compiler: the native kernels cannot be built (set PYROBNN_REQUIRE_NATIVE=1 to fail instead)")

F64 = torch.float64


def t64(v):
    return torch.tensor(v, dtype=F64)


def likelihoods(n):
    """(likelihood, network outputs, targets) of every kind the kernels take; noise priors with
    float64 parameters, so that torch's reference value is exact to float64."""
    g = torch.Generator().manual_seed(1)
    reg1, reg2 = torch.randn(n, 1, generator=g, dtype=F64), torch.randn(n, 2, generator=g, dtype=F64)
    return [
        (pyrobnn.GaussianLikelihood(scale=0.3), 2, reg2),
        (pyrobnn.GaussianLikelihood(scale=dist.LogNormal(t64(-1.0), t64(0.7))), 1, reg1),
        (pyrobnn.GaussianLikelihood(scale=dist.HalfNormal(t64(0.7))), 1, reg1),
        (pyrobnn.GaussianLikelihood(scale=dist.HalfCauchy(t64(0.7))), 1, reg1),
        (pyrobnn.GaussianLikelihood(scale=dist.Gamma(t64(2.0), t64(3.0))), 1, reg1),
        (pyrobnn.GaussianLikelihood(scale=dist.Exponential(t64(2.0))), 1, reg1),
        (pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=1e-3, max_scale=10.0, link="exp"), 4, reg2),
        (pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=1e-3), 2, reg1),
        (pyrobnn.CategoricalLikelihood(), 4, torch.randint(0, 4, (n,), generator=g)),
        (pyrobnn.BernoulliLikelihood(), 3, torch.randint(0, 2, (n, 3), generator=g).to(F64)),
    ]


@pytest.mark.parametrize("activation", ["tanh", "relu", "gelu", "sigmoid", Erf, Cos], ids=["tanh", "relu", "gelu", "sigmoid", "erf", "cos"])
@pytest.mark.parametrize("case", range(10))
def test_value_and_gradient_are_autograds(activation, case):
    n = 37
    likelihood, outputs, y = likelihoods(n)[case]
    torch.manual_seed(case)
    x = torch.randn(n, 3, dtype=F64)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, outputs, hidden=(5, 4), activation=activation).double(), likelihood,
                                  {"0.*": pyrobnn.NormalPrior(0.8, fan_in=True), "*": pyrobnn.NormalPrior(1.3)}).eval()
    potential = FlatPotential(model, x, y)
    assert_native_is_autograd(potential, native.NativeMLP(potential), torch.randn(3, potential.dim, dtype=F64) * 0.7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n, hidden", [(3, (9, 17)), (5, (9, 17)), (7, (17, 4)), (11, (9, 17)), (37, (17, 4)), (130, (9, 17)),
                                      (300, (33, 1))])
def test_every_shape_of_the_blocked_products_is_autograds(n, hidden, dtype):
    """The layer products are register-blocked (mlp_kernels.cpp, "dense products"): full tiles,
    the last tile of a row or column overlapping the one before, one row at a time under four
    rows, for fewer points than a vector holds tiles of halved widths down to 4 columns (5 and 7
    points: two overlapping tiles of 4; 11: of 8 in float32 under AVX-512) or one point at a
    time under 4, and the weights' gradient through the transposed layer input (few points, a
    wide layer) or by sums over the points (many points, or a narrow layer). Points from under
    one vector to several tiles, and layers from 1 to 33 units, cover each branch for both
    dtypes, against float64 autograd."""
    torch.manual_seed(n)
    x, y = torch.randn(n, 3, dtype=F64), torch.randn(n, 2, dtype=F64)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 2, hidden=hidden, activation=Erf).double(), pyrobnn.GaussianLikelihood(scale=0.5),
                                  pyrobnn.NormalPrior(1.0, fan_in=True)).eval()
    reference = FlatPotential(model, x, y)
    z = torch.randn(3, reference.dim, dtype=F64) * 0.7
    if dtype == torch.float64:
        assert_native_is_autograd(reference, native.NativeMLP(reference), z)
        return
    low = FlatPotential(copy.deepcopy(model).float(), x.float(), y.float())
    u, g = native.NativeMLP(low).value_and_grad(z.float())
    u_ref, g_ref = reference.value_and_grad(z)
    assert ((u.double() - u_ref).abs() / u_ref.abs()).max() < 1e-5
    assert ((g.double() - g_ref).abs().max(-1).values / g_ref.abs().max(-1).values).max() < 1e-5


def test_a_build_without_the_vector_math_library_computes_the_same(fresh_cache, monkeypatch):
    """Where glibc's vector math library is missing (not glibc on x86-64) the build goes on
    without it (the record says how it was built) and the activations call the scalar functions:
    the same values to rounding."""
    monkeypatch.setattr(native.build, "VECTOR_MATH", ["-DPYROBNN_VECTOR_MATH", "-lpyrobnn_no_such_library"])
    _, record = native.library()
    assert record["event"] == "built" and "-lpyrobnn_no_such_library" not in record["built_with"]
    torch.manual_seed(0)
    x, y = torch.randn(40, 3, dtype=F64), torch.randn(40, 1, dtype=F64)
    for activation in ("gelu", Erf, Cos, "tanh", "sigmoid"):
        model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=(20, 20), activation=activation).double(), pyrobnn.GaussianLikelihood(scale=0.5)).eval()
        potential = FlatPotential(model, x, y)
        assert_native_is_autograd(potential, native.NativeMLP(potential), torch.randn(2, potential.dim, dtype=F64))


def assert_native_is_autograd(potential, kernel, z):
    """The kernel's value and gradient at ``z`` equal the torch potential's; returns those."""
    u_ref, g_ref = potential.value_and_grad(z)
    u, g = kernel.value_and_grad(z)
    torch.testing.assert_close(u, u_ref, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-9)
    return u_ref, g_ref


def test_constant_layers_and_a_bare_linear_layer():
    torch.manual_seed(0)
    x, y = torch.randn(20, 3, dtype=F64), torch.randn(20, 1, dtype=F64)
    last = pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=(6,), activation="tanh").double(), pyrobnn.GaussianLikelihood(scale=0.5),
                                 random="last_layer")
    bare = pyrobnn.BayesianModel(torch.nn.Linear(3, 1).double(), pyrobnn.GaussianLikelihood(scale=0.5))
    for model in (last, bare):
        potential = FlatPotential(model.eval(), x, y)
        z = torch.randn(2, potential.dim, dtype=F64)
        for a, b in zip(native.NativeMLP(potential).value_and_grad(z), potential.value_and_grad(z)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-10)


def calibrated_stack(activation, outputs=1, mean=(0.7,)):
    """A network of the Bayesian-optimization surrogates' shape (``InfiniteWidthMLP.network``):
    a fixed input map first, the limit's priors, a constant output offset last."""
    limit = InfiniteWidthMLP(activation=activation, weight_scales=(1.3, 0.9, 2.0), bias_scales=(0.1, 0.2, 0.05),
                             input_center=t64([0.5, 0.4, 0.6]), input_scale=t64([2.0, 0.5, 3.0]), output_mean=t64(list(mean)))
    return limit.bayesian_model(pyrobnn.GaussianLikelihood(scale=0.3), outputs, width=7).eval()


@pytest.mark.parametrize("activation", ["erf", "relu", "cos"])
@pytest.mark.parametrize("mean", [(0.7,), (0.7, -1.5)], ids=["one offset", "one per output"])
def test_a_fixed_input_map_and_output_offset_are_the_networks(activation, mean):
    """The input map and the offset are applied as the network applies them: value and gradient
    equal autograd's, and an MCLMC step equals the torch one (offsets of several noise scales, a
    map that moves every input: leaving out either changes the potential by far more than the
    tolerance, as checked)."""
    torch.manual_seed(5)
    x = torch.rand(25, 3, dtype=F64)
    y = torch.randn(25, 2, dtype=F64)
    model = calibrated_stack(activation, outputs=2, mean=mean)
    assert native.unsupported_reason(model, x) is None
    potential = FlatPotential(model, x, y)
    kernel = native.NativeMLP(potential)
    z = torch.randn(3, potential.dim, dtype=F64) * 0.5
    u_ref, g_ref = assert_native_is_autograd(potential, kernel, z)
    for module, buffer, value in ((0, "center", 0.0), (0, "scale", 1.0), (-1, "mean", 0.0)):  # each left out in turn
        changed = copy.deepcopy(model)
        getattr(changed.net[module], buffer).fill_(value)
        assert (FlatPotential(changed, x, y).value_and_grad(z)[0] - u_ref).abs().min() > 1.0, buffer  # it matters to the check
    state = MCLMCState(z, torch.nn.functional.normalize(torch.randn_like(z), dim=-1), u_ref, g_ref)
    tuning = MCLMCTuning(torch.full((3,), 0.05, dtype=F64), torch.full((3,), 1.0, dtype=F64), torch.ones(3, potential.dim, dtype=F64))
    noise = MCLMC().randoms(state, tuning, torch.Generator().manual_seed(1))
    a, (da, _) = MCLMC().step(state, potential.value_and_grad, noise, tuning)
    b, (db, _) = native_mclmc_step(kernel, state, noise, tuning)
    for name in ("z", "u", "energy", "grad"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-9, atol=1e-10)


def test_an_input_map_or_offset_elsewhere_keeps_the_torch_path():
    x = torch.rand(10, 3, dtype=F64)
    net = calibrated_stack("erf").net
    scaling, first, act, mean = net[0], net[1], net[2], net[-1]
    for layers in ([first, scaling, act, net[5]],  # the map not first
                   [scaling, first, act, mean],  # the offset after an activation
                   [scaling, first, act, net[3], mean, net[4], net[5]],  # the offset not last
                   [scaling, first, act, net[3], net[4], net[5], OutputMean(t64([1.0, 2.0]))]):  # two offset values, one output
        model = pyrobnn.BayesianModel(torch.nn.Sequential(*layers), pyrobnn.GaussianLikelihood(scale=0.3))
        assert "an InputScaling first, an OutputMean last" in native.unsupported_reason(model, x)


def test_the_surrogates_calibrated_network_takes_the_native_path():
    """MCLMC and NUTS on the network calibrated_model gives the BO surrogates run natively."""
    from pyrobnn.infer.mcmc.samplers import mclmc
    from pyrobnn.integrations.infinite_width_gp import calibrated_model

    torch.manual_seed(0)
    x = torch.rand(12, 2, dtype=F64)
    y = torch.sin(6 * x[:, :1]) + x[:, 1:]
    y = (y - y.mean()) / y.std()
    model = calibrated_model(x, y)
    assert isinstance(model.net[0], InputScaling) and isinstance(model.net[-1], OutputMean)
    result = mclmc(model, x, y, num_samples=4, num_warmup=(20, 10, 10), num_chains=2, thinning=1, progress=False)
    assert result.stats["path"] == "native", result.stats["path_reason"]
    result = nuts(model, x, y, num_samples=2, num_warmup=4, max_tree_depth=3, num_chains=2, progress=False)
    assert result.stats["path"] == "native", result.stats["path_reason"]


def test_float32_agrees_to_float32_rounding():
    """The 1-50-1 tanh network of benchmarks/hmc_speed.py in float32 (the rational tanh)."""
    torch.manual_seed(0)
    x, y = torch.randn(100, 1), torch.randn(100, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"), pyrobnn.GaussianLikelihood(scale=0.1)).eval()
    potential = FlatPotential(model, x, y)
    z = torch.randn(4, potential.dim) * 0.5
    u, g = native.NativeMLP(potential).value_and_grad(z)
    u_ref, g_ref = FlatPotential(model.double(), x.double(), y.double()).value_and_grad(z.double())
    assert ((u.double() - u_ref).abs() / u_ref.abs()).max() < 1e-5
    assert ((g.double() - g_ref).abs().max(-1).values / g_ref.abs().max(-1).values).max() < 1e-5


def small_bnn(likelihood=None):
    torch.manual_seed(3)
    x = torch.randn(30, 2, dtype=F64)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(30, 1, dtype=F64)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(8,), activation="tanh").double(),
                                  likelihood or pyrobnn.GaussianLikelihood(scale=0.2)).eval()
    return model, x, y


def nuts_transition(target, state, settings, depth, seed, native=None):
    """One transition on the random numbers of ``seed``: the torch one, or the native one."""
    randoms = NUTS(depth).randoms(state, settings, torch.Generator().manual_seed(seed))
    if native is None:
        return nuts_step(target, state, randoms, settings, depth)
    return native_nuts_step(native, state, randoms, settings, depth)


def test_a_nuts_transition_is_the_torch_one():
    """Same state, step sizes, mass matrices and generator: the native transition follows the
    batched torch code leaf for leaf, including trees that end early inside a subtree."""
    model, x, y = small_bnn()
    potential = FlatPotential(model, x, y)
    kernel = native.NativeMLP(potential)
    z = torch.randn(6, potential.dim, dtype=F64) * 0.3
    state = NUTSState(z, *potential.value_and_grad(z))
    step = torch.tensor([0.002, 0.01, 0.03, 0.05, 0.1, 0.5], dtype=F64)
    inv_mass = torch.rand(6, potential.dim, dtype=F64, generator=torch.Generator().manual_seed(2)) + 0.5
    depths = set()
    settings = NUTSSettings(step, inv_mass)
    for seed in range(4):
        a, sa = nuts_transition(potential.value_and_grad, state, settings, 8, seed)
        b, sb = nuts_transition(kernel.value_and_grad, state, settings, 8, seed, native=kernel)
        torch.testing.assert_close(b.z, a.z, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(b.energy, a.energy, rtol=1e-9, atol=1e-9)
        for key in ("tree_depth", "diverging"):
            assert torch.equal(getattr(sb, key), getattr(sa, key)), key
        torch.testing.assert_close(sb.num_steps, sa.num_steps)
        torch.testing.assert_close(sb.accept_prob, sa.accept_prob, rtol=1e-9, atol=1e-12)
        depths |= set(sa.tree_depth.tolist())
        state = a
    assert len(depths) > 2  # the steps cover short, long and divergent trees


def test_an_mclmc_step_is_the_torch_one():
    model, x, y = small_bnn(pyrobnn.GaussianLikelihood(scale=dist.LogNormal(t64(-1.5), t64(0.5))))
    potential = FlatPotential(model, x, y)
    kernel = native.NativeMLP(potential)
    z = torch.randn(5, potential.dim, dtype=F64) * 0.3
    u = torch.nn.functional.normalize(torch.randn(5, potential.dim, dtype=F64), dim=-1)
    state = MCLMCState(z, u, *potential.value_and_grad(z))
    # the last chain's step is far too large: non-finite, undone, with a fresh direction
    tuning = MCLMCTuning(torch.tensor([0.01, 0.05, 0.1, 0.3, 1e6], dtype=F64), torch.full((5,), 2.0, dtype=F64),
                         torch.rand(5, potential.dim, dtype=F64) + 0.5)
    mclmc = MCLMC()
    for _ in range(3):
        noise = mclmc.randoms(state, tuning, torch.Generator().manual_seed(4))
        with pyro.validation_enabled(False):  # as the samplers run it: a non-finite step is undone, not refused
            a, (da, fa) = mclmc.step(state, potential.value_and_grad, noise, tuning)
        b, (db, fb) = native_mclmc_step(kernel, state, noise, tuning)
        assert torch.equal(fa, fb)
        for name in ("z", "u", "energy", "grad"):
            torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(db, da, rtol=1e-8, atol=1e-10)
        # the undone chain stays, its fresh direction the second half refresh's noise
        assert torch.equal(b.z[-1], state.z[-1])
        torch.testing.assert_close(b.u[-1], torch.nn.functional.normalize(noise[1, -1], dim=-1), rtol=1e-12, atol=1e-14)
        state = a
    assert not fa[-1] and fa[:-1].all()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYROBNN_CACHE", str(tmp_path))
    monkeypatch.setattr(native.build, "_LOADED", {})
    return os.path.join(str(tmp_path), "kernels")


def _record(folder):
    (name,) = [f for f in os.listdir(folder) if f.endswith(".json")]
    return os.path.join(folder, name)


@pytest.mark.slow  # two native builds into fresh caches, 18-32 s: in .ci/run's -m slow (the default run builds the kernels once)
def test_the_cache_is_built_once_and_refuses_what_it_cannot_trust(fresh_cache, monkeypatch):
    _, record = native.library()
    assert record["event"] == "built"
    monkeypatch.setattr(native.build, "_LOADED", {})
    assert native.library()[1]["event"] == "loaded"  # a second process loads, it does not build

    def reload():
        monkeypatch.setattr(native.build, "_LOADED", {})
        return native.library()[1]

    library = os.path.join(fresh_cache, record["file"])
    with open(library, "r+b") as f:  # corrupted in place
        f.seek(100)
        f.write(b"\0garbage\0")
    again = reload()
    assert again["event"] == "built" and "checksum" in again["rebuilt_because"]

    path = _record(fresh_cache)
    with open(path) as f:
        saved = json.load(f)
    with open(path, "w") as f:  # an entry from other sources (another pyrobnn version)
        json.dump(dict(saved, source_sha256="0" * 64), f)
    again = reload()
    assert again["event"] == "built" and "other sources" in again["rebuilt_because"]

    os.chmod(os.path.join(fresh_cache, again["file"]), 0o777)  # writable by anyone
    again = reload()
    assert again["event"] == "built" and "writable by others" in again["rebuilt_because"]

    with open(_record(fresh_cache), "w") as f:
        f.write("{not json")
    assert reload()["rebuilt_because"] == "the cache record is unreadable"
    assert reload()["event"] == "loaded"


def test_a_library_the_loader_refuses_leaves_the_torch_path_and_says_why(monkeypatch):
    """A built library that does not load (a symbol this machine's libraries lack) is not a crash:
    ``library()`` raises NativeUnavailable with the loader's message and ``backend="auto"`` takes
    the torch path, saying why, in the samplers and in a deep ensemble's full-batch MAP."""
    native.library()  # built or cached already: this test builds nothing new
    monkeypatch.setattr(native.build, "_LOADED", {})

    def refuse(path, *args, **kwargs):
        raise OSError(f"{path}: undefined symbol: _ZGVeN8v_erf")

    monkeypatch.setattr(native.build.ctypes, "CDLL", refuse)
    with pytest.raises(native.NativeUnavailable, match="could not be loaded: .*undefined symbol: _ZGVeN8v_erf"):
        native.library()
    model, x, y = small_bnn()
    result = nuts(model, x, y, num_samples=2, num_warmup=2, num_chains=2, max_tree_depth=2, progress=False)
    assert result.stats["path"] == "eager" and "undefined symbol" in result.stats["path_reason"]
    ensemble = deep_ensemble(model, x, y, num_members=2, max_epochs=2, batch_size=None, progress=False)  # the MAP's rule alike
    assert ensemble.stats["path"] == "eager" and "undefined symbol" in ensemble.stats["path_reason"]


def test_the_rule_picks_the_backend_and_never_the_cache(fresh_cache):
    """The native kernels wherever they apply, short run or long: built on the first run, read
    from the cache on the next, and the draws the same both times; backend="eager" stays eager."""
    model, x, y = small_bnn()
    short = nuts(model, x, y, num_samples=2, num_warmup=2, max_tree_depth=2, num_chains=2, progress=False)
    assert short.stats["path"] == "native" and "built them" in short.stats["path_reason"]
    again = nuts(model, x, y, num_samples=2, num_warmup=2, max_tree_depth=2, num_chains=2, progress=False)
    assert again.stats["path"] == "native" and "cache" in again.stats["path_reason"]
    assert all(torch.equal(short.samples[k], again.samples[k]) for k in short.samples)
    assert nuts(model, x, y, num_samples=2, num_warmup=2, num_chains=2, backend="eager", progress=False).stats["path"] == "eager"
    with pytest.raises(ValueError, match="backend must be one of"):
        nuts(model, x, y, backend="fast")
    with pytest.raises(TypeError, match="compile"):  # the deprecated spelling of backend= is gone
        nuts(model, x, y, compile=False)


class StudentTLikelihood(pyrobnn.GaussianLikelihood):
    """A user's likelihood that inherits the Gaussian's native form but not its density."""

    def distribution(self, output, **latents):
        return dist.StudentT(3.0, output, self.scale(**latents)).to_event(1)


def test_models_the_kernels_do_not_take_keep_the_torch_path():
    torch.manual_seed(0)
    x, y = torch.randn(20, 2), torch.randn(20, 1)
    cases = [
        (pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(0.3), pyrobnn.ScaleMixturePrior()), "ScaleMixturePrior"),
        (pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,), activation="elu"), pyrobnn.GaussianLikelihood(0.3)), "nn.Sequential of nn.Linear"),
        (pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(dist.InverseGamma(2.0, 1.0))), "InverseGamma"),
        (pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), StudentTLikelihood(0.3)), "StudentTLikelihood changes the distribution"),
    ]
    for model, name in cases:
        assert name in native.unsupported_reason(model, x)
        target = y
        result = nuts(model, x, target, num_samples=2, num_warmup=2, max_tree_depth=2, num_chains=2, progress=False)
        assert result.stats["path"] == "eager" and name in result.stats["path_reason"] and "too few for compiling to pay" in result.stats["path_reason"]
        with pytest.raises(ValueError, match="backend='native' does not apply to this run: .*" + name):
            nuts(model, x, target, num_samples=2, num_warmup=2, num_chains=2, backend="native", progress=False)
    with pytest.raises(ValueError, match="do not apply"):
        native.NativeMLP(FlatPotential(cases[0][0], x, y))
    classifier = pyrobnn.BayesianModel(pyrobnn.MLP(2, 3, hidden=(4,)), pyrobnn.CategoricalLikelihood())
    potential = FlatPotential(classifier, x, torch.zeros(20, dtype=torch.long))
    potential.y = torch.full((20,), 3)  # past the checks FlatPotential makes: the kernels refuse it themselves
    with pytest.raises(ValueError, match=r"class labels in \[0, 3\)"):
        native.NativeMLP(potential)


def test_mclmc_on_a_large_network_with_many_chains_takes_the_batched_compiled_path():
    """MILE-sized networks: MCLMC's lockstep chains run in Inductor's batched products, whatever
    the run's length (the rule reads the model and the chains, not the budget); few chains, and
    NUTS, stay native."""
    from pyrobnn.infer.mcmc.backend import choose_path

    torch.manual_seed(0)
    x, y = torch.randn(800, 8), torch.randn(800, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(8, 2, hidden=(16, 16)), pyrobnn.HeteroscedasticGaussianLikelihood(link="exp")).eval()
    potential = FlatPotential(model, x, y)
    assert native.multiply_adds(model, x) == 800 * (8 * 16 + 16 * 16 + 16 * 2)
    z12 = torch.randn(12, potential.dim) * 0.1
    path = choose_path(potential, z12, "auto", "MCLMC", 2 * 60_000)
    assert path.kind == "torch.compile" and "lockstep" in path.reason
    assert choose_path(potential, z12, "auto", "MCLMC", 20).kind == "torch.compile"
    assert choose_path(potential, z12, "auto", "NUTS", 2 * 60_000).kind == "native"
    assert choose_path(potential, z12[:4], "auto", "MCLMC", 2 * 60_000).kind == "native"


def test_chain_groups_on_two_threads_give_the_one_thread_results():
    """The tests run on one torch thread (conftest); the native kernels' chain groups on
    several threads must give exactly what one thread gives (each chain is independent)."""
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=(50, 50)), pyrobnn.GaussianLikelihood(scale=0.3), pyrobnn.NormalPrior(1.0)).double()
    x, y = torch.randn(200, 3, dtype=F64), torch.randn(200, 1, dtype=F64)
    potential = FlatPotential(model, x, y)
    one, two = native.NativeMLP(potential, threads=1), native.NativeMLP(potential, threads=2)
    z = torch.randn(8, potential.dim, dtype=F64) * 0.3
    assert two._work * 8 >= 2e5  # enough work for the groups to run on two threads
    for a, b in zip(one.value_and_grad(z), two.value_and_grad(z)):
        assert torch.equal(a, b)
    state = NUTSState(z, *one.value_and_grad(z))
    settings = NUTSSettings(torch.full((8,), 0.01, dtype=F64), torch.ones(8, potential.dim, dtype=F64))
    a, sa = nuts_transition(one.value_and_grad, state, settings, 6, 0, native=one)
    b, sb = nuts_transition(two.value_and_grad, state, settings, 6, 0, native=two)
    assert torch.equal(a.z, b.z) and torch.equal(sa.tree_depth, sb.tree_depth)
    one.close()
    two.close()


def test_auto_never_takes_a_compiled_path_the_installed_torch_cannot_run(monkeypatch):
    """torch 2.11 refuses NUTS's compiled doubling (a while loop over gradients); 2.14 compiles it.
    The rule reads the installed version: below the floor auto runs eagerly, saying why, and
    backend="compile" is refused before sampling; MCLMC (no while loop) is unaffected."""
    from pyrobnn.infer.mcmc import backend

    assert backend.torch_version("2.11.0+cu130") == (2, 11) and backend.torch_version("2.14.1") == (2, 14)
    assert "torch 2.11.0 cannot compile NUTS's doubling" in backend.compile_refusal("NUTS", "2.11.0+cu130")
    assert backend.compile_refusal("NUTS", "2.14.1") is None and backend.compile_refusal("MCLMC", "2.11.0") is None
    x, y = torch.randn(20, 2), torch.randn(20, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,), activation="elu"), pyrobnn.GaussianLikelihood(0.3))
    potential = FlatPotential(model, x, y)
    z = torch.zeros(2, potential.dim)
    assert backend.choose_path(potential, z, "auto", "NUTS", 10**6).kind == "torch.compile"
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    path = backend.choose_path(potential, z, "auto", "NUTS", 10**6)
    assert path.kind == "eager" and "would pay for torch.compile, but torch 2.11.0 cannot compile" in path.reason
    assert backend.choose_path(potential, z, "auto", "MCLMC", 10**6).kind == "torch.compile"
    with pytest.raises(ValueError, match="backend='compile' does not apply to this run: torch 2.11.0"):
        backend.choose_path(potential, z, "compile", "NUTS", 10)


def map_problem(n=30, likelihood=None):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, 3, generator=g, dtype=F64) * 2 - 1
    y = torch.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:] + 0.05 * torch.randn(n, 1, generator=g, dtype=F64)
    net = torch.nn.Sequential(InputScaling(torch.zeros(3, dtype=F64), torch.full((3,), 1.5, dtype=F64)),
                              torch.nn.Linear(3, 16), Erf(), torch.nn.Linear(16, 16), Erf(), torch.nn.Linear(16, 1),
                              OutputMean(t64([0.2]))).double()
    likelihood = likelihood if likelihood is not None else pyrobnn.GaussianLikelihood(scale=0.1)
    return pyrobnn.BayesianModel(net, likelihood, pyrobnn.NormalPrior(1.0)).double(), x, y


@pytest.mark.parametrize("likelihood", [None, "latent"])
def test_full_batch_map_members_are_the_same_on_the_native_and_torch_paths(likelihood):
    """deep_ensemble's full-batch MAP (what Laplace and SWAG start from) takes the native kernels
    by default: the same members as torch's autograd up to rounding after 150 AdamW steps (each
    evaluation agrees to about 1e-13), the same training loss and early stopping, and the result
    says which path ran. With a latent noise scale the objective holds its prior and log-Jacobian."""
    if likelihood == "latent":
        likelihood = pyrobnn.GaussianLikelihood(scale=dist.LogNormal(t64(-2.0), t64(0.5)))
    model, x, y = map_problem(likelihood=likelihood)
    options = dict(num_members=3, objective="map", lr=1e-2, batch_size=None, max_epochs=150, progress=False, seed=2)
    if likelihood is not None:
        options.update(num_members=2)
    torch_path = deep_ensemble(model, x, y, backend="eager", **options)
    native_path = deep_ensemble(model, x, y, **options)
    assert native_path.stats["path"] == "native" and "backend='auto'" in native_path.stats["path_reason"]
    assert torch_path.stats["path"] == "eager"
    for name, value in torch_path.samples.items():
        torch.testing.assert_close(native_path.samples[name], value, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(native_path.stats["train_loss"], torch_path.stats["train_loss"], rtol=1e-10, atol=1e-10)
    start = deep_ensemble(model, x, y, backend="eager", **dict(options, max_epochs=1))
    name = next(name for name in start.samples if name.endswith("weight"))
    assert not torch.allclose(start.samples[name], torch_path.samples[name], atol=1e-3)  # it trained


def test_the_maps_path_is_chosen_by_a_rule_and_native_refused_by_name():
    """``backend="auto"`` takes torch's autograd where the native kernels do not apply, saying
    why: minibatches, the likelihood alone as the objective, a network they do not take; and
    ``backend="native"`` is refused there, naming the reason, before anything trains."""
    model, x, y = map_problem()
    cases = [
        (dict(batch_size=8), "batch_size=8 < 30 points"),
        (dict(objective="likelihood"), "objective='likelihood'"),
    ]
    for options, reason in cases:
        result = deep_ensemble(model, x, y, num_members=2, max_epochs=2, progress=False, **{"batch_size": None, **options})
        assert result.stats["path"] == "eager" and reason in result.stats["path_reason"]
        with pytest.raises(ValueError, match=f"backend='native' does not apply to this run: {reason}"):
            deep_ensemble(model, x, y, num_members=2, max_epochs=2, progress=False, backend="native",
                          **{"batch_size": None, **options})
    cnn = pyrobnn.BayesianModel(torch.nn.Sequential(torch.nn.Unflatten(1, (1, 3)), torch.nn.Conv1d(1, 2, 2), torch.nn.Flatten(),
                                                    torch.nn.Linear(4, 1)).double(), pyrobnn.GaussianLikelihood(scale=0.1))
    result = deep_ensemble(cnn, x, y, num_members=2, max_epochs=2, batch_size=None, progress=False)
    assert result.stats["path"] == "eager" and "the network is not an nn.Linear" in result.stats["path_reason"]


def test_anchored_members_are_the_same_on_the_native_and_torch_paths():
    """The anchored ensemble (the BO surrogates' default) on the native path: each member's
    potential of its own perturbed targets, shifted to its anchor by the Gaussian prior's
    closed form; the same members and losses as torch's autograd of the anchored objective."""
    model, x, y = map_problem()
    options = dict(num_members=4, objective="anchored", lr=1e-2, batch_size=None, max_epochs=150, progress=False, seed=1)
    torch_path = deep_ensemble(model, x, y, backend="eager", **options)
    native_path = deep_ensemble(model, x, y, **options)
    assert native_path.stats["path"] == "native" and "'anchored'" in native_path.stats["path_reason"]
    for name, value in torch_path.samples.items():
        torch.testing.assert_close(native_path.samples[name], value, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(native_path.stats["train_loss"], torch_path.stats["train_loss"], rtol=1e-10, atol=1e-10)


@pytest.mark.slow  # 10-15 s: spawned processes
def test_anchored_members_on_the_native_path_in_two_processes_are_the_torch_paths():
    """Each process builds the native potentials of its own members' targets and anchors."""
    model, x, y = map_problem()
    options = dict(num_members=4, objective="anchored", lr=1e-2, batch_size=None, max_epochs=150, progress=False, seed=1)
    torch_path = deep_ensemble(model, x, y, backend="eager", **options)
    two = deep_ensemble(model, x, y, num_processes=2, **options)
    assert two.stats["path"] == "native"
    for name, value in torch_path.samples.items():
        torch.testing.assert_close(two.samples[name], value, rtol=1e-9, atol=1e-10)
