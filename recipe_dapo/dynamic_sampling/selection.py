"""What a step trained, measured against what it generated: the bias that selecting groups can bring.

Dynamic sampling trains a selection of what finished: groups whose responses all score the same are dropped, and
a step that ends when its batch is full (``one_round``, or verl's asynchronous modes) trains the groups that finished
first, which are the short ones; the slow, often harder, prompts finish later or in the next step. Per step::

    selection/length_ks               two-sample Kolmogorov-Smirnov distance between the lengths of the trained
                                      responses and of every response that finished this step (0: same distribution)
    selection/trained_length_mean     mean length (tokens) of the trained responses
    selection/finished_length_mean    ... of every response that finished this step, kept or not
    selection/length_shift            trained over finished mean length, minus 1 (negative: shorter trained)
    selection/trained_solve_rate      share of the trained responses that are right (the ``acc`` column)
    selection/finished_solve_rate     ... of every response that finished this step
    selection/recycled_responses      trained responses that more than one policy generated (resumed after an update)

Both trainers log them (the classic trainer's recycled count is 0: it has no partial rollouts). A step that trained
only carried-over groups, or finished nothing, logs the trained figures alone.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

PREFIX = "selection/"
LENGTH_KS = PREFIX + "length_ks"
TRAINED_LENGTH = PREFIX + "trained_length_mean"
FINISHED_LENGTH = PREFIX + "finished_length_mean"
LENGTH_SHIFT = PREFIX + "length_shift"
TRAINED_SOLVE_RATE = PREFIX + "trained_solve_rate"
FINISHED_SOLVE_RATE = PREFIX + "finished_solve_rate"
RECYCLED = PREFIX + "recycled_responses"

LENGTH_COLUMN = "response_length"
"""The per-response column (tokens) a round source adds to its scored columns for these metrics."""
SOLVED_COLUMN = "acc"
"""The reward's correctness column (the recipe's reward manager writes it; 1 right, 0 wrong)."""


def ks_distance(sample: np.ndarray, other: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical distribution
    functions, over every value either sample takes (ties handled as the distribution functions jump)."""
    a, b = np.sort(np.asarray(sample, dtype=np.float64)), np.sort(np.asarray(other, dtype=np.float64))
    if not len(a) or not len(b):
        raise ValueError("the Kolmogorov-Smirnov distance needs two non-empty samples")
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, points, side="right") / len(a)
    cdf_b = np.searchsorted(b, points, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def selection_metrics(trained_lengths, finished_lengths=None, trained_solved=None, finished_solved=None,
                      recycled: int = 0) -> dict[str, float]:
    """The module docstring's metrics; ``finished_*`` None or empty when the step finished nothing."""
    trained = np.asarray(trained_lengths, dtype=np.float64)
    metrics: dict[str, float] = {RECYCLED: float(recycled)}
    if not len(trained):
        return metrics
    metrics[TRAINED_LENGTH] = float(trained.mean())
    finished = _array(finished_lengths)
    if finished is not None:
        metrics[FINISHED_LENGTH] = float(finished.mean())
        metrics[LENGTH_KS] = ks_distance(trained, finished)
        if metrics[FINISHED_LENGTH] > 0:
            metrics[LENGTH_SHIFT] = metrics[TRAINED_LENGTH] / metrics[FINISHED_LENGTH] - 1.0
    solved = _array(trained_solved)
    if solved is not None:
        metrics[TRAINED_SOLVE_RATE] = float((solved > 0).mean())
    finished_right = _array(finished_solved)
    if finished_right is not None:
        metrics[FINISHED_SOLVE_RATE] = float((finished_right > 0).mean())
    return metrics


def _array(values) -> Optional[np.ndarray]:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    return array if len(array) else None
