"""The recipe's Hydra config: ``dapo_trainer.yaml`` on verl 0.9.1's ``ppo_trainer``, and its groups ``size/``,
``ablation/``, ``sampling/``, ``platform/``.

verl's ``ppo_trainer`` is found in the installed verl package by folder, without importing verl
(``recipe_dapo.config.resolvers``). The ``dapo:`` section is :class:`recipe_dapo.config.settings.DapoSettings`, stored in
Hydra's ConfigStore as ``dapo_settings``. Importing this package registers both, and the resolvers the YAML uses:
``initialize_config_module`` imports it, and the entry points (``main_dapo``, ``dry_run``) import it before Hydra
composes.
"""

from __future__ import annotations

import os

from recipe_dapo.config.resolvers import register_resolvers, verl_config_dir


def register() -> None:
    """The resolvers and the ``dapo:`` schema (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from recipe_dapo.config.settings import DapoSettings

    register_resolvers()
    ConfigStore.instance().store(name="dapo_settings", node=DapoSettings)


def config_groups() -> list[str]:
    """Names of the config groups a command line may choose (``platform=cpu``): the recipe's and verl's."""
    groups = []
    for folder in (os.path.dirname(__file__), verl_config_dir()):
        groups += [name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)) and name[0] != "_"]
    return sorted(set(groups))


register()
