"""The command line and the examples run, and their results beat trivial baselines."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, tmp_path):
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_demo_command(tmp_path):
    stdout = run([sys.executable, "-m", "pyrobnn.cli", "demo", "--out", "demo", "--epochs", "400", "--samples", "100", "--quiet"], tmp_path)
    rows = json.load(open(tmp_path / "demo" / "results.json"))
    assert [r["method"] for r in rows] == ["mean-field (Bayes by Backprop)", "variational dropout"]
    for r in rows:
        assert (tmp_path / "demo" / r["plot"]).stat().st_size > 10_000
        # y spans about 1.0 with sd 0.25; predicting its mean would give RMSE ~0.25
        assert r["rmse"] < 0.15
        assert 0 <= r["coverage_90"] <= 1
        assert r["method"] in stdout
    assert "| test RMSE |" in stdout


def test_regression_example(tmp_path):
    stdout = run([sys.executable, os.path.join(ROOT, "examples", "regression.py"), "--quick", "--out", "r.png"], tmp_path)
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert result["rmse"] < 0.5  # the targets have sd 0.77
    assert (tmp_path / "r.png").exists()


def test_classification_example(tmp_path):
    stdout = run([sys.executable, os.path.join(ROOT, "examples", "classification.py"), "--quick", "--out", "c.png"], tmp_path)
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert result["accuracy"] > 0.85  # chance is 0.5
    assert (tmp_path / "c.png").exists()
