"""``max_staleness`` is a hard bound: property tests over random scenarios.

Random batch sizes, prompt granularity, mini-batch sizes (``groups_multiple_of``), budgets, exhaustion policies, keep
rates and checkpoint restores, through both step loops (``collect_step``: the classic trainer's rounds;
``collect_streaming_step`` with draining: verl v1's synchronous trainer; without: its async mode, where a group
submitted in one step may finish in a later one). Every group's birth step (the step its prompt was submitted in) is
known to the source, so each check is against ground truth, not against the sampler's own bookkeeping:

- every trained group was generated at most ``max_staleness`` steps before the step that trains it;
- the pool a step carries out (``carried_out_groups``) is the pool, and every group in it can still train;
- ``trained_groups``, ``carried_in_groups`` and ``dropped_stale_groups`` count what happened, and over the run
  qualifying = trained + pooled + dropped.

The positive controls run the same checks on a sampler whose drops are switched off, and on one that ages a streamed
group from its arrival instead of its submission, and find the violations.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from recipe_dapo.dynamic_sampling import (
    DynamicSampler,
    DynamicSamplingConfig,
    DynamicSamplingExhausted,
    PromptStream,
    ScoredRound,
    collect_step,
    collect_streaming_step,
)

P = "dynamic_sampling/"
N = 2  # responses per prompt


class BoundViolated(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise BoundViolated(message)


class Births:
    """The ground truth: the step each group id was generated in, and which qualified."""

    def __init__(self, rng: np.random.Generator, keep: float):
        self.rng, self.keep = rng, keep
        self.step_of: dict[str, int] = {}
        self.serial = itertools.count()

    def scored(self, count: int, step: int, submitted: list | None = None) -> ScoredRound:
        """``count`` groups generated in ``step``, or submitted in the steps ``submitted`` (a streaming source)."""
        uids = [f"g{next(self.serial)}" for _ in range(count)]
        born = submitted if submitted is not None else [step] * count
        for uid, birth in zip(uids, born):
            self.step_of[uid] = birth
        qualifies = self.rng.random(count) < self.keep
        acc = np.concatenate([[1.0, 0.0] if q else [float(self.rng.random() < 0.5)] * N for q in qualifies])
        rows = np.repeat(np.array(uids, dtype=object), N)
        return ScoredRound(rollouts=rows, group_ids=rows.copy(), metric_values=acc, generated_tokens=len(rows),
                           born_steps=None if submitted is None else np.repeat(np.array(born), N))


class Stream:
    """A streaming source: each prompt's group comes back after 1..max_polls polls."""

    def __init__(self, births: Births, max_polls: int):
        self.births, self.max_polls = births, max_polls
        self.pending: list[list] = []  # [polls left, step submitted in]
        self.step = 0
        self.submitted = self.returned = 0

    def submit(self, prompts: int) -> None:
        for _ in range(prompts):
            self.pending.append([int(self.births.rng.integers(1, self.max_polls + 1)), self.step])
        self.submitted += prompts

    def poll(self):
        done = [p[1] for p in self.pending if p[0] <= 1]
        self.pending = [[p[0] - 1, p[1]] for p in self.pending if p[0] > 1]
        if not done:
            return None
        self.returned += len(done)
        return self.births.scored(len(done), self.step, submitted=done)

    def release(self, group_ids) -> None:
        pass

    def in_flight(self) -> int:
        return self.submitted - self.returned

    def wait(self) -> None:
        pass


def random_scenario(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    staleness = int(rng.integers(0, 3))
    granularity = int(rng.choice([1, 2, 4]))
    train = granularity * int(rng.integers(1, 4))
    if staleness and granularity > train * staleness:
        granularity = 1
    return dict(
        rng=rng,
        loop=str(rng.choice(["rounds", "streaming", "async"])),
        staleness=staleness,
        granularity=granularity,
        train=train,
        gen=train * int(rng.integers(1, 3)),
        mini=int(rng.choice([d for d in range(1, train + 1) if train % d == 0])),
        budget=int(rng.integers(1, 4)),
        on_exhausted=str(rng.choice(["train_partial", "raise"])),
        sizing=str(rng.choice(["deficit", "whole"])),
        keep=float(rng.uniform(0.05, 0.9)),
        restore_every=int(rng.integers(0, 4)),  # 0: never
        steps=12,
    )


def make_sampler(s: dict, sampler_class=DynamicSampler) -> DynamicSampler:
    config = DynamicSamplingConfig.from_config(
        {"enable": True, "metric": "acc", "max_num_gen_batches": s["budget"]},
        {"max_staleness": s["staleness"], "prompt_granularity": s["granularity"], "on_exhausted": s["on_exhausted"],
         "round_sizing": s["sizing"], "min_round_prompts": s["granularity"], "max_empty_rounds": 1000},
        train_batch_size=s["train"],
        gen_batch_size=s["gen"],
    )
    return sampler_class(config)


def run_and_check(s: dict, sampler_class=DynamicSampler) -> dict:
    """Run the scenario's steps, checking the bound and the metrics at every step; the run's totals."""
    births = Births(s["rng"], s["keep"])
    sampler = make_sampler(s, sampler_class)
    prompts = PromptStream(lambda epoch: (np.arange(i, i + s["gen"]) for i in itertools.count(0, s["gen"])))
    stream = Stream(births, max_polls=int(s["rng"].integers(1, 5)))
    seen_trained: set[str] = set()
    dropped_total = 0
    for step in range(1, s["steps"] + 1):
        if s["restore_every"] and step % s["restore_every"] == 0:
            state = sampler.state_dict()
            sampler = sampler_class(sampler.config)
            sampler.load_state_dict(state)
        stream.step = step
        try:
            if s["loop"] == "rounds":
                collected = collect_step(sampler, prompts, lambda p, step=step: births.scored(len(p), step), step,
                                         groups_multiple_of=s["mini"])
            else:
                collected = collect_streaming_step(sampler, stream, step, groups_multiple_of=s["mini"],
                                                   drain=s["loop"] == "streaming")
        except DynamicSamplingExhausted:
            break  # the run stops (on_exhausted=raise, or a v1 step short of a mini-batch): nothing trains
        metrics = collected.metrics
        trained = [] if collected.batch is None else [str(uid) for uid in collected.batch[::N]]
        ages = [step - births.step_of[uid] for uid in trained]
        check(all(age <= s["staleness"] for age in ages),
              f"step {step} trained groups {max(ages, default=0)} steps old at max_staleness={s['staleness']}")
        check(not seen_trained & set(trained), f"step {step} trained a group twice")
        seen_trained |= set(trained)
        check(metrics[P + "trained_groups"] == len(trained), f"step {step}: trained_groups")
        check(metrics[P + "carried_in_groups"] == sum(age > 0 for age in ages), f"step {step}: carried_in_groups")
        check(metrics[P + "carried_out_groups"] == sampler.pooled_groups,
              f"step {step}: carried_out_groups {metrics[P + 'carried_out_groups']} but {sampler.pooled_groups} pooled")
        pooled_ages = [step + 1 - births.step_of[str(uid)] for uid in sampler.pooled_group_ids()]
        check(all(age <= s["staleness"] for age in pooled_ages),
              f"step {step} carries out a group that cannot train within max_staleness={s['staleness']}")
        dropped_total += int(metrics[P + "dropped_stale_groups"])
    counters = sampler.run_counters()
    check(counters["dropped_stale_groups"] >= dropped_total, "dropped_stale_groups summed over steps")
    check(counters["qualifying_groups"]
          == counters["trained_groups"] + sampler.pooled_groups + counters["dropped_stale_groups"],
          f"qualifying != trained + pooled + dropped: {counters}, pooled {sampler.pooled_groups}")
    return counters


@pytest.mark.parametrize("seed", range(300))
def test_no_trained_group_is_older_than_max_staleness_and_the_pool_metrics_equal_the_pool(seed):
    run_and_check(random_scenario(seed))


def test_the_scenarios_cover_drops_restores_partial_steps_and_both_loops():
    """The random scenarios reach what the bound is about: drops, partial steps under train_partial with mini-batches
    of several groups, restores, max_staleness 0 to 2, both loops (else the property test above proves little)."""
    seen = {"dropped": 0, "partial": 0, "restores": 0, "loops": set(), "staleness": set()}
    for seed in range(300):
        s = random_scenario(seed)
        counters = run_and_check(s)
        seen["dropped"] += counters["dropped_stale_groups"] > 0
        seen["partial"] += counters["partial_steps"] > 0 and s["mini"] > 1
        seen["restores"] += s["restore_every"] > 0
        seen["loops"].add(s["loop"])
        seen["staleness"].add(s["staleness"])
    assert seen["dropped"] >= 30 and seen["partial"] >= 30 and seen["restores"] >= 100, seen
    assert seen["loops"] == {"rounds", "streaming", "async"} and seen["staleness"] == {0, 1, 2}


class NeverDrops(DynamicSampler):
    """A sampler whose stale groups are never dropped (the positive control)."""

    def _drop_stale(self, born_before: int) -> None:
        pass


def test_the_checks_catch_a_sampler_that_keeps_stale_groups():
    """Positive control: with drops switched off, the same random scenarios train groups beyond the bound."""
    caught = 0
    for seed in range(300):
        try:
            run_and_check(random_scenario(seed), NeverDrops)
        except BoundViolated:
            caught += 1
    assert caught >= 30, caught


class AgesFromArrival(DynamicSampler):
    """A sampler that ages a streamed group from the step it arrived in (the positive control for async streams)."""

    def _group_born_steps(self, born_steps, stats, num_rows):
        return None


def test_the_checks_catch_a_sampler_that_ages_streamed_groups_from_their_arrival():
    caught = 0
    for seed in range(300):
        scenario = random_scenario(seed)
        if scenario["loop"] != "async":
            continue
        try:
            run_and_check(scenario, AgesFromArrival)
        except BoundViolated:
            caught += 1
    assert caught >= 10, caught


def test_the_first_drop_is_a_warning_naming_the_bound_and_later_ones_are_not(caplog):
    s = dict(random_scenario(0), staleness=0, train=2, gen=4, granularity=1, mini=1, budget=0, keep=0.9,
             on_exhausted="train_partial", sizing="whole", restore_every=0, loop="rounds", steps=4)
    with caplog.at_level(logging.DEBUG, logger="recipe_dapo.dynamic_sampling.sampler"):
        counters = run_and_check(s)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert counters["dropped_stale_groups"] >= 2
    assert len(warnings) == 1 and "max_staleness=0" in warnings[0] and "dropped_stale_groups" in warnings[0]


def test_the_round_loop_keeps_no_ids_of_the_groups_it_dropped():
    """Only a streaming source frees storage by a dropped group's id; the round loop lets them go at once (over a long
    run at max_staleness=0 they would otherwise pile up, one per dropped group)."""
    s = dict(random_scenario(0), staleness=0, train=2, gen=4, granularity=1, mini=1, budget=0, keep=0.9,
             on_exhausted="train_partial", sizing="whole", restore_every=0, loop="rounds", steps=1)
    sampler = make_sampler(s)
    births = Births(s["rng"], s["keep"])
    prompts = PromptStream(lambda epoch: (np.arange(i, i + 4) for i in itertools.count(0, 4)))
    collected = collect_step(sampler, prompts, lambda p: births.scored(len(p), 1), 1)
    assert collected.metrics[P + "dropped_stale_groups"] >= 1  # (positive control: something was dropped)
    assert sampler.take_dropped_group_ids().shape[0] == 0
