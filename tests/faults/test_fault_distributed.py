"""One rank of a Lightning DDP fit fails: the run ends within a bounded time with an error that
names the rank (no hang), and it resumes from its last checkpoint."""

import json
import subprocess
import sys
import time

import pytest

from fault_tools import child_env

CHILD = r"""
import json, os, signal, sys, time, warnings
warnings.simplefilter("ignore")
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset
import fault_cases as c, pyrobnn
from pyrobnn.integrations.lightning import EndProcessGroup, SVIModule

how, folder = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("none", "")


class Fail(L.Callback):
    # rank 1 fails in the middle of epoch 3
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if how != "none" and trainer.global_rank == 1 and trainer.current_epoch == 2 and batch_idx == 1:
            if how == "raise":
                raise RuntimeError("injected failure on rank 1")
            os.kill(os.getpid(), signal.SIGKILL)


def trainer(**kw):
    return L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=4, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=folder,
                     callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=folder, save_last=True, every_n_epochs=1), EndProcessGroup(), *kw.pop("callbacks", [])], **kw)


def main():
    x, y = c.data(64)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = c.model()
    module = SVIModule(model, pyrobnn.MeanFieldNormal(model), lr=1e-2)
    start = time.monotonic()
    out = {}
    try:
        trainer(callbacks=[Fail()]).fit(module, loader)
        out["error"] = None
    except BaseException as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - start
    out["checkpoints"] = sorted(n for n in os.listdir(folder) if n.endswith(".ckpt"))
    if how != "none":  # resume from the last checkpoint, no failure this time
        model = c.model()
        module = SVIModule(model, pyrobnn.MeanFieldNormal(model), lr=1e-2)
        t = trainer()
        before = torch.load(os.path.join(folder, "last.ckpt"), weights_only=False)["epoch"]
        t.fit(module, loader, ckpt_path=os.path.join(folder, "last.ckpt"))
        # the ranks ran in spawned processes: what they did is read from the checkpoint they wrote
        out["resumed_from_epoch"] = before
        out["epochs_at_the_end"] = torch.load(os.path.join(folder, "last.ckpt"), weights_only=False)["epoch"] + 1
    print(json.dumps(out))


if __name__ == "__main__":  # the spawned ranks import this file and run only what Lightning gives them
    main()
"""


@pytest.mark.slow
@pytest.mark.fault(
    fault="one rank of a two-process Lightning DDP fit (ddp_spawn, gloo) raises, or is killed with SIGKILL, in epoch 3",
    survives="the other rank and the main process: the fit ends with an error naming the failed rank (no hang); the epoch checkpoints; `fit(ckpt_path=last)` resumes to the end",
    bound="ends within 120 s of the failure",
)
@pytest.mark.parametrize("how", ["raise", "SIGKILL"])
def test_a_failed_ddp_rank_ends_the_run_naming_it_and_the_run_resumes(how, tmp_path, fault_figures):
    start = time.monotonic()
    script = tmp_path / "ddp_run.py"  # a file, not -c: the spawned ranks import the main module
    script.write_text(CHILD)
    env = child_env()
    proc = subprocess.run([sys.executable, str(script), "raise" if how == "raise" else "kill", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    fault_figures["seconds until the error"] = round(out["seconds"], 1)
    fault_figures["whole test"] = round(time.monotonic() - start, 1)
    assert out["error"] is not None and ("process 1" in out["error"].lower() or "rank 1" in out["error"].lower()), out
    if how == "raise":
        assert "injected failure on rank 1" in out["error"], out
    assert out["seconds"] < 120, out
    assert "last.ckpt" in out["checkpoints"], out
    assert out["resumed_from_epoch"] == 1 and out["epochs_at_the_end"] == 4, out
