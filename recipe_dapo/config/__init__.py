"""The recipe's Hydra config: ``dapo_trainer.yaml`` on verl 0.9.1's ``ppo_trainer``, plus config groups.

verl's ``ppo_trainer`` is found in the installed verl package by folder (``file://``), located without importing
verl: a ``pkg://verl.trainer.config`` search path would import verl (and torch, and the plugins) just to read
YAML, which made every configuration mistake take tens of seconds to report. The folder comes from the
``recipe_dapo_verl_config_dir`` resolver.

The ``dapo:`` section is :class:`recipe_dapo.settings.DapoSettings`, stored in Hydra's ConfigStore as
``dapo_settings``. Both are registered when this package is imported: ``initialize_config_module`` imports it,
and the entry points (``main_dapo``, ``dry_run``) import it before Hydra composes.
"""

from __future__ import annotations

import importlib.util
import os

from omegaconf import OmegaConf

VERL_CONFIG_RESOLVER = "recipe_dapo_verl_config_dir"


def verl_config_dir() -> str:
    """The folder of verl's trainer configs in the installed verl package (verl is not imported)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed in this Python environment; install the recipe with its extras")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")
    if not os.path.isfile(os.path.join(folder, "ppo_trainer.yaml")):
        raise RuntimeError(f"verl's ppo_trainer.yaml is not in {folder}; is verl 0.9.1 installed?")
    return folder


def register() -> None:
    """The resolver that finds verl's configs, and the ``dapo:`` schema (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from recipe_dapo.settings import DapoSettings

    if not OmegaConf.has_resolver(VERL_CONFIG_RESOLVER):
        OmegaConf.register_new_resolver(VERL_CONFIG_RESOLVER, verl_config_dir)
    ConfigStore.instance().store(name="dapo_settings", node=DapoSettings)


def config_groups() -> list[str]:
    """Names of the config groups a command line may choose (``platform=cpu``): the recipe's and verl's."""
    groups = []
    for folder in (os.path.dirname(__file__), verl_config_dir()):
        groups += [name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name)) and name[0] != "_"]
    return sorted(set(groups))


register()
