"""jaxdrive.files: atomic writes keep the old file on failure, names stay inside a root."""

import os

import pytest

from jaxdrive.files import (
    OutputError,
    UnsafeNameError,
    atomic_open,
    atomic_write_text,
    check_writable,
    check_writable_file,
    confined,
    safe_name,
)


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_open(target) as f:
            f.write("half of the new")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@pytest.mark.parametrize("name", ["", " x", ".", "..", "../x", "a/b", "a\\b", "/abs", "a\x00b"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(UnsafeNameError, match="what"):
        safe_name(name, "what")


@pytest.mark.parametrize("name", ["default", "closed_loop.v2", "run-1_x"])
def test_plain_names_pass(name):
    assert safe_name(name, "what") == name


def test_confined_refuses_escapes_and_links_out(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert confined(root, "a", "b.mp4") == root.resolve() / "a" / "b.mp4"
    with pytest.raises(UnsafeNameError):
        confined(root, "..", "x")
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafeNameError):
        confined(root, "link", "x")


def test_check_writable_creates_and_names_bad_paths(tmp_path):
    assert check_writable(tmp_path / "new" / "dir").is_dir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputError, match=str(a_file)):
        check_writable(a_file)
    with pytest.raises(OutputError, match="file"):
        check_writable(a_file / "below")
    with pytest.raises(OutputError, match="is a directory"):
        check_writable_file(tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputError, match=str(locked)):
            check_writable(locked)
