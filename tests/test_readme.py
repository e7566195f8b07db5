"""README's and the user guide's code runs: README's example (one model by SVI, NUTS and Laplace)
and the guide's blocks in order (fit, predict, save; the same model and guide in Pyro's ``SVI``,
``Predictive`` and ``JitTrace_ELBO``; the posterior verbs with a checkpoint, ArviZ, summary,
save/load), each in one namespace as a reader would paste them, on a toy data set, in a
temporary folder (they write files)."""

import pathlib
import re

import pytest
import torch

from pyrobnn.data import gap_regression

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def toy_data():
    x, y = gap_regression(n=100, seed=0)
    x_test, y_test = gap_regression(n=50, seed=1)
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test}


@pytest.mark.slow  # NUTS's 500 + 200 transitions of 4 chains, a 1000-epoch fit and a Laplace fit
def test_the_readme_example_runs(tmp_path, monkeypatch):
    (example,) = python_blocks(ROOT / "README.md")
    assert "pyrobnn.fit(" in example and "pyrobnn.nuts(" in example and "pyrobnn.laplace(" in example
    monkeypatch.chdir(tmp_path)
    namespace = toy_data()
    exec(compile(example, str(ROOT / "README.md"), "exec"), namespace)
    assert (tmp_path / "nuts.pt").is_file()
    # the three posteriors of one model predict the toy curve better than its spread
    spread = float(namespace["y_test"].std())
    for posterior in (namespace["vi"], namespace["hmc"], namespace["la"]):
        assert posterior.model is namespace["model"]
        assert posterior.predict(namespace["x_test"]).metrics(namespace["y_test"])["rmse"] < spread


@pytest.mark.slow  # NUTS's 300 + 500 transitions of 4 chains and a 2000-epoch fit: about 30 s
def test_the_guides_blocks_run_in_order(tmp_path, monkeypatch):
    guide_page = ROOT / "docs" / "guide.md"
    blocks = python_blocks(guide_page)
    quick_start, pyro_svi, pyro_optim, verbs = blocks[:4]
    assert "pyrobnn.fit(" in quick_start and "pyro.infer.SVI" in pyro_svi and "JitTrace_ELBO" in pyro_optim
    assert "pyrobnn.nuts(" in verbs and "load_posterior" in verbs, "the guide's blocks moved: update this test's order"
    monkeypatch.chdir(tmp_path)
    namespace = toy_data()
    for block in (quick_start, pyro_svi, pyro_optim, verbs):
        exec(compile(block, str(guide_page), "exec"), namespace)
    assert (tmp_path / "bnn.pt").is_file() and (tmp_path / "nuts.pt").is_file()
    post = namespace["post"]  # the posterior loaded back from nuts.pt
    assert post.num_chains == 4 and post.num_draws == 300
    # the loaded posterior predicts what the sampled one did, draw for draw
    assert torch.equal(post.predict(namespace["x_test"]).mean, namespace["pred"].mean)
