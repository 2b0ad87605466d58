"""`import verl` alone registers the recipe (verl.plugins entry point), and a missing plugin fails loudly."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_importing_verl_in_a_fresh_process_registers_loss_and_reward_manager():
    # Nothing from recipe_dapo is imported explicitly: only verl's entry-point discovery can register these.
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
        "from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER\n"
        "print('dapo' in POLICY_LOSS_REGISTRY, 'recipe_dapo' in REWARD_MANAGER)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True True"


def test_missing_component_names_what_is_missing_and_how_to_fix_it(monkeypatch):
    import recipe_dapo.plugin as plugin
    from recipe_dapo.preflight import PluginNotLoadedError, check_plugins_registered

    monkeypatch.setattr(plugin, "registered_components", lambda: {"policy_loss:dapo": True, "reward_manager:recipe_dapo": False})
    with pytest.raises(PluginNotLoadedError) as error:
        check_plugins_registered(where="a Ray worker")
    message = str(error.value)
    assert "reward_manager:recipe_dapo" in message and "a Ray worker" in message and "pip install -e ." in message
