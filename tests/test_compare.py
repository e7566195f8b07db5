"""`pyrobnn compare` on UCI data saves each split as it completes and resumes from them."""

import json
import math
import os

import pytest

from pyrobnn.apps.compare import runner as compare


def _yacht(shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "uci", "yacht")):
        pytest.skip(f"UCI yacht not found under {shared_data_dir} (set PYROBNN_DATA)")
    return shared_data_dir


@pytest.mark.slow  # about 45-55 s: five comparisons of a UCI split (the saved-split reuse is also in the default run, below)
def test_an_interrupted_uci_comparison_resumes_from_its_saved_splits(tmp_path, shared_data_dir, monkeypatch):
    data_dir = _yacht(shared_data_dir)
    out = str(tmp_path / "cmp")
    kwargs = dict(dataset="yacht", out_dir=out, data_dir=data_dir, methods=["meanfield"], quick=True, progress=False)
    run_split = compare._run_split
    calls = []

    def interrupted(split, *args, **kw):
        calls.append(split["split"])
        if split["split"] == 1:
            raise KeyboardInterrupt
        return run_split(split, *args, **kw)

    monkeypatch.setattr(compare, "_run_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compare.run_compare(splits=[0, 1], **kwargs)
    assert calls == [0, 1]
    saved = json.load(open(os.path.join(out, "splits", "split-0.json")))
    assert not os.path.exists(os.path.join(out, "splits", "split-1.json"))

    # the rerun fits split 1 only and reports split 0 as saved
    calls.clear()
    monkeypatch.setattr(compare, "_run_split", lambda split, *a, **kw: (calls.append(split["split"]), run_split(split, *a, **kw))[1])
    rows = {r["key"]: r for r in compare.run_compare(splits=[0, 1], **kwargs)}
    assert calls == [1]
    assert rows["reference"]["splits"] == 2
    results = json.load(open(os.path.join(out, "results.json")))
    assert results["per_split"]["reference"][0]["rmse"] == saved["rows"]["reference"]["rmse"]
    # the table says how stationary the reference's chains are, each on its own, over both splits
    worst = [d["worst_rhat"] for d in results["reference_diagnostics"]]
    assert len(worst) == 2 and rows["reference"]["worst_within_chain_rhat"] == max(worst)
    assert f"worst {max(worst):.3f}" in open(os.path.join(out, "results.md")).read()

    # other settings (another seed) or more methods than were saved: the split runs again
    calls.clear()
    compare.run_compare(splits=[0], **{**kwargs, "methods": ["meanfield", "mc_dropout"]})
    assert calls == [0]
    calls.clear()
    compare.run_compare(splits=[0], seed=1, **kwargs)
    assert calls == [0]
    calls.clear()
    compare.run_compare(splits=[0], resume=False, **kwargs)
    assert calls == [0]
    calls.clear()
    compare.run_compare(splits=[0], reference="ensemble-nuts", **kwargs)
    assert calls == [0]


def test_compare_refuses_an_unknown_reference_or_method(tmp_path):
    with pytest.raises(ValueError, match="reference"):
        compare.run_compare(out_dir=str(tmp_path), reference="hmc", quick=True, progress=False)
    with pytest.raises(ValueError, match="unknown methods"):
        compare.run_compare(out_dir=str(tmp_path), methods=["hamiltonian_vi"], quick=True, progress=False)


@pytest.mark.slow  # 14-26 s: four methods after a reference; in .ci/run's -m slow
def test_compare_runs_the_baselines_built_on_the_ensemble(tmp_path):
    """Laplace, SWAG, SGLD and SGHMC on the toy problem, quick: finite scores, and the
    sample-based ones close to the ensemble they start from (W2 to the reference of the same
    order as the ensemble's)."""
    rows = compare.run_compare(out_dir=str(tmp_path), methods=["ensemble", "laplace", "swag", "sgld", "sghmc"], quick=True, progress=False)
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) >= {"reference", "ensemble", "laplace", "swag", "sgld", "sghmc"}
    for key in ("laplace", "swag", "sgld", "sghmc"):
        r = by_key[key]
        assert math.isfinite(r["rmse"]) and math.isfinite(r["log_likelihood"]), (key, r)
        assert r["w2_to_reference"] < 3 * by_key["ensemble"]["w2_to_reference"] + 0.05, (key, r)


@pytest.mark.parametrize("text, message", [
    ("x", "'x' in 'x' is not a split number"),
    ("1.5", "'1.5' in '1.5' is not a split number"),
    ("5-2", "the range '5-2' in '5-2' is empty"),
    ("0,,3", "'' in '0,,3' is not a split number"),
    ("0,0", "lists split(s) [0] more than once"),
    ("0-3,2", "lists split(s) [2] more than once"),
])
def test_cli_splits_are_refused_with_a_usage_error_naming_them(text, message, capsys):
    from pyrobnn.apps.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--splits", text])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_splits_parse_ranges_and_lists():
    from pyrobnn.apps.cli import parse_splits

    assert parse_splits("0-2,7") == [0, 1, 2, 7]


def test_compare_refuses_bad_splits_before_writing_anything(tmp_path, capsys):
    from pyrobnn.apps.cli import main

    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"lists \[0\] more than once"):
        compare.run_compare(out_dir=str(out), splits=[0, 0], quick=True, progress=False)
    with pytest.raises(ValueError, match="toy has 1 split"):
        compare.run_compare(out_dir=str(out), splits=[1], quick=True, progress=False)
    assert main(["compare", "--quick", "--methods", "bogus", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrobnn compare: error: unknown methods ['bogus']") and "Traceback" not in err
    assert not out.exists()


def test_cli_reports_an_unusable_output_path_in_one_line(tmp_path, capsys):
    from pyrobnn.apps.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["demo", "--out", str(blocker / "sub"), "--epochs", "1", "--samples", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrobnn demo: error: ") and str(blocker) in err and "Traceback" not in err


def test_compare_refuses_to_rank_against_a_degenerate_reference(tmp_path, monkeypatch, capsys):
    """A reference the diagnostics judge degenerate ranks nothing: the distances to it are n/a,
    the tables open with the warning and its verdict, and the command exits with status 3."""
    from pyrobnn.apps.cli import main
    real = compare._reference_diagnostics

    def degenerate(*args, **kwargs):
        out, idata = real(*args, **kwargs)
        return dict(out, degenerate=True, verdict="Degenerate posterior: (judged so for this test)"), idata

    monkeypatch.setattr(compare, "_reference_diagnostics", degenerate)
    out = tmp_path / "cmp"
    assert main(["compare", "--quick", "--methods", "ensemble", "--out", str(out), "--quiet"]) == 3
    captured = capsys.readouterr()
    assert "WARNING: the reference is degenerate on split(s) [0]" in captured.err
    table = (out / "results.md").read_text()
    assert table.splitlines()[2].startswith("**WARNING") and "(judged so for this test)" in table
    rows = {r["key"]: r for r in json.load(open(out / "results.json"))["summary"]}
    assert math.isnan(rows["ensemble"]["w2_to_reference"]) and "| n/a |" in table
    assert rows["reference"]["degenerate_splits"] == [0]


def test_a_saved_split_holding_a_non_number_is_named_and_run_again(tmp_path):
    cache = compare._SplitCache(str(tmp_path), {"seed": 0})
    row = {m: 1.0 for m in compare.METRICS}
    record = {"rows": {"reference": row}, "calibration": {"reference": [0.5] * len(compare.CALIBRATION_LEVELS)}, "diagnostics": None}
    cache.save(0, record)
    assert cache.load(0, ["reference"])["rows"]["reference"] == row
    path = os.path.join(str(tmp_path), "splits", "split-0.json")
    saved = json.load(open(path))
    saved["rows"]["reference"]["rmse"] = "1.0"
    json.dump(saved, open(path, "w"))
    with pytest.warns(UserWarning, match="rows\\['reference'\\]\\['rmse'\\] is '1.0', not a number"):
        assert cache.load(0, ["reference"]) is None
    saved["rows"]["reference"]["rmse"] = 1.0
    saved["calibration"]["reference"] = [0.5, None]
    json.dump(saved, open(path, "w"))
    with pytest.warns(UserWarning, match="calibration\\['reference'\\] is not 11 numbers"):
        assert cache.load(0, ["reference"]) is None
