"""The ``verl.plugins`` entry point: importing this module registers every recipe component.

verl imports each ``verl.plugins`` entry point inside ``import verl``, in the driver and in every Ray
worker, but logs a failed import only at DEBUG level. ``registered_components`` lets the trainer check
at start-up, in the driver and in a worker, that the import really happened (see ``preflight``).
"""

from __future__ import annotations

import importlib

# Order matters: the CPU platform must be registered before anything asks verl for its platform.
COMPONENT_MODULES = (
    "recipe_dapo.cpu.platform",
    "recipe_dapo.loss",
    "recipe_dapo.reward.manager",
)

for _module in COMPONENT_MODULES:
    importlib.import_module(_module)


def registered_components() -> dict[str, bool]:
    """What this process has registered in verl's registries (used by the start-up check)."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    return {
        "policy_loss:dapo": "dapo" in POLICY_LOSS_REGISTRY,
        "reward_manager:recipe_dapo": "recipe_dapo" in REWARD_MANAGER,
    }
