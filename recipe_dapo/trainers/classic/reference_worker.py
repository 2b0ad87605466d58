"""Iterative RL's reset of the reference model: verl's ``ActorRolloutRefWorker`` with one more method,
``reset_reference_to_actor``, that copies the actor's weights into the reference model (both live in the same worker
process, sharded alike), and the copy itself. ``recipe_dapo.loss.reference_reset`` decides when; the classic task
runner uses this worker only when ``dapo.objective.reference_reset_every > 0``.
"""

from __future__ import annotations

import ray
import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker


@torch.no_grad()
def copy_policy_into_reference(policy: torch.nn.Module, reference: torch.nn.Module) -> int:
    """Copy every parameter and buffer of ``policy`` into the same-named one of ``reference``, each rank its own shard
    (FSDP2 ``DTensor`` s are copied shard to shard, across devices when one model is offloaded). Returns the number
    of tensors copied; a name or shard shape that differs is an error (the two must be the same model)."""
    source = dict(policy.named_parameters())
    source.update(policy.named_buffers())
    targets = dict(reference.named_parameters())
    targets.update(reference.named_buffers())
    if set(source) != set(targets):
        missing, extra = sorted(set(targets) - set(source)), sorted(set(source) - set(targets))
        raise ValueError(f"the reference and the policy differ: only in the reference {missing[:5]}, only in the "
                         f"policy {extra[:5]}")
    for name, target in targets.items():
        src, dst = _local(source[name]), _local(target)
        if src.shape != dst.shape:
            raise ValueError(f"{name}: the policy's shard {tuple(src.shape)} is not the reference's {tuple(dst.shape)}")
        dst.copy_(src)
    return len(targets)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing it writes the DTensor), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class ResettableReferenceWorker(ActorRolloutRefWorker):
    """verl's actor + rollout + reference worker whose reference can take the actor's current weights."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset_reference_to_actor(self) -> int:
        if self.ref is None or self.actor is None:
            raise RuntimeError("reset_reference_to_actor needs the actor and the reference in this worker "
                               "(role actor_rollout_ref)")
        return copy_policy_into_reference(self.actor.engine.module, self.ref.engine.module)


def use_resettable_reference(role_worker_mapping: dict) -> None:
    """Make the task runner's actor + reference role this worker (verl's task runner just registered its own)."""
    from verl.trainer.ppo.ray_trainer import Role

    if Role.ActorRolloutRef not in role_worker_mapping:
        raise ValueError("dapo.objective.reference_reset_every > 0 needs a reference model in the actor's worker "
                         "(the KL in the loss or the reward, without LoRA)")
    role_worker_mapping[Role.ActorRolloutRef] = ray.remote(ResettableReferenceWorker)
