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

Run: python bench/dynamic_sampling_sim.py [--steps 60]
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass

import numpy as np

from recipe_dapo.dynamic_sampling import DynamicSampler, DynamicSamplingConfig, PromptStream, ScoredRound, collect_step

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
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
    print(f"worst case of '{DEFAULT_SCHEME}' over the distributions; {time.perf_counter() - started:.1f} s")
    print(f"RESULT gen_per_trained_over_ideal={worst_ratio:.3f} utilization={worst_util:.3f}")


if __name__ == "__main__":
    main()
