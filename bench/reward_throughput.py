"""Reward throughput and agreement: recipe_dapo's verifier vs verl 0.9.1's ``math_dapo.compute_score``.

What it measures, all in one run on this machine:

1. Side by side on one core: 4,096 realistic long responses (chains of thought built from real MATH-500 /
   GSM8K solution text, 0.5k-20k tokens, ending in an Answer line or a box; right, wrong, missing and
   adversarial answers; ground truths from DAPO-Math-17k), scored by verl's ``math_dapo.compute_score``
   and by ours with default settings (math-verify on when installed), responses per second and ratio.
2. A paper-scale generation batch of 24,576 distinct responses on 2 worker processes (what
   ``reward.num_workers=2`` gives), each scoring its half the way verl's reward loop does: one asyncio
   task per sample, ``compute_score`` in the event loop's thread pool. Target: <= 10 s.
3. The reward managers end to end on token ids (``RewardLoopWorker.compute_score_batch`` over a padded
   DataProto with the Qwen2.5 tokenizer, rollout budget 20,480 tokens): ``recipe_dapo`` (tail decoding)
   vs verl's ``dapo`` manager (full decoding + math_dapo).
4. The slowest single cases (pathological inputs, symbolic bombs) against the time limit.
5. Agreement of both verifiers with labels on a labelled set (generated kinds + curated formats +
   MATH-500 answers), the cases where they differ and which one is right.

Run: ``python bench/reward_throughput.py`` (about a minute on 2 cores). Last line:
``RESULT ours_per_s=... verl_per_s=... ratio=... batch24576_s=... slowest_case_s=... timeout_s=...``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pandas as pd

from recipe_dapo.reward import symbolic, verifier
from recipe_dapo.reward.verifier import DEFAULT_TIMEOUT_S, compute_score

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data")
if not os.path.isdir(DATA):
    DATA = "/work/shared/data"
TOKENIZER_DIR = os.path.join(DATA, "qwen2.5-tokenizer")
CHARS_PER_TOKEN = 3.5  # measured on MATH-500 solutions with the Qwen2.5 tokenizer


def verl_compute_score(solution: str, ground_truth) -> dict:
    from verl.utils.reward_score import math_dapo

    try:
        return math_dapo.compute_score(solution, str(ground_truth))
    except Exception as error:  # count, don't crash the benchmark
        return {"score": -1.0, "acc": False, "pred": f"<exception {type(error).__name__}>"}


# --- data ---------------------------------------------------------------------------------------------


def load_paragraphs() -> list[str]:
    """Real solution text (MATH-500 and GSM8K) cut into paragraphs: the body of the chains of thought."""
    paragraphs = []
    with open(os.path.join(DATA, "eval", "math500_test.jsonl"), encoding="utf-8") as f:
        for line in f:
            paragraphs += [p.strip() for p in json.loads(line)["solution"].split("\n\n") if p.strip()]
    with open(os.path.join(DATA, "eval", "gsm8k_test.jsonl"), encoding="utf-8") as f:
        for line in f:
            paragraphs.append(json.loads(line)["answer"].split("####")[0].strip())
    return paragraphs


def load_math500() -> list[str]:
    with open(os.path.join(DATA, "eval", "math500_test.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["answer"] for line in f]


def load_dapo_ground_truths() -> list[str]:
    frame = pd.read_parquet(os.path.join(DATA, "dapo-math-17k", "dapo-math-17k.parquet"), columns=["reward_model"])
    return [row["ground_truth"] for row in frame["reward_model"]]


KIND_WEIGHTS = {
    "right_line": 30,
    "right_box": 8,
    "right_form": 5,
    "right_arith": 2,
    "wrong_line": 25,
    "wrong_box": 5,
    "wrong_expr": 3,
    "missing": 12,
    "adversarial": 10,
}


@dataclass
class Case:
    response: str
    ground_truth: str
    label: bool  # is the response's final answer right?
    kind: str


def body(rng: random.Random, paragraphs: list[str], chars: int) -> str:
    parts, size = [], 0
    while size < chars:
        paragraph = paragraphs[rng.randrange(len(paragraphs))]
        parts.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(parts)


def right_form(rng: random.Random, gt: int) -> str:
    forms = [f"x = {gt}", f"{gt} \\text{{ ways}}", f"\\frac{{{2 * gt}}}{{2}}", f"{gt}.0", f"0{gt}", f"{gt}^\\circ"]
    if abs(gt) >= 1000:
        forms.append(f"{gt:,}")
    return rng.choice(forms)


def right_arith(rng: random.Random, gt: int) -> str:
    forms = [f"{gt - 7} + 7"] + ([f"\\sqrt{{{gt * gt}}}"] if gt >= 0 else [])
    if gt > 0 and gt & (gt - 1) == 0 and gt > 2:
        forms.append(f"2^{{{gt.bit_length() - 1}}}")
        if gt >= 1024:
            forms.append(f"2^{gt.bit_length() - 1}")  # "2^10": ambiguous in LaTeX, left to math-verify
    factors = [d for d in range(2, 40) if gt % d == 0 and gt // d > 1]
    if factors:
        d = rng.choice(factors)
        forms.append(f"{d} \\cdot {gt // d}")
    return rng.choice(forms)


# name -> (ending built from the ground truth, is that ending's answer right?)
ADVERSARIAL = {
    "nested braces": (lambda gt: "\\boxed{" * 30_000 + str(gt) + "}" * 30_000, True),  # the last box holds gt
    "unclosed box": (lambda gt: "so \\boxed{" + "{" * 50_000, False),
    "dollar storm": (lambda gt: "$" * 60_000 + f"\nAnswer: {gt}", True),
    "answer spam": (lambda gt: "Answer:" * 15_000, False),
    "huge answer line": (lambda gt: "Answer: " + "1+" * 40_000 + "1", False),
    "replacement chars": (lambda gt: "\ufffd" * 30_000 + f"\nAnswer: {gt}", True),
    "lone surrogates": (lambda gt: "reasoning \ud800\udc80\udfff\nAnswer: \ud800", False),
    "100k no answer": (lambda gt: "let me think " * 8_000, False),
    "power tower": (lambda gt: "Answer: 10^{10^{10}}", False),
    "deep parens": (lambda gt: "Answer: " + "(" * 5_000 + "1" + ")" * 5_000, False),
    "control bytes": (lambda gt: f"\x00\x01\x1b[31m junk \x7f\nAnswer: {gt}", True),
}


def make_case(rng: random.Random, paragraphs: list[str], ground_truths: list[str], kind: str) -> Case:
    gt_text = ground_truths[rng.randrange(len(ground_truths))]
    gt = int(gt_text)
    tokens = math.exp(rng.uniform(math.log(500), math.log(20_000)))  # log-uniform 0.5k-20k tokens
    text = body(rng, paragraphs, int(tokens * CHARS_PER_TOKEN))
    label = kind.startswith("right")
    if kind == "right_line":
        template = rng.choice(["Answer: {}", "Answer: ${}$", "**Answer:** {}", "Answer: \\boxed{{{}}}", "Answer: {}."])
        ending = template.format(gt)
    elif kind == "right_box":
        ending = f"Therefore, the final answer is $\\boxed{{{gt}}}$."
    elif kind == "right_form":
        ending = f"Answer: {right_form(rng, gt)}"
    elif kind == "right_arith":
        ending = f"Answer: ${right_arith(rng, gt)}$"
    elif kind == "wrong_line":
        ending = f"Answer: {gt + rng.choice([-10, -2, -1, 1, 2, 3, 17, 100])}"
    elif kind == "wrong_box":
        ending = f"So the answer is $\\boxed{{{gt + rng.choice([-1, 1, 5])}}}$."
    elif kind == "wrong_expr":
        ending = "Answer: " + rng.choice(["\\frac{\\sqrt{3}}{2}", "2\\pi", "x = 3y", "(1, 2)", "\\sqrt{2}+1"])
    elif kind == "missing":
        # Truncated mid-thought. The solution text it is made of has boxes and "answer:" of its own; remove
        # them so that "no answer" is the truth (a real chain of thought could leave one behind).
        text = text.replace("\\boxed", "\\mathbf").replace("\\fbox", "\\mathbf").replace("nswer", "nswr")
        text = text[: rng.randrange(len(text) // 2, len(text))]
        ending = ""
    else:
        name = rng.choice(sorted(ADVERSARIAL))
        make, label = ADVERSARIAL[name]
        return Case(text + "\n\n" + make(gt), gt_text, label, f"adversarial: {name}")
    return Case(f"{text}\n\n{ending}" if ending else text, gt_text, label, kind)


def make_cases(count: int, seed: int, paragraphs: list[str], ground_truths: list[str]) -> list[Case]:
    rng = random.Random(seed)
    kinds = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()), k=count)
    return [make_case(rng, paragraphs, ground_truths, kind) for kind in kinds]


CURATED = [
    # (category, response ending, ground truth, label)
    ("format", "Answer: 1,000", "1000", True),
    ("format", "Answer: $1{,}000$", "1000", True),
    ("format", "Answer: 10\\,000", "10000", True),
    ("format", "**Answer:** 42", "42", True),
    ("format", "Answer:\n42", "42", True),
    ("format", "Answer: 42.", "42", True),
    ("format", "Answer: $x = 42$", "42", True),
    ("format", "Answer: 42 \\text{ apples}", "42", True),
    ("format", "Answer: 042", "42", True),
    ("format", "Answer: 30^\\circ", "30", True),
    ("format", "Answer: 30 degrees", "30", True),
    ("format", "Answer: \\$18", "18", True),
    ("format", "Answer: 25\\%", "25", True),
    ("format", "Answer: \\boxed{42}", "42", True),
    ("format", "Answer: The final answer is $42$.", "42", True),
    ("format", "Final Answer: 7", "7", True),
    ("format", "Answer: 4 2", "42", True),
    ("fallback", "so it is \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
    ("fallback", "the answer is \\boxed{12}.", "12", True),
    ("fallback", "\\boxed{5}, I mean \\boxed{6}", "6", True),
    ("fallback", "I think \\boxed{5} was wrong, so 7.", "7", False),
    ("equivalence", "Answer: 0.5", "\\frac{1}{2}", True),
    ("equivalence", "Answer: 1/2", "\\frac12", True),
    ("equivalence", "Answer: \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
    ("equivalence", "Answer: \\sqrt{3}/2", "\\frac{\\sqrt{3}}{2}", True),
    ("equivalence", "Answer: 2\\sqrt{2}", "\\sqrt{8}", True),
    ("equivalence", "Answer: 2^{10}", "1024", True),
    ("equivalence", "Answer: 5.0", "5", True),
    ("equivalence", "Answer: \\{2, 1\\}", "\\{1, 2\\}", True),
    ("equivalence", "Answer: [1, 3)", "[1,3)", True),
    ("equivalence", "Answer: \\pi/2", "\\frac{\\pi}{2}", True),
    ("equivalence", "Answer: 0.333", "\\frac{1}{3}", False),
    ("equivalence", "Answer: \\sqrt{2}", "\\sqrt{3}", False),
    ("wrong", "Answer: 41", "42", False),
    ("wrong", "Answer: 4.2", "42", False),
    ("wrong", "Answer: -42", "42", False),
    ("wrong", "Answer: 420", "42", False),
    ("wrong", "Answer: x + 42", "42", False),
    ("missing", "I am not sure.", "42", False),
    ("missing", "Answer:", "42", False),
    ("missing", "The result follows from $\\frac{1}{2}$", "\\frac{1}{2}", False),
    ("far answer", "Answer: 42\n" + "Let me double-check everything once more. " * 80, "42", True),  # an answer far from the end
]


def math500_cases(rng: random.Random, answers: list[str]) -> list[tuple[str, str, str, bool]]:
    """(category, response, ground truth, label) from the 500 real MATH answers."""
    cases = []
    for i, answer in enumerate(answers):
        cases.append(("math500 line", f"So we are done.\n\nAnswer: {answer}", answer, True))
        cases.append(("math500 box", f"So the answer is $\\boxed{{{answer}}}$.", answer, True))
        other = answers[(i + 1 + rng.randrange(len(answers) - 1)) % len(answers)]
        same = verifier.normalize_answer(other) == verifier.normalize_answer(answer)
        cases.append(("math500 wrong", f"Answer: {other}", answer, same))
        rewritten = answer.replace("\\dfrac", "\\frac").replace("\\left", "").replace("\\right", "")
        rewritten = rewritten.replace("\\frac{", "\\tfrac{") if "\\frac{" in rewritten else rewritten
        cases.append(("math500 rewrite", f"Answer: ${rewritten}$", answer, True))
    return cases


# --- measurements -------------------------------------------------------------------------------------


def warm_checker() -> None:
    """What the reward manager does at construction: have math-verify imported before scoring starts."""
    if symbolic.math_verify_installed():
        verifier.verify("Answer: \\sqrt{2}\\pi", "\\pi\\sqrt{2}", timeout_s=60)
    verifier.clear_symbolic_cache()


def time_side_by_side(cases: list[Case], rounds: int) -> tuple[float, float, list, list]:
    """Best of ``rounds`` alternating rounds (the minimum is the least disturbed by other processes)."""
    ours_s, verl_s = [], []
    ours_results = verl_results = None
    for _ in range(rounds):
        start = time.perf_counter()
        verl_results = [verl_compute_score(c.response, c.ground_truth) for c in cases]
        verl_s.append(time.perf_counter() - start)
        verifier.clear_symbolic_cache()  # cold cache: every round pays for its symbolic checks
        start = time.perf_counter()
        ours_results = [compute_score("math_dapo", c.response, c.ground_truth) for c in cases]
        ours_s.append(time.perf_counter() - start)
    return min(ours_s), min(verl_s), ours_results, verl_results


def _batch_worker(cases: list[Case], indices: range, barrier, results) -> None:
    warm_checker()

    async def score_all():
        loop = asyncio.get_running_loop()
        tasks = [
            loop.run_in_executor(None, compute_score, "math_dapo", cases[i].response, cases[i].ground_truth)
            for i in indices
        ]
        return await asyncio.gather(*tasks)

    barrier.wait()
    start = time.perf_counter()
    scored = asyncio.run(score_all())
    elapsed = time.perf_counter() - start
    errors = sum(1 for r in scored if r["verify_error"])
    results.put((len(scored), elapsed, errors))


def time_batch_on_workers(cases: list[Case], workers: int) -> tuple[float, int, int]:
    context = mp.get_context("fork")
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    chunk = math.ceil(len(cases) / workers)
    processes = [
        context.Process(
            target=_batch_worker, args=(cases, range(w * chunk, min(len(cases), (w + 1) * chunk)), barrier, results)
        )
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    barrier.wait()
    start = time.perf_counter()
    outputs = [results.get() for _ in processes]
    wall = time.perf_counter() - start
    for process in processes:
        process.join()
    return wall, sum(o[0] for o in outputs), sum(o[2] for o in outputs)


def time_managers(cases: list[Case], count: int, budget: int) -> tuple[float, float]:
    """Responses/s of the two reward managers through verl's RewardLoopWorker on a padded DataProto."""
    import numpy as np
    import torch
    from hydra import compose, initialize_config_module
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils.ray_utils import get_event_loop

    import recipe_dapo.reward.manager  # noqa: F401  registers recipe_dapo

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    chosen = [c for c in cases if not c.kind.startswith("adversarial")][:count]
    # Tokenising megabytes of text would dominate the run: tokenise each response's last 4,000 characters
    # and put the right number of real solution-text tokens in front (decoding cost depends on the count).
    filler = tokenizer("\n\n".join(load_paragraphs()[:400]), add_special_tokens=False)["input_ids"]
    tails = tokenizer([c.response[-4000:] for c in chosen], add_special_tokens=False)["input_ids"]
    responses = torch.full((len(chosen), budget), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(chosen), budget), dtype=torch.long)
    for row, (case, tail) in enumerate(zip(chosen, tails)):
        front = max(0, round(len(case.response[:-4000]) / CHARS_PER_TOKEN))
        ids = ((filler * (front // len(filler) + 1))[:front] + tail + [tokenizer.eos_token_id])[-budget:]
        responses[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    prompts = torch.full((len(chosen), 8), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.cat([torch.ones_like(prompts), mask], dim=1)
    batch = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention},
        non_tensors={
            "data_source": np.array(["math_dapo"] * len(chosen), dtype=object),
            "reward_model": np.array([{"ground_truth": c.ground_truth} for c in chosen], dtype=object),
        },
    )
    per_s = {}
    for name in ("recipe_dapo", "dapo"):
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            config = compose(
                config_name="ppo_trainer",
                overrides=[
                    f"data.max_response_length={budget}",
                    f"actor_rollout_ref.model.path={TOKENIZER_DIR}",
                    f"reward.reward_manager.name={name}",
                    "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                    f"+reward.reward_kwargs.overlong_buffer_cfg.len={budget // 5}",
                    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                    "+reward.reward_kwargs.overlong_buffer_cfg.log=true",
                    f"+reward.reward_kwargs.max_resp_len={budget}",
                ],
            )
        worker = RewardLoopWorker(config)
        warm_checker()
        loop = get_event_loop()
        start = time.perf_counter()
        outputs = loop.run_until_complete(worker.compute_score_batch(batch))
        per_s[name] = len(outputs) / (time.perf_counter() - start)
    return per_s["recipe_dapo"], per_s["dapo"]


def slowest_cases(paragraphs: list[str]) -> list[tuple[str, float, str]]:
    rng = random.Random(7)
    text = body(rng, paragraphs, 70_000)
    probes = [(f"adversarial: {name}", f"{text}\n\n{make(42)}", "42") for name, (make, _) in ADVERSARIAL.items()]
    probes += [
        ("symbolic bomb: 10^{10^{10}} vs \\pi", "Answer: 10^{10^{10}}", "\\pi"),
        ("symbolic bomb: 9^{9^{9}}\\pi vs \\pi", "Answer: 9^{9^{9}}\\pi", "\\pi"),
        ("symbolic: (x+1)^{100000} vs x", "Answer: (x+1)^{100000}", "x"),
        ("symbolic: 300-char expression", "Answer: " + "+".join(["\\sqrt{2}"] * 37), "\\pi"),
        ("right, 70k chars", text + "\n\nAnswer: 42", "42"),
    ]
    timings = []
    for name, response, gt in probes:
        verifier.clear_symbolic_cache()
        start = time.perf_counter()
        result = compute_score("math_dapo", response, gt)
        outcome = result["verify_error"][:48] or f"score {result['score']:+.0f}"
        timings.append((name, time.perf_counter() - start, outcome))
    return timings


def agreement(rows: list[tuple[str, str, str, bool]]) -> tuple[list, list]:
    """Per category: n, ours matches label, verl matches label; plus the disagreements."""
    table = defaultdict(Counter)
    differences = []
    for category, response, gt, label in rows:
        ours = compute_score("math_dapo", response, gt)["acc"]
        theirs = bool(verl_compute_score(response, gt)["acc"])
        stats = table[category]
        stats["n"] += 1
        stats["ours_ok"] += ours == label
        stats["verl_ok"] += theirs == label
        if ours != theirs:
            differences.append((category, response, gt, label, ours, theirs))
    return sorted(table.items()), differences


def snippet(text: str, width: int = 44) -> str:
    tail = text[-width:].replace("\n", "\\n")
    return ascii(tail)[1:-1][-width:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=24_576)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--manager-responses", type=int, default=512)
    parser.add_argument("--budget", type=int, default=20_480, help="rollout budget (tokens) of the manager batch")
    args = parser.parse_args()

    paragraphs, dapo_gts = load_paragraphs(), load_dapo_ground_truths()
    batch = make_cases(args.batch, seed=0, paragraphs=paragraphs, ground_truths=dapo_gts)
    cases = batch[: args.responses]
    mean_tokens = sum(len(c.response) for c in cases) / len(cases) / CHARS_PER_TOKEN
    print(f"math-verify installed: {symbolic.math_verify_installed()}; time limit {DEFAULT_TIMEOUT_S:g} s; "
          f"{os.cpu_count()} CPUs; mean response ~{mean_tokens:,.0f} tokens")
    print("kinds:", dict(sorted(Counter(c.kind.split(":")[0] for c in cases).items())))

    # 1. side by side, one process
    verl_compute_score("warm", "0")
    warm_checker()
    ours_s, verl_s, ours_results, verl_results = time_side_by_side(cases, args.rounds)
    ours_per_s, verl_per_s = len(cases) / ours_s, len(cases) / verl_s
    print(f"\n## 1. {len(cases):,} responses, one process (best of {args.rounds} alternating rounds)")
    print(f"{'verifier':<36}{'seconds':>10}{'responses/s':>14}")
    print(f"{'verl math_dapo.compute_score':<36}{verl_s:>10.3f}{verl_per_s:>14,.0f}")
    print(f"{'recipe_dapo compute_score':<36}{ours_s:>10.3f}{ours_per_s:>14,.0f}")
    print(f"ratio ours/verl = {ours_per_s / verl_per_s:.3f}")
    print(f"symbolic checks: {verifier.symbolic_checks_run()} of {len(cases):,}; "
          f"verify errors: {sum(1 for r in ours_results if r['verify_error'])}")

    # 2. paper-scale batch on 2 workers
    wall, scored, errors = time_batch_on_workers(batch, args.workers)
    print(f"\n## 2. paper-scale batch: {scored:,} distinct responses on {args.workers} worker processes")
    print(f"wall {wall:.2f} s = {scored / wall:,.0f} responses/s (target <= 10 s); verify errors {errors}")

    # 3. reward managers end to end on token ids
    ours_manager, verl_manager = time_managers(batch, args.manager_responses, args.budget)
    print(f"\n## 3. reward managers on {args.manager_responses} tokenised responses "
          f"(budget {args.budget:,} tokens), RewardLoopWorker.compute_score_batch, one process")
    print(f"{'manager':<36}{'responses/s':>14}")
    print(f"{'verl dapo (full decode + math_dapo)':<36}{verl_manager:>14,.0f}")
    print(f"{'recipe_dapo (tail decode + ours)':<36}{ours_manager:>14,.0f}")
    print(f"ratio ours/verl = {ours_manager / verl_manager:.2f}; a {args.batch:,}-response batch on "
          f"{args.workers} workers would take ~{args.batch / (args.workers * ours_manager):.1f} s "
          f"(~{args.batch / (args.workers * verl_manager):.1f} s with verl's)")

    # 4. slowest single cases
    timings = slowest_cases(paragraphs)
    print(f"\n## 4. slowest single cases (time limit {DEFAULT_TIMEOUT_S:g} s)")
    print(f"{'case':<44}{'ms':>10}  outcome")
    for name, seconds, outcome in sorted(timings, key=lambda t: -t[1]):
        print(f"{name:<44}{seconds * 1e3:>10.1f}  {outcome}")
    slowest = max(seconds for _, seconds, _ in timings)

    # 5. agreement on labelled sets
    rows = [(c.kind.split(":")[0], c.response, c.ground_truth, c.label) for c in cases]
    rows += [(category, "Reasoning...\n\n" + ending, gt, label) for category, ending, gt, label in CURATED]
    rows += math500_cases(random.Random(1), load_math500())
    table, differences = agreement(rows)
    print(f"\n## 5. agreement with labels ({len(rows):,} labelled cases)")
    print(f"{'category':<18}{'n':>6}{'ours right':>12}{'verl right':>12}")
    for category, stats in table:
        n = stats["n"]
        print(f"{category:<18}{n:>6}{stats['ours_ok'] / n:>12.1%}{stats['verl_ok'] / n:>12.1%}")
    ours_only = sum(1 for d in differences if d[4] == d[3])
    verl_only = sum(1 for d in differences if d[5] == d[3])
    regressions = [d for d in differences if d[3] and not d[4] and d[5]]
    print(f"they differ on {len(differences)} cases: ours right on {ours_only}, verl right on {verl_only}; "
          f"known-correct scored wrong by ours but right by math_dapo: {len(regressions)}")
    ours_wrong = [r for r in rows if compute_score("math_dapo", r[1], r[2])["acc"] != r[3]]
    for category, response, gt, label in ours_wrong[:10]:
        result = compute_score("math_dapo", response, gt)
        print(f"  ours wrong: {category}: ...{snippet(response)} gt={snippet(gt, 20)} label={label} -> {result}")
    print(f"\n{'category':<16}{'response ends with':<46}{'ground truth':<22}{'label':>6}{'ours':>6}{'verl':>6}")
    shown = Counter()
    for category, response, gt, label, ours, theirs in differences:
        if shown[category] < 6:
            shown[category] += 1
            print(f"{category:<16}{snippet(response):<46}{snippet(gt, 20):<22}{label!s:>6}{ours!s:>6}{theirs!s:>6}")

    print(
        f"RESULT ours_per_s={ours_per_s:.0f} verl_per_s={verl_per_s:.0f} ratio={ours_per_s / verl_per_s:.3f} "
        f"batch24576_s={wall:.2f} manager_ours_per_s={ours_manager:.0f} manager_verl_per_s={verl_manager:.0f} "
        f"slowest_case_s={slowest:.3f} timeout_s={DEFAULT_TIMEOUT_S:g} regressions={len(regressions)}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
