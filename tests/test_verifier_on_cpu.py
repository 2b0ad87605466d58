"""The DAPO answer verifier: extraction and normalisation rules on golden cases, the +1/-1 contract of
``compute_score``, the optional symbolic step and its time limit, and its robustness cases."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest

from recipe_dapo.reward import compute_score, extract_answer, normalize_answer, verify
from recipe_dapo.reward import arithmetic, symbolic, verifier
from recipe_dapo.reward.verifier import TAIL_CHARS, as_rational

# Budget for the non-symbolic rules on any input; they are linear on <= TAIL_CHARS characters (~50 us),
# so 50 ms leaves room for a slow CI machine and still catches a quadratic or backtracking rule.
FAST_RULES_BUDGET_S = 0.05

needs_math_verify = pytest.mark.skipif(not symbolic.math_verify_installed(), reason="extra 'math' not installed")


@pytest.mark.parametrize(
    "response, expected",
    [
        ("We get 6 * 7.\n\nAnswer: 42", "42"),  # the DAPO prompt's last line
        ("Answer: 1\nso... wait.\nAnswer: 2", "2"),  # the last Answer line wins
        ("answer:   -3  ", "-3"),  # any case, surrounding blanks dropped
        ("**Answer:** $\\frac{3}{4}$", "$\\frac{3}{4}$"),  # markdown around the marker
        ("Answer:\n\n17", "17"),  # answer on the line after the marker
        ("Final Answer\uff1a 8", "8"),  # full-width colon
        ("so \\boxed{12} is it", "12"),  # no Answer line: last box
        ("\\boxed{1} then \\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}"),  # nested braces matched
        ("\\fbox{7}", "7"),
        ("\\boxed 9 done", "9"),  # box without braces: the next word
        ("\\boxed{5} and then \\boxed{6", ""),  # last box unclosed (truncated): no answer
        ("Answer: \n\\boxed{4}", "\\boxed{4}"),  # a box inside the Answer line: the line (unwrapped later)
        ("So our answer: 5?\nNo.\n\\boxed{6}", "6"),  # a box after the last Answer line wins
        ("\\boxed{6}\nAnswer: 7", "7"),  # an Answer line after the last box wins
        ("Answer: 7\n\\boxed{8", "7"),  # a later but unclosed box does not
        ("no answer here", ""),
        ("", ""),
        ("ANSWER: 5", "5"),  # markers are found with rfind on "nswer"/"NSWER" after "a"/"A", not a lowered copy
        ("Answer: 3<|im_end|>\nAnswer: 4", "3"),  # nothing from the first chat special token on
        ("Answer: 3</s> Answer: 4", "3"),
        ("we test <|x| and Answer: 6", "6"),  # "<|" that starts no special token cuts nothing
    ],
)
def test_extract_answer_reads_last_answer_line_then_last_box(response, expected):
    assert extract_answer(response) == expected


def test_extract_answer_finds_an_answer_followed_by_much_more_text():
    # An answer followed by more than TAIL_CHARS characters was not found
    assert extract_answer("Answer: 1\n" + "x" * (10 * TAIL_CHARS)) == "1"
    assert extract_answer("so $\\boxed{3}$.\n" + "Checking again. " * 2000) == "3"
    assert extract_answer("y" * 100_000 + "\nAnswer: 5") == "5"


@pytest.mark.parametrize(
    "response, expected",
    [
        # an answer line written as a sentence
        ("\\boxed{14400}\nFinal Answer: The final answer is 14400. I hope it is correct.", "14400"),
        ("Answer: The largest $n$ is 34.", "34"),
        ("Answer: Therefore $x \\geq 5$ is the solution.", "x>=5"),
        ("Answer: the number is not 10 which is 1,000.99", "1000.99"),
        # "answer:" inside a sentence after the final box does not take over; a line does
        ("$\\boxed{7}$. Let me double check the answer: substituting back, it works.", "7"),
        ("$\\boxed{7}$.\nAnswer: 8", "8"),
        ("The sum is $10,200 + 255 = 10,455$. Final Answer: The final answer is $10,455$.", "10455"),
        # several boxes in one list
        ("The solutions are $\\boxed{1},\\boxed{2},\\boxed{3}$.", "1,2,3"),
        ("$\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}$", "-2,1"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # text between: only the last box
        # chat special tokens end the response
        ("Answer: 5\n<|im_start|>user\nAnswer: 6", "5"),
        # invisible characters, emoji, \cfrac, units in \text
        ("Answer: 42\u200b", "42"),
        ("Answer: 42 \U0001F389", "42"),
        ("Answer: \\cfrac{1}{3}", "\\frac{1}{3}"),
        ("Answer: 5\\text{ meters}", "5"),
        ("Answer: $\\frac{1}{3} \\textbf{meters}$", "\\frac{1}{3}"),
        ("Answer: \uff14\uff12", "42"),
        ("Answer: \u22125", "-5"),
        ("Answer: 11,\\! 111,\\! 100", "11111100"),
        ("Answer: 1\\text{ and }2", "1and2"),  # "and" is not a unit
    ],
)
def test_answers_in_sentences_several_boxes_and_odd_characters_are_read(response, expected):
    assert normalize_answer(extract_answer(response)) == expected


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("  42 ", "42"),  # whitespace
        ("$42$", "42"),  # math delimiters
        ("The answer is $5$.", "5"),  # last math segment of prose
        ("\\(7\\)", "7"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),  # box unwrapped, \dfrac -> \frac
        ("\\tfrac12", "\\frac{1}{2}"),  # \tfrac and shorthand
        ("\\frac1{3}", "\\frac{1}{3}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\text{(B)}", "(B)"),  # \text{} unwrapped
        ("\\left( 1, 2 \\right)", "(1,2)"),  # \left/\right dropped
        ("1,000,000", "1000000"),  # thousands separators
        ("1{,}234", "1234"),
        ("10\\,000", "10000"),
        ("3.", "3"),  # trailing period
        ("90^\\circ", "90"),  # degree marks
        ("90^{\\circ}", "90"),
        ("45°", "45"),
        ("50\\%", "50"),  # percent
        ("\\$18.90", "18.90"),  # currency
        ("12 cm", "12"),  # units after a number
        ("5 square feet", "5"),
        ("10 \\text{ inches}^2", "10"),
        ("x = 5", "x=5"),  # equations stay whole here; verify compares "x = 5" with 5 by its value
        ("x \\geq 5", "x>=5"),  # relations in one spelling
        ("x \\neq 3", "x!=3"),
        ("042", "42"),  # leading zeros of integers
        ("-007", "-7"),
        ("+5", "5"),
        ("-0", "0"),
        ("**12**", "12"),  # markdown bold
        ("{{5}}", "5"),  # redundant braces
        ("[1, 2)", "[1,2)"),  # intervals keep their brackets
        ("4\x002\ufffd\ud800", "42"),  # control characters, U+FFFD and lone surrogates dropped
        ("", ""),
    ],
)
def test_normalize_answer_applies_each_documented_rule(raw, normalized):
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    "normalized, value",
    [
        ("42", Fraction(42)),
        ("-3", Fraction(-3)),
        ("0.50", Fraction(1, 2)),
        (".25", Fraction(1, 4)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{-1}{2}", Fraction(-1, 2)),
        ("-\\frac{6}{4}", Fraction(-3, 2)),
        ("\\frac{1}{0}", None),  # zero denominator: not a number
        ("\\sqrt{2}", None),
        ("1" * 65, None),  # too long to be an answer: compared as a string
        ("", None),
    ],
)
def test_as_rational_reads_integers_decimals_and_fractions_exactly(normalized, value):
    assert as_rational(normalized) == value


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2^{10}", Fraction(1024)),
        ("2^{-2}", Fraction(1, 4)),
        ("-2^2", Fraction(-4)),  # unary minus binds looser than ^
        ("2^{3^2}", Fraction(512)),  # right-associative
        ("3\\cdot14", Fraction(42)),
        ("5\\times10^3", Fraction(5000)),
        ("2(3+4)", Fraction(14)),  # juxtaposition multiplies
        ("\\frac{84}{2}", Fraction(42)),
        ("\\frac{1}{2}+\\frac{1}{3}", Fraction(5, 6)),
        ("\\sqrt{1764}", Fraction(42)),  # perfect square: exact
        ("\\sqrt[3]{27}", Fraction(3)),
        ("\\sqrt{\\frac{9}{4}}", Fraction(3, 2)),
        ("5!", Fraction(120)),
        ("\\sqrt{2}", 2**0.5),  # irrational: a float
        ("10^{10^{10}}", float("inf")),  # too big to compute exactly: overflows to inf instantly
        ("2^10", None),  # LaTeX reads 2^1 0: ambiguous, left to the symbolic step
        ("x+1", None),
        ("1/0", None),
        ("(1,2)", None),
        ("{" * 40 + "1" + "}" * 40, None),  # nested deeper than MAX_DEPTH
        ("1+" * 150 + "1", None),  # more than MAX_TOKENS tokens
    ],
)
def test_arithmetic_evaluate_is_exact_when_it_can_be_and_gives_up_outside_its_bounds(expression, value):
    result = arithmetic.evaluate(expression)
    if isinstance(value, float):
        assert isinstance(result, float) and (result == value or abs(result - value) < 1e-12)
    else:
        assert result == value and (value is None or isinstance(result, Fraction))


@pytest.mark.parametrize(
    "response, ground_truth, correct, method",
    [
        ("Answer: 42", "42", True, "exact"),
        ("Answer: 42", 42, True, "exact"),  # int ground truth
        ("Answer: 43", 42, False, "numeric"),
        ("Answer: 5.0", "5", True, "numeric"),
        ("Answer: 0.5", "\\frac{1}{2}", True, "numeric"),  # decimal vs fraction, exact
        ("Answer: 0.333", "\\frac13", False, "numeric"),  # not exactly 1/3
        ("Answer: 1/2", 0.5, True, "numeric"),  # float ground truth
        ("Answer: 2^{5}", "32", True, "numeric"),  # arithmetic on numbers, evaluated exactly
        ("Answer: \\sqrt{1765}", "42", False, "numeric"),  # 42.0119...: not within 1e-9
        ("Answer: 10^{10^{10}}", "5", False, "numeric"),  # overflow is decided at once, no sympy
        ("Answer: x + 1", "5", False, "identity"),  # x + 1 is not 5 at the evaluation points: no symbolic call
        ("Answer: (1, 5)", "5", False, "list"),  # a tuple is not a number
        ("Answer: \\pi", "3", False, "mismatch"),
        ("Answer: 7", ["6", "7"], True, "exact"),  # several acceptable answers
        ("Answer: 7", np.int64(7), True, "exact"),  # numpy scalar from a parquet column
        ("I cannot solve it.", "7", False, "no_answer"),
        ("Answer: $$", "7", False, "no_answer"),
        # decided without math-verify
        ("Answer: (1,4.5)", "(1,\\frac{9}{2})", True, "list"),
        ("Answer: x + x", "2x", True, "identity"),
        ("Answer: (x+1)^2", "x^2+2x+1", True, "identity"),
        ("Answer: \\{2, 1\\}", "\\{1,2\\}", True, "list"),
        ("Answer: 2, 1", "1, 2", True, "list"),  # bare lists are sets
        ("Answer: (2, 1)", "(1, 2)", False, "list"),  # tuples are ordered
        ("Answer: [0, 9)", "(0, 9)", False, "list"),  # so are the brackets of intervals
        ("Answer: \\pi/2", "\\frac{\\pi}{2}", True, "numeric"),
        # equations: "v = value" is its value; a real equation is not its right-hand side
        ("Answer: x = 5", "5", True, "exact"),
        ("Answer: 5", "y = 5", True, "exact"),
        ("Answer: 3 + 4 = 7", "7", True, "exact"),
        ("Answer: x = 2 + 3 = 5", "5", True, "exact"),
        ("Answer: x\\approx 11", "11", True, "exact"),
        ("Answer: 11a+c", "7 = 11a+c", False, "mismatch"),
        # long decimals are approximations; short ones and exact ones are not
        ("Answer: 0.0833333333333333", "\\frac{1}{12}", True, "approximate"),
        ("Answer: 0.3333333", "\\frac13", True, "approximate"),
        ("Answer: 1.41421356", "\\sqrt{2}", True, "approximate"),
        ("Answer: 0.08", "\\frac{1}{12}", False, "numeric"),
        ("Answer: 0.5000001", "0.5", False, "numeric"),
        ("Answer: 1,000", "1000", True, "exact"),
        # wrapped integers are compared at once: "$", a box and a full stop around an integer are its value
        ("Answer: $\\boxed{-7}$.", "-7", True, "exact"),
        ("Answer: \\boxed{8}", "$8$", True, "exact"),
        ("Answer: $\\boxed{9}", "9", True, "exact"),  # unbalanced wrappers take the normal rules
        # "\begin{pmatrix}" and "\end{pmatrix}" made a ground truth written without "$"
        # a sentence of two words ("pmatrix" twice), cut to its last number "3"; environment names are not words
        ("Answer: $\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}$", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
         True, "exact"),
    ],
)
def test_verify_decides_without_math_verify_where_the_rules_suffice(response, ground_truth, correct, method):
    verdict = verify(response, ground_truth, symbolic_check=False)
    assert (verdict.correct, verdict.method, verdict.error) == (correct, method, "")


def test_compute_score_has_verls_custom_reward_signature_and_keys():
    right = compute_score("math_dapo", "Thus.\nAnswer: 12", 12, extra_info={"index": 0})
    wrong = compute_score(data_source="math_dapo", solution_str="Answer: 13", ground_truth="12")
    missing = compute_score("math_dapo", "no idea", "12", None, reward_router_address=None)
    assert right == {"score": 1.0, "acc": True, "pred": "12", "verify_error": ""}
    assert wrong == {"score": -1.0, "acc": False, "pred": "13", "verify_error": ""}
    assert missing == {"score": -1.0, "acc": False, "pred": "", "verify_error": ""}


def test_verify_works_without_math_verify_installed_and_flags_what_it_skipped(monkeypatch, caplog):
    monkeypatch.setattr(symbolic, "math_verify_installed", lambda: False)
    verifier._warn_symbolic_off_once.cache_clear()
    with caplog.at_level("WARNING", logger="recipe_dapo.reward.verifier"):
        verdict = verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)")  # needs symbolic maths: wrong without it
        verify("Answer: \\tan(x)", "\\sin(x)")
    assert (verdict.correct, verdict.method, verdict.error, verdict.symbolic_skipped) == (False, "mismatch", "", True)
    assert sum("SYMBOLIC ANSWER CHECK IS OFF" in r.message for r in caplog.records) == 1  # loud, once
    assert verify("Answer: \\frac{3}{6}", "0.5").correct  # exact rules still apply
    assert not verify("Answer: 7", "8").symbolic_skipped  # decided by the rules: nothing skipped
    # Inexact but within 1e-9 relative: sqrt(3)/2 = 0.8660254037844386 on both sides, accepted without sympy.
    assert verify("Answer: \\sqrt{3}/2", "\\frac{\\sqrt{3}}{2}").method == "numeric"


# Wrong answers that a looser rule would accept (equations, huge powers, decimals and their kin): they must stay
# wrong with and without the symbolic step. A false positive teaches the policy to cheat.
FALSE_POSITIVE_TRAPS = [
    ("Answer: 0", "a + 3z = 0"),  # an equation is not its right-hand side
    ("Answer: 1", "x^2+y^2=1"),
    ("Answer: 10^{2000}", "10^{2001}"),  # beyond a float: compared exactly
    ("Answer: 2^{10000}", "2^{10001}"),
    ("Answer: 10^{100}+1", "10^{100}"),
    ("Answer: \\boxed{32, 349}", "32349"),  # a list, not a thousands separator
    ("Answer: 1, 234", "1234"),
    ("Answer: --33", "33"),  # a malformed number
    ("Answer: 0.08", "\\frac{1}{12}"),  # too short to be an approximation
    ("\\boxed{1} and \\boxed{4}", "1, 2"),
    ("Answer: (1, 2)", "(1, 2]"),
    ("Answer: $\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}$", "\\begin{pmatrix} -1/3 \\\\ 5/3 \\end{pmatrix}"),
    ("Answer: 3", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}"),  # was this ground truth's "answer"
    # each of the next three was scored right before the fix next to it (suite mathverify_*)
    ("Answer: 0,111", "111"),  # "0,111" is no thousands separator (a decimal comma or a list)
    ("Answer: \\frac{14}{3}", "x = -5, p = \\frac{14}{3}"),  # a list of equations, not x = (-5, p) = 14/3
    ("Answer: 2", "\\boxed{1} papers and \\boxed{2} bins"),  # the ground truth is the list 1, 2
    ("Answer: 1, 2", "\\boxed{1} no no no no no \\boxed{2}"),  # words between boxes: not one list
    ("Answer: (2,5),(2,7)", "p=5,q=2;p=7,q=2"),  # tuples in the order the ground truth names them
    ("Answer: 1, 1, 2", "1, 2"),  # numbers are not deduplicated (three unknowns may be 1, 1, 2)
    ("Answer: (1,2),(1,2)", "(1,2),(3,4)"),
    ("so 5 is the answer", "5"),  # "X is the answer" is read only when X is math right before the phrase
    ("Check whether $5$ is the answer.", "5"),  # ... and the sentence states it: no question or condition
    ("If $5$ is the answer, then the sum is 9", "5"),
    ("So $5$ is the answer?", "5"),
]


@pytest.mark.parametrize(
    "response, ground_truth",
    [
        # "{, }" is LaTeX's "{,}" (a comma without space), so 14{,}916 is 14916 (math-verify model output)
        ("Answer: 14 {, }916", "14916"),
        # a final-answer phrase right after math: the math ("$x \\leq 2$" and "x <= 2" are both x<=2)
        ("Thus $x <= 2$ is our answer.", "$x \\leq 2$"),
        # a list of equations: each item "x = -5" is compared by its value -5 (was read as the chain x = ... = 14/3)
        ("Answer: \\boxed{-5, \\frac{14}{3}}", "\\boxed{x = -5,\\ p = \\frac{14}{3}}"),
        # ground truths only: several boxes joined by "and" after at most one word, or several math
        # segments joined by "and"/"or"/commas, are one list; a box repeated is one answer
        ("Answer: 1, 2", "\\boxed{1} papers and \\boxed{2} bins"),
        ("Answer: 1, 2, 3", "$1$ and $2$ and $3$"),
        ("Answer: 840", "so \\boxed{840}.\n**Final Answer**\n\\boxed{840}"),
        # ground truths only: "p=5,q=2;p=7,q=2" is the set of tuples (p, q) = (5,2), (7,2)
        ("Answer: $(5,2),(7,2)$", "$p=5,q=2;p=7,q=2$"),
        # a set of tuples that lists one twice is still that set
        ("Answer: (1,2),(1,2),(3,4)", "(3,4),(1,2)"),
        # "y_2 =" between two boxes names the second one: both boxes are the answer (a list of two)
        ("\\(y_1 = \\boxed{2x+1} \\) and \\( y_2 = \\boxed{3x}\\)", "y_1 = 2x+1, y_2 = 3x"),
    ],
)
def test_multi_part_answers_and_final_answer_phrases_are_read_without_math_verify(response, ground_truth):
    verdict = verify(response, ground_truth, symbolic_check=False)
    assert verdict.correct and verdict.error == "", verdict


@pytest.mark.parametrize("symbolic_check", [False, None])
@pytest.mark.parametrize("response, ground_truth", FALSE_POSITIVE_TRAPS)
def test_wrong_answers_that_look_right_stay_wrong(response, ground_truth, symbolic_check):
    verdict = verify(response, ground_truth, symbolic_check=symbolic_check, timeout_s=30)
    assert not verdict.correct, verdict


@pytest.mark.parametrize(
    "ground_truth, error",
    [
        ({"answer": "42"}, "ground truth of type dict"),
        (None, "ground truth of type NoneType"),
        ("  ", "empty ground truth"),
        ([], "empty list of ground truths"),
        (b"\xff\xfe", "not UTF-8"),
        (True, "ground truth of type bool"),
    ],
)
def test_a_malformed_ground_truth_is_an_error_that_names_the_problem(ground_truth, error, caplog):
    # A dict ground truth scored -1 with an empty error, like a wrong answer
    with caplog.at_level("WARNING", logger="recipe_dapo.reward.verifier"):
        result = compute_score("math_dapo", "Answer: 42", ground_truth)
    assert (result["score"], result["acc"], result["pred"]) == (-1.0, False, "42")
    assert result["verify_error"].startswith("malformed ground truth") and error in result["verify_error"]
    assert "reward_model.ground_truth" in result["verify_error"]  # says where to fix it


def test_failure_log_details_the_first_few_then_counts(caplog):
    import logging

    from recipe_dapo.reward.failures import FailureLog

    log = FailureLog(logging.getLogger("test.failures"), "thing failed", detailed=2, summary_every_s=3600)
    with caplog.at_level("WARNING", logger="test.failures"):
        for i in range(50):
            try:
                raise ValueError(f"bad {i}")
            except ValueError as error:
                log.report(str(error), exc_info=error)
    # 2 detailed (with tracebacks) + 1 summary: the first failure after the details is reported at once,
    # the next 47 fall within summary_every_s and are only counted.
    assert len(caplog.records) == 3 and log.count == 50
    assert [r.exc_info is not None for r in caplog.records] == [True, True, False]
    assert "bad 0" in caplog.records[0].getMessage() and "1 more since the last report (3 in all)" in caplog.records[2].getMessage()


def test_an_exception_in_verification_scores_minus_one_and_is_reported(monkeypatch):
    def broken(*_):
        raise RuntimeError("boom")

    monkeypatch.setattr(verifier, "_compare", broken)
    verifier._verification_failures.count = 0
    result = compute_score("math_dapo", "Answer: 42", "42")
    assert result == {"score": -1.0, "acc": False, "pred": "42", "verify_error": "RuntimeError: boom"}


@needs_math_verify
@pytest.mark.parametrize(
    "answer, ground_truth, correct",
    [
        ("\\sqrt{3}/2", "\\frac{\\sqrt{3}}{2}", True),  # radicals
        ("3\\sqrt{2}", "\\sqrt{18}", True),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
        ("2^{10}", "1024", True),  # arithmetic of numbers against an integer
        ("5\\times10^3", "5000", True),
        ("\\{2, 1\\}", "\\{1,2\\}", True),  # sets
        ("(1, 3]", "(1,3]", True),  # intervals (equal after whitespace removal already)
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("2^{11}", "1024", False),
    ],
)
def test_symbolic_check_confirms_equivalent_forms(answer, ground_truth, correct):
    verifier.clear_symbolic_cache()
    verdict = verify(f"Answer: {answer}", ground_truth, symbolic_check=True, timeout_s=30)
    assert (verdict.correct, verdict.error) == (correct, "")


@needs_math_verify
def test_symbolic_time_out_kills_the_check_scores_minus_one_and_the_checker_recovers():
    checker = symbolic.default_checker()
    assert verify("Answer: 2^{3}", "8", timeout_s=30).correct  # warm: the child has imported sympy
    verifier.clear_symbolic_cache()
    kills = checker.kills
    start = time.monotonic()
    verdict = verify("Answer: 10^{10^{10}}", "\\pi", timeout_s=1.0)  # sympy builds a 10-billion-digit integer
    elapsed = time.monotonic() - start
    assert (verdict.correct, verdict.method) == (False, "error")
    assert verdict.error.startswith("time-out")
    assert elapsed < 1.0 + 0.25  # the limit, plus scheduling slack on a loaded CI machine
    assert checker.kills == kills + 1
    assert verify("Answer: 3^{2}", "9", timeout_s=30).correct  # a fresh child answers the next check


@pytest.mark.parametrize(
    "name, response",
    [
        ("empty", ""),
        ("100k characters", "Let me think. " * 7_000 + "\nAnswer: 42"),
        ("100k characters without answer", "a" * 100_000),
        ("deeply nested braces", "\\boxed{" * 50_000 + "42" + "}" * 50_000),
        ("unclosed nested braces", "\\boxed{" * 100_000),
        ("many answer markers", "Answer:" * 20_000),
        ("marker then blanks", "Answer:" + " " * 100_000),
        ("dollar storm", "$" * 100_000),
        ("number then words", "Answer: 1" + " a" * 50_000 + "!"),
        ("thousands lookalike", "Answer: " + "1,234" * 20_000 + "x"),
        ("replacement characters", "\ufffd" * 50_000 + "Answer: 42\ufffd"),
        ("lone surrogates", "Answer: 4\udc80\ud8002"),
        ("NUL and control bytes", "Answer: \x00\x01 42 \x7f"),
    ],
)
def test_pathological_responses_are_scored_within_the_fast_rules_budget(name, response):
    for ground_truth in ("42", 42, 4.2, None, ["42"], b"42"):
        elapsed = float("inf")
        for _ in range(3):  # the fastest of three: a scheduling hiccup on a busy CI machine is not the rule's cost
            start = time.perf_counter()
            result = compute_score("math_dapo", response, ground_truth, symbolic_check=False)
            elapsed = min(elapsed, time.perf_counter() - start)
        assert result["score"] in (1.0, -1.0) and isinstance(result["acc"], bool) and isinstance(result["pred"], str)
        assert elapsed < FAST_RULES_BUDGET_S, f"{name}: {elapsed * 1e3:.1f} ms"
        assert len(result["pred"]) <= verifier.MAX_REPORTED_CHARS


def test_invalid_utf8_decoded_with_replacement_still_finds_the_answer():
    raw = b"\xff\xfe\xc3 reasoning \xe2\x82\nAnswer: 42"
    assert compute_score("math_dapo", raw.decode("utf-8", errors="replace"), 42)["acc"]
    assert compute_score("math_dapo", raw, 42)["acc"]  # bytes are decoded the same way


def test_concurrent_calls_from_a_thread_pool_like_verls_reward_loop_all_return():
    # verl's reward loop calls compute_score from its event loop's thread pool; mix fast and symbolic cases.
    verifier.clear_symbolic_cache()
    cases = [("Answer: 42", 42, True), ("Answer: 41", 42, False), ("Answer: 2^{3}", 8, None)] * 20
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda c: compute_score("math_dapo", c[0], c[1], timeout_s=30), cases))
    for (_, _, expected), result in zip(cases, results):
        if expected is not None:
            assert result["acc"] is expected
        elif symbolic.math_verify_installed():
            assert result["acc"] is True and result["verify_error"] == ""


@needs_math_verify
def test_a_symbolic_time_out_is_never_cached_as_an_answer(monkeypatch):
    # A time-out (say under CPU load) was cached as "wrong" for the rest of the process
    real = symbolic.SymbolicChecker.equivalent
    calls = []

    def slow_once(self, gold, pred, timeout_s):
        calls.append(pred)
        if len(calls) == 1:
            raise symbolic.SymbolicTimeout("time-out: symbolic checker still checking at the limit")
        return real(self, gold, pred, timeout_s)

    monkeypatch.setattr(symbolic.SymbolicChecker, "equivalent", slow_once)
    verifier.clear_symbolic_cache()
    first = verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30)
    assert (first.correct, first.method) == (False, "error") and first.error.startswith("time-out")
    second = verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30)  # same call: asked again
    assert (second.correct, second.error, len(calls)) == (True, "", 2)
    assert verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30).correct and len(calls) == 2  # cached


@needs_math_verify
def test_after_a_killed_check_the_next_easy_check_needs_no_restart_of_math_verify():
    # The replacement of a killed checker was still importing math-verify, so the next easy
    # check timed out too (a cascade). Checkers are forked from a template that imported it once.
    checker = symbolic.default_checker()
    assert verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30).correct  # warm
    for round_ in range(3):
        verifier.clear_symbolic_cache()
        kills = checker.kills
        assert verify("Answer: 10^{10^{10}}", "\\pi", timeout_s=0.5).error.startswith("time-out")
        assert checker.kills == kills + 1
        start = time.monotonic()
        easy = verify(f"Answer: \\sqrt{{2}}\\sqrt{{{3 + round_}}}", f"\\sqrt{{{6 + 2 * round_}}}", timeout_s=1.0)
        assert (easy.correct, easy.error) == (True, ""), easy
        assert time.monotonic() - start < 1.0 + 0.25


@needs_math_verify
def test_threads_do_not_queue_behind_a_hard_check_and_every_call_stays_within_its_limit():
    # 4 threads on one checker waited for each other (14.7 s worst call against a 2 s limit)
    symbolic.default_checker()
    verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30)  # warm
    verifier.clear_symbolic_cache()
    limit = 1.5
    easy = [(f"Answer: \\sqrt{{2}}\\sqrt{{{n}}}", f"\\sqrt{{{2 * n}}}") for n in range(3, 15)]
    bombs = [(f"Answer: 10^{{10^{{{10 + n}}}}}", "\\pi") for n in range(4)]
    cases = bombs + easy

    def timed(case):
        start = time.monotonic()
        verdict = verify(*case, timeout_s=limit)
        return verdict, time.monotonic() - start

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(timed, cases))
    assert all(seconds < limit for _, seconds in results), [round(s, 2) for _, s in results]  # the whole call
    assert all(v.correct and v.error == "" for v, _ in results[len(bombs) :])
    assert all(v.error.startswith("time-out") for v, _ in results[: len(bombs)])


@needs_math_verify
def test_the_time_limit_covers_the_whole_call_not_only_the_symbolic_step(monkeypatch):
    # The symbolic step had the whole limit to itself, so time spent before it (extraction, the
    # rules, waiting for the GIL) made calls end late. Golden: 0.4 s before it + a runaway check must still
    # end within 1.0 s (it ended at 0.4 + 1.0 - 0.05 = 1.35 s before).
    verify("Answer: 2\\sin(x)\\cos(x)", "\\sin(2x)", timeout_s=30)  # warm
    verifier.clear_symbolic_cache()
    real = verifier.extract_answer
    monkeypatch.setattr(verifier, "extract_answer", lambda text: (time.sleep(0.4), real(text))[1])
    start = time.monotonic()
    verdict = verify("Answer: 10^{10^{10}}", "\\pi", timeout_s=1.0)
    assert verdict.error.startswith("time-out") and time.monotonic() - start < 1.0


@pytest.mark.parametrize("body", ["", "We compute.\n\n", "so \\boxed{3}.\n", "x" * 3000 + "\n", "<|im_end|>\n"])
@pytest.mark.parametrize(
    "last_line",
    [
        "Answer: 42", "answer:   -3  ", "**Answer:** $\\frac{3}{4}$", "**Final Answer:** 7", "The final answer: 8",
        "The  final answer: 8", "the final\tanswer: 8", "My final Answer\uff1a 9", "- Answer: * 5 *", "Answer:",
        "Answer: **", "So the answer: 5", "Answer: the answer: 6", "Answer: \\boxed{4}", "Answer: 3 <|im_end|>",
        "# ANSWER: 10", "Final** Answer: 11", "Answer: $$ 12 $$",
    ],
)
def test_the_fast_last_line_path_gives_what_the_general_rules_give(body, last_line):
    # The DAPO format "Answer: X" on the last line is read at once (throughput); it must agree with
    # the general rules (the tail window, then the whole response) on every ending, taken or not.
    response = body + last_line
    general = verifier._extract(verifier._before_special_tokens(response))[0]
    assert extract_answer(response) == general
