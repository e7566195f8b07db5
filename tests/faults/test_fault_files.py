"""Files under faults: a process killed while it writes, a full disk, a corrupted, truncated or
foreign checkpoint, a tampered native-kernel cache. What was written before survives, and
nothing broken is ever read as valid."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import pyrobnn
import pyrobnn.utils.io as io_module
from fault_tools import child_env, run_child, start_child, user_namespaces, wait_for
from fault_cases import RUNS, data, draws, model
from pyrobnn.data import mnist
from pyrobnn.infer.core.checkpoints import RunCheckpoint
from pyrobnn.utils.io import WriteError

# ------------------------------------------------------------------ SIGKILL while writing
WRITER = r"""
import sys, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
from pyrobnn.infer.core.checkpoints import RunCheckpoint
folder = sys.argv[1]
m = c.model(); g = pyrobnn.MeanFieldNormal(m); x, y = c.data(); g(x)
big = [torch.full((4_000_000,), float(v)) for v in (1, 2)]  # 16 MB a file: a kill lands mid-write
ckpt = RunCheckpoint(folder + "/run.ckpt", "test", {"settings": 1})
print("ready", flush=True)
i = 0
while True:
    pyrobnn.save(folder + "/model.pt", m, g, metadata={"version": i % 2, "payload": big[i % 2]})
    ckpt.save({"version": i % 2, "payload": big[i % 2]}, i)
    i += 1
"""


@pytest.mark.fault(
    fault="SIGKILL at random moments while a process rewrites a saved model and a run checkpoint (16 MB each) in a loop",
    survives="after every kill both files load whole, each one of the two versions written; no temporary file is read",
    bound="4 kills (up to 8, until one has landed mid-write)",
)
def test_a_process_killed_while_writing_leaves_the_earlier_files_whole(tmp_path, fault_figures):
    rng = random.Random(0)
    mid_write = kills = 0
    while kills < 4 or (mid_write == 0 and kills < 8):
        kills += 1
        proc = start_child(WRITER, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
            wait_for(lambda: (tmp_path / "run.ckpt").exists(), 120, "the first writes", proc)
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        leftovers = [n for n in os.listdir(tmp_path) if n.startswith(io_module.TMP_PREFIX)]
        mid_write += bool(leftovers)
        m = model()
        g = pyrobnn.MeanFieldNormal(m)
        g(data()[0])
        meta = pyrobnn.load(tmp_path / "model.pt", m, g)
        assert torch.equal(meta["payload"], torch.full((4_000_000,), float(meta["version"] + 1)))
        state = RunCheckpoint(str(tmp_path / "run.ckpt"), "test", {"settings": 1}).load()
        assert torch.equal(state["payload"], torch.full((4_000_000,), float(state["version"] + 1)))
        for name in leftovers:  # what a killed write leaves is a temporary file, never the target
            os.unlink(tmp_path / name)
    fault_figures["kills that landed mid-write"] = f"{mid_write} of {kills}"
    assert mid_write >= 1  # the test did kill writes in progress


# ------------------------------------------------------------------ a full disk, injected
@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """``os.write`` fails with ENOSPC after 1 KB for files under ``tmp_path/full`` (as a disk
    that fills during the write); writes elsewhere go through."""
    folder = tmp_path / "full"
    folder.mkdir()
    real_write = os.write
    written = {}

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(str(folder)):
            written[fd] = written.get(fd, 0) + len(data)
            if written[fd] > 1024:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell which file a descriptor writes")
    monkeypatch.setattr(os, "write", write)
    return folder


def _no_temporaries(folder):
    return [n for n in os.listdir(folder) if n.startswith(io_module.TMP_PREFIX)]


def _trained():
    m = model()
    g = pyrobnn.MeanFieldNormal(m)
    x, y = data()
    return m, g, pyrobnn.fit(m, g, x, y, epochs=2, progress=False, seed=0)


@pytest.mark.fault(
    fault="the disk fills during pyrobnn.save and Result.save over an earlier file (ENOSPC injected into os.write)",
    survives="the earlier file, unchanged; no temporary file left; an OSError naming the file and the full disk",
    bound="-",
)
@pytest.mark.parametrize("what", ["pyrobnn.save", "Result.save"])
def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_earlier_one(what, full_disk):
    m, g, result = _trained()
    path = full_disk / "model.pt"
    path.write_bytes(b"earlier contents")
    with pytest.raises(WriteError, match=f"could not write {path}: no space left on the device \\(the earlier {path} is unchanged"):
        if what == "pyrobnn.save":
            pyrobnn.save(path, m, g)
        else:
            result.save(path)
    assert path.read_bytes() == b"earlier contents"
    assert _no_temporaries(full_disk) == []


@pytest.mark.fault(
    fault="the disk fills while a NUTS run and an SVI fit write their checkpoints (ENOSPC injected)",
    survives="the run: it warns, naming the file, and finishes with the uninterrupted result; the earlier checkpoint stays whole",
    bound="-",
)
@pytest.mark.parametrize("what", ["nuts", "fit"])
def test_a_full_disk_during_a_checkpoint_warns_and_the_run_goes_on(what, full_disk):
    x, y = data()
    path = full_disk / "run.ckpt"
    if what == "nuts":
        whole = RUNS["nuts"](model(), x, y, progress=False)
        with pytest.warns(UserWarning, match=f"NUTS: the state after .* was not saved: could not write {path}: no space left"):
            result = RUNS["nuts"](model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=5))
        for k, v in draws(whole).items():
            torch.testing.assert_close(result.samples[k], v, rtol=0, atol=0)
    else:
        m = model()
        g = pyrobnn.MeanFieldNormal(m)
        with pytest.warns(UserWarning, match=f"SVI: the state after epoch .* was not saved: could not write {path}: no space left"):
            history = pyrobnn.fit(m, g, x, y, epochs=3, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=1))
        assert len(history.history.loss) == 3
    assert not path.exists() and _no_temporaries(full_disk) == []


@pytest.mark.fault(
    fault="the disk fills while `pyrobnn compare` saves a finished split and while the MNIST cache is written (ENOSPC injected)",
    survives="the files written before; an OSError naming the file",
    bound="-",
)
@pytest.mark.parametrize("what", ["compare split", "MNIST cache"])
def test_a_full_disk_in_the_compare_and_data_caches_names_the_file(what, full_disk, shared_data_dir):
    if what == "compare split":
        from pyrobnn.apps.compare import runner

        cache = runner._SplitCache(str(full_disk), {"dataset": "yacht"})
        os.makedirs(full_disk / "splits")
        (full_disk / "splits" / "split-0.json").write_text("{}")
        with pytest.raises(WriteError, match="could not write .*split-1.json: no space left"):
            cache.save(1, {"rows": {"x": list(range(1000))}})
        assert (full_disk / "splits" / "split-0.json").read_text() == "{}"
        assert _no_temporaries(full_disk / "splits") == []
    else:
        if not os.path.isdir(os.path.join(shared_data_dir, "MNIST")):
            pytest.skip(f"no MNIST under {shared_data_dir} (set PYROBNN_DATA)")
        with pytest.raises(WriteError, match="could not write .*: no space left on the device"):
            mnist(shared_data_dir, train=False, subset=10, cache=str(full_disk))


# ------------------------------------------------------------------ a real full disk
FULL = r"""
import json, os, sys, warnings, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
from pyrobnn.utils.io import WriteError
what, folder = sys.argv[1], sys.argv[2]
out = {}
if what == "save":
    m = c.model(); g = pyrobnn.MeanFieldNormal(m); g(c.data()[0])
    pyrobnn.save(folder + "/small.pt", m, g)
    try:
        pyrobnn.save(folder + "/small.pt", m, g, metadata={"payload": torch.zeros(200_000)})
    except WriteError as e:
        out["error"] = str(e)
    m2 = c.model(); g2 = pyrobnn.MeanFieldNormal(m2); g2(c.data()[0])
    out["earlier_loads"] = pyrobnn.load(folder + "/small.pt", m2, g2) == {}
elif what == "checkpoint":
    x, y = c.data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pyrobnn.nuts(c.model(), x, y, num_samples=150, num_warmup=20, num_chains=2, max_tree_depth=3, backend="eager", progress=False,
                         checkpoint=pyrobnn.Checkpointing(folder + "/run.ckpt", every=1))
    out["draws"] = int(next(iter(r.samples.values())).shape[1])
    out["warnings"] = sorted({str(w.message).split(":")[0] for w in caught if "was not saved" in str(w.message)})
    out["a_warning"] = next((str(w.message) for w in caught if "was not saved" in str(w.message)), "")
    out["file_loads"] = int(torch.load(folder + "/run.ckpt", weights_only=True)["count"]) if os.path.exists(folder + "/run.ckpt") else None
elif what == "native build":
    os.environ["PYROBNN_CACHE"] = folder + "/cache"
    with open(folder + "/filler", "wb") as f:  # the disk is full before the build starts
        try:
            f.write(b"x" * (1 << 30))
        except OSError:
            pass
    x, y = c.data()
    r = pyrobnn.nuts(c.model(), x, y, num_samples=5, num_warmup=5, num_chains=1, max_tree_depth=3, progress=False)
    out["path"] = r.summary()["path"] if isinstance(r.summary(), dict) and "path" in r.summary() else str(r.stats.get("path"))
    out["why"] = str(r.stats.get("path_reason", r.settings.get("path_reason", "")))
    out["summary"] = str(r.summary())[:3000]
out["left"] = sorted(os.listdir(folder))
print(json.dumps(out))
"""


def _in_a_small_tmpfs(tmp_path, what, size):
    folder = tmp_path / "disk"
    folder.mkdir()
    shell = f"mount -t tmpfs -o size={size} tmpfs {folder} && exec {sys.executable} -c \"$0\" \"$@\""
    env = child_env()
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", shell, FULL, what, str(folder)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


needs_tmpfs = pytest.mark.skipif(not user_namespaces(), reason="this machine lets no process mount a tmpfs of its own (unshare -rm): the injected full disk above stands in")


@needs_tmpfs
@pytest.mark.fault(
    fault="a real full disk (a 256 KB tmpfs): saving a larger model over a smaller one",
    survives="the earlier file, which loads; an OSError naming the file and the full disk; no temporary file left",
    bound="-",
)
def test_a_real_full_disk_during_a_save(tmp_path):
    out = _in_a_small_tmpfs(tmp_path, "save", "256k")
    assert "no space left on the device" in out["error"] and "small.pt is unchanged" in out["error"], out
    assert out["earlier_loads"] and out["left"] == ["small.pt"], out


@pytest.mark.slow
@needs_tmpfs
@pytest.mark.fault(
    fault="a real full disk (a 64 KB tmpfs) under a NUTS run that checkpoints after every draw",
    survives="the run, to its end with all its draws; a warning naming the file; the last checkpoint that fitted stays whole",
    bound="-",
)
def test_a_real_full_disk_under_a_checkpointed_run(tmp_path):
    out = _in_a_small_tmpfs(tmp_path, "checkpoint", "64k")
    assert out["draws"] == 150 and out["warnings"] == ["NUTS"], out
    assert "run.ckpt: no space left on the device" in out["a_warning"], out
    assert out["left"] in (["run.ckpt"], []), out
    assert out["file_loads"] is None or 0 < out["file_loads"] < 170


@pytest.mark.slow
@needs_tmpfs
@pytest.mark.fault(
    fault="a real full disk (a 1 MB tmpfs, filled) as the native kernels' cache while they build",
    survives="the run: NUTS takes the torch path and its summary says the build failed in that folder",
    bound="-",
)
def test_a_real_full_disk_during_the_native_build(tmp_path):
    from pyrobnn.infer.core import native

    if native.build_info()["compiler"] is None:
        pytest.skip("no C++ compiler: no native build to fail")
    out = _in_a_small_tmpfs(tmp_path, "native build", "1m")
    assert "building the native kernels in" in out["summary"] and "/cache/kernels failed" in out["summary"], out["summary"]


# ------------------------------------------------------------------ broken checkpoints
def _checkpointed(path, **kw):
    x, y = data()
    return RUNS["sgld"](model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=10), **kw)


@pytest.mark.fault(
    fault="a run checkpoint truncated at 10 points, one with a byte flipped in its tensors, garbage, an empty file",
    survives="nothing is resumed from: each is refused by name (corrupted), and the file is left as it was",
    bound="-",
)
def test_a_corrupted_or_truncated_checkpoint_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    _checkpointed(path)
    whole = path.read_bytes()
    broken = {f"cut at {k}/10": whole[: len(whole) * k // 10] for k in range(10)}
    # a flipped byte inside the last tensor's storage (the zip's data section, before its index)
    index = whole.rfind(b"PK\x01\x02")
    flipped = bytearray(whole)
    flipped[index - 40] ^= 0xFF
    broken["a flipped byte"] = bytes(flipped)
    broken["garbage"] = b"not a checkpoint at all" * 10
    for label, content in broken.items():
        path.write_bytes(content)
        with pytest.raises(ValueError, match="corrupted") as info:
            _checkpointed(path)
        assert str(path) in str(info.value), label
        assert path.read_bytes() == content, label


@pytest.mark.fault(
    fault="a checkpoint of another method, another model, other data, other settings, a saved result, an SVI checkpoint",
    survives="nothing is resumed from: each is refused, naming what differs; the file is left as it was",
    bound="-",
)
def test_a_checkpoint_of_another_run_is_refused_by_name(tmp_path):
    path = tmp_path / "run.ckpt"
    _checkpointed(path)
    before = path.read_bytes()
    x, y = data()
    other_model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(9,)), model().likelihood, pyrobnn.NormalPrior(1.0))
    with pytest.raises(ValueError, match="holds a SGLD run, not a SGHMC run"):
        RUNS["sghmc"](model(), x, y, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="another SGLD run: .*differ"):
        RUNS["sgld"](other_model, x, y, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="another SGLD run: the training data differ"):
        RUNS["sgld"](model(), x, y * 2, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="another SGLD run: num_steps is 80 there and 81 here"):
        pyrobnn.sgld(model(), x, y, num_steps=81, thinning=4, batch_size=8, num_chains=2, step_size=1e-3, progress=False, checkpoint=path)
    assert path.read_bytes() == before
    m, g, result = _trained()
    result.save(tmp_path / "result.pt")
    with pytest.raises(ValueError, match="is not a pyrobnn run checkpoint"):
        _checkpointed(tmp_path / "result.pt")
    trainer = pyrobnn.SVITrainer(m, g)
    trainer.fit(x, y, epochs=1, progress=False, checkpoint=tmp_path / "svi.ckpt")
    with pytest.raises(ValueError, match="is not a pyrobnn run checkpoint"):
        _checkpointed(tmp_path / "svi.ckpt")
    with pytest.raises(ValueError, match="is not a pyrobnn training checkpoint"):
        pyrobnn.SVITrainer(m, g).fit(x, y, epochs=2, progress=False, checkpoint=path, resume=True)


# ------------------------------------------------------------------ a tampered native cache
TAMPER = r"""
import json, sys
from pyrobnn.infer.core import native
lib, record = native.library()
print(json.dumps({"event": record["event"], "because": record.get("rebuilt_because", ""), "file": record["file"]}))
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="the native-kernel cache tampered with between runs: the library replaced by another shared object, made group-writable, given to another owner",
    survives="nothing untrusted is loaded: each is refused, said why, and rebuilt",
    bound="-",
)
def test_a_tampered_native_cache_is_rebuilt_never_loaded(tmp_path):
    from pyrobnn.infer.core import native

    if native.build_info()["compiler"] is None:
        pytest.skip("no C++ compiler: no native kernels to cache")
    env = {"PYROBNN_CACHE": str(tmp_path)}
    first = json.loads(run_child(TAMPER, env=env).stdout)
    assert first["event"] == "built"
    library = tmp_path / "kernels" / first["file"]
    replacement = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6") if os.path.exists(p)) if sys.platform.startswith("linux") else None
    tamperings = {"replaced": lambda p: p.write_bytes(open(replacement, "rb").read()) if replacement else p.write_bytes(b"\x7fELF" + b"\0" * 64),
                  "group-writable": lambda p: os.chmod(p, 0o775)}
    if hasattr(os, "getuid") and os.getuid() == 0:
        tamperings["another owner"] = lambda p: os.chown(p, 65534, 65534)
    for label, tamper in tamperings.items():
        tamper(library)
        again = json.loads(run_child(TAMPER, env=env).stdout)
        assert again["event"] == "built" and again["because"], (label, again)
        library = tmp_path / "kernels" / again["file"]
    assert json.loads(run_child(TAMPER, env=env).stdout)["event"] == "loaded"
