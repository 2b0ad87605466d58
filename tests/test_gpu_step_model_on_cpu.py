"""The GPU step-time model (``bench/gpu_step_model.py``): its engine, its token books and its one-round mode.

With every response the same length and a fixed half of the prompts qualifying, a round's time and tokens follow
from the sizing formula and the engine's wave arithmetic, computed here independently of the simulation. The
one-round mode (the recipe's ``one_round=true``) trains exactly the batch every step, loses no aborted token and trains
no group more than ``max_staleness`` steps after its submission; deliberately broken variants that throw the aborted
groups away, or never report overdue prompts, are caught by the same checks (token books, length shift, ages).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_step_model as model  # noqa: E402

SMALL = model.System(replicas=2, concurrency=4, train_prompts=8, gen_prompts=24, poll_s=0.5)
LENGTH = 100


@pytest.fixture(autouse=True)
def _quiet():
    """The sampler's expected warnings (the paper's discard) off during each test, the level put back after."""
    recipe = logging.getLogger("recipe_dapo")
    level = recipe.level
    recipe.setLevel(logging.ERROR)
    yield
    recipe.setLevel(level)


def half_qualify_world() -> model.World:
    """Every response LENGTH tokens; even prompts get 8 of 16 right (kept), odd ones none (dropped)."""
    return model.World(0.5, 0.0, seed=0, constant_length=LENGTH, correct_pattern=lambda i: 8 if i % 2 == 0 else 0)


def waves_seconds(sequences: int, system: model.System) -> float:
    """A blocking round of equal responses, spread round-robin: each replica runs full waves of ``concurrency`` and a
    last partial one; every admitted sequence costs its prefill."""
    worst = 0.0
    for replica in range(system.replicas):
        mine = len(range(replica, sequences, system.replicas))
        full, rest = divmod(mine, system.concurrency)
        seconds = 0.0
        for size in [system.concurrency] * full + ([rest] if rest else []):
            seconds += size * system.prefill_s_per_token * system.prompt_tokens
            seconds += LENGTH * (system.decode_fixed_s + system.decode_per_seq_s * size)
        worst = max(worst, seconds)
    return worst


def test_equal_lengths_give_the_sizing_arithmetic_in_every_mode():
    world = half_qualify_world()
    # First round of a step at the prior keep rate 0.5 and the default margin 0.1: ceil(8 * 1.1 / 0.5) = 18 prompts,
    # of which 9 qualify: one round. v1's submission is capped by the dispatch room, 8 x (1 + max_staleness 1) = 16
    # prompts (8 qualify: full). The paper's whole round is gen_batch_size = 24 prompts.
    first = math.ceil(8 * 1.1 / 0.5)
    expected = {"deficit": first, "v1": 16, "whole": 24}
    for mode, prompts in expected.items():
        records, accounts = model.run_mode(mode, world, SMALL, steps=1)
        record = records[0]
        assert record.generated_tokens == prompts * model.RESPONSES * LENGTH, mode
        assert accounts["sampler"].run_counters()["generated_groups"] == prompts, mode
        assert record.trained_groups == 8, mode
        exact = waves_seconds(prompts * model.RESPONSES, SMALL)
        if mode == "v1":  # the step ends at the poll that sees the last group
            assert exact <= record.gen_s <= exact + SMALL.poll_s + 1e-9, (record.gen_s, exact)
        else:
            assert record.gen_s == pytest.approx(exact, rel=1e-12), mode
    # Over several steps the round modes' tokens are exactly their generated groups' responses.
    for mode in ("deficit", "whole"):
        records, accounts = model.run_mode(mode, world, SMALL, steps=5)
        groups = accounts["sampler"].run_counters()["generated_groups"]
        assert sum(r.generated_tokens for r in records) == groups * model.RESPONSES * LENGTH


def token_books_balance(accounts: dict) -> bool:
    """Every decoded token is in a finished response or in a response carried to the next step."""
    return accounts["decoded"] == accounts["finished"] + accounts["carried"]


def quick_world(keep: float = 0.45) -> model.World:
    return model.World(keep, model.LENGTH_SETTINGS["paper"], seed=3)


def test_one_round_trains_exactly_the_batch_and_loses_no_aborted_token():
    world = quick_world()
    records, accounts = model.run_mode("one_round", world, model.QUICK, steps=8)
    assert [r.trained_groups for r in records] == [model.QUICK.train_prompts] * 8
    assert accounts["carried"] > 0 and sum(r.resumed for r in records) > 0  # it did abort and resume
    assert token_books_balance(accounts)
    # v1 drains: nothing is carried, and its books balance too.
    records, accounts = model.run_mode("v1", world, model.QUICK, steps=4)
    assert accounts["carried"] == 0 and accounts["in_flight_groups"] == 0 and token_books_balance(accounts)


def test_throwing_aborted_groups_away_is_caught_by_the_books_and_by_the_length_shift():
    world = quick_world()
    reference = world.reference()
    shifts = {}
    for broken in (False, True):
        records, accounts = model.run_mode("one_round", world, model.QUICK, steps=10, drop_aborted=broken)
        assert token_books_balance(accounts) is not broken
        summary = model.summarize("one_round", "paper", world, reference, records, accounts["recorder"], warmup=3,
                                  system=model.QUICK)
        shifts[broken] = summary.shift
        # No schedule decodes faster than every replica full: the step's own tokens at peak rate bound its time.
        assert 0 < summary.floor_s <= summary.gen_s, (summary.floor_s, summary.gen_s)
        if broken:
            assert summary.resumed_per_step == 0
    # The broken variant trains what finishes first: the short, easy groups. Same prompts, so the gap is not noise.
    assert shifts[True] < shifts[False] - 0.05, shifts


def test_overdue_counts_the_prompts_in_flight_that_would_train_too_late():
    """max_staleness 1: a prompt submitted in step 1 and still in flight in step 2 would, aborted again, train in step 3
    at the earliest, two steps after its submission; the prompts of step 2 are not overdue. max_staleness 2: none."""
    for max_staleness, expected in ((1, 3), (2, 0)):
        stream = model.SimulatedStream(half_qualify_world(), SMALL, model.Recorder(), max_staleness=max_staleness)
        stream.begin_step(1)
        stream.submit(3)
        stream.wait()  # 0.5 s: no response of 100 tokens has finished
        assert stream.overdue() == 0  # aborted now, they would train in step 2: in time
        stream.abort()
        stream.begin_step(2)
        stream.submit(2)
        assert stream.in_flight() == 5 and stream.overdue() == expected, max_staleness


@pytest.mark.parametrize("keep", [0.3, 0.6])
def test_one_round_never_trains_a_group_later_than_max_staleness(keep):
    """The real one-round mode (one_round=true, max_staleness 1): every trained group was submitted at most one step
    before (and some at exactly one: resumed responses are trained), and no group finishes later than that. Here the
    resumed responses start first and finish before the batch fills, so no step waits for overdue prompts; the wait and
    its positive control (a stream that never reports them) are exercised by tests/test_one_round_on_cpu.py, whose
    lengths have a tail long enough to outlast a step twice."""
    world = quick_world(keep)
    records, accounts = model.run_mode("one_round", world, model.QUICK, steps=8)
    assert [r.trained_groups for r in records] == [model.QUICK.train_prompts] * 8
    assert max(r.oldest_age for r in records) <= 1 and max(r.oldest_age for r in records[1:]) == 1
    assert accounts["late_groups"] == 0
    assert token_books_balance(accounts)


def test_keep_rate_settings_and_length_calibration_hold():
    for keep in (0.1, 0.9):
        assert model.expected_keep_rate(model.concentration_for(keep)) == pytest.approx(keep, abs=1e-6)
    world = model.World(0.3, 4000.0, seed=1)
    reference = world.reference()
    assert reference["keep_rate"] == pytest.approx(0.3, abs=0.01)
    assert reference["kept_mean_length"] == pytest.approx(4000.0, rel=0.02)
    # Harder prompts answer longer: the groups that qualify are harder than those all right.
    q, correct, lengths = world.prompts(0, 4000)
    easy, hard = q > 0.8, q < 0.2
    assert lengths[hard].mean() > 1.5 * lengths[easy].mean()
    assert lengths.max() <= model.MAX_LENGTH


def test_ks_distance():
    a = np.arange(100)
    assert model.ks_distance(a, a) == 0.0
    assert model.ks_distance(a, a + 1000) == 1.0
    assert model.ks_distance(a, a + 50) == pytest.approx(0.5)
