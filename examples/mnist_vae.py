"""A variational autoencoder on MNIST in Pyro (Kingma & Welling 2014): encoder and decoder
2 x 500, 20 latent dimensions, Bernoulli likelihood, dynamically binarized training images.

    python examples/mnist_vae.py --checkpoint runs/vae.pt --out runs/vae     # 300 epochs
    python examples/mnist_vae.py --quick --out vae                           # CI, under a minute

Reports the test ELBO and the importance-sampled test log-likelihood with 5000 samples per
image (Burda et al. 2016), on the test set binarized once with a fixed seed, and writes
``reconstructions.png`` (test digits above their reconstructions) and ``latent_2d.png`` (the
posterior means of the test images projected on their first two principal components,
coloured by digit). Training checkpoints every epoch and resumes from ``--checkpoint``.
"""

import argparse
import json
import math
import os

import matplotlib.pyplot as plt
import torch

from pyrobnn.data import mnist
from pyrobnn.utils.io import record_results
from pyrobnn.evaluation.plotting import save_figure
from pyrobnn.apps.vae import VAE, elbo_per_example, fit_vae, importance_log_likelihood

PUBLISHED_LL = -86.76  # Burda et al. 2016, VAE with one stochastic layer, k = 5000

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", default=None, help="folder holding MNIST/raw (default $PYROBNN_DATA)")
parser.add_argument("--epochs", type=int, default=300)
parser.add_argument("--samples", type=int, default=5000, help="importance samples per test image")
parser.add_argument("--test-images", type=int, default=None, help="evaluate on this many test images (default all)")
parser.add_argument("--quick", action="store_true", help="10,000 images, 3 epochs, 500 test images, 200 samples (CI)")
parser.add_argument("--checkpoint", default=None)
parser.add_argument("--out", default="vae")
parser.add_argument("--results", default=None, help="merge the figures into this JSON list")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

epochs = 3 if args.quick else args.epochs
samples = 200 if args.quick else args.samples
test_images = 500 if args.quick else args.test_images
x, y = mnist(args.data, train=True, subset=10000 if args.quick else None)
x_test, y_test = mnist(args.data, train=False, subset=test_images)
x, x_test = x.reshape(-1, 784), x_test.reshape(-1, 784)
x_test_binary = torch.bernoulli(x_test, generator=torch.Generator().manual_seed(1234))

torch.manual_seed(args.seed)
vae = VAE(784, 20, hidden=(500, 500))
history = fit_vae(vae, x, epochs=epochs, batch_size=100, lr=1e-3, seed=args.seed, checkpoint=args.checkpoint, resume=args.checkpoint is not None)
torch.manual_seed(args.seed)
elbo = elbo_per_example(vae, x_test_binary, num_samples=100).mean().item()
log_liks = importance_log_likelihood(vae, x_test_binary, num_samples=samples, progress=True)
log_lik = log_liks.mean().item()
log_lik_se = (log_liks.std() / len(log_liks) ** 0.5).item()  # over test images, for reading against the target
# a baseline with independent pixels at the training frequencies: what "better than chance" means here
p = x.mean(0).clamp(1e-3, 1 - 1e-3)
independent = torch.distributions.Bernoulli(probs=p).log_prob(x_test_binary).sum(-1).mean().item()

os.makedirs(args.out, exist_ok=True)
fig, axes = plt.subplots(2, 10, figsize=(10, 2.2))
recon = vae.reconstruct(x_test_binary[:10])
for i in range(10):
    axes[0, i].imshow(x_test_binary[i].reshape(28, 28), cmap="gray")
    axes[1, i].imshow(recon[i].reshape(28, 28), cmap="gray")
    axes[0, i].axis("off")
    axes[1, i].axis("off")
fig.suptitle("test digits (top) and reconstructions from the posterior mean (bottom)")
save_figure(fig, os.path.join(args.out, "reconstructions.png"))
with torch.no_grad():
    means = vae.posterior(x_test_binary).loc
centred = means - means.mean(0)
_, _, v = torch.linalg.svd(centred, full_matrices=False)
embedding = centred @ v[:2].T
fig, ax = plt.subplots(figsize=(6, 5))
points = ax.scatter(embedding[:, 0], embedding[:, 1], c=y_test, cmap="tab10", s=3)
fig.colorbar(points, ax=ax, label="digit")
ax.set(title="posterior means of test images, first two principal components", xlabel="PC 1", ylabel="PC 2")
save_figure(fig, os.path.join(args.out, "latent_2d.png"))

print(f"VAE 2 x 500, 20 latents: test ELBO {elbo:.2f} nats, IS log-likelihood (k = {samples}) {log_lik:.2f} ± {log_lik_se:.2f} nats "
      f"(published {PUBLISHED_LL}), independent-pixel baseline {independent:.2f}, {len(history.epoch)} epochs, "
      f"{history.seconds[-1]:.0f} s of training")
if args.results:
    command = f"python examples/mnist_vae.py --epochs {epochs} --samples {samples} --seed {args.seed}" + (" --quick" if args.quick else "")
    name = "VAE 2 x 500, 20 latents" + (" (quick)" if args.quick else "")
    record_results(args.results, [
        {"name": name, "metric": f"test log-likelihood (IS, k = {samples}), nats", "value": log_lik, "standard_error": log_lik_se, "published": PUBLISHED_LL, "command": command, "epochs": len(history.epoch), "seed": args.seed, "train_seconds": history.seconds[-1]},
        {"name": name, "metric": "test ELBO, nats", "value": elbo, "published": None, "command": command, "epochs": len(history.epoch), "seed": args.seed},
    ])
print(json.dumps({"epochs": len(history.epoch), "elbo": elbo, "log_likelihood": log_lik, "log_likelihood_se": log_lik_se, "independent_pixels": independent, "samples": samples,
                  "train_seconds": history.seconds[-1], "nonfinite": not math.isfinite(log_lik)}))
