"""The method registry: the declarations the refusals, the support table and the budgets read,
and the result protocol every method's result answers."""

import inspect

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn import methods
from pyrobnn.infer.results.protocol import Result
from pyrobnn.testing import build_case


def test_a_refusal_names_the_method_what_it_lacks_and_the_methods_that_take_the_case():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 2, hidden=(4,)), pyrobnn.HeteroscedasticGaussianLikelihood())
    with pytest.raises(methods.UnsupportedModelError) as e:
        pyrobnn.laplace(model, torch.randn(10, 2), torch.randn(10, 1))
    text = str(e.value)
    assert text.startswith("laplace does not support HeteroscedasticGaussianLikelihood (laplace-torch has no heteroscedastic likelihood)")
    takers = [k for k, m in methods.METHODS.items() if "heteroscedastic" in m.support.likelihoods]
    assert "nuts" in takers and "laplace" not in takers
    assert text.endswith("Methods that take this likelihood: " + ", ".join(takers))


def test_a_prior_refusal_reads_the_same_declaration():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(0.1), pyrobnn.ScaleMixturePrior(0.5, 1.0, 0.1))
    for call in (lambda: pyrobnn.ivon(model, torch.randn(8, 2), torch.randn(8)), lambda: pyrobnn.MCDropout(model)):
        with pytest.raises(methods.UnsupportedModelError, match="needs NormalPrior on every random site; site '0.weight' has a ScaleMixturePrior"):
            call()


def test_the_learned_noise_scale_is_refused_by_every_method_that_moves_latent_sites_only():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), pyrobnn.GaussianLikelihood("learned"))
    latent_only = [k for k, m in methods.METHODS.items() if "gaussian_learned" not in m.support.likelihoods]
    assert set(latent_only) == {"ivon", "nuts", "mclmc", "pyro_nuts", "ensemble_sampling", "deep_ensemble", "laplace", "swag", "sgld", "sghmc", "smile"}
    x, y = torch.randn(8, 2), torch.randn(8)
    for key in latent_only:
        with pytest.raises(methods.UnsupportedModelError, match="does not support GaussianLikelihood.*learned.*fixed noise scale or a prior"):
            methods.spec(key).run(model, x, y)


def test_the_support_table_is_the_declarations():
    rows = {r["method"]: r for r in methods.support_table()}
    assert list(rows) == list(methods.METHODS)
    for key, row in rows.items():
        spec = methods.spec(key)
        for kind in methods.LIKELIHOODS:
            assert row[f"likelihood:{kind}"] == (kind in spec.support.likelihoods)
        for kind in methods.PRIORS:
            assert row[f"prior:{kind}"] == (kind in spec.support.priors)


def test_kinds_are_read_from_the_model():
    lik = pyrobnn.GaussianLikelihood
    assert methods.likelihood_kind(lik(0.1)) == "gaussian"
    assert methods.likelihood_kind(lik(dist.LogNormal(0.0, 1.0))) == "gaussian_prior"
    assert methods.likelihood_kind(lik("learned")) == "gaussian_learned"
    net = pyrobnn.MLP(2, 1, hidden=(4,))
    mixed = pyrobnn.BayesianModel(net, lik(0.1), {"0.*": pyrobnn.NormalPrior(1.0), "*": pyrobnn.LogUniformPrior()})
    kind, site = methods.prior_kind(mixed)
    assert kind == "other" and site.name == "2.weight"
    assert methods.prior_kind(pyrobnn.BayesianModel(net, lik(0.1), pyrobnn.LogUniformPrior()))[0] == "log_uniform"
    normal = pyrobnn.BayesianModel(net, lik(0.1), pyrobnn.NormalPrior(1.0))
    assert methods.prior_kind(normal) == ("normal", normal.sites[0])
    # a method that needs another prior names the site and the prior it has
    with pytest.raises(pyrobnn.UnsupportedModelError, match="GaussianDropout needs .*; site '.*' has a NormalPrior"):
        pyrobnn.GaussianDropout(normal)


def test_every_registered_method_takes_model_x_y_and_keywords():
    for key, spec in methods.METHODS.items():
        params = list(inspect.signature(spec.run).parameters.values())
        assert [p.name for p in params[:3]] == ["model", "x", "y"], key
        assert spec.seeded in inspect.signature(spec.run).parameters or any(p.kind == p.VAR_KEYWORD for p in params), key


def test_fit_returns_a_result_with_its_history():
    model, x, y, x_test, _ = build_case("targets_1d")
    vi = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=4, progress=False, seed=0)
    assert isinstance(vi, Result) and isinstance(vi.history, pyrobnn.infer.History) and len(vi.history) == 4
    assert vi.stats["elbo_nll"].tolist() == vi.history.nll and vi.settings["batch_size"] == x.shape[0]
    assert vi.predict(x_test).mean.shape == (x_test.shape[0], 1)


@pytest.mark.parametrize("guide_class,options", [
    (pyrobnn.MeanFieldNormal, {"init_scale": 0.05}),
    (pyrobnn.VariationalDropout, {"alpha": "weight", "log_alpha_range": (-6.0, 1.0)}),
    (pyrobnn.MCDropout, {"p": {"0.weight": 0.2, "*": 0.4}}),
    (pyrobnn.ConcreteDropout, {"init_p": 0.3, "temperature": 0.2}),
])
def test_a_saved_guide_loads_with_the_model_alone(guide_class, options, tmp_path):
    model, x, y, x_test, _ = build_case("targets_1d")
    vi = pyrobnn.fit(model, guide_class(model, **options), x, y, epochs=3, progress=False, seed=0)
    vi.num_draws = 7
    vi.save(tmp_path / "vi.pt")
    loaded = pyrobnn.load_posterior(tmp_path / "vi.pt", model)
    assert type(loaded.guide) is guide_class and loaded.guide.config() == vi.guide.config()
    assert loaded.num_draws == 7 and loaded.history.nll == vi.history.nll
    a, b = vi.predict(x_test, seed=5), loaded.predict(x_test, seed=5)
    assert a.num_samples == 7 and torch.equal(a.loc_samples, b.loc_samples)


def test_a_guide_pyrobnn_cannot_rebuild_asks_for_it(tmp_path):
    model, x, y, _, _ = build_case("targets_1d")
    vi = pyrobnn.fit(model, pyro.infer.autoguide.AutoNormal(model), x, y, epochs=2, progress=False)
    vi.save(tmp_path / "auto.pt")
    with pytest.raises(ValueError, match="holds a trained AutoNormal that pyrobnn cannot rebuild by itself.*guide=guide"):
        pyrobnn.load_posterior(tmp_path / "auto.pt", model)


def test_the_verbs_have_one_signature():
    from pyrobnn.infer.results.posterior import Posterior
    from pyrobnn.infer.svi.variational import VariationalPosterior

    for cls in (Posterior, VariationalPosterior, pyrobnn.infer.modes.LaplacePosterior):
        params = inspect.signature(cls.predict).parameters
        assert list(params)[:3] == ["self", "x", "num_samples"] and params["num_samples"].default is None, cls
        for name in ("seed", "batch_size"):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None, (cls, name)
        assert list(inspect.signature(cls.to_arviz).parameters)[:3] == ["self", "x", "y"], cls
        assert list(inspect.signature(cls.load).parameters)[:2] == ["path", "model"], cls


def test_predict_dispatches_on_the_protocol():
    model, x, y, x_test, _ = build_case("targets_1d")
    la = pyrobnn.laplace(model, x, y, num_samples=5, map_options={"max_epochs": 3, "progress": False})
    # pyrobnn.predict on a result is the result's own predictive (Laplace's: linearized)
    assert torch.equal(pyrobnn.predict(model, la, x_test).loc_samples, la.predict(x_test).loc_samples)
    other = build_case("targets_1d")[0]
    with pytest.raises(ValueError, match="belongs to another model object"):
        pyrobnn.predict(other, la, x_test)


def test_arguments_are_refused_by_the_declaration_before_any_work(monkeypatch):
    """The constraints of a method's declaration refuse at the call: nothing is trained first
    (an ensemble-initialized run checks its sampler's arguments before the ensemble)."""
    import pyrobnn.infer.ensemble_sampling as ensemble_sampling

    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(3,)), pyrobnn.GaussianLikelihood(0.1))
    x, y = torch.randn(8, 1), torch.randn(8)
    trained = []
    monkeypatch.setattr(ensemble_sampling, "deep_ensemble", lambda *args, **kwargs: trained.append(kwargs))
    with pytest.raises(ValueError, match=r"target_accept must be in \(0, 1\), got 1.5"):
        pyrobnn.ensemble_sampling(model, x, y, sampler="nuts", target_accept=1.5, ensemble_options=dict(num_members=2, max_epochs=1000))
    assert trained == []
    for call, message in (
        (lambda: pyrobnn.nuts(model, x, y, backend="cuda"), r"backend must be one of \('auto', 'native', 'compile', 'eager'\), got 'cuda'"),
        (lambda: pyrobnn.mclmc(model, x, y, num_warmup=(10, 5)), "mclmc: num_warmup must be a number of steps or the steps of the three tuning phases"),
        (lambda: pyrobnn.mclmc(model, x, y, num_samples=5, thinning=10), r"num_samples \(5\) must be at least thinning \(10\)"),
        (lambda: pyrobnn.sgld(model, x, y, num_steps=10, num_burnin=9, thinning=20), "no draws kept: num_steps=10 with thinning=20"),
        (lambda: pyrobnn.sghmc(model, x, y, friction=0.0), r"friction must be in \(0, 1\], got 0.0"),
        (lambda: pyrobnn.smile(model, x, y, reset_prob=0.0), r"reset_prob must be a fraction in \(0, 1\], got 0.0"),
        (lambda: pyrobnn.swag(model, x, y, momentum=1.0), r"momentum must be in \[0, 1\), got 1.0"),
        (lambda: pyrobnn.ivon(model, x, y, clip_radius=0.0), "clip_radius must be a positive number, got 0.0"),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_the_declaration_check_finds_an_option_the_method_does_not_take():
    """A warm start or Bayesian-optimization option naming a parameter the method lacks (a
    renamed one) fails the conformance suite's declaration check, as do options the method's own
    constraints refuse."""
    from pyrobnn.testing import check_declaration

    nuts = methods.spec("nuts")
    fakes = {
        "renamed_warmup": methods.MethodSpec("renamed_warmup", "a test", "mcmc", nuts.run, nuts.support, budgets=nuts.budgets,
                                             warm_start=methods.WarmStart(init="init", count="num_chains", scaled=("warmup_steps",))),
        "bad_bo_options": methods.MethodSpec("bad_bo_options", "a test", "mcmc", nuts.run, nuts.support, budgets=nuts.budgets,
                                             constraints=nuts.constraints, bo_options={"target_accept": 2.0}),
        "clean": methods.MethodSpec("clean", "a test", "mcmc", nuts.run, nuts.support, budgets=nuts.budgets, constraints=nuts.constraints,
                                    bo_options=nuts.bo_options, warm_start=nuts.warm_start),
    }
    try:
        for spec in fakes.values():
            methods.register(spec)
        with pytest.raises(AssertionError, match=r"its warm_start name \['warmup_steps'\]"):
            check_declaration("renamed_warmup")
        with pytest.raises(AssertionError, match="target_accept must be in"):
            check_declaration("bad_bo_options")
        check_declaration("clean")
    finally:
        for key in fakes:
            methods.METHODS.pop(key, None)


def test_a_warm_start_scales_the_budgets_and_keeps_them_above_the_smallest():
    class Previous:
        num_chains = 3
        stats = {"step_size": torch.tensor([0.1, 0.2, 0.3]), "L": torch.tensor([1.0, 2.0, 3.0])}

    nuts = methods.spec("nuts")
    options = nuts.warm_start.options(nuts, None, Previous, None, None, {"num_warmup": 200, "num_samples": 64}, 0.25, 0)
    assert options == {"num_warmup": 50, "num_samples": 64, "init": Previous, "num_chains": 3}
    mclmc = methods.spec("mclmc")
    # the default phases, the step size's a tenth as long again: it starts where each chain's ended
    options = mclmc.warm_start.options(mclmc, None, Previous, None, None, {}, 0.1, 0)
    assert options["num_warmup"] == (400, 500, 500) and options["energy_variance"] == 0.1 and options["num_chains"] == 3
    assert torch.equal(options["step_size"], Previous.stats["step_size"]) and torch.equal(options["L"], Previous.stats["L"])
    options = mclmc.warm_start.options(mclmc, None, Previous, None, None, {"num_warmup": 100, "energy_variance": 0.05}, 0.25, 0)
    assert options["num_warmup"] == (2, 2, 2) and options["energy_variance"] == 0.05  # 100 steps are (80, 10, 10)
    options = nuts.warm_start.options(nuts, None, Previous, None, None, {"num_warmup": 1}, 0.25, 0)
    assert options["num_warmup"] == 1  # at least 1 (scaled_budget), and at least the smallest budget (0)
