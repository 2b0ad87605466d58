"""Ground-truth answers in one canonical spelling, and the number-spelling rules the verifier shares.

``normalize_ground_truth`` applies these rules, in order, and nothing else (anything that is not a
plain number after step 3 keeps its LaTeX untouched, e.g. ``\\frac{14}{3}`` or ``(3, \\frac{\\pi}{2})``):

1. numbers from JSON/parquet become text: an integral float ``27.0`` becomes ``"27"``;
2. surrounding whitespace and one pair of enclosing ``$...$`` (or ``$$...$$``) are removed;
3. a ``\\boxed{...}`` wrapping the whole answer is unwrapped;
4. thousands separators inside a number are dropped: ``1,319``, ``1{,}319`` and ``1\\,319`` -> ``1319``
   (only well-formed groups of three digits after a first digit that is not 0, so a pair like ``1,5`` and
   ``0,111`` -- a decimal comma or a list -- are left alone);
5. an integer loses its sign ``+``, its leading zeros and the sign of zero: ``025`` -> ``25``, ``-007`` -> ``-7``,
   ``+3`` -> ``3``, ``-0`` -> ``0``;
6. a decimal loses trailing zeros and a bare point, and gains a leading zero: ``2.50`` -> ``2.5``,
   ``27.0`` -> ``27``, ``.5`` -> ``0.5``.

Every DAPO-Math-17k, AIME and AMC answer is an integer, so for those sets the rules reduce to
"canonical integer": the AIME ``"025"`` and ``"25"`` compare equal.

Rules 4 and 5 are :func:`without_thousands_separators` and :func:`canonical_integer`, the one implementation
of them: the verifier's ``normalize_answer`` (``recipe_dapo.reward.verifier``) applies the same two functions
to predictions and ground truths as its last steps, after its own, wider clean-up of model output (boxes,
``\\text{}``, units, sentences...). Decimals are not respelled there: the verifier compares them by value.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"([+-]?)0*(\d+)")
# Thousands separators: "1,000"; never after a leading 0 ("0,111" is a decimal comma or a list, not 111)
_THOUSANDS = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
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
        commas = _SEPARATOR.sub(",", text)
        grouped = without_thousands_separators(commas)
        text = grouped if grouped != commas else text
    integer = canonical_integer(text)
    if integer is not None:
        return integer
    if _DECIMAL.fullmatch(text):
        return _canonical_decimal(text)
    return text


def canonical_integer(text: str) -> str | None:
    """``text`` in its canonical spelling when it is an integer (rule 5), else ``None``.

    >>> canonical_integer("-007"), canonical_integer("+3"), canonical_integer("-0"), canonical_integer("2.5")
    ('-7', '3', '0', None)
    """
    match = _INTEGER.fullmatch(text)
    if match is None:
        return None
    sign, digits = match.groups()
    return ("-" if sign == "-" and digits != "0" else "") + digits


def without_thousands_separators(text: str) -> str:
    """``text`` without its commas when it is a number with comma thousands separators (rule 4), else ``text``.

    >>> without_thousands_separators("1,000,000"), without_thousands_separators("-1,319.5")
    ('1000000', '-1319.5')
    >>> without_thousands_separators("0,111"), without_thousands_separators("1,5"), without_thousands_separators("32,349,1")
    ('0,111', '1,5', '32,349,1')
    """
    return text.replace(",", "") if "," in text and _THOUSANDS.fullmatch(text) else text


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
    integer_part = canonical_integer(integer_part or "0")
    fraction_part = fraction_part.rstrip("0")
    if not fraction_part:
        return canonical_integer(sign + integer_part)  # "-0.0" -> "0"
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
