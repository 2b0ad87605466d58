"""Pre-rollout prompt skipping: the skip rule, its bound, the adaptation of the exploration probability,
resume, metrics, prompt keys, and the sampler's invariants with skipping on.

The skipper is tested alone (keys in, decisions out) and through ``collect_step`` with numpy payloads (a
structured array: uid and prompt key per row) and with verl ``DataProto``s carrying ``extra_info.index``.
"""

from __future__ import annotations

import io
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl.protocol import DataProto

from recipe_dapo.dynamic_sampling import (
    DATAPROTO_OPS,
    DynamicSampler,
    DynamicSamplingConfig,
    DynamicSamplingConfigError,
    PromptKeyError,
    PromptSkipper,
    PromptStream,
    ScoredRound,
    SkipSettings,
    collect_step,
    resolve_keep_rule,
)
from recipe_dapo.dynamic_sampling.prompt_keys import dataproto_prompt_keys
from recipe_dapo.dynamic_sampling.skipping import beta_binomial_pmf

S = "dynamic_sampling/skip/"
ROW = np.dtype([("uid", np.int64), ("prompt_key", np.int64)])


def settings(**overrides) -> SkipSettings:
    return SkipSettings(**{"enable": True, **overrides})


def make_config(train_batch_size=4, gen_batch_size=8, skip=None, filter_groups=None, **own):
    """Skipping on; with n = 4, a prompt is a candidate after two uniform groups (max_qualify_probability 0.5)."""
    filter_groups = {"enable": True, "metric": "acc", "max_num_gen_batches": 0, **(filter_groups or {})}
    own = {"skip": {"enable": True, "max_qualify_probability": 0.5, **(skip or {})}, **own}
    return DynamicSamplingConfig.from_config(filter_groups, own, train_batch_size=train_batch_size,
                                             gen_batch_size=gen_batch_size, seed=7)


# ----------------------------------------------------------------------------- the skip rule


def skipper_with(seed=0, keep_rule=None, **overrides) -> PromptSkipper:
    return PromptSkipper(settings(**overrides), seed, keep_rule or resolve_keep_rule("spread"))


def uniform_history(skipper, keys, groups, right=True, n=16):
    """``groups`` all-right (or all-wrong) groups of n for each key."""
    for _ in range(groups):
        skipper.record(keys, right=np.full(len(keys), n if right else 0), sizes=np.full(len(keys), n),
                       qualified=np.zeros(len(keys), bool))


def beta_binomial_by_lgamma(n, alpha, beta):
    def log_b(a, b):
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    return np.array([math.comb(n, x) * math.exp(log_b(alpha + x, beta + n - x) - log_b(alpha, beta))
                     for x in range(n + 1)])


def test_beta_binomial_pmf_matches_the_closed_form_and_sums_to_one():
    pmf = beta_binomial_pmf(16, np.array([0.5, 16.5, 3.0, 80.5]), np.array([0.5, 0.5, 7.0, 0.5]))
    for row, (a, b) in zip(pmf, [(0.5, 0.5), (16.5, 0.5), (3.0, 7.0), (80.5, 0.5)]):
        np.testing.assert_allclose(row, beta_binomial_by_lgamma(16, a, b), rtol=1e-10)
        assert row.sum() == pytest.approx(1.0)


def test_the_predicted_chance_to_qualify_is_beta_binomial_under_the_keep_rule():
    skipper = skipper_with(history_decay=0.5)
    assert skipper.qualify_probability(["never seen"]).tolist() == [1.0]
    uniform_history(skipper, ["p"], groups=2)  # decayed counts: right = responses = 16 * 0.5 + 16 = 24
    pmf = beta_binomial_by_lgamma(16, 0.5 + 24, 0.5)
    assert skipper.qualify_probability(["p"])[0] == pytest.approx(1 - pmf[0] - pmf[16])
    band = skipper_with(keep_rule=resolve_keep_rule("band", {"low": 0.25, "high": 0.75}), history_decay=0.5)
    uniform_history(band, ["p"], groups=2)
    assert band.qualify_probability(["p"])[0] == pytest.approx(pmf[4:13].sum())  # 4..12 right of 16


def test_new_prompts_and_prompts_with_a_recent_mixed_group_are_not_candidates():
    skipper = skipper_with(explore_init=0.05, explore_min=0.05, max_qualify_probability=0.2)
    uniform_history(skipper, ["solved", "mixed"], groups=6)
    skipper.record(["mixed"], right=np.array([8]), sizes=np.array([16]), qualified=np.array([True]))
    uniform_history(skipper, ["mixed"], groups=2)
    probability = skipper.qualify_probability(["new", "mixed", "solved"])
    assert probability[0] == 1.0 and probability[1] > 0.2 > probability[2]
    skipped = sum(not g for _ in range(100) for g in skipper.choose(["new", "mixed"]))
    assert skipped == 0


def test_candidates_are_skipped_with_probability_one_minus_explore():
    skipper = skipper_with(seed=1, explore_init=0.7, max_consecutive_skips=10**6)
    keys = [f"p{i}" for i in range(4000)]
    uniform_history(skipper, keys, groups=20, right=False)
    assert (skipper.qualify_probability(keys) < 0.1).all()
    skipped = 4000 - int(skipper.choose(keys).sum())
    assert skipped / 4000 == pytest.approx(0.3, abs=0.03)


def test_no_prompt_is_skipped_more_than_max_consecutive_skips_times_in_a_row_in_random_scenarios():
    rng = np.random.default_rng(0)
    reached = 0
    for scenario in range(40):
        bound = int(rng.integers(1, 5))
        skipper = skipper_with(seed=scenario, explore_init=float(rng.uniform(0.01, 1)), explore_min=0.01,
                               max_consecutive_skips=bound, max_qualify_probability=float(rng.uniform(0.2, 1)))
        run, longest = {}, 0  # key -> skips in a row observed from outside; the longest run seen
        keys = np.arange(int(rng.integers(2, 30)))
        for _ in range(60):
            shown = rng.choice(keys, size=int(rng.integers(1, 20)))
            generate = skipper.choose(shown)
            for key, gen in zip(shown.tolist(), generate.tolist()):
                run[key] = 0 if gen else run.get(key, 0) + 1
                longest = max(longest, run[key])
                assert run[key] <= bound, (scenario, key)
            generated = shown[generate]
            right = rng.choice([0, 2, 4], p=[0.45, 0.1, 0.45], size=len(generated))
            skipper.record(generated, right=right, sizes=np.full(len(generated), 4), qualified=right == 2)
            skipper.end_step(len(generated), int(rng.integers(0, len(generated) + 1)))
        reached += longest == bound
    assert reached >= 30  # most scenarios do run into the bound


def test_explore_adapts_toward_the_target_keep_rate_within_its_bounds():
    skipper = skipper_with(target_keep_rate=0.5, explore_init=0.5, explore_min=0.3, explore_step=0.125)
    skipper.end_step(generated_groups=10, kept_groups=2)  # keep rate 0.2 < 0.5: skip more
    assert skipper.explore == 0.375
    skipper.end_step(10, 2)
    skipper.end_step(10, 2)
    assert skipper.explore == 0.3  # floor
    for _ in range(10):
        skipper.end_step(10, 5)  # at the target: skip less
    assert skipper.explore == 1.0  # ceiling: nothing is skipped
    skipper.end_step(0, 0)  # a step without rounds leaves it alone
    assert skipper.explore == 1.0


# ----------------------------------------------------------------------------- through the sampler (numpy)


class Loader:
    """A stateful dataloader stand-in: each epoch a fresh permutation, the position survives a restart."""

    def __init__(self, size, batch_size):
        self.size, self.batch_size, self.epoch, self.position = size, batch_size, 0, 0

    def open_epoch(self, epoch):
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0
        order = np.random.default_rng(epoch).permutation(self.size)
        while self.position < self.size:
            self.position += self.batch_size
            yield order[self.position - self.batch_size : self.position]


class World:
    """A numpy round source: prompt k's responses are right with a fixed probability; rows carry uid and key."""

    def __init__(self, pass_rates, responses=4, seed=0):
        self.pass_rates = np.asarray(pass_rates)
        self.responses = responses
        self.rng = np.random.default_rng(seed)
        self.uid = itertools.count()
        self.generated = []  # prompt keys generated, per round

    def stream(self, batch_size=5):
        self.loader = Loader(len(self.pass_rates), batch_size)
        return PromptStream(self.loader.open_epoch)

    def generate_round(self, prompts):
        self.generated.append(prompts.tolist())
        rows = np.zeros(len(prompts) * self.responses, dtype=ROW)
        rows["uid"] = np.repeat([next(self.uid) for _ in prompts], self.responses)
        rows["prompt_key"] = np.repeat(prompts, self.responses)
        acc = self.rng.random(len(rows)) < self.pass_rates[rows["prompt_key"]]
        return ScoredRound(rows, group_ids=rows["uid"], metric_values=acc, generated_tokens=len(rows))


def run_steps(sampler, world, stream, steps):
    return [collect_step(sampler, stream, world.generate_round, step) for step in steps]


def test_skipped_prompts_are_replaced_so_rounds_get_the_prompts_asked_for_and_budgets_count_only_generated():
    # Half the prompts always solved (never qualify), half at 0.5; budget 2 x 8 prompts per step.
    world = World([1.0, 0.5] * 20)
    config = make_config(train_batch_size=4, gen_batch_size=8, filter_groups={"max_num_gen_batches": 2},
                         skip={"explore_init": 0.05, "explore_min": 0.05}, round_sizing="whole")
    sampler, stream = DynamicSampler(config), world.stream()
    collected = run_steps(sampler, world, stream, range(1, 30))
    assert all(len(r) == 8 for r in world.generated)  # every whole round got gen_batch_size prompts
    for step in collected:
        assert step.metrics["dynamic_sampling/generated_groups"] <= 16  # skipped prompts cost no budget
    skipped = sum(c.metrics[S + "skipped_prompts"] for c in collected)
    assert skipped > 100
    solved_share = np.mean([k % 2 == 0 for r in world.generated[-20:] for k in r])
    assert solved_share < 0.25  # without skipping, half of every round would be solved prompts


def test_training_batches_keep_their_invariants_with_skipping_on():
    rng = np.random.default_rng(3)
    world = World(rng.choice([0.0, 1.0, 0.3, 0.6, 0.9], size=37), seed=1)
    config = make_config(train_batch_size=4, gen_batch_size=8, skip={"explore_init": 0.2, "explore_min": 0.05})
    sampler, stream = DynamicSampler(config), world.stream(batch_size=3)
    seen_uids = set()
    for step in run_steps(sampler, world, stream, range(1, 40)):
        rows = step.batch
        assert len(rows) == 4 * world.responses  # exactly train_batch_size whole groups
        uids = rows["uid"].reshape(4, world.responses)
        assert (uids == uids[:, :1]).all()  # groups contiguous
        assert not seen_uids & set(uids[:, 0].tolist())  # no group trained twice
        seen_uids |= set(uids[:, 0].tolist())
        assert step.metrics[S + "skipped_fraction"] <= 1.0
    totals = sampler.run_counters()
    assert totals["trained_groups"] <= totals["qualifying_groups"] <= totals["generated_groups"]


def test_a_resumed_sampler_decides_exactly_like_the_uninterrupted_one():
    def fresh():
        world = World(np.random.default_rng(5).choice([0.0, 1.0, 0.5], size=23), seed=2)
        config = make_config(train_batch_size=3, gen_batch_size=6, skip={"explore_init": 0.3})
        return world, DynamicSampler(config), world.stream(batch_size=4)

    world, sampler, stream = fresh()
    expected = run_steps(sampler, world, stream, range(1, 25))

    world, sampler, stream = fresh()
    run_steps(sampler, world, stream, range(1, 13))
    assert sampler.skipper.tracked_prompts > 0 and sampler.skipper.explore != 0.3
    buffer = io.BytesIO()
    torch.save({"sampler": sampler.state_dict(), "stream": stream.state_dict(), "rng": world.rng.bit_generator.state,
                "uid": next(world.uid), "loader": (world.loader.epoch, world.loader.position)}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=False)

    world, sampler, stream = fresh()  # a new process: the same config, then the saved state
    sampler.load_state_dict(state["sampler"])
    stream.load_state_dict(state["stream"])
    world.rng.bit_generator.state = state["rng"]
    world.uid = itertools.count(state["uid"])
    world.loader.epoch, world.loader.position = state["loader"]
    resumed = run_steps(sampler, world, stream, range(13, 25))
    for got, want in zip(resumed, expected[12:]):
        assert got.metrics == want.metrics
        assert got.batch.tolist() == want.batch.tolist()
    assert sum(m.metrics[S + "skipped_prompts"] for m in resumed) > 0  # the resumed steps did skip


def test_prompts_skipped_then_generated_are_counted_with_how_many_qualified():
    skipper = skipper_with(explore_init=0.05, explore_min=0.05, max_consecutive_skips=1, max_qualify_probability=0.5)
    skipper.begin_step()
    uniform_history(skipper, ["a"], groups=3, right=True)
    uniform_history(skipper, ["b"], groups=3, right=False)
    predicted = skipper.qualify_probability(["a", "b"])
    assert skipper.choose(["a", "b"]).tolist() == [False, False]  # 95% each; seed 0 skips both
    assert skipper.choose(["a", "b"]).tolist() == [True, True]  # the bound: skipped once, now generated
    skipper.record(["a", "b"], right=np.array([9, 0]), sizes=np.array([16, 16]), qualified=np.array([True, False]))
    metrics = skipper.end_step(generated_groups=4, kept_groups=1)
    assert metrics["skipped_prompts"] == 2 and metrics["skipped_easy_prompts"] == 1  # "a" was all right
    assert metrics["candidate_prompts"] == 4 and metrics["forced_prompts"] == 2
    assert (metrics["generated_after_skip"], metrics["qualified_after_skip"]) == (2, 1)
    assert metrics["considered_prompts"] == 4 and metrics["skipped_fraction"] == 0.5
    assert metrics["predicted_qualify_of_skipped"] == pytest.approx(predicted.mean())
    assert metrics["skip_probability"] == pytest.approx(0.95)
    assert skipper.step_skipped_keys == ["a", "b"]


def test_skip_metrics_are_reported_under_their_prefix_only_when_skipping_is_on():
    world = World([1.0, 0.5] * 10)
    on = DynamicSampler(make_config())
    off = DynamicSampler(make_config(skip={"enable": False}))
    assert off.skipper is None
    metrics_on = run_steps(on, world, world.stream(), [1])[0].metrics
    metrics_off = run_steps(off, world, world.stream(), [1])[0].metrics
    assert {S + "skipped_prompts", S + "skip_probability", S + "qualified_after_skip"} <= set(metrics_on)
    assert not [k for k in metrics_off if k.startswith(S)]


def test_a_group_holding_responses_of_two_prompts_is_refused():
    sampler = DynamicSampler(make_config())
    sampler.begin_step(1)
    rows = np.zeros(4, dtype=ROW)
    rows["uid"], rows["prompt_key"] = [1, 1, 2, 2], [10, 11, 12, 12]
    with pytest.raises(ValueError, match="group 1 holds responses of different prompts"):
        sampler.add_round(rows, group_ids=rows["uid"], metric_values=[1, 0, 1, 0])


def test_a_checkpoint_written_before_skipping_existed_still_loads():
    plain = DynamicSampler(make_config(skip={"enable": False}))
    state = plain.state_dict()
    state["version"] = 1
    state.pop("skipper")
    DynamicSampler(make_config()).load_state_dict(state)  # skipping starts afresh (warned)
    with pytest.raises(ValueError, match="version 99"):
        DynamicSampler(make_config()).load_state_dict({**state, "version": 99})


# ----------------------------------------------------------------------------- prompt keys (verl DataProto)


def prompts_proto(indices, source="math", extra=None):
    extra_info = np.array([{"index": i, "split": "train"} for i in indices] if extra is None else extra, dtype=object)
    return DataProto.from_dict(
        tensors={"prompt": torch.as_tensor(np.arange(len(extra_info)))},
        non_tensors={"extra_info": extra_info, "data_source": np.array([source] * len(extra_info), dtype=object),
                     "index": np.zeros(len(extra_info), dtype=object)},  # verl's own column: 0 when absent
    )


def test_dataproto_prompt_keys_are_the_data_source_and_extra_info_index():
    keys = dataproto_prompt_keys(prompts_proto([4, 0, 4]))
    assert keys.tolist() == ["math#4", "math#0", "math#4"]  # copies of one problem share their key
    assert dataproto_prompt_keys(prompts_proto([4], source="aime24")).tolist() == ["aime24#4"]


def test_rows_without_extra_info_index_are_refused_not_given_verls_index_zero():
    batch = prompts_proto(None, extra=[{"index": 1}, {}, {"split": "train"}])
    with pytest.raises(PromptKeyError, match=r"2 of 3 rows have no extra_info.index \(rows \[1, 2\]\).*skip.enable=false"):
        dataproto_prompt_keys(batch)
    with pytest.raises(PromptKeyError, match="the batch has no extra_info field"):
        dataproto_prompt_keys(DataProto.from_dict(tensors={"prompt": torch.zeros(2)}))


class DataProtoRun:
    """The trainer's shapes: DataProto prompts with extra_info from a stream, rollouts repeated n times."""

    N = 4

    def __init__(self, pass_rates):
        self.pass_rates = np.asarray(pass_rates)
        size = len(pass_rates)
        self.stream = PromptStream(
            lambda epoch: (prompts_proto(range(i, min(i + 3, size))) for i in range(0, size, 3)), DATAPROTO_OPS
        )
        self.sampler = DynamicSampler(make_config(train_batch_size=2, gen_batch_size=4), DATAPROTO_OPS)
        self.serial = itertools.count()

    def generate_round(self, prompts):
        rollouts = prompts.repeat(repeat_times=self.N, interleave=True)
        uids = np.repeat([f"u{next(self.serial)}" for _ in range(len(prompts))], self.N)
        rollouts.non_tensor_batch["uid"] = np.array(uids, dtype=object)
        index = np.array([e["index"] for e in rollouts.non_tensor_batch["extra_info"]])
        # a solved prompt (rate 1) answers right every time; any other right twice then wrong: it always qualifies
        acc = (self.pass_rates[index] == 1.0) | (np.arange(len(index)) % self.N < 2)
        return ScoredRound(rollouts, uids, acc)


def test_dataproto_rounds_record_outcomes_under_the_prompts_keys_and_skip_them():
    run = DataProtoRun([1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 0.5])
    skipped = []
    for step in range(1, 12):
        collected = collect_step(run.sampler, run.stream, run.generate_round, step)
        assert len(collected.batch) == 2 * run.N
        assert "prompt" in collected.batch.batch.keys()  # the payload travels whole
        skipped += run.sampler.skipper.step_skipped_keys
    assert run.sampler.skipper.tracked_prompts == 7
    assert len(skipped) > 5 and set(skipped) == {"math#0", "math#2", "math#4"}  # the solved prompts, only them


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "skip, filter_groups, message",
    [
        ({"target_keep_rate": 0}, {}, r"skip.target_keep_rate must lie in \(0.0, 1.0\]"),
        ({"explore_min": 1.5}, {}, r"skip.explore_min must lie in \(0.0, 1.0\]"),
        ({"explore_init": 0.01, "explore_min": 0.1}, {}, r"explore_init=0.01 is below explore_min=0.1"),
        ({"max_consecutive_skips": 0}, {}, r"skip.max_consecutive_skips must be >= 1"),
        ({"seed": "x"}, {}, r"skip.seed must be an integer or null"),
        ({"max_skips": 2}, {}, r"unknown setting dapo.dynamic_sampling.skip.max_skips; did you mean max_consecutive_skips"),
        ({}, {"enable": False}, r"skip.enable=true needs algorithm.filter_groups.enable=true"),
    ],
)
def test_bad_skip_settings_are_refused_naming_the_key(skip, filter_groups, message):
    with pytest.raises(DynamicSamplingConfigError, match=message):
        make_config(skip=skip, filter_groups=filter_groups)


def test_the_skip_seed_defaults_to_the_data_seed():
    assert make_config().skip_seed == 7
    assert make_config(skip={"seed": 3}).skip_seed == 3
    assert SimpleNamespace(**vars(SkipSettings())).enable is False  # off by default
