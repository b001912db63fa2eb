import os
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(__file__))

# One persistent XLA cache per test session: modules that build the same program (the
# trainer's step in several runs of one config, the env step at the shared test sizes)
# compile it once. Results are unaffected; only compile time is saved.
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("JAXDRIVE_TEST_XLA_CACHE")
                  or tempfile.mkdtemp(prefix="jaxdrive-test-xla-"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
