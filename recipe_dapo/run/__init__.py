"""A run's life, whichever verl trainer drives it: the run object both trainers hold (``recipe_run.RecipeRun``) and its
parts: the driver's lock on the run folder (``run_lock``), pre-emption (``preemption``), the checkpoint guard, the
recipe's state in checkpoints and its records (``checkpoint_guard``, ``checkpoint_state``, ``checkpoint_records``), the
rollout's health and liveness (``rollout_health``, ``rollout_liveness``), step and validation metrics
(``step_metrics``, ``validation_metrics``), the driver's end-of-run summary (``run_end``) and the check of every Ray
node (``nodes``).

"What happens when the run is pre-empted, fails or ends" is answered here; the trainers (``recipe_dapo.trainers``)
adapt verl's hooks onto it. Nothing here imports the trainers; nothing is imported here.
"""
