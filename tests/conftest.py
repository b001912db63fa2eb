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
# Commands the tests start as subprocesses (``python -m jaxdrive.X``) use the same cache,
# not the user's default one (``jaxdrive.compile_cache``).
os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"

# The test modules that take longest (summed test time on the 2-core CI machine, from
# `PYTHONPATH=tests python -m pytest -p compile_profile` and
# `experiments/test_time_report.py`), run first. pytest-xdist's `--dist loadfile` hands
# whole modules to the workers in collection order; with the long ones last, one worker
# ran them alone for minutes at the end while the other sat idle. Longest first (LPT
# order) keeps both busy to the end. Order within a module is unchanged. Some modules
# compile programs that later ones load from the shared persistent cache (test_eval's
# evaluators for test_golden_eval and the CLIs, its scenes for test_realism_eval;
# test_train_step's scenes for test_population and test_aux_goal): those stay ahead of
# their users.
LONGEST_FIRST = (
    "test_dense_rows.py", "test_train_run.py", "test_golden_env.py", "test_eval.py",
    "test_golden_models.py", "test_procedural_feasibility.py", "test_trial_env.py",
    "test_realism_eval.py", "test_env_rows.py", "test_env.py", "test_data_json.py",
    "test_golden_eval.py", "test_procedural.py", "test_train_step.py", "test_run_reliability.py",
    "test_render_video.py", "test_wosac.py", "test_dynamics.py", "test_inspect.py",
    "test_trial_measurement.py", "test_hidden_goal.py", "test_policy.py",
    "test_geometry.py", "test_policy_cache.py", "test_population.py", "test_aux_goal.py",
    "test_procedural_signals.py", "test_eval_planning.py", "test_selection.py",
    "test_checkpoint_integrity.py", "test_train_data.py", "test_cli.py", "test_trial_cli.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
