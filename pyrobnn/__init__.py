"""pyrobnn: Bayesian neural networks as Pyro models.

A BNN is two Pyro callables: a :class:`BayesianModel` (an ordinary ``nn.Module`` whose chosen
parameters have priors, plus a likelihood) and a guide from :mod:`pyrobnn.guides`. Train them
with :func:`fit` or ``pyro.infer.SVI``; predict with :func:`predict` or
``pyro.infer.Predictive``. Every other method (:mod:`pyrobnn.methods` lists them) takes the same
model and returns a :class:`Result` with the same verbs; :mod:`pyrobnn.testing` holds every one of
them to that contract. The package is cut in layers (the model, guides, results, the shared
core, the method families, integrations, applications) that import only downward; the layout
page of the documentation draws them.
"""

from pyrobnn.utils import progress  # noqa: F401 (first: Pyro imports tqdm.auto too; pyrobnn.utils.progress says why)
from pyrobnn.models import kl  # noqa: F401 (registers the KL divergences with torch)
from pyrobnn.utils import memory, runtime  # noqa: F401 (pyrobnn.memory, pyrobnn.runtime)
from pyrobnn.models.estimators import flipout, local_reparameterization, per_example_weights
from pyrobnn.guides import (
    ConcreteDropout,
    GaussianDropout,
    MCDropout,
    MeanFieldNormal,
    SparseVariationalDropout,
    VariationalDropout,
)
from pyrobnn.infer import KLAnnealing, SplitELBO, SVITrainer, fit
from pyrobnn.infer.core.checkpoints import Checkpointing
from pyrobnn.infer.svi import ivon
from pyrobnn.infer.ensemble_sampling import ensemble_sampling
from pyrobnn.infer.mcmc import mclmc, nuts, pyro_nuts
from pyrobnn.infer.modes import deep_ensemble, laplace, swag
from pyrobnn.infer.loading import load_posterior
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.results.protocol import Result
from pyrobnn.infer.sgmcmc import sghmc, sgld, smile
from pyrobnn.infer.svi.variational import VariationalPosterior
from pyrobnn.evaluation.calibration import TemperatureScaling
from pyrobnn.utils.io import load, save
from pyrobnn import methods  # after the method families: their modules register them
from pyrobnn.methods import UnsupportedModelError
from pyrobnn.models.likelihoods import (
    BernoulliLikelihood,
    CategoricalLikelihood,
    GaussianLikelihood,
    HeteroscedasticGaussianLikelihood,
)
from pyrobnn.models import MLP, BayesianModel, LeNet5, LeNet300100
from pyrobnn.infer.results.predictive import predict
from pyrobnn.models.priors import ARDPrior, LogUniformPrior, NormalPrior, ScaleMixturePrior

__version__ = "0.1.0"

__all__ = [
    "BayesianModel",
    "MLP",
    "LeNet300100",
    "LeNet5",
    "NormalPrior",
    "ScaleMixturePrior",
    "LogUniformPrior",
    "ARDPrior",
    "GaussianLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "CategoricalLikelihood",
    "BernoulliLikelihood",
    "MeanFieldNormal",
    "VariationalDropout",
    "SparseVariationalDropout",
    "GaussianDropout",
    "MCDropout",
    "ConcreteDropout",
    "fit",
    "SVITrainer",
    "SplitELBO",
    "KLAnnealing",
    "predict",
    "nuts",
    "mclmc",
    "pyro_nuts",
    "deep_ensemble",
    "ensemble_sampling",
    "laplace",
    "swag",
    "sgld",
    "sghmc",
    "smile",
    "ivon",
    "TemperatureScaling",
    "local_reparameterization",
    "flipout",
    "per_example_weights",
    "save",
    "load",
    "Result",
    "Posterior",
    "VariationalPosterior",
    "UnsupportedModelError",
    "methods",
    "memory",
    "load_posterior",
    "Checkpointing",
    "SVIModule",
    "EnsembleModule",
    "EndProcessGroup",
]

# Lightning takes seconds to import: its classes load on first use
_LAZY = {name: "pyrobnn.integrations.lightning" for name in ("SVIModule", "EnsembleModule", "EndProcessGroup")}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pyrobnn' has no attribute {name!r}")
