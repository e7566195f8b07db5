"""The Bayesian-optimization measurement scripts run (benchmarks/bo_boundary.py,
bo_step_cost.py, bo_warm_refits.py, bo_blas_threads.py): the one-off diagnostics that
docs/bayesopt.md's sections cite, apart from the regret benchmark's own tests
(tests/test_bo_benchmarks.py) so that pytest-xdist's ``--dist loadfile`` can run the two files
on two workers; together they were the default suite's longest file."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bo_blas_threads_benchmark_fits_the_same_gp_either_way(run_command):
    """benchmarks/bo_blas_threads.py, one repeat: the batched fit with the BLAS libraries on their
    own threads and on one ends at bit-identical hyperparameters on both problems (the library's
    fits run on one thread: nothing they fit may differ for it), and both are timed."""
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "bo_blas_threads.py"), "--repeats", "1", "--torch-threads", "1"])
    report = json.loads(stdout.strip().splitlines()[-1])
    assert sorted(report["cases"]) == ["branin", "hartmann6"]
    for case in report["cases"].values():
        assert case["identical_fits"] is True
        assert case["blas_own_threads_s"] > 0 and case["blas_one_thread_s"] > 0


def test_bo_boundary_benchmark_reports_where_each_acquisition_sends_its_candidates(run_command):
    """benchmarks/bo_boundary.py --quick with a form of the Laplace surrogate added: one design of
    Hartmann-6; each record's fraction of coordinates on the boundary is the one its candidates'
    largest distances from the centre allow (a candidate with L_inf below 0.5 - 1e-3 has no
    coordinate on a bound, so the fraction is at most the share of candidates on a face), the
    posterior is read at all 2^6 corners, the objective at the recorded candidates is the recorded
    value, the batch's gain is its best value less the best of the design's outcomes (recomputed
    here from the problem) over their standard deviation, the nearest candidate's distance from the
    design's best point is the one recorded, and the summary is what the records hold."""
    import statistics

    import torch
    from torch.quasirandom import SobolEngine

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bo_problems import problem

    hartmann = problem("hartmann6")
    X = SobolEngine(6, scramble=True, seed=0).draw(12).to(torch.float64)
    Y = hartmann.f(X)
    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "bo_boundary.py"), "--quick", "--methods", "gp",
                          "infinite_width", "laplace", "laplace:last_layer"])
    report = json.loads(stdout.strip().splitlines()[-1])
    assert [r["method"] for r in report["records"]] == ["gp", "infinite_width", "laplace", "laplace:last_layer"]
    for r in report["records"]:
        on_a_face = sum(v > 0.5 - 1e-3 for v in r["l_inf"]) / len(r["l_inf"])
        assert 0.0 <= r["on_bound"] <= on_a_face <= 1.0
        assert r["improves"] == (max(r["values"]) > r["best_observed"])
        assert len(r["corner_mean"]) == len(r["corner_sd"]) == 64 and min(r["corner_sd"]) >= 0.0
        assert r["best_observed_standardized"] > 0.0  # the largest of standardized outcomes
        bound = max(m + 2 * s for m, s in zip(r["corner_mean"], r["corner_sd"]))
        assert math.isclose(r["best_observed"], float(Y.max()), rel_tol=1e-12) and math.isclose(r["observed_sd"], float(Y.std()), rel_tol=1e-12)
        gain = (max(r["values"]) - float(Y.max())) / float(Y.std())
        candidates = torch.tensor(r["candidates"], dtype=torch.float64)
        assert torch.allclose(hartmann.f(candidates).reshape(-1), torch.tensor(r["values"], dtype=torch.float64), rtol=1e-12)
        nearest = float((candidates - X[Y.reshape(-1).argmax()]).norm(dim=-1).min())
        assert math.isclose(r["from_best"], nearest, rel_tol=1e-9)
        assert (gain > 0) == r["improves"]
        assert report["summary"]["hartmann6"][r["method"]] == dict(
            on_bound=round(r["on_bound"], 3), improved=int(r["improves"]), designs=1, batch_gain=round(gain, 3), from_best=round(r["from_best"], 3),
            corner_mean_spread=round(statistics.pstdev(r["corner_mean"]), 3),
            corner_bound_over_best=round(bound - r["best_observed_standardized"], 3))


def test_bo_boundary_along_a_run_takes_that_runs_data_at_its_steps(run_command, tmp_path):
    """``--along gp --at-steps 0 2`` (quick budget: 6 Sobol points, rounds of q = 2) reads the GP's
    own run of design 0: at step 0 its data are the design's Sobol points (the best observation is
    theirs, recomputed here), at step 2 they are 10 points, the run's, whose best is at least the
    design's; each record names the run and step. ``--at-steps`` without ``--along``, a step past
    the budget and ``--n`` with ``--along`` are refused, naming the option."""
    import torch
    from torch.quasirandom import SobolEngine

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bo_problems import problem

    script = os.path.join(ROOT, "benchmarks", "bo_boundary.py")
    stdout = run_command([sys.executable, script, "--quick", "--methods", "gp", "--along", "gp", "--at-steps", "0", "2"])
    report = json.loads(stdout.strip().splitlines()[-1])
    design = problem("hartmann6").f(SobolEngine(6, scramble=True, seed=0).draw(6).to(torch.float64))
    first, later = report["records"]
    assert (first["at_step"], first["n"], later["at_step"], later["n"]) == (0, 6, 2, 10)
    assert first["along"] == later["along"] == "gp" and report["settings"]["at_steps"] == [0, 2]
    assert math.isclose(first["best_observed"], float(design.max()), rel_tol=1e-12)
    assert later["best_observed"] >= first["best_observed"]
    quick = [sys.executable, script, "--quick", "--methods", "gp"]
    for extra, message in ((["--at-steps", "1"], "--at-steps is for --along"),
                           (["--along", "gp", "--at-steps", "8"], "--at-steps must lie in 0..7"),
                           (["--along", "gp", "--n", "10"], "--n sets the Sobol designs' size")):
        refused = subprocess.run(quick + extra, cwd=tmp_path, capture_output=True, text=True)
        assert refused.returncode != 0 and message in refused.stderr, (extra, refused.stderr[-300:])


def test_bo_step_cost_benchmark_times_every_surrogate_beside_the_gp(run_command):
    """benchmarks/bo_step_cost.py --quick: Branin, 3 steps; each surrogate's ratio is its median
    fit plus median acquisition over the GP's, from the times it records, and the worst problem's
    ratio is the one the bound is checked on."""
    import statistics

    stdout = run_command([sys.executable, os.path.join(ROOT, "benchmarks", "bo_step_cost.py"), "--quick"])
    report = json.loads(stdout.strip().splitlines()[-1])
    (record,) = report["records"]
    times = record["times"]
    assert sorted(times) == ["gp", "infinite_width", "laplace"]
    assert all(t["n"] == [6, 8, 10] and len(t["fit"]) == len(t["acquisition"]) == 3 for t in times.values())
    gp = statistics.median(times["gp"]["fit"]) + statistics.median(times["gp"]["acquisition"])
    for m in ("infinite_width", "laplace"):
        ratio = (statistics.median(times[m]["fit"]) + statistics.median(times[m]["acquisition"])) / gp
        assert report["summary"]["branin"][0][m]["ratio_to_gp"] == pytest.approx(ratio, abs=1e-3)
        assert report["worst"][m]["problem"] == "branin" and report["worst"][m]["within_bound"] == (report["worst"][m]["ratio"] <= 3)
    for m, t in times.items():  # the optimizer's evaluations and restarts, per step and summarized
        assert len(t["evaluations"]) == len(t["retried"]) == 3 and all(e >= 1 for e in t["evaluations"])
        assert report["summary"]["branin"][0][m]["evaluations"] == statistics.median(t["evaluations"])
        assert report["summary"]["branin"][0][m]["retried_steps"] == sum(t["retried"])


def test_bo_warm_refits_benchmark_pairs_each_variant_with_the_registered_warm_start(run_command):
    """benchmarks/bo_warm_refits.py --quick with two refits: one shared cold fit, then each
    variant's refits on the same points; the carried variant runs the warm-up it names, the
    registered restart a quarter of the cold one, depth:2 trees of at most 3 leapfrog steps and
    samples:8 eight draws per chain (the quick budget's 16 members); the summary pairs each variant's NLL with the restart's at the
    same n, and a run without the restart to pair with is refused. Erf and ReLU offered (``--activations``): these data keep the
    cold fit's activation at both refits, so that every refit is warm (with NUTS's cosine network offered too, a refit's data
    choose another and it starts cold)."""
    script = os.path.join(ROOT, "benchmarks", "bo_warm_refits.py")
    stdout = run_command([sys.executable, script, "--quick", "--refits", "2", "--variants", "restart", "carried:5", "depth:2", "samples:8",
                          "--activations", "erf", "relu"])
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["settings"]["activations"] == ["erf", "relu"]
    records = report["records"]
    assert [r["variant"] for r in records if r["n"] == 6] == ["cold"]
    for variant, warmup in (("restart", 25), ("carried:5", 5), ("depth:2", 25), ("samples:8", 25)):  # the quick budget's cold warm-up is 100
        rows = [r for r in records if r["variant"] == variant]
        assert [r["n"] for r in rows] == [8, 10] and {r["warmup"] for r in rows} == {warmup}
    assert all(r["leapfrogs"] <= 3 for r in records if r["variant"] == "depth:2")
    assert max(r["leapfrogs"] for r in records if r["variant"] == "restart") > 3
    assert {r["draws"] for r in records if r["variant"] == "samples:8"} == {8} and {r["draws"] for r in records if r["variant"] == "restart"} == {16}
    by = {(r["variant"], r["n"]): r["nll"] for r in records}
    paired = [by["carried:5", n] - by["restart", n] for n in (8, 10)]
    assert report["summary"]["carried:5"]["nll_below_restart"] == sum(d < 0 for d in paired)
    refused = subprocess.run([sys.executable, script, "--quick", "--variants", "carried:5"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--variants must include restart" in refused.stderr
    refused = subprocess.run([sys.executable, script, "--quick", "--method", "mclmc", "--variants", "restart", "carried:5"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown variant 'carried:5' of mclmc" in refused.stderr
    refused = subprocess.run([sys.executable, script, "--quick", "--variants", "restart", "depth:0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown variant 'depth:0' of nuts" in refused.stderr


def test_bo_warm_refits_benchmark_compares_mclmcs_registered_warm_start_with_the_restarted_tuning(run_command):
    """--method mclmc: the registered refit tunes a fortieth of the cold fit's first phase and a
    quarter of the others (the quick budget's cold tuning is (400, 100, 100)), from the step size
    and L each chain ended at; tuning:0.25 is the restarted tuning it replaced."""
    script = os.path.join(ROOT, "benchmarks", "bo_warm_refits.py")
    stdout = run_command([sys.executable, script, "--quick", "--method", "mclmc", "--refits", "1", "--variants", "restart", "tuning:0.25"])
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["settings"]["method"] == "mclmc"
    warmups = {r["variant"]: r["warmup"] for r in report["records"]}
    assert warmups == {"cold": [400, 100, 100], "restart": [10, 25, 25], "tuning:0.25": [100, 25, 25]}
    assert all("L" in r and "leapfrogs" not in r for r in report["records"])
