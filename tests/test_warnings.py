"""No third-party warning reaches a user who did nothing wrong.

A fresh interpreter (so that warnings raised once per process, at import, are seen) runs the
public API on a fresh data set with every warning shown (``-W always``) and without the test
configuration's filters; its stderr must hold no warning. The calls are those that raised one
before we silenced it where it is raised on our behalf: laplace-torch's ``torch.jit.script``
FutureWarning and its ``link_approx`` reminder (a classifier's Laplace fit), Lightning's
``LeafSpec`` FutureWarning (a Lightning fit), and tqdm's "IProgress not found" (importing the
progress bar where Jupyter is detected is not reproduced here).
"""

import os
import subprocess
import sys
import textwrap

import pytest


SCRIPT = textwrap.dedent(
    """
    import pyro.distributions as dist
    import torch
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    import pyrobnn
    from pyrobnn.data import gap_regression, two_moons

    torch.set_num_threads(1)
    x, y = two_moons(n=120, seed=3)
    clf = pyrobnn.BayesianModel(pyrobnn.MLP(2, 2, hidden=(8,)), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(clf)
    pyrobnn.fit(clf, guide, x, y, epochs=3, progress=False)
    pyrobnn.predict(clf, guide, x, num_samples=4)
    ensemble = pyrobnn.deep_ensemble(clf, x, y, num_members=2, max_epochs=3, progress=False)
    pyrobnn.laplace(clf, x, y, map_estimate=ensemble.member(0)).predict(x)
    xr, yr = gap_regression(n=40, seed=5)
    reg = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(-2.0, 1.0)), pyrobnn.NormalPrior(1.0))
    post = pyrobnn.nuts(reg, xr, yr, num_samples=10, num_warmup=10, num_chains=2, backend="eager", progress=False)
    post.to_arviz(xr, yr)
    post.summary()
    module = pyrobnn.SVIModule(clf, pyrobnn.MeanFieldNormal(clf))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=60))
    print("done")
    """
)


@pytest.mark.slow  # a fresh interpreter importing laplace-torch and Lightning: about 30 s
def test_public_api_shows_no_third_party_warning(tmp_path):
    env = dict(os.environ, PYROBNN_CACHE=str(tmp_path / "cache"), PYTHONWARNINGS="always")
    out = subprocess.run([sys.executable, "-W", "always", "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("done")
    lines = [l for l in out.stderr.splitlines() if "Warning" in l or "warn(" in l]
    assert not lines, "warnings reached the user:\n" + "\n".join(lines[:20])


COMPILE_LOG = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "pyrobnn":
        from pyrobnn.utils.runtime import compiled
        compiled(lambda t: t + 1)
    else:
        import torch.utils.cpp_extension
    """
)


@pytest.mark.slow  # two fresh interpreters importing torch: about 10 s
def test_compiling_logs_no_cuda_runtime_message_on_a_cpu_machine(tmp_path):
    """torch's C++ build helpers log "No CUDA runtime is found" at import where a CUDA toolkit is
    found (here: CUDA_HOME names a folder) but no GPU; :func:`pyrobnn.utils.runtime.compiled` imports
    them quietly before torch.compile would. The plain import is the control: it must log."""
    env = dict(os.environ, CUDA_HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="")

    def stderr_of(who):
        out = subprocess.run([sys.executable, "-c", COMPILE_LOG, who], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr

    assert "No CUDA runtime is found" in stderr_of("torch")
    assert "No CUDA runtime is found" not in stderr_of("pyrobnn")
