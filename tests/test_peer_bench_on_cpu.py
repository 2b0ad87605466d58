"""``bench/peer_side_by_side.py``'s summary: a repeat that failed is reported in the table and the RESULT line, and the
bench exits non-zero; driven through its summary function with recorded results, no launch."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "peer_side_by_side.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("peer_side_by_side", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_result(bench, step_s: float) -> dict:
    result = {key: 1.0 for _, key, _, _ in bench.COLUMNS}
    result.update(step_s=step_s, gen_over_ideal=1.0, discarded=0.0)
    return result


def summary(bench, capsys, results, failures):
    args = argparse.Namespace(steps=10, repeats=3, arms=["recipe_v0", "recipe_v1"])
    status = bench.finish(results, args, failures)
    lines = capsys.readouterr().out.splitlines()
    return status, lines, next(line for line in lines if line.startswith(("RESULT", "PARTIAL")))


def test_a_failed_repeat_is_in_the_result_line_and_the_table_and_the_bench_exits_non_zero(bench, capsys):
    """recipe_v1's second repeat failed: its mean comes from 2 repeats, said as such; the RESULT line carries
    failed_repeats=1 and the exit status is 1. Positive control: the same figures with no failure give 0 and
    failed_repeats=0 (before this, a failed repeat was only printed while running and the RESULT line read as
    3 clean repeats)."""
    results = {"recipe_v0": [run_result(bench, s) for s in (10.0, 11.0, 12.0)],
               "recipe_v1": [run_result(bench, s) for s in (20.0, 22.0)]}
    status, lines, result = summary(bench, capsys, results, ["recipe_v1 repeat 1"])
    assert status == 1
    assert result.startswith("RESULT ") and result.endswith(" failed_repeats=1")
    assert "recipe_v0_step_s=11.00" in result and "recipe_v1_step_s=21.00" in result
    assert any(line.startswith("| recipe_v1 | 2 of 3 | 21.00 [20.00-22.00]") for line in lines), lines
    assert any(line.startswith("| recipe_v0 | 3 of 3 |") for line in lines)
    assert "FAILED repeats (their figures are missing above): recipe_v1 repeat 1" in lines

    results["recipe_v1"].append(run_result(bench, 21.0))
    status, _, result = summary(bench, capsys, results, [])
    assert status == 0 and result.endswith(" failed_repeats=0")


def test_an_arm_whose_every_repeat_failed_is_listed_as_failed(bench, capsys):
    results = {"recipe_v0": [run_result(bench, 10.0)] * 3, "recipe_v1": []}
    failures = [f"recipe_v1 repeat {r}" for r in range(3)]
    status, lines, result = summary(bench, capsys, results, failures)
    assert status == 1 and result.endswith(" failed_repeats=3") and "recipe_v1_step_s" not in result
    assert any(line.startswith("| recipe_v1 | 0 of 3 | failed") for line in lines)
