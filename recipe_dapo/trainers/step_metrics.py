"""What both trainers log about a step beyond verl's metrics, with one meaning each.

- :data:`RESPONSE_TOKENS_METRIC`: response tokens that carried loss in the step's update, counted after the
  overlong filter zeroed truncated responses (the classic trainer counts the filtered masks; the v1 trainer the
  masks it hands the actor). The console's end-of-run summary and the run report read it as is.
- :func:`scored_round_metrics`: what was scored this step, before filtering (``reward/*``, ``overlong/*``).
- The timers verl reports as ``timing_s/<name>``: generation (every round of a step), the step, validation.
- :class:`UpdateGuard`: steps whose update verl skipped for a non-finite gradient, counted; too many in a row stop
  the run with what to check.

Pure: no verl import.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

logger = logging.getLogger(__name__)

RESPONSE_TOKENS_METRIC = "training/response_tokens"
GEN_TIMER, STEP_TIMER, TESTING_TIMER = "gen", "step", "testing"

# verl's names for what the console and the run report show (verl.trainer.ppo.metric_utils and its actor; verl has
# no constants for them).
ENTROPY = "actor/entropy"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"
TIMING_PREFIX = "timing_s/"
STEP_TIME, GEN_TIME, VALIDATION_TIME = (TIMING_PREFIX + name for name in (STEP_TIMER, GEN_TIMER, TESTING_TIMER))


def scored_round_metrics(scored_columns: Mapping[str, Any]) -> dict[str, float]:
    """Reward and overlong metrics of every response scored this step (before filtering)."""
    from recipe_dapo.overlong import overlong_metrics
    from recipe_dapo.reward.metrics import reward_metrics

    return {**reward_metrics(scored_columns), **overlong_metrics(scored_columns)}


GRAD_NORM = "actor/grad_norm"
UPDATE_SKIPPED = "training/update_skipped"
"""1.0 when verl skipped the step's optimizer update (or one of its mini-batches') for a non-finite gradient norm."""
SKIPPED_UPDATES = "training/skipped_updates"
"""Steps so far whose update verl skipped, over the whole run (restored with the trainer's checkpoint)."""


class NonFiniteUpdates(RuntimeError):
    """Too many steps in a row had their update skipped for a non-finite gradient: the run learns nothing."""


class UpdateGuard:
    """Counts the steps whose update verl skipped for a non-finite gradient norm (verl then prints
    ``grad_norm is not finite`` and zeroes the gradient), and stops the run after ``max_in_a_row`` such steps in a
    row (``dapo.health.max_skipped_updates``; 0 never stops)."""

    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = int(max_in_a_row)
        self.in_a_row = 0
        self.total = 0

    def observe(self, metrics: dict, step: int) -> None:
        """Read the step's reduced ``actor/grad_norm`` (a mean over mini-batches: non-finite when any was), add the
        guard's metrics to ``metrics``, and raise :class:`NonFiniteUpdates` when the limit is reached."""
        grad_norm = metrics.get(GRAD_NORM)
        if grad_norm is None:
            return  # no update this step
        skipped = not math.isfinite(float(grad_norm))
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        self.total += int(skipped)
        metrics[UPDATE_SKIPPED] = float(skipped)
        metrics[SKIPPED_UPDATES] = float(self.total)
        if skipped:
            logger.warning("step %d: verl skipped the update: grad_norm is %s (%d step(s) in a row)", step, grad_norm,
                           self.in_a_row)
        if self.max_in_a_row and self.in_a_row >= self.max_in_a_row:
            raise NonFiniteUpdates(
                f"step {step}: the last {self.in_a_row} steps' updates were all skipped for a non-finite gradient norm "
                f"({GRAD_NORM}={grad_norm}): the policy is not learning. Check the rewards (a reward function returning "
                "NaN or inf is counted in reward/verify_error_ratio), the learning rate and the loss settings "
                "(actor_rollout_ref.actor.*), and the data; dapo.health.max_skipped_updates sets this limit (0: never stop)"
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row, self.total = int(state.get("in_a_row", 0)), int(state.get("total", 0))
