"""Verifier agreement on public suites: recipe_dapo's verifier vs verl's ``math_dapo`` vs math-verify.

The suites are data files in ``bench/verifier_suites/`` (built from outside material by
``bench/verifier_suites/build_suites.py``; each case names its source); nothing is fetched at run time.
Each case is a response in the DAPO format, a ground truth and a label (is the response's answer right?).

For every suite it prints the share of cases each verifier gets right (agrees with the label):

- ``ours``: ``recipe_dapo.reward.compute_score`` with default settings (symbolic step on when math-verify
  is installed), and ``ours-nosym`` with ``symbolic_check=False`` (an install without math-verify);
- ``verl``: ``verl.utils.reward_score.math_dapo.compute_score`` (Answer line, string match);
- ``math-verify``: ``math_verify.verify(parse(gold), parse(response))`` with its default extraction.

then our false positives (label wrong, scored right: the worst error in RL), the cases ours gets wrong, and
the slowest call of ours -- once sequentially and once from 4 threads at a time with a cold cache, as
verl's reward loop calls it. Last line::

    RESULT ours_macro=... mathverify_macro=... verl_macro=... false_positives=... slowest_s=... timeout_s=...

Run: ``python bench/verifier_agreement.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from recipe_dapo.reward import symbolic, verifier
from recipe_dapo.reward.verifier import DEFAULT_TIMEOUT_S, compute_score

SUITES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verifier_suites")


def load_suites() -> dict[str, list[dict]]:
    suites: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(SUITES, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                case = json.loads(line)
                suites.setdefault(case["suite"], []).append(case)
    return suites


def verl_accepts(response: str, ground_truth: str) -> bool:
    from verl.utils.reward_score import math_dapo

    try:
        return bool(math_dapo.compute_score(response, ground_truth)["acc"])
    except Exception:  # noqa: BLE001 - an exception is a wrong score for the benchmark
        return False


def mathverify_accepts(response: str, ground_truth: str) -> bool | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    gold = ground_truth if "$" in ground_truth or "\\boxed" in ground_truth else f"${ground_truth}$"
    try:
        return bool(verify(parse(gold), parse(response)))
    except Exception:  # noqa: BLE001
        return False


def ours_timed(case: dict, **kwargs) -> tuple[bool, float, str]:
    start = time.perf_counter()
    result = compute_score("bench", case["response"], case["ground_truth"], **kwargs)
    return bool(result["acc"]), time.perf_counter() - start, result["verify_error"]


def snippet(text: str, width: int = 60) -> str:
    return ascii(text.replace("\n", " ")[-width:])[1:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4, help="threads of the concurrent pass")
    parser.add_argument("--show", type=int, default=8, help="cases ours gets wrong to print per suite")
    args = parser.parse_args()
    suites = load_suites()
    installed = symbolic.math_verify_installed()
    print(f"math-verify installed: {installed}; per-call limit {DEFAULT_TIMEOUT_S:g} s; {os.cpu_count()} CPUs")
    if installed:  # what the reward manager does at start-up: have math-verify imported before scoring
        compute_score("bench", "Answer: \\sqrt{2}\\pi", "\\pi\\sqrt{2}", timeout_s=60)
    verifier.clear_symbolic_cache()

    rows, wrong, slowest, errors = [], defaultdict(list), (0.0, ""), 0
    false_positives = []
    for name, cases in suites.items():
        counts = defaultdict(int)
        for case in cases:
            label = case["label"]
            ours, seconds, error = ours_timed(case)
            errors += bool(error)
            if seconds > slowest[0]:
                slowest = (seconds, f"{name}: {snippet(case['response'], 40)}")
            nosym = compute_score("bench", case["response"], case["ground_truth"], symbolic_check=False)["acc"]
            theirs = mathverify_accepts(case["response"], case["ground_truth"])
            counts["n"] += 1
            counts["ours"] += ours == label
            counts["nosym"] += nosym == label
            counts["verl"] += verl_accepts(case["response"], case["ground_truth"]) == label
            counts["mv"] += theirs == label
            if ours != label:
                wrong[name].append((case, ours, theirs, error))
            if ours and not label:
                false_positives.append(case)
        rows.append((name, counts))

    # The same cases from several threads at once, cold cache: time-outs and queueing show up here.
    verifier.clear_symbolic_cache()
    everything = [case for cases in suites.values() for case in cases]
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        concurrent = list(pool.map(ours_timed, everything))
    concurrent_slowest = max(seconds for _, seconds, _ in concurrent)
    concurrent_changed = sum(acc != first for (acc, _, _), first in zip(concurrent, [None] * 0)) if False else sum(
        1 for (acc, _, _), case in zip(concurrent, everything) if acc != case["label"]
    )

    print(f"\n{'suite':<28}{'n':>6}{'ours':>9}{'ours-nosym':>12}{'verl':>9}{'math-verify':>13}")
    for name, c in rows:
        n = c["n"]
        print(f"{name:<28}{n:>6}{c['ours'] / n:>9.1%}{c['nosym'] / n:>12.1%}{c['verl'] / n:>9.1%}"
              f"{c['mv'] / n:>13.1%}")
    for name, cases in wrong.items():
        print(f"\nours wrong on {len(cases)} of {name} (showing {min(len(cases), args.show)}):")
        for case, ours, theirs, error in cases[: args.show]:
            print(f"  label={case['label']!s:<5} ours={ours!s:<5} mv={theirs!s:<5} gt={snippet(case['ground_truth'], 30)}"
                  f"  resp=...{snippet(case['response'], 50)}" + (f"  error={error[:40]}" if error else "")
                  + (f"\n      note: {case['note']}" if case.get("note") else ""))
    print(f"\nfalse positives (label wrong, ours right): {len(false_positives)}")
    for case in false_positives:
        print(f"  gt={snippet(case['ground_truth'], 30)} resp=...{snippet(case['response'], 60)} [{case['source']}]")
    print(f"verification errors: {errors}; slowest call {slowest[0]:.3f} s ({slowest[1]})")
    print(f"{args.threads} threads, cold cache: slowest call {concurrent_slowest:.3f} s; "
          f"disagreements with the labels {concurrent_changed} (sequential: {sum(len(v) for v in wrong.values())})")

    def macro(key: str) -> float:
        return sum(c[key] / c["n"] for _, c in rows) / len(rows)

    print(
        f"RESULT ours_macro={macro('ours'):.4f} mathverify_macro={macro('mv'):.4f} verl_macro={macro('verl'):.4f} "
        f"ours_nosym_macro={macro('nosym'):.4f} false_positives={len(false_positives)} "
        f"slowest_s={max(slowest[0], concurrent_slowest):.3f} timeout_s={DEFAULT_TIMEOUT_S:g}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
