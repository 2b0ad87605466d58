"""The validation headline ``val-core/<source>/acc/mean@k`` covers every problem.

Runs verl's real ``RayPPOTrainer._val_metrics_update`` (through ``RayDAPOTrainer``) on the shape of the
default run's validation: 31 problems validated with n = 4, one of which appears twice in the file, so
that its problem id (data source + prompt) collects 8 samples.
"""

from __future__ import annotations

import numpy as np
import pytest

from recipe_dapo.run.validation_metrics import equal_samples_per_problem

SOURCE = "synthetic_arithmetic"


def default_run_validation():
    """31 problems x 4 samples, problem p0 repeated in the file (8 samples).

    Correct samples: all 8 of p0 and 1 of the 4 of p1; every other sample is wrong.
    Per-problem accuracies: p0 = 1, p1 = 1/4, p2..p30 = 0, so the mean over the 31 problems is
    (1 + 0.25) / 31 = 0.0403...; verl's own grouping reported p0 alone (1.0) as mean@8.
    """
    uids, acc = [], []
    for problem in range(31):
        copies = 2 if problem == 0 else 1
        for _ in range(copies * 4):
            uids.append(f"p{problem}")
            acc.append(1.0 if problem == 0 else 0.0)
    acc[8] = 1.0  # first sample of p1 (p0 holds indices 0..7)
    n = len(uids)
    infos = {
        "reward": [2.0 * a - 1.0 for a in acc],
        "acc": acc,
        "score": [2.0 * a - 1.0 for a in acc],
        "pred": ["7" if a else "3" for a in acc],
        "response_length": [10.0] * n,
        "truncated": [False] * n,
    }
    return np.array([SOURCE] * n, dtype=object), uids, infos


@pytest.fixture(scope="module")
def trainer():
    from recipe_dapo.trainers.classic.trainer import RayDAPOTrainer

    # Only the metric code runs: no workers, no config needed by the methods under test.
    return object.__new__(RayDAPOTrainer)


def test_headline_is_the_per_problem_mean_over_every_problem(trainer):
    data_sources, uids, infos = default_run_validation()
    metrics = trainer._val_metrics_update(data_sources, uids, infos, sample_turns=[])
    expected = (1.0 + 0.25) / 31
    assert metrics[f"val-core/{SOURCE}/acc/mean@4"] == pytest.approx(expected)
    assert metrics[f"val/{SOURCE}/mean@4"] == pytest.approx(expected)
    assert metrics[f"val/{SOURCE}/num_problems"] == 31


def test_no_validation_metric_describes_only_the_problems_with_more_samples(trainer):
    data_sources, uids, infos = default_run_validation()
    metrics = trainer._val_metrics_update(data_sources, uids, infos, sample_turns=[])
    # verl named p0's metrics @8 and showed mean@8 = 1.0 as the headline; nothing @8 may remain.
    assert not [key for key in metrics if "@8" in key]
    core = {key for key in metrics if key.startswith("val-core/")}
    names = ("mean@4", "best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std")
    assert core == {f"val-core/{SOURCE}/acc/{name}" for name in names}


def test_verl_metrics_on_equal_groups_match_the_hand_computed_best_of_k(trainer):
    data_sources, uids, infos = default_run_validation()
    metrics = trainer._val_metrics_update(data_sources, uids, infos, sample_turns=[])
    # best@4 over 4 samples (bootstrap draws with replacement): p0 always 1, p1 is 1 with prob 1-(3/4)^4.
    # The bootstrap estimate is noisy, so it is bounded rather than pinned: mean over 31 problems.
    best = metrics[f"val-core/{SOURCE}/acc/best@4/mean"]
    assert (1 + 0.6) / 31 < best < (1 + 0.8) / 31


def test_equal_samples_keeps_the_first_k_samples_of_each_problem_in_order():
    data_sources = ["a", "a", "a", "b", "a", "b", "b", "b"]
    uids = ["x", "x", "y", "z", "x", "z", "w", "w"]
    infos = {"acc": [1, 2, 3, 4, 5, 6, 7, 8], "empty": []}
    # a: x has 3 samples, y has 1 -> k = 1; b: z has 2, w has 2 -> k = 2.
    sources, kept_uids, kept = equal_samples_per_problem(data_sources, uids, infos)
    assert list(sources) == ["a", "a", "b", "b", "b", "b"]
    assert kept_uids == ["x", "y", "z", "z", "w", "w"]
    assert kept == {"acc": [1, 3, 4, 6, 7, 8], "empty": []}
