"""Dynamic sampling without a model: how much generation each scheme spends per trained group.

Each prompt gets a pass rate q from a beta distribution; its n=16 responses are correct with probability
q (the ``acc`` metric). A group qualifies when its responses are neither all correct nor all wrong, so the
true keep rate is 1 - E[q^16] - E[(1-q)^16] and the ideal is 1/keep_rate generated groups per trained
group (every qualifying group trained on). Every scheme runs through the recipe's ``DynamicSampler``:

- paper:          whole rounds of gen_batch_size = 3 x 512 prompts, surplus discarded (max_staleness=0)
- whole+carry:    the same rounds, surplus carried one step
- deficit m=...:  rounds sized to the missing groups with safety margin m (the recipe's default is 0.1),
                  top-up rounds of at least 128 prompts (min_round_prompts auto = train_batch_size / 4)
- no carry:       the default sizing with the surplus discarded (max_staleness=0)

Columns: ideal = generated/qualifying; gen/trained; ratio = (gen/trained)/ideal; util = trained/qualifying
(run-end leftovers count as unused); rounds/step (mean, max); prompts per round; stale% = trained groups
generated in an earlier step; dropped = qualifying groups discarded.

The second table asks whether pre-rollout skipping (``dapo.dynamic_sampling.skip``) generates less
than filtering after the fact. Prompts are a fixed data set whose difficulty persists and drifts: prompt i's pass
rate is sigmoid(skill(t) - d_i + w_i(t)), d_i ~ N(0, 3^2) fixed, w_i a random walk (sd 1 over the run), and the
policy's skill(t) moves linearly (hard->easy: from -2, where 35% of groups are all wrong, to 3.5, where about half
are all right as in the DAPO paper's Fig. 3b). Response lengths are long-tailed (lognormal, longer for harder prompts
and wrong answers, cut at 20,480 tokens). The runs span about 400 epochs, as a DAPO run does, so a prompt changes
between two visits about as much as in a real run; "4x faster" puts the same change into 100 epochs. In each world,
four arms see the same prompts and drift:

- blocking:           the recipe's sampler, rounds as verl's classic trainer runs them (no skipping)
- blocking + skip:    the same with skipping on (the recipe's skip defaults)
- streaming (+ skip): a source that ends a round once the missing groups have qualified, aborting the rest

Latency model, in decode steps (one token per step for every sequence in flight): a blocking round lasts as long
as its longest response; a streaming round until the group that completes the batch finishes. The last line reports
the hard->easy world with blocking rounds (skipping on against off, side by side), the late world, and the first
table's worst case of the default sampler.

Run: python bench/dynamic_sampling_sim.py [--steps 60] [--skip-steps 1600]   (about a minute on one core)
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass

import numpy as np

from recipe_dapo.dynamic_sampling import (
    SKIP_METRIC_PREFIX,
    DynamicSampler,
    DynamicSamplingConfig,
    PromptStream,
    ScoredRound,
    collect_step,
)

TRAIN_PROMPTS = 512
GEN_PROMPTS = 3 * TRAIN_PROMPTS  # the paper's gen_batch_size
RESPONSES = 16
MAX_NUM_GEN_BATCHES = 10  # the paper's setting; a budget of 10 x 1536 prompts per step

# name -> (a, b) of Beta(a, b) at the first and last step (equal: a fixed distribution)
DISTRIBUTIONS = {
    "uniform B(1,1)": ((1.0, 1.0), (1.0, 1.0)),
    "u-shaped B(.5,.5)": ((0.5, 0.5), (0.5, 0.5)),
    "hard B(.5,2)": ((0.5, 2.0), (0.5, 2.0)),
    "easy B(2,.5)": ((2.0, 0.5), (2.0, 0.5)),
    "very hard B(.2,1)": ((0.2, 1.0), (0.2, 1.0)),
    "drift hard->easy": ((0.3, 1.5), (1.5, 0.3)),
}

SCHEMES = {
    "paper": dict(round_sizing="whole", max_staleness=0),
    "whole+carry": dict(round_sizing="whole", max_staleness=1),
    "deficit m=0": dict(safety_margin=0.0),
    "deficit m=0.05": dict(safety_margin=0.05),
    "deficit m=0.1 (default)": dict(),
    "deficit m=0.25": dict(safety_margin=0.25),
    "deficit m=0.1 no carry": dict(max_staleness=0),
}
DEFAULT_SCHEME = "deficit m=0.1 (default)"


@dataclass
class RunSummary:
    ideal: float
    gen_per_trained: float
    utilization: float
    rounds_per_step: float
    max_rounds: int
    prompts_per_round: float
    stale_fraction: float
    dropped: int

    @property
    def ratio(self) -> float:
        return self.gen_per_trained / self.ideal


def simulate(distribution: tuple, scheme: dict, steps: int, seed: int) -> RunSummary:
    rng = np.random.default_rng(seed)
    config = DynamicSamplingConfig.from_config(
        {"enable": True, "metric": "acc", "max_num_gen_batches": MAX_NUM_GEN_BATCHES},
        scheme,
        train_batch_size=TRAIN_PROMPTS,
        gen_batch_size=GEN_PROMPTS,
    )
    sampler = DynamicSampler(config)
    # Prompts are serial numbers; a prompt instance's responses share its number as their group id.
    stream = PromptStream(lambda epoch: (np.arange(i, i + GEN_PROMPTS) for i in itertools.count(0, GEN_PROMPTS)))
    (a0, b0), (a1, b1) = distribution
    rounds, carried, dropped, trained = [], 0, 0, 0
    for step in range(1, steps + 1):
        progress = (step - 1) / max(steps - 1, 1)
        a, b = a0 + (a1 - a0) * progress, b0 + (b1 - b0) * progress

        def generate_round(prompts: np.ndarray) -> ScoredRound:
            pass_rate = rng.beta(a, b, size=len(prompts))
            correct = rng.random((len(prompts), RESPONSES)) < pass_rate[:, None]
            uids = np.repeat(prompts, RESPONSES)
            return ScoredRound(uids, group_ids=uids, metric_values=correct.reshape(-1))

        collected = collect_step(sampler, stream, generate_round, step)
        batch, metrics = collected.batch, collected.metrics
        rounds.append(int(metrics["dynamic_sampling/num_gen_rounds"]))
        carried += int(metrics["dynamic_sampling/carried_in_groups"])
        dropped += int(metrics["dynamic_sampling/dropped_stale_groups"])
        trained += len(batch) // RESPONSES
    totals = sampler.run_counters()
    # Groups still pooled at the end were never trained: count them as discarded for this comparison.
    dropped += sampler.pooled_groups
    return RunSummary(
        ideal=totals["generated_groups"] / totals["qualifying_groups"],
        gen_per_trained=totals["generated_groups"] / trained,
        utilization=trained / totals["qualifying_groups"],
        rounds_per_step=float(np.mean(rounds)),
        max_rounds=max(rounds),
        prompts_per_round=totals["generated_groups"] / max(totals["rounds"], 1),
        stale_fraction=carried / trained,
        dropped=dropped,
    )


# ----------------------------------------------------------------------------- prompt skipping


@dataclass(frozen=True)
class WorldSpec:
    """A policy's skill (a logit) at the first and the last step; a prompt's pass rate is
    sigmoid(skill - difficulty + drift), its difficulty fixed per prompt, its drift a per-prompt random walk.
    ``steps_factor`` scales the run's length (fewer steps: the same change of skill in fewer epochs)."""

    skill_start: float
    skill_end: float
    steps_factor: float = 1.0


WORLDS = {
    "early: mostly hard": WorldSpec(-2.0, -2.0),
    "learning: hard->easy": WorldSpec(-2.0, 3.5),
    "same, 4x faster": WorldSpec(-2.0, 3.5, steps_factor=0.25),
    "late: half solved": WorldSpec(3.5, 3.5),
}
HEADLINE_WORLD = "learning: hard->easy"
LATE_WORLD = "late: half solved"
# The skipping runs use smaller batches than the paper's so that a run spans as many epochs as a DAPO run: about 400
# (17,917 prompts, ~1,500 generated per step, ~5,000 steps), so that a prompt's pass rate changes between two of its
# visits about as much as in a real run. One epoch is about 4 steps here.
SKIP_TRAIN_PROMPTS = 128
SKIP_GEN_PROMPTS = 3 * SKIP_TRAIN_PROMPTS
DATASET_PROMPTS = 1024
SKIP_STEPS = 1600
DIFFICULTY_SD = 3.0  # spread of prompt difficulties, in logits: at skill 3.5 about half the groups are all right
DRIFT_SD = 1.0  # per prompt, over the whole run (a random walk): pass rates also move apart from the overall skill
LENGTH_MEDIAN = 1200  # tokens, of a right answer to a prompt of even odds (pass rate 1/2)
LENGTH_SIGMA = 0.6  # lognormal spread of response lengths: a long tail up to MAX_LENGTH
LENGTH_PER_LOGIT = 0.25  # harder prompts get longer answers: x exp(0.25) per logit of difficulty above skill
WRONG_LENGTH_FACTOR = 1.4  # wrong answers run longer than right ones
MAX_LENGTH = 20480  # the paper's response budget: longer answers are truncated here
SKIP_SETTINGS: dict = {"enable": True}  # the recipe's skip defaults, switched on
ARMS = {  # name -> (skip settings or None, streaming source)
    "blocking": (None, False),
    "blocking + skip": (SKIP_SETTINGS, False),
    "streaming": (None, True),
    "streaming + skip": (SKIP_SETTINGS, True),
}


class PromptWorld:
    """Prompts with a persistent difficulty that drift as the policy learns, and long-tailed response lengths.

    The world (difficulties, drift) depends only on the seed, so arms built with one seed see the same prompts
    change in the same way whatever they generate; each arm draws its responses from its own generator.
    """

    def __init__(self, spec: WorldSpec, steps: int, seed: int):
        self.spec, self.steps = spec, steps
        world_rng = np.random.default_rng([seed, 1])
        self.difficulty = world_rng.normal(0.0, DIFFICULTY_SD, DATASET_PROMPTS)
        self._drift_rng = np.random.default_rng([seed, 2])
        self._responses_rng = np.random.default_rng([seed, 3])
        self.offset = np.zeros(DATASET_PROMPTS)
        self.skill = spec.skill_start

    def at_step(self, step: int) -> None:
        progress = (step - 1) / max(self.steps - 1, 1)
        self.skill = self.spec.skill_start + (self.spec.skill_end - self.spec.skill_start) * progress
        if step > 1:
            self.offset += self._drift_rng.normal(0.0, DRIFT_SD / np.sqrt(self.steps - 1), DATASET_PROMPTS)

    def logit(self, prompts: np.ndarray) -> np.ndarray:
        return self.skill - self.difficulty[prompts] + self.offset[prompts]

    def pass_rate(self, prompts: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit(prompts)))

    def qualify_probability(self, prompts: np.ndarray) -> np.ndarray:
        """Probability that a group of RESPONSES to each prompt would have mixed results (the spread rule)."""
        q = self.pass_rate(np.asarray(prompts, dtype=np.int64))
        return 1.0 - q**RESPONSES - (1.0 - q) ** RESPONSES

    def respond(self, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(correct [k, n] bool, response lengths [k, n] tokens) for prompts [k]."""
        rng = self._responses_rng
        correct = rng.random((len(prompts), RESPONSES)) < self.pass_rate(prompts)[:, None]
        median = LENGTH_MEDIAN * np.exp(-LENGTH_PER_LOGIT * np.clip(self.logit(prompts), -4, 4))[:, None]
        median = median * np.where(correct, 1.0, WRONG_LENGTH_FACTOR)
        lengths = np.exp(np.log(median) + LENGTH_SIGMA * rng.standard_normal(correct.shape))
        return correct, np.minimum(np.ceil(lengths), MAX_LENGTH).astype(np.int64)


ROW = np.dtype([("uid", np.int64), ("prompt_key", np.int64)])


class BlockingSource:
    """A round as verl's classic trainer runs it: every response of the round is awaited, so the round takes as
    long as its longest response (time in decode steps: one token per step for every sequence in flight)."""

    def __init__(self, world: PromptWorld):
        self.world = world
        self.uids = itertools.count()
        self.time = 0.0
        self.tokens = 0

    def __call__(self, prompts: np.ndarray) -> ScoredRound:
        correct, lengths = self.world.respond(prompts)
        self.time += lengths.max()
        self.tokens += int(lengths.sum())
        return self.scored(prompts, correct, lengths.sum())

    def scored(self, prompts: np.ndarray, correct: np.ndarray, tokens) -> ScoredRound:
        rows = np.zeros(correct.size, dtype=ROW)
        rows["uid"] = np.repeat([next(self.uids) for _ in range(len(prompts))], RESPONSES)
        rows["prompt_key"] = np.repeat(prompts, RESPONSES)
        return ScoredRound(rows, group_ids=rows["uid"], metric_values=correct.reshape(-1), generated_tokens=int(tokens))


class StreamingSource(BlockingSource):
    """A source that judges each group as soon as its last response ends and aborts the rest of the round once the
    groups still missing from the batch have qualified: the round ends at that moment (or at its longest response,
    if too few qualify); the aborted groups are not returned, their tokens so far are counted as generated."""

    def __init__(self, world: PromptWorld, sampler: DynamicSampler):
        super().__init__(world)
        self.sampler = sampler

    def __call__(self, prompts: np.ndarray) -> ScoredRound:
        correct, lengths = self.world.respond(prompts)
        missing = self.sampler.config.train_batch_size - self.sampler.pooled_groups
        finish = lengths.max(axis=1)
        order = np.argsort(finish, kind="stable")
        right = correct[order].sum(axis=1)
        qualified = np.cumsum((right > 0) & (right < RESPONSES))  # the spread rule on acc
        enough = np.flatnonzero(qualified >= missing)
        end = finish[order[enough[0]]] if enough.size else finish.max()
        done = finish <= end
        tokens = int(np.minimum(lengths, end).sum())
        self.time += end
        self.tokens += tokens
        return self.scored(prompts[done], correct[done], tokens)


@dataclass
class SkipRun:
    generated_groups: int
    qualifying_groups: int
    trained_groups: int
    tokens: int
    time_per_step: float
    considered_prompts: int
    skipped_prompts: int
    skipped_would_qualify: float  # expected qualifying groups among the skipped prompts
    generated_after_skip: int
    qualified_after_skip: int

    @property
    def keep_rate(self) -> float:
        return self.qualifying_groups / self.generated_groups

    @property
    def gen_per_trained(self) -> float:
        return self.generated_groups / self.trained_groups

    @property
    def tokens_per_trained(self) -> float:
        return self.tokens / self.trained_groups

    @property
    def would_qualify_share(self) -> float:
        return self.skipped_would_qualify / self.skipped_prompts if self.skipped_prompts else 0.0


def simulate_skipping(spec: WorldSpec, skip: dict | None, streaming: bool, steps: int, seed: int) -> SkipRun:
    steps = max(int(steps * spec.steps_factor), 2)
    world = PromptWorld(spec, steps, seed)
    config = DynamicSamplingConfig.from_config(
        {"enable": True, "metric": "acc", "max_num_gen_batches": MAX_NUM_GEN_BATCHES},
        {"skip": skip} if skip else {},
        train_batch_size=SKIP_TRAIN_PROMPTS,
        gen_batch_size=SKIP_GEN_PROMPTS,
        seed=seed,
    )
    sampler = DynamicSampler(config)

    def open_epoch(epoch: int):
        order = np.random.default_rng([seed, 4, epoch]).permutation(DATASET_PROMPTS)
        return (order[i : i + SKIP_GEN_PROMPTS] for i in range(0, DATASET_PROMPTS, SKIP_GEN_PROMPTS))

    stream = PromptStream(open_epoch)
    source = StreamingSource(world, sampler) if streaming else BlockingSource(world)
    trained, would_qualify = 0, 0.0
    for step in range(1, steps + 1):
        world.at_step(step)
        collected = collect_step(sampler, stream, source, step)
        trained += 0 if collected.batch is None else len(collected.batch) // RESPONSES
        if sampler.skipper is not None:
            would_qualify += float(world.qualify_probability(sampler.skipper.step_skipped_keys).sum())
    totals = sampler.run_counters()
    metrics = collected.metrics
    skip_total = lambda key: int(metrics.get(SKIP_METRIC_PREFIX + key, 0))  # noqa: E731
    considered = stream.prompts_taken
    return SkipRun(
        generated_groups=totals["generated_groups"],
        qualifying_groups=totals["qualifying_groups"],
        trained_groups=trained,
        tokens=source.tokens,
        time_per_step=source.time / steps,
        considered_prompts=considered,
        skipped_prompts=skip_total("total_skipped_prompts"),
        skipped_would_qualify=would_qualify,
        generated_after_skip=skip_total("total_generated_after_skip"),
        qualified_after_skip=skip_total("total_qualified_after_skip"),
    )


def skipping_study(steps: int, seed: int) -> dict[str, dict[str, SkipRun]]:
    """Every arm in every world, side by side (the same prompts and drift within a world)."""
    return {
        name: {arm: simulate_skipping(spec, skip, streaming, steps, seed) for arm, (skip, streaming) in ARMS.items()}
        for name, spec in WORLDS.items()
    }


def print_skipping_study(study: dict[str, dict[str, SkipRun]], steps: int) -> None:
    print(
        f"Prompt skipping: {DATASET_PROMPTS} prompts with persistent difficulties, {steps} steps, "
        f"{SKIP_TRAIN_PROMPTS} train / {SKIP_GEN_PROMPTS} gen prompts, n={RESPONSES}, skip settings {SKIP_SETTINGS} "
        "(the rest the recipe's defaults)"
    )
    header = (
        f"{'world':<21} {'arm':<17} {'keep':>5} {'1/keep':>6} {'gen/trn':>7} {'vs ideal':>8} {'skip%':>6} "
        f"{'would-q':>7} {'later-q':>7} {'ktok/trn':>8} {'time/step':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, arms in study.items():
        ideal = 1.0 / arms["blocking"].keep_rate
        for arm, run in arms.items():
            later = run.qualified_after_skip / run.generated_after_skip if run.generated_after_skip else float("nan")
            print(
                f"{name:<21} {arm:<17} {run.keep_rate:5.3f} {1 / run.keep_rate:6.3f} {run.gen_per_trained:7.3f} "
                f"{run.gen_per_trained / ideal:8.3f} {100 * run.skipped_prompts / run.considered_prompts:6.1f} "
                f"{run.would_qualify_share:7.3f} {later:7.3f} {run.tokens_per_trained / 1e3:8.2f} "
                f"{run.time_per_step / 1e3:9.1f}"
            )
        print()
    print(
        "keep = qualifying / generated groups; vs ideal = gen/trn over 1/keep of the blocking arm without skipping "
        "(filtering after the fact); skip% = prompts skipped of those taken; would-q = expected share of the skipped "
        "prompts whose group would have qualified; later-q = share of skipped prompts that qualified when next "
        "generated; ktok/trn = thousand generated tokens per trained group; time/step = thousand decode steps per "
        "training step (blocking: each round lasts its longest response; streaming: until the missing groups "
        "qualified)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--skip-steps", type=int, default=SKIP_STEPS, help="training steps per prompt-skipping run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.perf_counter()
    header = (
        f"{'distribution':<19} {'scheme':<24} {'ideal':>6} {'gen/trn':>7} {'ratio':>6} {'util':>6} "
        f"{'rnd/step':>8} {'max':>4} {'prm/rnd':>7} {'stale%':>6} {'dropped':>8}"
    )
    print(f"{TRAIN_PROMPTS} train prompts, n={RESPONSES}, gen_batch_size={GEN_PROMPTS}, "
          f"max_num_gen_batches={MAX_NUM_GEN_BATCHES}, {args.steps} steps per run")
    print(header)
    print("-" * len(header))
    worst_ratio, worst_util = 0.0, 1.0
    for index, (name, distribution) in enumerate(DISTRIBUTIONS.items()):
        for scheme_name, scheme in SCHEMES.items():
            run = simulate(distribution, scheme, args.steps, seed=args.seed * 1000 + index)
            print(
                f"{name:<19} {scheme_name:<24} {run.ideal:6.3f} {run.gen_per_trained:7.3f} {run.ratio:6.3f} "
                f"{run.utilization:6.3f} {run.rounds_per_step:8.2f} {run.max_rounds:4d} "
                f"{run.prompts_per_round:7.0f} {100 * run.stale_fraction:6.1f} {run.dropped:8d}"
            )
            if scheme_name == DEFAULT_SCHEME:
                worst_ratio = max(worst_ratio, run.ratio)
                worst_util = min(worst_util, run.utilization)
        print()
    print(f"worst case of '{DEFAULT_SCHEME}' over the distributions: gen_per_trained_over_ideal={worst_ratio:.3f} "
          f"utilization={worst_util:.3f}")
    print()

    study = skipping_study(args.skip_steps, args.seed)
    print_skipping_study(study, args.skip_steps)
    headline, late = study[HEADLINE_WORLD], study[LATE_WORLD]
    print(f"{time.perf_counter() - started:.1f} s")
    print(
        f"RESULT gen_per_trained_over_ideal={skip_ratio(headline):.3f} "
        f"skip_saving={1 - headline['blocking + skip'].gen_per_trained / headline['blocking'].gen_per_trained:.3f} "
        f"skipped_would_qualify={headline['blocking + skip'].would_qualify_share:.3f} "
        f"token_saving={1 - headline['blocking + skip'].tokens_per_trained / headline['blocking'].tokens_per_trained:.3f} "
        f"late_gen_per_trained_over_ideal={skip_ratio(late):.3f} "
        f"late_skipped_would_qualify={late['blocking + skip'].would_qualify_share:.3f} "
        f"sampler_gen_per_trained_over_ideal={worst_ratio:.3f} utilization={worst_util:.3f}"
    )


def skip_ratio(arms: dict[str, SkipRun]) -> float:
    """Generated per trained group with skipping, over 1 / keep rate of filtering after the fact (no skipping)."""
    return arms["blocking + skip"].gen_per_trained * arms["blocking"].keep_rate


if __name__ == "__main__":
    main()
