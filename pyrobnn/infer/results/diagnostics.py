"""ArviZ diagnostics for MCMC and SVI posteriors of a BayesianModel.

Weights of a neural network are not identifiable (hidden units can be permuted, signs
flipped), so R-hat and ESS on weights can look bad while the posterior over *functions* has
mixed; the summaries here report them on predictions (the network's output at given points)
as well as on the weights.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from pyrobnn.infer.results.predictive import network_outputs
from pyrobnn.infer.results.protocol import Result
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.validation import as_tensor

__all__ = [
    "inference_data", "convergence_summary", "within_chain_rhat", "between_chain_rhat", "within_chain_summary",
    "plot_diagnostics", "save_netcdf", "WITHIN_CHAIN_RHAT_OK", "degeneracy",
]


def _az():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az
    return az


def _draws_of(posterior):
    """``(samples {site: (chains, draws, *shape)}, stats)`` of a result (its
    :meth:`~pyrobnn.infer.results.protocol.Result.as_draws`) or of a dict of draws."""
    if isinstance(posterior, Result):
        draws = posterior.as_draws()
        return draws.samples, draws.stats
    if isinstance(posterior, dict):
        return posterior, {}
    raise TypeError(f"expected a result of a pyrobnn method or a dict of draws {{site: (chains, draws, ...)}}, got {type(posterior).__name__}")


def _eval_outputs(model, flat_samples, x):
    with eval_mode(model):
        return network_outputs(model, flat_samples, x)


@torch.no_grad()
def _predictive_arrays(model, flat_samples, x, y, chains, draws):
    """Network outputs, simulated targets and per-point log-likelihoods for every draw (the
    points in chunks within the memory budget, :mod:`pyrobnn.utils.memory`)."""
    latent_names = list(model.likelihood.latent_sites())
    f = _eval_outputs(model, flat_samples, x)
    latents = {k: flat_samples[k].reshape(-1, 1).to(f.device) for k in latent_names}
    dist = model.likelihood.distribution(f, **latents)
    arrays = {"f": f, "obs": dist.sample()}
    if y is not None:
        y_checked = model.likelihood.check_targets(y.to(f.device), f.shape[-2:])
        arrays["log_lik"] = dist.log_prob(y_checked)
    return {k: v.reshape((chains, draws) + v.shape[1:]).cpu().double().numpy() for k, v in arrays.items()}


def _data(model, x, y):
    x = as_tensor(x, "x", model.dtype).to(model.device)
    model.check_x(x)
    return x, None if y is None else as_tensor(y, "y", model.dtype)


def inference_data(model, posterior, x, y=None, observed=True):
    """An ``arviz.InferenceData`` for posterior draws of ``model`` (any method's result, read
    through its :meth:`~pyrobnn.infer.results.protocol.Result.as_draws`, or a dict ``{site: (chains, draws,
    *shape)}``):

    - ``posterior``: every latent site, and ``f``, the network's output at ``x``;
    - ``posterior_predictive``: ``obs``, targets simulated at ``x``;
    - ``log_likelihood``: ``obs``, the log-likelihood of each point of ``y`` (for ``az.loo``);
    - ``observed_data``: ``obs`` = ``y``.
    """
    az = _az()
    samples, stats = _draws_of(posterior)
    x, y = _data(model, x, y)
    chains, draws = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in samples.items()}
    arrays = _predictive_arrays(model, flat, x, y, chains, draws)
    post = {k.replace(".", "_"): v.double().cpu().numpy() for k, v in samples.items()}
    post["f"] = arrays["f"]
    groups = {
        "posterior": post,
        "posterior_predictive": {"obs": _squeeze_output(arrays["obs"])},
    }
    if y is not None:
        groups["log_likelihood"] = {"obs": arrays["log_lik"]}
        if observed:
            groups["observed_data"] = {"obs": _squeeze_output(y.double().cpu().numpy()[None, None])[0, 0]}
    sample_stats = {}
    if "diverging" in stats:
        sample_stats["diverging"] = stats["diverging"].cpu().numpy()
    if "tree_depth" in stats:
        sample_stats["tree_depth"] = stats["tree_depth"].cpu().numpy()
    if "accept_prob" in stats:
        sample_stats["acceptance_rate"] = stats["accept_prob"].cpu().double().numpy()
    if sample_stats:
        groups["sample_stats"] = sample_stats
    with warnings.catch_warnings():
        # a deep ensemble is many chains of one draw each, by design
        warnings.filterwarnings("ignore", message="More chains")
        return az.from_dict(**groups)


def _squeeze_output(a):
    # (chains, draws, N, 1) -> (chains, draws, N) for one-dimensional targets
    return a[..., 0] if a.ndim >= 4 and a.shape[-1] == 1 else a


def convergence_summary(idata) -> dict:
    """Worst R-hat (``None`` for a single chain) and smallest bulk ESS over the predictions
    ``f`` and over the weights."""
    az = _az()
    posterior = idata.posterior
    weights = [v for v in posterior.data_vars if v != "f"]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, names in (("predictions", ["f"]), ("weights", weights)):
            if posterior.sizes["chain"] > 1:  # R-hat compares chains
                rhat = az.rhat(posterior[names])
                out[f"max_rhat_{label}"] = float(max(np.nanmax(rhat[v].values) for v in names))
            else:
                out[f"max_rhat_{label}"] = None
            ess = az.ess(posterior[names], method="bulk")
            out[f"min_ess_{label}"] = float(min(np.nanmin(ess[v].values) for v in names))
    if "sample_stats" in idata.groups() and "diverging" in idata.sample_stats:
        out["divergences"] = int(idata.sample_stats["diverging"].values.sum())
    return out


#: within-chain split R-hat below which a chain counts as stationary (Vehtari et al. 2021 advise
#: 1.01 for a final analysis between chains; each chain here is judged alone, on its own halves)
WITHIN_CHAIN_RHAT_OK = 1.1


def within_chain_rhat(draws) -> np.ndarray:
    """Rank-normalized split R-hat (Vehtari et al. 2021) of each chain on its own: the chain's
    first and second halves are treated as two chains (and split again by ArviZ), so a chain that
    is still drifting gets a large value even when no other chain is there to disagree with it.

    :param draws: ``(chains, draws, ...)``; returns ``(chains, ...)``."""
    az = _az()
    a = np.asarray(draws.detach().cpu().double().numpy() if isinstance(draws, torch.Tensor) else draws, dtype=np.float64)
    chains, n = a.shape[:2]
    if n < 8:
        raise ValueError(f"within-chain R-hat needs at least 8 draws per chain, got {n}")
    half = n // 2
    rest = a.shape[2:]
    # (2 halves, half, chains * rest) as two "chains" per original chain
    halves = a[:, n - 2 * half :].reshape((chains, 2, half) + rest)
    stacked = np.moveaxis(halves, 0, 2).reshape(2, half, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = az.rhat(az.convert_to_dataset(stacked), method="rank")
    values = np.asarray(next(iter(r.data_vars.values())).values)
    return values.reshape((chains,) + rest)


def between_chain_rhat(draws) -> float:
    """Rank-normalized split R-hat (Vehtari et al. 2021) across the chains of ``draws``
    (``(chains, draws)``, e.g. the log density at each draw): near 1 when the chains agree."""
    az = _az()
    a = np.asarray(draws.detach().cpu().double().numpy() if isinstance(draws, torch.Tensor) else draws, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(az.rhat(az.convert_to_dataset(a[..., None]), method="rank")["x"].values.max())


@torch.no_grad()
def within_chain_summary(
    model, posterior, x, y=None, threshold: float = WITHIN_CHAIN_RHAT_OK, *, x_train=None, y_train=None, reference_lppd=None
) -> dict:
    """Diagnostics for samplers whose chains explore different regions by design (ensemble-
    initialized sampling): each chain is judged on its own.

    - ``rhat_predictions``: per chain, the worst within-chain split R-hat
      (:func:`within_chain_rhat`) of the network's output over the points of ``x``;
    - ``rhat_log_density``: per chain, the within-chain R-hat of the potential at each draw (when
      the sampler recorded it): a chain still climbing shows here first;
    - ``ess_predictions``: per chain, the smallest bulk ESS over the points;
    - ``lppd``: per chain, with ``y``, the log of the chain's mean predictive density, averaged
      over the points;
    - ``between_chain_rhat``: the ordinary R-hat across chains on the predictions (large when
      the chains describe different regions; not a failure by itself here);
    - ``degenerate`` and what it rests on (:func:`degeneracy`, with the training data
      ``x_train, y_train`` and a sane ``reference_lppd`` such as the deep ensemble's, each where
      given): a posterior whose chains collapse onto spikes of an unbounded likelihood;
    - ``verdict``: a plain-language reading of the above that claims only what they show.
    """
    az = _az()
    samples, stats = _draws_of(posterior)
    x, y = _data(model, x, y)
    chains, draws = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in samples.items()}
    arrays = _predictive_arrays(model, flat, x, y, chains, draws)
    f = arrays["f"].reshape(chains, draws, -1)
    rhat_f = within_chain_rhat(f)
    out = {"chains": chains, "draws": draws, "rhat_predictions": np.nanmax(rhat_f, axis=1)}
    energy = stats.get("energy")
    if energy is not None and energy.shape[1] >= 8:
        out["rhat_log_density"] = within_chain_rhat(energy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ess = az.ess(az.convert_to_dataset(np.moveaxis(f, 0, 2).reshape(1, draws, -1)), method="bulk")
        ess_values = np.asarray(next(iter(ess.data_vars.values())).values).reshape(chains, -1)
        out["ess_predictions"] = np.nanmin(ess_values, axis=1)
        out["between_chain_rhat"] = float(np.nanmax(az.rhat(az.convert_to_dataset(f), method="rank")["x"].values)) if chains > 1 else None
    log_lik = None
    if y is not None:
        log_lik = arrays["log_lik"].reshape(chains, draws, -1)
        lppd = _logmeanexp(log_lik, axis=1).mean(-1)
        out["lppd"] = lppd
        out["lppd_mixture"] = float(_logmeanexp(log_lik.reshape(chains * draws, -1), axis=0).mean())
    worst = np.maximum(out["rhat_predictions"], out.get("rhat_log_density", out["rhat_predictions"]))
    out["worst_rhat"] = float(np.nanmax(worst))
    out["median_rhat"] = float(np.nanmedian(worst))
    drifting = int((worst > threshold).sum())
    out["drifting_chains"] = drifting
    out.update(degeneracy(model, samples, log_lik=log_lik, x_train=x_train, y_train=y_train, reference_lppd=reference_lppd))
    out["verdict"] = _verdict(out, drifting, threshold)
    return out


#: a chain whose test LPPD is this many nats per point below a sane reference's (the deep
#: ensemble's) has collapsed: e^10 times less predictive density at every test point
COLLAPSED_LPPD_NATS = 10.0
#: the share of (draw, training point) pairs with the noise scale at a spike that makes a chain
#: degenerate
NOISE_SPIKE_SHARE = 0.05
#: Pareto k above which an importance-sampling style average rests on a few draws (Vehtari et
#: al. 2024, "Pareto smoothed importance sampling")
PARETO_K_BAD = 0.7


@torch.no_grad()
def degeneracy(model, samples, log_lik=None, x_train=None, y_train=None, reference_lppd=None) -> dict:
    r"""Signs that a posterior is degenerate rather than unconverged: chains collapsed onto
    spikes of an unbounded likelihood. A Gaussian's density grows without bound as its scale
    goes to 0, so where training targets repeat exactly (integer-valued targets, duplicated
    rows) a heteroscedastic (or free) noise scale can shrink towards its clip at those points:
    the chains then sit on spikes whose test densities are astronomically small wherever a
    test target differs, and sampling longer makes it worse, not better.

    - ``noise_spike_share`` (per chain; with ``x_train, y_train``): the share of training
      points and draws whose noise scale is below ``noise_floor``: 1% of the smallest gap
      between distinct training targets (the targets' resolution: a scale far below it claims
      a discrete value is exact), or 1.5 times the likelihood's ``min_scale`` where that clip is
      below a thousandth of the targets' spread (a scale at such a clip);
    - ``collapsed_chains`` (with ``reference_lppd`` and test log-likelihoods): chains whose
      test LPPD is more than ``COLLAPSED_LPPD_NATS`` below the reference's;
    - ``pareto_k`` (with test log-likelihoods): per test point, the Pareto k of the draws'
      densities :math:`p(y_n \mid \theta_s)` (ArviZ's PSIS), and ``heavy_tail_share``, the
      share of points with k above 0.7, where the mixture's density rests on a few draws;
    - ``targets``: whether the training targets are integer-valued and the share that repeat
      exactly;
    - ``degenerate``: a noise spike in any chain or a collapsed chain. Heavy tails alone do
      not count: chains in different modes give them too.
    """
    _check_degeneracy_inputs(x_train, y_train, reference_lppd)
    out = {"degenerate": False}
    chains, draws = next(iter(samples.values())).shape[:2]
    if y_train is not None:
        yt = torch.as_tensor(y_train, device=getattr(y_train, "device", "cpu")).double().reshape(len(y_train), -1)
        values = torch.unique(yt)
        gaps = values.diff()
        gap = float(gaps.min()) if gaps.numel() else 0.0
        steps = (values - values[0]) / gap if gap > 0 else values
        out["targets"] = {
            "integer_valued": bool(torch.all(yt == torch.round(yt))),
            # distinct values a whole number of the smallest gap apart: integers after z-scoring
            "lattice": bool(gap > 0 and torch.all((steps - torch.round(steps)).abs() < 1e-3)),
            "distinct": int(values.numel()),
            "repeated_share": float(1.0 - torch.unique(yt, dim=0).shape[0] / yt.shape[0]),
            "min_gap": gap,
        }
    spike = None
    if x_train is not None and y_train is not None:
        spike = _noise_spike_share(model, samples, x_train, out["targets"]["min_gap"], float(yt.std()) if yt.numel() > 1 else 1.0)
        if spike is not None:
            out["noise_spike_share"], out["noise_floor"] = spike
    if log_lik is not None:
        az = _az()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, k = az.psislw(np.moveaxis(log_lik.reshape(chains * draws, -1), 0, -1).copy())
        out["pareto_k"] = np.asarray(k)
        out["heavy_tail_share"] = float(np.mean(out["pareto_k"] > PARETO_K_BAD))
        if reference_lppd is not None:
            lppd = _logmeanexp(log_lik, axis=1).mean(-1)
            out["reference_lppd"] = float(reference_lppd)
            out["collapsed_chains"] = int(np.sum(lppd < reference_lppd - COLLAPSED_LPPD_NATS))
    spiked = spike is not None and bool(np.any(spike[0] > NOISE_SPIKE_SHARE))
    out["degenerate"] = spiked or out.get("collapsed_chains", 0) > 0
    return out


def _check_degeneracy_inputs(x_train, y_train, reference_lppd):
    if (x_train is None) != (y_train is None):
        raise ValueError("x_train and y_train go together: give both (the training data) or neither")
    if x_train is not None:
        for name, value in (("x_train", x_train), ("y_train", y_train)):
            if not isinstance(value, torch.Tensor) or value.numel() == 0:
                raise ValueError(f"{name} must be a non-empty tensor, got {type(value).__name__}"
                                 + (" of no elements" if isinstance(value, torch.Tensor) else ""))
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise ValueError(f"{name} holds NaN or infinite values")
        if x_train.shape[0] != y_train.shape[0]:
            raise ValueError(f"x_train has {x_train.shape[0]} rows and y_train {y_train.shape[0]}: they must be the same points")
    if reference_lppd is not None and not (isinstance(reference_lppd, (int, float)) and np.isfinite(reference_lppd)):
        raise ValueError(f"reference_lppd must be a finite number (a test LPPD), got {reference_lppd!r}")


def _noise_spike_share(model, samples, x_train, min_gap, spread):
    """Per chain, the share of draws and training points whose noise scale is below the floor
    (see :func:`degeneracy`), and the floor; ``None`` for a fixed noise scale."""
    from pyrobnn.models.likelihoods import GaussianLikelihood, HeteroscedasticGaussianLikelihood

    lik = model.likelihood
    chains, draws = next(iter(samples.values())).shape[:2]
    if isinstance(lik, HeteroscedasticGaussianLikelihood):
        flat = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in samples.items()}
        with torch.no_grad():
            out = _eval_outputs(model, flat, x_train.to(model.device))
        scale = lik.split(out)[1].reshape(chains, draws, -1)
        floor = 0.01 * min_gap
        if 1.5 * lik.min_scale < 1e-3 * spread:  # a clip far below the targets' spread: at it is a spike
            floor = max(floor, 1.5 * lik.min_scale)
    elif isinstance(lik, GaussianLikelihood) and lik.noise_kind == "prior":
        scale = samples[lik.noise_site].reshape(chains, draws, -1)
        floor = 0.01 * min_gap
    else:
        return None
    return (scale < floor).double().mean((1, 2)).cpu().numpy(), float(floor)


def _logmeanexp(a, axis):
    m = np.max(a, axis=axis, keepdims=True)
    return (np.log(np.mean(np.exp(a - m), axis=axis, keepdims=True)) + m).squeeze(axis)


def _verdict(out, drifting, threshold) -> str:
    chains = out["chains"]
    measured = "predictions and log density" if "rhat_log_density" in out else "predictions"
    if out.get("degenerate"):
        return _degenerate_verdict(out, drifting, threshold)
    if drifting == 0:
        text = (
            f"Each of the {chains} chains is stationary on its own: the worst within-chain R-hat on the "
            f"{measured} is {out['worst_rhat']:.3f} (at most {threshold})."
        )
        between = out.get("between_chain_rhat")
        if between is not None and between > threshold:
            text += (
                f" Across chains R-hat is {between:.2f}: the chains are each stationary but describe different "
                "regions of the posterior, and the predictive is their mixture."
            )
        return text + _heavy_tail_note(out)
    return (
        f"{drifting} of {chains} chains are not stationary yet: their within-chain R-hat on the {measured} "
        f"exceeds {threshold} (worst {out['worst_rhat']:.3f}). Their draws still depend on where they started; "
        "sample longer before reading the mixture as the posterior."
    ) + _heavy_tail_note(out)


def _heavy_tail_note(out) -> str:
    share = out.get("heavy_tail_share")
    if not share:
        return ""
    return (
        f" At {100 * share:.0f}% of the test points the mixture's predictive density rests on a few draws "
        f"(Pareto k above {PARETO_K_BAD}, worst {np.max(out['pareto_k']):.2f}): its LPPD there is noisy."
    )


def _degenerate_verdict(out, drifting, threshold) -> str:
    chains = out["chains"]
    signs = []
    if "noise_spike_share" in out and np.any(out["noise_spike_share"] > NOISE_SPIKE_SHARE):
        share = out["noise_spike_share"]
        signs.append(
            f"in {int(np.sum(share > NOISE_SPIKE_SHARE))} of {chains} chains the noise scale is below {out['noise_floor']:.2g} "
            f"at up to {100 * float(np.max(share)):.0f}% of the training points and draws"
        )
    if out.get("collapsed_chains"):
        lppd = out.get("lppd")
        worst = f" (lowest {float(np.min(lppd)):.4g})" if lppd is not None else ""
        signs.append(
            f"{out['collapsed_chains']} of {chains} chains have a test LPPD more than {COLLAPSED_LPPD_NATS:.0f} nats per point "
            f"below the reference's {out['reference_lppd']:.3f}{worst}"
        )
    if out.get("heavy_tail_share"):
        signs.append(
            f"at {100 * out['heavy_tail_share']:.0f}% of the test points the mixture's density rests on a few draws "
            f"(Pareto k above {PARETO_K_BAD}, worst {np.max(out['pareto_k']):.3g})"
        )
    targets = out.get("targets")
    cause = "an unbounded likelihood: a Gaussian's density grows without limit as its scale goes to 0"
    floor = "a tenth of the targets' resolution"
    if targets is not None and (targets["integer_valued"] or targets["lattice"] or targets["repeated_share"] > 0):
        if targets["integer_valued"]:
            what = "integer-valued"
        elif targets["lattice"]:
            what = f"discrete ({targets['distinct']} values on a lattice {targets['min_gap']:.3g} apart, as integer targets are after standardizing)"
        else:
            what = "real-valued"
        cause += (
            f", and the training targets are {what} with {100 * targets['repeated_share']:.0f}% of them repeating exactly, "
            "so the chains collapse onto spikes at repeated targets"
        )
        if targets["min_gap"] > 0:
            floor = f"min_scale={0.1 * targets['min_gap']:.2g} in these units, a tenth of the targets' resolution"
    text = (
        f"Degenerate posterior: {'; '.join(signs)}. The likely cause is {cause}. This is not a shortage of samples: "
        "sampling longer deepens the spikes, and the mixture's LPPD becomes a lottery over a few draws. Remedies: a floor "
        f"on the noise scale (HeteroscedasticGaussianLikelihood({floor})), a homoscedastic or a discrete likelihood for "
        "discrete targets, or jitter on the targets (uniform within their resolution)."
    )
    if drifting:
        text += f" ({drifting} of {chains} chains also exceed a within-chain R-hat of {threshold}, as chains sliding into spikes do.)"
    return text


def plot_diagnostics(idata, out_dir: str, prefix: str = "nuts", num_points: int = 4) -> list:
    """Trace and rank plots of the predictions at a few points and of a few weights, and a
    posterior predictive check, as PNG files; returns their paths."""
    az = _az()
    import matplotlib.pyplot as plt

    from pyrobnn.evaluation.plotting import save_figure

    os.makedirs(out_dir, exist_ok=True)
    n = idata.posterior["f"].shape[2]
    points = sorted(set(np.linspace(0, n - 1, min(num_points, n)).astype(int).tolist()))
    f_sel = {"f_dim_0": points}
    if "f_dim_1" in idata.posterior["f"].dims:
        f_sel["f_dim_1"] = [0]
    weight = next(v for v in idata.posterior.data_vars if v != "f")
    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, plot in (("trace", az.plot_trace), ("rank", az.plot_rank)):
            axes = plot(idata, var_names=["f"], coords=f_sel)
            path = os.path.join(out_dir, f"{prefix}_{kind}_predictions.png")
            save_figure(np.asarray(axes).ravel()[0].figure, path)
            paths.append(path)
        coords = {d: [0] for d in idata.posterior[weight].dims[2:]}
        axes = az.plot_trace(idata, var_names=[weight], coords=coords)
        path = os.path.join(out_dir, f"{prefix}_trace_weight.png")
        save_figure(np.asarray(axes).ravel()[0].figure, path)
        paths.append(path)
        if "observed_data" in idata.groups():
            ax = az.plot_ppc(idata, num_pp_samples=50)
            path = os.path.join(out_dir, f"{prefix}_ppc.png")
            save_figure(np.asarray(ax).ravel()[0].figure, path)
            paths.append(path)
    plt.close("all")
    return paths


def save_netcdf(idata, path: str) -> None:
    """Write ``idata`` to netCDF through a temporary file and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    try:
        idata.to_netcdf(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
