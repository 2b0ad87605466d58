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

# The metrics' names live below the trainers, where the console and the report read them too.
from recipe_dapo.tracking.metric_names import (  # noqa: F401  (re-exported: the trainers' and tests' spelling)
    ENTROPY,
    GEN_TIME,
    GEN_TIMER,
    GRAD_NORM,
    RESPONSE_LENGTH_CLIP_RATIO,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_TOKENS_METRIC,
    SKIPPED_UPDATES,
    STEP_TIME,
    STEP_TIMER,
    TESTING_TIMER,
    TIMING_PREFIX,
    UPDATE_SKIPPED,
    VALIDATION_TIME,
)

logger = logging.getLogger(__name__)


def scored_round_metrics(scored_columns: Mapping[str, Any]) -> dict[str, float]:
    """Reward and overlong metrics of every response scored this step (before filtering)."""
    from recipe_dapo.overlong import overlong_metrics
    from recipe_dapo.reward.metrics import reward_metrics

    return {**reward_metrics(scored_columns), **overlong_metrics(scored_columns)}



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
