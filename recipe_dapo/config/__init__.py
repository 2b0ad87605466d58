"""The recipe's configuration: the Hydra config ``dapo_trainer.yaml`` on verl 0.9.1's ``ppo_trainer`` and its groups
``size/``, ``ablation/``, ``objective/``, ``sampling/``, ``platform/``; the typed ``dapo:`` section (``settings``); the
resolvers the YAML uses (``resolvers``); 'did you mean' for mistyped keys (``suggest``).

verl's ``ppo_trainer`` is found in the installed verl package by folder, without importing verl (``resolvers``).
Importing this package registers the resolvers at once (omegaconf only) and stores :class:`settings.DapoSettings` in
Hydra's ConfigStore as ``dapo_settings`` as soon as Hydra's ConfigStore is imported (``initialize_config_module``
imports this package first, then Hydra composes), so a process that only resolves a config never imports Hydra.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe_dapo.config.resolvers import register_resolvers, verl_config_dir
from recipe_dapo.import_hooks import when_imported


def _store_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from recipe_dapo.config.settings import DapoSettings

    ConfigStore.instance().store(name="dapo_settings", node=DapoSettings)


def register() -> None:
    """The resolvers and, once Hydra is imported, the ``dapo:`` schema (idempotent)."""
    register_resolvers()
    when_imported("hydra.core.config_store", _store_schema)


def select(config: DictConfig, key: str, default: Any = None) -> Any:
    """``config``'s value at the dotted ``key``, or ``default`` when a level is missing (the one config accessor:
    the start-up rules, the CPU memory check and the reward settings read through it)."""
    return OmegaConf.select(config, key, default=default)


def config_groups() -> list[str]:
    """Names of the config groups a command line may choose (``platform=cpu``): the recipe's and verl's."""
    groups = []
    for folder in (os.path.dirname(__file__), verl_config_dir()):
        groups += [name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)) and name[0] != "_"]
    return sorted(set(groups))


register()
