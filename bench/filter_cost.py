"""Cost of the group filter at the paper's scale: 1,536 prompts x 16 responses = 24,576 trajectories.

Rows, each timed on the same round (verl-style uuid4 string uids, ``acc`` from Beta(.5,.5) pass rates):

- recipe group_statistics + kept rows:  this package's filter (np.unique / bincount / reduceat)
- recipe DynamicSampler.add_round:      the same plus pooling, with a numpy payload
- recipe, rows shuffled:                groups not contiguous (the general np.unique path)
- python per-trajectory (dict + set):   a straightforward loop: values per uid, np.std per group, set lookup
- reference (list membership):          the verl-recipe DAPO filter as written (``uid in list``: quadratic)

All four must keep exactly the same rows; the benchmark checks that before timing.

Run: python bench/filter_cost.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections import defaultdict
from typing import Callable

import numpy as np

from recipe_dapo.dynamic_sampling import DynamicSampler, DynamicSamplingConfig, group_statistics

PROMPTS = 1536
RESPONSES = 16


def make_round(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    uids = np.array([str(uuid.UUID(int=int(rng.integers(2**63)))) for _ in range(PROMPTS)], dtype=object)
    pass_rate = rng.beta(0.5, 0.5, size=PROMPTS)
    acc = rng.random((PROMPTS, RESPONSES)) < pass_rate[:, None]
    return np.repeat(uids, RESPONSES), acc.reshape(-1)


def recipe_filter(uids: np.ndarray, acc: np.ndarray) -> np.ndarray:
    stats = group_statistics(uids, acc)
    rows, _ = stats.rows_of(stats.keep)
    return rows


def python_set_filter(uids: np.ndarray, acc: np.ndarray) -> np.ndarray:
    values_by_uid = defaultdict(list)
    for uid, value in zip(uids, acc):
        values_by_uid[uid].append(float(value))
    kept = {uid for uid, values in values_by_uid.items() if np.std(values) > 0 or len(values) == 1}
    return np.array([row for row, uid in enumerate(uids) if uid in kept])


def reference_list_filter(uids: np.ndarray, acc: np.ndarray) -> np.ndarray:
    values_by_uid = defaultdict(list)
    for uid, value in zip(uids, acc):
        values_by_uid[uid].append(float(value))
    std_by_uid = {uid: np.std(values) for uid, values in values_by_uid.items()}
    kept = [uid for uid, std in std_by_uid.items() if std > 0 or len(values_by_uid[uid]) == 1]
    return np.array([row for row, uid in enumerate(uids) if uid in kept])


def sampler_add_round(uids: np.ndarray, acc: np.ndarray) -> None:
    config = DynamicSamplingConfig.from_config(
        {"enable": True, "metric": "acc"}, {}, train_batch_size=512, gen_batch_size=PROMPTS
    )
    sampler = DynamicSampler(config)
    sampler.begin_step(1)
    sampler.add_round(np.arange(uids.shape[0]), group_ids=uids, metric_values=acc)


def time_ms(function: Callable, uids: np.ndarray, acc: np.ndarray, repeats: int) -> float:
    function(uids, acc)  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function(uids, acc)
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per row (reference: 3)")
    args = parser.parse_args()

    uids, acc = make_round(seed=0)
    expected = recipe_filter(uids, acc)
    for check in (python_set_filter, reference_list_filter):
        if not np.array_equal(check(uids, acc), expected):
            raise SystemExit(f"{check.__name__} keeps different rows than the recipe filter")

    shuffle = np.random.default_rng(1).permutation(uids.shape[0])
    shuffled_rows = np.sort(recipe_filter(uids[shuffle], acc[shuffle]))
    if not np.array_equal(np.sort(shuffle[shuffled_rows]), expected):
        raise SystemExit("the recipe filter keeps different trajectories when the rows are shuffled")

    rows = [
        ("recipe group_statistics + kept rows", recipe_filter, args.repeats),
        ("recipe, rows shuffled", lambda u, a: recipe_filter(u[shuffle], a[shuffle]), args.repeats),
        ("recipe DynamicSampler.add_round", lambda u, a: sampler_add_round(u, a), args.repeats),
        ("python per-trajectory (dict + set)", python_set_filter, max(args.repeats // 4, 3)),
        ("reference (list membership)", reference_list_filter, 3),
    ]
    print(f"{PROMPTS} prompts x {RESPONSES} = {uids.shape[0]} trajectories, {expected.shape[0]} kept; "
          "median ms per call")
    print(f"{'filter':<38} {'ms/call':>9} {'x recipe':>9}")
    timings = {}
    for name, function, repeats in rows:
        timings[name] = time_ms(function, uids, acc, repeats)
    recipe_ms = timings[rows[0][0]]
    for name, _, _ in rows:
        print(f"{name:<38} {timings[name]:9.2f} {timings[name] / recipe_ms:9.1f}")
    print(f"RESULT filter_ms={recipe_ms:.2f} baseline_ms={timings[rows[3][0]]:.2f}")


if __name__ == "__main__":
    main()
