"""The training loop and direct use with Pyro's SVI."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyrobnn
from pyrobnn.data import two_moons
from pyrobnn.guides.base import site_key
from pyrobnn.infer import NonFiniteLossError, SVITrainer
from test_conjugate import bayesian_linear_model, conjugate_problem


def regression_data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


def mlp_model(prior=None, likelihood=None):
    net = pyrobnn.MLP(1, 1, hidden=(16,), activation="tanh")
    return pyrobnn.BayesianModel(net, likelihood or pyrobnn.GaussianLikelihood(scale=0.1), prior)


def test_pyro_svi_trains_our_model_and_guide_directly():
    X, y, exact_mean, precision = conjugate_problem(seed=3)
    model = bayesian_linear_model()
    guide = pyrobnn.MeanFieldNormal(model, init_scale=0.1)
    svi = pyro.infer.SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.02, "lrd": 0.999}), pyro.infer.Trace_ELBO(num_particles=32, vectorize_particles=True))
    losses = [svi.step(X, y) for _ in range(3000)]
    assert sum(losses[-100:]) < sum(losses[:100])
    posterior_sd = 1 / torch.diag(precision).sqrt()
    loc = guide.loc[site_key(model.sites[0].name)].detach().reshape(-1)
    assert torch.all((loc - exact_mean).abs() < 0.2 * posterior_sd)
    # Pyro's store names our tensors (for its optimizers) and holds no copy of them
    store = pyro.get_param_store()
    assert {store.param_name(p) for p in guide.parameters()} == {"guide." + n for n, _ in guide.named_parameters()}


def test_two_bnns_in_one_process_share_no_parameters():
    x, y = regression_data()
    models = [mlp_model() for _ in range(2)]
    guides = [pyrobnn.MeanFieldNormal(m) for m in models]
    captured = []
    for model, guide in zip(models, guides):
        with pyro.poutine.trace(param_only=True) as tr:
            pyro.infer.Trace_ELBO().loss_and_grads(model, guide, x, y)
        captured.append({id(site["value"].unconstrained()) for site in tr.trace.nodes.values()})
    assert captured[0] and captured[1] and not captured[0] & captured[1]
    before = [p.detach().clone() for p in guides[1].parameters()]
    svi = pyro.infer.SVI(models[0], guides[0], pyro.optim.Adam({"lr": 0.05}), pyro.infer.Trace_ELBO())
    start = [p.detach().clone() for p in guides[0].parameters()]
    for _ in range(20):
        svi.step(x, y)
    assert any(not torch.equal(a, p) for a, p in zip(start, guides[0].parameters()))
    assert all(torch.equal(a, p) for a, p in zip(before, guides[1].parameters()))


def test_fit_reports_nll_and_kl_apart_and_improves():
    x, y = regression_data()
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    history = pyrobnn.fit(model, guide, x, y, epochs=300, batch_size=16, lr=0.02, progress=False, seed=0).history
    assert len(history) == 300 and history.steps == 300 * 4
    assert history.kl_methods == {s.name: "monte_carlo" for s in model.sites}
    for loss, nll, kl, beta in zip(history.loss, history.nll, history.kl, history.kl_weight):
        assert loss == pytest.approx(nll + beta * kl, rel=1e-6, abs=1e-6)
    assert history.nll[-1] < 0.2 * history.nll[0]
    pred = pyrobnn.predict(model, guide, x, 200)
    assert pred.rmse(y) < 0.2  # the noise is 0.1; an untrained net is about 0.75


def test_fit_accepts_a_dataloader_and_kl_annealing():
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    history = pyrobnn.fit(model, guide, loader=loader, epochs=6, kl_annealing=(2, 4), lr=0.01, progress=False).history
    # epoch-averaged KL weight: steps at fractional epochs e + i/4
    # (t - 2) / 2 at t = e, e + 0.25, e + 0.5, e + 0.75, clipped to [0, 1]
    expected = [0.0, 0.0, 0.1875, 0.6875, 1.0, 1.0]
    assert history.kl_weight == pytest.approx(expected)


class BreaksAfter(nn.Module):
    """Passes its input through for ``calls`` calls, then returns NaN."""

    def __init__(self, calls):
        super().__init__()
        self.limit, self.calls = calls, 0

    def forward(self, h):
        self.calls += 1
        return h * float("nan") if self.calls > self.limit else h


def model_that_breaks_after(calls):
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1), BreaksAfter(calls))
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.1))
    return net, model, pyrobnn.MeanFieldNormal(model)


def test_nonfinite_loss_stops_with_the_step_and_keeps_the_last_finite_parameters():
    net, model, guide = model_that_breaks_after(5)
    x, y = regression_data()
    trainer = SVITrainer(model, guide, lr=0.05)
    trainer._setup(x, y, None)
    net[-1].calls = 0  # count the steps' calls only (the set-up checks the network's output once)
    for _ in range(5):
        trainer.step(x, y)
    last = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(NonFiniteLossError, match="at step 5") as info:
        trainer.step(x, y)
    assert info.value.step == 5
    assert all(torch.equal(a, p) for a, p in zip(last, guide.parameters()))


def test_nonfinite_gradient_is_caught_before_the_update():
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = regression_data()
    trainer = SVITrainer(model, guide, lr=0.05)
    trainer.step(x, y)
    hook = guide.loc[site_key(model.sites[0].name)].register_hook(lambda g: g * float("inf"))
    last = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(NonFiniteLossError, match="gradient"):
        trainer.step(x, y)
    hook.remove()
    assert all(torch.equal(a, p) for a, p in zip(last, guide.parameters()))


@pytest.mark.parametrize("num_particles", [1, 2])
def test_resumed_training_equals_an_uninterrupted_run(tmp_path, num_particles):
    """Bit for bit, also with vectorized particles (Pyro's traces, whose plate-nesting guess on
    a resumed trainer's first step must not draw from the random stream)."""
    x, y = regression_data()

    def run(epochs, checkpoint=None, resume=False, init_seed=0):
        torch.manual_seed(init_seed)  # a different initialization must not matter on resume
        model = mlp_model()
        guide = pyrobnn.MeanFieldNormal(model)
        history = pyrobnn.fit(
            model, guide, x, y, epochs=epochs, batch_size=16, lr=0.02, progress=False, seed=5,
            checkpoint=checkpoint, resume=resume, kl_annealing=(1, 3), num_particles=num_particles,
        ).history
        return guide, history

    full_guide, full_history = run(6)
    path = tmp_path / "run.pt"
    run(3, checkpoint=path)
    resumed_guide, resumed_history = run(6, checkpoint=path, resume=True, init_seed=123)
    for a, b in zip(full_guide.parameters(), resumed_guide.parameters()):
        assert torch.equal(a, b)
    assert resumed_history.loss == full_history.loss
    assert resumed_history.epoch == list(range(1, 7))


def test_classification_with_categorical_likelihood():
    x, y = two_moons(400, seed=0)
    net = pyrobnn.MLP(2, 2, hidden=(32, 32))
    model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood())
    guide = pyrobnn.MeanFieldNormal(model)
    pyrobnn.fit(model, guide, x, y, epochs=200, batch_size=100, lr=0.02, progress=False, seed=0)
    x_test, y_test = two_moons(1000, seed=1)
    pred = pyrobnn.predict(model, guide, x_test, 100)
    assert pred.accuracy(y_test) > 0.95  # chance is 0.5
    assert pred.probs.shape == (1000, 2)
    assert torch.allclose(pred.probs.sum(-1), torch.ones(1000))


def test_bernoulli_likelihood_trains():
    x, y = two_moons(400, seed=0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(32, 32)), pyrobnn.BernoulliLikelihood())
    guide = pyrobnn.MeanFieldNormal(model)
    pyrobnn.fit(model, guide, x, y.float(), epochs=200, batch_size=100, lr=0.02, progress=False, seed=0)
    x_test, y_test = two_moons(1000, seed=1)
    pred = pyrobnn.predict(model, guide, x_test, 100)
    assert pred.sample_probs.shape == (100, 1000, 1, 2)
    assert pred.accuracy(y_test.unsqueeze(-1)) > 0.95


def test_heteroscedastic_likelihood_learns_the_noise_function():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2000, 1, generator=g) * 2 - 1
    true_scale = 0.05 + 0.3 * x.abs()
    y = x + true_scale * torch.randn(2000, 1, generator=g)
    net = pyrobnn.MLP(1, 2, hidden=(32,), activation="tanh")
    model = pyrobnn.BayesianModel(net, pyrobnn.HeteroscedasticGaussianLikelihood(), random="last_layer")
    guide = pyrobnn.MeanFieldNormal(model)
    pyrobnn.fit(model, guide, x, y, epochs=150, batch_size=200, lr=0.02, progress=False, seed=0)
    grid = torch.tensor([[-0.8], [0.0], [0.8]])
    pred = pyrobnn.predict(model, guide, grid, 200)
    expected = 0.05 + 0.3 * grid.abs()
    # ~700 points per third of the range: a fitted scale is within about 10% of the truth
    assert torch.allclose(pred.aleatoric_std, expected, rtol=0.25, atol=0.02)
    assert pred.aleatoric_std[0] > 2 * pred.aleatoric_std[1]


def test_noise_with_a_prior_is_a_latent_site_with_a_posterior():
    x, y = regression_data(n=200)
    model = mlp_model(likelihood=pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.3), 1.0)))
    guide = pyrobnn.MeanFieldNormal(model)
    pyrobnn.fit(model, guide, x, y, epochs=1500, lr=0.02, progress=False, seed=0)
    noise = guide.latent_posterior("noise_scale")
    # with 200 points the prior hardly matters and the ELBO's optimum for the noise is
    # sigma^2 = E_q[(y - f_w(x))^2] averaged over the data = residual^2 + epistemic variance
    pred = pyrobnn.predict(model, guide, x, 2000, seed=1)
    fixed_point = pred.rmse(y) ** 2 + (pred.epistemic_std**2).mean().item()
    assert noise.mean.item() ** 2 == pytest.approx(fixed_point, rel=0.1)
    assert 0.08 < noise.mean.item() < 0.2  # the data's noise is 0.1
    # predictions draw the noise from its posterior: the aleatoric part is its RMS
    samples = noise.sample((100_000,))
    assert pred.aleatoric_std.mean().item() == pytest.approx(samples.pow(2).mean().sqrt().item(), rel=0.03)


@pytest.mark.slow  # about 25-45 s: a statistical check, run by .ci/run's -m slow
def test_ard_prior_variance_reaches_its_empirical_bayes_optimum_by_monte_carlo():
    """With a Monte Carlo KL the ARD prior's variances are learned point parameters; with the
    posterior held fixed, maximizing the ELBO over them must give lambda = mu^2 + sigma^2, the
    optimum at which the registered analytic KL is evaluated."""
    x, y = regression_data()
    model = mlp_model(prior=pyrobnn.ARDPrior(init_variance=1.0))
    guide = pyrobnn.MeanFieldNormal(model, init_scale=0.2)
    for p in guide.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(model.prior_params.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.998)
    elbo = pyrobnn.SplitELBO("monte_carlo", num_particles=64)
    for _ in range(2000):
        opt.zero_grad()
        elbo.differentiable_loss(model, guide, x, y).backward()
        opt.step()
        sched.step()
    for site in model.sites:
        lam = model.prior_params[f"{site_key(site.name)}:log_variance"].exp()
        optimum = guide.loc[site_key(site.name)] ** 2 + guide.scale_of(site) ** 2
        # 64 particles per step and a decayed step size: within a few percent
        assert torch.allclose(lam, optimum, rtol=0.1), (site.name, (lam / optimum).min(), (lam / optimum).max())


def test_a_checkpoint_of_another_guide_is_refused_before_anything_changes(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(16, 1), torch.randn(16, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale="learned"))
    other = pyrobnn.SVITrainer(model, pyrobnn.MCDropout(model, p=0.1))
    other.fit(x, y, epochs=1, progress=False)
    path = tmp_path / "dropout.pt"
    other.save_checkpoint(path)

    trained = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale="learned"))
    trainer = pyrobnn.SVITrainer(trained, pyrobnn.MeanFieldNormal(trained))
    trainer.fit(x, y, epochs=2, progress=False)
    model_before = {k: v.clone() for k, v in trained.state_dict().items()}
    guide_before = {k: v.clone() for k, v in trainer.guide.state_dict().items()}
    with pytest.raises(ValueError, match="the saved guide state does not match this guide"):
        trainer.load_checkpoint(path, x, y)
    assert all(torch.equal(model_before[k], v) for k, v in trained.state_dict().items())
    assert all(torch.equal(guide_before[k], v) for k, v in trainer.guide.state_dict().items())
    assert trainer.epoch == 2


def test_fit_skips_every_update_from_the_first_failed_step_and_says_so():
    _, model, guide = model_that_breaks_after(7)
    x, y = regression_data()
    trainer = SVITrainer(model, guide, lr=0.05)
    # fit's check of the data and the trainer's set-up run the network once each; then step k
    # is call k + 3
    with pytest.raises(NonFiniteLossError, match="the loss is nan at step 5 .*before step 5") as info:
        trainer.fit(x, y, epochs=3, batch_size=16, progress=False, seed=0)
    assert (info.value.step, info.value.epoch) == (5, 1)
    # steps 5, 6 and 7 of the second epoch ran but none of them moved a parameter
    assert all(int(trainer.optimizer.state[p]["step"]) == 5 for p in trainer.parameters())
    assert all(torch.isfinite(p).all() for p in trainer.parameters())
    assert len(trainer.history) == 1  # the failed epoch is not recorded


def test_an_overflowing_update_is_undone_reported_as_such_and_never_checkpointed(tmp_path):
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = regression_data()
    with pytest.raises(ValueError, match="lr must be a finite positive number"):
        SVITrainer(model, guide, lr=float("inf"))
    trainer = SVITrainer(model, guide, lr=1e39)  # finite, but the float32 update overflows
    with torch.no_grad():
        guide(x)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="the update of step 0 .* made the parameters non-finite .* and was undone; the parameters are those from before step 0"):
        trainer.step(x, y)
    for n, p in guide.named_parameters():  # the last finite parameters, bit for bit
        assert torch.equal(p, before[n]), n
    trainer.save_checkpoint(tmp_path / "ckpt.pt")  # finite again: a state training can go on from
    # parameters made non-finite another way are never written
    with torch.no_grad():
        next(iter(guide.parameters())).fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match="not writing"):
        trainer.save_checkpoint(tmp_path / "other.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_fit_with_an_overflowing_learning_rate_leaves_the_last_finite_parameters():
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = regression_data()
    pyrobnn.fit(model, guide, x, y, epochs=2, progress=False, seed=0)
    before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="overflowed"):
        pyrobnn.fit(model, guide, x, y, epochs=3, lr=1e39, batch_size=8, progress=False)
    for n, p in guide.named_parameters():
        assert torch.equal(p, before[n]), n


def test_fit_synchronizes_with_the_host_once_per_epoch_not_per_step(monkeypatch):
    """Reading a tensor's value on the host (a device sync on a GPU) is counted; the count
    does not grow with the number of steps in an epoch. The overflow guard reads its check at
    once on the CPU only (no device to wait for): here it takes its accelerator path, the one
    whose reads would be syncs."""
    from pyrobnn.infer.core.failures import OverflowGuard

    monkeypatch.setattr(OverflowGuard, "HOST_READ_DEVICES", ())
    x, y = regression_data()
    counts = {}
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] = counts.get("n", 0) + 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def reads(batch_size, estimator):
        model = mlp_model()
        guide = pyrobnn.MeanFieldNormal(model)
        trainer = SVITrainer(model, guide, lr=0.01, estimator=estimator)
        trainer.fit(x, y, epochs=1, batch_size=batch_size, progress=False, seed=0)
        counts["n"] = 0
        trainer.fit(x, y, epochs=3, batch_size=batch_size, progress=False)
        return counts["n"]

    for estimator in (None, "local"):
        assert reads(64, estimator) == reads(4, estimator)  # 1 and 16 steps per epoch


def test_step_checks_every_batch_as_fit_checks_its_data():
    """SVITrainer.step (public) names what is wrong with a batch instead of failing inside torch."""
    import numpy as np

    from pyrobnn.infer import InvalidBatchError

    x, y = regression_data()
    model = mlp_model()
    trainer = SVITrainer(model, pyrobnn.MeanFieldNormal(model), lr=0.01)
    before = [p.detach().clone() for p in trainer.guide.parameters()]
    for bad_x, bad_y, error, match in (
        (torch.randn(8, 3), y[:8], ValueError, "expects 1 features"),
        (torch.randn(0, 1), y[:0], ValueError, "x is empty"),
        (torch.randn(8, 5, 1), y[:8], ValueError, r"x has shape \(8, 5, 1\)"),
        (x[:8], y[:5], ValueError, "x has 8 examples but y has shape"),
        (x[:8].clone().fill_(float("nan")), y[:8], InvalidBatchError, "holds NaN or infinite values"),
        (x[:8], y[:8].clone().fill_(float("inf")), InvalidBatchError, "holds NaN or infinite values"),
    ):
        with pytest.raises(error, match=match):
            trainer.step(bad_x, bad_y)
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.guide.parameters()))
    loss, *_ = trainer.step(np.asarray(x[:8]), np.asarray(y[:8]))  # numpy is converted, as by fit
    assert math.isfinite(loss)
    # labels out of range: found on the device, nothing applied, the step named
    xc, yc = two_moons(64, seed=0)
    classifier = pyrobnn.BayesianModel(pyrobnn.MLP(2, 2, hidden=(8,)), pyrobnn.CategoricalLikelihood())
    trainer = SVITrainer(classifier, pyrobnn.MeanFieldNormal(classifier), lr=0.01)
    trainer.step(xc[:16], yc[:16])
    before = [p.detach().clone() for p in trainer.guide.parameters()]
    with pytest.raises(InvalidBatchError, match="step 1 .*labels outside"):
        trainer.step(xc[:16], yc[:16] + 3)
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.guide.parameters()))


def test_every_batch_of_a_dataloader_is_checked_not_only_the_first():
    from pyrobnn.infer import InvalidBatchError

    x, y = regression_data()
    x = x.clone()
    x[40, 0] = float("nan")  # in the third batch of 16
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    model = mlp_model()
    trainer = SVITrainer(model, pyrobnn.MeanFieldNormal(model), lr=0.01)
    with pytest.raises(InvalidBatchError, match="the batch of step 2 \\(epoch 0\\)") as info:
        trainer.fit(loader=loader, epochs=2, progress=False)
    assert info.value.step == 2
    assert all(int(trainer.optimizer.state[p]["step"]) == 2 for p in trainer.parameters())


def test_clip_grad_norm_bounds_the_update():
    """With plain SGD at lr 1, the update is the (clipped) gradient: its global norm is at most
    the bound (before this test the clip was handed the gradients instead of the parameters and
    clipped nothing)."""
    x, y = regression_data()
    model = mlp_model()
    guide = pyrobnn.MeanFieldNormal(model)
    trainer = SVITrainer(model, guide, optimizer=lambda params: torch.optim.SGD(params, lr=1.0), clip_grad_norm=1e-3)
    before = [p.detach().clone() for p in trainer.parameters()]
    trainer.step(x, y)
    change = torch.stack([(p.detach() - b).norm() for p, b in zip(trainer.parameters(), before)]).norm()
    assert 0 < change <= 1e-3 * (1 + 1e-5)


def test_a_batch_is_refused_for_the_cause_found_and_boolean_labels_are_refused():
    from pyrobnn.infer import InvalidBatchError

    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 3, hidden=(4,)), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
    trainer = pyrobnn.SVITrainer(model, pyrobnn.MeanFieldNormal(model))
    x, y = torch.randn(8, 2), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    trainer.step(x, y)
    with pytest.raises(ValueError, match="class labels must be an integer tensor, got dtype torch.bool"):
        trainer.step(x, y > 0)
    with pytest.raises(InvalidBatchError, match="is refused: y holds class labels outside \\[0, 3\\)"):
        trainer.step(x, y + 1)
    with pytest.raises(InvalidBatchError, match="is refused: x holds NaN or infinite values"):
        trainer.step(x.clone().fill_(float("nan")), y + 1)  # both are wrong: the first found is named
    regression = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=0.1))
    trainer = pyrobnn.SVITrainer(regression, pyrobnn.MeanFieldNormal(regression))
    trainer.step(x, torch.randn(8, 1))
    with pytest.raises(InvalidBatchError, match="is refused: y holds NaN or infinite values"):
        trainer.step(x, torch.full((8, 1), float("inf")))


def test_labels_out_of_range_under_pyros_own_svi_are_named():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 3, hidden=(4,)), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
    svi = pyro.infer.SVI(model, pyrobnn.MeanFieldNormal(model), pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    with pytest.raises(ValueError, match="class labels must lie in \\[0, 3\\) for a network with 3 outputs, got labels from -1 to 3"):
        svi.step(torch.randn(4, 2), torch.tensor([0, 3, -1, 1]))


def test_mean_field_scales_too_small_to_represent_are_refused_and_a_zero_posterior_scale_stays_finite():
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    for bad in (1e-45, 0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="init_scale must be a finite number >= 1.18e-38"):
            pyrobnn.MeanFieldNormal(model, init_scale=bad)
    guide = pyrobnn.MeanFieldNormal(model)
    with torch.no_grad():
        for rho in guide.rho.values():
            rho.fill_(-200.0)  # softplus(-200) is exactly 0 in float32
    x, y = torch.randn(16, 1), torch.randn(16, 1)
    history = pyrobnn.fit(model, guide, x, y, epochs=2, progress=False).history
    assert all(math.isfinite(v) for v in history.loss)


def test_batch_normalization_in_training_mode_takes_several_particles():
    """Vectorized particles through a network whose batch normalization updates running
    statistics: each weight draw normalizes by its own batch statistics, and the running
    statistics move by the draws' average (vmap cannot update one buffer from every draw)."""
    from pyrobnn.testing import build_case

    model, x, y, _, _ = build_case("batchnorm")
    norm = model.net.features[1]
    assert norm.training and norm.num_batches_tracked.item() == 0
    vi = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=2, num_particles=3, progress=False, seed=0)
    assert all(math.isfinite(v) for v in vi.history.loss)
    # two steps, and the one trace Pyro's ELBO makes on its first call to count the model's plates
    assert norm.num_batches_tracked.item() == 3 and not torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
    # one weight draw: its batch statistics update the running mean by the momentum rule
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(0.1), random=[net[0]])
    w = torch.randn(2, 3, 2)  # two draws of the linear layer's weight
    b = torch.zeros(2, 3)
    xb = torch.randn(16, 2)
    from pyrobnn.models.functional import call_with_weights

    call_with_weights(net, model.sites, {"0.weight": w, "0.bias": b}, xb)
    expected = 0.1 * torch.stack([(xb @ w[i].T).mean(0) for i in range(2)]).mean(0)
    assert torch.allclose(net[1].running_mean, expected, atol=1e-6)
