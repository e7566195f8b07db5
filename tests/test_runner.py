"""The one runner of the samplers (pyrobnn.infer.core.runner) on plain potentials: its state
records survive a checkpoint as they are, a run stopped anywhere resumes to the uninterrupted
draws for every kernel, and a stretch the adaptation cannot resume inside is never written."""

import math
from typing import NamedTuple

import pytest
import torch
from torch import nn

from pyrobnn.infer.core import graphs, records
from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint
from pyrobnn.infer.core.kernel import FullBatch
from pyrobnn.infer.core.runner import run_chains
from pyrobnn.infer.mcmc.mclmc_kernel import MCLMC, MCLMCAdaptation
from pyrobnn.infer.mcmc.nuts_kernel import NUTS, WindowAdaptation
from pyrobnn.testing import HostReads
from pyrobnn.utils.modes import eval_mode

SCALES = torch.linspace(0.5, 2.0, 6, dtype=torch.float64)


def gaussian(z):
    return 0.5 * ((z / SCALES) ** 2).sum(-1), z / SCALES**2


class Inner(NamedTuple):
    n: int
    mean: torch.Tensor


class Outer(NamedTuple):
    z: torch.Tensor
    inner: Inner
    positions: tuple


def test_a_record_is_its_own_checkpoint(tmp_path):
    record = Outer(torch.randn(3, 2), Inner(4, torch.arange(3.0)), (torch.ones(2), torch.zeros(2)))
    torch.save(records.to_tree(record), tmp_path / "r.pt")
    back = records.from_tree(Outer, torch.load(tmp_path / "r.pt", weights_only=True))
    assert isinstance(back.inner, Inner) and back.inner.n == 4 and isinstance(back.positions, tuple)
    assert torch.equal(back.z, record.z) and torch.equal(back.inner.mean, record.inner.mean)
    assert all(torch.equal(a, b) for a, b in zip(back.positions, record.positions))
    with pytest.raises(ValueError, match=r"a saved Inner has the fields \['mean'\], this one \['mean', 'n'\]"):
        records.from_tree(Outer, {"z": record.z, "inner": {"mean": record.inner.mean}, "positions": []})


def test_where_keeps_old_rows_per_chain():
    old, new = Inner(1, torch.zeros(3, 2)), Inner(2, torch.ones(3, 2))
    picked = records.where(torch.tensor([True, False, True]), new, old)
    assert picked.n == 2 and picked.mean[:, 0].tolist() == [1.0, 0.0, 1.0]


class Stop(Exception):
    pass


def stopping_after(evaluations):
    """``gaussian``, raising :class:`Stop` at evaluation number ``evaluations``."""
    count = [0]

    def target(z):
        count[0] += 1
        if count[0] == evaluations:
            raise Stop
        return gaussian(z)

    return target


@pytest.mark.parametrize("kernel,adaptation,thinning,stops", [
    (NUTS(4), WindowAdaptation(40), 1, (90, 400)),  # evaluations: in the warm-up, while sampling
    (MCLMC(), MCLMCAdaptation((30, 10, 10)), 3, (90, 140)),  # inside the third tuning phase, while sampling
])
def test_a_run_stopped_anywhere_resumes_to_the_uninterrupted_draws(tmp_path, kernel, adaptation, thinning, stops):
    z0 = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def run(target, checkpoint=None):
        return run_chains(kernel, adaptation, FullBatch(target), z0.clone(), num_samples=30, thinning=thinning,
                          generator=torch.Generator().manual_seed(1), checkpoint=checkpoint)

    whole = run(gaussian)
    identity = {"kernel": kernel.name}
    for stop_at in stops:
        path = tmp_path / f"run{stop_at}.ckpt"
        with pytest.raises(Stop):
            run(stopping_after(stop_at), RunCheckpoint(Checkpointing(path, every=1), kernel.name, identity))
        saved = RunCheckpoint(Checkpointing(path), kernel.name, identity)
        state = saved.load()
        assert 0 < state["iteration"] < adaptation.num_steps + 30
        assert adaptation.resumable_after(state["iteration"])
        resumed = run(gaussian, RunCheckpoint(Checkpointing(path, every=1), kernel.name, identity))
        assert torch.equal(resumed.draws, whole.draws)
        for k, v in whole.stats.items():
            assert torch.equal(torch.as_tensor(resumed.stats[k]), torch.as_tensor(v)), k
        assert resumed.kept == whole.kept


def test_mclmc_never_writes_inside_its_third_phase_and_writes_just_before_it(tmp_path):
    adaptation = MCLMCAdaptation((20, 10, 10))
    written = []

    class Recording(RunCheckpoint):
        def save(self, state, count=None):
            written.append(count)
            super().save(state, count)

    z0 = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    run_chains(MCLMC(), adaptation, FullBatch(gaussian), z0, num_samples=5, generator=torch.Generator().manual_seed(1),
               checkpoint=Recording(Checkpointing(tmp_path / "m.ckpt", every=1), "MCLMC", {}))
    assert 30 in written and not any(30 < c < 40 for c in written) and 40 in written and written[-1] == 45
    assert len(written) == len(set(written))  # each state once


def test_the_runner_refuses_a_budget_it_cannot_run():
    z0 = torch.zeros(1, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        run_chains(MCLMC(), MCLMCAdaptation((1, 1, 1)), FullBatch(gaussian), z0, num_samples=0)
    with pytest.raises(ValueError, match="thinning must be a positive integer, got 0"):
        run_chains(MCLMC(), MCLMCAdaptation((1, 1, 1)), FullBatch(gaussian), z0, num_samples=2, thinning=0)


def test_eval_mode_gives_every_submodule_its_own_mode_back():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.BatchNorm1d(2))
    net[2].eval()  # a user's choice inside a network in training mode
    with eval_mode(net, None):
        assert not any(m.training for m in net.modules())
    assert net.training and net[1].training and not net[2].training
    with pytest.raises(RuntimeError), eval_mode(net):
        raise RuntimeError
    assert net.training and not net[2].training


def test_kernels_declare_their_evaluations():
    assert NUTS(6).evaluations_per_step == 2**6 - 1 and MCLMC().evaluations_per_step == 2
    assert math.isclose(MCLMCAdaptation((40, 5, 5)).num_steps, 50)


def test_nuts_reads_the_host_at_most_twice_per_iteration_off_the_cpu_and_draws_the_same():
    # 20 dimensions with scales from 0.1 to 3: trees of 3 to 6 doublings, which differ between
    # chains and iterations. "few" is the accelerators' schedule (every leaf taken, finished
    # chains masked; the trajectory's end read from the last transition's depth on); "per_leaf"
    # the CPU's (a read per leaf and per doubling, 33 per iteration here)
    scales = torch.logspace(-1, 0.5, 20, dtype=torch.float64)

    def target(z):
        return 0.5 * ((z / scales) ** 2).sum(-1), z / scales**2

    runs, reads_of = {}, {}
    for checks in ("per_leaf", "few"):
        z0 = torch.randn(8, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        with HostReads() as reads:
            runs[checks] = run_chains(NUTS(6, host_checks=checks), WindowAdaptation(50), FullBatch(target), z0, num_samples=50,
                                      generator=torch.Generator().manual_seed(1))
        reads_of[checks] = reads.count
    assert torch.equal(runs["few"].draws, runs["per_leaf"].draws)
    assert torch.equal(runs["few"].stats["num_steps"], runs["per_leaf"].stats["num_steps"])
    # the initial step-size search reads 4 times; then at most 2 per iteration (1.7 measured)
    assert reads_of["few"] - 4 <= 2 * 100
    assert reads_of["per_leaf"] > 10 * 100  # the count sees them


def test_an_mclmc_step_recorded_and_replayed_draws_as_the_eager_one(replaying_graphs):
    # the fixed input buffers, the copies in and out and the warm-up calls of a recorded step,
    # with a stand-in graph that replays by running the function (CUDA's own is checked on a GPU)
    z0 = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    runs = {}
    for recorded in (False, True):
        runs[recorded] = run_chains(MCLMC(graphs=recorded), MCLMCAdaptation((30, 10, 10)), FullBatch(gaussian), z0.clone(), num_samples=40,
                                    generator=torch.Generator().manual_seed(1))
    assert len(replaying_graphs) == 1 and replaying_graphs[0].replays == 30 + 10 + 10 + 40 - graphs.WARMUP_CALLS
    assert torch.equal(runs[True].draws, runs[False].draws)
    for k, v in runs[False].stats.items():
        assert torch.equal(torch.as_tensor(runs[True].stats[k]), torch.as_tensor(v)), k


def test_nuts_leaves_recorded_and_replayed_draw_as_the_eager_ones(replaying_graphs):
    z0 = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    runs = {}
    for checks, recorded in (("per_leaf", False), ("few", True)):
        runs[recorded] = run_chains(NUTS(5, host_checks=checks, graphs=recorded), WindowAdaptation(30), FullBatch(gaussian), z0.clone(),
                                    num_samples=20, generator=torch.Generator().manual_seed(1))
    assert len(replaying_graphs) == 1 and replaying_graphs[0].replays > 100  # one graph for every leaf of every depth
    assert torch.equal(runs[True].draws, runs[False].draws)
    assert torch.equal(runs[True].stats["num_steps"], runs[False].stats["num_steps"])


def test_nuts_refuses_an_unknown_schedule_by_name():
    with pytest.raises(ValueError, match="host_checks must be None, 'per_leaf' or 'few', got 'sometimes'"):
        NUTS(5, host_checks="sometimes")
