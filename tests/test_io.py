"""Saving and loading: round trips, refusal of code-carrying files, atomic writes."""

import os
import pickle
import stat
import subprocess
import sys
import time

import pytest
import torch

import pyrobnn
from pyrobnn.utils.io import atomic_save


def make(seed):
    torch.manual_seed(seed)
    model = pyrobnn.BayesianModel(
        pyrobnn.MLP(2, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale="learned"), pyrobnn.LogUniformPrior()
    )
    return model, pyrobnn.VariationalDropout(model, alpha="unit")


def test_round_trip_gives_identical_predictions(tmp_path):
    model, guide = make(0)
    x = torch.randn(30, 2)
    y = x.sum(-1, keepdim=True)
    pyrobnn.fit(model, guide, x, y, epochs=20, lr=0.02, progress=False)
    path = tmp_path / "bnn.pt"
    pyrobnn.save(path, model, guide, metadata={"epochs": 20, "note": "toy"})
    before = pyrobnn.predict(model, guide, x, 50, seed=7)

    fresh_model, fresh_guide = make(1)
    assert not torch.equal(pyrobnn.predict(fresh_model, fresh_guide, x, 50, seed=7).loc_samples, before.loc_samples)
    metadata = pyrobnn.load(path, fresh_model, fresh_guide)
    assert metadata == {"epochs": 20, "note": "toy"}
    after = pyrobnn.predict(fresh_model, fresh_guide, x, 50, seed=7)
    assert torch.equal(after.loc_samples, before.loc_samples)
    assert torch.equal(after.scale_samples, before.scale_samples)


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_file_that_would_execute_code_is_refused(tmp_path):
    marker = tmp_path / "executed"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"format": "pyrobnn", "version": 1, "payload": _RunsCode(str(marker))}, f, protocol=2)
    model, guide = make(0)
    with pytest.raises(ValueError, match="refusing to load"):
        pyrobnn.load(path, model, guide)
    assert not marker.exists()
    # the same through torch.save
    torch.save({"format": "pyrobnn", "payload": _RunsCode(str(marker))}, path)
    with pytest.raises(ValueError, match="refusing to load"):
        pyrobnn.load(path, model, guide)
    assert not marker.exists()


def test_loading_into_a_different_architecture_fails_clearly(tmp_path):
    model, guide = make(0)
    path = tmp_path / "bnn.pt"
    pyrobnn.save(path, model, guide)
    other = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(9,)), pyrobnn.GaussianLikelihood(scale="learned"), pyrobnn.LogUniformPrior())
    with pytest.raises(ValueError, match="weight sites"):
        pyrobnn.load(path, other, pyrobnn.VariationalDropout(other, alpha="unit"))
    with pytest.raises(ValueError, match="guide of type VariationalDropout, not MeanFieldNormal"):
        pyrobnn.load(path, model, pyrobnn.MeanFieldNormal(model))
    with pytest.raises(FileNotFoundError):
        pyrobnn.load(tmp_path / "missing.pt", model, guide)
    torch.save({"something": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a pyrobnn file"):
        pyrobnn.load(tmp_path / "other.pt", model, guide)


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    atomic_save({"a": torch.ones(3)}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"a": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["state.pt"]


def test_empty_truncated_or_foreign_files_are_reported_as_corrupted_with_the_path(tmp_path):
    model, guide = make(0)
    good = tmp_path / "good.pt"
    pyrobnn.save(good, model, guide)
    data = good.read_bytes()
    cases = {"empty.pt": b"", "truncated.pt": data[: len(data) // 2], "text.pt": b"hello world"}
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=rf"{path} is corrupted or not a pyrobnn file"):
            pyrobnn.load(path, model, guide)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_users_umask(tmp_path, umask, expected):
    from pyrobnn.utils.io import atomic_write_text

    old = os.umask(umask)
    try:
        atomic_write_text("x", tmp_path / "f.txt")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f.txt").st_mode) == expected


def test_stale_temporaries_of_killed_saves_are_removed(tmp_path):
    from pyrobnn.utils.io import STALE_SECONDS, TMP_PREFIX, atomic_write_text

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = tmp_path / f"{TMP_PREFIX}{dead.pid}-abc"
    fresh = tmp_path / f"{TMP_PREFIX}{dead.pid}-def"
    mine = tmp_path / f"{TMP_PREFIX}{os.getpid()}-ghi"
    other = tmp_path / ".tmp-someone-else"
    for p in (stale, fresh, mine, other):
        p.write_text("partial")
    old = time.time() - 2 * STALE_SECONDS
    for p in (stale, mine, other):
        os.utime(p, (old, old))
    atomic_write_text("x", tmp_path / "f.txt")
    assert not stale.exists()
    assert fresh.exists() and mine.exists() and other.exists()
