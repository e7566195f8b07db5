"""Two processes at once on one cache or one output folder (the native build, the torch.compile
cache, the MNIST cache, a `pyrobnn compare` folder), and a run resumed on another thread count:
no corrupted cache, no crash, both results right."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from fault_tools import child_env, run_child
from fault_cases import RUNS, data, draws, wide_model
from pyrobnn.data import mnist


def _together(code, args_list, env=None, timeout=600):
    """Start one process per argument list at once; wait for all; their stdout lines as JSON."""
    full_env = child_env(env)
    procs = [subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
             for args in args_list]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


BUILD = r"""
import json
from pyrobnn.infer.core import native
lib, record = native.library()
print(json.dumps({"event": record["event"], "file": record["file"]}))
"""


@pytest.mark.fault(
    fault="two processes find no native library at once and both go to build it into one fresh cache",
    survives="one build (a lock): the second waits and loads the first's library; one library and one record in the cache, both verified",
    bound="-",
)
def test_two_processes_building_the_native_kernels_build_once(tmp_path):
    from pyrobnn.infer.core import native

    if native.build_info()["compiler"] is None:
        pytest.skip("no C++ compiler: nothing to build")
    outs = _together(BUILD, [[], []], env={"PYROBNN_CACHE": str(tmp_path)})
    assert sorted(o["event"] for o in outs) == ["built", "loaded"], outs
    assert outs[0]["file"] == outs[1]["file"]
    files = sorted(os.listdir(tmp_path / "kernels"))
    assert [f for f in files if f.endswith(".so")] == [outs[0]["file"]] and len([f for f in files if f.endswith(".json")]) == 1, files
    assert json.loads(run_child(BUILD, env={"PYROBNN_CACHE": str(tmp_path)}).stdout)["event"] == "loaded"


MNIST = r"""
import hashlib, json, sys
from pyrobnn.data import mnist
x, y = mnist(sys.argv[1], train=False, cache=sys.argv[2])
print(json.dumps({"x": hashlib.sha256(x.numpy().tobytes()).hexdigest(), "y": hashlib.sha256(y.numpy().tobytes()).hexdigest()}))
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="two processes build the MNIST cache at once, into one fresh cache folder",
    survives="both get the whole test set, identical to a read of the source; the cache left whole (a third process reads it)",
    bound="-",
)
def test_two_processes_filling_the_mnist_cache_get_the_same_data(tmp_path, shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "MNIST")):
        pytest.skip(f"no MNIST under {shared_data_dir} (set PYROBNN_DATA)")
    outs = _together(MNIST, [[shared_data_dir, tmp_path / "cache"]] * 2)
    x, y = mnist(shared_data_dir, train=False, cache=str(tmp_path / "reference"))
    expected = {"x": hashlib.sha256(x.numpy().tobytes()).hexdigest(), "y": hashlib.sha256(y.numpy().tobytes()).hexdigest()}
    assert outs == [expected, expected]
    assert json.loads(run_child(MNIST, shared_data_dir, tmp_path / "cache").stdout) == expected
    assert not [n for n in os.listdir(tmp_path / "cache" / "torchvision" / "MNIST" / "raw") if n.startswith(".tmp-")]


COMPILE = r"""
import hashlib, json, sys, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
x, y = c.data()
r = pyrobnn.nuts(c.model(), x, y, num_samples=10, num_warmup=10, num_chains=2, max_tree_depth=3, backend="compile", progress=False)
print(json.dumps({k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in r.samples.items()}))
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="two processes compile the same NUTS run with torch.compile at once, into one fresh Inductor cache",
    survives="both runs, with the same draws; a third process then runs from the filled cache with the same draws",
    bound="-",
)
def test_two_processes_filling_the_torch_compile_cache_get_the_same_draws(tmp_path):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    outs = _together(COMPILE, [[], []], env=env, timeout=1200)
    assert outs[0] == outs[1]
    assert json.loads(run_child(COMPILE, env=env, timeout=1200).stdout.strip().splitlines()[-1]) == outs[0]


COMPARE = r"""
import json, sys
from pyrobnn.apps.cli import main
main(["compare", "--quick", "--dataset", "yacht", "--data-dir", sys.argv[1], "--splits", "0", "--methods", "meanfield",
      "--reference", "nuts", "--out", sys.argv[2], "--quiet"])
with open(sys.argv[2] + "/results.json") as f:
    results = json.load(f)
print(json.dumps({r["key"]: r["rmse"] for r in results["summary"]}))
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="two `pyrobnn compare` runs with the same settings write one output folder at once",
    survives="both finish with the same table; every file in the folder is whole (JSON that parses, no temporary left)",
    bound="-",
)
def test_two_compare_runs_writing_one_folder(tmp_path, shared_data_dir):
    if not os.path.isdir(os.path.join(shared_data_dir, "uci", "yacht")):
        pytest.skip(f"UCI yacht not found under {shared_data_dir} (set PYROBNN_DATA)")
    out = tmp_path / "cmp"
    outs = _together(COMPARE, [[shared_data_dir, out]] * 2, timeout=1200)
    assert outs[0] == outs[1] and set(outs[0]) == {"reference", "meanfield"}
    for root, _, files in os.walk(out):
        for name in files:
            assert not name.startswith(".tmp-"), name
            if name.endswith(".json"):
                with open(os.path.join(root, name)) as f:
                    json.load(f)
    with open(out / "results.json") as f:
        assert {r["key"]: r["rmse"] for r in json.load(f)["summary"]} == outs[0]


RESUME = r"""
import json, os, signal, sys, torch
torch.set_num_threads(int(sys.argv[3]))
import fault_cases as c, pyrobnn
from pyrobnn.infer.core.checkpoints import RunCheckpoint
from pyrobnn.infer.core.interrupts import RunInterrupted
name, path, threads, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
real = RunCheckpoint.after
def after(self, count, *args, **kwargs):
    if count == stop_at:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, count, *args, **kwargs)
RunCheckpoint.after = after
x, y = c.data(4096)
try:
    r = c.RUNS[name](c.wide_model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=10**6, seconds=3600))
except RunInterrupted as e:
    print(json.dumps({"stopped": e.done}))
    sys.exit(0)
torch.save(r.samples, path + ".draws")
print(json.dumps({"stopped": None}))
"""


@pytest.mark.fault(
    fault="a run stopped (SIGTERM) on one torch thread and resumed on two, on a wider network (2 x 64 units, 4096 points)",
    survives="the uninterrupted one-thread draws, bit for bit",
    bound="-",
)
@pytest.mark.slow
@pytest.mark.parametrize("method", ["nuts", "mclmc"])
def test_a_run_resumed_on_another_thread_count_gives_the_same_draws(method, tmp_path):
    path = str(tmp_path / "run.ckpt")
    assert json.loads(run_child(RESUME, method, path, 1, 20).stdout.strip().splitlines()[-1])["stopped"] == 20
    assert json.loads(run_child(RESUME, method, path, 2, 0).stdout.strip().splitlines()[-1])["stopped"] is None
    resumed = torch.load(path + ".draws", weights_only=True)
    whole = RUNS[method](wide_model(), *data(4096), progress=False)
    for k, v in draws(whole).items():
        torch.testing.assert_close(resumed[k], v, rtol=0, atol=0)
