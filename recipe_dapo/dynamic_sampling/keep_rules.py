"""Keep rules: which groups carry a learning signal, chosen by ``dapo.dynamic_sampling.keep_rule``.

A keep rule is a function of one round's per-group statistics (:class:`GroupView`, arrays of shape [G]) that
returns a boolean mask [G] of the groups to keep. Its parameters are keyword-only arguments, given by
``dapo.dynamic_sampling.keep_rule_args``; a parameter without a default must be given. A new rule is one
function plus its registration, with the one line that says what it keeps::

    @register_keep_rule("top_heavy", check=lambda args: [] if args["above"] >= 0 else ["above must be >= 0"],
                        doc="groups with spread whose success rate is at least ``above``")
    def top_heavy(groups: GroupView, *, above: float = 0.5) -> np.ndarray:
        return groups.varied & (groups.success_rate >= above)

Whatever the rule, a group of one response is kept (its spread is undefined, not zero), and with the filter off
(``algorithm.filter_groups.enable=false``) every group is kept. Every registered rule, its parameters and what it
keeps are listed in ``docs/registries.md``, generated from :data:`KEEP_RULES` (``scripts/registries.py``). The
rules other than ``spread`` (the default, the paper's eq. 11) are on top of it: a group whose responses all score
the same has zero GRPO advantage whatever its mean, so no rule trains on it.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Optional

import numpy as np

KEY = "dapo.dynamic_sampling.keep_rule"
ARGS_KEY = "dapo.dynamic_sampling.keep_rule_args"
DEFAULT_KEEP_RULE = "spread"


@dataclass(frozen=True)
class GroupView:
    """What a keep rule sees of a round: one entry per group."""

    sizes: np.ndarray  # [G] responses per group
    mean: np.ndarray  # [G] mean metric value
    std: np.ndarray  # [G] standard deviation of the metric (ddof=0)
    spread: np.ndarray  # [G] max - min of the metric
    success_rate: np.ndarray  # [G] fraction of responses whose metric is above SOLVED_ABOVE (0)
    varied: np.ndarray  # [G] bool: spread above the same-value tolerance


KeepDecision = Callable[[GroupView], np.ndarray]
"""A rule with its arguments bound: GroupView -> bool mask [G]."""

CheckArgs = Callable[[Mapping[str, Any]], list]
"""Rule arguments (defaults filled in) -> list of problems (strings, empty when the arguments are valid)."""


@dataclass(frozen=True)
class KeepRule:
    name: str
    decide: Callable[..., np.ndarray]
    parameters: Mapping[str, inspect.Parameter]
    check: Optional[CheckArgs]
    doc: str = ""
    """What the rule keeps, one line (``docs/registries.md`` shows it)."""

    def defaults(self) -> dict[str, Any]:
        return {name: p.default for name, p in self.parameters.items() if p.default is not inspect.Parameter.empty}


KEEP_RULES: dict[str, KeepRule] = {}


def register_keep_rule(name: str, check: Optional[CheckArgs] = None, doc: Optional[str] = None):
    """Register ``decide(groups, *, arg=default, ...) -> bool mask`` under ``name`` (a decorator). ``doc``: what the
    rule keeps, one line (default: the first line of ``decide``'s docstring)."""

    def register(decide: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        if name in KEEP_RULES:
            raise ValueError(f"keep rule {name!r} is already registered")
        params = list(inspect.signature(decide).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise TypeError(f"keep rule {name!r}: the first parameter must be the GroupView")
        loose = [p.name for p in params[1:] if p.kind is not p.KEYWORD_ONLY]
        if loose:
            raise TypeError(f"keep rule {name!r}: parameters {loose} must be keyword-only (after '*')")
        meaning = doc if doc is not None else first_line(decide.__doc__)
        KEEP_RULES[name] = KeepRule(name, decide, {p.name: p for p in params[1:]}, check, " ".join(meaning.split()))
        return decide

    return register


def first_line(docstring: Optional[str]) -> str:
    """A docstring's first paragraph on one line ("" for none)."""
    return " ".join((docstring or "").strip().split("\n\n")[0].split())


def keep_rule_problems(name: Any, args: Optional[Mapping[str, Any]]) -> list[str]:
    """Everything wrong with a keep rule name and its arguments, each with its key and fix (empty: valid)."""
    if not isinstance(name, str) or name not in KEEP_RULES:
        close = difflib.get_close_matches(str(name), KEEP_RULES, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return [f"{KEY}={name!r} is not a registered keep rule; {hint}the rules are {', '.join(sorted(KEEP_RULES))}"]
    rule = KEEP_RULES[name]
    args = dict(args or {})
    problems = []
    for key in args:
        if key not in rule.parameters:
            close = difflib.get_close_matches(key, rule.parameters, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            known = ", ".join(rule.parameters) or "none"
            problems.append(f"{ARGS_KEY}.{key} is not a parameter of keep rule {name!r}; {hint}its parameters: {known}")
    for key, parameter in rule.parameters.items():
        if key not in args and parameter.default is inspect.Parameter.empty:
            problems.append(f"keep rule {name!r} needs {ARGS_KEY}.{key} (no default)")
    if problems:
        return problems
    values = {**rule.defaults(), **args}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"{ARGS_KEY}.{key} must be a finite number, got {value!r}")
    if problems or rule.check is None:
        return problems
    return [f"keep rule {name!r}: {problem}" for problem in rule.check(values)]


def resolve_keep_rule(name: str, args: Optional[Mapping[str, Any]] = None) -> KeepDecision:
    """The rule ``name`` with its arguments bound (defaults filled in); ValueError listing every problem."""
    problems = keep_rule_problems(name, args)
    if problems:
        raise ValueError("; ".join(problems))
    rule = KEEP_RULES[name]
    return partial(rule.decide, **{**rule.defaults(), **dict(args or {})})


# ----------------------------------------------------------------------------- the rules


@register_keep_rule("spread")
def spread(groups: GroupView) -> np.ndarray:
    """The paper's rule (eq. 11): the responses do not all score the same."""
    return groups.varied


def _check_band(args: Mapping[str, Any]) -> list[str]:
    low, high = args["low"], args["high"]
    problems = [f"{ARGS_KEY}.{k}={v} is outside [0, 1] (a success rate)" for k, v in args.items() if not 0 <= v <= 1]
    if not problems and low > high:
        problems.append(f"{ARGS_KEY}.low={low} is above high={high}: did you swap them?")
    return problems


@register_keep_rule("band", check=_check_band)
def band(groups: GroupView, *, low: float = 0.2, high: float = 0.8) -> np.ndarray:
    """Groups with spread whose success rate (the share of responses whose metric is above 0: for ``acc`` the group
    mean, for ``score`` the share right) lies in [low, high], bounds included, e.g. 0.2-0.8."""
    return groups.varied & (groups.success_rate >= low) & (groups.success_rate <= high)


def _check_min_std(args: Mapping[str, Any]) -> list[str]:
    return [] if args["min_std"] >= 0 else [f"{ARGS_KEY}.min_std={args['min_std']} must be >= 0"]


@register_keep_rule("min_std", check=_check_min_std)
def min_std(groups: GroupView, *, min_std: float) -> np.ndarray:
    """Groups with spread whose metric has a standard deviation (population, ddof=0) of at least ``min_std``."""
    return groups.varied & (groups.std >= min_std)
