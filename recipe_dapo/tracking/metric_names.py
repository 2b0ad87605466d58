"""The names of the step metrics both trainers log beyond verl's, and of verl's own that the console and the run report
read (verl has no constants for them). Defined here, below the trainers, so that the console, the report and the
trainers share one spelling; ``run.step_metrics`` says what each means and computes them."""

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
