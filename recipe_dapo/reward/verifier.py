"""DAPO's rule-based answer verifier (paper section 2.4): +1 when the final answer equals the ground truth, else -1.

Pure Python (``re`` and ``fractions``); math-verify is used only for the symbolic step, in a child process
(see :mod:`recipe_dapo.reward.symbolic`). False positives are worse than misses (a wrong answer scored right
teaches the policy to cheat), so every rule below that could accept is exact or bounded, and anything
undecided goes to the symbolic step or is wrong.

Extraction (:func:`extract_answer`), on the whole response: a last line ``Answer: X`` at once (the DAPO
prompt's format), else its last 512 characters first, the rest only when they hold no decisive answer (a box
or a strong Answer line) and a ``str.rfind`` finds a marker in it, so a response without any marker costs a
few C-speed scans whatever its length (the reward manager first decodes only the last ``TAIL_CHARS``
characters and decodes more only when they hold no answer). Text from the
first chat special token on (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ``</s>``)
is not part of the response.

1. the Answer line: the text after the last ``Answer:`` (any case, full-width colon too; ``Answer $...$``,
   ``Answer \\[...\\]`` without a colon too), from the first non-blank character to the end of that line, or
   to the end of a display-math block it opens; markdown ``**`` around the marker is skipped::

       "... so x = 7.\\n\\nAnswer: 42"        -> "42"
       "**Answer:** $\\frac{3}{4}$"         -> "$\\frac{3}{4}$"
       "Answer:\\n17"                        -> "17"

   The marker is *strong* when it starts its line (after markdown, ``Final``, ``The final``) and *weak*
   inside a sentence (``"so our answer: 5?"``, ``"the answer is 5"``). Without any ``answer:``, the last
   ``answer is ...`` or math right before ``is our/the/my (final) answer`` is a weak Answer line
   (``"Thus $x \\leq 2$ is our answer."`` -> ``"$x \\leq 2$"``; ``"so 5 is the answer"`` stays unread).
2. the last box, ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched; an unclosed last box gives nothing),
   when there is no Answer line, when the box starts after the Answer line, or when the last marker is weak
   (``"\\boxed{7}. Checking the answer: it works."`` -> ``7``). Boxes separated only by commas, ``and``,
   ``or``, spaces, math delimiters or the name of the next one (``y_2 =``) are one answer:
   ``"\\boxed{1}, \\boxed{2}"`` -> ``"1, 2"``.
3. otherwise no answer: ``pred == ""`` and the sample scores -1 (no guessing from free text).

Normalisation (:func:`normalize_answer`), applied to prediction and ground truth alike:

- control characters, U+FFFD, lone surrogates, invisible characters (zero-width spaces and joiners, BOM,
  soft hyphen, direction marks) and emoji are dropped; full-width ASCII becomes ASCII; ``−`` (U+2212)
  becomes ``-``; ``×``, ``÷``, ``·``, ``π``, ``√``, ``∞``, ``≤``, ``≥``, ``≠`` become their LaTeX commands;
- boxes inside the answer are unwrapped (several joined as above); ``\\$`` (currency), ``\\left``/``\\right``,
  markdown ``**`` are dropped; ``\\dfrac``/``\\tfrac``/``\\cfrac`` become ``\\frac``; a unit in ``\\text{}``,
  ``\\mathrm{}`` ... at the end goes (``5\\text{ meters}`` -> ``5``), other ``\\text{X}`` become ``X``;
  ``\\geq``/``\\ge``/``>=`` become ``>=``, likewise ``<=`` and ``!=``;
- a sentence (two words or more around the math): up to the first full stop that is followed by more text
  (``"... is 14400. I hope it is correct."``), the text after ``answer is`` when present, else whichever comes
  last of the last math segment and the last number (``"The largest $n$ is 34."`` -> ``34``, ``"Therefore $x
  \\geq 5$ is the solution."`` -> ``x>=5``);
- math delimiters: with ``$...$`` (or ``\\(...\\)``, ``\\[...\\]``) present, the last math segment is the answer;
- spacing commands, degree marks (``^\\circ``, ``°``) and percent signs are dropped; ``{,}`` (``{, }`` too)
  becomes ``,``;
- a number followed by words is the number (``"12 cm"`` -> ``12``, ``"5 square feet"`` -> ``5``);
- all whitespace and a trailing ``.``, ``,``, ``;`` or ``:`` are removed; ``\\frac12`` -> ``\\frac{1}{2}``,
  ``\\sqrt2`` -> ``\\sqrt{2}``; up to three layers of redundant outer braces are removed;
- thousands separators go when written without spaces and not after a leading 0 (``1,000,000`` -> ``1000000``;
  ``32, 349`` is a list of two numbers, ``0,111`` is no number), then a leading ``+`` and the leading zeros
  of an integer (``042`` -> ``42``, ``-007`` -> ``-7``): these two steps are the data converters' own rules 4
  and 5, from their one implementation in :mod:`recipe_dapo.data.answers`.

Comparison (:func:`verify`), first rule that decides wins:

1. equal normalised strings -> correct;
2. equations: ``v = value`` (``v`` a variable such as ``x`` or ``a_1``, or arithmetic on numbers; chains
   ``x = 2 + 3 = 5`` and ``x \\approx 11`` too) is compared by its value when the other side is not an
   equation (``x = 5`` vs ``5``); an equation such as ``a + 3z = 0`` is never its right-hand side, nor is a
   list of equations ``x = -5, p = 14/3`` a chain (its items are compared by their values);
3. lists: tuples and intervals ``(1, 4.5)``, ``[0, 1)`` element by element in order with the same brackets;
   sets ``\\{1, 2\\}`` and bare lists ``1, 2, 3`` as multisets (a set of tuples that lists one tuple twice
   is that set; numbers are never deduplicated); a list never equals a single value. Ground truths only
   (they are trusted): several boxes joined by ``and``/``or`` after at most one word, or several math
   segments joined by ``and``/``or``/commas, are one list (``\\boxed{1} papers and \\boxed{2} bins`` ->
   ``1, 2``; a repeated box is one answer), and ``p=5,q=2;p=7,q=2`` is the tuples ``(5,2),(7,2)``;
4. numbers or arithmetic on numbers (integer, decimal, ``a/b``, ``\\frac{a}{b}``, ``2^{10}``, ``3\\sqrt{2}``,
   ``\\pi``; see :mod:`recipe_dapo.reward.arithmetic`) by value: exactly when both are exact (``0.5`` =
   ``\\frac{1}{2}``, ``10^{2000}`` != ``10^{2001}``); a decimal with six decimal places or more also equals a
   value it rounds or truncates (``0.0833333`` = ``\\frac{1}{12}``, but ``0.333`` != ``\\frac{1}{3}`` and
   ``0.5000001`` != ``0.5``); a float value (irrational root, ``\\pi``) within 1e-9 relative is confirmed by
   the symbolic step (or counts as right without it); values too large for a float are undecided;
5. expressions in single-letter variables (``x + x`` = ``2x``, ``(x+1)^2`` = ``x^2+2x+1``) by exact
   evaluation at two fixed rational points (see :func:`recipe_dapo.reward.arithmetic.identical`);
6. ground truth a number but the prediction is not arithmetic on numbers (a variable, a tuple) -> wrong;
7. the symbolic check with math-verify (``symbolic_check=None`` means "when installed"; it is in every
   install the README gives): everything the rules above leave undecided. Without it such an answer is
   wrong and ``Verdict.symbolic_skipped`` is set (``reward/symbolic_skipped_count``); the first one logs a
   warning.

Time limit: steps 1-6 use no regular expression with nested quantifiers, scan each character a bounded number
of times and evaluate arithmetic under size limits, so their time is bounded by construction (tens of
microseconds; see ``bench/reward_throughput.py``). Only step 7 can run away (sympy), so it runs in a child
process killed at ``timeout_s``, the time limit of the *whole* call (measured from its start; waiting for a
free checker and killing a runaway one included). A
time-out or any other failure scores -1 and is reported in ``Verdict.error`` / ``verify_error`` (time-outs
start with ``time-out``); it is never cached. ``verify`` never raises.

Ground truths may be ``int``, ``float``, ``str``, UTF-8 ``bytes``, or a non-empty list/tuple/array of those
(any of them is accepted). Anything else (a dict, ``None``, an empty string, bytes that are not UTF-8) is a
*malformed* ground truth: the sample scores -1 with ``verify_error`` saying what is wrong, and the first few
are logged.
"""

from __future__ import annotations

import functools
import logging
import numbers
import re
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from recipe_dapo.data.answers import canonical_integer, without_thousands_separators
from recipe_dapo.reward import arithmetic, symbolic
from recipe_dapo.reward.failures import FailureLog

logger = logging.getLogger(__name__)

TAIL_CHARS = 2000
"""The reward manager decodes this many characters from the end first (and the whole response when they
hold no answer)."""

DEFAULT_TIMEOUT_S = 2.0
"""Wall-clock limit of one whole verification; only its symbolic step could run away, and it gets what is
left, waiting for a free checker and killing a runaway checker included (``symbolic.KILL_RESERVE_S``). Set
per run with ``reward.reward_kwargs.verify_timeout_s``."""

MAX_SYMBOLIC_CHARS = 300
"""Longer answers are not sent to math-verify (parsing cost grows fast with length); they count as wrong."""

MAX_REPORTED_CHARS = 256
"""``pred`` and ``verify_error`` are cut to this length: verl stores them in fixed-width numpy string arrays."""

MAX_ANSWER_CHARS = 1000
"""An Answer line or display block longer than this is cut, and a box whose braces do not close within it
gives no answer: bounds the work on a runaway answer (normalising 4,000 characters cost about 1 ms). The
longest MATH-500 answer has 159 characters; verl's ``math_dapo`` reads only the last 300 of a response."""

MAX_JOINED_BOXES = 32
"""At most this many adjacent boxes are read as one list answer."""

_MAX_RATIONAL_CHARS = 64  # longer "numbers" are compared as strings (and stay clear of int-parsing limits)
_MIN_APPROXIMATION_PLACES = 6

_verification_failures = FailureLog(logger, "answer verification failed; scored -1")
_malformed_ground_truths = FailureLog(logger, "malformed ground truth; scored -1")
_symbolic_failures = FailureLog(logger, "symbolic check failed or timed out; scored -1")

# --- extraction ----------------------------------------------------------------------------------------

_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>")
_SPECIAL_TOKEN_START = re.compile(r"<(?:\||/s>)")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE = re.compile(r"[{}]")
_MATH_OPENERS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}
_DISPLAY_MATH = {"$$": "$$", "\\[": "\\]"}
_STRONG_PREFIXES = ("", "the final", "my final", "final")
_MAX_BOX_GAP = 80
# "Answer:" (group 1: the colon) or "Answer $...$", "Answer \[...\]" (group 2: the math opener, kept)
_ANSWER_MARKER = re.compile(r"answer[ \t*]*(?:([:\uff1a])|(\$|\\\[|\\\())", re.IGNORECASE)
_ANSWER_PHRASE = re.compile(r"answer[ \t]+is[ \t:]", re.IGNORECASE)
# "$x \leq 2$ is our answer" (searched just before a found "answer", so "$" is the end of that window)
_MATH_BEFORE_ANSWER = re.compile(
    r"\$([^$]{1,300})\$[ \t]+is[ \t]+(?:(?:the|our|my)[ \t]+)(?:final[ \t]+)?$", re.IGNORECASE
)
_STATEMENT_END = re.compile(r"[ \t*]*(?:[.!]|\n|$)")
_CONDITION = re.compile(r"\b(?:if|whether|check|verify|suppose|assume|assuming)\b", re.IGNORECASE)
# A last line that is a strong Answer line (rule 1): "Answer: 42", "**Final Answer:** $x$", "The final answer: 7"
# (the prefixes of _STRONG_PREFIXES exactly: "the  final" with two spaces is weak there, so it is left out here)
_STRONG_LAST_LINE = re.compile(
    r"[ \t*#>_-]*(?:(?:the |my )?final[ \t]*)?answer[ \t*]*[:\uff1a](.*)", re.IGNORECASE
)
_ANSWER_SPELLINGS = ("nswer", "NSWER")  # after "a" or "A"
_MAX_LIST_CHARS = 2000
_FIRST_WINDOW_CHARS = 512
_MAX_MARKER_CANDIDATES = 1000
# Between adjacent boxes of one list answer: blanks, commas, "and"/"or", math delimiters, spacing commands.
_BOX_SEPARATOR = re.compile(
    r"(?:\s|[,;$]|\\[\[\]()]|\\q?quad|\\[,;:! ]|and|or|\\text\{\s*(?:and|or|,)?\s*\}|&"
    r"|[a-z](?:_\{?[a-z0-9]+\}?)?\s*=)*",  # "\boxed{1} \) and \( y_2 = \boxed{2}": the second one's name
    re.IGNORECASE,
)


def extract_answer(response: str) -> str:
    """The answer written in ``response`` (rules in the module docstring), stripped; ``""`` when none.

    Most answers are on the last line, so the last ``_FIRST_WINDOW_CHARS`` characters are read first; the
    whole response only when they hold no decisive answer, and then only after four ``str.rfind`` calls
    found a marker in it (a response without any is answered at C speed, whatever its length). Where they
    were found is reused when no special token cuts the response: each long scan is done once."""
    last_line = _last_answer_line_fast(response)
    if last_line:
        return last_line
    if len(response) > _FIRST_WINDOW_CHARS:
        answer, decisive = _extract(_before_special_tokens(response[-_FIRST_WINDOW_CHARS:]))
        if decisive:
            return answer
        marks = _Marks.of(response)
        if marks.none():
            return answer
        text = _before_special_tokens(response)
        return _extract(text, marks if text is response else None)[0]
    return _extract(_before_special_tokens(response))[0]


def _last_answer_line_fast(response: str) -> str:
    """The DAPO prompt's own format, at once: the last line is a strong ``Answer: X`` with no other marker
    and no special token near it. Then rule 1 gives ``X`` whatever comes before (a box before a strong
    Answer line loses to it), so this is :func:`_extract`'s answer for the few cases it accepts; ``""``
    means "not this case", never "no answer"."""
    line_start = response.rfind("\n") + 1
    if len(response) - line_start > MAX_ANSWER_CHARS:
        return ""
    line = _STRONG_LAST_LINE.fullmatch(response, line_start)
    if line is None:
        return ""
    content = line.group(1)
    if "nswer" in content or "NSWER" in content:
        return ""  # another marker in the line: the general rules
    if _SPECIAL_TOKEN_START.search(response, max(0, len(response) - _FIRST_WINDOW_CHARS)):
        return ""
    return content.lstrip(" \t\r\n*").strip().strip("*").strip()


@dataclass(slots=True)
class _Marks:
    """The last ``nswer``/``NSWER`` (the cursors of :func:`_answer_words`) and the last box of a text."""

    words: list[int]
    box: int

    @classmethod
    def of(cls, text: str) -> _Marks:
        return cls([text.rfind(spelling) for spelling in _ANSWER_SPELLINGS], _last_box_start(text))

    def none(self) -> bool:
        return self.box < 0 and max(self.words) < 0


def _extract(text: str, marks: _Marks | None = None) -> tuple[str, bool]:
    """The answer in ``text`` and whether a text extending further back could not change it (it comes
    from a box or a strong Answer line). ``marks``: :meth:`_Marks.of` ``text``, when already known."""
    marks = marks or _Marks.of(text)
    line, marker_start, line_end, strong = _last_answer_line(text, marks.words)
    box_start = marks.box
    if line and (box_start < 0 or marker_start <= box_start < line_end or (strong and box_start < marker_start)):
        return line, strong or box_start >= 0
    boxed, first = _boxed_with_start(text, box_start)
    if boxed:
        return boxed, not _may_continue_a_list(text, first)
    return line, False


def _may_continue_a_list(text: str, first: int) -> bool:
    """Whether a box that started before ``text`` could end just before the box at ``first`` and so belong
    to its list: a ``}`` separated from it only by list separators."""
    brace = text.rfind("}", max(0, first - _MAX_BOX_GAP), first)
    return first == 0 or (brace >= 0 and bool(_BOX_SEPARATOR.fullmatch(text, brace + 1, first)))


def _before_special_tokens(text: str) -> str:
    for candidate in _SPECIAL_TOKEN_START.finditer(text):  # one pass (two "in" tests took 7 times longer)
        if text.startswith(_SPECIAL_TOKENS, candidate.start()):
            return text[: candidate.start()]
    return text


def _answer_words(text: str, last: list[int]):
    """Where ``answer`` (lower, title or upper case) starts in ``text``, last first: ``str.rfind`` cursors
    for ``nswer`` and ``NSWER`` merged (``last``: where each was found last), so the text is read at C speed
    and never copied (``text.lower()`` of a 70k-character response costs more than a whole verification)."""
    cursors = list(last)
    for _ in range(_MAX_MARKER_CANDIDATES):
        which = 0 if cursors[0] >= cursors[1] else 1
        position = cursors[which]
        if position < 0:
            return
        if position > 0 and text[position - 1] in "aA":
            yield position - 1
        cursors[which] = text.rfind(_ANSWER_SPELLINGS[which], 0, position)


def _last_answer_line(text: str, last_words: list[int]) -> tuple[str, int, int, bool]:
    """The last Answer line: (its text, where its marker starts, where it ends, whether the marker is strong);
    ``("", -1, -1, False)`` when the last marker has no answer after it or there is none. The marker is the
    last ``answer:`` (or ``Answer $``); only when there is none, the last ``answer is`` or ``$...$ is our
    answer`` (always weak)."""
    last = phrase = None
    for position in _answer_words(text, last_words):
        last = _ANSWER_MARKER.match(text, position)
        if last:
            break
        if phrase is None:
            phrase = _ANSWER_PHRASE.match(text, position) or _math_before_answer_word(text, position)
    if last is None and phrase is None:
        return "", -1, -1, False
    if last is None:
        if isinstance(phrase, tuple):  # "Thus $x \leq 2$ is our answer."
            return phrase
        last = phrase
        line, line_end = _line_from(text, phrase.end())
    else:
        line, line_end = _line_from(text, last.end() if last.group(1) else last.end() - len(last.group(2)))
    if not line:
        return "", -1, -1, False
    start = last.start()
    line_start = text.rfind("\n", 0, start) + 1
    prefix = text[line_start:start].strip(" \t*#>-_").lower()
    for word in _STRONG_PREFIXES[1:]:
        prefix = prefix[: -len(word)].rstrip() if prefix.endswith(word) else prefix
    # strong: the marker starts its line or a sentence ("... = $10,455. Final Answer: ...")
    return line, start, line_end, last is not phrase and (prefix == "" or prefix[-1] in ".!?")


def _math_before_answer_word(text: str, position: int) -> tuple[str, int, int, bool] | None:
    """``$x \\leq 2$ is our answer`` (``is the answer``, ``is my final answer``) ending at ``position``:
    the math, as a weak Answer line that starts at its ``$``; ``None`` otherwise. Only math right before
    the phrase counts: ``"so 5 is the answer"`` in prose stays unread (no guessing from free text). The
    phrase must end its sentence with ``.``, ``!`` or a line end, and the sentence must not ask (``"Check
    whether $5$ is the answer."``, ``"If $5$ is the answer, ..."``, ``"$5$ is the answer?"``)."""
    end = position + len("answer")
    if not _STATEMENT_END.match(text, end):
        return None
    match = _MATH_BEFORE_ANSWER.search(text, max(0, position - _MAX_BOX_GAP - MAX_SYMBOLIC_CHARS), position)
    if match is None:
        return None
    sentence_start = max(text.rfind(". ", 0, match.start()), text.rfind("\n", 0, match.start()), 0)
    if _CONDITION.search(text, sentence_start, match.start()):
        return None
    return "$" + match.group(1) + "$", match.start(), end, False


def _line_from(text: str, i: int) -> tuple[str, int]:
    """The answer that starts at ``text[i]``: the rest of the line after blanks and markdown (the next line
    when this one is empty), or a whole display-math block it opens; and where it ends."""
    while i < len(text) and text[i] in " \t\r\n*":
        i += 1
    newline = text.find("\n", i, i + MAX_ANSWER_CHARS)
    end = newline if newline >= 0 else min(len(text), i + MAX_ANSWER_CHARS)
    for opener, closer in _DISPLAY_MATH.items():
        if text.startswith(opener, i):
            close = text.find(closer, i + len(opener), i + MAX_ANSWER_CHARS)
            if close > end:  # a display block spans lines: "Answer:\n\\[\n9\n\\]" (inline math does not)
                end = close + len(closer)
            break
    return text[i:end].strip().strip("*").strip(), end


def _last_box_start(text: str, end: int | None = None) -> int:
    """Where the last box command before ``end`` starts (-1: none); only the ``MAX_ANSWER_CHARS`` (and a
    gap) before ``end`` are searched when ``end`` is given: an earlier box could not end next to it."""
    begin = 0 if end is None else max(0, end - MAX_ANSWER_CHARS - 2 * _MAX_BOX_GAP)
    return max(text.rfind(command, begin, end) for command in _BOX_COMMANDS)


def _box_at(text: str, start: int) -> tuple[str, int] | None:
    """Content and end of the box starting at ``start``; ``None`` when its braces do not close."""
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(command)
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5": the next word
        if text[i] in "\n\\":
            return None
        word = text[i:].split(None, 1)[0].split("$", 1)[0]
        return word, i + len(word)
    close = _matching_brace(text, i, min(len(text), i + MAX_ANSWER_CHARS))
    if close < 0:
        return None  # unclosed box (truncated response): no answer
    return text[i + 1 : close], close + 1


def _matching_brace(text: str, i: int, end: int) -> int:
    """Where the ``}`` that closes the ``{`` at ``text[i]`` is, before ``end``; -1 when it is not. Jumps from
    ``}`` to ``}`` with ``str.find`` and counts the ``{`` in between with ``str.count`` (C speed)."""
    opened, closed, j = 0, 0, i
    while True:
        close = text.find("}", j, end)
        if close < 0:
            return -1
        opened += text.count("{", j, close)
        closed += 1
        if closed == opened:
            return close
        j = close + 1


def boxed_answer(text: str) -> str:
    """The content of the last box, with the boxes just before it that form one list (``"1, 2"``); ``""``
    when there is no closed last box."""
    return _boxed_with_start(text, _last_box_start(text))[0]


def _boxed_with_start(text: str, start: int) -> tuple[str, int]:
    """:func:`boxed_answer` of the box at ``start`` (the last one) and where the first box of its list
    starts (-1 when there is none)."""
    if start < 0:
        return "", -1
    box = _box_at(text, start)
    if box is None:
        return "", -1
    contents = [box[0].strip()]
    while len(contents) < MAX_JOINED_BOXES:
        previous = _last_box_start(text, start)
        if previous < 0:
            break
        earlier = _box_at(text, previous)
        if earlier is None or not 0 <= start - earlier[1] <= _MAX_BOX_GAP:
            break
        if not _BOX_SEPARATOR.fullmatch(text, earlier[1], start):
            break
        contents.insert(0, earlier[0].strip())
        start = previous
    return ", ".join(contents), start

# --- normalisation -------------------------------------------------------------------------------------

_JUNK_CHARACTERS: dict[int, Any] = {c: None for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, 0xFFFD]}
_JUNK_CHARACTERS.update({c: None for c in [0x00AD, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2065), 0xFEFF]})
_JUNK_CHARACTERS.update({c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)})  # full-width ASCII
_JUNK_CHARACTERS.update({
    0x2212: "-", 0x00D7: "\\times ", 0x00F7: "\\div ", 0x00B7: "\\cdot ", 0x22C5: "\\cdot ", 0x03C0: "\\pi ",
    0x221A: "\\sqrt", 0x221E: "\\infty ", 0x2264: "<=", 0x2265: ">=", 0x2260: "!=", 0x00A0: " ", 0x3000: " ",
})
_DROPPED_RANGES = re.compile("[\ud800-\udfff\u2600-\u27bf\ufe00-\ufe0f\U0001f000-\U0001faff]")  # surrogates, emoji
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_WRAPPERS = r"\\(?:text|textbf|textit|textrm|textnormal|textup|mathrm|mathbf|mathit|mathsf|mathtt|mbox|operatorname)"
_TEXT_WRAPPER = re.compile(_WRAPPERS + r"\s*\{([^{}]*)\}")
# A unit at the end: "5\text{ meters}", "3\mathrm{cm}^2" (not "1\text{ and }2", not a lone "\text{A}").
_UNIT_AT_END = re.compile(r"(?<=[\d}.])\s*" + _WRAPPERS + r"\s*\{\s*(?!and\b|or\b)[A-Za-z][A-Za-z .]*\}(?:\^\{?[23]\}?)?(?=\s*\$?\s*$)")
_RELATIONS = ((re.compile(r"\\(?:geq|geqslant|ge)(?![A-Za-z])"), ">="), (re.compile(r"\\(?:leq|leqslant|le)(?![A-Za-z])"), "<="),
              (re.compile(r"\\(?:neq|ne)(?![A-Za-z])"), "!="))
_DROPPED = (
    "\\displaystyle", "\\qquad", "\\quad", "\\!", "\\,", "\\;", "\\:", "~", "^{\\circ}", "^\\circ",
    "\\circ", "\\degree", "°", "\\%", "%", "**",
)
_ESCAPED_SPACE = re.compile(r"(?<!\\)\\ ")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[A-Za-z*]*\}")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_PROSE_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?")
_SENTENCE_END = re.compile(r"[.!?]\s+(?=[A-Z(])")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?", re.IGNORECASE)
_NUMBER_WITH_WORDS = re.compile(r"([+-]?[\d.,]*\d)\s+[A-Za-z]{2,}\.?(?:\s+[A-Za-z]+\.?)*(?:\^\{?\d\}?)?")
_FRAC_DIGIT_DIGIT = re.compile(r"\\frac(\d)(\d)")
_FRAC_DIGIT_BRACE = re.compile(r"\\frac(\d)\{")
_FRAC_BRACE_DIGIT = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_DIGIT = re.compile(r"\\sqrt(\d)")
_BRACED_COMMA = re.compile(r"\{\s*,\s*\}")  # "14{,}916", "14 {, }916": a comma without LaTeX's space
_COMMA_SPACE = re.compile(r",\s")
_THIN_SPACE_THOUSANDS = re.compile(r"(?:,|\{,\})\\!\s*(?=\d{3})")


def normalize_answer(answer: str) -> str:
    """Canonical string form of an answer (rules in the module docstring); ``""`` stays ``""``."""
    return _canonical(_clean(answer))


def _clean(answer: str) -> str:
    """Normalisation that keeps spaces (the form math-verify reads: ``\\pi r`` must not become ``\\pir``)."""
    s = answer.translate(_JUNK_CHARACTERS)
    if not s.isascii():
        s = _DROPPED_RANGES.sub("", s)
    if "\\" in s:
        if "\\boxed" in s or "\\fbox" in s:
            s = boxed_answer(s) or s
        s = _THIN_SPACE_THOUSANDS.sub(",", s.replace("\\$", ""))  # "11,\\! 111" is 11111
        s = _LEFT_RIGHT.sub("", s)
        s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
        for pattern, relation in _RELATIONS:
            s = pattern.sub(relation, s)
    s = s.replace("\\(", "$").replace("\\)", "$").replace("\\[", "$").replace("\\]", "$").replace("$$", "$")
    s = _from_sentence(s)
    s = s.strip().rstrip(".,;:").strip()
    if "\\" in s:  # units and escaped spaces are commands: skip two regex scans of plain answers
        s = _UNIT_AT_END.sub("", s)
    s = _TEXT_WRAPPER.sub(r"\1", s)
    parts = s.split("$")
    if len(parts) >= 3:  # text with math in it: the last non-empty math segment is the answer
        segments = [p for p in parts[1::2] if p.strip()]
        s = segments[-1] if segments else ""
    s = s.replace("$", "")
    if "\\" in s:
        s = _ESCAPED_SPACE.sub(" ", _UNIT_AT_END.sub("", s))  # "\\ " is a space; "\\\\ " ends a matrix row and stays
    for token in _DROPPED:
        s = s.replace(token, "")
    s = _BRACED_COMMA.sub(",", s).strip().rstrip(".,;:").strip()
    words = _NUMBER_WITH_WORDS.fullmatch(s)
    if words:
        s = words.group(1)
    return s


def _from_sentence(s: str) -> str:
    """The answer inside a sentence (two words or more outside math and ``\\commands``), else ``s``."""
    # "\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}": environment names are not words of a sentence
    outside_math = (_ENVIRONMENT.sub(" ", s) if "\\begin" in s else s).split("$")[0::2]
    if sum(len(_WORD.findall(part)) for part in outside_math) < 2:
        return s
    first = _SENTENCE_END.search(s)
    if first and not s[: first.start()].count("$") % 2:  # "... is 14400. I hope it is correct."
        head = s[: first.start()]
        if "$" in head or _DIGIT.search(head):
            s = head
    phrase = None
    for phrase in _ANSWER_IS.finditer(s):
        pass
    if phrase:
        s = s[phrase.end() :]
    last_math = s.rfind("$")
    numbers = [m for m in _PROSE_NUMBER.finditer(s) if not s[: m.start()].count("$") % 2]
    if numbers and numbers[-1].start() > last_math:
        return numbers[-1].group()  # "The largest $n$ is 34." -> 34
    return s  # the last math segment is taken later


def _canonical(cleaned: str) -> str:
    s = "".join(cleaned.split()).rstrip(".,;:")
    s = _FRAC_DIGIT_DIGIT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_DIGIT_BRACE.sub(r"\\frac{\1}{", s)
    s = _FRAC_BRACE_DIGIT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_DIGIT.sub(r"\\sqrt{\1}", s)
    for _ in range(3):
        if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _braces_balanced(s[1:-1]):
            s = s[1:-1]
    if "," in s and not _COMMA_SPACE.search(cleaned):  # "1,000" is 1000, but "32, 349" is a list of two numbers
        s = without_thousands_separators(s)
    return canonical_integer(s) or s


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
_LONG_DECIMAL = re.compile(r"[+-]?\d*\.(\d{%d,})" % _MIN_APPROXIMATION_PLACES)
_SLASH_FRACTION = re.compile(rf"({_NUMBER})/({_NUMBER})")
_LATEX_FRACTION = re.compile(rf"([+-]?)\\frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}")
# Commands that keep an expression a number: "2^{10}", "\sqrt{16}", "5\times10^3" may equal an integer.
_NUMERIC_COMMANDS = re.compile(r"\\(?:frac|sqrt|cdot|times|div|binom|dbinom|tbinom|pi)(?![A-Za-z])")
_NOT_ARITHMETIC = re.compile(r"[^0-9.+\-*/^()\[\]{}!]")
_VARIABLE = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?")
_RELATION = re.compile(r"<=|>=|!=|=|<|>|\\approx")
_SIMPLE_INTEGER = re.compile(r"-?[1-9]\d{0,17}|0")
# An integer alone, in math delimiters and/or a box, maybe with a full stop: "$42$", "\boxed{-7}.", "$\boxed{3}$"
_WRAPPED_INTEGER = re.compile(r"(\$)?(\\boxed\{)?\s*(-?(?:[1-9]\d{0,17}|0))\s*(?(2)\})(?(1)\$)\.?")
_DOUBLE_SIGN = re.compile(r"[+-]{2}")
_DIGIT = re.compile(r"\d")
_LETTERS = re.compile(r"[A-Za-z]+")
_LIST_JOINER = re.compile(r"\s*(?:,|;|,?\s*and|,?\s*or)?\s*", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"([A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?)=([^=<>]+)")
_LIST_BRACKETS = {"(": ")", "[": "]", "\\{": "\\}"}


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
    return bool(_DIGIT.search(normalized)) and not _NOT_ARITHMETIC.search(without_commands)


def numeric_value(normalized: str) -> arithmetic.Number | None:
    """The value of a normalised answer that is a number or arithmetic on numbers; ``None`` otherwise."""
    value = as_rational(normalized)
    if value is None and len(normalized) <= MAX_SYMBOLIC_CHARS and _is_arithmetic_of_numbers(normalized):
        return arithmetic.evaluate(normalized)
    return value


def _equation_value(normalized: str) -> str | None:
    """The value an equation states when it is ``v = value`` (``v`` a variable or arithmetic on numbers),
    a chain ``x = 2 + 3 = 5``, or ``x \\approx 11``; ``None`` for any other text (``a + 3z = 0`` stays an
    equation: it is not its right-hand side)."""
    if "=" not in normalized and "\\approx" not in normalized:
        return None
    exact, _, approximate = normalized.partition("\\approx")
    segments = exact.split("=")
    if any(not part or part[-1] in "<>!" for part in segments[:-1]):
        return None  # "<=", ">=", "!=": an inequality
    if any("," in part or ";" in part for part in segments[1:-1]):
        return None  # "x = -5, p = 14/3" is a list of equations, not x = (-5, p) = 14/3
    value = segments[-1] if len(segments) > 1 else None
    lhs = segments[0]
    if value is not None and not _VARIABLE.fullmatch(lhs):
        # "3 + 4 = 7" states 7; "7 = 11a + c" states an equation
        if not (_is_arithmetic_of_numbers(lhs) and numeric_value(value) is not None):
            return None
    if approximate:  # "x \approx 11" -> 11; "x = 1/3 \approx 0.33" -> 1/3
        if value is None and _VARIABLE.fullmatch(exact):
            value = approximate
        elif value is None:
            value = exact
    if value is None or _RELATION.search(value):
        return None
    return value


def _split_list(normalized: str) -> tuple[str, list[str]] | None:
    """``(kind, items)`` of a tuple or interval (kind = its brackets: ``"()"``, ``"[)"`` ...), a set or a bare
    comma list (kind ``"set"``: ``\\{1,2\\}``, ``1,2,3``); ``None`` for anything else."""
    s = normalized
    if "," not in s and ";" not in s:
        return None  # no separator: no list (and no character-by-character bracket walk)
    if s.startswith("\\{") and s.endswith("\\}") and _closes_at_end(s, 1):
        items = _top_level_split(s[2:-2])
        return ("set", items) if items else None
    if s[:1] in "([" and s[-1:] in ")]" and _closes_at_end(s, 0):
        items = _top_level_split(s[1:-1])
        return (s[0] + s[-1], items) if items else None
    items = _top_level_split(s)
    return ("set", items) if items else None


def _closes_at_end(s: str, i: int) -> bool:
    """The bracket at ``s[i]`` is closed by the last character (any of ``)]}`` closes any of ``([{``)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j == len(s) - 1
    return False


def _top_level_split(s: str) -> list[str] | None:
    """``s`` split at the commas (or semicolons) outside brackets; ``None`` when it has none or the
    brackets do not balance."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif c in ",;" and depth == 0:
            items.append(s[start:i])
            start = i + 1
    if depth != 0 or not items:
        return None
    items.append(s[start:])
    return items if all(items) else None


def _decide(pred: str, answer: str, depth: int = 0) -> tuple[bool | None, str]:
    """Rules 3-6 on two normalised answers: ``(True/False, method)`` when decided, ``(None, "")`` when only the
    symbolic step can tell, ``(True, "close")`` when two float values agree within 1e-9 (to be confirmed)."""
    if pred == answer:
        return True, "exact"
    if _DOUBLE_SIGN.search(pred) and not _DOUBLE_SIGN.search(answer):
        return False, "mismatch"  # "--33" is a malformed number, not 33
    if depth:  # list items: "x = -5" against "-5"
        pred_relation, answer_relation = bool(_RELATION.search(pred)), bool(_RELATION.search(answer))
        if pred_relation != answer_relation:
            value = _equation_value(pred if pred_relation else answer)
            if value is not None:
                pred, answer = (value, answer) if pred_relation else (pred, value)
    listable = depth < 3 and len(pred) <= _MAX_LIST_CHARS and len(answer) <= _MAX_LIST_CHARS
    pred_list, answer_list = (_split_list(pred), _split_list(answer)) if listable else (None, None)
    if pred_list or answer_list:
        return _decide_lists(pred_list, answer_list, pred, answer, depth)
    pred_value, answer_value = numeric_value(pred), numeric_value(answer)
    if pred_value is not None and answer_value is not None:
        same = arithmetic.compare(pred_value, answer_value)
        if same is False and (_approximates(pred, answer_value) or _approximates(answer, pred_value)):
            return True, "approximate"
        if same is True and not (isinstance(pred_value, Fraction) and isinstance(answer_value, Fraction)):
            return True, "close"
        return same, "numeric" if same is not None else ""
    identical = arithmetic.identical(pred, answer) if max(len(pred), len(answer)) <= MAX_SYMBOLIC_CHARS else None
    if identical is not None:
        return identical, "identity"
    if isinstance(answer_value, Fraction) and not _is_arithmetic_of_numbers(pred):
        return False, "mismatch"  # a variable, a word or a tuple is not this number
    return None, ""


def _decide_lists(pred_list, answer_list, pred: str, answer: str, depth: int) -> tuple[bool | None, str]:
    if pred_list is None or answer_list is None:
        single = answer if pred_list else pred
        if numeric_value(single) is not None:
            return False, "list"  # "32, 349" is not 32349
        return None, ""
    (pred_kind, pred_items), (answer_kind, answer_items) = pred_list, answer_list
    if pred_kind != answer_kind:
        if "set" in (pred_kind, answer_kind):
            return None, ""  # a tuple against a set or a bare list: the symbolic step
        return False, "list"  # (0, 9) is not [0, 9)
    if pred_kind == "set" and _repeats_a_tuple(pred_items) and len(set(answer_items)) == len(answer_items):
        pred_items = list(dict.fromkeys(pred_items))  # a set of tuples with one listed twice is still that set
    if len(pred_items) != len(answer_items):
        return False, "list"
    if pred_kind != "set":  # tuples and intervals: in order
        verdicts = [_decide(p, a, depth + 1)[0] for p, a in zip(pred_items, answer_items)]
        if False in verdicts:
            return False, "list"
        return (True, "list") if all(verdicts) else (None, "")
    unmatched = list(answer_items)  # sets: every element matched once (greedy on decided equalities)
    undecided = False
    for item in pred_items:
        for candidate in unmatched:
            verdict = _decide(item, candidate, depth + 1)[0]
            if verdict:
                unmatched.remove(candidate)
                break
            undecided |= verdict is None
        else:
            return (None, "") if undecided else (False, "list")
    return True, "list"


def _repeats_a_tuple(items: list[str]) -> bool:
    """Every item is a tuple or interval and one is written twice: ``(3,17,3,7),(3,17,3,7),(17,3,3,7)``.
    Numbers are not deduplicated: ``1, 1, 2`` may be the values of three unknowns."""
    return len(set(items)) < len(items) and all(item[:1] in "([" and item[-1:] in ")]" for item in items)


def _approximates(decimal: str, value: arithmetic.Number) -> bool:
    """``decimal`` has at least six decimal places, ``value`` has more, and ``decimal`` is ``value`` rounded
    or truncated to its places: ``0.0833333`` for 1/12, ``1.41421356`` for ``\\sqrt{2}``."""
    match = _LONG_DECIMAL.fullmatch(decimal)
    if match is None:
        return False
    places = len(match.group(1))
    scale = Fraction(10) ** places
    if isinstance(value, Fraction):
        if (value * scale).denominator == 1:
            return False  # 0.5 is exactly 0.5000000: a different decimal is a different number
        return abs(Fraction(decimal) - value) <= 1 / scale
    return abs(float(Fraction(decimal)) - value) <= float(1 / scale) * (1 + 1e-9)


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification.

    ``method`` says which rule decided: ``exact``, ``numeric``, ``approximate``, ``list``, ``identity``,
    ``symbolic``, ``mismatch`` (no rule found them equal), ``no_answer`` or ``error``. ``symbolic_skipped``:
    only the symbolic step could have decided, and it is off (math-verify missing or ``symbolic_check=False``).
    """

    correct: bool
    pred: str
    method: str
    error: str = ""
    symbolic_skipped: bool = False

    @property
    def score(self) -> float:
        return 1.0 if self.correct else -1.0


class MalformedGroundTruth(ValueError):
    """The ground truth is not a string, a number or a non-empty list of them."""


def ground_truth_answers(ground_truth: Any) -> list[str]:
    """The acceptable answers as strings: ``42`` -> ``["42"]``; a list/tuple/array -> one string per item.

    Raises :class:`MalformedGroundTruth` for anything else (a dict, ``None``, ``""``, bytes that are not UTF-8).
    """
    where = "reward_model.ground_truth of the data"
    if isinstance(ground_truth, str):
        if not ground_truth.strip():
            raise MalformedGroundTruth(f"empty ground truth: fill {where}")
        return [ground_truth]
    if isinstance(ground_truth, bytes):
        try:
            return ground_truth_answers(ground_truth.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise MalformedGroundTruth(f"ground truth bytes are not UTF-8 ({error}): store {where} as text") from None
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, (int, float)):
        ground_truth = ground_truth.tolist()  # numpy scalars and arrays
    if isinstance(ground_truth, (list, tuple)):
        if not ground_truth:
            raise MalformedGroundTruth(f"empty list of ground truths: give {where} at least one answer")
        return [answer for item in ground_truth for answer in ground_truth_answers(item)]
    if isinstance(ground_truth, numbers.Number) and not isinstance(ground_truth, bool):
        return [str(ground_truth)]
    raise MalformedGroundTruth(
        f"ground truth of type {type(ground_truth).__name__} ({_cut(repr(ground_truth))[:80]}): {where} must be "
        "a string, a number or a list of them"
    )


def verify(
    response: Any, ground_truth: Any, *, symbolic_check: bool | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Verdict:
    """Score one response against its ground truth (rules in the module docstring); never raises.

    ``symbolic_check``: ``None`` uses math-verify when it is installed, ``True`` requires it (its absence is
    reported in ``Verdict.error``), ``False`` never uses it. ``timeout_s`` limits the whole call (the symbolic
    step gets what is left of it).
    """
    pred = ""
    deadline = time.monotonic() + float(timeout_s)  # the limit covers the whole call, not only the symbolic step
    try:
        text = response if isinstance(response, str) else _as_text(response)
        try:
            answers = ground_truth_answers(ground_truth)
        except MalformedGroundTruth as error:
            _malformed_ground_truths.report(str(error))
            return Verdict(False, _cut(extract_answer(text)), "error", _cut(f"malformed ground truth: {error}"))
        pred = extract_answer(text)
        if not pred:
            return Verdict(False, "", "no_answer")
        for answer in answers:  # not empty: ground_truth_answers raises on an empty list
            verdict = _compare(pred, answer, symbolic_check, deadline)
            if verdict.correct:
                return verdict
        return verdict
    except Exception as error:  # a bug or a pathological input must cost one sample, never the run
        _verification_failures.report(f"{type(error).__name__}: {error}", exc_info=error)
        return Verdict(False, _cut(pred), "error", _cut(f"{type(error).__name__}: {error}"))


def _compare(pred: str, answer: str, symbolic_check: bool | None, deadline: float) -> Verdict:
    reported = _cut(pred)
    answer_clean, answer_norm = _normalized_ground_truth(answer)
    if _SIMPLE_INTEGER.fullmatch(answer_norm):  # the common case at once: "42", "$42$", "\boxed{42}."
        integer = _WRAPPED_INTEGER.fullmatch(pred)
        if integer:
            digits = integer.group(3)
            return Verdict(int(digits) == int(answer_norm), reported, "exact" if digits == answer_norm else "numeric")
    pred_clean = _clean(pred)
    pred_norm = _canonical(pred_clean)
    if not pred_norm:
        return Verdict(False, reported, "no_answer")
    if not answer_norm:
        return Verdict(False, reported, "mismatch")
    # "x = 5" is its value unless the other side is an equation too; "a + 3z = 0" never is its right side.
    if not _RELATION.search(answer_norm):
        value = _equation_value(pred_norm)
        if value is not None:
            pred_norm, pred_clean = value, _clean_value(pred_clean, value)
    if not _RELATION.search(pred_norm):
        value = _equation_value(answer_norm)
        if value is not None:
            answer_norm, answer_clean = value, _clean_value(answer_clean, value)
    equal, method = _decide(pred_norm, answer_norm)
    if equal is not None and method != "close":
        return Verdict(equal, reported, method if equal or method != "exact" else "mismatch")
    if len(pred_clean) > MAX_SYMBOLIC_CHARS or len(answer_clean) > MAX_SYMBOLIC_CHARS:
        return Verdict(False, reported, "mismatch")
    use_symbolic = symbolic.math_verify_installed() if symbolic_check is None else symbolic_check
    if not use_symbolic:
        if method == "close":  # within 1e-9 of each other: right without a symbolic confirmation
            return Verdict(True, reported, "numeric")
        _warn_symbolic_off_once(symbolic_check)
        return Verdict(False, reported, "mismatch", symbolic_skipped=True)
    try:
        equal = _symbolic_equal(answer_clean, pred_clean, deadline)
    except symbolic.SymbolicCheckError as error:
        _symbolic_failures.report(str(error))
        return Verdict(False, reported, "error", _cut(str(error)))
    return Verdict(equal, reported, "symbolic" if equal else "mismatch")


@functools.lru_cache(maxsize=4096)
def _normalized_ground_truth(answer: str) -> tuple[str, str]:
    """``_clean`` and ``_canonical`` of a ground truth, cached (a group of 16 responses shares one), with two
    readings that only a ground truth gets (it is trusted; a response is read by the extraction rules):

    - several boxes, or several math segments joined only by commas, ``and`` or ``or``, are one list:
      ``"\\boxed{1} papers and \\boxed{2} bins"`` -> ``1, 2``; ``"$1$ and $2$ and $3$"`` -> ``1, 2, 3``;
    - groups of assignments separated by ``;`` are tuples in the order written: ``"p=5,q=2;p=7,q=2"`` ->
      ``(5,2),(7,2)``.
    """
    cleaned = _clean(_ground_truth_parts(answer))
    return cleaned, _assignments_as_tuples(_canonical(cleaned))


def _ground_truth_parts(answer: str) -> str:
    if answer.count("\\boxed") + answer.count("\\fbox") >= 2:
        contents, end = [], -1
        for start in sorted(i for command in _BOX_COMMANDS for i in _positions(answer, command)):
            box = _box_at(answer, start) if start >= end else None  # a box inside a box is part of it
            if box is None:
                continue
            if end >= 0 and not _joins_boxes(answer[end:start]):
                return answer  # "\\boxed{1} no no no \\boxed{2}": not one list
            contents.append(box[0].strip())
            end = box[1]
        contents = list(dict.fromkeys(contents))  # "\\boxed{840} ... **Final Answer** \\boxed{840}" is one answer
        return ", ".join(contents) if len(contents) >= 2 else answer
    parts = answer.replace("$$", "$").split("$")
    if len(parts) >= 5 and len(parts) % 2 and not parts[0].strip() and not parts[-1].strip(" .\n"):
        if all(_LIST_JOINER.fullmatch(between) for between in parts[2:-1:2]):
            return ", ".join(parts[1::2])
    return answer


def _joins_boxes(between: str) -> bool:
    """Text between two boxes of a ground truth that makes them one list: no words (``", "``, ``" ++ "``),
    or ``and``/``or`` after at most one word (``" papers and "``)."""
    words = _LETTERS.findall(between)
    return not words or (words[-1].lower() in ("and", "or") and len(words) <= 2)


def _positions(text: str, needle: str):
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


def _assignments_as_tuples(normalized: str) -> str:
    if ";" not in normalized or "=" not in normalized:
        return normalized
    tuples, names = [], None
    for group in normalized.split(";"):
        pairs = [_ASSIGNMENT.fullmatch(item) for item in group.split(",")]
        if len(pairs) < 2 or not all(pairs) or names not in (None, [m.group(1) for m in pairs]):
            return normalized
        names = [m.group(1) for m in pairs]
        tuples.append("(" + ",".join(m.group(2) for m in pairs) + ")")
    return ",".join(tuples)


def _clean_value(cleaned: str, value: str) -> str:
    """The cleaned (spaces kept) form of an equation's value: the text after its last ``=`` or ``\\approx``."""
    for separator in ("=", "\\approx"):
        if separator in cleaned:
            tail = cleaned.rpartition(separator)[2].strip()
            if _canonical(tail) == value:
                return tail
    if "\\approx" in cleaned:
        head = cleaned.partition("\\approx")[0].strip()
        if _canonical(head) == value:
            return head
    return value


@functools.lru_cache(maxsize=1)
def _warn_symbolic_off_once(symbolic_check: bool | None) -> None:
    """One loud warning per process the first time an answer needed the symbolic step while it was off."""
    how = "symbolic_check=false" if symbolic_check is False else "math-verify is not installed"
    logger.warning(
        "SYMBOLIC ANSWER CHECK IS OFF (%s): answers that only symbolic maths can match (x + x vs 2x is done "
        "without it, \\sin(\\pi/6) vs 1/2 is not) are scored wrong; see reward/symbolic_skipped_count. "
        "Install it with pip install 'recipe_dapo[math]'.", how,
    )


_SYMBOLIC_CACHE_SIZE = 8192
_symbolic_verdicts: dict[tuple[str, str], bool] = {}
_symbolic_lock = threading.Lock()
_symbolic_checks = 0


def _symbolic_equal(gold: str, pred: str, deadline: float) -> bool:
    """Cached (a group of 16 often repeats an answer; the oldest verdict goes first when full). A failure
    or time-out raises and is not cached, so the next call tries again. ``deadline``: ``time.monotonic()``
    by which the whole verification must have returned."""
    global _symbolic_checks
    key = (gold, pred)
    cached = _symbolic_verdicts.get(key)
    if cached is not None:
        return cached
    with _symbolic_lock:
        _symbolic_checks += 1
    equal = symbolic.default_checker().equivalent(gold, pred, timeout_s=deadline - time.monotonic())
    with _symbolic_lock:
        if len(_symbolic_verdicts) >= _SYMBOLIC_CACHE_SIZE:
            del _symbolic_verdicts[next(iter(_symbolic_verdicts))]
        _symbolic_verdicts[key] = equal
    return equal


def clear_symbolic_cache() -> None:
    """Forget cached symbolic verdicts (benchmarks measure cold runs)."""
    global _symbolic_checks
    with _symbolic_lock:
        _symbolic_verdicts.clear()
        _symbolic_checks = 0


def symbolic_checks_run() -> int:
    """How many symbolic checks this process has sent to math-verify since the cache was last cleared."""
    return _symbolic_checks


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
