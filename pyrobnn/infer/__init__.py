"""Inference: the ELBO with its terms apart, and the SVI training loop."""

from pyrobnn.infer.elbo import ELBOTerms, SplitELBO, make_elbo
from pyrobnn.infer.fit import History, InvalidBatchError, KLAnnealing, NonFiniteLossError, SVITrainer, fit

__all__ = ["SplitELBO", "ELBOTerms", "make_elbo", "fit", "SVITrainer", "History", "KLAnnealing", "NonFiniteLossError", "InvalidBatchError"]
