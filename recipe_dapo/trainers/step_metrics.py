"""What both trainers log about a step beyond verl's metrics, with one meaning each.

- :data:`RESPONSE_TOKENS_METRIC`: response tokens that carried loss in the step's update, counted after the
  overlong filter zeroed truncated responses (the classic trainer counts the filtered masks; the v1 trainer the
  masks it hands the actor). The console's end-of-run summary and the run report read it as is.
- :func:`scored_round_metrics`: what was scored this step, before filtering (``reward/*``, ``overlong/*``).
- The timers verl reports as ``timing_s/<name>``: generation (every round of a step), the step, validation.

Pure: no verl import.
"""

from __future__ import annotations

from typing import Any, Mapping

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
