"""The ``verl.plugins`` entry point: registers every recipe component, lazily.

verl imports each ``verl.plugins`` entry point inside ``import verl``, in the driver and in every Ray worker,
so this module must cost next to nothing (``bench/plugin_import_cost.py`` measures it). It imports:

- the CPU platform, only where ``recipe_dapo.cpu.detect.cpu_platform_wanted()`` says so (``platform=cpu``, or no
  accelerator outside Ray), before anything asks verl for its platform;
- the ``dapo`` policy loss and the ``grpo_process`` advantage estimator, when verl imports its registries
  (``core_algos``);
- the ``recipe_dapo`` reward manager, when verl imports its reward-loop registry package;
- the ``recipe_dapo_seeded`` agent loop (seeded rollouts), when verl imports its agent-loop package.

verl logs a failed plugin import only at DEBUG level; ``registered_components`` lets the start-up check confirm,
in the driver and in a worker, that the registrations really happened (see ``preflight``).
"""

from __future__ import annotations

import importlib
import logging
import sys

from recipe_dapo.cpu.detect import cpu_platform_wanted
from recipe_dapo.import_hooks import failed_hooks, when_imported

POLICY_LOSS_REGISTRY_MODULE = "verl.trainer.ppo.core_algos"
REWARD_MANAGER_REGISTRY_MODULE = "verl.experimental.reward_loop.reward_manager"
AGENT_LOOP_REGISTRY_MODULE = "verl.experimental.agent_loop"

SEEDED_AGENT_LOOP = "recipe_dapo_seeded"
"""The name the seeded agent loop registers under (``trainers.classic.seeded_agent_loop``)."""

# module that registers a component -> the verl module it registers into
COMPONENT_MODULES = {
    "recipe_dapo.loss.dapo": POLICY_LOSS_REGISTRY_MODULE,
    "recipe_dapo.advantages.estimator": POLICY_LOSS_REGISTRY_MODULE,  # the advantage-estimator registry's module too
    "recipe_dapo.reward.manager": REWARD_MANAGER_REGISTRY_MODULE,
    "recipe_dapo.trainers.classic.seeded_agent_loop": AGENT_LOOP_REGISTRY_MODULE,
}
CPU_PLATFORM_MODULE = "recipe_dapo.cpu.platform"

logger = logging.getLogger(__name__)

if cpu_platform_wanted():
    try:
        importlib.import_module(CPU_PLATFORM_MODULE)
    except Exception as _error:  # e.g. a verl without verl.plugin.platform: never break `import verl`
        failed_hooks[CPU_PLATFORM_MODULE] = _error
        logger.warning("recipe_dapo: the CPU platform did not register", exc_info=True)

if "vllm" in sys.modules:
    # A vLLM engine process that imports verl (verl's worker extension does, before the model loads). Where the
    # recipe is installed its `vllm.general_plugins` entry point already did this; where it is only shipped with a
    # Ray job (VERL_USE_EXTERNAL_MODULES, no entry points), this is the only way vLLM-CPU keeps its weights
    # syncable. A no-op off the CPU platform, and repeating it is harmless.
    try:
        from recipe_dapo.cpu.vllm_plugin import register as _register_vllm_cpu

        _register_vllm_cpu()
    except Exception as _error:
        failed_hooks["recipe_dapo.cpu.vllm_plugin"] = _error
        logger.warning("recipe_dapo: the vLLM-CPU weight patch did not apply", exc_info=True)

for _component, _registry in COMPONENT_MODULES.items():
    when_imported(_registry, lambda module=_component: importlib.import_module(module))


class PluginNotLoadedError(RuntimeError):
    """The recipe's verl plugins are not registered in some process."""


def registered_components() -> dict[str, bool]:
    """What this process has registered in verl's registries (imports them: used by the start-up check)."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    from recipe_dapo.compat.verl import registered_agent_loops

    return {
        "policy_loss:dapo": "dapo" in POLICY_LOSS_REGISTRY,
        "adv_estimator:grpo_process": "grpo_process" in ADV_ESTIMATOR_REGISTRY,
        "reward_manager:recipe_dapo": "recipe_dapo" in REWARD_MANAGER,
        f"agent_loop:{SEEDED_AGENT_LOOP}": SEEDED_AGENT_LOOP in registered_agent_loops(),
    }


def registration_errors() -> dict[str, str]:
    """verl module -> the error its recipe registration raised (empty when all went well)."""
    return {module: repr(error) for module, error in failed_hooks.items()}


def check_plugins_registered(where: str) -> None:
    """Fail loudly when the ``verl.plugins`` entry point did not register the recipe in this process."""
    import verl  # noqa: F401  (importing verl is what loads the plugins)

    try:
        missing = [name for name, ok in registered_components().items() if not ok]
        error = registration_errors() or None
    except Exception as exc:  # verl's registries (or the recipe's modules they import) failed to import
        missing, error = ["recipe_dapo.plugin"], exc
    if CPU_PLATFORM_MODULE in failed_hooks:  # the plugin's import of the CPU platform failed (see above)
        missing.append("platform:cpu")
    if missing:
        raise PluginNotLoadedError(
            f"recipe_dapo components are not registered in {where}: missing {missing}"
            + (f" (importing or registering recipe_dapo.plugin failed: {error!r})" if error else "")
            + ". verl loads them through the 'verl.plugins' entry point: install the recipe into the Python "
            "environment the workers use (`pip install -e .` in this repository, or add it to the Ray "
            "runtime_env), and make sure VERL_USE_EXTERNAL_PLUGINS is unset, 'auto' or includes 'recipe_dapo'."
        )
