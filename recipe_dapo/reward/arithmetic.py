"""Bounded evaluation of LaTeX arithmetic on numbers, so most answers need no symbolic maths.

A DAPO-Math ground truth is an integer; a prediction like ``2^{10}``, ``\\sqrt{1764}`` or ``3\\cdot 14`` is
either equal to it or not, and deciding that with sympy costs 10-40 ms a time. :func:`evaluate` decides
it in microseconds and gives up (``None``) on anything it cannot bound.

Grammar (whitespace already removed by normalisation)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "\\cdot" | "\\times" | "/" | "\\div") unary | unary)*     # juxtaposition multiplies
    unary   := ("+" | "-") unary | power                                              # -2^2 = -4
    power   := postfix ("^" exponent)?                                                # right-associative
    exponent:= "{" expr "}" | "(" expr ")" | one digit | unary sign + exponent       # 2^10 is ambiguous: give up
    postfix := primary "!"*                                                           # n! for integers <= 170
    primary := number | "(" expr ")" | "{" expr "}" | "\\frac" group group | "\\sqrt" ("[" expr "]")? group
    group   := "{" expr "}" | one digit

    primary := ... | "\\pi" | variable                                                    # with ``variables`` only

Values are exact ``Fraction`` s while they can be (``\\sqrt`` of a perfect square stays exact) and ``float``
otherwise (an irrational root, ``\\pi``, a power too large to compute exactly: ``10^{10^{10}}`` is
``inf``). Limits that keep every call cheap: at most ``MAX_TOKENS`` tokens, nesting ``MAX_DEPTH``, exact
powers up to ``MAX_EXACT_BITS`` bits. Anything else (commas, other commands, division by zero, ``nan``)
gives ``None``: undecided.

Variables: with a ``variables`` mapping, a single letter (``x``, ``a_1`` is not one) takes the value given for
it; two letters in a row (``xy``, or a word) are undecided. :func:`identical` evaluates two expressions at
the same fixed rational points to decide identities such as ``x + x`` = ``2x`` without sympy: two rational
functions that differ agree at a point chosen independently of them only on a set of measure zero, and
:data:`POINTS` are unremarkable rationals.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_TOKENS = 200
MAX_DEPTH = 32
MAX_EXACT_BITS = 1 << 16  # 10^{2000} and 10^{2001} stay exact (and different)
MAX_FACTORIAL = 170

Number = Fraction | float

_TOKEN = re.compile(r"(\d+(?:\.\d*)?|\.\d+)|(\\[A-Za-z]+)|(.)", re.DOTALL)
_LETTER = re.compile(r"[A-Za-z]")

POINTS = (
    lambda index: Fraction(7 + 4 * index, 3 + 2 * index) + Fraction(1, 10 + index),
    lambda index: Fraction(-11 - 3 * index, 5 + index) + Fraction(2, 17 + 3 * index),
)
"""Value of the ``index``-th variable (in alphabetical order) at the evaluation points of :func:`identical`."""
_MULTIPLY = {"*", "\\cdot", "\\times"}
_DIVIDE = {"/", "\\div"}
_STARTS_PRIMARY = {"(", "{", "\\frac", "\\sqrt", "\\pi"}


class _Undecided(Exception):
    """The expression is outside the grammar or its bounds."""


def evaluate(expression: str, variables: dict[str, Number] | None = None) -> Number | None:
    """The value of ``expression`` under the grammar above, or ``None`` when undecided.

    >>> evaluate("2^{10}"), evaluate("\\\\sqrt{1764}"), evaluate("-\\\\frac{3}{6}"), evaluate("x+1")
    (Fraction(1024, 1), Fraction(42, 1), Fraction(-1, 2), None)
    """
    tokens = []
    for match in _TOKEN.finditer(expression):
        tokens.append(match.group(0))
        if len(tokens) > MAX_TOKENS:
            return None
    if not tokens:
        return None
    parser = _Parser(tokens, variables or {})
    try:
        value = parser.expr(0)
        if parser.position != len(tokens):
            return None
    except (_Undecided, ZeroDivisionError, OverflowError, ValueError):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def letters(expression: str) -> set[str]:
    """The single-letter variables of ``expression`` (letters outside ``\\commands``)."""
    return {m.group(0) for m in _TOKEN.finditer(expression) if m.group(3) and _LETTER.fullmatch(m.group(3))}


def identical(first: str, second: str) -> bool | None:
    """Whether two expressions in the same variables are equal at every point of :data:`POINTS`: ``True``
    (exactly equal, or within 1e-9 relative where a value is a float), ``False`` (different at a point),
    ``None`` (undecided: outside the grammar, or a value too large for a float)."""
    names = sorted(letters(first) | letters(second))
    if not names:
        return None
    for point in POINTS:
        assignment = {name: point(i) for i, name in enumerate(names)}
        a, b = evaluate(first, assignment), evaluate(second, assignment)
        if a is None or b is None:
            return None
        same = compare(a, b)
        if same is not True:
            return same
    return True


def compare(a: Number, b: Number) -> bool | None:
    """``True``/``False`` when two values are decided equal or different (exactly when both are exact,
    within 1e-9 relative otherwise); ``None`` when both overflowed to infinity of the same sign."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    if math.isinf(a) or math.isinf(b):
        return None if a == b else False
    return close_to(a, b)


class _Parser:
    def __init__(self, tokens: list[str], variables: dict[str, Number]):
        self.tokens = tokens
        self.variables = variables
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Undecided(f"expected {expected!r}, got {token!r}")
        self.position += 1
        return token

    def expr(self, depth: int) -> Number:
        if depth > MAX_DEPTH:
            raise _Undecided("nested too deeply")
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            if self.take() == "+":
                value = value + self.term(depth)
            else:
                value = value - self.term(depth)
        return value

    def term(self, depth: int) -> Number:
        value = self.unary(depth)
        while True:
            token = self.peek()
            if token in _MULTIPLY:
                self.take()
                value = value * self.unary(depth)
            elif token in _DIVIDE:
                self.take()
                value = _divide(value, self.unary(depth))
            elif token is not None and (token in _STARTS_PRIMARY or _is_number(token) or token in self.variables):
                value = value * self.unary(depth)  # 3\sqrt{2}, 2(5)
            else:
                return value

    def unary(self, depth: int) -> Number:
        token = self.peek()
        if token in ("+", "-"):
            self.take()
            if self.peek() in ("+", "-"):
                raise _Undecided("two signs in a row")  # "--33" is not a way to write 33
            value = self.unary(depth + 1)
            return -value if token == "-" else value
        return self.power(depth)

    def power(self, depth: int) -> Number:
        base = self.postfix(depth)
        if self.peek() != "^":
            return base
        self.take()
        return _power(base, self.exponent(depth + 1))

    def exponent(self, depth: int) -> Number:
        token = self.peek()
        if token in ("+", "-"):
            self.take()
            value = self.exponent(depth + 1)
            return -value if token == "-" else value
        if token in ("{", "("):
            return self.bracketed(depth)
        if token is not None and _is_number(token) and len(token) == 1:
            self.take()
            return Fraction(token)
        raise _Undecided("exponent must be braced or a single digit")

    def postfix(self, depth: int) -> Number:
        value = self.primary(depth)
        while self.peek() == "!":
            self.take()
            value = _factorial(value)
        return value

    def primary(self, depth: int) -> Number:
        token = self.peek()
        if token is None:
            raise _Undecided("expression ends early")
        if _is_number(token):
            self.take()
            return Fraction(token)
        if token in ("(", "{"):
            return self.bracketed(depth)
        if token in self.variables:
            self.take()
            if self.peek() in self.variables:
                raise _Undecided("two letters in a row: a word or a product left to the symbolic step")
            return self.variables[token]
        if token == "\\pi" and self.variables is not None:
            self.take()
            return math.pi
        if token == "\\frac":
            self.take()
            numerator = self.group(depth + 1)
            return _divide(numerator, self.group(depth + 1))
        if token == "\\sqrt":
            self.take()
            degree = Fraction(2)
            if self.peek() == "[":
                self.take()
                degree = self.expr(depth + 1)
                self.take("]")
            return _root(self.group(depth + 1), degree)
        raise _Undecided(f"unsupported token {token!r}")

    def bracketed(self, depth: int) -> Number:
        closing = {"(": ")", "{": "}"}[self.take()]
        value = self.expr(depth + 1)
        self.take(closing)
        return value

    def group(self, depth: int) -> Number:
        token = self.peek()
        if token == "{":
            return self.bracketed(depth)
        if token is not None and _is_number(token) and len(token) == 1:
            self.take()
            return Fraction(token)
        raise _Undecided("\\frac and \\sqrt need braced arguments")


def _is_number(token: str) -> bool:
    return token[0].isdigit() or (token[0] == "." and len(token) > 1)


def _divide(numerator: Number, denominator: Number) -> Number:
    if denominator == 0:
        raise _Undecided("division by zero")
    return numerator / denominator


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, Fraction) and isinstance(exponent, Fraction) and exponent.denominator == 1:
        e = exponent.numerator
        size = max(abs(base.numerator), abs(base.denominator)).bit_length()
        if size * abs(e) <= MAX_EXACT_BITS:
            if base == 0 and e < 0:
                raise _Undecided("zero to a negative power")
            return base**e
    try:
        return math.pow(float(base), float(exponent))
    except OverflowError:
        odd = isinstance(exponent, Fraction) and exponent.denominator == 1 and exponent.numerator % 2 == 1
        return -math.inf if base < 0 and odd else math.inf
    except ValueError as error:  # negative base, fractional exponent
        raise _Undecided(str(error)) from error


def _root(radicand: Number, degree: Number) -> Number:
    if isinstance(radicand, Fraction) and isinstance(degree, Fraction) and degree.denominator == 1 and degree > 0:
        n = degree.numerator
        if radicand >= 0 and n <= 64:
            exact_num, exact_den = _integer_root(radicand.numerator, n), _integer_root(radicand.denominator, n)
            if exact_num is not None and exact_den is not None:
                return Fraction(exact_num, exact_den)
    if radicand < 0 or degree == 0:
        raise _Undecided("root of a negative number or of degree 0")
    return math.pow(float(radicand), 1.0 / float(degree))


def _integer_root(value: int, n: int) -> int | None:
    """The integer r with r**n == value, or None."""
    if value.bit_length() > MAX_EXACT_BITS:
        return None
    guess = math.isqrt(value) if n == 2 else round(value ** (1.0 / n)) if value.bit_length() < 1000 else None
    if guess is None:
        return None
    for candidate in (guess - 1, guess, guess + 1):
        if candidate >= 0 and candidate**n == value:
            return candidate
    return None


def _factorial(value: Number) -> Fraction:
    if isinstance(value, Fraction) and value.denominator == 1 and 0 <= value.numerator <= MAX_FACTORIAL:
        return Fraction(math.factorial(value.numerator))
    raise _Undecided("factorial of a non-integer or of a large number")


def close_to(value: Number, target: Number) -> bool:
    """Floating-point closeness (relative 1e-9) used when one side is inexact. An infinite value (a power
    too large for a float) is close to nothing: two such values may still differ (``10^{10^{10}}`` and
    ``10^{10^{10}+1}``)."""
    try:
        a, b = float(value), float(target)
    except OverflowError:
        return False
    if math.isinf(a) or math.isinf(b):
        return False
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
