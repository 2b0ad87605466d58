"""Chain arithmetic: a CPU task whose reasoning length varies from problem to problem.

"Compute 4+5-2+3." (the bare problem is the whole prompt) is solved one operation per line, each line evaluating the
first operation of the line before, and ends in the DAPO answer line::

    4+5-2+3
    =9-2+3
    =7+3
    =10
    Answer: 10

A problem has ``min_terms`` to ``max_terms`` small terms, so the needed response length spreads several-fold
across problems, and every extra line is one more chance to slip: accuracy falls with length. The running total
stays between 0 and 20, so every number is a plain integer and one line is one of a few hundred facts.

Two ways to write the same solution are taught in the warm-up (:func:`solution`):

- ``concise``: the lines above;
- ``verbose``: every line prefixed ``Step i:`` and a closing sentence, about twice as many tokens.

A policy warmed up on both starts out choosing either, so its response lengths spread widely, and the verbose
solutions of long chains overrun a response limit that the concise ones fit. That gives each DAPO technique
something to act on: the overlong shaping (a verbose long chain is truncated or lands in the penalty zone), the
token-level loss (long and short responses of one group weigh differently under the two aggregations), dynamic
sampling (short chains are often all right, long ones often all wrong), and clip-higher (the style choice and each
digit are low-probability tokens that a symmetric clip holds back). The answer is verifiable exactly: the real
reward path scores "Answer: <integer>".

Everything is generated from a seed: nothing is downloaded.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

DATA_SOURCE = "chain_arithmetic"
STYLES = ("concise", "verbose")


@dataclass(frozen=True)
class ChainProblem:
    """One problem: its terms and the operations between them (``ops[i]`` joins ``terms[i]`` and ``terms[i+1]``)."""

    terms: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def text(self) -> str:
        return "Compute " + self.expression + "."

    @property
    def expression(self) -> str:
        return join(self.terms, self.ops)

    def running_totals(self) -> list[int]:
        totals = [self.terms[0]]
        for op, term in zip(self.ops, self.terms[1:]):
            totals.append(totals[-1] + term if op == "+" else totals[-1] - term)
        return totals

    @property
    def answer(self) -> int:
        return self.running_totals()[-1]

    @property
    def steps(self) -> int:
        return len(self.ops)


MAX_TERM = 5
MAX_TOTAL = 20


def join(terms, ops) -> str:
    """``(4, 7, 2), ("+", "-")`` -> ``"4+7-2"`` (no spaces: fewer tokens for a small tokenizer)."""
    parts = [str(terms[0])]
    for op, term in zip(ops, terms[1:]):
        parts += [op, str(term)]
    return "".join(parts)


def draw_problem(rng: random.Random, min_terms: int = 2, max_terms: int = 5) -> ChainProblem:
    """A chain of ``min_terms``..``max_terms`` terms of 1..MAX_TERM whose running total stays in 0..MAX_TOTAL (a ``-``
    is drawn only where the total can take it, a ``+`` only where it stays within MAX_TOTAL), so one step is one of
    a few hundred facts, and the length of the chain is what makes a problem hard."""
    count = rng.randint(min_terms, max_terms)
    terms = [rng.randint(1, MAX_TERM)]
    ops = []
    total = terms[0]
    for _ in range(count - 1):
        term = rng.randint(1, MAX_TERM)
        allowed = [op for op, ok in (("+", total + term <= MAX_TOTAL), ("-", total >= term)) if ok]
        op = rng.choice(allowed)
        total = total + term if op == "+" else total - term
        terms.append(term)
        ops.append(op)
    return ChainProblem(tuple(terms), tuple(ops))


def parse_problem(text: str) -> ChainProblem:
    """The inverse of :attr:`ChainProblem.text` (a bare problem, without the DAPO template)."""
    body = text.strip()
    if not (body.startswith("Compute ") and body.endswith(".")):
        raise ValueError(f"not a chain-arithmetic problem: {text!r}")
    tokens = re.findall(r"\d+|[^\d\s]", body[len("Compute "):-1])
    terms = tuple(int(t) for t in tokens[0::2])
    ops = tuple(tokens[1::2])
    if len(terms) != len(ops) + 1 or any(op not in "+-" for op in ops):
        raise ValueError(f"not a chain-arithmetic problem: {text!r}")
    return ChainProblem(terms, ops)


def solution(problem: ChainProblem, style: str = "concise") -> str:
    """The worked solution in one of :data:`STYLES`, ending with the DAPO answer line.

    Each line evaluates the first operation of the line before and copies the rest, so every line needs only the
    two numbers at its start (what a small model can learn): ``4+5-2+3`` / ``=9-2+3`` / ``=7+3`` / ``=10``. The verbose style numbers every line and closes with a sentence."""
    if style not in STYLES:
        raise ValueError(f"unknown solution style {style!r}; expected one of {STYLES}")
    totals = problem.running_totals()
    lines = [problem.expression]
    for index in range(problem.steps):
        lines.append("=" + join((totals[index + 1], *problem.terms[index + 2:]), problem.ops[index + 1:]))
    if style == "verbose":
        lines = [f"Step {number}: {line}" for number, line in enumerate(lines, 1)]
        lines.append(f"So the result is {problem.answer}.")
    lines.append(f"Answer: {problem.answer}")
    return "\n".join(lines)


def problems(count: int, seed: int, split: str, min_terms: int = 2, max_terms: int = 5) -> list[ChainProblem]:
    """``count`` problems drawn from ``(seed, split)``; validation and training draw from different streams."""
    rng = random.Random(f"chain-{seed}-{split}")
    return [draw_problem(rng, min_terms, max_terms) for _ in range(count)]


STEP_RIGHT = 1.0
STEP_WRONG = -1.0
_STEP_PREFIX = re.compile(r"^Step \d+:\s*")
_ANSWER_LINE = re.compile(r"^Answer:\s*(-?\d+)\s*$")
_EXPRESSION = re.compile(r"^=?\d+(?:[+-]\d+)*$")


def score_steps(problem: ChainProblem, response: str) -> list[tuple[int, float]]:
    """The steps of a response and their rewards, as ``(index of the step's last character, reward)``.

    A step is a line: the restated problem (right if it is the problem's expression), each ``=...`` line (right if it
    evaluates the first operation of the line before and copies the rest, :func:`solution`'s rule, whether or not the
    line before was right), and the ``Answer:`` line (right if it is the problem's answer). Right is +1, wrong -1
    (never 0: ``recipe_dapo.advantages.estimator`` reads a non-zero reward as a step end). A line that is neither (the
    verbose style's closing sentence, a stray word) is no step: its characters belong to the next step. Text after the
    last newline-terminated or final line that is cut off (truncation) is scored as it stands: ``=9-`` is wrong.
    """
    steps: list[tuple[int, float]] = []
    previous: str | None = None
    start = 0
    for line in response.split("\n"):
        end = start + len(line) - 1
        body = _STEP_PREFIX.sub("", line.strip())
        answer = _ANSWER_LINE.match(body)
        if answer:
            steps.append((end, STEP_RIGHT if int(answer.group(1)) == problem.answer else STEP_WRONG))
        elif body.startswith("="):
            right = previous is not None and _EXPRESSION.match(body) is not None and body[1:] == _next_line(previous)
            steps.append((end, STEP_RIGHT if right else STEP_WRONG))
            previous = body[1:]
        elif previous is None and _EXPRESSION.match(body):
            steps.append((end, STEP_RIGHT if body == problem.expression else STEP_WRONG))
            previous = body
        start += len(line) + 1
    return [(end, reward) for end, reward in steps if end >= 0]


_PROMPT_PROBLEM = re.compile(r"Compute \d+(?:[+-]\d+)*\.")


def score_response(prompt: str, response: str) -> list[tuple[int, float]]:
    """:func:`score_steps` with the problem read from the prompt (its last ``Compute ...``): the ``chain_rule`` step
    scorer (``recipe_dapo.advantages.steps.StepScorer``)."""
    found = _PROMPT_PROBLEM.findall(prompt)
    if not found:
        raise ValueError(
            f"the chain_rule step scorer found no chain-arithmetic problem ('Compute 4+5-2.') in the prompt "
            f"{prompt[-200:]!r}; it scores only the CPU task's chain data (size=cpu_chain)"
        )
    return score_steps(parse_problem(found[-1]), response)


def _next_line(expression: str) -> str | None:
    """``"4+5-2"`` -> ``"9-2"``: the first operation evaluated, the rest copied (None if there is no operation)."""
    if not _EXPRESSION.match(expression):
        return None
    tokens = re.findall(r"\d+|[+-]", expression)
    if len(tokens) < 3:
        return None
    first, op, second = int(tokens[0]), tokens[1], int(tokens[2])
    return "".join([str(first + second if op == "+" else first - second), *tokens[3:]])
