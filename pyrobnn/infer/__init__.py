"""Inference: every way to a posterior over a BayesianModel, one family per subpackage.

- :mod:`pyrobnn.infer.svi`: stochastic variational inference (the ELBO, the training loop);
- :mod:`pyrobnn.infer.mcmc`: full-batch MCMC (NUTS, MCLMC, ensemble-initialized sampling);
- :mod:`pyrobnn.infer.sgmcmc`: stochastic-gradient MCMC (SGLD, SGHMC);
- :mod:`pyrobnn.infer.modes`: posteriors from optimized modes (deep ensembles, Laplace, SWAG);
- :mod:`pyrobnn.infer.lightning`: the training objectives as Lightning modules.

Shared by them: the result protocol (:mod:`.result`), its draws (:mod:`.posterior`) and a
trained guide (:mod:`.variational`), the flat potential (:mod:`.potential`), the curvature estimate (:mod:`.curvature`) and
process spreading (:mod:`.processes`). The import paths of pyrobnn 0.1 (``pyrobnn.infer.fit``,
``pyrobnn.infer.hmc``, ...) still work for one release, with a ``DeprecationWarning``
(:mod:`.moved`).
"""

from pyrobnn.infer import moved
from pyrobnn.infer.posterior import Posterior, load_posterior
from pyrobnn.infer.svi import ELBOTerms, History, InvalidBatchError, KLAnnealing, NonFiniteLossError, SplitELBO, SVITrainer, fit, make_elbo
from pyrobnn.infer.variational import VariationalPosterior

moved.install()

__all__ = [
    "SplitELBO", "ELBOTerms", "make_elbo", "fit", "SVITrainer", "History", "KLAnnealing", "NonFiniteLossError", "InvalidBatchError",
    "Posterior", "VariationalPosterior", "load_posterior",
]
