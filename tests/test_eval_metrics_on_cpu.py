"""Evaluation metrics: unbiased pass@k, mean@k, maj@k and their per-data-source aggregation.

Golden values are derived by hand in the comments. The 960-vs-30 equivalence test builds its validation
batches with verl's real ``DataProto`` and its ``repeat(interleave=True)``, exactly as
``RayPPOTrainer._validate`` repeats a validation batch ``val_kwargs.n`` times.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from verl import DataProto

from recipe_dapo.evaluation.metrics import (
    majority_vote_correct,
    mean_at_k,
    pass_at_k,
    pass_k_values,
    per_source_metrics,
    problem_ids_from_prompts,
    validation_metrics,
)

from conftest import SHARED  # noqa: E402



# ---------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (10, 3, 1, 0.3),
        (4, 4, 3, 1.0),  # n = c: every draw is correct
        (4, 0, 2, 0.0),  # c = 0: no draw is correct
        (5, 3, 3, 1.0),  # k > n - c = 2: any 3 of 5 include a correct one
        (6, 1, 6, 1.0),  # k = n: the one correct sample is always drawn
        (1000, 1, 500, 0.5),  # 1 - C(999,500)/C(1000,500) = 1 - 500/1000, with no overflow
    ],
)
def test_pass_at_k_matches_golden_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_on_every_small_case():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_reported_pass_ks_are_powers_of_two_up_to_k_plus_k():
    assert pass_k_values(32) == [1, 2, 4, 8, 16, 32]
    assert pass_k_values(6) == [1, 2, 4, 6]
    assert pass_k_values(1) == [1]


# ---------------------------------------------------------------- mean@k and maj@k


def test_mean_at_k_is_the_fraction_of_correct_samples():
    assert mean_at_k([1, 0, 0, 1, 1]) == pytest.approx(0.6)


def test_majority_vote_counts_normalised_answers_together():
    # "025" and "25" are one answer with 2 votes, beating "7" with 1; its first sample is correct.
    assert majority_vote_correct(["7", "025", "25"], [False, True, True]) == 1.0


def test_majority_vote_tie_goes_to_the_answer_seen_first():
    # "7" and "5" both have 2 votes; "7" appears first, and it is wrong.
    assert majority_vote_correct(["7", "5", "05", "7"], [False, True, True, False]) == 0.0
    assert majority_vote_correct(["5", "7", "7", "05"], [True, False, False, True]) == 1.0


def test_samples_without_an_answer_do_not_vote():
    # Three blank/None preds would outvote "4" if they counted.
    assert majority_vote_correct([None, "", "  ", "4"], [False, False, False, True]) == 1.0
    assert majority_vote_correct([None, ""], [False, False]) == 0.0


# ---------------------------------------------------------------- aggregation per data source


def test_validation_metrics_match_hand_computed_values():
    # Source "a": three problems, four samples each; source "b": one problem, two samples, interleaved.
    #   p1 acc 1,0,1,0  preds 5,7,05,7 -> mean .5, pass@2 1-C(2,2)/C(4,2)=5/6, pass@4 1; maj: 5 vs 7 tie, 5 first -> 1
    #   p2 acc 0,0,0,0  preds 1,2,-,1  -> mean 0, pass 0; maj "1" wrong -> 0
    #   p3 acc 1,1,1,0  preds 9,9,9,8  -> mean .75, pass@2 1 (n-c=1<2), pass@4 1; maj "9" right -> 1
    #   a: mean@4 = pass@1 = (.5+0+.75)/3 = 5/12; pass@2 = (5/6+0+1)/3 = 11/18; pass@4 = maj@4 = 2/3
    #   b: q1 acc 1,0 preds 3,4 -> mean@2 = pass@1 = .5, pass@2 = 1, maj tie -> "3" first, right -> 1
    samples = [
        ("a", "p1", 1, "5", 10, False),
        ("b", "q1", 1, "3", 4, False),
        ("a", "p1", 0, "7", 20, True),
        ("a", "p2", 0, "1", 30, True),
        ("a", "p1", 1, "05", 10, False),
        ("a", "p2", 0, "2", 30, True),
        ("a", "p3", 1, "9", 5, False),
        ("a", "p2", 0, None, 30, True),
        ("a", "p3", 1, "9", 5, False),
        ("a", "p1", 0, "7", 20, True),
        ("a", "p3", 1, "9", 5, False),
        ("b", "q1", 0, "4", 6, False),
        ("a", "p2", 0, "1", 30, True),
        ("a", "p3", 0, "8", 5, False),
    ]
    sources, ids, acc, preds, lengths, truncated = map(list, zip(*samples))

    metrics = validation_metrics(sources, ids, acc, preds, lengths, truncated)

    expected = {
        "val/a/mean@4": 5 / 12,
        "val/a/pass@1": 5 / 12,
        "val/a/pass@2": 11 / 18,
        "val/a/pass@4": 2 / 3,
        "val/a/maj@4": 2 / 3,
        "val/a/response_length_mean": (2 * 10 + 2 * 20 + 4 * 30 + 4 * 5) / 12,  # = 200/12
        "val/a/truncated_ratio": 6 / 12,  # the two 20s and the four 30s
        "val/a/num_problems": 3,
        "val/b/mean@2": 0.5,
        "val/b/pass@1": 0.5,
        "val/b/pass@2": 1.0,
        "val/b/maj@2": 1.0,
        "val/b/response_length_mean": 5.0,
        "val/b/truncated_ratio": 0.0,
        "val/b/num_problems": 1,
    }
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value), key


def test_unequal_group_sizes_use_the_smallest_as_k_and_vote_over_the_first_k():
    # p1 has 3 samples, p2 has 2 -> k = 2.
    #   p1 acc 1,1,0 preds x,y,y: the first 2 tie, "x" first -> right (all 3 would elect "y", wrong)
    #   p2 acc 0,1   preds -,z  : "z" right
    #   mean@2 = (2/3 + 1/2)/2 = 7/12 (each problem's mean over all its samples); pass@2: both 1 (n-c < 2)
    metrics = per_source_metrics(
        ["c"] * 5, ["p1", "p1", "p1", "p2", "p2"], [1, 1, 0, 0, 1], ["x", "y", "y", None, "z"], [1] * 5, [False] * 5
    )["c"]

    assert metrics["mean@2"] == pytest.approx(7 / 12)
    assert metrics["pass@1"] == pytest.approx(7 / 12)
    assert metrics["pass@2"] == 1.0
    assert metrics["maj@2"] == 1.0


def test_maj_is_left_out_without_extracted_answers():
    metrics = validation_metrics(["a", "a"], ["p", "p"], [1, 0], None, [3, 4], [False, False])

    assert "val/a/maj@2" not in metrics and metrics["val/a/mean@2"] == 0.5


def test_reward_scores_instead_of_accuracies_are_refused():
    with pytest.raises(ValueError, match=r"acc must be per-sample correctness in \[0, 1\]"):
        validation_metrics(["a", "a"], ["p", "p"], [1.0, -1.0], None, [3, 4], [False, False])


def test_arrays_of_different_lengths_are_refused_with_their_lengths():
    with pytest.raises(ValueError, match=r"'acc': 3"):
        validation_metrics(["a", "a"], ["p", "p"], [1, 0, 1], None, [3, 4], [False, False])


def test_problem_ids_group_copies_of_one_prompt_and_separate_data_sources():
    chat = [{"role": "user", "content": "What is 1+1?"}]
    ids = problem_ids_from_prompts(["s", "s", "t", "s"], [chat, "What is 1+1?", chat, "What is 2+2?"])

    assert ids[0] == ids[1]  # chat list and plain text of the same prompt
    assert len({ids[0], ids[2], ids[3]}) == 3


# ---------------------------------------------------------------- 960 rows x n=1  ==  30 rows x n=32


def object_array(values) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def validation_batch(frame: pd.DataFrame, n: int) -> DataProto:
    """The batch verl's _validate scores: each row repeated n times, copies adjacent (interleave=True)."""
    batch = DataProto.from_dict(
        tensors={"row": torch.arange(len(frame))},
        non_tensors={
            "data_source": object_array(frame["data_source"]),
            "raw_prompt": object_array([list(prompt) for prompt in frame["prompt"]]),
            "ground_truth": object_array(frame["reward_model"].map(lambda rm: rm["ground_truth"])),
        },
    )
    return batch.repeat(repeat_times=n, interleave=True)


def simulated_outcomes(batch: DataProto, outcomes: dict[str, list[tuple[int, str, int]]]) -> tuple:
    """Give the j-th sample of each problem (in batch order) the problem's j-th outcome."""
    texts = [prompt[0]["content"] for prompt in batch.non_tensor_batch["raw_prompt"]]
    seen: dict[str, int] = {}
    acc, preds, lengths = [], [], []
    for text in texts:
        j = seen.get(text, 0)
        seen[text] = j + 1
        correct, pred, length = outcomes[text][j]
        acc.append(correct)
        preds.append(pred)
        lengths.append(length)
    return acc, preds, lengths


def batch_metrics(batch: DataProto, outcomes, max_len: int, prompt_ids=None) -> dict[str, float]:
    acc, preds, lengths = simulated_outcomes(batch, outcomes)
    data_sources = batch.non_tensor_batch["data_source"]
    if prompt_ids is None:
        prompt_ids = problem_ids_from_prompts(data_sources, batch.non_tensor_batch["raw_prompt"])
    return validation_metrics(data_sources, prompt_ids, acc, preds, lengths, [length >= max_len for length in lengths])


@pytest.mark.skipif(SHARED is None, reason="shared data not found at ../shared/data or $SHARED_DATA_DIR")
def test_960_row_aime_file_at_n1_and_30_row_file_at_n32_give_identical_metrics():
    frame_960 = pd.read_parquet(SHARED / "eval" / "aime-2024-dapo-960.parquet")
    texts = frame_960["prompt"].map(lambda prompt: prompt[0]["content"])
    frame_30 = frame_960[~texts.duplicated()].reset_index(drop=True)  # first copy of each problem
    assert len(frame_30) == 30

    # 32 outcomes per problem: each problem has its own success rate; wrong samples answer one of two
    # wrong values so that majority votes go both ways.
    rng = np.random.default_rng(0)
    outcomes = {}
    for text, truth in zip(frame_30["prompt"].map(lambda p: p[0]["content"]), frame_30["reward_model"]):
        rate = rng.uniform(0, 1)
        outcomes[text] = [
            (1, truth["ground_truth"], int(rng.integers(50, 120)))
            if rng.uniform() < rate
            else (0, str(rng.choice(["1", "2"])), int(rng.integers(50, 121)))
            for _ in range(32)
        ]
    max_len = 120

    metrics_960 = batch_metrics(validation_batch(frame_960, n=1), outcomes, max_len)
    metrics_30 = batch_metrics(validation_batch(frame_30, n=32), outcomes, max_len)

    assert metrics_960.keys() == metrics_30.keys()
    assert {
        f"val/math_dapo/{name}" for name in ("mean@32", "pass@1", "pass@16", "pass@32", "maj@32")
    } <= metrics_960.keys()
    for key in metrics_960:
        assert metrics_960[key] == pytest.approx(metrics_30[key], abs=1e-12), key
    all_acc = [correct for samples in outcomes.values() for correct, _, _ in samples]
    assert metrics_960["val/math_dapo/mean@32"] == pytest.approx(np.mean(all_acc))

    # Grouping by verl's per-row uid instead of by prompt would see 960 problems with one sample each.
    per_row_uids = [str(i) for i in range(960)]
    by_row = batch_metrics(validation_batch(frame_960, n=1), outcomes, max_len, prompt_ids=per_row_uids)
    assert "val/math_dapo/mean@1" in by_row and "val/math_dapo/mean@32" not in by_row
