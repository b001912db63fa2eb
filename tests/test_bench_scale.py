"""``python -m jaxdrive.bench train --devices``: one worker process per device count,
interleaved timing, records with ``devices`` and ``mesh``; bad input exits 2 before any
worker starts."""

import json

import pytest
import yaml
from test_train_run import STEPS_PER_IT, TINY

from jaxdrive.bench import cli as bench
from jaxdrive.bench.scale import configurations


def test_configurations_plain_on_one_device_mesh_on_more():
    def runs(mesh):
        return [(c["devices"], c["mesh"]) for c in configurations(["mlp"], [1, 2], mesh)]

    assert runs("off") == [(1, False), (2, True)]
    assert runs("on") == [(1, True), (2, True)]
    assert runs("both") == [(1, False), (1, True), (2, True)]


def test_bad_devices_exit_2_before_any_worker(tmp_path, capsys):
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(TINY))  # train.num_envs = 2
    base = ["train", "--config", str(config_file), "--policy", "mlp",
            "--json", str(tmp_path / "s.json")]
    assert bench.main(base + ["--devices", "1,4"]) == 2
    assert "does not divide over [4]" in capsys.readouterr().err
    assert bench.main(base + ["--devices", "1,x"]) == 2
    assert bench.main(base + ["--devices", "0"]) == 2
    assert bench.main(base + ["--mesh", "both"]) == 2  # needs --devices
    assert "jaxdrive bench train" not in capsys.readouterr().out


@pytest.mark.slow
def test_bench_train_devices_1_2_records(tmp_path):
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "s.json"
    assert bench.main(["train", "--config", str(config_file), "--policy", "mlp",
                       "--devices", "1,2", "--repeats", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "train_scale"
    recs = data["records"]
    assert [(r["devices"], r["mesh"]) for r in recs] == [(1, False), (2, True)]
    for r in recs:
        assert r["policy"] == "mlp" and r["backend"] == "cpu"
        assert r["steps_per_s"] > 0 and r["trained_steps_per_s"] > 0 and r["compile_s"] > 0
        assert r["per_device_steps_per_s"] == pytest.approx(r["steps_per_s"] / r["devices"])
        assert len(r["iteration_s_all"]) == 2 and r["rounds"] == 2
        assert r["agent_steps_per_iteration"] == STEPS_PER_IT
    assert recs[0]["ratio_to_1_device"] == 1.0 and recs[1]["ratio_to_1_device"] > 0
    assert recs[0]["paired_ratio_to_1_device"] == 1.0 and recs[1]["paired_ratio_to_1_device"] > 0

    # In process, --mesh forces the data-mesh path on this one device.
    out = tmp_path / "m.json"
    assert bench.main(["train", "--config", str(config_file), "--policy", "mlp", "--mesh",
                       "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["devices"] == 1 and data["mesh"] is True and data["steps_per_s"] > 0
