"""Advantages beyond verl's outcome estimators: process supervision (``process``: GRPO's step-level advantages, pure
torch; ``steps``: the step scorers; ``prm``: a process reward model as one, ``prm_backends``: where its scores come
from) and its entry in verl's advantage-estimator registry (``estimator``, imported by the plugin when verl imports
``core_algos``). This module itself imports nothing: the start-up rules read its names."""

GRPO_PROCESS = "grpo_process"
"""The name of the process-supervised estimator in verl's registry (``algorithm.adv_estimator``)."""

STEP_SCORERS = ("chain_rule", "prm")
"""The step scorers ``dapo.objective.step_scorer`` may name (``recipe_dapo.trainers.process_steps``): ``chain_rule``,
the CPU task's rule; ``prm``, a process reward model served as verl's reward model (``advantages.prm``)."""

PRM_SCORER = "prm"
"""The step scorer backed by a process reward model (``dapo.objective.prm``)."""
