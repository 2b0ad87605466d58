"""Advantages beyond verl's outcome estimators: process supervision (``process``: GRPO's step-level advantages, pure
torch; ``steps``: the step scorers) and its entry in verl's advantage-estimator registry (``estimator``, imported by
the plugin when verl imports ``core_algos``). This module itself imports nothing: the start-up rules read its names."""

GRPO_PROCESS = "grpo_process"
"""The name of the process-supervised estimator in verl's registry (``algorithm.adv_estimator``)."""

STEP_SCORERS = ("chain_rule",)
"""The step scorers ``dapo.objective.step_scorer`` may name (``recipe_dapo.advantages.steps.SCORERS``)."""
