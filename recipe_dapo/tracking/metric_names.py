"""The names of the step metrics both trainers log beyond verl's, and of verl's own that the console and the run report
read (verl has no constants for them). Defined here, below the trainers, so that the console, the report and the
trainers share one spelling. :data:`CATALOGUE` gives each name its producer and one line of meaning, with the
``policy_lag/*`` names; ``docs/registries.md`` renders it (``scripts/registries.py``)."""

from typing import NamedTuple

from recipe_dapo.dynamic_sampling.selection import METRICS as SELECTION_METRICS
from recipe_dapo.policy_lag.names import METRICS as POLICY_LAG_METRICS

RESPONSE_TOKENS_METRIC = "training/response_tokens"
"""Response tokens that carried loss in the step's update (after the overlong filter)."""
GEN_TIMER, STEP_TIMER, TESTING_TIMER = "gen", "step", "testing"
"""verl's timers (logged as ``timing_s/<name>``): generation (every round of a step), the step, validation."""

ENTROPY = "actor/entropy"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"
TIMING_PREFIX = "timing_s/"
STEP_TIME, GEN_TIME, VALIDATION_TIME = (TIMING_PREFIX + name for name in (STEP_TIMER, GEN_TIMER, TESTING_TIMER))

GRAD_NORM = "actor/grad_norm"
UPDATE_SKIPPED = "training/update_skipped"
"""1.0 when verl skipped the step's optimizer update (or one of its mini-batches') for a non-finite gradient norm."""
SKIPPED_UPDATES = "training/skipped_updates"
"""Steps so far whose update verl skipped, over the whole run (restored with the trainer's checkpoint)."""


class Metric(NamedTuple):
    name: str
    """As logged (``<k>`` stands for a number)."""
    producer: str
    """The module that computes it (several separated by ``, ``)."""
    meaning: str
    """One line."""


_VERL_METRICS = "verl.trainer.ppo.metric_utils"
_VERL_TRAINERS = "verl.trainer.ppo.ray_trainer, verl.trainer.ppo.v1.trainer_base"

CATALOGUE: tuple[Metric, ...] = (
    Metric(RESPONSE_TOKENS_METRIC, "recipe_dapo.run.recipe_run, recipe_dapo.trainers.v1.trainer",
           "response tokens that carried loss in the step's update (the trained batch's, after the overlong filter)"),
    Metric(UPDATE_SKIPPED, "recipe_dapo.run.step_metrics",
           "1.0 when verl skipped the step's optimizer update (or one of its mini-batches') for a non-finite "
           "gradient norm"),
    Metric(SKIPPED_UPDATES, "recipe_dapo.run.step_metrics",
           "steps so far whose update verl skipped, over the whole run (restored with the trainer's checkpoint)"),
    Metric(ENTROPY, _VERL_TRAINERS, "mean token entropy of the policy on the step's batch (verl's)"),
    Metric(GRAD_NORM, "verl.workers.engine_workers", "the actor's gradient norm before clipping (verl's)"),
    Metric(RESPONSE_LENGTH_MEAN, _VERL_METRICS, "mean response length of the trained batch, in tokens (verl's)"),
    Metric(RESPONSE_LENGTH_CLIP_RATIO, _VERL_METRICS,
           "share of the trained batch's responses cut at the maximum response length (verl's)"),
    Metric(STEP_TIME, _VERL_METRICS, "seconds of the whole step (verl's timer)"),
    Metric(GEN_TIME, _VERL_METRICS, "seconds of generation in the step, every round included (verl's timer)"),
    Metric(VALIDATION_TIME, _VERL_METRICS, "seconds of the validation run at the step, when one ran (verl's timer)"),
) + tuple(Metric(*entry) for entry in (*POLICY_LAG_METRICS, *SELECTION_METRICS))
"""Every metric named here, in ``policy_lag.names`` and in ``dynamic_sampling.selection``: (name, producer, one line of
meaning)."""
