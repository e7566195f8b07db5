r"""Variational autoencoder (Kingma & Welling 2014) as a Pyro model and guide.

.. math::

    p(z) = N(0, I), \quad p_\theta(x \mid z) = \mathrm{Bernoulli}(\sigma(f_\theta(z))), \quad
    q_\phi(z \mid x) = N(\mu_\phi(x), \mathrm{diag}\,\sigma_\phi(x)^2)

with MLP encoder and decoder. :meth:`VAE.model` and :meth:`VAE.guide` are ordinary Pyro
callables (``pyro.infer.SVI(vae.model, vae.guide, ...)`` works); :func:`fit_vae` trains them
with ``Trace_ELBO`` on dynamically binarized data, with a progress bar and exact-resume
checkpoints like :class:`~pyrobnn.infer.SVITrainer`; :func:`importance_log_likelihood` gives
the importance-sampled estimate of :math:`\log p(x)` used by Burda et al. 2016:

.. math:: \log p(x) \approx \log \frac1K \sum_{k=1}^K
          \frac{p(x \mid z_k)\, p(z)}{q(z_k \mid x)}, \quad z_k \sim q(z \mid x),

a lower bound in expectation that tightens to :math:`\log p(x)` as :math:`K \to \infty`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Trace_ELBO
from torch import nn

from pyrobnn.infer.svi.history import History
from pyrobnn.utils.io import atomic_save, safe_load
from pyrobnn.utils.progress import tqdm

__all__ = ["VAE", "fit_vae", "importance_log_likelihood", "elbo_per_example"]


def _mlp(sizes, activation=nn.Softplus):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class VAE(nn.Module):
    """Encoder and decoder MLPs (``hidden`` units each, softplus), a Normal posterior with a
    diagonal covariance and a Bernoulli likelihood on flattened binary images.

    :param x_dim: pixels per image (784 for MNIST).
    :param z_dim: latent dimensions (20 by default).
    :param hidden: hidden layer sizes of the encoder; the decoder mirrors them.
    """

    def __init__(self, x_dim: int = 784, z_dim: int = 20, hidden=(500, 500)):
        super().__init__()
        self.x_dim, self.z_dim = int(x_dim), int(z_dim)
        self.encoder = _mlp([self.x_dim, *hidden, 2 * self.z_dim])
        self.decoder = _mlp([self.z_dim, *reversed(hidden), self.x_dim])

    def _flat(self, x):
        x = x.reshape(x.shape[0], -1)
        if x.shape[-1] != self.x_dim:
            raise ValueError(f"the VAE takes {self.x_dim} pixels per image, got {x.shape[-1]}")
        return x

    def posterior(self, x) -> dist.Normal:
        """:math:`q(z \\mid x)`, batch shape ``(N, z_dim)``."""
        out = self.encoder(self._flat(x))
        loc, raw = out[..., : self.z_dim], out[..., self.z_dim :]
        return dist.Normal(loc, nn.functional.softplus(raw) + 1e-6)

    def likelihood(self, z) -> dist.Bernoulli:
        """:math:`p(x \\mid z)` with batch shape ``(*z.shape[:-1], x_dim)``."""
        return dist.Bernoulli(logits=self.decoder(z), validate_args=False)

    def model(self, x):
        x = self._flat(x)
        with pyro.plate("data", x.shape[0]):
            prior = dist.Normal(x.new_zeros(self.z_dim), x.new_ones(self.z_dim)).to_event(1)
            z = pyro.sample("z", prior)
            pyro.sample("x", self.likelihood(z).to_event(1), obs=x)

    def guide(self, x):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", self.posterior(x).to_event(1))

    @torch.no_grad()
    def reconstruct(self, x) -> torch.Tensor:
        """Pixel probabilities decoded from the posterior mean."""
        return torch.sigmoid(self.decoder(self.posterior(x).loc)).reshape(x.shape)


def _check_images(x):
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError(f"images must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if x.shape[0] == 0:
        raise ValueError("no images")
    if not torch.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise ValueError("pixel values must be finite and in [0, 1]")


def _check_samples(num_samples):
    if int(num_samples) < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")


def _log_weights(vae, x, k):
    """``(k, N)`` log importance weights log p(x|z) + log p(z) - log q(z|x), z ~ q(z|x)."""
    q = vae.posterior(x)
    z = q.sample((k,))
    log_px = vae.likelihood(z).log_prob(x.reshape(1, x.shape[0], -1)).sum(-1)
    log_pz = dist.Normal(0.0, 1.0).log_prob(z).sum(-1)
    return log_px + log_pz - q.log_prob(z).sum(-1)


@torch.no_grad()
def importance_log_likelihood(
    vae: VAE, x, num_samples: int = 5000, batch_size: int = 100, sample_batch: int = 500, progress: bool = False
) -> torch.Tensor:
    """Per-image importance-sampled estimate of :math:`\\log p(x)` with ``num_samples``
    samples of :math:`q(z\\mid x)` (images in chunks of ``batch_size``, samples in chunks of
    ``sample_batch``, combined exactly with ``logsumexp``); ``progress`` shows a bar over the
    image chunks (10,000 images at 5000 samples are minutes of work)."""
    _check_images(x)
    _check_samples(num_samples)
    out = []
    starts = range(0, x.shape[0], batch_size)
    for i in tqdm(starts, desc=f"log p(x), {num_samples} samples", unit="batch", disable=not progress, dynamic_ncols=True):
        xb = vae._flat(x[i : i + batch_size])
        parts, done = [], 0
        while done < num_samples:
            k = min(sample_batch, num_samples - done)
            parts.append(torch.logsumexp(_log_weights(vae, xb, k), 0))
            done += k
        out.append(torch.logsumexp(torch.stack(parts), 0) - math.log(num_samples))
    return torch.cat(out)


@torch.no_grad()
def elbo_per_example(vae: VAE, x, num_samples: int = 10, batch_size: int = 500) -> torch.Tensor:
    """Per-image ELBO, averaged over ``num_samples`` samples of :math:`q(z\\mid x)`."""
    _check_images(x)
    _check_samples(num_samples)
    return torch.cat([_log_weights(vae, vae._flat(x[i : i + batch_size]), num_samples).mean(0) for i in range(0, x.shape[0], batch_size)])


def fit_vae(
    vae: VAE,
    x,
    *,
    epochs: int = 100,
    batch_size: int = 100,
    lr: float = 1e-3,
    binarize: bool = True,
    checkpoint=None,
    resume: bool = False,
    seed: Optional[int] = None,
    progress: bool = True,
    callback=None,
) -> History:
    """Train by SVI (``Trace_ELBO``, Adam) on images with pixels in [0, 1].

    :param binarize: draw a fresh binarization :math:`x_b \\sim \\mathrm{Bernoulli}(x)` of
        every minibatch (dynamic binarization, as in Burda et al.'s protocol).
    :param checkpoint: file written atomically after every epoch; with ``resume`` the run
        continues from it and gives the same result as an uninterrupted run.
    :returns: the :class:`~pyrobnn.infer.svi.trainer.History`; ``history.loss`` is the negative
        ELBO per image.
    """
    _check_images(x)
    n = x.shape[0]
    optimizer = torch.optim.Adam(vae.parameters(), lr=lr)
    loss_fn = Trace_ELBO()
    generator = torch.Generator(device="cpu")  # the data order, drawn on the host
    history, epoch = History(), 0
    if resume and checkpoint is not None and os.path.exists(checkpoint):
        state = safe_load(checkpoint)
        if not isinstance(state, dict) or state.get("format") != "pyrobnn-vae-checkpoint":
            raise ValueError(f"{checkpoint} is not a pyrobnn VAE checkpoint")
        vae.load_state_dict(state["vae"])
        optimizer.load_state_dict(state["optimizer"])
        history = History.from_dict(state["history"])
        epoch = int(state["epoch"])
        torch.set_rng_state(state["torch_rng"])
        generator.set_state(state["data_rng"])
    else:
        if seed is not None:
            pyro.set_rng_seed(seed)
        generator.manual_seed(int(torch.randint(0, 2**62, (), device="cpu").item()) if seed is None else seed)
    bar = tqdm(total=epochs, initial=epoch, disable=not progress, desc="VAE", unit="epoch", dynamic_ncols=True)
    start = time.perf_counter() - (history.seconds[-1] if history.seconds else 0.0)
    try:
        while epoch < epochs:
            total, count = 0.0, 0
            perm = torch.randperm(n, generator=generator, device="cpu")
            for i in range(0, n, batch_size):
                xb = x[perm[i : i + batch_size]]
                if binarize:
                    xb = torch.bernoulli(xb, generator=generator)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn.differentiable_loss(vae.model, vae.guide, xb) / xb.shape[0]
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"the VAE loss is {loss.item()} in epoch {epoch}")
                loss.backward()
                optimizer.step()
                total += loss.item() * xb.shape[0]
                count += xb.shape[0]
            epoch += 1
            history.epoch.append(epoch)
            history.loss.append(total / count)
            history.seconds.append(time.perf_counter() - start)
            shown = {"-elbo": f"{history.loss[-1]:.2f}"}
            if callback is not None:
                for k, v in (callback(vae, epoch) or {}).items():
                    history.extra.setdefault(k, []).append(v)
                    shown[k] = f"{v:.4g}" if isinstance(v, float) else v
            bar.set_postfix(shown, refresh=False)
            bar.update(1)
            if checkpoint is not None:
                atomic_save(
                    {"format": "pyrobnn-vae-checkpoint", "vae": vae.state_dict(), "optimizer": optimizer.state_dict(),
                     "history": history.as_dict(), "epoch": epoch, "torch_rng": torch.get_rng_state(), "data_rng": generator.get_state()},
                    checkpoint,
                )
    finally:
        bar.close()
    return history
