"""Long runs checkpoint when asked, and a run killed part way resumes to the uninterrupted result,
bit for bit."""

import math
import os
import subprocess
import sys
import time

import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.infer.core.checkpoints import RunCheckpoint


def _model():
    torch.manual_seed(0)
    return pyrobnn.BayesianModel(
        pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.1), 0.5)), pyrobnn.NormalPrior(1.0)
    )


def _data(n=24):
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


RUNS = {
    "nuts": lambda m, x, y, **kw: pyrobnn.nuts(m, x, y, num_samples=12, num_warmup=20, num_chains=2, max_tree_depth=4, backend="eager", **kw),
    # the tuning phases, the preconditioner's re-tuning and phase 3 all run before the first draw
    "mclmc": lambda m, x, y, **kw: pyrobnn.mclmc(
        m, x, y, num_samples=40, num_warmup=(30, 12, 10), num_chains=2, thinning=4, diagonal_preconditioning=True, backend="eager", **kw
    ),
    "ensemble": lambda m, x, y, **kw: pyrobnn.deep_ensemble(m, x, y, num_members=2, max_epochs=12, batch_size=8, validation=0.25, **kw),
    "swag": lambda m, x, y, **kw: pyrobnn.swag(
        m, x, y, num_epochs=8, batch_size=8, rank=3, num_samples=10, map_options={"max_epochs": 6}, **kw
    ),
    "sgld": lambda m, x, y, **kw: pyrobnn.sgld(m, x, y, num_steps=40, thinning=3, batch_size=8, num_chains=2, step_size=1e-3, **kw),
    "sghmc": lambda m, x, y, **kw: pyrobnn.sghmc(m, x, y, num_steps=40, thinning=3, batch_size=8, num_chains=2, step_size=1e-4, **kw),
    # tuning and sampling both run across the checkpoints, with an added velocity refresh
    "smile": lambda m, x, y, **kw: pyrobnn.smile(m, x, y, num_samples=24, num_warmup=16, thinning=3, batch_size=8, num_chains=2, L=1.0, **kw),
}


class Killed(BaseException):
    """What a kill leaves: the process's memory is gone, its checkpoint file stays."""


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(name, tmp_path, monkeypatch):
    x, y = _data()
    run = RUNS[name]
    whole = run(_model(), x, y, progress=False)
    path = tmp_path / f"{name}.ckpt"
    writes = []
    real_save = RunCheckpoint.save

    def save_then_die(self, state, count=None):
        real_save(self, state, count)
        writes.append(self.path)
        if len(writes) == 2:
            raise Killed

    monkeypatch.setattr(RunCheckpoint, "save", save_then_die)
    with pytest.raises(Killed):
        run(_model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=3))
    monkeypatch.setattr(RunCheckpoint, "save", real_save)
    resumed = run(_model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=3))
    for k, v in whole.samples.items():
        torch.testing.assert_close(resumed.samples[k], v, rtol=0, atol=0)
    for k, v in whole.stats.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(resumed.stats[k], v, rtol=0, atol=0)
    # the finished run's file gives the result again without running
    again = run(_model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=3))
    for k, v in whole.samples.items():
        torch.testing.assert_close(again.samples[k], v, rtol=0, atol=0)
    # the same file for a run with other settings is refused by name, and left as it was
    before = os.path.getmtime(path)
    with pytest.raises(ValueError, match="was written by another .* run: seed is 0 there and 1 here"):
        run(_model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=3), seed=1)
    assert os.path.getmtime(path) == before


def test_a_checkpoint_of_other_data_or_another_kind_is_refused(tmp_path):
    x, y = _data()
    path = tmp_path / "run.ckpt"
    RUNS["sgld"](_model(), x, y, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="another SGLD run: the training data differ"):
        RUNS["sgld"](_model(), x, y + 1, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="holds a SGLD run, not a SGHMC run"):
        RUNS["sghmc"](_model(), x, y, progress=False, checkpoint=path)
    (tmp_path / "other.ckpt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupted or not a pyrobnn file"):
        RUNS["sgld"](_model(), x, y, progress=False, checkpoint=tmp_path / "other.ckpt")


SCRIPT = """
import math, sys, torch, pyro.distributions as dist, pyrobnn
torch.set_num_threads(1)
torch.manual_seed(0)
model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.1), 0.5)), pyrobnn.NormalPrior(1.0))
x = torch.linspace(-1, 1, 24).unsqueeze(-1)
y = torch.sin(2 * x) + 0.1 * torch.randn(24, 1, generator=torch.Generator().manual_seed(1))
pyrobnn.nuts(model, x, y, num_samples=150, num_warmup=50, num_chains=2, max_tree_depth=4, backend="eager", progress=False, checkpoint=pyrobnn.Checkpointing(sys.argv[1], every=1))
"""


@pytest.mark.slow  # 30 s; the fault suite's signal cases (tests/faults) run by default
def test_nuts_killed_by_a_signal_resumes_to_the_uninterrupted_draws(tmp_path):
    path = tmp_path / "nuts.ckpt"
    log = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(path)], stderr=log)
    try:
        deadline = time.monotonic() + 600
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # a few more transitions, so the kill lands at an arbitrary point
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert path.exists(), (tmp_path / "stderr.txt").read_text()[-2000:]
    saved = torch.load(path, weights_only=True)["state"]["iteration"]
    assert 0 < saved < 200, saved
    x, y = _data()
    kw = dict(num_samples=150, num_warmup=50, num_chains=2, max_tree_depth=4, backend="eager", progress=False)
    whole = pyrobnn.nuts(_model(), x, y, **kw)
    resumed = pyrobnn.nuts(_model(), x, y, checkpoint=pyrobnn.Checkpointing(path, every=5), **kw)
    for k, v in whole.samples.items():
        torch.testing.assert_close(resumed.samples[k], v, rtol=0, atol=0)


@pytest.mark.slow  # 20 s: two spawned processes
def test_members_in_two_processes_checkpoint_a_file_each_and_resume(tmp_path):
    x, y = _data()
    kw = dict(num_members=2, max_epochs=6, batch_size=8, progress=False, num_processes=2)
    path = tmp_path / "ensemble.ckpt"
    first = pyrobnn.deep_ensemble(_model(), x, y, checkpoint=path, **kw)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["ensemble.ckpt.group0-of-2", "ensemble.ckpt.group1-of-2"]
    again = pyrobnn.deep_ensemble(_model(), x, y, checkpoint=path, **kw)  # both groups finished: read back
    for k, v in first.samples.items():
        torch.testing.assert_close(again.samples[k], v, rtol=0, atol=0)
