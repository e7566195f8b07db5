"""What ``pyrobnn compare`` writes: the tables (Markdown, CSV, JSON) beside the published
figures, and the calibration and predictive-band plots."""

from __future__ import annotations

import csv
import io
import json
import math
import os

import torch

from pyrobnn.utils.io import atomic_write_text

__all__ = ["PUBLISHED", "METRICS", "RHAT_CONVERGED", "CALIBRATION_LEVELS", "format_markdown", "degenerate_warning", "diagnostics_threshold", "write_outputs", "plot_calibration", "plot_toy"]

#: Gal & Ghahramani 2016, Table 1 (VI, PBP and MC dropout columns) and the corrected grid-search
#: results of yaringal/DropoutUncertaintyExps: mean and standard error over the 20 splits
PUBLISHED = {
    "bostonHousing": {"rmse": {"VI": (4.32, 0.29), "PBP": (3.01, 0.18), "MC dropout": (2.97, 0.19), "MC dropout (grid)": (2.90, 0.18)},
                      "log_likelihood": {"VI": (-2.90, 0.07), "PBP": (-2.57, 0.09), "MC dropout": (-2.46, 0.06), "MC dropout (grid)": (-2.40, 0.04)}},
    "concrete": {"rmse": {"VI": (7.19, 0.12), "PBP": (5.67, 0.09), "MC dropout": (5.23, 0.12), "MC dropout (grid)": (4.82, 0.16)},
                 "log_likelihood": {"VI": (-3.39, 0.02), "PBP": (-3.16, 0.02), "MC dropout": (-3.04, 0.02), "MC dropout (grid)": (-2.93, 0.02)}},
    "energy": {"rmse": {"VI": (2.65, 0.08), "PBP": (1.80, 0.05), "MC dropout": (1.66, 0.04), "MC dropout (grid)": (0.54, 0.06)},
               "log_likelihood": {"VI": (-2.39, 0.03), "PBP": (-2.04, 0.02), "MC dropout": (-1.99, 0.02), "MC dropout (grid)": (-1.21, 0.01)}},
    "naval-propulsion-plant": {"rmse": {"VI": (0.01, 0.00), "PBP": (0.01, 0.00), "MC dropout": (0.01, 0.00), "MC dropout (grid)": (0.00, 0.00)},
                               "log_likelihood": {"VI": (3.73, 0.12), "PBP": (3.73, 0.01), "MC dropout": (3.80, 0.01), "MC dropout (grid)": (4.45, 0.00)}},
    "protein-tertiary-structure": {"rmse": {"VI": (4.84, 0.03), "PBP": (4.73, 0.01), "MC dropout": (4.36, 0.01), "MC dropout (grid)": (4.27, 0.02)},
                                   "log_likelihood": {"VI": (-2.99, 0.01), "PBP": (-2.97, 0.00), "MC dropout": (-2.89, 0.00), "MC dropout (grid)": (-2.87, 0.00)}},
    "yacht": {"rmse": {"VI": (6.89, 0.67), "PBP": (1.02, 0.05), "MC dropout": (1.11, 0.09), "MC dropout (grid)": (0.67, 0.05)},
              "log_likelihood": {"VI": (-3.43, 0.16), "PBP": (-1.63, 0.02), "MC dropout": (-1.55, 0.03), "MC dropout (grid)": (-1.25, 0.01)}},
}


METRICS = ("rmse", "log_likelihood", "coverage_90", "crps", "w2_to_reference", "seconds")

#: R-hat on the predictions below which random-start NUTS chains count as agreeing (Vehtari et al. 2021)
RHAT_CONVERGED = 1.01

CALIBRATION_LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]


def format_markdown(dataset, rows, quick=False) -> str:
    def pm(r, k, digits=3):
        if math.isnan(r[k]):
            return "n/a"
        return f"{r[k]:.{digits}f} ± {r[k + '_se']:.{digits}f}" if r["splits"] > 1 else f"{r[k]:.{digits}f}"

    lines = [f"# pyrobnn compare: {dataset}" + (" (quick)" if quick else ""), ""]
    ref = next((r for r in rows if r.get("key") == "reference"), None)
    if ref is not None and ref.get("degenerate_splits"):
        lines += [degenerate_warning(ref), ""]
    lines += [
        "| method | splits | test RMSE | test log-lik | 90% coverage | CRPS | W2 to reference | fit time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['splits']} | {pm(r, 'rmse')} | {pm(r, 'log_likelihood')} | {pm(r, 'coverage_90')} | "
            f"{pm(r, 'crps')} | {pm(r, 'w2_to_reference')} | {pm(r, 'seconds', 1)} |"
        )
    if ref is not None and "max_rhat_predictions" in ref:
        converged = ref["max_rhat_predictions"] <= RHAT_CONVERGED
        lines += ["", (
            f"Random-start NUTS on the test predictions: max R-hat {ref['max_rhat_predictions']:.3f} (median over splits "
            f"{ref['median_max_rhat_predictions']:.3f}), min bulk ESS {ref['min_ess_predictions']:.0f}, "
            f"{ref['divergences']} divergent transitions. "
        ) + (
            "The chains agree: NUTS is a converged reference."
            if converged else
            f"R-hat above {RHAT_CONVERGED} means the chains disagree, so NUTS is not a converged reference here "
            "(whether they sit in different modes or are still climbing, this table does not tell: see the "
            "log-density traces), and 'W2 to reference' is a distance to the mixture of its chains."
        )]
    elif ref is not None and "worst_within_chain_rhat" in ref:
        lines += ["", (
            f"{ref['method'].replace(' (reference)', '')}: each chain judged on its own, within-chain R-hat on the test "
            f"predictions and log density worst {ref['worst_within_chain_rhat']:.3f}, median {ref['median_within_chain_rhat']:.3f} "
            f"over splits; {ref['drifting_chains']} of {ref['chains_total']} chains above {diagnostics_threshold()}. "
            f"Worst split: {ref['verdict_worst_split']}"
        )]
    if dataset in PUBLISHED:
        lines += ["", "Published (Gal & Ghahramani 2016, Table 1; grid: DropoutUncertaintyExps README), mean ± SE over 20 splits:", ""]
        lines += ["| method | test RMSE | test log-lik |", "|---|---|---|"]
        pub = PUBLISHED[dataset]
        for name in pub["rmse"]:
            lines.append(f"| {name} | {pub['rmse'][name][0]:.2f} ± {pub['rmse'][name][1]:.2f} | {pub['log_likelihood'][name][0]:.2f} ± {pub['log_likelihood'][name][1]:.2f} |")
    return "\n".join(lines) + "\n"


def degenerate_warning(reference_row) -> str:
    """The line that opens the tables when the reference was judged degenerate."""
    return (
        f"**WARNING: the reference is degenerate on split(s) {reference_row['degenerate_splits']}; no method is ranked "
        "against it there ('W2 to reference' is n/a).** " + reference_row["degenerate_verdict"]
    )


def diagnostics_threshold() -> float:
    from pyrobnn.infer.results.diagnostics import WITHIN_CHAIN_RHAT_OK

    return WITHIN_CHAIN_RHAT_OK


def write_outputs(out_dir, dataset, rows, per_split, calibration, diagnostics_rows, s, quick):
    markdown = format_markdown(dataset, rows, quick)
    if diagnostics_rows:
        markdown += "\nReference diagnostics (per split): " + json.dumps(diagnostics_rows) + "\n"
    atomic_write_text(markdown + f"\nSettings: {s}\n", os.path.join(out_dir, "results.md"))
    fields = ["method", "key", "splits"] + [f"{m}{suf}" for m in METRICS for suf in ("", "_se")]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r[k] for k in fields})
    atomic_write_text(table.getvalue(), os.path.join(out_dir, "results.csv"))
    results = {"dataset": dataset, "summary": rows, "per_split": per_split, "reference_diagnostics": diagnostics_rows, "settings": s.__dict__}
    atomic_write_text(json.dumps(results, indent=2), os.path.join(out_dir, "results.json"))


def plot_calibration(out_dir, keys, calibration, labels):
    import matplotlib.pyplot as plt

    from pyrobnn.evaluation.plotting import save_figure

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="0.5", lw=1, ls="--", label="ideal")
    for key in keys:
        observed = torch.tensor(calibration[key], dtype=torch.float64, device="cpu").mean(0)
        ax.plot(CALIBRATION_LEVELS, observed.tolist(), marker="o", ms=3, label=labels[key])
    ax.set_xlabel("nominal coverage of the central interval")
    ax.set_ylabel("observed coverage on the test set")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out_dir, "calibration.png"))


def plot_toy(out_dir, keys, grid_preds, split, x_grid, labels):
    import matplotlib.pyplot as plt

    from pyrobnn.evaluation.plotting import plot_regression_1d, save_figure

    cols = 4
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), sharex=True, sharey=True, squeeze=False)
    reference_mean = grid_preds["reference"].mean.reshape(-1)
    for ax, key in zip(axes.ravel(), keys):
        plot_regression_1d(ax, x_grid, grid_preds[key], split["x_train"], split["y_train"], title=labels[key])
        if key != "reference":
            ax.plot(x_grid.reshape(-1), reference_mean, color="C3", lw=1, ls="--", label="reference mean")
    for ax in axes.ravel()[len(keys):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6, loc="upper left")
    save_figure(fig, os.path.join(out_dir, "predictive_bands.png"))
