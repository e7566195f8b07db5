"""Plots of predictive distributions (matplotlib). The backend is the user's: inline in Jupyter,
a window on a desktop, and matplotlib's own fallback (Agg) on a machine without a display."""

from __future__ import annotations

import io
import os

import matplotlib.pyplot as plt
import torch

from pyrobnn.utils.io import atomic_write_bytes

__all__ = ["plot_regression_1d", "plot_reliability_diagram", "save_figure"]


def plot_regression_1d(ax, x_grid, prediction, x_train=None, y_train=None, x_test=None, y_test=None, title=None, level=0.9):
    """Predictive mean, the central ``level`` interval of the predictive (shaded) and its
    epistemic part (mean +/- 1.645 epistemic std, hatched) over a 1-D grid, with the data."""
    xg = x_grid.reshape(-1).cpu().numpy()
    mean = prediction.mean.reshape(-1).cpu().numpy()
    lower, upper = prediction.interval(level)
    ax.fill_between(xg, lower.reshape(-1).cpu().numpy(), upper.reshape(-1).cpu().numpy(), color="C0", alpha=0.25, label=f"{round(level * 100)}% predictive interval")
    epi = prediction.epistemic_std.reshape(-1).cpu().numpy()
    z = 1.6448536269514722
    ax.fill_between(xg, mean - z * epi, mean + z * epi, color="C0", alpha=0.35, label="epistemic part")
    ax.plot(xg, mean, color="C0", lw=1.5, label="predictive mean")
    if x_test is not None:
        ax.scatter(x_test.reshape(-1).cpu(), y_test.reshape(-1).cpu(), s=4, color="0.6", label="test data")
    if x_train is not None:
        ax.scatter(x_train.reshape(-1).cpu(), y_train.reshape(-1).cpu(), s=6, color="k", label="training data")
    if title:
        ax.set_title(title)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    return ax


def save_figure(fig, path) -> None:
    """Save a figure atomically (:func:`pyrobnn.utils.io.atomic_write_bytes`) and close it."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=120, bbox_inches="tight", format=os.path.splitext(os.fspath(path))[1][1:] or "png")
    finally:
        plt.close(fig)
    atomic_write_bytes(buffer.getvalue(), path)


def plot_reliability_diagram(ax, probs, y, num_bins: int = 15, label=None):
    """Accuracy against confidence per equal-width bin (Guo et al. 2017, fig. 1): bars at the
    bins' accuracy, the diagonal of perfect calibration, and the ECE in the legend."""
    from pyrobnn.evaluation.metrics import calibration_bins, expected_calibration_error

    count, conf, acc = calibration_bins(probs.detach().cpu(), y.detach().cpu(), num_bins)
    edges = torch.linspace(0, 1, num_bins + 1, device="cpu")  # for matplotlib, as the bins
    filled = count > 0
    ece = expected_calibration_error(probs.detach().cpu(), y.detach().cpu(), num_bins)
    name = f"{label}: " if label else ""
    ax.bar(edges[:-1][filled].numpy(), acc[filled].numpy(), width=1 / num_bins, align="edge", alpha=0.6, edgecolor="k",
           label=f"{name}ECE {100 * ece:.2f}%")
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left")
