"""Variational families placed at the weight sites of a :class:`~pyrobnn.models.BayesianModel`."""

from pyrobnn.guides.base import WeightGuide
from pyrobnn.guides.dropout import ConcreteDropout, MCDropout
from pyrobnn.guides.mean_field import MeanFieldNormal
from pyrobnn.guides.variational_dropout import GaussianDropout, SparseVariationalDropout, VariationalDropout

__all__ = [
    "WeightGuide",
    "MeanFieldNormal",
    "VariationalDropout",
    "SparseVariationalDropout",
    "GaussianDropout",
    "MCDropout",
    "ConcreteDropout",
]
