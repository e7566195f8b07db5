"""pyrobnn's surrogates in Ax: a BNN posterior as the model of Ax's modular BoTorch generator.

Ax builds the model of a Bayesian-optimization step from a ``ModelConfig``: it calls the model
class's ``construct_inputs`` on the experiment's data (BoTorch's own, which gives ``train_X`` and
``train_Y``), adds the input transform (``Normalize`` to the search space's bounds, by default)
and the ``model_options``, constructs the model and fits it with the function registered for its
class in ``fit_botorch_model``. This module registers :meth:`BNNSurrogate.fit
<pyrobnn.integrations.botorch.BNNSurrogate.fit>` there, so a
:class:`~pyrobnn.integrations.botorch.BNNSurrogate` runs wherever Ax runs a GP:

.. code-block:: python

    from ax.api.client import Client
    from pyrobnn.integrations.ax import generation_strategy

    client = Client()
    client.configure_experiment(parameters=[...])
    client.configure_optimization(objective="-loss")
    client.set_generation_strategy(generation_strategy("nuts", initialization_budget=8))

The members are buffers, so Ax's cross-validation (which reloads a fitted model's
``state_dict`` into a new model for each fold, without refitting) predicts with the fitted
posterior.

This module needs Ax: ``pip install ax-platform``.
"""

from __future__ import annotations

try:
    from ax.api.utils.generation_strategy_dispatch import choose_generation_strategy
    from ax.api.utils.structs import GenerationStrategyDispatchStruct
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model
except ImportError as error:  # pragma: no cover - Ax is not installed
    raise ImportError("pyrobnn.integrations.ax needs Ax: pip install ax-platform") from error

from pyrobnn.integrations.botorch import DEFAULT_METHOD, BNNSurrogate

__all__ = ["model_config", "generation_strategy"]


@fit_botorch_model.register(BNNSurrogate)
def _fit_bnn_surrogate(model: BNNSurrogate, mll_class=None, mll_options=None) -> None:
    """Ax's fit step for a :class:`BNNSurrogate`: the method's run (there is no marginal
    likelihood to hand ``mll_class``; it is ignored)."""
    model.fit()


def model_config(method: str = DEFAULT_METHOD, *, name: str | None = None, **surrogate_options) -> ModelConfig:
    """An Ax ``ModelConfig`` whose model is a :class:`BNNSurrogate` fitted by ``method``;
    ``surrogate_options`` are :class:`BNNSurrogate`'s keywords (``options``, ``num_samples``,
    ``seed``, ``model``, ``warm_fraction``, ``outcome_transform``)."""
    return ModelConfig(
        botorch_model_class=BNNSurrogate, model_options=dict(surrogate_options, method=method), name=name or f"pyrobnn {method}",
    )


def generation_strategy(method: str = DEFAULT_METHOD, *, initialization_budget: int | None = None,
                        initialization_random_seed: int | None = None, **surrogate_options):
    """Ax's default generation strategy (Sobol initialization, then its modular BoTorch
    generator with qLogNEI) with a pyrobnn surrogate in place of the GP."""
    struct = GenerationStrategyDispatchStruct(
        method="custom", initialization_budget=initialization_budget, initialization_random_seed=initialization_random_seed,
    )
    return choose_generation_strategy(struct=struct, model_config=model_config(method, **surrogate_options))
