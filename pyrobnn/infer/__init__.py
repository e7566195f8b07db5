"""Inference: every way to a posterior over a BayesianModel.

Read from the bottom up; each layer imports only the layers below it:

1. the results (:mod:`.results`): the protocol every method returns, the posterior predictive,
   ArviZ conversion and convergence diagnostics, and draws of the latent sites;
2. the shared core (:mod:`.core`): the flat potential, the minibatch log joint and its loop,
   starting positions, integrators, the step-failure policy, checkpoints, curvature and processes;
3. the method families, none of which imports another: :mod:`.svi` (the ELBO, the training loop,
   IVON, a trained guide as a result), :mod:`.mcmc` (NUTS, MCLMC), :mod:`.sgmcmc` (SGLD, SGHMC,
   SMILE) and :mod:`.modes` (deep ensembles, Laplace, SWAG);
4. methods made of two families (:mod:`.ensemble_sampling`) and reading any saved result
   (:mod:`.loading`).
"""

from pyrobnn.infer.loading import load_posterior
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.svi import ELBOTerms, History, InvalidBatchError, KLAnnealing, NonFiniteLossError, SplitELBO, SVITrainer, fit, make_elbo
from pyrobnn.infer.svi.variational import VariationalPosterior

__all__ = [
    "SplitELBO", "ELBOTerms", "make_elbo", "fit", "SVITrainer", "History", "KLAnnealing", "NonFiniteLossError", "InvalidBatchError",
    "Posterior", "VariationalPosterior", "load_posterior",
]
