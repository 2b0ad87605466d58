"""Ground-truth answers in one canonical spelling, shared by the converters and the verifier.

``normalize_ground_truth`` applies these rules, in order, and nothing else (anything that is not a
plain number after step 3 keeps its LaTeX untouched, e.g. ``\\frac{14}{3}`` or ``(3, \\frac{\\pi}{2})``):

1. numbers from JSON/parquet become text: an integral float ``27.0`` becomes ``"27"``;
2. surrounding whitespace and one pair of enclosing ``$...$`` (or ``$$...$$``) are removed;
3. a ``\\boxed{...}`` wrapping the whole answer is unwrapped;
4. thousands separators inside a number are dropped: ``1,319``, ``1{,}319`` and ``1\\,319`` -> ``1319``
   (only well-formed groups of three digits, so a pair like ``1,5`` is left alone);
5. an integer loses its sign ``+``, its leading zeros and the sign of zero: ``025`` -> ``25``, ``-007`` -> ``-7``,
   ``+3`` -> ``3``, ``-0`` -> ``0``;
6. a decimal loses trailing zeros and a bare point, and gains a leading zero: ``2.50`` -> ``2.5``,
   ``27.0`` -> ``27``, ``.5`` -> ``0.5``.

Every DAPO-Math-17k, AIME and AMC answer is an integer, so for those sets the rules reduce to
"canonical integer": the AIME ``"025"`` and ``"25"`` compare equal.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?\d*\.\d+")
# A number written with thousands separators: "," or "{,}" or "\," between groups of exactly three digits.
_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\}|\\,)\d{3})+(?:\.\d+)?")
_SEPARATOR = re.compile(r",|\{,\}|\\,")
_BOXED_PREFIX = "\\boxed{"


def normalize_ground_truth(answer: str | int | float) -> str:
    """Canonical spelling of a reference answer (rules in the module docstring).

    >>> normalize_ground_truth("025"), normalize_ground_truth(" $1,319$ "), normalize_ground_truth(27.0)
    ('25', '1319', '27')
    >>> normalize_ground_truth("\\\\boxed{\\\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise TypeError(f"a ground truth must be a string or a number, got {type(answer).__name__}: {answer!r}")
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    text = _strip_dollars(str(answer).strip())
    text = _unwrap_boxed(text)
    if _GROUPED_NUMBER.fullmatch(text):
        text = _SEPARATOR.sub("", text)
    if _INTEGER.fullmatch(text):
        return str(int(text))
    if _DECIMAL.fullmatch(text):
        return _canonical_decimal(text)
    return text


def _strip_dollars(text: str) -> str:
    for delimiter in ("$$", "$"):
        inner = text[len(delimiter) : -len(delimiter)]
        if (
            len(text) > 2 * len(delimiter)
            and text.startswith(delimiter)
            and text.endswith(delimiter)
            and "$" not in inner
        ):
            return inner.strip()
    return text


def _unwrap_boxed(text: str) -> str:
    """``\\boxed{X}`` -> ``X`` only when the box's closing brace is the last character."""
    if not (text.startswith(_BOXED_PREFIX) and text.endswith("}")):
        return text
    depth = 0
    for position in range(len(_BOXED_PREFIX) - 1, len(text)):
        char = text[position]
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return text[len(_BOXED_PREFIX) : -1].strip() if position == len(text) - 1 else text
    return text


def _canonical_decimal(text: str) -> str:
    sign = "-" if text.startswith("-") else ""
    integer_part, fraction_part = text.lstrip("+-").split(".")
    integer_part = str(int(integer_part or "0"))
    fraction_part = fraction_part.rstrip("0")
    if not fraction_part:
        return str(int(sign + integer_part))  # "-0.0" -> "0"
    return f"{sign}{integer_part}.{fraction_part}"


def gsm8k_final_answer(solution: str | int | float) -> str:
    """The number after the last ``#### `` of a GSM8K solution, normalised (``"#### 1,200"`` -> ``"1200"``).

    Returns ``""`` when the marker is missing, which the row validation then reports as an empty
    ground truth.
    """
    marker = "####"
    solution = str(solution)
    if marker not in solution:
        return ""
    return normalize_ground_truth(solution.rsplit(marker, 1)[1].strip())
