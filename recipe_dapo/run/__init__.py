"""A run's life, whichever verl trainer drives it: the run object both trainers hold (``recipe_run.RecipeRun``) and its
lifecycle (``lifecycle.RunLifecycle``: the run begins, a step begins, generates, updates and ends, and the run stops
for pre-emption, gives a step up or fails, with the outcome it prints), driven by the loop events the trainers
forward; and their parts: the driver's lock on the run folder (``run_lock``), pre-emption (``preemption``), the
checkpoint guard, the recipe's state in checkpoints and its records (``checkpoint_guard``, ``checkpoint_state``,
``checkpoint_records``), the rollout's health and liveness (``rollout_health``, ``rollout_liveness``), step and
validation metrics (``step_metrics``, ``validation_metrics``), the driver's end-of-run summary (``run_end``) and the
check of every Ray node (``nodes``).

"What happens when the run is pre-empted, fails or ends" is answered here; the trainers (``recipe_dapo.trainers``)
forward verl's events. A new fault feature is a module here, its event in ``lifecycle``, and its test. Nothing here
imports the trainers; nothing is imported here.
"""
