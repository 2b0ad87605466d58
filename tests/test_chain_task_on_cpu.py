"""Chain arithmetic, the learning study's task: problems, worked solutions and rows the real reward path scores."""

from __future__ import annotations

import pytest

from recipe_dapo.cpu import assets, chain_task
from recipe_dapo.reward import compute_score


def test_solution_evaluates_one_operation_per_line_and_ends_with_the_answer():
    # 4+5-2+3: 4+5 = 9, 9-2 = 7, 7+3 = 10, each line copying what is left of the chain.
    problem = chain_task.ChainProblem((4, 5, 2, 3), ("+", "-", "+"))
    assert problem.text == "Compute 4+5-2+3."
    assert chain_task.solution(problem) == "4+5-2+3\n=9-2+3\n=7+3\n=10\nAnswer: 10"
    assert chain_task.solution(problem, "verbose") == (
        "Step 1: 4+5-2+3\nStep 2: =9-2+3\nStep 3: =7+3\nStep 4: =10\nSo the result is 10.\nAnswer: 10")
    with pytest.raises(ValueError, match="unknown solution style"):
        chain_task.solution(problem, "terse")


def test_problems_are_seeded_parse_back_and_keep_the_running_total_in_range():
    drawn = chain_task.problems(300, seed=0, split="train")
    assert drawn == chain_task.problems(300, seed=0, split="train")
    assert drawn != chain_task.problems(300, seed=0, split="val")
    assert {p.steps for p in drawn} == {1, 2, 3, 4}  # 2-5 terms: the lengths spread
    for problem in drawn:
        assert chain_task.parse_problem(problem.text) == problem
        assert all(0 <= total <= chain_task.MAX_TOTAL for total in problem.running_totals())
        assert all(1 <= term <= chain_task.MAX_TERM for term in problem.terms)
    with pytest.raises(ValueError, match="not a chain-arithmetic problem"):
        chain_task.parse_problem("What is 3 + 4?")


def test_chain_rows_are_bare_problems_whose_solutions_in_either_style_score_correct_and_wrong_ones_do_not():
    rows = assets.synthetic_rows(40, "train", seed=0, task="chain")
    for row in rows:
        problem_text, answer = assets.arithmetic_problem_from_row(row)
        assert row["prompt"][0]["content"] == problem_text  # no DAPO template: a short prompt
        problem = chain_task.parse_problem(problem_text)
        assert problem.answer == answer == int(row["reward_model"]["ground_truth"])
        for style in chain_task.STYLES:
            scored = compute_score(row["data_source"], chain_task.solution(problem, style), str(answer))
            assert scored["acc"] is True
        wrong = chain_task.solution(problem).rsplit("Answer:", 1)[0] + f"Answer: {answer + 1}"
        assert compute_score(row["data_source"], wrong, str(answer))["acc"] is False


def test_warmup_targets_mix_both_styles_from_a_seeded_draw():
    import random

    rows = assets.synthetic_rows(200, "warmup", seed=0, task="chain")
    styles = random.Random(1)
    targets = [assets.warmup_solution(*assets.arithmetic_problem_from_row(r), "chain", styles) for r in rows]
    verbose = sum(t.startswith("Step 1:") for t in targets)
    assert 0 < verbose < len(targets)
    arithmetic = assets.synthetic_rows(3, "train", seed=0)
    assert assets.warmup_solution(*assets.arithmetic_problem_from_row(arithmetic[0]), "arithmetic",
                                  random.Random(1)) == assets.worked_solution(*assets.arithmetic_problem_from_row(arithmetic[0]))
