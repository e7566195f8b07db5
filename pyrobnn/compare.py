"""A sampling reference beside variational methods and deep ensembles on small regression
problems: ``pyrobnn compare``.

Every method fits the same network (one hidden layer; 50 units, 100 for protein) with the same
Gaussian likelihood, whose noise scale has a log-normal prior, so the reference and the guides
target the same kind of model; each method has the prior its family is defined with (Normal(0, 1)
weights for the reference, the ensemble, the mean-field and the dropout methods; Blundell's scale
mixture; the log-uniform prior of variational dropout).

The reference is ensemble-initialized sampling by default (Sommer et al. 2024, 2025): a deep
ensemble (MAP under the model's prior) and one MCLMC chain started at each member
(``reference="ensemble-mclmc"``), or one NUTS chain per member (``"ensemble-nuts"``); random-start
NUTS (``"nuts"``) is still there, but on the UCI sets its chains do not agree within a run's budget
(docs/compare.md). Ensemble-initialized chains are judged each on its own (within-chain R-hat on
the test predictions and log density, :func:`pyrobnn.diagnostics.within_chain_summary`).

Beside the variational methods and the deep ensemble, the methods built on that ensemble: the
Laplace approximation around its first member (KFAC GGN over all weights, prior precision tuned
by the marginal likelihood, the linearized predictive), SWAG from the same member, and SGLD and
SGHMC with one chain started at each member; their step sizes are set from the largest
curvature at the start (``"auto"``).

On every split each method is scored on the test set in the original units of the target:

- RMSE of the predictive mean; test log-likelihood, the log of the mean predictive density
  over posterior samples (Hernández-Lobato & Adams 2015); coverage of the central 90%
  predictive interval; CRPS;
- ``w2_to_reference``: the 2-Wasserstein distance between the method's predictive marginal and
  the reference's at each test point (from 20 quantiles of each Gaussian-mixture predictive),
  averaged over the points: how far the method is from the reference posterior;
- wall time of the fit (the reference: ensemble training and sampling, warm-up included; Laplace,
  SWAG, SGLD and SGHMC: their own time plus the split's deep ensemble, whose first member is
  their MAP or whose members start their chains).

Results are mean and standard error over splits, beside the published figures of
``REFERENCES.md`` for the UCI sets.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import pyro
import pyro.distributions as dist
import torch
from tqdm.auto import tqdm

import pyrobnn
from pyrobnn import metrics
from pyrobnn.data import gap_regression, uci, uci_num_splits
from pyrobnn.infer.ensemble import deep_ensemble, ensemble_sampling
from pyrobnn.infer.hmc import nuts
from pyrobnn.infer.laplace import laplace
from pyrobnn.infer.sgmcmc import sghmc, sgld
from pyrobnn.infer.swag import swag
from pyrobnn.io import atomic_write_text

__all__ = ["METHODS", "REFERENCES", "PUBLISHED", "run_compare", "format_markdown", "predictive_w2"]

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


@dataclass
class Method:
    key: str
    label: str
    prior: Callable
    guide: Optional[Callable]  # None: the reference or the ensemble
    elbo: str = "meanfield"
    estimator: Optional[str] = "local"


#: the reference samplers: label of the table row
REFERENCES = {
    "ensemble-mclmc": "DE-initialized MCLMC (reference)",
    "ensemble-nuts": "DE-initialized NUTS (reference)",
    "nuts": "NUTS from random starts (reference)",
}

METHODS = {
    m.key: m
    for m in (
        Method("reference", "reference sampler", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("ensemble", "deep ensemble", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("laplace", "Laplace (KFAC, all weights, GLM predictive)", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("swag", "SWAG", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("sgld", "SGLD (from the ensemble)", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("sghmc", "SGHMC (from the ensemble)", lambda: pyrobnn.NormalPrior(1.0), None),
        Method("meanfield", "mean-field, Gaussian prior", lambda: pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.MeanFieldNormal(m)),
        Method("meanfield_mixture", "mean-field, scale-mixture prior", lambda: pyrobnn.ScaleMixturePrior(0.5, 1.0, math.exp(-6)), lambda m: pyrobnn.MeanFieldNormal(m), elbo="trace"),
        Method("variational_dropout", "variational dropout", lambda: pyrobnn.LogUniformPrior(), lambda m: pyrobnn.VariationalDropout(m, log_alpha_range=(-8.0, 0.0))),
        Method("sparse_vd", "sparse VD, log-uniform prior", lambda: pyrobnn.LogUniformPrior(), lambda m: pyrobnn.SparseVariationalDropout(m)),
        Method("mc_dropout", "MC dropout", lambda: pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.MCDropout(m, p=0.05)),
        Method("concrete_dropout", "concrete dropout", lambda: pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.ConcreteDropout(m)),
    )
}


def _noise_prior():
    # log-normal on the noise scale in standardized units: median 0.25, covering 0.03-2
    return dist.LogNormal(math.log(0.25), 1.0)


def _model(method, in_features, hidden, activation):
    net = pyrobnn.MLP(in_features, 1, hidden=(hidden,), activation=activation)
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=_noise_prior()), method.prior())


@dataclass
class Settings:
    """Effort per method; :func:`settings` gives the defaults and the ``--quick`` ones."""

    epochs: int
    batch_size: Optional[int]
    lr: float
    num_predictive: int
    chains: int  # random-start NUTS chains
    warmup: int  # NUTS warm-up iterations
    samples: int  # NUTS draws per chain
    max_tree_depth: int
    members: int  # deep-ensemble members (one chain each for the ensemble-initialized reference)
    ensemble_epochs: int
    mclmc_warmup: tuple  # steps of MCLMC's three tuning phases
    mclmc_samples: int  # MCLMC steps after tuning
    mclmc_thinning: int
    sg_epochs: int  # SGLD/SGHMC epochs (half burn-in) and SWAG's SGD epochs after the MAP (step sizes "auto")


def settings(dataset: str, quick: bool) -> Settings:
    if quick:
        return Settings(epochs=150, batch_size=None, lr=1e-2, num_predictive=100, chains=2, warmup=60, samples=60, max_tree_depth=5,
                        members=2, ensemble_epochs=500, mclmc_warmup=(300, 50, 50), mclmc_samples=400, mclmc_thinning=4,
                        sg_epochs=20)
    if dataset == "toy":
        return Settings(epochs=3000, batch_size=None, lr=1e-2, num_predictive=500, chains=8, warmup=300, samples=300, max_tree_depth=10,
                        members=8, ensemble_epochs=2000, mclmc_warmup=(16_000, 2_000, 2_000), mclmc_samples=10_000, mclmc_thinning=10,
                        sg_epochs=200)
    return Settings(epochs=400, batch_size=32, lr=1e-2, num_predictive=500, chains=4, warmup=200, samples=200, max_tree_depth=8,
                    members=8, ensemble_epochs=400, mclmc_warmup=(16_000, 2_000, 2_000), mclmc_samples=10_000, mclmc_thinning=10,
                    sg_epochs=100)


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


#: R-hat on the predictions below which random-start NUTS chains count as agreeing (Vehtari et al. 2021)
RHAT_CONVERGED = 1.01

CALIBRATION_LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]


def _ensemble(model, split, s, seed, progress):
    return deep_ensemble(
        model, split["x_train"], split["y_train"], num_members=s.members, validation=0.1, objective="map", lr=s.lr,
        batch_size=s.batch_size, max_epochs=s.ensemble_epochs, patience=20, seed=seed, progress=progress,
    )


def _fit_method(key, split, s, seed, progress, reference, x_grid=None, shared=None):
    """Fit one method on one split; returns (prediction on test, prediction on grid, seconds,
    extra). ``shared`` carries the split's deep ensemble from the reference to the ``ensemble``
    method (trained once, with the same seed)."""
    method = METHODS[key]
    in_features = split["x_train"].shape[1]
    shared = {} if shared is None else shared
    pyro.set_rng_seed(seed)
    model = _model(method, in_features, split["hidden"], split["activation"])
    extra = {"model": model}
    start = time.perf_counter()
    num = None
    if key == "reference" and reference == "nuts":
        posterior = nuts(
            model, split["x_train"], split["y_train"], num_samples=s.samples, num_warmup=s.warmup,
            num_chains=s.chains, max_tree_depth=s.max_tree_depth, seed=seed, progress=progress,
        )
        seconds = time.perf_counter() - start
        extra["result"] = posterior
    elif key in ("reference", "ensemble"):
        if "ensemble" not in shared:
            shared["ensemble"] = _ensemble(model, split, s, seed, progress)
        ensemble = shared["ensemble"]
        posterior, seconds = ensemble, ensemble.seconds
        if key == "reference":
            sampler = reference.split("-", 1)[1]
            options = (
                dict(num_samples=s.mclmc_samples, num_warmup=s.mclmc_warmup, thinning=s.mclmc_thinning)
                if sampler == "mclmc" else dict(num_samples=s.samples, num_warmup=s.warmup, max_tree_depth=s.max_tree_depth)
            )
            posterior = ensemble_sampling(model, split["x_train"], split["y_train"], ensemble, sampler, seed=seed, progress=progress, **options)
            seconds = ensemble.seconds + posterior.seconds
            extra["result"] = posterior
            extra["ensemble"] = ensemble
    elif key in POSTERIOR_FROM_MAP:
        if "ensemble" not in shared:
            shared["ensemble"] = _ensemble(model, split, s, seed, progress)
        ensemble = shared["ensemble"]
        posterior = _posterior_from_map(key, model, split, s, seed, ensemble, progress)
        # the MAP (or the starting points) came from the split's deep ensemble: its time counts
        seconds = ensemble.seconds + posterior.seconds
        if key == "laplace":
            test = posterior.linearized_predict(split["x_test"]).rescale(split["y_mean"], split["y_std"])
            grid = None
            if x_grid is not None:
                grid = posterior.linearized_predict(x_grid).rescale(split["y_mean"], split["y_std"])
            return test, grid, seconds, extra
    else:
        guide = method.guide(model)
        pyrobnn.fit(
            model, guide, split["x_train"], split["y_train"], epochs=s.epochs, batch_size=s.batch_size, lr=s.lr,
            elbo=method.elbo, estimator=method.estimator, progress=progress, seed=seed,
        )
        seconds = time.perf_counter() - start
        posterior = guide
        num = s.num_predictive
    test = pyrobnn.predict(model, posterior, split["x_test"], num, seed=seed).rescale(split["y_mean"], split["y_std"])
    grid = None
    if x_grid is not None:
        grid = pyrobnn.predict(model, posterior, x_grid, num, seed=seed).rescale(split["y_mean"], split["y_std"])
    return test, grid, seconds, extra


#: methods built on the split's deep ensemble: the MAP is its first member (Laplace, SWAG), or
#: the chains start at its members (SGLD, SGHMC)
POSTERIOR_FROM_MAP = ("laplace", "swag", "sgld", "sghmc")


def _posterior_from_map(key, model, split, s, seed, ensemble, progress):
    x, y = split["x_train"], split["y_train"]
    n = x.shape[0]
    batch = min(s.batch_size or 32, n)  # minibatches even where the VI methods take full batches
    if key in ("laplace", "swag"):
        first = ensemble.member(0)
        if key == "laplace":
            return laplace(model, x, y, subset="all", hessian="kron", map_estimate=first, num_samples=s.num_predictive, seed=seed)
        return swag(model, x, y, num_epochs=s.sg_epochs, lr="auto", batch_size=batch, rank=20,
                    num_samples=s.num_predictive, map_estimate=first, seed=seed, progress=progress)
    steps = s.sg_epochs * math.ceil(n / batch)
    kept_per_chain = max(1, s.num_predictive // ensemble.num_chains)
    thinning = max(1, (steps - steps // 2) // kept_per_chain)
    options = dict(num_steps=steps, num_burnin=steps // 2, thinning=thinning, batch_size=batch, init=ensemble, seed=seed, progress=progress)
    if key == "sgld":
        return sgld(model, x, y, step_size="auto", **options)
    return sghmc(model, x, y, step_size="auto", friction=0.1, **options)


def _reference_diagnostics(reference, model, result, split, ensemble=None):
    """Random-start NUTS: R-hat and ESS across chains; ensemble-initialized chains: each chain
    on its own (within-chain R-hat on predictions and log density, per-chain LPPD). Both are
    checked for degeneracy (:func:`pyrobnn.diagnostics.degeneracy`: noise scales collapsed onto
    spikes at the training targets; for the ensemble-initialized references also chains whose
    test LPPD is far below the ensemble's)."""
    from pyrobnn import diagnostics

    if reference == "nuts":
        idata = diagnostics.inference_data(model, result, split["x_test"], split["y_test"])
        out = diagnostics.convergence_summary(idata)
        found = diagnostics.degeneracy(model, result.samples, x_train=split["x_train"], y_train=split["y_train"])
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
    from pyrobnn import diagnostics

    preds, rows, calibration, grid_preds, summary = {}, {}, {}, {}, None
    y_orig = split["y_test"] * split["y_std"] + split["y_mean"]
    shared = {}
    for key in keys:
        bar.set_postfix({"split": split["split"], "method": key}, refresh=True)
        test, grid, seconds, extra = _fit_method(key, split, s, seed + split["split"], False, reference, x_grid, shared)
        preds[key] = test
        rows[key] = _score(test, y_orig, seconds)
        calibration[key] = _calibration(test, y_orig, CALIBRATION_LEVELS)
        if key == "reference":
            summary, idata = _reference_diagnostics(reference, extra["model"], extra["result"], split, extra.get("ensemble"))
            summary["split"] = split["split"]
            rows[key].update({k: v for k, v in summary.items() if k not in ("split", "verdict", "per_chain_lppd")})
            if first:
                if idata is None:
                    idata = diagnostics.inference_data(extra["model"], extra["result"], split["x_test"], split["y_test"])
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
        return {
            "rows": {k: saved["rows"][k] for k in keys},
            "calibration": {k: saved["calibration"][k] for k in keys},
            "diagnostics": saved["diagnostics"],  # the reference always runs
        }

    def save(self, index, record):
        atomic_write_text(json.dumps({"fingerprint": self.fingerprint, **record}, indent=1), self._path(index))


def _splits(dataset, data_dir, splits, quick, seed):
    if dataset == "toy":
        x, y = gap_regression(n=100, noise=0.1, seed=seed)
        x_test, y_test = gap_regression(n=200, noise=0.1, seed=seed + 1)
        yield {
            "split": 0, "x_train": x, "y_train": y, "x_test": x_test, "y_test": y_test,
            "y_mean": torch.tensor(0.0), "y_std": torch.tensor(1.0), "hidden": 50, "activation": "tanh",
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

    A reference judged degenerate (:func:`pyrobnn.diagnostics.degeneracy`) on a split ranks
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
    unknown = [k for k in keys if k not in METHODS]
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
    x_grid = torch.linspace(-1.6, 1.6, 300).unsqueeze(-1) if toy else None
    split_list = list(_splits(dataset, data_dir, splits, quick, seed))
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
        label = REFERENCES[reference] if key == "reference" else METHODS[key].label
        summary = {"method": label, "key": key, "splits": len(per_split[key])}
        for metric in METRICS:
            values = torch.tensor([r[metric] for r in per_split[key]], dtype=torch.float64)
            summary[metric] = values.mean().item()
            summary[f"{metric}_se"] = (values.std() / math.sqrt(len(values))).item() if len(values) > 1 else 0.0
        if key == "reference" and diagnostics_rows:
            summary.update(_reference_summary(reference, diagnostics_rows))
            if degenerate:
                summary["degenerate_splits"] = degenerate
                summary["degenerate_verdict"] = next(d["verdict"] for d in diagnostics_rows if d.get("degenerate"))
        rows.append(summary)
    _write_outputs(out_dir, dataset, rows, per_split, calibration, diagnostics_rows, s, quick)
    labels = {r["key"]: r["method"] for r in rows}
    _plot_calibration(out_dir, keys, calibration, labels)
    if toy and grid_preds:
        _plot_toy(out_dir, keys, grid_preds, split_list[0], x_grid, labels)
    return rows


METRICS = ("rmse", "log_likelihood", "coverage_90", "crps", "w2_to_reference", "seconds")


def _reference_summary(reference, diagnostics_rows) -> dict:
    if reference == "nuts":
        rhat = torch.tensor([d["max_rhat_predictions"] for d in diagnostics_rows], dtype=torch.float64)
        return {
            "max_rhat_predictions": rhat.max().item(),
            "median_max_rhat_predictions": rhat.median().item(),
            "min_ess_predictions": min(d["min_ess_predictions"] for d in diagnostics_rows),
            "divergences": sum(int(d["divergences"]) for d in diagnostics_rows),
        }
    worst = max(diagnostics_rows, key=lambda d: d["worst_rhat"])
    return {
        "worst_within_chain_rhat": worst["worst_rhat"],
        "median_within_chain_rhat": float(torch.tensor([d["median_rhat"] for d in diagnostics_rows]).median()),
        "drifting_chains": sum(d["drifting_chains"] for d in diagnostics_rows),
        "chains_total": sum(d["chains"] for d in diagnostics_rows),
        "verdict_worst_split": worst["verdict"],
    }


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
    from pyrobnn.diagnostics import WITHIN_CHAIN_RHAT_OK

    return WITHIN_CHAIN_RHAT_OK


def _write_outputs(out_dir, dataset, rows, per_split, calibration, diagnostics_rows, s, quick):
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


def _plot_calibration(out_dir, keys, calibration, labels):
    import matplotlib.pyplot as plt

    from pyrobnn.plotting import save_figure

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="0.5", lw=1, ls="--", label="ideal")
    for key in keys:
        observed = torch.tensor(calibration[key], dtype=torch.float64).mean(0)
        ax.plot(CALIBRATION_LEVELS, observed.tolist(), marker="o", ms=3, label=labels[key])
    ax.set_xlabel("nominal coverage of the central interval")
    ax.set_ylabel("observed coverage on the test set")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out_dir, "calibration.png"))


def _plot_toy(out_dir, keys, grid_preds, split, x_grid, labels):
    import matplotlib.pyplot as plt

    from pyrobnn.plotting import plot_regression_1d, save_figure

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
