"""Glue between verl's validation bookkeeping and the recipe's per-problem metrics (pure, no Ray).

verl's ``_validate`` groups the n samples of a validation row by the row's ``uid``. Giving every row a
``uid`` derived from its data source and prompt text (``with_problem_uids``) makes copies of one problem
share it, so a file that repeats each AIME problem 32 times validated with n=1 and the 30-problem file
validated with n=32 are measured the same way (mean@32, pass@k, maj@32).

**The headline over every problem.** verl's ``process_validation_metrics`` names each problem's metrics after
its own sample count (``mean@4`` for a problem with 4 samples, ``mean@8`` for one with 8) and averages each
name over the problems that have it; ``val-core`` then shows the name with the largest count. When one
problem has more samples than the rest (a prompt repeated in the file, now grouped by its problem id), the
headline ``val-core/<source>/acc/mean@8`` describes that one problem only. :func:`equal_samples_per_problem`
gives verl the first ``k`` samples of every problem (``k``: the source's smallest count), so each of its
metrics covers every problem, and :func:`headline_metrics` sets ``val-core/<source>/acc/mean@k`` to the
recipe's ``val/<source>/mean@k``: each problem's accuracy over all of its samples, averaged over problems.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from recipe_dapo.evaluation.metrics import VAL_PREFIX, problem_ids_from_prompts, validation_metrics


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


def equal_samples_per_problem(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos: Mapping[str, Sequence[Any]]
) -> tuple[np.ndarray, list, dict[str, list]]:
    """The first ``k`` samples of every problem, ``k`` the smallest sample count among its source's problems.

    Returns ``(data_sources, sample_uids, infos)`` restricted to those samples, in their original order;
    per-sample lists in ``infos`` are cut the same way (empty lists stay empty).
    """
    sources = np.asarray([str(source) for source in data_sources], dtype=object)
    uids = list(sample_uids)
    counts: dict[tuple[str, Any], int] = {}
    for source, uid in zip(sources.tolist(), uids):
        counts[(source, uid)] = counts.get((source, uid), 0) + 1
    smallest: dict[str, int] = {}
    for (source, _), count in counts.items():
        smallest[source] = min(count, smallest.get(source, count))
    seen: dict[tuple[str, Any], int] = {}
    keep = np.zeros(len(uids), dtype=bool)
    for index, key in enumerate(zip(sources.tolist(), uids)):
        seen[key] = seen.get(key, 0) + 1
        keep[index] = seen[key] <= smallest[key[0]]
    kept = np.flatnonzero(keep)
    cut = {
        name: [values[i] for i in kept] if len(values) == len(uids) else list(values) for name, values in infos.items()
    }
    return sources[kept], [uids[i] for i in kept], cut


def headline_metrics(problem_metrics: Mapping[str, float], core_var: str = "acc") -> dict[str, float]:
    """``val-core/<source>/<core_var>/mean@k`` from the recipe's ``val/<source>/mean@k`` (every problem)."""
    headline = {}
    for key, value in problem_metrics.items():
        prefix, _, rest = key.partition("/")
        source, _, name = rest.rpartition("/")  # a data source may itself contain "/"
        if prefix == VAL_PREFIX and source and name.startswith("mean@"):
            headline[f"val-core/{source}/{core_var}/{name}"] = value
    return headline


def add_problem_metrics(
    metric_dict: dict, data_sources: Sequence[str], sample_uids: Sequence[Any], reward_extra_infos: Mapping[str, Sequence[Any]]
) -> dict:
    """verl's validation ``metric_dict`` plus the recipe's per-problem metrics, with the ``val-core`` headline set from
    them (both trainers, classic and v1, report validation through this)."""
    problem_metrics = validation_problem_metrics(data_sources, sample_uids, reward_extra_infos)
    metric_dict.update(problem_metrics)
    metric_dict.update(headline_metrics(problem_metrics))
    return metric_dict
