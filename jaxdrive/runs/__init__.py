"""Run directories: the run configuration (``config``), orbax checkpoints
(``checkpoint``) and reading a run back (``load``: ``read_run_config``,
``load_policy``). Below both ``train`` and ``eval``."""
