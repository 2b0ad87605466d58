"""Scoring generated responses with the recipe's verifier (``recipe_dapo.reward.compute_score``).

The verifier is called as verl calls a custom reward function::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)

and may return a number or a dict. From a dict, ``acc`` (correctness), ``score`` (the reward) and ``pred``
(the extracted answer, used by maj@k) are read; a missing ``acc`` is ``score > 0``. From a number,
``score`` is the number, ``acc`` is ``score > 0`` and there is no ``pred``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ComputeScore = Callable[..., Any]


@dataclass(frozen=True)
class SampleScore:
    """The verdict on one response."""

    score: float
    acc: float
    pred: str | None


def load_compute_score() -> ComputeScore:
    """The recipe's verifier, imported lazily so that the rest of evaluation works without it."""
    try:
        from recipe_dapo.reward import compute_score
    except ImportError as error:
        raise ImportError(
            f"the evaluation scores with recipe_dapo.reward.compute_score, which could not be imported ({error}); "
            "reinstall the recipe (pip install -e .) and its 'math' extra"
        ) from error
    return compute_score


def score_response(
    compute_score: ComputeScore,
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None,
) -> SampleScore:
    """Run the verifier on one response and read its verdict (rules in the module docstring)."""
    result = compute_score(
        data_source=data_source, solution_str=response, ground_truth=ground_truth, extra_info=extra_info
    )
    if isinstance(result, Mapping):
        if "acc" not in result and "score" not in result:
            raise ValueError(f"compute_score returned a dict without 'acc' or 'score': {sorted(result)}")
        score = float(result.get("score", result.get("acc")))
        acc = float(result["acc"]) if "acc" in result else float(score > 0)
        pred = result.get("pred")
        return SampleScore(score, acc, None if pred is None else str(pred))
    score = float(result)
    return SampleScore(score, float(score > 0), None)
