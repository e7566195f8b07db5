"""Networks as Pyro models: which parameters are random, and ready architectures."""

from pyrobnn.models.architectures import MLP, LeNet5, LeNet300100
from pyrobnn.models.bayesian_model import BayesianModel
from pyrobnn.models.sites import DEFAULT_EXCLUDE, WeightSite, select_sites

__all__ = ["BayesianModel", "WeightSite", "select_sites", "DEFAULT_EXCLUDE", "MLP", "LeNet300100", "LeNet5"]
