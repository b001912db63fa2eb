"""PPO training: ``python -m jaxdrive.train``, ``load_policy(run_dir)``.

Modules: ``config`` (run configuration), ``ppo`` (the jitted training step), ``gae``,
``losses``, ``validation``, ``checkpoint`` (orbax), ``run`` (the host loop), ``cli``.
"""


def __getattr__(name):  # lazy: ``jaxdrive.train.gae`` should not import orbax
    if name in ("load_policy", "train", "LoadedPolicy"):
        from jaxdrive.train import run

        return getattr(run, name)
    raise AttributeError(name)
