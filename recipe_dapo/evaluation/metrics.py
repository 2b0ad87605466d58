"""Sampling metrics as papers report them: mean@k, unbiased pass@k, maj@k, per data source.

For one problem with ``n`` samples of which ``c`` are correct:

- ``mean@k`` (the paper's avg@k): the fraction of correct samples, ``c / n``, averaged over problems.
- ``pass@k`` (Chen et al. 2021, unbiased): ``1 - C(n-c, k) / C(n, k)``, the chance that ``k`` samples drawn
  without replacement from the ``n`` contain a correct one; computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``,
  which never forms a binomial coefficient (no overflow at n = 1024). It is 1 when ``n - c < k``.
- ``maj@k``: whether the most frequent extracted answer among the first ``k`` samples is correct.
  Answers vote after ``normalize_ground_truth`` (so ``025`` and ``25`` vote together); samples with no
  extracted answer do not vote. **Ties** go to the tied answer that appears first in sample order, and the
  winner is correct when its first sample is correct. No vote at all scores 0.

**Problem ids.** Samples are grouped into problems by id, not by row: ``problem_ids_from_prompts``
derives the id from the data source and the prompt text, so the 960-row AIME file (30 problems x 32
copies, validated with n = 1) and the 30-row file validated with n = 32 form the same 30 groups of 32
samples and give identical metrics.

**k per data source** is the smallest number of samples any of its problems has (with equal group sizes,
just the number of samples per problem). A sample counts as correct when its ``acc`` is >= 0.5 (the
verifier's ``acc`` is 0 or 1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recipe_dapo.data.answers import normalize_ground_truth

VAL_PREFIX = "val"
MEAN_AT, PASS_AT, MAJ_AT = "mean@", "pass@", "maj@"  # logged as val/<data_source>/mean@<k> (pass@<j>, maj@<k>)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (formula in the module docstring).

    >>> pass_at_k(5, 2, 2)   # 1 - C(3,2)/C(5,2) = 1 - 3/10
    0.7
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}: draw more samples per problem or lower k")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_at_k(acc: Sequence[float]) -> float:
    """Mean accuracy of one problem's samples."""
    if len(acc) == 0:
        raise ValueError("mean@k of a problem with no samples")
    return float(np.mean(np.asarray(acc, dtype=np.float64)))


def vote_key(pred: Any) -> str:
    """The spelling an extracted answer votes under: ``normalize_ground_truth`` of its text."""
    return normalize_ground_truth(
        pred if isinstance(pred, (str, int, float)) and not isinstance(pred, bool) else str(pred)
    )


def majority_vote_correct(
    preds: Sequence[Any], correct: Sequence[bool], answer_key: Callable[[Any], str] = vote_key
) -> float:
    """1.0 when the majority answer of one problem's samples is correct (rules and tie-break above).

    >>> majority_vote_correct(["7", "5", "05", "7"], [False, True, True, False])  # tie 7:2, 5:2 -> "7" came first
    0.0
    """
    if len(preds) != len(correct):
        raise ValueError(f"maj@k needs one pred per sample, got {len(preds)} preds for {len(correct)} samples")
    counts: dict[str, int] = {}
    first_correct: dict[str, bool] = {}
    for pred, is_correct in zip(preds, correct):
        if pred is None or (isinstance(pred, str) and not pred.strip()):
            continue
        key = answer_key(pred)
        counts[key] = counts.get(key, 0) + 1
        first_correct.setdefault(key, bool(is_correct))
    if not counts:
        return 0.0
    # dicts keep insertion order, and max() returns the first maximum: the earliest-seen tied answer wins.
    winner = max(counts, key=counts.__getitem__)
    return float(first_correct[winner])


def pass_k_values(k: int) -> list[int]:
    """The j of the reported pass@j: 1, 2, 4, ... up to k, plus k itself."""
    values = [1 << power for power in range(k.bit_length()) if (1 << power) <= k]
    return values if values[-1] == k else [*values, k]


def problem_ids_from_prompts(data_sources: Sequence[str], prompts: Sequence[Any]) -> np.ndarray:
    """One id per sample: a hash of ``data_source`` and the prompt text (a string, or a chat list whose
    contents are joined), so every copy of a prompt shares an id."""
    if len(data_sources) != len(prompts):
        raise ValueError(f"got {len(data_sources)} data sources for {len(prompts)} prompts")
    ids = []
    for data_source, prompt in zip(data_sources, prompts):
        text = prompt if isinstance(prompt, str) else "\n".join(str(message["content"]) for message in prompt)
        ids.append(hashlib.sha1(f"{data_source}\0{text}".encode()).hexdigest()[:16])
    return np.asarray(ids, dtype=object)


def per_source_metrics(
    data_sources: Sequence[str],
    prompt_ids: Sequence[Any],
    acc: Sequence[float],
    preds: Sequence[Any] | None,
    response_lengths: Sequence[float],
    truncated: Sequence[bool],
) -> dict[str, dict[str, float]]:
    """``{data_source: {"mean@k": ..., "pass@j": ..., "maj@k": ..., "response_length_mean": ...,
    "truncated_ratio": ..., "num_problems": ...}}`` from flat per-sample arrays (rules above).

    ``maj@k`` is left out when ``preds`` is None.
    """
    arrays = _checked_arrays(data_sources, prompt_ids, acc, preds, response_lengths, truncated)
    sources, ids, acc, preds, lengths, truncated = arrays
    correct = acc >= 0.5
    result: dict[str, dict[str, float]] = {}
    for source in dict.fromkeys(sources.tolist()):
        in_source = np.flatnonzero(sources == source)
        groups = _group_by_problem(ids[in_source], in_source)
        k = min(len(samples) for samples in groups)
        metrics = {f"{MEAN_AT}{k}": float(np.mean([mean_at_k(acc[samples]) for samples in groups]))}
        for j in pass_k_values(k):
            metrics[f"{PASS_AT}{j}"] = float(np.mean([pass_at_k(len(s), int(correct[s].sum()), j) for s in groups]))
        if preds is not None:
            votes = [majority_vote_correct(preds[s[:k]], correct[s[:k]]) for s in groups]
            metrics[f"{MAJ_AT}{k}"] = float(np.mean(votes))
        metrics["response_length_mean"] = float(lengths[in_source].mean())
        metrics["truncated_ratio"] = float(truncated[in_source].mean())
        metrics["num_problems"] = float(len(groups))
        result[str(source)] = metrics
    return result


def validation_metrics(
    data_sources: Sequence[str],
    prompt_ids: Sequence[Any],
    acc: Sequence[float],
    preds: Sequence[Any] | None,
    response_lengths: Sequence[float],
    truncated: Sequence[bool],
) -> dict[str, float]:
    """:func:`per_source_metrics` flattened to logger keys ``val/<data_source>/<metric>``."""
    per_source = per_source_metrics(data_sources, prompt_ids, acc, preds, response_lengths, truncated)
    return {
        f"{VAL_PREFIX}/{source}/{name}": value
        for source, metrics in per_source.items()
        for name, value in metrics.items()
    }


def _group_by_problem(ids: np.ndarray, sample_indices: np.ndarray) -> list[np.ndarray]:
    """Sample indices per problem, problems in order of first appearance, samples in their order."""
    groups: dict[Any, list[int]] = {}
    for problem_id, index in zip(ids.tolist(), sample_indices.tolist()):
        groups.setdefault(problem_id, []).append(index)
    return [np.asarray(indices) for indices in groups.values()]


def _checked_arrays(data_sources, prompt_ids, acc, preds, response_lengths, truncated):
    named = {
        "data_sources": data_sources,
        "prompt_ids": prompt_ids,
        "acc": acc,
        "response_lengths": response_lengths,
        "truncated": truncated,
    }
    if preds is not None:
        named["preds"] = preds
    sizes = {name: len(values) for name, values in named.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"validation metrics need one value per sample in every array, got lengths {sizes}")
    if sizes["acc"] == 0:
        raise ValueError("validation metrics need at least one sample")
    acc = np.asarray(acc, dtype=np.float64)
    if np.isnan(acc).any() or (acc < 0).any() or (acc > 1).any():
        raise ValueError(
            "acc must be per-sample correctness in [0, 1] (the verifier's 'acc', not the +-1 reward score); "
            f"got values in [{np.nanmin(acc)}, {np.nanmax(acc)}]"
        )
    preds_array = None if preds is None else np.asarray(list(preds), dtype=object)
    return (
        np.asarray([str(source) for source in data_sources], dtype=object),
        np.asarray(list(prompt_ids), dtype=object),
        acc,
        preds_array,
        np.asarray(response_lengths, dtype=np.float64),
        np.asarray(truncated, dtype=bool),
    )
