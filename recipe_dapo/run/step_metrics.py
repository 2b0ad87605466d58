"""What both trainers log about a step beyond verl's metrics, with one meaning each.

- :data:`RESPONSE_TOKENS_METRIC`: response tokens that carried loss in the step's update, counted after the
  overlong filter zeroed truncated responses (the classic trainer counts the filtered masks; the v1 trainer the
  masks it hands the actor). The console's end-of-run summary and the run report read it as is.
- :func:`scored_round_metrics`: what was scored this step, before filtering (``reward/*``, ``overlong/*``).
- The timers verl reports as ``timing_s/<name>``: generation (every round of a step), the step, validation.
- :class:`UpdateGuard`: steps whose update verl skipped for a non-finite gradient, counted; too many in a row stop
  the run with what to check.
- :class:`PolicyWatch`: a policy that has stopped producing anything the reward scores right (not one right response
  for ``dapo.health.max_steps_all_wrong`` steps in a row), or whose entropy is not a number, stops the run in one line.

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


class PolicyStopped(RuntimeError):
    """The policy produces nothing the reward scores right any more, or its entropy is not a number."""


class PolicyWatch:
    """Stops a run whose policy has stopped producing anything trainable, instead of letting it end "finished":

    - ``actor/entropy`` not finite (NaN or inf): the policy's log-probabilities are not numbers, so neither are its
      weights (a checkpoint damaged inside a tensor, an update that diverged); it stops at once;
    - ``reward/acc_mean`` (every response scored in the step, before filtering) 0 for ``max_steps_all_wrong`` steps in a
      row: not one response right, each wrong or without an answer (``reward/no_answer_ratio``); 0 never stops. A step
      that scored nothing (its batch all from the pool) neither counts nor resets.
    """

    def __init__(self, max_steps_all_wrong: int):
        self.max_steps_all_wrong = int(max_steps_all_wrong)
        self.in_a_row = 0
        self.groups_in_a_row = 0

    def observe(self, metrics: dict, step: int) -> None:
        from recipe_dapo.reward.metrics import ACC_MEAN

        entropy = metrics.get(ENTROPY)
        if entropy is not None and not math.isfinite(float(entropy)):
            raise PolicyStopped(
                f"step {step}: the policy's entropy ({ENTROPY}) is {float(entropy)}: its log-probabilities are not "
                "numbers, so neither are its weights (a checkpoint damaged inside a tensor, or an update that diverged), "
                "and nothing it generates can be trained on. Resume from an earlier checkpoint (trainer.resume_mode="
                "resume_path trainer.resume_from_path=...), and check the learning rate and the loss settings"
            )
        accuracy = metrics.get(ACC_MEAN)
        if accuracy is None:
            return
        if float(accuracy) > 0:
            self.in_a_row = self.groups_in_a_row = 0
            return
        self.in_a_row += 1
        self.groups_in_a_row += int(metrics.get("dynamic_sampling/generated_groups", 0))
        logger.warning("step %d: not one response scored this step was right (%d step(s) in a row)", step, self.in_a_row)
        if self.max_steps_all_wrong and self.in_a_row >= self.max_steps_all_wrong:
            no_answer = metrics.get("reward/no_answer_ratio")
            unparsed = f", {float(no_answer):.0%} of the last step's without an answer" if no_answer is not None else ""
            raise PolicyStopped(
                f"step {step}: not one response was right in the last {self.in_a_row} steps ({self.groups_in_a_row} "
                f"groups generated{unparsed}): the policy has stopped producing anything the reward scores, and "
                "nothing qualifies to train on. Check the last checkpoint (a damaged one can load as NaN), the reward "
                "function and the data's ground truths (a format the reward cannot read scores every response wrong), "
                "and the learning rate; dapo.health.max_steps_all_wrong sets this limit (0: never stop)"
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "groups_in_a_row": self.groups_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row, self.groups_in_a_row = int(state.get("in_a_row", 0)), int(state.get("groups_in_a_row", 0))
