"""Per-step reward metrics from the ``reward_extra_info`` columns of the ``recipe_dapo`` manager.

Call it on every generation batch's columns (``batch.non_tensor_batch`` after the reward, or the
``reward_extra_infos_dict`` from ``verl.trainer.ppo.reward.extract_reward``) *before* dynamic sampling
drops groups, so the ratios describe everything that was scored::

    reward/verify_error_ratio    fraction of samples whose verification raised or timed out (scored -1)
    reward/verify_timeout_ratio  the part of those that were time-outs (verify_error starts with "time-out")
    reward/symbolic_skipped_count  answers only the symbolic step could have matched, scored -1 because it is off
    reward/no_answer_ratio       fraction with no extractable answer (pred == "")
    reward/acc_mean              fraction answered correctly

(``overlong/*`` come from the same columns through ``recipe_dapo.overlong.overlong_metrics``.)
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

ACC_MEAN = "reward/acc_mean"

REWARD_EXTRA_KEYS = (
    "score", "acc", "pred", "overlong_reward", "truncated", "response_length", "verify_error", "symbolic_skipped"
)
"""The per-sample ``reward_extra_info`` keys of the ``recipe_dapo`` manager (the same keys for every sample)."""


def reward_metrics(columns: Mapping[str, Any]) -> dict[str, float]:
    """The metrics above from per-sample columns (numpy arrays or lists); missing columns are skipped."""
    metrics: dict[str, float] = {}
    if "verify_error" in columns:
        errors = [str(e) for e in columns["verify_error"]]
        if errors:
            metrics["reward/verify_error_ratio"] = float(np.mean([e != "" for e in errors]))
            metrics["reward/verify_timeout_ratio"] = float(np.mean([e.startswith("time-out") for e in errors]))
    if "symbolic_skipped" in columns and len(columns["symbolic_skipped"]):
        metrics["reward/symbolic_skipped_count"] = float(np.sum(np.asarray(columns["symbolic_skipped"], dtype=bool)))
    if "pred" in columns and len(columns["pred"]):
        metrics["reward/no_answer_ratio"] = float(np.mean([str(p) == "" for p in columns["pred"]]))
    if "acc" in columns and len(columns["acc"]):
        metrics[ACC_MEAN] = float(np.mean(np.asarray(columns["acc"], dtype=np.float64)))
    return metrics
