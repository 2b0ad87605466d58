"""Rebuild the public verifier suites in this folder from outside material (run by hand; the bench reads the
``*.jsonl`` files and fetches nothing).

    python bench/verifier_suites/build_suites.py --math-verify-checkout PATH_TO_Math-Verify

Suites (one JSON object per line: ``suite``, ``response``, ``ground_truth``, ``label``, ``source``, and
``note`` on a case recipe_dapo leaves as a miss on purpose, saying why):

- ``mathverify_tests``: the (gold, prediction, expected) cases of math-verify's own tests (github
  huggingface/Math-Verify, ``tests/*.py``) with its default settings (cases of tests that change the
  precision, strictness or set-relation option are left out). DAPO format: the prediction becomes the
  response's last line ``Answer: <prediction>`` unless it already has a box or an answer line; the gold is
  the ground truth as written. Cases read with ``ast.literal_eval`` from the test files; no code copied.
- ``mathverify_model_outputs``: the same for the long model outputs of its ``test_boxed``,
  ``test_numina_cases``, ``test_open_thoughts`` and ``test_yujianll`` files.
- ``math500_solutions``: MATH-500 reference solutions (``/work/shared/data/eval/math500_test.jsonl``, from
  HuggingFaceH4/MATH-500) as responses: each solution against its own answer (right) and against the answer of
  another problem whose answer differs as a number or string (wrong).

- ``dapo_formats``: DAPO-Math-17k ground truths (``/work/shared/data/dapo-math-17k``, from
  BytedTsinghua-SIA/DAPO-Math-17k) written in 20 right forms and 6 wrong ones, as a DAPO response ends.

``verl_reward_tests.jsonl`` and ``answer_format_cases.jsonl`` are written by hand (see their ``source`` fields).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/work/shared/data"

# Tests whose cases run with non-default options of math-verify (precision, strict, set relations).
NON_DEFAULT_TESTS = {"test_set_rel_assymetry", "test_float_precision", "test_sqrt_precision", "test_symbols",
                     "test_strict_variable_comparison", "test_precision"}
MODEL_OUTPUT_FILES = {"test_boxed.py", "test_numina_cases.py", "test_open_thoughts.py", "test_yujianll.py"}
# Upstream expectations that are mathematically wrong (math-verify tests its own behaviour); label fixed here.
RELABELLED = {("$1 - \\frac{1}{\\mathrm{e}}$", "$1 + \\frac{1}{\\mathrm{e}}$"): False}
# Cases recipe_dapo leaves as misses on purpose: (gold, a piece of the prediction) -> note.
NOTES = [
    ("1000.99", "1000,99", "ambiguous: a decimal comma with digits after one comma cannot be told from the list "
     "1000, 99; recipe_dapo reads neither (a miss, never a false positive)"),
    ("1,22", "1.22", "ambiguous: the ground truth 1,22 may be the list 1, 22 (math-verify scores it wrong too)"),
    ("0,111", "0.111", "ambiguous: the ground truth 0,111 may be the list 0, 111; it is not 111 either"),
    ("2.74", "Soucis", "ambiguous: garbled Answer line with a decimal comma"),
    ("$2/3$", "Alice wins the game is 2/3", "free text: the Answer line holds a whole solution whose last sentence "
     "ends 'is 2/3'; no final-answer phrase, so recipe_dapo does not guess"),
    ("$12$", "distinct arithmetic sequences", "free text: the Answer line holds a whole solution ending 'there are "
     "12 ... I hope it is correct'; no final-answer phrase"),
    ("$100%$", "increases by 100%", "free text: the Answer line holds a whole solution ending 'increases by "
     "100%.'; no final-answer phrase"),
    ("Since $25<30<36$", "$12 $ and $13 $", "ambiguous: the answer 'between 12 and 13' is written as two math "
     "segments '$12 $ and $13 $' inside a box that closes after them"),
    ("$$(3, 3), (1, 1)$$", "for part (a) and", "ambiguous: two boxes for two parts separated by prose ('for part "
     "(a) and'); joining boxes across prose would also join '\\boxed{5} is wrong, so \\boxed{6}'"),
]


def note_for(gold: str, pred: str) -> str | None:
    return next((note for g, piece, note in NOTES if gold.startswith(g) and piece in pred), None)


def parametrized_cases(source: str):
    """(test name, gold, pred, expected) of every ``@pytest.mark.parametrize`` with gold/pred columns."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and len(decorator.args) >= 2):
                continue
            try:
                names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
                rows = ast.literal_eval(decorator.args[1])
            except (ValueError, SyntaxError, AttributeError):
                continue
            if "gold" not in names or "pred" not in names:
                continue
            for row in rows:
                values = dict(zip(names, row))
                if values.get("precision", 6) != 6 or values.get("strict", True) is not True:
                    continue
                if "allow_set_relation_comp" in values:
                    continue
                expected = values.get("expected", values.get("result"))
                if isinstance(values["gold"], str) and isinstance(values["pred"], str) and expected in (0, 1, True, False):
                    yield node.name, values["gold"], values["pred"], bool(expected)


def as_dapo_response(pred: str) -> str:
    if "\\boxed" in pred or "answer" in pred.lower():
        return pred
    return f"Let me work it out.\n\nAnswer: {pred}"


def mathverify_suites(checkout: str) -> list[dict]:
    rows = []
    files = subprocess.run(["git", "-C", checkout, "ls-files", "tests"], capture_output=True, text=True, check=True)
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    for path in sorted(files.stdout.split()):
        if not path.endswith(".py"):
            continue
        with open(os.path.join(checkout, path), encoding="utf-8") as f:
            source = f.read()
        name = os.path.basename(path)
        suite = "mathverify_model_outputs" if name in MODEL_OUTPUT_FILES else "mathverify_tests"
        for test, gold, pred, expected in parametrized_cases(source):
            if test in NON_DEFAULT_TESTS:
                continue
            label = RELABELLED.get((gold, pred), expected)
            row = {
                "suite": suite, "response": as_dapo_response(pred), "ground_truth": gold, "label": label,
                "source": f"huggingface/Math-Verify@{commit[:12]} {path}::{test}"
                + (" (relabelled: upstream expects the wrong value)" if label != expected else ""),
            }
            note = note_for(gold, pred) if label else None
            rows.append({**row, "note": note} if note else row)
    return rows


def math500_suite() -> list[dict]:
    with open(os.path.join(DATA, "eval", "math500_test.jsonl"), encoding="utf-8") as f:
        problems = [json.loads(line) for line in f]
    rng = random.Random(0)
    rows = []
    for i, problem in enumerate(problems):
        source = f"HuggingFaceH4/MATH-500 test.jsonl {problem.get('unique_id', i)}"
        rows.append({"suite": "math500_solutions", "response": problem["solution"],
                     "ground_truth": problem["answer"], "label": True, "source": source})
        # A wrong answer: another problem's, different as written and (when both are numbers) in value.
        for _ in range(50):
            other = problems[rng.randrange(len(problems))]["answer"]
            if _plain(other) != _plain(problem["answer"]) and not _same_number(other, problem["answer"]):
                break
        rows.append({"suite": "math500_solutions", "response": problem["solution"], "ground_truth": other,
                     "label": False, "source": source + " against another problem's answer"})
    return rows


RIGHT_FORMS = [
    "Answer: {n}", "Answer: ${n}$", "**Answer:** {n}", "Answer: \\boxed{{{n}}}", "Answer: {n}.", "Answer:\n{n}",
    "answer: {n}", "Answer: $\\boxed{{{n}}}$", "Answer: x = {n}", "Answer: {n} \\text{{ ways}}", "Answer: {n}^\\circ",
    "Answer: \\frac{{{n2}}}{{2}}", "Answer: {n}.0", "Answer: {comma}", "Answer: $n = {n}$", "Answer: \\({n}\\)",
    "So the final answer is $\\boxed{{{n}}}$.", "Final Answer: The final answer is ${n}$. I hope it is correct.",
    "Answer: {n} \\text{{cm}}^2", "Answer: {n}\\%",
]
WRONG_FORMS = ["Answer: {m}", "Answer: {n}0", "Answer: -{n}1", "Answer: {n}.5", "Answer: \\boxed{{{m}}}",
               "Answer: {n}, {m}"]


def dapo_formats_suite() -> list[dict]:
    import pandas as pd

    frame = pd.read_parquet(os.path.join(DATA, "dapo-math-17k", "dapo-math-17k.parquet"), columns=["reward_model"])
    answers = [row["ground_truth"] for row in frame["reward_model"]]
    rng = random.Random(0)
    rows = []
    for answer in rng.sample([a for a in answers if int(a) != 0], 60):  # "{n}0" must differ from n
        n = int(answer)
        fields = {"n": n, "n2": 2 * n, "comma": f"{n:,}", "m": n + rng.choice([-3, -1, 1, 2, 10])}
        body = "We compute the quantity step by step.\n\n"
        source = "BytedTsinghua-SIA/DAPO-Math-17k ground truth " + answer
        for form in RIGHT_FORMS:
            rows.append({"suite": "dapo_formats", "response": body + form.format(**fields), "ground_truth": answer,
                         "label": True, "source": source})
        for form in WRONG_FORMS:
            rows.append({"suite": "dapo_formats", "response": body + form.format(**fields), "ground_truth": answer,
                         "label": False, "source": source})
    return rows


def _plain(answer: str) -> str:
    for mark in ("^\\circ", "^{\\circ}", "\\%", "\\$", "\\left", "\\right"):
        answer = answer.replace(mark, "")
    return "".join(answer.replace("\\dfrac", "\\frac").split())


def _same_number(a: str, b: str) -> bool:
    try:
        return float(_plain(a)) == float(_plain(b))
    except ValueError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--math-verify-checkout", required=True)
    args = parser.parse_args()
    by_suite: dict[str, list[dict]] = {}
    for row in mathverify_suites(args.math_verify_checkout) + math500_suite() + dapo_formats_suite():
        by_suite.setdefault(row["suite"], []).append(row)
    for suite, rows in by_suite.items():
        with open(os.path.join(HERE, f"{suite}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{suite}: {len(rows)} cases")


if __name__ == "__main__":
    main()
