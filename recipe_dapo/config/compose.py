"""The one place the recipe's Hydra config is composed outside a ``@hydra.main`` entry point.

Every caller (the dry run, the memory plan's command line, the 'did you mean' hints, the start-up rule that compares a
run with the defaults) composes ``dapo_trainer`` through :func:`compose`, so the config module, the config name and
the Hydra version base are set once. Inside an entry point (``python -m recipe_dapo.main_dapo``) Hydra is already
initialised with the entry point's search path, and :func:`compose` composes there instead of initialising it again.
"""

from __future__ import annotations

from typing import Sequence

CONFIG_MODULE = "recipe_dapo.config"
CONFIG_NAME = "dapo_trainer"


def compose(overrides: Sequence[str] = ()):
    """The config ``python -m recipe_dapo.main_dapo <overrides>`` would train with (Hydra's compose API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside an entry point's @hydra.main: compose with its search path
        return hydra_compose(CONFIG_NAME, overrides=list(overrides))
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))
