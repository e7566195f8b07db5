"""The MNIST reproductions' --quick modes run and beat chance by a clear margin.

They need MNIST (``$PYROBNN_DATA/MNIST/raw``, default ``../shared/data``) and skip, saying so,
when it is absent. Each copies the raw files to a per-test cache, never into the data folder.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def mnist_data(shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "MNIST", "raw")):
        pytest.skip(f"MNIST not found under {shared_data_dir} (set PYROBNN_DATA to the folder holding MNIST/raw)")
    return shared_data_dir


def run_example(name, args, data, tmp_path):
    env = dict(os.environ, PYROBNN_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), "--quick", "--data", data, *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow  # 12-14 s: an MNIST example's quick mode
def test_sparse_vd_quick_prunes_and_exports(mnist_data, tmp_path):
    r = run_example("mnist_sparse_vd.py", ["--results", "results.json", "--export", "net.pt"], mnist_data, tmp_path)
    assert r["error"] < 50.0  # chance: 90% error
    assert r["exported_error"] == r["error"]  # the exported plain net is the pruned BNN
    assert r["compression"] > 5.0  # log-uniform prior + KL: most weights already have log alpha >= 3
    records = json.load(open(tmp_path / "results.json"))
    assert {(e["name"], e["metric"]) for e in records} == {("sparse VD lenet300100 (quick)", "test error %"), ("sparse VD lenet300100 (quick)", "compression")}
    assert (tmp_path / "net.pt").stat().st_size > 0


@pytest.mark.slow  # 12-14 s: an MNIST example's quick mode
def test_bbb_quick_and_snr_pruning(mnist_data, tmp_path):
    r = run_example("mnist_bbb.py", ["--validation", "1000", "--seed", "1", "--results", "results.json"], mnist_data, tmp_path)
    assert r["error"] < 30.0
    assert r["validation_images"] == 1000 and r["validation_error"] < 30.0  # held out of the 5000 training images
    records = json.load(open(tmp_path / "results.json"))
    # a second seed gets its own entries instead of replacing seed 0's (the sparse VD test checks seed 0's names)
    assert all(e["name"] == "Bayes by Backprop 2 x 400 (1000 images held out) (seed 1) (quick)" and e["seed"] == 1 for e in records)
    assert all("--validation 1000" in e["command"] and "--pi 0.5 --neg-log-sigma1 0 --neg-log-sigma2 6" in e["command"] for e in records)
    # removing half the weights by signal-to-noise hardly matters even this early
    assert r["pruning"]["0.5"] < r["error"] + 3.0


@pytest.mark.slow  # about 20 s on the loaded machine; the dropout guides' own tests are in the default run
def test_dropout_family_quick(mnist_data, tmp_path):
    r = run_example("mnist_dropout_1000.py", [], mnist_data, tmp_path)
    for name, row in r["methods"].items():
        assert row["mean_prediction"][0] > 70.0, name  # chance: 10%
        if row["mc_sampling"] is not None:
            assert row["mc_sampling"][0] > 70.0, name
    p = r["methods"]["concrete dropout"]["dropout_p"]
    assert all(0.0 < v < 1.0 for v in p.values())


@pytest.mark.slow  # about 30 s on the loaded machine; the VAE's unit tests are in test_vae.py
def test_vae_quick_beats_independent_pixels(mnist_data, tmp_path):
    r = run_example("mnist_vae.py", ["--out", "vae"], mnist_data, tmp_path)
    # independent pixels at their training frequencies give about -206 nats
    assert r["log_likelihood"] > r["independent_pixels"] + 10.0
    assert r["log_likelihood"] >= r["elbo"] - 1.0  # the IS estimate tightens the ELBO
    for png in ("reconstructions.png", "latent_2d.png"):
        assert (tmp_path / "vae" / png).stat().st_size > 5_000
