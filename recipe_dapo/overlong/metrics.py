"""Every ``overlong/*`` metric, written here only.

From the reward columns of everything scored in a step (before dynamic sampling drops groups)::

    overlong/truncated_ratio       fraction that used the whole rollout budget without a stop token
    overlong/penalized_ratio       fraction with a length penalty < 0
    overlong/reward_mean           mean length penalty (<= 0)

From overlong filtering of the training batch (when ``dapo.overlong_filter.enable``)::

    overlong/filtered_ratio        filtered responses / responses
    overlong/filtered_count        filtered responses
    overlong/filtered_token_ratio  loss tokens removed / loss tokens before
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from recipe_dapo.overlong.truncation import TRUNCATED_COLUMN

PENALTY_COLUMN = "overlong_reward"
TRUNCATED_RATIO = "overlong/truncated_ratio"
FILTERED_RATIO = "overlong/filtered_ratio"
FILTERED_TOKEN_RATIO = "overlong/filtered_token_ratio"
FILTER_METRIC_NAMES = (FILTERED_RATIO, "overlong/filtered_count", FILTERED_TOKEN_RATIO)


def overlong_metrics(columns: Mapping[str, Any]) -> dict[str, float]:
    """The reward-side metrics above from per-sample columns (missing columns are skipped)."""
    metrics: dict[str, float] = {}
    if TRUNCATED_COLUMN in columns and len(columns[TRUNCATED_COLUMN]):
        metrics[TRUNCATED_RATIO] = float(np.mean(np.asarray(columns[TRUNCATED_COLUMN], dtype=np.float64)))
    if PENALTY_COLUMN in columns and len(columns[PENALTY_COLUMN]):
        penalties = np.asarray(columns[PENALTY_COLUMN], dtype=np.float64)
        metrics["overlong/penalized_ratio"] = float(np.mean(penalties < 0))
        metrics["overlong/reward_mean"] = float(penalties.mean())
    return metrics


def filter_metrics(num_responses: int, num_filtered: int, tokens_before: float, tokens_after: float) -> dict[str, float]:
    """The filter-side metrics above."""
    return {
        FILTERED_RATIO: num_filtered / num_responses if num_responses else 0.0,
        "overlong/filtered_count": float(num_filtered),
        FILTERED_TOKEN_RATIO: (tokens_before - tokens_after) / tokens_before if tokens_before else 0.0,
    }
