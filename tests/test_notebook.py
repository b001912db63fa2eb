"""notebooks/quickstart.ipynb runs top to bottom (issue 42, item 3), and the pretrained
policy it shows drives.

The notebook's code cells run in order in one namespace, as a kernel would run them,
with ``JAXDRIVE_NOTEBOOK_SMOKE=1`` (8 held-out scenes, two training iterations) in a
temporary directory. The install cell runs too: jaxdrive is installed, so it installs
nothing. Checked: the pretrained policy reaches its goal on held-out scenes (a random
policy would almost never), the video and the learning curve are written. Those two
are ``slow``: the notebook compiles the quickstart's evaluation, rendering and training
programs, which no other test shares (51 s on a quiet 2-core CPU; docs/testing.md).
By default: the shipped policy loads with its checksums, and damaged files are
refused."""

import json
import os
import shutil
from pathlib import Path

import pytest

from jaxdrive.config import ConfigError

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"


@pytest.fixture(scope="module")
def namespace(tmp_path_factory):
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    work = tmp_path_factory.mktemp("notebook")
    before, env_before = os.getcwd(), dict(os.environ)
    os.environ.update(JAXDRIVE_NOTEBOOK_SMOKE="1", MPLBACKEND="Agg")
    os.chdir(work)
    ns: dict = {"__name__": "__main__"}
    try:
        for i, src in enumerate(code):
            exec(compile(src, f"{NOTEBOOK.name}[code cell {i}]", "exec"), ns)
    finally:
        os.chdir(before)
        os.environ.clear()
        os.environ.update(env_before)
    ns["_work"] = work
    return ns


@pytest.mark.slow
def test_the_pretrained_policy_drives_on_held_out_scenes(namespace):
    m = namespace["result"].metrics
    assert m["held_out/agent_episodes"] >= 20
    # The shipped policy's recorded held-out goal rate is 0.92; untrained parameters
    # reach almost no goal (the notebook's own 2-iteration run below shows it).
    assert m["held_out/goal_rate"] >= 0.7
    assert m["held_out/collision_rate"] <= 0.15
    assert namespace["info"]["results"]["val/goal_rate"] > 0.9


@pytest.mark.slow
def test_the_video_and_the_learning_curve_are_written(namespace):
    video = Path(namespace["result"].videos[0])
    assert video.suffix == ".mp4" and video.stat().st_size > 1000
    assert (namespace["_work"] / "notebook_curve.png").stat().st_size > 1000
    assert len(namespace["curve"]) == 2  # validation after each of the 2 iterations
    assert namespace["curve"][-1][1] < 0.5  # two iterations from scratch: not a driver


def test_the_shipped_policy_loads_as_its_manifest_says():
    import jax
    import numpy as np

    import jaxdrive
    from jaxdrive.runs.pretrained import manifest

    loaded = jaxdrive.pretrained("quickstart")
    info = manifest("quickstart")
    leaves = jax.tree.leaves(loaded.params)
    assert sum(np.size(x) for x in leaves) == info["params"] == 50_652
    assert loaded.step == info["step"] and loaded.config.policy.kind == info["policy"]
    assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
    assert loaded.config.env.scenario.max_agents == 8  # the quickstart's env


def test_a_damaged_or_unknown_pretrained_policy_is_refused(tmp_path, monkeypatch):
    from jaxdrive.runs import pretrained as module

    shutil.copytree(module.PRETRAINED_DIR / "quickstart", tmp_path / "quickstart")
    monkeypatch.setattr(module, "PRETRAINED_DIR", tmp_path)
    assert module.available() == ["quickstart"]
    raw = bytearray((tmp_path / "quickstart" / "params.npz").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "quickstart" / "params.npz").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"params.npz does not match its SHA-256"):
        module.pretrained("quickstart")
    with pytest.raises(ConfigError, match=r"no pretrained policy named 'nope'; available: "
                                          r"quickstart"):
        module.pretrained("nope")


def test_parameter_paths_round_trip_through_the_flat_files():
    import numpy as np

    from jaxdrive.runs.pretrained import _flat, _nested

    tree = {"params": {"a": {"kernel": np.ones((2, 3))}, "b": np.arange(4.0)}}
    flat = _flat(tree)
    assert sorted(flat) == ["params/a/kernel", "params/b"]
    back = _nested(flat)
    np.testing.assert_array_equal(back["params"]["a"]["kernel"], tree["params"]["a"]["kernel"])
    np.testing.assert_array_equal(back["params"]["b"], tree["params"]["b"])


def test_the_export_command_refuses_bad_input_before_writing(tmp_path, capsys, monkeypatch):
    from jaxdrive.runs import pretrained as module

    monkeypatch.setattr(module, "PRETRAINED_DIR", tmp_path / "pretrained")
    assert module.main([str(tmp_path / "missing"), "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    assert module.main([str(run), "../evil"]) == 2
    assert "must stay inside its output directory" in capsys.readouterr().err
    assert module.main([str(run), "x", "--results", "[1]"]) == 2
    assert "--results must be a JSON object" in capsys.readouterr().err
    assert not (tmp_path / "pretrained").exists() and not (tmp_path / "evil").exists()
