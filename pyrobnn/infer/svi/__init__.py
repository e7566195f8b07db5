"""Stochastic variational inference: the ELBO with its terms apart (:mod:`.elbo`), its trace-free
form for our guides (:mod:`.trace_free`), the objective that picks between them
(:mod:`.objective`), the training loop (:mod:`.trainer`) with its schedules (:mod:`.schedules`)
and its handling of failed steps (:mod:`.failures`); and IVON's natural-gradient variational
learning on the flat weight vector (:mod:`.ivon`)."""

from pyrobnn.infer.core.failures import InvalidBatchError, NonFiniteLossError
from pyrobnn.infer.svi.elbo import ELBOTerms, SplitELBO, make_elbo
from pyrobnn.infer.svi.history import History
from pyrobnn.infer.svi.ivon import ivon
from pyrobnn.infer.svi.schedules import KLAnnealing
from pyrobnn.infer.svi.trace_free import TraceFreeELBO
from pyrobnn.infer.svi.trainer import SVITrainer, fit

__all__ = [
    "fit", "ivon", "SVITrainer", "History", "KLAnnealing", "SplitELBO", "ELBOTerms", "make_elbo", "TraceFreeELBO",
    "NonFiniteLossError", "InvalidBatchError",
]
