"""`import verl` alone registers the recipe (verl.plugins entry point), and a missing plugin fails loudly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import fresh_pythons


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
    from recipe_dapo.plugin import PluginNotLoadedError, check_plugins_registered

    monkeypatch.setattr(plugin, "registered_components", lambda: {"policy_loss:dapo": True, "reward_manager:recipe_dapo": False})
    with pytest.raises(PluginNotLoadedError) as error:
        check_plugins_registered(where="a Ray worker")
    message = str(error.value)
    assert "reward_manager:recipe_dapo" in message and "a Ray worker" in message and "pip install -e ." in message


def fresh_env(**env) -> dict:
    import os

    environ = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_RAYLET_PID", "VLLM_TARGET_DEVICE")}
    return dict(environ, **env)


def run_fresh(code: str, **env) -> str:
    return fresh_pythons((code, fresh_env(**env)))[0]


MODULES_AFTER_IMPORT_VERL = "import sys, verl\nprint(' '.join(sorted(sys.modules)))\n"
LIGHT = {
    "recipe_dapo", "recipe_dapo.plugin", "recipe_dapo.import_hooks", "recipe_dapo.config", "recipe_dapo.config.resolvers",
    "recipe_dapo.cpu",
    "recipe_dapo.cpu.detect", "recipe_dapo.compat", "recipe_dapo.compat.stdlib",
}


@pytest.mark.parametrize(
    "env, cpu_platform",
    [
        ({"VERL_PLATFORM": "cuda"}, False),  # a GPU machine (the platform verl would detect there, pinned)
        ({"RAY_RAYLET_PID": "1"}, False),  # a GPU job's Ray worker on a node without a GPU
        ({"VERL_PLATFORM": "cpu"}, True),  # platform=cpu
    ],
)
def test_import_verl_with_the_plugin_loads_only_what_the_process_asked_for(env, cpu_platform):
    """The loss and reward manager wait for verl's registries; the CPU platform comes only where it is wanted."""
    bare, with_plugin = fresh_pythons((MODULES_AFTER_IMPORT_VERL, fresh_env(VERL_USE_EXTERNAL_PLUGINS="none", **env)),
                                      (MODULES_AFTER_IMPORT_VERL, fresh_env(**env)))
    added = set(with_plugin.split()) - set(bare.split())
    expected_cpu = {"recipe_dapo.cpu.platform", "recipe_dapo.cpu.compat", "recipe_dapo.compat.torch",
                    "recipe_dapo.compat.verl"}
    assert added - expected_cpu == LIGHT
    assert (expected_cpu <= added) == cpu_platform


def test_registries_get_the_recipe_when_verl_imports_them_even_after_other_imports():
    code = (
        "import verl, sys\n"
        "import verl.trainer.ppo.core_algos as core_algos\n"
        "from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "print('dapo' in core_algos.POLICY_LOSS_REGISTRY, get_reward_manager_cls('recipe_dapo').__module__,\n"
        "      _agent_loop_registry['recipe_dapo_seeded']['_target_'])\n"
    )
    assert run_fresh(code, VERL_PLATFORM="cuda") == (
        "True recipe_dapo.reward.manager recipe_dapo.trainers.classic.seeded_agent_loop.SeededSingleTurnAgentLoop"
    )


def test_a_failing_registration_is_reported_by_the_start_up_check_not_by_a_broken_verl_import():
    code = (
        "import sys, types\n"
        "sys.modules['recipe_dapo.loss.dapo'] = None  # importing it raises ImportError\n"
        "import verl\n"
        "import verl.trainer.ppo.core_algos  # must still import\n"
        "from recipe_dapo.plugin import PluginNotLoadedError, check_plugins_registered\n"
        "try:\n"
        "    check_plugins_registered('the driver')\n"
        "except PluginNotLoadedError as error:\n"
        "    print('policy_loss:dapo' in str(error) and 'import of recipe_dapo.loss.dapo halted' in str(error))\n"
    )
    assert run_fresh(code, VERL_PLATFORM="cuda") == "True"


def test_vllm_general_plugin_imports_nothing_in_a_gpu_engine():
    code = (
        "import sys\n"
        "from recipe_dapo.cpu.vllm_plugin import register\n"
        "register()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'verl', 'torch')))\n"
    )
    assert run_fresh(code) == "[]"


def test_the_seeded_agent_loop_hands_the_rows_seed_to_vllm(monkeypatch):
    import asyncio

    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from recipe_dapo.trainers.classic.seeded_agent_loop import SeededSingleTurnAgentLoop

    seen = []

    async def verl_single_turn_run(self, sampling_params, **kwargs):
        seen.append((sampling_params, kwargs))

    monkeypatch.setattr(SingleTurnAgentLoop, "run", verl_single_turn_run)
    loop = object.__new__(SeededSingleTurnAgentLoop)  # the run method only; its constructor needs a rollout server
    asyncio.run(loop.run({"temperature": 1.0}, rollout_seed=np.int64(1234), raw_prompt=["hi"]))
    asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=["hi"]))
    assert seen[0] == ({"temperature": 1.0, "seed": 1234}, {"raw_prompt": ["hi"]})
    assert seen[1] == ({"temperature": 1.0}, {"raw_prompt": ["hi"]})
