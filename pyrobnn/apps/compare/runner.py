"""Running ``pyrobnn compare``: every method of :mod:`pyrobnn.apps.compare.methods` on every split,
scored against the reference sampler, each split saved as it completes so that a stopped run
resumes; the outputs are written by :mod:`pyrobnn.apps.compare.report`."""

from __future__ import annotations

import json
import math
import os
import time
import warnings

import pyro
import torch

import pyrobnn
from pyrobnn.apps.compare.methods import METHODS, REFERENCES, build_model, predict_on, settings
from pyrobnn.apps.compare.report import CALIBRATION_LEVELS, METRICS, plot_calibration, plot_toy, write_outputs
from pyrobnn.data import gap_regression, uci, uci_num_splits
from pyrobnn.evaluation import metrics
from pyrobnn.utils.io import atomic_write_text
from pyrobnn.utils.progress import tqdm

__all__ = ["run_compare", "predictive_w2", "fit_method"]


def predictive_w2(pred, ref, levels: int = 20) -> float:
    """Mean over points of the 2-Wasserstein distance between two 1-D predictives, from their
    quantiles at ``levels`` equally spaced probabilities."""
    total = 0.0
    for k in range(levels):
        q = (k + 0.5) / levels
        a = metrics.gaussian_mixture_quantile(pred.loc_samples, pred.scale_samples, q, iterations=40)
        b = metrics.gaussian_mixture_quantile(ref.loc_samples, ref.scale_samples, q, iterations=40)
        total = total + (a - b) ** 2
    return torch.sqrt(total / levels).mean().item()


def _score(pred, y, seconds):
    return {
        "rmse": pred.rmse(y),
        "log_likelihood": pred.log_likelihood(y),
        "coverage_90": pred.coverage(y, 0.9),
        "crps": pred.crps(y),
        "seconds": seconds,
    }


def _calibration(pred, y, levels):
    return [pred.coverage(y, level) for level in levels]


def fit_method(key, split, s, seed, progress, reference, x_grid=None, shared=None):
    """Fit one method (``"reference"``: the sampler ``reference``) on one split; returns
    ``(prediction on test, prediction on the grid, seconds, posterior)``. ``shared`` carries
    the split's deep ensemble between the methods built on it (trained once, with the same seed);
    its training time counts in each of their fit times."""
    method = REFERENCES[reference] if key == "reference" else METHODS[key]
    shared = {} if shared is None else shared
    pyro.set_rng_seed(seed)
    model = build_model(method, split["x_train"].shape[1], split["hidden"], split["activation"])
    trained_before = shared.get("ensemble")
    start = time.perf_counter()
    posterior = method.fit(model, split, s, seed, progress, shared)
    seconds = time.perf_counter() - start
    if method.on_ensemble and trained_before is not None:
        seconds += trained_before.seconds
    test = predict_on(posterior, split["x_test"], s, seed).rescale(split["y_mean"], split["y_std"])
    grid = None
    if x_grid is not None:
        grid = predict_on(posterior, x_grid, s, seed).rescale(split["y_mean"], split["y_std"])
    return test, grid, seconds, posterior


def _reference_diagnostics(reference, model, result, split, ensemble=None):
    """Random-start NUTS: R-hat and ESS across chains; ensemble-initialized chains: each chain
    on its own (within-chain R-hat on predictions and log density, per-chain LPPD). Both are
    checked for degeneracy (:func:`pyrobnn.infer.results.diagnostics.degeneracy`: noise scales collapsed onto
    spikes at the training targets; for the ensemble-initialized references also chains whose
    test LPPD is far below the ensemble's)."""
    from pyrobnn.infer.results import diagnostics

    if reference == "nuts":
        idata = diagnostics.inference_data(model, result, split["x_test"], split["y_test"])
        out = diagnostics.convergence_summary(idata)
        found = diagnostics.degeneracy(model, result.as_draws().samples, x_train=split["x_train"], y_train=split["y_train"])
        out["degenerate"] = found["degenerate"]
        if found["degenerate"]:
            out["verdict"] = diagnostics.within_chain_summary(
                model, result, split["x_test"], split["y_test"], x_train=split["x_train"], y_train=split["y_train"]
            )["verdict"]
        return out, idata
    reference_lppd = None
    if ensemble is not None:
        reference_lppd = pyrobnn.predict(model, ensemble, split["x_test"], num_samples=None).log_likelihood(split["y_test"])
    summary = diagnostics.within_chain_summary(
        model, result, split["x_test"], split["y_test"], x_train=split["x_train"], y_train=split["y_train"], reference_lppd=reference_lppd
    )
    keep = ("worst_rhat", "median_rhat", "drifting_chains", "between_chain_rhat", "lppd_mixture", "verdict", "chains", "degenerate")
    out = {k: summary[k] for k in keep}
    out["per_chain_lppd"] = [float(v) for v in summary["lppd"]]
    return out, None


def _run_split(split, keys, s, seed, bar, x_grid, out_dir, first, reference="ensemble-mclmc"):
    """Fit and score every method on one split: ``{"rows", "calibration", "diagnostics",
    "grid_preds"}``, the rows and calibration keyed by method."""
    from pyrobnn.infer.results import diagnostics

    preds, rows, calibration, grid_preds, summary = {}, {}, {}, {}, None
    y_orig = split["y_test"] * split["y_std"] + split["y_mean"]
    shared = {}
    for key in keys:
        bar.set_postfix({"split": split["split"], "method": key}, refresh=True)
        test, grid, seconds, posterior = fit_method(key, split, s, seed + split["split"], False, reference, x_grid, shared)
        preds[key] = test
        rows[key] = _score(test, y_orig, seconds)
        calibration[key] = _calibration(test, y_orig, CALIBRATION_LEVELS)
        if key == "reference":
            summary, idata = _reference_diagnostics(reference, posterior.model, posterior, split, shared.get("ensemble"))
            summary["split"] = split["split"]
            rows[key].update({k: v for k, v in summary.items() if k not in ("split", "verdict", "per_chain_lppd")})
            if first:
                if idata is None:
                    idata = posterior.to_arviz(split["x_test"], split["y_test"])
                diagnostics.plot_diagnostics(idata, out_dir, prefix="reference")
                diagnostics.save_netcdf(idata, os.path.join(out_dir, "reference.nc"))
        if grid is not None:
            grid_preds[key] = grid
        bar.update(1)
    for key in keys:
        # against a degenerate reference a distance ranks nothing: left out (NaN), see run_compare
        degenerate = summary is not None and summary.get("degenerate")
        rows[key]["w2_to_reference"] = math.nan if degenerate else 0.0 if key == "reference" else predictive_w2(preds[key], preds["reference"])
    return {"rows": rows, "calibration": calibration, "diagnostics": summary, "grid_preds": grid_preds}


class _SplitCache:
    """Per-split results in ``out_dir/splits/split-<i>.json``, written atomically; a saved
    split is reused only if it was run with the same data set, seed and settings and holds every
    method asked for."""

    def __init__(self, out_dir, fingerprint):
        self.folder = os.path.join(out_dir, "splits")
        self.fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from JSON

    def _path(self, index):
        return os.path.join(self.folder, f"split-{index}.json")

    def load(self, index, keys):
        path = self._path(index)
        if not os.path.exists(path):
            return None
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return None  # unreadable: run the split again
        if saved.get("fingerprint") != self.fingerprint or not set(keys) <= set(saved.get("rows", {})):
            return None
        problem = _record_problem(saved, keys)
        if problem is not None:
            warnings.warn(f"{path} is not a usable saved split ({problem}): running split {index} again", stacklevel=3)
            return None
        return {
            "rows": {k: saved["rows"][k] for k in keys},
            "calibration": {k: saved["calibration"][k] for k in keys},
            "diagnostics": saved["diagnostics"],  # the reference always runs
        }

    def save(self, index, record):
        atomic_write_text(json.dumps({"fingerprint": self.fingerprint, **record}, indent=1), self._path(index))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _record_problem(saved, keys):
    """What makes a saved split unusable (a value that is not a number where a number belongs),
    or ``None``."""
    for key in keys:
        row = saved["rows"][key]
        if not isinstance(row, dict):
            return f"rows[{key!r}] is not a table row"
        for metric in METRICS:
            if not _is_number(row.get(metric)):
                return f"rows[{key!r}][{metric!r}] is {row.get(metric)!r}, not a number"
        levels = saved.get("calibration", {}).get(key)
        if not isinstance(levels, list) or len(levels) != len(CALIBRATION_LEVELS) or not all(_is_number(v) for v in levels):
            return f"calibration[{key!r}] is not {len(CALIBRATION_LEVELS)} numbers"
    if saved.get("diagnostics") is not None and not isinstance(saved["diagnostics"], dict):
        return "its reference diagnostics are not a table"
    return None


def _splits(dataset, data_dir, splits, seed):
    if dataset == "toy":
        x, y = gap_regression(n=100, noise=0.1, seed=seed)
        x_test, y_test = gap_regression(n=200, noise=0.1, seed=seed + 1)
        yield {
            "split": 0, "x_train": x, "y_train": y, "x_test": x_test, "y_test": y_test,
            "y_mean": torch.tensor(0.0, device="cpu"), "y_std": torch.tensor(1.0, device="cpu"), "hidden": 50, "activation": "tanh",
        }
        return
    n = uci_num_splits(dataset, data_dir)
    for i in splits if splits is not None else range(n):
        s = uci(dataset, i, data_dir)
        yield {
            "split": i, "x_train": s.x_train, "y_train": s.y_train, "x_test": s.x_test, "y_test": s.y_test,
            "y_mean": s.y_mean, "y_std": s.y_std, "hidden": s.meta.get("n_hidden", 50), "activation": "relu",
        }


def _check_splits(dataset, data_dir, splits):
    """``splits`` as a list of distinct split numbers that exist for ``dataset`` (``None``: all)."""
    if splits is None:
        return None
    splits = list(splits)
    if not splits:
        raise ValueError("splits is empty: give split numbers, or None for all")
    bad = [v for v in splits if not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad:
        raise ValueError(f"splits must be non-negative integers, got {bad}")
    repeated = sorted({v for v in splits if splits.count(v) > 1})
    if repeated:
        raise ValueError(f"splits lists {repeated} more than once")
    available = 1 if dataset == "toy" else uci_num_splits(dataset, data_dir)
    missing = [v for v in splits if v >= available]
    if missing:
        raise ValueError(f"{dataset} has {available} split(s), numbered 0-{available - 1}; no split {missing}")
    return splits


def run_compare(
    dataset: str = "toy",
    out_dir: str = "pyrobnn-compare",
    data_dir=None,
    splits=None,
    methods=None,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    resume: bool = True,
    reference: str = "ensemble-mclmc",
):
    """Run the comparison, write ``results.md``, ``results.csv``, ``results.json``, the plots
    and NUTS's diagnostics into ``out_dir``; return the summary rows.

    A reference judged degenerate (:func:`pyrobnn.infer.results.diagnostics.degeneracy`) on a split ranks
    nothing there: every method's ``w2_to_reference`` on that split is NaN, the reference's row
    carries ``degenerate_splits`` and the verdict, the tables open with a warning, and the
    ``pyrobnn compare`` command exits with status 3.

    :param reference: the reference sampler: ``"ensemble-mclmc"`` (default), ``"ensemble-nuts"``
        or ``"nuts"`` (random starts).
    :param resume: reuse the splits of a UCI set that an earlier run with the same settings
        saved in ``out_dir/splits`` (each split is saved as it completes), so that a long run
        stopped part way goes on from where it stopped.
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {list(REFERENCES)}, got {reference!r}")
    keys = list(dict.fromkeys(methods)) if methods else list(METHODS)
    unknown = [k for k in keys if k not in METHODS and k != "reference"]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
    splits = _check_splits(dataset, data_dir, splits)
    os.makedirs(out_dir, exist_ok=True)
    keys = ["reference"] + [k for k in keys if k != "reference"]
    s = settings(dataset, quick)
    per_split = {k: [] for k in keys}
    calibration = {k: [] for k in keys}
    grid_preds = {}
    toy = dataset == "toy"
    x_grid = torch.linspace(-1.6, 1.6, 300, device="cpu").unsqueeze(-1) if toy else None
    split_list = list(_splits(dataset, data_dir, splits, seed))
    # a split's results are saved as it completes, so an interrupted run resumes where it
    # stopped; the toy run keeps its plotting grid in memory and always runs afresh
    fingerprint = {"dataset": dataset, "seed": seed, "settings": dict(s.__dict__), "reference": reference}
    cache = _SplitCache(out_dir, fingerprint) if resume and not toy else None
    bar = tqdm(total=len(split_list) * len(keys), disable=not progress, desc=f"compare {dataset}", unit="fit", position=0)
    diagnostics_rows = []
    try:
        for split in split_list:
            record = cache.load(split["split"], keys) if cache is not None else None
            if record is None:
                record = _run_split(split, keys, s, seed, bar, x_grid, out_dir, first=split is split_list[0], reference=reference)
                grid_preds.update(record.pop("grid_preds"))
                if cache is not None:
                    cache.save(split["split"], record)
            else:
                bar.update(len(keys))
            for key in keys:
                per_split[key].append(record["rows"][key])
                calibration[key].append(record["calibration"][key])
            if record["diagnostics"] is not None:
                diagnostics_rows.append(record["diagnostics"])
    finally:
        bar.close()

    degenerate = [d["split"] for d in diagnostics_rows if d.get("degenerate")]
    rows = []
    for key in keys:
        label = (REFERENCES[reference] if key == "reference" else METHODS[key]).label
        summary = {"method": label, "key": key, "splits": len(per_split[key])}
        for metric in METRICS:
            values = torch.tensor([r[metric] for r in per_split[key]], dtype=torch.float64, device="cpu")
            summary[metric] = values.mean().item()
            summary[f"{metric}_se"] = (values.std() / math.sqrt(len(values))).item() if len(values) > 1 else 0.0
        if key == "reference" and diagnostics_rows:
            summary.update(_reference_summary(reference, diagnostics_rows))
            if degenerate:
                summary["degenerate_splits"] = degenerate
                summary["degenerate_verdict"] = next(d["verdict"] for d in diagnostics_rows if d.get("degenerate"))
        rows.append(summary)
    write_outputs(out_dir, dataset, rows, per_split, calibration, diagnostics_rows, s, quick)
    labels = {r["key"]: r["method"] for r in rows}
    plot_calibration(out_dir, keys, calibration, labels)
    if toy and grid_preds:
        plot_toy(out_dir, keys, grid_preds, split_list[0], x_grid, labels)
    return rows


def _reference_summary(reference, diagnostics_rows) -> dict:
    if reference == "nuts":
        rhat = torch.tensor([d["max_rhat_predictions"] for d in diagnostics_rows], dtype=torch.float64, device="cpu")
        return {
            "max_rhat_predictions": rhat.max().item(),
            "median_max_rhat_predictions": rhat.median().item(),
            "min_ess_predictions": min(d["min_ess_predictions"] for d in diagnostics_rows),
            "divergences": sum(int(d["divergences"]) for d in diagnostics_rows),
        }
    worst = max(diagnostics_rows, key=lambda d: d["worst_rhat"])
    return {
        "worst_within_chain_rhat": worst["worst_rhat"],
        "median_within_chain_rhat": float(torch.tensor([d["median_rhat"] for d in diagnostics_rows], device="cpu").median()),
        "drifting_chains": sum(d["drifting_chains"] for d in diagnostics_rows),
        "chains_total": sum(d["chains"] for d in diagnostics_rows),
        "verdict_worst_split": worst["verdict"],
    }


