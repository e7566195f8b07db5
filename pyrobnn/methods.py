"""The method registry: one declaration per posterior method, read by the refusals, the
conformance suite (:mod:`pyrobnn.testing`), ``pyrobnn compare`` and the support table of the
documentation.

Every method is a function ``method(model, x, y, *, ...)`` that returns a result satisfying
:class:`~pyrobnn.infer.results.protocol.Result`. Its :class:`MethodSpec` says what it takes
(:class:`Support`: the likelihoods and priors it is defined for), what its arguments may be
(``constraints``, from :mod:`pyrobnn.utils.constraints`: the smallest budgets, ranges, options;
``rules`` for what one argument requires of another) and what it knows of its own use: the
options it runs with as a Bayesian-optimization surrogate (``bo_options``) and how a refit starts
from its previous result (:class:`WarmStart`). A method decorated with :func:`checked` is refused
at the call, before any work, by that declaration (:meth:`MethodSpec.check`), so that what it
refuses, the message that says so, and the table a user reads beforehand come from one
declaration and cannot drift apart.

The network is never a reason for a refusal: every method takes any ``nn.Module`` (a user's
CNN, a custom ``forward``, ``nn.Dropout``, batch normalization), evaluated as
:data:`NETWORK_EVALUATION` states.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from dataclasses import dataclass, field
from typing import Callable, Optional

from pyrobnn.utils.constraints import Budget, Constraint

__all__ = [
    "Support", "MethodSpec", "WarmStart", "UnsupportedModelError", "METHODS", "LIKELIHOODS", "PRIORS", "NETWORK_EVALUATION",
    "LATENT_ONLY", "latent_only_support", "register", "spec", "checked", "likelihood_kind", "prior_kind", "supports",
    "refuse_unsupported", "scaled_budget", "samples_cover_thinning", "CHAIN_WARM_START", "support_table",
]

#: the likelihood kinds a declaration names, with what each is
LIKELIHOODS = {
    "gaussian": "GaussianLikelihood with a fixed noise scale",
    "gaussian_prior": "GaussianLikelihood with a prior on the noise scale (a latent site)",
    "gaussian_learned": "GaussianLikelihood(scale='learned'), whose noise scale is a point parameter",
    "heteroscedastic": "HeteroscedasticGaussianLikelihood",
    "categorical": "CategoricalLikelihood (integer class labels)",
    "bernoulli": "BernoulliLikelihood (binary targets)",
    "custom": "a likelihood of the user's own (a pyrobnn Likelihood subclass)",
}

#: the prior kinds a declaration names
PRIORS = {
    "normal": "NormalPrior on every random site",
    "log_uniform": "LogUniformPrior on every random site",
    "other": "another prior on some site: ScaleMixturePrior, ARDPrior, a mix of kinds, or a prior of the user's own",
}

#: how every method that builds a potential evaluates the user's network
NETWORK_EVALUATION = (
    "in evaluation mode: dropout off, batch normalization on the running statistics the network holds when the "
    "method is called (frozen, as in a network's eval mode)"
)


class UnsupportedModelError(ValueError):
    """A method was asked for a model it is not defined for (raised before any work)."""


@dataclass(frozen=True)
class Support:
    """What a method is defined for.

    :ivar likelihoods: the :data:`LIKELIHOODS` kinds it takes (default: all).
    :ivar priors: the :data:`PRIORS` kinds it takes (default: all).
    :ivar reasons: why a kind is not taken, by kind (``"prior"``: for every prior kind not
        taken); the refusal quotes it.
    """

    likelihoods: tuple = tuple(LIKELIHOODS)
    priors: tuple = tuple(PRIORS)
    reasons: dict = field(default_factory=dict)

    def __post_init__(self):
        unknown = [k for k in self.likelihoods if k not in LIKELIHOODS] + [k for k in self.priors if k not in PRIORS]
        unknown += [k for k in self.reasons if k not in LIKELIHOODS and k not in PRIORS and k != "prior"]
        if unknown:
            raise ValueError(f"unknown kinds {unknown}: likelihoods are {list(LIKELIHOODS)}, priors {list(PRIORS)}")


#: point parameters in a likelihood (a learned noise scale) stay fixed in every method that moves
#: latent sites only: the samplers, ensembles, Laplace, SWAG and IVON
LATENT_ONLY = (
    "it moves latent sites only, and would leave a learned noise scale at its initial value: give the likelihood a "
    "fixed noise scale or a prior (GaussianLikelihood(scale=0.1) or scale=dist.LogNormal(...))"
)


def latent_only_support(**kwargs) -> Support:
    """The support of a method that moves latent sites only (every kind but a learned scale)."""
    likelihoods = kwargs.pop("likelihoods", tuple(LIKELIHOODS))
    reasons = {"gaussian_learned": LATENT_ONLY, **kwargs.pop("reasons", {})}
    return Support(likelihoods=tuple(k for k in likelihoods if k != "gaussian_learned"), reasons=reasons, **kwargs)


def scaled_budget(value, fraction: float):
    """A budget (or a tuple of them: MCLMC's phases) cut to ``fraction`` of itself, at least 1."""
    if isinstance(value, (tuple, list)):
        return type(value)(max(1, round(v * fraction)) for v in value)
    return max(1, round(value * fraction))


@dataclass(frozen=True)
class WarmStart:
    """How a refit starts from the previous result of the same method on more data (Bayesian
    optimization's refits, :mod:`pyrobnn.integrations.botorch`), declared beside the method so
    that the conformance suite catches a renamed option.

    :ivar init: the option that takes the previous result (its last draws, its members).
    :ivar count: the option set to the previous result's number of chains or members
        (``None``: none).
    :ivar scaled: the budgets cut to the refit's fraction of the cold fit's (tuning and training
        budgets: a sampler's warm-up, an ensemble's epochs), from the options or else the
        method's default.
    :ivar prepare: ``prepare(model, previous, x, y, options, fraction, seed) -> options``, first,
        for a method that needs more (a MAP trained from the previous one; a burn-in cut).
    :ivar names: the options ``prepare`` sets, for the conformance suite's check.
    """

    init: Optional[str] = "init"
    count: Optional[str] = None
    scaled: tuple = ()
    prepare: Optional[Callable] = None
    names: tuple = ()

    def option_names(self) -> set:
        """Every option this warm start sets or reads."""
        return {n for n in (self.init, self.count) if n} | set(self.scaled) | set(self.names)

    def options(self, method: "MethodSpec", model, previous, x, y, options: dict, fraction: float, seed: int) -> dict:
        """The refit's options: ``options`` started from ``previous`` with ``fraction`` of the cold
        fit's budgets (each still at least the method's smallest)."""
        warm = dict(options)
        if self.prepare is not None:
            warm = self.prepare(model, previous, x, y, warm, fraction, seed)
        if self.init:
            warm[self.init] = previous
        if self.count:
            warm[self.count] = previous.num_chains
        defaults = inspect.signature(method.run).parameters
        for name in self.scaled:
            warm[name] = scaled_budget(options.get(name, defaults[name].default), fraction)
        for name, least in method.budgets.items():  # a scaled budget stays one the method takes
            value = warm.get(name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                warm[name] = max(least, value)
        return warm


#: the warm start of the samplers whose chains go on: from the previous result's last draws, one
#: chain each, with ``fraction`` of the cold fit's warm-up
CHAIN_WARM_START = WarmStart(init="init", count="num_chains", scaled=("num_warmup",))


def samples_cover_thinning(method: str):
    """The rule of a sampler that keeps every ``thinning``-th of its ``num_samples`` steps: at
    least one draw is kept."""

    def rule(options):
        if options["num_samples"] < options["thinning"]:
            return f"{method}: num_samples ({options['num_samples']}) must be at least thinning ({options['thinning']}): no draw would be kept"
        return None

    return rule


@dataclass(frozen=True)
class MethodSpec:
    """One registered method.

    :ivar key: its name in the registry (``"nuts"``, ``"meanfield"``).
    :ivar label: a short description for tables.
    :ivar family: the :data:`~pyrobnn.infer.results.protocol.FAMILIES` key of its results.
    :ivar run: ``run(model, x, y, **options) -> Result``.
    :ivar support: what it takes (:class:`Support`).
    :ivar budgets: ``{argument: smallest accepted value}`` of its integer budgets; a call below
        is refused at once. Given here, each becomes a :class:`~pyrobnn.utils.constraints.Budget`
        among the ``constraints``; read back, it lists every budget the constraints hold.
    :ivar constraints: ``{argument: Constraint}``: what each argument may be
        (:mod:`pyrobnn.utils.constraints`), checked by :meth:`check`.
    :ivar rules: checks across arguments, ``rule(options) -> message or None``, run after the
        constraints (``num_samples`` at least ``thinning``).
    :ivar quick: options that keep a run of the conformance suite short (merged with the
        smallest budgets).
    :ivar seeded: the argument that seeds a run (every registered method has one).
    :ivar bounded_memory: whether fitting's memory grows with the batch and not with the data set
        (``False`` states where a method cannot bound it, and why: ``unbounded_because``).
    :ivar bo_options: the options it runs with as a Bayesian-optimization surrogate (small
        budgets for 10-200 points), under the user's.
    :ivar bo_limit_network: whether its default surrogate's network is the whole network of its
        calibrated infinite-width limit (the activation the fit chose and the GP's constant mean,
        :func:`~pyrobnn.integrations.infinite_width_gp.calibrated_model`'s default) or, ``False``,
        an erf network without the mean (better in regret for NUTS, MCLMC, the deep ensemble, SWAG
        and IVON; not for Laplace, whose linearized predictive at the MAP gained nothing from it
        on Ackley-10 and Levy-20; docs/bayesopt.md).
    :ivar bo_activations: the activations its default surrogate's calibration chooses among where
        that network is its limit's (``bo_limit_network``); ``None``:
        :data:`~pyrobnn.integrations.infinite_width_gp.DEFAULT_ACTIVATIONS`, erf and ReLU. NUTS
        offers the stationary cosine network too, which put it ahead of random search on every
        development problem (docs/bayesopt.md).
    :ivar warm_start: how a refit starts from its previous result (:class:`WarmStart`;
        ``None``: a refit starts cold).
    """

    key: str
    label: str
    family: str
    run: Callable
    support: Support = field(default_factory=Support)
    budgets: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)
    seeded: str = "seed"
    bounded_memory: bool = True
    unbounded_because: str = ""
    constraints: dict = field(default_factory=dict)
    rules: tuple = ()
    bo_options: dict = field(default_factory=dict)
    bo_limit_network: bool = False
    bo_activations: Optional[tuple] = None
    warm_start: Optional[WarmStart] = None

    def __post_init__(self):
        merged = {name: Budget(least) for name, least in self.budgets.items()}
        merged.update(self.constraints)
        bad = [name for name, c in merged.items() if not isinstance(c, Constraint)]
        if bad:
            raise TypeError(f"the constraints of {self.key} on {bad} are not Constraints (pyrobnn.utils.constraints)")
        object.__setattr__(self, "constraints", merged)
        object.__setattr__(self, "budgets", {name: c.least for name, c in merged.items() if c.least is not None})

    def check(self, model, options: dict) -> None:
        """Refuse, before any work, a model the method is not defined for
        (:func:`refuse_unsupported`) and any of ``options`` its constraints and rules do not
        take, naming the argument, what it must be and what it got."""
        refuse_unsupported(self.key, model)
        for name, constraint in self.constraints.items():
            if name in options:
                message = constraint.error(self.key, name, options[name])
                if message is not None:
                    raise ValueError(message)
        for rule in self.rules:
            message = rule(options)
            if message is not None:
                raise ValueError(message)

    def check_call(self, model, *args, **kwargs) -> None:
        """:meth:`check` on the options of the call ``run(model, *args, **kwargs)``, its defaults
        filled in (the options of a ``**kwargs`` parameter among them)."""
        bound = _signature(self.run).bind(model, *args, **kwargs)
        bound.apply_defaults()
        options = {}
        for name, value in list(bound.arguments.items())[1:]:
            if _signature(self.run).parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                options.update(value)
            else:
                options[name] = value
        self.check(model, options)


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


#: the registered methods, by key, in registration order
METHODS: dict = {}

#: the order in which the registry lists methods (the docs' tables, the conformance matrix), by
#: family: never the order in which their modules happen to be imported. A method not named here
#: is listed after these, in the order it registered.
ORDER = (
    "meanfield", "variational_dropout", "sparse_vd", "gaussian_dropout", "mc_dropout", "concrete_dropout", "ivon",
    "nuts", "mclmc", "pyro_nuts", "ensemble_sampling", "deep_ensemble", "laplace", "swag", "sgld", "sghmc", "smile",
)


def register(method: MethodSpec) -> MethodSpec:
    """Add ``method`` to the registry (a key registered twice is refused), in the place
    :data:`ORDER` gives it."""
    if method.key in METHODS:
        raise ValueError(f"a method with key {method.key!r} is registered already")
    METHODS[method.key] = method
    rank = {key: i for i, key in enumerate(ORDER)}
    ordered = sorted(METHODS.items(), key=lambda item: rank.get(item[0], len(ORDER)))  # stable: the rest keep their order
    METHODS.clear()
    METHODS.update(ordered)
    return method


def spec(key: str) -> MethodSpec:
    """The registered method ``key``."""
    try:
        return METHODS[key]
    except KeyError:
        raise KeyError(f"no method {key!r} is registered; registered: {sorted(METHODS)}") from None


def likelihood_kind(likelihood) -> str:
    """The :data:`LIKELIHOODS` kind of ``likelihood``."""
    from pyrobnn.models.likelihoods import BernoulliLikelihood, CategoricalLikelihood, GaussianLikelihood, HeteroscedasticGaussianLikelihood

    if isinstance(likelihood, HeteroscedasticGaussianLikelihood):
        return "heteroscedastic"
    if isinstance(likelihood, GaussianLikelihood):
        return {"fixed": "gaussian", "prior": "gaussian_prior", "learned": "gaussian_learned"}[likelihood.noise_kind]
    if isinstance(likelihood, CategoricalLikelihood):
        return "categorical"
    if isinstance(likelihood, BernoulliLikelihood):
        return "bernoulli"
    return "custom"


def prior_kind(model) -> tuple:
    """``(kind, site)``: ``"normal"`` or ``"log_uniform"`` if every random site of ``model`` has
    that prior (``site``: the first; ``None`` for a model without random sites), else ``"other"``
    with the first site whose prior differs from the first site's kind."""
    from pyrobnn.models.priors import LogUniformPrior, NormalPrior

    kinds = [("normal" if isinstance(p, NormalPrior) else "log_uniform" if isinstance(p, LogUniformPrior) else "other", s)
             for s, p in ((s, model.site_prior(s)) for s in model.sites)]
    if not kinds:
        return "normal", None
    first = kinds[0][0]
    for kind, site in kinds:
        if kind != first or kind == "other":
            return "other", site
    return first, kinds[0][1]


def supports(key: str, model) -> bool:
    """Whether the registered method ``key`` is defined for ``model``."""
    support = spec(key).support
    return likelihood_kind(model.likelihood) in support.likelihoods and prior_kind(model)[0] in support.priors


def _alternatives(kind_of, kind) -> list:
    return [k for k, m in METHODS.items() if kind in kind_of(m.support)]


def refuse_unsupported(key: str, model, what: Optional[str] = None) -> None:
    """Raise :class:`UnsupportedModelError` if the registered method ``key`` is not defined for
    ``model``, naming the method (``what``, default its key), what it lacks, why, and the
    registered methods that take the model's kind."""
    method = spec(key)
    name = what or key
    support = method.support
    kind = likelihood_kind(model.likelihood)
    if kind not in support.likelihoods:
        others = _alternatives(lambda s: s.likelihoods, kind)
        why = support.reasons.get(kind)
        raise UnsupportedModelError(
            f"{name} does not support {LIKELIHOODS[kind]}" + (f" ({why})" if why else "")
            + f". It takes {', '.join(LIKELIHOODS[k] for k in support.likelihoods)}. Methods that take this likelihood: "
            + (", ".join(others) if others else "none")
        )
    prior, site = prior_kind(model)
    if prior not in support.priors:
        others = _alternatives(lambda s: s.priors, prior)
        why = support.reasons.get(prior, support.reasons.get("prior"))
        needs = " or ".join(PRIORS[k] for k in support.priors)
        has = f"site {site.name!r} has a {type(model.site_prior(site)).__name__}"
        raise UnsupportedModelError(
            f"{name} needs {needs}; {has}" + (f" ({why})" if why else "")
            + f". Methods that take this prior: {', '.join(others) if others else 'none'}"
        )


def checked(key: str):
    """Decorate the method registered as ``key``: every call is checked by its declaration
    (:meth:`MethodSpec.check`: the model's kind, the constraints, the rules) before the method
    runs. The registration may follow the definition (it is looked up at the call)."""

    def decorate(fn):
        @functools.wraps(fn)
        def method(*args, **kwargs):
            spec(key).check_call(*args, **kwargs)
            return fn(*args, **kwargs)

        return method

    return decorate


def support_table() -> list:
    """One row per registered method: ``{"method", "label", "family", kind: bool...}`` over the
    likelihood and prior kinds, for the documentation's support table."""
    rows = []
    for key, m in METHODS.items():
        row = {"method": key, "label": m.label, "family": m.family}
        row.update({f"likelihood:{k}": k in m.support.likelihoods for k in LIKELIHOODS})
        row.update({f"prior:{k}": k in m.support.priors for k in PRIORS})
        row["budgets"] = dict(m.budgets)
        rows.append(row)
    return rows
