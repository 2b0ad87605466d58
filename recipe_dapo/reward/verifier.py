"""DAPO's rule-based answer verifier (paper section 2.4): +1 when the final answer equals the ground truth, else -1.

Pure Python (``re`` and ``fractions``); math-verify is used only for the optional symbolic step, in a child
process (see :mod:`recipe_dapo.reward.symbolic`).

Extraction (:func:`extract_answer`), on the last ``TAIL_CHARS`` characters of the response only -- the DAPO
prompt asks for the answer on the *last* line, and a bounded window bounds the work:

1. the text after the last ``Answer:`` (any case, full-width colon too), from the first non-blank character
   to the end of that line; markdown ``**`` around the marker is skipped::

       "... so x = 7.\\n\\nAnswer: 42"        -> "42"
       "**Answer:** $\\frac{3}{4}$"         -> "$\\frac{3}{4}$"
       "Answer:\\n17"                        -> "17"

2. the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched; an unclosed last box
   gives nothing) when there is no (non-empty) Answer line, or when that box starts after the Answer
   line -- a chain of thought may say "the answer: ..." long before its final box::

       "... hence \\boxed{\\dfrac{1}{2}}."    -> "\\dfrac{1}{2}"
       "our answer: 5?\\n...\\n\\boxed{6}"      -> "6"

3. otherwise no answer: ``pred == ""`` and the sample scores -1.

Normalisation (:func:`normalize_answer`), applied to prediction and ground truth alike:

- control characters, U+FFFD (undecodable bytes) and lone surrogates are dropped;
- a ``\\boxed{X}`` inside the answer gives ``X``; ``\\$`` (currency), ``\\left``/``\\right``, markdown ``**``
  are dropped; ``\\dfrac``/``\\tfrac`` become ``\\frac``; ``\\text{X}``, ``\\mathrm{X}``, ``\\textbf{X}``,
  ``\\mbox{X}`` ... become ``X``;
- math delimiters: with ``$...$`` (or ``\\(...\\)``, ``\\[...\\]``) present, the last math segment is the
  answer (``"The answer is $5$."`` -> ``5``);
- spacing commands (``\\!``, ``\\,``, ``\\;``, ``\\quad`` ...), degree marks (``^\\circ``, ``°``) and
  percent signs are dropped; ``{,}`` becomes ``,``;
- ``lhs = rhs`` becomes ``rhs`` when ``lhs`` is a variable (``x``, ``a_1``) or ``rhs`` is a number
  (``"x = 5"`` -> ``5``, ``"3 + 4 = 7"`` -> ``7``);
- a number followed by words is the number (``"12 cm"`` -> ``12``, ``"5 square feet"`` -> ``5``);
- all whitespace and a trailing ``.``, ``,``, ``;`` or ``:`` are removed; ``\\frac12`` -> ``\\frac{1}{2}``,
  ``\\sqrt2`` -> ``\\sqrt{2}``; up to three layers of redundant outer braces are removed;
- thousands separators go (``1,000,000`` -> ``1000000``), then a leading ``+`` and the leading zeros of an
  integer (``042`` -> ``42``, ``-007`` -> ``-7``).

Comparison (:func:`verify`), first rule that decides wins:

1. equal normalised strings -> correct;
2. both sides numbers or arithmetic on numbers (integer, decimal, ``a/b``, ``\\frac{a}{b}``, ``2^{10}``,
   ``3\\sqrt{2}``, ``5\\times10^3``; see :mod:`recipe_dapo.reward.arithmetic`) -> compared by value: exactly
   when both values are exact (``0.5`` = ``\\frac{1}{2}``, ``\\sqrt{1764}`` = ``42``, ``0.333`` !=
   ``\\frac{1}{3}``); an inexact value (irrational root, overflow) that is not within 1e-9 relative is
   wrong, one that is goes to step 4 (or counts as right without math-verify);
3. ground truth a number but the prediction is not arithmetic on numbers (it has a variable, ``\\pi``, a
   comma, ...) -> wrong, without a symbolic check;
4. symbolic check with math-verify when enabled (``symbolic_check=None`` means "when installed"; extra
   ``math``): radicals, intervals, sets, expressions with ``\\pi``; otherwise wrong.

Time limit: steps 1-3 use no regular expression with nested quantifiers, scan each character a bounded
number of times on at most ``TAIL_CHARS`` characters, and evaluate arithmetic under size limits, so their
time is bounded by construction (tens of microseconds; see ``bench/reward_throughput.py``). Only step 4
can run away (sympy), so it runs in a child process that is killed at ``timeout_s``; a time-out or any
exception scores -1 and is reported in ``Verdict.error`` / ``verify_error``. ``verify`` never raises.

Ground truths may be ``int``, ``float``, ``str``, ``bytes``, or a list/tuple/array of acceptable answers.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from recipe_dapo.reward import arithmetic, symbolic

logger = logging.getLogger(__name__)

TAIL_CHARS = 2000
"""Only the last this many characters of a response are read (math_dapo reads 300)."""

DEFAULT_TIMEOUT_S = 2.0
"""Wall-clock limit of one symbolic check (the only step that could run away)."""

MAX_SYMBOLIC_CHARS = 300
"""Longer answers are not sent to math-verify (parsing cost grows fast with length); they count as wrong."""

MAX_REPORTED_CHARS = 256
"""``pred`` and ``verify_error`` are cut to this length: verl stores them in fixed-width numpy string arrays."""

_MAX_RATIONAL_CHARS = 64  # longer "numbers" are compared as strings (and stay clear of int-parsing limits)

# --- extraction ----------------------------------------------------------------------------------------

_ANSWER_MARKER = re.compile(r"answer[ \t]*[:\uff1a]", re.IGNORECASE)
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE = re.compile(r"[{}]")


def extract_answer(response: str) -> str:
    """The answer written in ``response`` (rules in the module docstring), stripped; ``""`` when none."""
    tail = response[-TAIL_CHARS:]
    answer, line_end = _last_answer_line(tail)
    if answer and _last_box_start(tail) < line_end:
        return answer
    return _last_boxed_content(tail).strip() or answer


def _last_answer_line(text: str) -> tuple[str, int]:
    """The text of the last Answer line and where that line ends (``("", -1)`` when there is none)."""
    marker_end = _last_marker_end(text)
    if marker_end < 0:
        return "", -1
    # "Answer:\n42" and "**Answer:** 42" both mean 42: skip blanks and markdown before taking the line.
    rest = text[marker_end:].lstrip(" \t\r\n*")
    line = rest.partition("\n")[0]
    return line.strip().strip("*").strip(), len(text) - len(rest) + len(line)


def _last_marker_end(text: str) -> int:
    """End of the last ``answer[ \\t]*:`` (any case), searching backwards with ``rfind`` (C speed)."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower-case to two ("İ"): positions would shift
        last = None
        for last in _ANSWER_MARKER.finditer(text):
            pass
        return last.end() if last else -1
    end = len(lowered)
    while (start := lowered.rfind("answer", 0, end)) >= 0:
        i = start + len("answer")
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] in ":\uff1a":
            return i + 1
        end = start
    return -1


def _last_box_start(text: str) -> int:
    return max(text.rfind(command) for command in _BOX_COMMANDS)


def _last_boxed_content(text: str) -> str:
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return ""
    i = start + len(command)
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return ""
    if text[i] != "{":  # "\boxed 5": the next word
        return text[i:].split(None, 1)[0].split("$", 1)[0] if text[i] not in "\n\\" else ""
    depth = 0
    for brace in _BRACE.finditer(text, i):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i + 1 : brace.start()]
    return ""  # unclosed box (truncated response): no answer


# --- normalisation -------------------------------------------------------------------------------------

_JUNK_CHARACTERS = {c: None for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, 0xFFFD]}
_SURROGATE = re.compile("[\ud800-\udfff]")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|textup|mathrm|mathbf|mathit|mathsf|mathtt|mbox|operatorname)"
    r"\s*\{([^{}]*)\}"
)
_DROPPED = (
    "\\displaystyle",
    "\\qquad",
    "\\quad",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "~",
    "^{\\circ}",
    "^\\circ",
    "\\circ",
    "\\degree",
    "°",
    "\\%",
    "%",
    "**",
)
_VARIABLE = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?")
_NUMBER_WITH_WORDS = re.compile(r"([+-]?[\d.,]*\d)\s+[A-Za-z]{2,}\.?(?:\s+[A-Za-z]+\.?)*(?:\^\{?\d\}?)?")
_FRAC_DIGIT_DIGIT = re.compile(r"\\frac(\d)(\d)")
_FRAC_DIGIT_BRACE = re.compile(r"\\frac(\d)\{")
_FRAC_BRACE_DIGIT = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_DIGIT = re.compile(r"\\sqrt(\d)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_INTEGER = re.compile(r"([+-]?)0*(\d+)")


def normalize_answer(answer: str) -> str:
    """Canonical string form of an answer (rules in the module docstring); ``""`` stays ``""``."""
    return _canonical(_clean(answer))


def _clean(answer: str) -> str:
    """Normalisation that keeps spaces (the form math-verify reads: ``\\pi r`` must not become ``\\pir``)."""
    s = _SURROGATE.sub("", answer.translate(_JUNK_CHARACTERS))
    if "\\boxed" in s or "\\fbox" in s:
        s = _last_boxed_content(s) or s
    s = s.replace("\\$", "")
    s = _LEFT_RIGHT.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT_WRAPPER.sub(r"\1", s)
    s = s.replace("\\(", "$").replace("\\)", "$").replace("\\[", "$").replace("\\]", "$").replace("$$", "$")
    parts = s.split("$")
    if len(parts) >= 3:  # prose with math in it: the last non-empty math segment is the answer
        segments = [p for p in parts[1::2] if p.strip()]
        s = segments[-1] if segments else ""
    s = s.replace("$", "")
    for token in _DROPPED:
        s = s.replace(token, "")
    s = s.replace("{,}", ",").strip().rstrip(".,;:").strip()
    if "=" in s:
        lhs, _, rhs = s.rpartition("=")
        if as_rational(_canonical(rhs)) is not None or (s.count("=") == 1 and _VARIABLE.fullmatch(lhs.strip())):
            s = rhs.strip()
    words = _NUMBER_WITH_WORDS.fullmatch(s)
    if words:
        s = words.group(1)
    return s


def _canonical(cleaned: str) -> str:
    s = "".join(cleaned.split()).rstrip(".,;:")
    s = _FRAC_DIGIT_DIGIT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_DIGIT_BRACE.sub(r"\\frac{\1}{", s)
    s = _FRAC_BRACE_DIGIT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_DIGIT.sub(r"\\sqrt{\1}", s)
    for _ in range(3):
        if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _braces_balanced(s[1:-1]):
            s = s[1:-1]
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    integer = _INTEGER.fullmatch(s)
    if integer:
        sign, digits = integer.groups()
        s = ("-" if sign == "-" and digits != "0" else "") + digits
    return s


def _braces_balanced(s: str) -> bool:
    depth = 0
    for brace in _BRACE.finditer(s):
        depth += 1 if brace.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


# --- comparison ----------------------------------------------------------------------------------------

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER = re.compile(_NUMBER)
_SLASH_FRACTION = re.compile(rf"({_NUMBER})/({_NUMBER})")
_LATEX_FRACTION = re.compile(rf"([+-]?)\\frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}")
# Commands that keep an expression a number: "2^{10}", "\sqrt{16}", "5\times10^3" may equal an integer.
_NUMERIC_COMMANDS = re.compile(r"\\(?:frac|sqrt|cdot|times|div|binom|dbinom|tbinom)(?![A-Za-z])")
_NOT_ARITHMETIC = re.compile(r"[^0-9.+\-*/^()\[\]{}!]")


def as_rational(normalized: str) -> Fraction | None:
    """The exact value of a normalised integer, decimal, ``a/b`` or ``\\frac{a}{b}``; else ``None``.

    >>> as_rational("-\\\\frac{3}{4}"), as_rational("0.50"), as_rational("\\\\sqrt{2}")
    (Fraction(-3, 4), Fraction(1, 2), None)
    """
    s = normalized
    if not s or len(s) > _MAX_RATIONAL_CHARS:
        return None
    try:
        if _PLAIN_NUMBER.fullmatch(s):
            return Fraction(s)
        slash = _SLASH_FRACTION.fullmatch(s)
        if slash:
            return Fraction(slash.group(1)) / Fraction(slash.group(2))
        latex = _LATEX_FRACTION.fullmatch(s)
        if latex:
            sign, numerator, denominator = latex.groups()
            value = Fraction(numerator) / Fraction(denominator)
            return -value if sign == "-" else value
    except ZeroDivisionError:
        return None
    return None


def _is_arithmetic_of_numbers(normalized: str) -> bool:
    """True when the answer has digits and, besides numeric commands, only digits, operators and brackets."""
    without_commands = _NUMERIC_COMMANDS.sub("", normalized)
    return any(c.isdigit() for c in normalized) and not _NOT_ARITHMETIC.search(without_commands)


def numeric_value(normalized: str) -> arithmetic.Number | None:
    """The value of a normalised answer that is a number or arithmetic on numbers; ``None`` otherwise."""
    value = as_rational(normalized)
    if value is None and len(normalized) <= MAX_SYMBOLIC_CHARS and _is_arithmetic_of_numbers(normalized):
        return arithmetic.evaluate(normalized)
    return value


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification.

    ``method`` says which rule decided: ``exact``, ``numeric``, ``symbolic``, ``mismatch`` (no rule found
    them equal), ``no_answer`` or ``error``.
    """

    correct: bool
    pred: str
    method: str
    error: str = ""

    @property
    def score(self) -> float:
        return 1.0 if self.correct else -1.0


def ground_truth_answers(ground_truth: Any) -> list[str]:
    """The acceptable answers as strings: ``42`` -> ``["42"]``; a list/tuple/array -> one string per item."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, bytes):
        return [ground_truth.decode("utf-8", errors="replace")]
    if isinstance(ground_truth, str):
        return [ground_truth]
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, (int, float)):
        ground_truth = ground_truth.tolist()  # numpy scalars and arrays
    if isinstance(ground_truth, (list, tuple)):
        return [answer for item in ground_truth for answer in ground_truth_answers(item)]
    return [str(ground_truth)]


def verify(
    response: Any, ground_truth: Any, *, symbolic_check: bool | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Verdict:
    """Score one response against its ground truth (rules in the module docstring); never raises.

    ``symbolic_check``: ``None`` uses math-verify when it is installed, ``True`` requires it (its absence is
    reported in ``Verdict.error``), ``False`` never uses it. ``timeout_s`` limits each symbolic check.
    """
    pred = ""
    try:
        text = response if isinstance(response, str) else _as_text(response)
        pred = extract_answer(text)
        if not pred:
            return Verdict(False, "", "no_answer")
        answers = ground_truth_answers(ground_truth)
        verdict = Verdict(False, _cut(pred), "mismatch")
        for answer in answers:
            verdict = _compare(pred, answer, symbolic_check, timeout_s)
            if verdict.correct:
                return verdict
        return verdict
    except Exception as error:  # a bug or a pathological input must cost one sample, never the run
        logger.warning("answer verification failed; scoring -1", exc_info=True)
        return Verdict(False, _cut(pred), "error", _cut(f"{type(error).__name__}: {error}"))


def _compare(pred: str, answer: str, symbolic_check: bool | None, timeout_s: float) -> Verdict:
    reported = _cut(pred)
    pred_clean, answer_clean = _clean(pred), _clean(answer)
    pred_norm, answer_norm = _canonical(pred_clean), _canonical(answer_clean)
    if not pred_norm:
        return Verdict(False, reported, "no_answer")
    if pred_norm == answer_norm:
        return Verdict(True, reported, "exact")
    pred_value, answer_value = numeric_value(pred_norm), numeric_value(answer_norm)
    close_but_inexact = False
    if pred_value is not None and answer_value is not None:
        if isinstance(pred_value, Fraction) and isinstance(answer_value, Fraction):
            return Verdict(pred_value == answer_value, reported, "numeric")
        if not arithmetic.close_to(pred_value, answer_value):
            return Verdict(False, reported, "numeric")
        close_but_inexact = True  # e.g. \sqrt{2}\sqrt{8} vs 4: confirm symbolically when possible
    elif isinstance(answer_value, Fraction) and not _is_arithmetic_of_numbers(pred_norm):
        return Verdict(False, reported, "mismatch")  # a variable, \pi, a tuple or a set is not this number
    if len(pred_clean) > MAX_SYMBOLIC_CHARS or len(answer_clean) > MAX_SYMBOLIC_CHARS or not answer_norm:
        return Verdict(False, reported, "mismatch")
    use_symbolic = symbolic.math_verify_installed() if symbolic_check is None else symbolic_check
    if not use_symbolic:
        return Verdict(close_but_inexact, reported, "numeric" if close_but_inexact else "mismatch")
    equal, error = _symbolic_equal(answer_clean, pred_clean, float(timeout_s))
    if error:
        return Verdict(False, reported, "error", _cut(error))
    return Verdict(equal, reported, "symbolic" if equal else "mismatch")


@functools.lru_cache(maxsize=8192)
def _symbolic_equal(gold: str, pred: str, timeout_s: float) -> tuple[bool, str]:
    """Cached (a group of 16 often repeats an answer); time-outs are cached too, so a bad answer hangs once."""
    try:
        return symbolic.default_checker().equivalent(gold, pred, timeout_s=timeout_s), ""
    except symbolic.SymbolicCheckError as error:
        return False, str(error)


def clear_symbolic_cache() -> None:
    """Forget cached symbolic verdicts (benchmarks measure cold runs)."""
    _symbolic_equal.cache_clear()


def symbolic_checks_run() -> int:
    """How many symbolic checks this process has sent to math-verify since the cache was last cleared."""
    return _symbolic_equal.cache_info().misses


def _as_text(response: Any) -> str:
    if response is None:
        return ""
    if isinstance(response, bytes):
        return response.decode("utf-8", errors="replace")
    return str(response)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REPORTED_CHARS else text[: MAX_REPORTED_CHARS - 1] + "\u2026"


def compute_score(
    data_source: Any,
    solution_str: Any,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    symbolic_check: bool | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **_verl_kwargs: Any,
) -> dict:
    """verl's custom-reward signature: ``{"score": +1/-1, "acc": bool, "pred": str, "verify_error": str}``.

    ``data_source`` and ``extra_info`` are not used (every source is a math answer). verl may pass
    ``reward_router_address``/``reward_model_tokenizer``; they are ignored. Plug it in with
    ``reward.custom_reward_function.path=pkg://recipe_dapo.reward`` (name ``compute_score``); set
    ``symbolic_check``/``timeout_s`` through ``reward.custom_reward_function.reward_kwargs``.
    """
    verdict = verify(solution_str, ground_truth, symbolic_check=symbolic_check, timeout_s=timeout_s)
    return {"score": verdict.score, "acc": verdict.correct, "pred": verdict.pred, "verify_error": verdict.error}
