"""PPO training: ``python -m jaxdrive.train``.

Modules: ``ppo`` (the jitted training step), ``gae``, ``losses``, ``validation``, ``run``
(the host loop), ``cli``. The run configuration, checkpoints and ``load_policy`` live in
``jaxdrive.runs`` (below ``train`` and ``eval``); ``jaxdrive.train.load_policy`` stays
as a shortcut.
"""


def __getattr__(name):  # lazy: ``jaxdrive.train.gae`` should not import orbax
    if name in ("load_policy", "LoadedPolicy"):
        from jaxdrive.runs import load

        return getattr(load, name)
    if name == "train":
        from jaxdrive.train import run

        return run.train
    raise AttributeError(name)
