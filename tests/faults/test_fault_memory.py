"""Asked for more memory than the process has: an error naming the argument that bounds it,
before anything is allocated, instead of the kernel's OOM killer; and, left to itself, pyrobnn
keeps within what there is."""

import json
import os
import resource

import pytest

from fault_tools import run_child

# under an address-space limit (ulimit -v): what the machine has is then what is left of it
CHILD = r"""
import json, resource, sys, warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import pyrobnn
from pyrobnn.utils.memory import MemoryBudgetError
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
limit = vm + (int(sys.argv[2]) << 20)  # what torch has mapped, and so much more
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
g = torch.Generator().manual_seed(0)
x = torch.randn(2000, 10, generator=g); y = x.sum(-1, keepdim=True)
torch.manual_seed(0)
m = pyrobnn.BayesianModel(pyrobnn.MLP(10, 1, hidden=(200, 200)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
guide = pyrobnn.MeanFieldNormal(m)
result = pyrobnn.fit(m, guide, x[:100], y[:100], epochs=1, progress=False)
cases = {
    "predict: num_samples": lambda: result.predict(torch.zeros(200_000, 10), num_samples=20_000),
    "predict: sample_batch_size": lambda: result.predict(x, num_samples=5000, sample_batch_size=5000),
    "Laplace: the full Hessian": lambda: pyrobnn.laplace(m, x, y, hessian="full", map_estimate=pyrobnn.deep_ensemble(m, x[:200], y[:200], num_members=1, max_epochs=1, progress=False)),
    "predict within the limit, chunks left to pyrobnn": lambda: result.predict(torch.zeros(20_000, 10), num_samples=50),
}
case = cases[sys.argv[1]]
try:
    out = case()
    print(json.dumps({"ok": True}))
except MemoryBudgetError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""

CASES = {
    "predict: num_samples": "lower num_samples, or predict on fewer points per call",
    "predict: sample_batch_size": "lower batch_size or sample_batch_size",
    "Laplace: the full Hessian": "hessian='kron' or 'diag', or subset='last_layer'",
    "predict within the limit, chunks left to pyrobnn": None,
}
#: the default run takes two; the slow marker the rest
SLOW = ("predict: sample_batch_size", "predict within the limit, chunks left to pyrobnn")


@pytest.mark.fault(
    fault="a prediction or a Laplace fit that needs more memory than the process has (an address-space limit 3 GiB above what the process has mapped after importing torch)",
    survives="the process: a MemoryBudgetError naming the argument that bounds the memory, before allocating; with the chunks left to pyrobnn the same limit is kept",
    bound="-",
)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_too_much_memory_is_refused_naming_the_knob(case):
    if not hasattr(resource, "RLIMIT_AS") or not os.path.exists("/proc/self/status"):
        pytest.skip("no address-space limit on this system")
    proc = run_child(CHILD, case, 3072, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]  # not killed, no MemoryError from the allocator
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if CASES[case] is None:
        assert out["ok"], out
    else:
        assert not out["ok"] and CASES[case] in out["error"] and "this process has" in out["error"], out
