"""SIGTERM and SIGINT during a long run: it stops within seconds, writes its checkpoint, says
where and how to resume, and the same call resumes to the uninterrupted result bit for bit."""

import json
import os
import signal
import time

import pytest
import torch

import pyrobnn
from fault_tools import run_child, start_child, wait_for
from fault_cases import RUNS, data, draws, fit, model

# the child sends the signal to itself at the end of iteration ``at`` (a real signal through the
# real handler, at a known point: the resumed run must then give the uninterrupted draws)
CHILD = r"""
import json, os, signal, sys, time, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
from pyrobnn.infer.core.checkpoints import RunCheckpoint
from pyrobnn.infer.core.interrupts import RunInterrupted
name, path, at, sig = sys.argv[1], sys.argv[2], int(sys.argv[3]), getattr(signal, sys.argv[4])
sent = []
def send():
    if not sent:
        sent.append(time.monotonic())
        os.kill(os.getpid(), sig)
try:
    if name == "fit":
        c.fit(path, callback=lambda trainer, epoch: send() if epoch == at else None)
    else:
        real = RunCheckpoint.after
        def after(self, count, *args, **kwargs):
            if count == at:
                send()
            return real(self, count, *args, **kwargs)
        RunCheckpoint.after = after
        x, y = c.data()
        c.RUNS[name](c.model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=10**6, seconds=3600))
except RunInterrupted as e:
    print(json.dumps({"message": str(e), "seconds": time.monotonic() - sent[0], "done": e.done, "path": e.path, "signal": e.signal}))
    sys.exit(0)
print(json.dumps({"message": "the run was not interrupted"}))
sys.exit(3)
"""

#: (method, signal, iteration at which it arrives, what that iteration is); the first few run
#: by default, the rest with the slow marker
CASES = [
    ("nuts", "SIGTERM", 25, "sampling"),
    ("mclmc", "SIGTERM", 47, "tuning phase 3 (not writable: back to the state before it)"),
    ("fit", "SIGINT", 7, "epoch 7 of 30"),
]
SLOW_CASES = [
    ("nuts", "SIGINT", 10, "warm-up"),
    ("mclmc", "SIGINT", 12, "tuning phase 1"),
    ("mclmc", "SIGTERM", 36, "tuning phase 2"),
    ("mclmc", "SIGTERM", 80, "sampling"),
    ("sgld", "SIGTERM", 30, "step 30 of 80"),
    ("sghmc", "SIGINT", 50, "step 50 of 80"),
    ("smile", "SIGTERM", 12, "warm-up"),
    ("ensemble", "SIGTERM", 6, "epoch 6 of 15"),
    ("swag", "SIGINT", 9, "epoch 9 of 20"),
]


def _params(case):
    method, sig, at, where = case
    return pytest.param(method, sig, at, id=f"{method}-{sig}-{where.split(' (')[0].replace(' ', '_')}")


def _compare(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=lambda m: f"{k}: {m}")


@pytest.mark.fault(
    fault="SIGTERM or SIGINT part way through the run (a real signal, sent at a known iteration)",
    survives="the checkpoint, written at the signal; the same call resumes to the uninterrupted draws bit for bit",
    bound="stops within 10 s",
)
@pytest.mark.parametrize("method,sig,at", [_params(c) for c in CASES] + [pytest.param(*_params(c).values, marks=pytest.mark.slow, id=_params(c).id) for c in SLOW_CASES])
def test_a_stop_signal_writes_the_checkpoint_and_the_same_call_resumes_bit_exactly(method, sig, at, tmp_path, fault_figures):
    path = tmp_path / f"{method}.ckpt"
    out = json.loads(run_child(CHILD, method, path, at, sig).stdout.strip().splitlines()[-1])
    fault_figures["seconds to stop"] = round(out["seconds"], 3)
    assert out["signal"] == sig and out["path"] == str(path), out
    assert out["seconds"] < 10, out
    assert str(path) in out["message"] and ("resumes" in out["message"] or "goes on" in out["message"]), out["message"]
    if method == "mclmc" and at == 47:
        assert out["done"] < at and "run again" in out["message"], out  # phase 3 cannot be written: the state before it
    else:
        assert out["done"] == at, out
    if method == "fit":
        m1, g1, h1 = fit()
        m2, g2, h2 = fit(path)
        assert h2.history.loss == h1.history.loss and len(h1.history.loss) == 30
        _compare(dict(g1.named_parameters()), dict(g2.named_parameters()))
        return
    x, y = data()
    whole = RUNS[method](model(), x, y, progress=False)
    resumed = RUNS[method](model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=10**6, seconds=3600))
    _compare(draws(whole), draws(resumed))
    _compare({k: v for k, v in whole.stats.items() if isinstance(v, torch.Tensor)}, {k: v for k, v in resumed.stats.items() if isinstance(v, torch.Tensor)})


LONG_RUN = r"""
import sys, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
x, y = c.data()
pyrobnn.nuts(c.model(), x, y, num_samples=10**6, num_warmup=50, num_chains=2, max_tree_depth=4, backend="eager", progress=False,
             checkpoint=pyrobnn.Checkpointing(sys.argv[1], every=5))
"""


@pytest.mark.fault(
    fault="SIGTERM from another process (as a scheduler sends it) during a NUTS run of a million draws",
    survives="the state at the signal, in the checkpoint; the error names the file and how to resume",
    bound="the process ends within 10 s of the signal",
)
def test_a_scheduler_s_sigterm_ends_a_long_run_within_seconds_with_its_state_written(tmp_path, fault_figures):
    path = tmp_path / "long.ckpt"
    proc = start_child(LONG_RUN, path, stdout=-1, stderr=-1, text=True)
    try:
        wait_for(path.exists, 300, "the first checkpoint", proc)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    fault_figures["seconds to stop"] = round(seconds, 3)
    assert seconds < 10
    assert proc.returncode != 0
    assert "RunInterrupted: NUTS stopped by SIGTERM" in err and str(path) in err and "resumes from there" in err, err[-2000:]
    saved = torch.load(path, weights_only=True)
    assert saved["count"] == saved["state"]["iteration"] > 5  # the state at the signal, past the last periodic write
    assert os.listdir(tmp_path) == ["long.ckpt"]  # no temporary file left


@pytest.mark.fault(
    fault="a second SIGINT while a run is already stopping; a SIGTERM that comes after a run's last iteration",
    survives="the user's intent: the second signal stops at once (KeyboardInterrupt); the late one is passed on, not swallowed",
    bound="-",
)
def test_a_second_signal_stops_at_once_and_a_late_one_is_passed_on():
    from pyrobnn.infer.core.interrupts import stop_signals

    # Python's own SIGINT handler, as in a foreground process (a job started with & from a
    # script ignores SIGINT, and so does a run inside it: tested below)
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _second_and_late_signals(stop_signals)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with stop_signals() as request:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert not request.requested  # an ignored signal stays ignored
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, original)


def _second_and_late_signals(stop_signals):
    with pytest.raises(KeyboardInterrupt) as info:
        with stop_signals() as request:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert request.signal_name == "SIGINT"  # the first is recorded, the run goes on
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
            raise AssertionError("the second SIGINT did not stop the block")
    assert not isinstance(info.value, AssertionError)
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with stop_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        time.sleep(0.05)
        assert seen == [signal.SIGTERM]  # passed on to the handler that was there before
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


MID_EPOCH = r"""
import json, os, signal, sys, torch
torch.set_num_threads(1)
import fault_cases as c, pyrobnn
from pyrobnn.infer.core import interrupts
from pyrobnn.infer.core.interrupts import RunInterrupted
from pyrobnn.infer.modes import ensemble
interrupts.GRACE_SECONDS = 0.0  # an epoch that would take longer than the grace to finish
calls = []
real = ensemble.minibatch_log_joint
def counted(*args, **kwargs):
    calls.append(1)
    if len(calls) == 22:  # the second batch of epoch 6 (4 batches an epoch)
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
ensemble.minibatch_log_joint = counted
x, y = c.data()
try:
    c.RUNS["ensemble"](c.model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(sys.argv[1], every=1))
except RunInterrupted as e:
    print(json.dumps({"message": str(e), "done": e.done}))
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="SIGTERM in the middle of an ensemble epoch that would outlast the grace period",
    survives="the state of the last whole epoch (the partial epoch is run again); the same call resumes to the uninterrupted members bit for bit",
    bound="stops at the next batch",
)
def test_a_stop_inside_a_long_epoch_goes_back_to_the_last_whole_epoch(tmp_path):
    path = tmp_path / "ensemble.ckpt"
    out = json.loads(run_child(MID_EPOCH, path).stdout.strip().splitlines()[-1])
    assert out["done"] == 5 and "stopped by SIGTERM after 5 epochs; its state after 5 epochs is in" in out["message"], out
    x, y = data()
    whole = RUNS["ensemble"](model(), x, y, progress=False)
    resumed = RUNS["ensemble"](model(), x, y, progress=False, checkpoint=pyrobnn.Checkpointing(path, every=1))
    _compare(draws(whole), draws(resumed))
