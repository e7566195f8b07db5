"""The conformance suite (pyrobnn.testing) over every registered method, and checks that its
checks can fail."""

import json
import pathlib

import pytest
import torch

import pyrobnn
from pyrobnn import methods, testing
from pyrobnn.infer.core import native


@testing.parametrize_with_checks()
def test_conformance(check):
    check()


if torch.cuda.is_available():

    @testing.parametrize_with_checks(device="cuda")
    def test_conformance_on_cuda(check):
        check()

else:  # one skip, not one per check

    @pytest.mark.skip(reason="no CUDA device: the conformance checks on CUDA run on a GPU machine (benchmarks/gpu_check.sh)")
    def test_conformance_on_cuda():
        pass


@pytest.fixture
def float64_by_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("key", list(methods.METHODS))
@pytest.mark.parametrize("case", ["targets_1d", "numpy"])
def test_a_float32_model_under_float64_as_the_default_dtype(key, case, float64_by_default):
    # the cases' models and data are float32 (NumPy's float64 for the numpy case): every tensor a
    # method makes without naming its dtype would be float64 here and meet float32 ones
    model = testing.build_case(case, key)[0]
    assert model.dtype == torch.float32
    testing.check_method(key, case, verbs=False)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(methods.METHODS))
def test_memory_grows_with_the_batch_not_the_data(key):
    testing.check_memory(key)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(methods.METHODS))
def test_the_same_call_gives_the_same_draws_in_fresh_processes_with_cold_caches(key, tmp_path):
    # the first process builds the native kernels and fills Inductor's cache, the second finds them
    env = {"PYROBNN_CACHE": str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "OMP_NUM_THREADS": "1"}
    testing.check_fresh_process(key, env=env)


def test_every_case_is_checked_and_every_method_registered_once():
    assert len(testing.CASES) >= 15 and len(set(testing.CASES)) == len(testing.CASES)
    keys = list(methods.METHODS)
    assert len(keys) == len(set(keys)) == 17
    for key, spec in methods.METHODS.items():
        assert spec.key == key and spec.family in pyrobnn.infer.results.protocol.FAMILIES
        assert spec.support.likelihoods and spec.support.priors


def _fake(run, **support):
    return methods.MethodSpec("fake", "a method under test", "mcmc", run, methods.Support(**support), budgets={"num_samples": 1},
                              quick={"num_samples": 2})


def _nuts(model, x, y, num_samples=2, seed=0):
    return pyrobnn.nuts(model, x, y, num_samples=num_samples, num_warmup=2, num_chains=1, max_tree_depth=2, seed=seed, progress=False)


def test_a_method_that_runs_where_it_declares_no_support_fails_the_refusal_check(monkeypatch):
    monkeypatch.setitem(methods.METHODS, "fake", _fake(_nuts, likelihoods=("gaussian",)))
    with pytest.raises(AssertionError, match="ran, but its declaration says it does not support"):
        testing.check_method("fake", "integer_labels")


def test_a_nondeterministic_method_fails_the_determinism_check(monkeypatch):
    calls = []

    def drifting(model, x, y, num_samples=2, seed=0):
        calls.append(1)
        return _nuts(model, x, y, num_samples, seed + len(calls))

    monkeypatch.setitem(methods.METHODS, "fake", _fake(drifting))
    with pytest.raises(AssertionError, match="gave different draws"):
        testing.check_determinism("fake")


def test_a_budget_below_the_declaration_that_runs_fails_the_budget_check(monkeypatch):
    def lenient(model, x, y, num_samples=2, seed=0):
        return _nuts(model, x, y, max(num_samples, 1), seed)

    monkeypatch.setitem(methods.METHODS, "fake", _fake(lenient))
    with pytest.raises(AssertionError, match="was not refused"):
        testing.check_budgets("fake")


def test_a_result_that_loads_differently_fails_the_contract(monkeypatch):
    from pyrobnn.infer.results.posterior import Posterior

    class Forgetful(Posterior):
        @classmethod
        def _from_saved(cls, fields, extra, model):
            fields["samples"] = {k: v + 1.0 for k, v in fields["samples"].items()}
            return cls(**fields, model=model)

    def forgetful(model, x, y, num_samples=2, seed=0):
        r = _nuts(model, x, y, num_samples, seed)
        return Forgetful(r.samples, r.stats, r.seconds, r.method, r.family, r.settings, model)

    monkeypatch.setitem(methods.METHODS, "fake", _fake(forgetful))
    with pytest.raises(AssertionError, match="predicts differently"):
        testing.check_method("fake", "targets_1d")


def test_the_memory_check_fails_where_a_pass_takes_all_the_points(monkeypatch):
    from pyrobnn.utils import memory

    monkeypatch.setattr(memory, "points_per_chunk", lambda points, *args, **kwargs: points)
    with pytest.raises(AssertionError, match="grows with the data"):
        testing.check_memory("meanfield")


def test_tensor_memory_counts_what_lives_at_once():
    x = torch.randn(1000, 100)
    with testing.TensorMemory() as whole:
        torch.tanh(x @ torch.ones(100, 100)).sum()
    with testing.TensorMemory() as chunked:
        for i in range(0, 1000, 100):
            torch.tanh(x[i : i + 100] @ torch.ones(100, 100)).sum()
    # one (1000, 100) float32 product and its tanh: 0.8 MB; in chunks of 100 a tenth, plus the ones
    assert whole.peak >= 2 * 1000 * 100 * 4
    assert chunked.peak <= 2 * 100 * 100 * 4 + 100 * 100 * 4 + 1024


def test_the_conformance_matrix_records_passes_refusals_and_failures(monkeypatch):
    def broken(model, x, y, num_samples=2, seed=0):
        methods.refuse_unsupported("fake", model)
        raise RuntimeError("broken on purpose")

    monkeypatch.setitem(methods.METHODS, "fake", _fake(broken, likelihoods=("gaussian",)))
    row = testing.conformance_matrix(["fake", "nuts"], ["targets_1d", "integer_labels", "learned_noise"])
    assert row["fake"]["targets_1d"].startswith("fails: RuntimeError")
    assert row["fake"]["integer_labels"] == "refused by design"
    assert row["nuts"] == {"targets_1d": "passes", "integer_labels": "passes", "learned_noise": "refused by design"}


def test_the_native_kernels_see_through_dropout():
    from torch import nn

    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 1))
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(0.1))
    assert native.unsupported_reason(model, torch.randn(5, 2)) is None


def test_the_documented_matrix_is_the_registry_and_the_cases():
    """docs/conformance.json (python -m pyrobnn.testing --out docs/conformance.json) lists every
    registered method on every case, each cell as the declarations say: passes where the method
    takes the case, refused by design where it does not, and no failure."""
    data = json.loads((pathlib.Path(__file__).parents[1] / "docs" / "conformance.json").read_text())
    assert list(data["matrix"]) == list(methods.METHODS)
    assert data["cases"] == {k: c.description for k, c in testing.CASES.items()}
    for key, row in data["matrix"].items():
        assert list(row) == list(testing.CASES)
        for case, cell in row.items():
            supported = methods.supports(key, testing.build_case(case, key)[0])
            assert cell == ("passes" if supported else "refused by design"), (key, case, cell)
