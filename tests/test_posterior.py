"""Every method's result answers the same verbs: predict, to_arviz, save/load, summary."""

import inspect
import math
import os

import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.infer.results.posterior import STATS, Posterior


def _model(hidden=4, noise=0.1):
    torch.manual_seed(0)
    scale = dist.LogNormal(math.log(0.1), 0.5) if noise is None else noise
    return pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(hidden,)), pyrobnn.GaussianLikelihood(scale=scale), pyrobnn.NormalPrior(1.0))


def _data(n=24):
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


def _fit(name, model, x, y):
    quiet = dict(progress=False)
    if name == "nuts":
        return pyrobnn.nuts(model, x, y, num_samples=10, num_warmup=10, num_chains=2, backend="native", **quiet)
    if name == "mclmc":
        return pyrobnn.mclmc(model, x, y, num_samples=40, num_warmup=(20, 5, 5), num_chains=2, thinning=4, backend="eager", **quiet)
    ensemble = pyrobnn.deep_ensemble(model, x, y, num_members=2, max_epochs=5, batch_size=8, **quiet)
    if name == "ensemble":
        return ensemble
    if name == "ensemble_mclmc":
        return pyrobnn.ensemble_sampling(model, x, y, ensemble=ensemble, sampler="mclmc", num_samples=40, num_warmup=(20, 5, 5), thinning=4, backend="eager", **quiet)
    if name == "laplace":
        return pyrobnn.laplace(model, x, y, hessian="diag", tune_prior=False, map_estimate=ensemble.member(0), num_samples=10)
    if name == "swag":
        return pyrobnn.swag(model, x, y, num_epochs=3, batch_size=8, rank=2, num_samples=10, map_estimate=ensemble.member(0), **quiet)
    if name in ("sgld", "sghmc"):
        return getattr(pyrobnn, name)(model, x, y, num_steps=20, thinning=2, batch_size=8, num_chains=2, **quiet)
    if name == "smile":
        return pyrobnn.smile(model, x, y, num_samples=20, num_warmup=10, thinning=2, batch_size=8, num_chains=2, **quiet)
    if name == "ivon":
        return pyrobnn.ivon(model, x, y, epochs=5, batch_size=8, **quiet)
    if name == "variational":
        return pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=5, **quiet)
    raise ValueError(name)


# The verbs every method answers on every case (predict, to_arviz, save/load, summary) are the
# conformance suite's (pyrobnn.testing, tests/test_conformance.py); here, what a summary and a
# reloaded result hold beyond them.
@pytest.mark.parametrize("name", ["nuts", "laplace", "smile", "ivon"])
def test_a_reloaded_result_holds_the_saved_draws_and_its_summary_the_methods_figures(name, tmp_path):
    x, y = _data()
    model = _model(noise=None if name == "nuts" else 0.1)
    posterior = _fit(name, model, x, y)
    path = tmp_path / "posterior.pt"
    posterior.save(path)
    fresh = _model(noise=None if name == "nuts" else 0.1)
    loaded = pyrobnn.load_posterior(path, fresh)
    assert type(loaded) is type(posterior) and loaded.method == posterior.method and loaded.family == posterior.family
    assert loaded.settings.keys() == posterior.settings.keys()
    assert repr(loaded.settings) == repr(posterior.settings)  # plain values, tensors included
    if name == "ivon":
        assert loaded.guide.config() == posterior.guide.config()
        for (k, v), (k2, v2) in zip(posterior.guide.state_dict().items(), loaded.guide.state_dict().items()):
            assert k == k2 and torch.equal(v, v2)
    else:
        for k, v in posterior.samples.items():
            torch.testing.assert_close(loaded.samples[k], v, rtol=0, atol=0)
    text = posterior.summary()
    assert posterior.method in text and type(model.net).__name__ in text
    if name in ("nuts", "smile"):
        assert f"{posterior.num_chains} chain(s) x {posterior.num_draws} draw(s)" in text
    if name == "nuts":
        assert "divergent transitions" in text
    if name == "laplace":
        assert "log marginal likelihood" in text


def test_a_loaded_posterior_refuses_a_model_of_another_structure(tmp_path):
    x, y = _data()
    model = _model()
    posterior = _fit("ensemble", model, x, y)
    path = tmp_path / "ensemble.pt"
    posterior.save(path)
    with pytest.raises(ValueError, match="site '0.weight' is \\[4, 1\\] there and \\[5, 1\\] in this model"):
        Posterior.load(path, _model(hidden=5))
    other = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(0.0, 1.0)))
    with pytest.raises(ValueError, match="latent sites"):
        Posterior.load(path, other)
    classifier = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.BernoulliLikelihood())
    with pytest.raises(ValueError, match="likelihood of type GaussianLikelihood; this model has BernoulliLikelihood"):
        Posterior.load(path, classifier)
    with pytest.raises(ValueError, match="holds a EnsemblePosterior, not a SWAGPosterior"):
        pyrobnn.infer.modes.SWAGPosterior.load(path, model)
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a saved pyrobnn posterior"):
        pyrobnn.load_posterior(tmp_path / "other.pt", model)


def test_saved_files_follow_the_users_umask(tmp_path):
    x, y = _data()
    posterior = _fit("sgld", _model(), x, y)
    old = os.umask(0o027)
    try:
        posterior.save(tmp_path / "p.pt")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "p.pt").st_mode & 0o777 == 0o640


def test_stats_outside_the_schema_are_refused():
    samples = {"w": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match="stats key 'diverging_total' is not in the schema"):
        Posterior(samples, {"diverging_total": torch.zeros(2)})
    with pytest.raises(ValueError, match="a draw statistic needs \\(2, 3\\) first"):
        Posterior(samples, {"diverging": torch.zeros(2, 4, dtype=torch.bool)})
    assert "diverging" in STATS and STATS["diverging"][0] == "draw"


def test_pyro_nuts_counts_its_divergences():
    # a target acceptance of 0.05 makes the warm-up choose steps far too long for this sharp
    # posterior (noise 0.01, 200 points): transitions diverge. The old result reported 0.
    torch.manual_seed(0)
    x = torch.randn(200, 1)
    y = 0.5 * x + 0.01 * torch.randn(200, 1)
    model = pyrobnn.BayesianModel(torch.nn.Linear(1, 1), pyrobnn.GaussianLikelihood(scale=0.01), pyrobnn.NormalPrior(1.0))
    result = pyrobnn.pyro_nuts(model, x, y, num_samples=20, num_warmup=20, max_tree_depth=4, target_accept=0.05, progress=False)
    assert result.stats["diverging"].shape == (1, 20)
    assert result.num_divergences > 0
    assert result.num_divergences == int(result.stats["diverging"].sum())


def test_a_subset_of_draws_takes_from_every_chain():
    model = _model()
    x = torch.zeros(3, 1)
    base = {s.name: torch.zeros((2, 50) + tuple(s.shape)) for s in model.sites}
    base["0.bias"] = torch.zeros(2, 50, 4)
    base["2.bias"] = torch.stack([torch.zeros(50, 1), torch.ones(50, 1)])  # chain 0 predicts 0, chain 1 predicts 1
    posterior = Posterior(base, model=model)
    pred = posterior.predict(x, num_samples=10)
    torch.testing.assert_close(pred.mean, torch.full((3, 1), 0.5))


def test_every_method_takes_its_settings_by_keyword_only():
    # (model, x, y) by position, everything else by name: deep_ensemble(model, x, y, 8) would
    # read as a seed in one method and a member count in another
    for name in ("nuts", "mclmc", "pyro_nuts", "ensemble_sampling", "deep_ensemble", "laplace", "swag", "sgld", "sghmc", "smile", "ivon"):
        params = list(inspect.signature(getattr(pyrobnn, name)).parameters.values())
        assert [p.name for p in params[:3]] == ["model", "x", "y"], name
        assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[3:]), name
