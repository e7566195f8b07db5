"""The command line and the examples run, and their results beat trivial baselines."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_command(tmp_path, run_command):
    stdout = run_command([sys.executable, "-m", "pyrobnn.apps.cli", "demo", "--out", "demo", "--epochs", "400", "--samples", "100", "--quiet"])
    rows = json.load(open(tmp_path / "demo" / "results.json"))
    assert [r["method"] for r in rows] == ["mean-field (Bayes by Backprop)", "variational dropout"]
    for r in rows:
        assert (tmp_path / "demo" / r["plot"]).stat().st_size > 10_000
        # y spans about 1.0 with sd 0.25; predicting its mean would give RMSE ~0.25
        assert r["rmse"] < 0.15
        assert 0 <= r["coverage_90"] <= 1
        assert r["method"] in stdout
    assert "| test RMSE |" in stdout


@pytest.mark.slow  # 11 s: an example script's quick mode (the demo and the compare CLI stay in the default run)
def test_regression_example(tmp_path, run_command):
    stdout = run_command([sys.executable, os.path.join(ROOT, "examples", "regression.py"), "--quick", "--out", "r.png"])
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert result["rmse"] < 0.5  # the targets have sd 0.77
    assert (tmp_path / "r.png").exists()


@pytest.mark.slow  # 11 s: an example script's quick mode (the demo and the compare CLI stay in the default run)
def test_classification_example(tmp_path, run_command):
    stdout = run_command([sys.executable, os.path.join(ROOT, "examples", "classification.py"), "--quick", "--out", "c.png"])
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert result["accuracy"] > 0.85  # chance is 0.5
    assert (tmp_path / "c.png").exists()


@pytest.mark.slow  # about 35 s: every method on the toy data (the UCI split and the example run compare in the default run)
def test_compare_quick_on_the_toy_data(tmp_path, run_command):
    stdout = run_command([sys.executable, "-m", "pyrobnn.apps.cli", "compare", "--quick", "--out", "cmp", "--quiet"])
    out = tmp_path / "cmp"
    for name in ("results.md", "results.csv", "results.json", "predictive_bands.png", "calibration.png", "reference_trace_predictions.png", "reference_rank_predictions.png", "reference_ppc.png", "reference.nc"):
        assert (out / name).stat().st_size > 0, name
    results = json.load(open(out / "results.json"))
    rows = {r["key"]: r for r in results["summary"]}
    assert set(rows) == {"reference", "ensemble", "laplace", "swag", "sgld", "sghmc", "smile", "ivon", "meanfield", "meanfield_mixture",
                         "variational_dropout", "sparse_vd", "mc_dropout", "concrete_dropout"}
    assert rows["reference"]["w2_to_reference"] == 0.0
    # the targets have sd 0.77; even the short runs must do better than predicting the mean
    assert rows["reference"]["rmse"] < 0.3 and rows["ensemble"]["rmse"] < 0.3
    assert all(0 <= r["coverage_90"] <= 1 and r["w2_to_reference"] >= 0 for r in rows.values())
    # the reference is ensemble-initialized MCLMC, judged chain by chain; the text claims no cause it did not check
    assert "DE-initialized MCLMC (reference)" in stdout and "within-chain R-hat" in stdout
    assert rows["reference"]["chains_total"] == 2 and "mode" not in stdout.lower()


@pytest.mark.slow  # 16-31 s: NUTS's reference on a UCI split; in .ci/run's -m slow (tests/test_compare.py keeps the command's other paths)
def test_compare_quick_on_a_uci_split(tmp_path, shared_data_dir, run_command):
    if not os.path.isdir(os.path.join(shared_data_dir, "uci", "yacht")):
        pytest.skip(f"UCI yacht not found under {shared_data_dir} (set PYROBNN_DATA)")
    run_command([sys.executable, "-m", "pyrobnn.apps.cli", "compare", "--quick", "--dataset", "yacht", "--data-dir", shared_data_dir,
                 "--splits", "0", "--methods", "meanfield", "--reference", "nuts", "--out", "cmp", "--quiet"])
    results = json.load(open(tmp_path / "cmp" / "results.json"))
    rows = {r["key"]: r for r in results["summary"]}
    assert set(rows) == {"reference", "meanfield"}
    assert rows["reference"]["method"] == "NUTS from random starts (reference)"
    # yacht's residuary resistance has sd ~15 in original units
    assert rows["reference"]["rmse"] < 10
    assert "Published" in open(tmp_path / "cmp" / "results.md").read()


@pytest.mark.slow  # about 20-30 s: NUTS and VI on the toy data (the CLI's compare on a UCI split stays in the default run)
def test_compare_example(tmp_path, run_command):
    stdout = run_command([sys.executable, os.path.join(ROOT, "examples", "compare_hmc_vi.py"), "--quick", "--out", "c.png"])
    assert "NUTS convergence" in stdout and (tmp_path / "c.png").exists()
    block = stdout[stdout.index("{\n"): stdout.rindex("}") + 1]
    results = json.loads(block)
    assert results["NUTS"]["rmse"] < 0.3 and results["NUTS"]["w2_to_nuts"] == 0.0


@pytest.mark.slow
def test_uci_sampling_benchmark_quick(tmp_path, shared_data_dir, run_command):
    """The MILE-protocol benchmark's --quick mode (BlackJAX and NumPyro are in the optional bench
    extra, so they are left out here): sampling from the ensemble beats the ensemble, and the
    last line is the JSON summary with the within-chain diagnostics."""
    if not os.path.isdir(os.path.join(shared_data_dir, "uci", "yacht")):
        pytest.skip(f"UCI yacht not found under {shared_data_dir} (set PYROBNN_DATA)")
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "uci_sampling.py"), "--quick", "--data-dir", shared_data_dir,
                          "--out", "records", "--skip-blackjax", "--skip-numpyro"])
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["yacht/MCLMC/lppd"] > summary["yacht/DE/lppd"] and summary["yacht/NUTS/lppd"] > summary["yacht/DE/lppd"]
    assert summary["mclmc_worst_within_chain_rhat"] >= 1.0 and "nuts_vs_mclmc_time" in summary
    # --quick runs twice, with empty kernel caches and then with the first run's
    assert "nuts_vs_mclmc_time_cold" in summary
    for name in ("cold", "warm"):
        assert (tmp_path / "records" / name / "yacht-1-quick.json").exists()


@pytest.mark.slow
def test_mnist_uncertainty_benchmark_quick(tmp_path, shared_data_dir, run_command):
    """Every posterior approximation on LeNet-300-100 (2,000 training images): finite metrics,
    better than chance, temperature scaling no worse than the MAP in NLL on the same
    predictions, and the reliability diagram written."""
    if not os.path.isdir(os.path.join(shared_data_dir, "MNIST", "raw")):
        pytest.skip(f"MNIST not found under {shared_data_dir} (set PYROBNN_DATA)")
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "mnist_uncertainty.py"), "--quick", "--data-dir", shared_data_dir,
                          "--out", "mnist"])
    summary = json.loads(stdout.strip().splitlines()[-1])
    errors = {k: v for k, v in summary.items() if k.endswith("/error")}
    assert len(errors) == 12 and all(v < 50 for v in errors.values()), errors
    assert summary["MAP + temperature scaling/nll"] <= summary["MAP/nll"] + 1e-6
    assert (tmp_path / "mnist" / "reliability.png").stat().st_size > 10_000


@pytest.mark.slow
def test_user_networks_benchmark_quick(tmp_path, shared_data_dir, run_command):
    """The users'-networks benchmark in its tiny setting, on one CNN and two methods: every
    rate and peak is a positive finite figure, and the JSON names the path each method ran."""
    run_command([sys.executable, os.path.join(ROOT, "benchmarks", "user_networks.py"), "--quick", "--networks", "cnn_batchnorm",
                 "--methods", "mclmc,ivon", "--data-dir", shared_data_dir, "--out", "u.json"])
    figures = json.load(open(tmp_path / "u.json"))["cnn_batchnorm"]
    for method in ("mclmc", "ivon"):
        row = figures["methods"][method]
        for name in ("ratio_to_torch_func", "predict_ratio_to_inference", "peak_rss_mib", "cold_seconds"):
            assert 0 < row[name] < float("inf"), (method, name, row[name])
    assert figures["methods"]["mclmc"]["path"] in ("native", "torch.compile", "eager")
    assert figures["auto_step"]["seconds"] > 0


@pytest.mark.slow  # two codes' kernels built into a fresh worktree's cache: in .ci/run's -m slow
def test_sampler_steps_benchmark_times_both_codes(run_command):
    """benchmarks/sampler_steps.py, cut to 400 MCLMC steps and two rounds, against HEAD: every
    figure is a positive time per chain and step for both codes and both samplers (a figure is a
    difference of two runs' times, which a few steps beside other work can turn negative: 60
    steps in one round failed this once), and the temporary worktree is removed."""
    import subprocess

    before = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "sampler_steps.py"), "--steps", "400", "--rounds", "2",
                          "--against", "HEAD"])
    figures = json.loads(stdout.strip().splitlines()[-1])["us_per_chain_step"]
    assert len(figures) == 8 and all(0 < v < float("inf") for v in figures.values()), figures
    assert {k.split(" | ")[0] for k in figures} == {"today", "HEAD"}
    assert subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout == before


@pytest.mark.slow  # 30-45 s (the host-read count runs NUTS under a dispatch mode): in .ci/run's -m slow
def test_gpu_benchmark_runs_on_the_cpu(tmp_path, run_command):
    """benchmarks/gpu.py in its smoke setting on the CPU (GPU machines are lent by chance, so the
    script must not rot between them): every timing is a positive figure, the recorded SVI step
    says why it is not recorded here, and the last line is the JSON report."""
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--smoke", "--device", "cpu", "--no-reference"])
    report = json.loads(stdout.strip().splitlines()[-1])
    svi = report["svi"]
    for name in ("plain", "handwritten_bbb", "pyrobnn_meanfield", "pyrobnn_meanfield_eager", "pyrobnn_lrt", "pyrobnn_flipout"):
        assert 0 < svi["ms_per_step"][name] < float("inf"), name
    assert svi["capture"]["pyrobnn_meanfield"].startswith("not recorded: CUDA graphs need a CUDA device")
    nuts = report["samplers"]["nuts"]
    assert nuts["pyrobnn"]["min_ess"] > 0 and nuts["chains_scaling"]["time_ratio"] > 0
    assert report["samplers"]["mclmc"]["pyrobnn"]["steps_per_s"] > 0
    assert report["versions"]["torch"] == __import__("torch").__version__
