"""Posteriors built from optimized modes of the log joint: deep ensembles (the modes
themselves, :mod:`.ensemble`), the Laplace approximation (a Gaussian at one mode from its
curvature, :mod:`.laplace`; its function-space predictive for a perceptron from the tangent
kernel in closed form, :mod:`.tangent_kernel`) and SWAG (a Gaussian from SGD's iterates around
one, :mod:`.swag`)."""

from pyrobnn.infer.modes.ensemble import EnsemblePosterior, deep_ensemble, train_members
from pyrobnn.infer.modes.laplace import LaplacePosterior, laplace
from pyrobnn.infer.modes.swag import SWAGMoments, SWAGPosterior, swag, swag_moments

__all__ = [
    "deep_ensemble", "EnsemblePosterior", "train_members",
    "laplace", "LaplacePosterior", "swag", "SWAGPosterior", "SWAGMoments", "swag_moments",
]
