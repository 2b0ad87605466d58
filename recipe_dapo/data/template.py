"""The DAPO user prompt template (paper, appendix / the DAPO-Math-17k release).

A problem ``P`` becomes the single user turn::

    DAPO_PROMPT_PREFIX + P + DAPO_PROMPT_SUFFIX

The template is idempotent here: wrapping an already wrapped problem returns it unchanged, so
converters can "apply or verify" it without doubling it.
"""

from __future__ import annotations

DAPO_PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def is_dapo_templated(text: str) -> bool:
    """True when ``text`` already starts with the DAPO prefix and ends with the DAPO suffix."""
    return text.startswith(DAPO_PROMPT_PREFIX) and text.endswith(DAPO_PROMPT_SUFFIX)


def strip_dapo_template(text: str) -> str:
    """The bare problem inside a templated prompt (``text`` unchanged when it is not templated)."""
    if not is_dapo_templated(text):
        return text
    return text[len(DAPO_PROMPT_PREFIX) : len(text) - len(DAPO_PROMPT_SUFFIX)]


def apply_dapo_template(problem: str) -> str:
    """Wrap a bare problem in the DAPO template; an already wrapped prompt is returned as is.

    A half-wrapped prompt (only the prefix, or only the suffix) loses that half before wrapping, so the
    template is never doubled. Surrounding whitespace of a bare problem is stripped first, so
    ``" P \\n"`` and ``"P"`` give the same prompt (and therefore deduplicate together).

    >>> apply_dapo_template(apply_dapo_template("1+1?")) == apply_dapo_template("1+1?")
    True
    """
    if is_dapo_templated(problem):
        return problem
    if problem.startswith(DAPO_PROMPT_PREFIX):
        problem = problem[len(DAPO_PROMPT_PREFIX) :]
    if problem.endswith(DAPO_PROMPT_SUFFIX):
        problem = problem[: -len(DAPO_PROMPT_SUFFIX)]
    return DAPO_PROMPT_PREFIX + problem.strip() + DAPO_PROMPT_SUFFIX
