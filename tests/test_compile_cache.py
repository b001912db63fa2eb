"""The persistent compilation cache of the commands (``jaxdrive.compile_cache``, issue 39,
item 6): where it lives, how to turn it off, and that a command run through
``run_command`` stores its compiled programs there."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax

from jaxdrive import compile_cache


def test_default_dir_follows_jaxdrive_cache_dir_then_xdg_then_home(tmp_path):
    assert compile_cache.default_dir({"JAXDRIVE_CACHE_DIR": str(tmp_path / "c")}) == \
        tmp_path / "c"
    assert compile_cache.default_dir({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "jaxdrive" / "xla"
    home = Path(os.path.expanduser("~"))
    assert compile_cache.default_dir({}) == home / ".cache" / "jaxdrive" / "xla"


def test_a_directory_already_set_is_kept_and_off_turns_it_off(tmp_path):
    current = jax.config.jax_compilation_cache_dir  # the test run's own (conftest)
    assert current
    assert compile_cache.enable({"JAXDRIVE_CACHE_DIR": str(tmp_path)}) == current
    for off in ("off", "0", "False", " no "):
        assert compile_cache.enable({"JAXDRIVE_COMPILATION_CACHE": off}) is None
    assert jax.config.jax_compilation_cache_dir == current
    assert not any(tmp_path.iterdir())


SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp
    from jaxdrive import compile_cache
    from jaxdrive.command import run_command
    out = {}
    out["off"] = compile_cache.enable({"JAXDRIVE_COMPILATION_CACHE": "off"})
    out["unwritable"] = compile_cache.enable({"JAXDRIVE_CACHE_DIR": sys.argv[1] + "/file/x"})
    out["dir_after_both"] = jax.config.jax_compilation_cache_dir

    def main(argv):
        jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).block_until_ready()
        return 0

    out["rc"] = run_command(main, "test", [])
    out["dir"] = jax.config.jax_compilation_cache_dir
    print(json.dumps(out))
""")


def test_a_command_stores_its_programs_in_the_default_cache(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(JAXDRIVE_CACHE_DIR=str(tmp_path / "cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off"] is None and out["unwritable"] is None
    assert out["dir_after_both"] is None  # neither touched JAX's config
    assert f"note: no compilation cache ({tmp_path}/file/x" in proc.stderr
    assert "JAXDRIVE_COMPILATION_CACHE=off" in proc.stderr
    assert out["rc"] == 0 and out["dir"] == str(tmp_path / "cache")
    assert any((tmp_path / "cache").iterdir())  # the jitted program was written


def test_prune_drops_the_least_recently_used_files_to_three_quarters(tmp_path):
    for i in range(10):  # 100 bytes each, used at times 0..9
        f = tmp_path / f"entry{i}"
        f.write_bytes(bytes(100))
        os.utime(f, (1000 + i, 1000 + i))
    assert compile_cache.prune(tmp_path, 1000) == 0  # at the limit: nothing goes
    assert compile_cache.prune(tmp_path, 800) == 400  # 1,000 -> 600 <= 0.75 x 800
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"entry{i}" for i in range(4, 10)]
