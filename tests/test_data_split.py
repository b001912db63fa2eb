"""Real scenes as shipped (issue 38, item 1): ``.json.gz`` files and directories of them
read like the uncompressed files, and a deterministic training / validation split by
scenario id (``data convert --split``). Host-side only: no JAX programs."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from test_data_reliability import SIZES, scene

from jaxdrive.data import json_scene
from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.json_scene import read_json_scene
from jaxdrive.data.raw import SceneError
from jaxdrive.data.sources import expand_inputs
from jaxdrive.data.split import split_of

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAIN44 = SHARED / "womd_json_train"


def _assert_same_scene(a, b) -> None:
    for field in a.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=field)
        elif field != "source":
            assert x == y, field


def test_a_gzip_scene_reads_like_the_uncompressed_file(tmp_path):
    text = json.dumps(scene(3)).encode()
    (tmp_path / "s.json").write_bytes(text)
    (tmp_path / "s.json.gz").write_bytes(gzip.compress(text))
    (tmp_path / "renamed.json").write_bytes(gzip.compress(text))  # found by its bytes
    plain = read_json_scene(tmp_path / "s.json")
    _assert_same_scene(plain, read_json_scene(tmp_path / "s.json.gz"))
    _assert_same_scene(plain, read_json_scene(tmp_path / "renamed.json"))
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"not a scene"))
    assert [(Path(f).name, k) for f, k in expand_inputs([str(tmp_path)])] == [
        ("renamed.json", "json"), ("s.json", "json"), ("s.json.gz", "json")]


def test_damaged_or_oversized_gzip_is_a_scene_error_naming_the_file(tmp_path, monkeypatch):
    data = gzip.compress(json.dumps(scene(3)).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SceneError, match=f"{cut}: damaged gzip file"):
        read_json_scene(cut)
    ok = tmp_path / "ok.json.gz"
    ok.write_bytes(data)
    monkeypatch.setattr(json_scene, "MAX_JSON_BYTES", 1000)
    with pytest.raises(SceneError, match=f"{ok}: inflates to more than"):
        read_json_scene(ok)


def test_the_split_depends_on_the_scenario_id_only(tmp_path, capsys):
    """Converting with --split train and --split validation partitions the scenes (every
    scene in exactly one cache), and a scene's split does not change with its file
    format, the order of the inputs or the other scenes converted with it."""
    ids = [f"scene{i}" for i in range(12)]
    for i in range(12):
        data = json.dumps(scene(i)).encode()
        name = f"s{i:02d}.json" + (".gz" if i % 2 else "")
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(gzip.compress(data) if i % 2 else data)
    kept = {}
    for split in ("train", "validation"):
        out = tmp_path / split
        assert cli(["convert", str(tmp_path / "in"), "--out", str(out), *SIZES, "--split",
                    split, "--validation-fraction", "0.3"]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        kept[split] = [r["scenario_id"] for r in manifest["scenarios"]]
        assert manifest["split"]["name"] == split
        assert manifest["split"]["scenes_of_the_other_split"] == 12 - len(kept[split])
        assert all(split_of(i, 0.3) == split for i in kept[split])
    assert sorted(kept["train"] + kept["validation"]) == sorted(ids)
    assert kept["train"] and kept["validation"]
    # One scene on its own, uncompressed: the same split as among the twelve.
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps(scene(5)))
    split5 = "train" if "scene5" in kept["train"] else "validation"
    assert cli(["convert", str(alone), "--out", str(tmp_path / "one"), *SIZES, "--split",
                split5, "--validation-fraction", "0.3"]) == 0
    assert json.loads((tmp_path / "one" / "manifest.json").read_text())["num_scenarios"] == 1
    capsys.readouterr()


def test_the_validation_fraction_is_the_share_of_scenes():
    """Over 4,000 random ids the validation share is the fraction within 4 standard
    deviations of a binomial draw; the fraction is checked."""
    rng = random.Random(38)
    ids = [f"{rng.getrandbits(64):016x}" for _ in range(4000)]
    for fraction in (0.1, 0.2, 0.5):
        share = np.mean([split_of(i, fraction) == "validation" for i in ids])
        assert abs(share - fraction) < 4 * np.sqrt(fraction * (1 - fraction) / 4000)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        split_of("x", 1.0)
    with pytest.raises(SystemExit):
        cli(["convert", "x", "--out", "y", "--validation-fraction", "nan"])


@pytest.mark.skipif(not TRAIN44.is_dir(), reason=f"real scenes not found in {TRAIN44}")
def test_real_gzip_scenes_read_like_their_json(tmp_path):
    """Every shipped ``.json.gz`` equals its inflated JSON read as a plain file, and the
    SOURCES.tsv checksum of the uncompressed bytes matches."""
    import hashlib

    sources = {line.split("\t")[0]: line.split("\t")[3] for line in
               (TRAIN44 / "SOURCES.tsv").read_text().splitlines()[1:] if line.strip()}
    files = sorted(TRAIN44.glob("*.json.gz"))
    assert len(files) == 44 == len(sources)
    for path in files[:3]:
        text = gzip.decompress(path.read_bytes())
        assert hashlib.sha256(text).hexdigest() == sources[path.name]
        plain = tmp_path / path.name[: -len(".gz")]
        plain.write_bytes(text)
        _assert_same_scene(read_json_scene(plain), read_json_scene(path))
