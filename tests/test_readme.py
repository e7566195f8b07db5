"""README's code runs: the quick start (fit, predict, save; the same model and guide in Pyro's
``SVI``, ``Predictive`` and ``JitTrace_ELBO``) and the posterior verbs (NUTS with a checkpoint,
ArviZ, summary, save/load, a guide with the same verbs), executed in order in one namespace as
a reader would paste them, on a toy data set, in a temporary folder (they write files)."""

import pathlib
import re

import pytest
import torch

from pyrobnn.data import gap_regression

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow  # NUTS's 300 + 500 transitions of 4 chains and a 2000-epoch fit: about 30 s
def test_quick_start_and_posterior_verbs_run(tmp_path, monkeypatch):
    blocks = python_blocks()
    quick_start, pyro_svi, pyro_optim, verbs = blocks[:4]
    assert "pyrobnn.fit(" in quick_start and "pyro.infer.SVI" in pyro_svi and "JitTrace_ELBO" in pyro_optim
    assert "pyrobnn.nuts(" in verbs and "load_posterior" in verbs, "README's blocks moved: update this test's order"
    monkeypatch.chdir(tmp_path)
    x, y = gap_regression(n=100, seed=0)
    x_test, y_test = gap_regression(n=50, seed=1)
    namespace = {"x": x, "y": y, "x_test": x_test, "y_test": y_test}
    for block in (quick_start, pyro_svi, pyro_optim, verbs):
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "bnn.pt").is_file() and (tmp_path / "nuts.pt").is_file()
    post = namespace["post"]  # the posterior loaded back from nuts.pt
    assert post.num_chains == 4 and post.num_draws == 300
    # the loaded posterior predicts what the sampled one did, draw for draw
    assert torch.equal(post.predict(x_test).mean, namespace["pred"].mean)
