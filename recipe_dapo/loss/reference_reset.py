"""Iterative RL (DeepSeekMath, arXiv 2402.03300, section 4.1.4): the reference model of the KL term is reset to the
current policy every N training steps, so the KL holds the policy near where it recently was rather than near where
it started. This module decides when, and what a configuration needs for it. Pure: no torch, no verl.

``dapo.objective.reference_reset_every=N`` (0: never): at the end of every step whose number is a multiple of N (after
its policy update, or without one when the step trained nothing), the reference takes the policy's weights (``recipe_dapo.trainers.classic.reference_worker``); the next
step's KL to the reference then starts from 0. It needs a reference model (the KL in the loss or in the reward) that
is a model of its own: with LoRA verl's reference is the actor without its adapter, which a reset cannot move.

On resume the reference is reset to the resumed policy: exact when the checkpoint was saved at a reset step (a
``trainer.save_freq`` that is a multiple of N; a pre-emption's checkpoint may fall between two resets).
"""

from __future__ import annotations

from typing import Any

KEY = "dapo.objective.reference_reset_every"


def reset_due(step: int, every: int, *, resumed: bool = False) -> bool:
    """Whether the reference takes the policy's weights after step ``step`` (numbered from 1) when resetting every
    ``every`` steps; ``resumed``: at the start of a run resumed from step ``step`` (the reference a checkpoint does
    not hold is the resumed policy, see above)."""
    if every <= 0 or step <= 0:
        return False
    return resumed or step % every == 0


def reference_reset_problems(every: Any, *, uses_reference: bool, lora: bool, use_v1: bool) -> list[str]:
    """What stops a configuration from resetting its reference every ``every`` steps (empty: nothing)."""
    if not isinstance(every, int) or every < 0:
        return [f"{KEY}={every!r} must be a whole number of steps >= 0 (0: never reset the reference)"]
    if every == 0:
        return []
    problems = []
    if not uses_reference:
        problems.append(
            f"{KEY}={every} resets a reference model the run does not have: set actor_rollout_ref.actor."
            "use_kl_loss=true with kl_loss_coef > 0 (objective=grpo), or set it to 0"
        )
    if lora:
        problems.append(
            f"{KEY}={every} with LoRA: verl's reference is then the actor without its adapter, which a reset cannot "
            "move; train without LoRA or set it to 0"
        )
    if use_v1:
        problems.append(f"{KEY}={every} resets the reference in the classic trainer only; set trainer.use_v1=false")
    return problems
