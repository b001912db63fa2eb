import os
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(__file__))

# One persistent XLA cache per test run, shared by the pytest-xdist workers: modules that
# build the same program (the trainer's step in several runs of one config, the env step
# at the shared test sizes) compile it once. Results are unaffected; only compile time
# is saved. The workers of one run share PYTEST_XDIST_TESTRUNUID.
_run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if os.environ.get("JAXDRIVE_TEST_XLA_CACHE"):
    _cache = os.environ["JAXDRIVE_TEST_XLA_CACHE"]
elif _run_id:
    _cache = os.path.join(tempfile.gettempdir(), f"jaxdrive-test-xla-{_run_id}")
    os.makedirs(_cache, exist_ok=True)
else:
    _cache = tempfile.mkdtemp(prefix="jaxdrive-test-xla-")
jax.config.update("jax_compilation_cache_dir", _cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
