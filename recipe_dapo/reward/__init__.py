"""DAPO's reward side: the answer verifier and the ``recipe_dapo`` reward manager.

- ``verifier``  extraction, normalisation and comparison rules (pure); ``compute_score`` has verl's
                custom-reward signature, so ``reward.custom_reward_function.path=pkg://recipe_dapo.reward``
                works with any reward manager
- ``arithmetic`` bounded exact evaluation of LaTeX arithmetic on numbers (``2^{10}``, ``\\sqrt{1764}``)
- ``symbolic``  the optional math-verify check, in a child process killed at the time limit
- ``settings``  ``reward.reward_kwargs`` read and checked once at start-up
- ``bounded_calls`` a user's reward function on threads of its own with a time-out per call, and the
                watchdog that warns when scoring makes no progress (pure, no Ray)
- ``manager``   the ``recipe_dapo`` reward manager (verl's reward-loop registry); imported by ``plugin.py``
- ``metrics``   per-step metrics from the reward_extra_info the manager returns

A new answer format is a new rule in ``verifier`` with a golden case in ``tests/test_verifier_on_cpu.py``.
"""

from recipe_dapo.reward.verifier import Verdict, compute_score, extract_answer, normalize_answer, verify

__all__ = ["Verdict", "compute_score", "extract_answer", "normalize_answer", "verify"]
