"""pyrobnn's surrogate in Ax (pyrobnn.integrations.ax): a Client runs Sobol then Ax's modular
BoTorch generator with a BNNSurrogate in place of the GP, and Ax's cross-validation reloads the
fitted model's state without refitting."""

import inspect
import math

import pytest

# Ax is imported in the test, not here: its import takes about 11 s, and every pytest-xdist worker
# collects every module, the default run's too, where this module's one test is deselected


def branin(x1, x2):
    return (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10


@pytest.mark.slow  # Ax's imports and a Client run: tens of seconds on a loaded machine
def test_a_client_runs_bo_with_a_bnn_surrogate_and_cross_validates():
    pytest.importorskip("ax", reason="the Ax adapter needs Ax: pip install ax-platform")
    from ax.adapter.cross_validation import cross_validate
    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig

    from pyrobnn.integrations.ax import generation_strategy, model_config
    from pyrobnn.integrations.botorch import DEFAULT_METHOD, BNNSurrogate

    for entry in (generation_strategy, model_config):  # the same default as fit_surrogate's and BNNSurrogate's
        assert inspect.signature(entry).parameters["method"].default == DEFAULT_METHOD

    client = Client(random_seed=0)
    client.configure_experiment(parameters=[RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5, 10)),
                                            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0, 15))])
    client.configure_optimization(objective="-branin")
    client.set_generation_strategy(generation_strategy(
        "deep_ensemble", initialization_budget=4, initialization_random_seed=0,
        options=dict(num_members=3, max_epochs=60), num_samples=3,
    ))
    for _ in range(6):
        for index, params in client.get_next_trials(max_trials=1).items():
            assert -5 <= params["x1"] <= 10 and 0 <= params["x2"] <= 15
            client.complete_trial(index, raw_data={"branin": branin(params["x1"], params["x2"])})
    strategy = client._generation_strategy
    assert strategy.current_node_name == "MBM"
    model = strategy.adapter.generator.surrogate.model
    assert isinstance(model, BNNSurrogate) and model.fitted and model.num_members == 3
    folds = cross_validate(strategy.adapter, folds=3)
    assert len(folds) >= 3
    assert all(math.isfinite(float(f.predicted.means[0])) for f in folds)
    best, prediction, _, _ = client.get_best_parameterization()
    assert set(best) == {"x1", "x2"}
