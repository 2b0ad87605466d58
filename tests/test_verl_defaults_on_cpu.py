"""Defaults that verl changed between 0.9.0 and 0.9.1 and that the recipe relies on: the recipe's own config pins each
one, so a run means the same whichever of the two verl versions composes it.

How the list was made: verl 0.9.0's and 0.9.1's ``verl/trainer/config/_generated_ppo_trainer.yaml`` (the whole
composed ``ppo_trainer``), flattened to dotted keys and compared. Keys present in both with a different value:

    algorithm.filter_groups.metric    0.9.0: null    0.9.1: reward

Every other difference is a key added in 0.9.1 (profiler hooks, ``hybrid_rollout``, ``checkpoint_callback_class``,
``turbo_config``, ...) or removed from it (``router_replay``, ``data.continuous_token``); the recipe sets none of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import compose_recipe_config

CHANGED_DEFAULTS = {
    # key: (verl 0.9.0's default, verl 0.9.1's default, the value the recipe pins)
    "algorithm.filter_groups.metric": (None, "reward", "acc"),
}

RECIPE_YAML = Path(__file__).resolve().parents[1] / "recipe_dapo" / "config" / "dapo_trainer.yaml"


def _verl_default(key: str):
    """The installed verl's own default (its generated, fully composed ppo_trainer config)."""
    from recipe_dapo.config.resolvers import verl_config_dir

    generated = yaml.safe_load((Path(verl_config_dir()) / "_generated_ppo_trainer.yaml").read_text())
    return OmegaConf.select(OmegaConf.create(generated), key, default="<absent>")


@pytest.mark.parametrize("key", sorted(CHANGED_DEFAULTS))
def test_the_installed_verl_has_one_of_the_two_defaults_the_list_records(key):
    """Positive control of the test below: the installed verl's default is one the recipe must not inherit (verl
    0.9.1's), so a recipe config that dropped the key would compose to it and fail there."""
    old, new, pinned = CHANGED_DEFAULTS[key]
    assert _verl_default(key) in (old, new)
    assert _verl_default(key) != pinned


@pytest.mark.parametrize("key", sorted(CHANGED_DEFAULTS))
def test_the_recipes_config_pins_every_default_verl_changed(key):
    """The key is written in the recipe's own YAML (not inherited), every size and every ablation composes to the
    pinned value, and no size or ablation file writes another value (so no pairing of them can: a composed key holds
    the value of the last file that writes it)."""
    _, _, pinned = CHANGED_DEFAULTS[key]
    own = OmegaConf.create(yaml.safe_load(RECIPE_YAML.read_text()))
    assert OmegaConf.select(own, key, default="<absent>") == pinned, f"{RECIPE_YAML.name} must set {key}={pinned}"
    config_dir = RECIPE_YAML.parent
    options = {group: sorted(path for path in (config_dir / group).glob("*.yaml")) for group in ("size", "ablation")}
    assert options["size"] and options["ablation"]
    for group, paths in options.items():
        for path in paths:
            written = OmegaConf.select(OmegaConf.create(yaml.safe_load(path.read_text()) or {}), key, default="<absent>")
            assert written in ("<absent>", pinned), f"{group}/{path.name} writes {key}={written}, expected {pinned}"
            config = compose_recipe_config([f"{group}={path.stem}"])
            value = OmegaConf.select(config, key)
            if key == "algorithm.filter_groups.metric" and not config.algorithm.filter_groups.enable:
                continue  # an ablation without dynamic sampling may leave the metric unused
            assert value == pinned, f"{group}={path.stem}: {key}={value}, expected {pinned}"


def test_the_file_scan_sees_a_size_that_writes_another_value(tmp_path):
    """Positive control of the scan above: a size file that writes the key is read as writing it."""
    size = tmp_path / "size.yaml"
    size.write_text("# @package _global_\nalgorithm:\n  filter_groups:\n    metric: reward\n")
    written = OmegaConf.select(OmegaConf.create(yaml.safe_load(size.read_text())), "algorithm.filter_groups.metric")
    assert written == "reward"
