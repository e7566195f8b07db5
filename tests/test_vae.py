"""The VAE's importance-sampled log-likelihood against quadrature; training and exact resume."""

import math

import pyro
import pytest
import torch

from pyrobnn.apps.vae import VAE, elbo_per_example, fit_vae, importance_log_likelihood


def exact_log_px(vae, x):
    """log p(x) = log int p(x|z) N(z; 0, 1) dz by the trapezoidal rule (1-D latent)."""
    z = torch.linspace(-12.0, 12.0, 40001, dtype=torch.float64).unsqueeze(-1)
    with torch.no_grad():
        logits = vae.decoder(z.float()).double()
    log_px_z = torch.distributions.Bernoulli(logits=logits.unsqueeze(1)).log_prob(x.double()).sum(-1)  # (Z, N)
    log_pz = torch.distributions.Normal(0.0, 1.0).log_prob(z)  # (Z, 1)
    integrand = torch.exp(log_px_z + log_pz)
    return torch.log(torch.trapezoid(integrand, z.squeeze(-1), dim=0))


def test_importance_sampled_log_likelihood_matches_quadrature():
    torch.manual_seed(0)
    vae = VAE(x_dim=6, z_dim=1, hidden=(16,))
    x = torch.bernoulli(torch.full((5, 6), 0.5))
    exact = exact_log_px(vae, x).float()
    pyro.set_rng_seed(1)
    # repeated estimates: their mean is within its standard error of the exact value (the
    # bias of the log of an average is O(1/K), negligible at K = 5000 for these weights)
    runs = torch.stack([importance_log_likelihood(vae, x, num_samples=5000, batch_size=2, sample_batch=700) for _ in range(8)])
    se = runs.std(0) / math.sqrt(runs.shape[0])
    assert torch.all((runs.mean(0) - exact).abs() < 4 * se + 1e-4), (runs.mean(0), exact, se)
    # the ELBO is below log p(x) by KL(q || p(z|x)) >= 0
    elbo = elbo_per_example(vae, x, num_samples=2000)
    assert torch.all(elbo < exact + 0.01)


def test_vae_learns_and_resumes_exactly(tmp_path):
    torch.manual_seed(0)
    # two prototypes with pixel noise: a latent code helps a lot
    protos = torch.bernoulli(torch.full((2, 20), 0.5))
    x = protos[torch.randint(0, 2, (200,))] * 0.9 + 0.05

    def run(epochs, checkpoint=None, resume=False):
        torch.manual_seed(123)
        vae = VAE(x_dim=20, z_dim=2, hidden=(32,))
        history = fit_vae(vae, x, epochs=epochs, batch_size=50, lr=1e-2, seed=0, checkpoint=checkpoint, resume=resume, progress=False)
        return vae, history

    full, history = run(6)
    assert history.loss[-1] < history.loss[0] - 2.0
    path = str(tmp_path / "vae.pt")
    run(3, checkpoint=path)
    resumed, resumed_history = run(6, checkpoint=path, resume=True)
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert resumed_history.loss == history.loss


def test_vae_rejects_bad_images():
    vae = VAE(x_dim=4, z_dim=1, hidden=(3,))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_vae(vae, torch.full((3, 4), 2.0), epochs=1, progress=False)
    with pytest.raises(ValueError, match="4 pixels"):
        importance_log_likelihood(vae, torch.rand(3, 5), num_samples=2)
    with pytest.raises(ValueError, match="num_samples"):
        importance_log_likelihood(vae, torch.rand(3, 4), num_samples=0)
    with pytest.raises(ValueError, match="floating-point"):
        importance_log_likelihood(vae, torch.ones(3, 4, dtype=torch.long), num_samples=2)
