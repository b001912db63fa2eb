"""The golden comparison itself: bit for bit on the recording machine, floats within a
tolerance on another one, integers exact everywhere."""

import json

import golden_cases
import golden_check
import numpy as np
import pytest

RECORDED = {"x": np.array([1.0, 2.0, 3.0], np.float32), "n": np.array([1, 2], np.int32)}


@pytest.fixture
def case(tmp_path, monkeypatch):
    """A golden case ``toy`` recorded in ``tmp_path``; returns a setter for what the
    case computes now and for the machine it was recorded on."""
    np.savez(tmp_path / "toy.npz", **RECORDED)
    now = {}
    monkeypatch.setattr(golden_cases, "path", lambda name: str(tmp_path / f"{name}.npz"))
    monkeypatch.setattr(golden_cases, "all_cases", lambda: {"toy": lambda: dict(now)})

    def set_case(arrays, recorded_on):
        now.clear()
        now.update(arrays)
        monkeypatch.setattr(golden_cases, "recorded_machines", lambda: {"toy": recorded_on})

    return set_case


def _bumped(ulps: float) -> np.ndarray:
    return RECORDED["x"] * np.float32(1 + ulps * 2.0**-23)


def test_same_machine_is_bit_for_bit(case):
    here = golden_cases.machine()
    case(RECORDED, here)
    golden_check.check_case("toy")  # equal: passes
    case({**RECORDED, "x": _bumped(2)}, here)
    with pytest.raises(AssertionError, match="x: 3 entries differ"):
        golden_check.check_case("toy")


def test_other_machine_allows_float_rounding_only(case):
    elsewhere = {**golden_cases.machine(), "cpu_vendor": "SomeOtherVendor"}
    case({**RECORDED, "x": _bumped(8)}, elsewhere)  # ~1e-6 relative: rounding
    golden_check.check_case("toy")
    case({**RECORDED, "x": RECORDED["x"] + np.float32(1e-3)}, elsewhere)
    with pytest.raises(AssertionError, match="beyond the other-machine tolerance"):
        golden_check.check_case("toy")
    case({**RECORDED, "n": np.array([1, 3], np.int32)}, elsewhere)
    with pytest.raises(AssertionError, match="n: 1 entries differ"):
        golden_check.check_case("toy")


def test_another_cpu_generation_or_an_older_record_is_another_machine(monkeypatch):
    here = golden_cases.machine()
    older_record = {k: v for k, v in here.items() if k != "cpu"}  # before "cpu" was kept
    monkeypatch.setattr(golden_cases, "recorded_machines", lambda: {
        "same": dict(here), "zen_other": {**here, "cpu": "family 25 model 1"},
        "old": older_record})
    assert golden_check.same_machine("same")
    assert not golden_check.same_machine("zen_other")
    assert not golden_check.same_machine("old")


def test_recording_keeps_a_bit_identical_file_and_rewrites_a_changed_one(
        case, tmp_path, monkeypatch):
    monkeypatch.setattr(golden_cases, "MACHINES_PATH", str(tmp_path / "machines.json"))
    monkeypatch.setattr(golden_cases, "recorded_machines", lambda: {})
    toy = tmp_path / "toy.npz"
    before = toy.read_bytes()
    case(RECORDED, {})
    golden_cases.main(["toy"])
    assert toy.read_bytes() == before  # same arrays: file untouched
    machines = json.loads((tmp_path / "machines.json").read_text())
    assert machines == {"toy": golden_cases.machine()}
    case({**RECORDED, "x": _bumped(1)}, {})
    golden_cases.main(["toy"])
    with np.load(toy) as written:
        np.testing.assert_array_equal(written["x"], _bumped(1))
