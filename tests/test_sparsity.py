"""Pruning by log alpha and by signal-to-noise ratio; export of the pruned network."""

import math

import pytest
import torch

import pyrobnn
from pyrobnn.guides import sparsity


def sparse_vd(seed=0):
    torch.manual_seed(seed)
    model = pyrobnn.BayesianModel(pyrobnn.LeNet300100(), pyrobnn.CategoricalLikelihood(), pyrobnn.LogUniformPrior(), random="weights")
    guide = pyrobnn.SparseVariationalDropout(model)
    with torch.no_grad():
        for v in guide.log_sigma2.values():
            v.normal_(-4.0, 6.0)
    return model, guide


def test_log_alpha_masks_count_exactly_the_weights_below_the_threshold():
    model, guide = sparse_vd()
    masks = sparsity.masks_by_log_alpha(guide, threshold=3.0)
    report = sparsity.report(guide, masks)
    total = nonzero = 0
    for site in guide.sites:
        key = site.name.replace(".", ":")
        theta, log_sigma2 = guide.theta[key].detach(), guide.log_sigma2[key].detach()
        la = torch.clamp(log_sigma2 - torch.log(theta**2 + 1e-16), -8.0, 8.0)
        kept = int((la < 3.0).sum())
        assert int(masks[site.name].sum()) == kept
        total, nonzero = total + site.numel, nonzero + kept
    assert math.isclose(report.compression, total / nonzero)
    assert [layer.name for layer in report.weights] == ["1.weight", "3.weight", "5.weight"]


def test_exported_sparse_net_predicts_as_the_pruned_posterior_mean():
    model, guide = sparse_vd()
    pruned = sparsity.PrunedGuide(guide, sparsity.masks_by_log_alpha(guide))
    x = torch.rand(64, 1, 28, 28)
    expected = pyrobnn.predict(model, pruned, x, method="mean").probs
    net = sparsity.export(model, pruned)
    assert isinstance(net, torch.nn.Sequential) and not isinstance(net, pyrobnn.BayesianModel)
    with torch.no_grad():
        got = torch.softmax(net(x), -1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # the zeros are in the exported weights, where the mask says
    for site in guide.sites:
        weight = dict(net.named_parameters())[site.name]
        assert torch.equal(weight != 0, pruned.masks[site.name] & (guide.theta[site.name.replace(".", ":")] != 0))


def test_pruned_guide_samples_are_zero_where_pruned_and_unchanged_elsewhere():
    model, guide = sparse_vd()
    masks = sparsity.masks_by_log_alpha(guide)
    pruned = sparsity.PrunedGuide(guide, masks)
    import pyro

    trace = pyro.poutine.trace(pruned).get_trace()
    for site in guide.sites:
        w = trace.nodes[site.name]["value"]
        raw = trace.nodes[site.name + "/unpruned"]["value"]
        assert torch.all(w[~masks[site.name]] == 0)
        assert torch.equal(w[masks[site.name]], raw[masks[site.name]])
    # vectorized prediction through Predictive works on the wrapper
    pred = pyrobnn.predict(model, pruned, torch.rand(8, 1, 28, 28), num_samples=5)
    assert pred.probs.shape == (8, 10)


def test_snr_masks_remove_the_requested_fraction_of_lowest_snr_weights():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(20, 3, hidden=(30,)), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    with torch.no_grad():
        for v in guide.rho.values():
            v.normal_(-3.0, 1.0)
    snr = sparsity.signal_to_noise(guide)
    site = guide.sites[0]
    q = guide.posterior(site)
    torch.testing.assert_close(snr[site.name], q.loc.abs() / q.scale)
    weights = torch.cat([snr[s.name].reshape(-1) for s in guide.sites if not s.is_bias])
    for fraction in (0.0, 0.5, 0.75, 0.95, 0.98):
        masks = sparsity.masks_by_snr(guide, fraction)
        removed = sum(int((~masks[s.name]).sum()) for s in guide.sites)
        assert removed == round(fraction * weights.numel())
        assert all(bool(masks[s.name].all()) for s in guide.sites if s.is_bias)
        if removed:  # every removed weight has an SNR at most that of every kept one
            kept_min = min(snr[s.name][masks[s.name]].min() for s in guide.sites if not s.is_bias)
            removed_max = max(snr[s.name][~masks[s.name]].max() for s in guide.sites if not s.is_bias and (~masks[s.name]).any())
            assert removed_max <= kept_min
    with pytest.raises(ValueError, match="fraction"):
        sparsity.masks_by_snr(guide, 1.0)


def test_log_alpha_of_a_mean_field_guide_is_minus_twice_log_snr():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(4, 1, hidden=(5,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model, init_scale=0.05)
    la, snr = sparsity.log_alpha(guide), sparsity.signal_to_noise(guide)
    for name in la:
        torch.testing.assert_close(la[name], -2 * torch.log(snr[name]))


def test_bad_masks_and_guides_are_refused():
    model, guide = sparse_vd()
    with pytest.raises(ValueError, match="unknown sites"):
        sparsity.PrunedGuide(guide, {"nope": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="shape"):
        sparsity.PrunedGuide(guide, {"1.weight": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(TypeError, match="pyrobnn guide"):
        sparsity.log_alpha(object())


def test_record_results_replaces_by_name_and_metric(tmp_path):
    from pyrobnn.utils.io import record_results

    path = tmp_path / "results.json"
    record_results(path, [{"name": "a", "metric": "err", "value": 1.0}, {"name": "a", "metric": "cr", "value": 2.0}])
    merged = record_results(path, [{"name": "a", "metric": "err", "value": 0.5}])
    assert sorted((r["metric"], r["value"]) for r in merged) == [("cr", 2.0), ("err", 0.5)]
    with pytest.raises(ValueError, match="name"):
        record_results(path, [{"value": 1}])
