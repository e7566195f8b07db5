#!/usr/bin/env bash
# The GPU checks in one call, without network access, in under 10 minutes on an H100/H200:
#   1. the device tests (tests/test_devices.py, test_device_steps.py, test_capture.py, the runner's);
#   2. the conformance checks on CUDA (python -m pyrobnn.testing --device cuda), every method on the
#      cases that exercise devices, and again for a user who set torch.set_default_device("cuda");
#   3. benchmarks/gpu.py --quick.
# Logs and results go to the folder given (default gpu-logs/), each part with its exit status.
#
# From the repository's root: bash benchmarks/gpu_check.sh [LOG_FOLDER]
# Packages the GPU machine lacks travel as wheels in .whl/ (see /work/.library/device/README.md for
# the pip download command: Python 3.12, manylinux x86_64, --no-deps); they are installed into
# /tmp/site when the folder is there. The lent machines have had torch, JAX, NumPyro, BoTorch and
# Lightning; pyrobnn also needs pyro-ppl (with pyro-api and opt-einsum), arviz (with xarray and
# h5netcdf where absent), laplace-torch (with its curvature backends) and, for the benchmark's rows,
# bayesian-torch and blackjax: read each wheel's Requires-Dist for what else is missing there.
set -u
LOG=${1:-gpu-logs}
mkdir -p "$LOG"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >"$LOG/wheels.log" 2>&1
  echo "wheels: exit $?" | tee -a "$LOG/status.txt"
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$LOG/gpu.txt" 2>&1
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" >>"$LOG/gpu.txt" 2>&1

run() {  # run NAME SECONDS COMMAND...: the command's output in LOG/NAME.log, its status in LOG/status.txt
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$LOG/status.txt"
}

run tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_devices.py tests/test_device_steps.py tests/test_capture.py tests/test_runner.py
CASES="targets_1d float64 noise_prior integer_labels cnn batchnorm"
run conformance_cuda 150 python3 -m pyrobnn.testing --device cuda --cases $CASES --out "$LOG/conformance_cuda.json"
run conformance_default_device 60 python3 -c "
import json, sys, torch
torch.set_default_device('cuda')
from pyrobnn import testing
matrix = testing.conformance_matrix(['meanfield', 'nuts', 'mclmc', 'deep_ensemble', 'laplace'], ['targets_1d', 'cnn'])
print(json.dumps(matrix, indent=1))
sys.exit(any(v.startswith('fails') for row in matrix.values() for v in row.values()))
"
run gpu_benchmark 300 python3 benchmarks/gpu.py --quick
tail -n 1 "$LOG/gpu_benchmark.log" >"$LOG/gpu_benchmark.json"
cat "$LOG/status.txt"
