"""Our model and guide under Pyro's own machinery: JIT, per-parameter optimizers, optimizer
state, handlers that substitute parameters, and isolation between two BNNs."""

import copy
import io

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, JitTrace_ELBO, JitTraceMeanField_ELBO, Trace_ELBO, TraceMeanField_ELBO

import pyrobnn
from pyrobnn.guides.base import site_key
from test_elbo import CASES, build, data

# Pyro's JIT ELBOs are built on torch.jit.trace, which torch 2.14 announces as deprecated on every call
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")

GUIDE_CASES = [c for c in CASES if c != "meanfield-ard"] + ["gaussian-dropout", "weight-vd"]


def build_case(case):
    if case == "gaussian-dropout":
        model, _ = build("sparsevd-loguniform")
        return model, pyrobnn.GaussianDropout(model, p=0.2)
    if case == "weight-vd":
        model, _ = build("sparsevd-loguniform")
        return model, pyrobnn.VariationalDropout(model, alpha="weight", init_log_alpha=-2.0)
    return build(case)


@pytest.mark.parametrize("case", GUIDE_CASES)
def test_jit_elbo_equals_the_eager_elbo_at_the_same_seed(case):
    model, guide = build_case(case)
    x, y = data()
    jit_elbo = JitTrace_ELBO(ignore_jit_warnings=True)
    jit_elbo.differentiable_loss(model, guide, x, y)  # compiles
    for seed in (1, 2):
        pyro.set_rng_seed(seed)
        expected = Trace_ELBO().differentiable_loss(model, guide, x, y)
        pyro.set_rng_seed(seed)
        got = jit_elbo.differentiable_loss(model, guide, x, y)
        assert got.item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-9)
    check_trains_under(JitTrace_ELBO, model, guide, x, y)


@pytest.mark.slow
@pytest.mark.parametrize("case", GUIDE_CASES)
def test_jit_mean_field_elbo_estimates_the_eager_mean_field_elbo(case):
    """Pyro's JitTraceMeanField_ELBO draws other random numbers than TraceMeanField_ELBO at
    the same seed (so for a plain Pyro model too), so the two are compared in distribution:
    their means over 300 draws agree within Monte Carlo error (4 standard errors)."""
    model, guide = build_case(case)
    x, y = data()
    jit_elbo, eager = JitTraceMeanField_ELBO(ignore_jit_warnings=True), TraceMeanField_ELBO()
    with torch.no_grad():
        a = torch.tensor([jit_elbo.differentiable_loss(model, guide, x, y).item() for _ in range(300)])
        b = torch.tensor([eager.differentiable_loss(model, guide, x, y).item() for _ in range(300)])
    se = (a.var() / a.numel() + b.var() / b.numel()).sqrt()
    assert (a.mean() - b.mean()).abs() < 4 * se + 1e-9
    check_trains_under(JitTraceMeanField_ELBO, model, guide, x, y)


def check_trains_under(elbo, model, guide, x, y):
    """SVI with ``elbo`` moves the guide's parameters."""
    # and it trains: SVI with the JIT ELBO moves the guide's parameters
    before = [p.detach().clone() for p in guide.parameters()]
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), elbo(ignore_jit_warnings=True))
    for _ in range(3):
        svi.step(x, y)
    assert any(not torch.equal(b, p) for b, p in zip(before, guide.parameters()))


@pytest.mark.parametrize("case", GUIDE_CASES)
def test_per_parameter_optimizer_options_reach_each_named_parameter(case):
    model, guide = build_case(case)
    x, y = data()
    frozen = "guide." + next(n for n, _ in guide.named_parameters())
    seen = []

    def options(name):
        seen.append(name)
        return {"lr": 0.0 if name == frozen else 0.05}

    named = {"guide." + n: p for n, p in guide.named_parameters()}
    before = {n: p.detach().clone() for n, p in named.items()}
    svi = SVI(model, guide, pyro.optim.Adam(options), Trace_ELBO())
    for _ in range(3):
        svi.step(x, y)
    assert sorted(seen) == sorted(named)  # every parameter, by its own name, once
    assert torch.equal(named[frozen], before[frozen])
    assert any(not torch.equal(named[n], before[n]) for n in named if n != frozen)


@pytest.mark.parametrize("case", GUIDE_CASES)
def test_optimizer_state_saved_and_loaded_through_pyro_resumes_exactly(case, tmp_path):
    x, y = data()
    model, guide = build_case(case)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(4):
        svi.step(x, y)
    state = svi.optim.get_state()
    assert set(state) == {"guide." + n for n, _ in guide.named_parameters()}
    svi.optim.save(tmp_path / "optim.pt")
    saved_model, saved_guide = copy.deepcopy(model.state_dict()), copy.deepcopy(guide.state_dict())

    def continue_from(load_state):
        m, g = build_case(case)
        m.load_state_dict(saved_model)
        g.load_state_dict(saved_guide)
        optim = pyro.optim.Adam({"lr": 0.02})
        if load_state:
            optim.load(tmp_path / "optim.pt")
        resumed = SVI(m, g, optim, Trace_ELBO())
        pyro.set_rng_seed(7)
        for _ in range(3):
            resumed.step(x, y)
        return [p.detach().clone() for p in g.parameters()]

    pyro.set_rng_seed(7)
    for _ in range(3):
        svi.step(x, y)
    uninterrupted = [p.detach() for p in guide.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(continue_from(True), uninterrupted))
    # without the optimizer's moments the same steps land elsewhere: the state mattered
    assert any(not torch.equal(a, b) for a, b in zip(continue_from(False), uninterrupted))


def test_model_point_parameters_are_named_and_optimized_through_pyro():
    model, _ = build("meanfield-normal")
    model = pyrobnn.BayesianModel(model.net, pyrobnn.GaussianLikelihood(scale="learned"), model.site_prior(model.sites[0]))
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = data()
    names = {n for n, _ in model.point_parameters()}
    assert names and all(n.startswith("likelihood.") for n in names)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    before = {n: p.detach().clone() for n, p in model.point_parameters()}
    for _ in range(3):
        svi.step(x, y)
    assert names <= set(svi.optim.get_state())
    assert all(not torch.equal(before[n], p) for n, p in model.point_parameters())


def test_substituted_parameters_are_the_ones_the_guide_computes_with():
    model, guide = build("meanfield-normal")
    x, y = data()
    site = model.sites[0]
    key = site_key(site.name)
    data_ = {"guide.loc." + key: torch.full_like(guide.loc[key], 3.0), "guide.rho." + key: torch.full_like(guide.rho[key], -30.0)}
    draws = poutine.substitute(guide, data=data_)(x, y)[site.name]
    assert torch.allclose(draws, torch.full_like(draws, 3.0), atol=1e-10)  # softplus(-30) ~ 1e-13
    # and nothing was written into the module
    assert not torch.equal(guide.loc[key], data_["guide.loc." + key])
    # replaying a parameter trace (what the JIT does) uses the replayed values as well
    with poutine.trace(param_only=True) as tr:
        guide(x, y)
    params = {n: s["value"] for n, s in tr.trace.nodes.items()}
    pyro.set_rng_seed(0)
    a = guide(x, y)[site.name]
    pyro.set_rng_seed(0)
    b = poutine.replay(guide, params=params)(x, y)[site.name]
    assert torch.equal(a, b)


def test_two_bnns_with_the_same_names_never_share_a_value():
    x, y = data()
    first_model, first_guide = build("meanfield-normal")
    svi = SVI(first_model, first_guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(10):
        svi.step(x, y)
    trained = [p.detach().clone() for p in first_guide.parameters()]
    second_model, second_guide = build("meanfield-normal")
    fresh = [p.detach().clone() for p in second_guide.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(trained, fresh))
    other = SVI(second_model, second_guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    with poutine.trace(param_only=True) as tr:
        other.step(x, y)
    # the second guide starts from its own values, not the first one's trained ones, and
    # training it leaves the first untouched
    used = {id(s["value"].unconstrained()) for s in tr.trace.nodes.values()}
    assert used == {id(p) for p in second_guide.parameters()}
    assert all(torch.equal(a, p) for a, p in zip(trained, first_guide.parameters()))
    # the names now point at the second guide's tensors; stepping the first again re-points them
    store = pyro.get_param_store()
    assert all(store.param_name(p) == "guide." + n for n, p in second_guide.named_parameters())
    svi.step(x, y)
    assert all(store.param_name(p) == "guide." + n for n, p in first_guide.named_parameters())
    assert all(store.param_name(p) is None for p in second_guide.parameters())


def test_a_module_trained_under_pyro_still_pickles():
    model, guide = build("meanfield-normal")
    x, y = data()
    SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO()).step(x, y)
    buffer = io.BytesIO()
    torch.save(guide, buffer)  # no weak references were attached to the parameters
    buffer.seek(0)
    reloaded = torch.load(buffer, weights_only=False)
    assert all(torch.equal(a, b) for a, b in zip(guide.parameters(), reloaded.parameters()))
    copied = copy.deepcopy(model)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copied.parameters()))


def test_a_second_prefix_keeps_two_jit_trained_bnns_apart():
    x, y = data()
    (m1, g1), (m2, g2) = build("meanfield-normal"), build("meanfield-normal")
    g2.pyro_prefix = "guide2."
    svi1 = SVI(m1, g1, pyro.optim.Adam({"lr": 0.05}), JitTrace_ELBO(ignore_jit_warnings=True))
    svi2 = SVI(m2, g2, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    svi1.step(x, y)
    before2 = [p.detach().clone() for p in g2.parameters()]
    svi2.step(x, y)
    after2 = [p.detach().clone() for p in g2.parameters()]
    before1 = [p.detach().clone() for p in g1.parameters()]
    svi1.step(x, y)  # the compiled step finds its own tensors by name
    assert all(torch.equal(a, p) for a, p in zip(after2, g2.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(before1, g1.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(before2, after2))


def test_a_pyro_param_of_the_users_under_one_of_our_names_is_refused_not_replaced():
    model, guide = build("meanfield-normal")
    x, y = data()
    name = "guide." + next(n for n, _ in guide.named_parameters())
    mine = pyro.param(name, torch.zeros(3))
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    with pytest.raises(ValueError, match=f"parameter store holds a parameter '{name}' that pyrobnn did not put there"):
        svi.step(x, y)
    assert pyro.get_param_store()[name] is mine  # left as it was
    pyro.clear_param_store()
    svi.step(x, y)  # with the store cleared, training goes on
