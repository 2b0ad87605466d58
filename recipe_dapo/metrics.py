"""Glue between verl's validation bookkeeping and the recipe's per-problem metrics (pure, no Ray).

verl's ``_validate`` groups the n samples of a validation row by the row's ``uid``. Giving every row a
``uid`` derived from its data source and prompt text (``with_problem_uids``) makes copies of one problem
share it, so a file that repeats each AIME problem 32 times validated with n=1 and the 30-problem file
validated with n=32 are measured the same way (mean@32, pass@k, maj@32).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from recipe_dapo.evaluation.metrics import problem_ids_from_prompts, validation_metrics


def with_problem_uids(collate_fn: Callable[[list], dict]) -> Callable[[list], dict]:
    """Wrap a verl collate function so each row's ``uid`` is its problem id (data source + prompt)."""

    def collate(rows: list) -> dict:
        batch = collate_fn(rows)
        batch["uid"] = problem_ids_from_prompts(batch["data_source"], batch["raw_prompt"])
        return batch

    return collate


def validation_problem_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], reward_extra_infos: Mapping[str, Sequence[Any]]
) -> dict[str, float]:
    """``val/<data_source>/{mean@k, pass@j, maj@k, response_length_mean, truncated_ratio}``.

    Needs the reward manager's per-sample ``acc`` (correctness, not the +-1 score); ``pred`` enables maj@k,
    ``response_length`` and ``overlong`` (truncated) the length metrics. Returns {} without ``acc``.
    """
    if "acc" not in reward_extra_infos or len(reward_extra_infos["acc"]) == 0:
        return {}
    num_samples = len(reward_extra_infos["acc"])
    zeros = np.zeros(num_samples)
    return validation_metrics(
        data_sources=list(data_sources),
        prompt_ids=list(sample_uids),
        acc=np.asarray(reward_extra_infos["acc"], dtype=np.float64),
        preds=reward_extra_infos.get("pred"),
        response_lengths=np.asarray(reward_extra_infos.get("response_length", zeros), dtype=np.float64),
        truncated=np.asarray(reward_extra_infos.get("truncated", zeros), dtype=bool),
    )
