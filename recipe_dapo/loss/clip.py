"""Clip-higher and dual clip (DAPO section 3.1): the clip bounds of the policy loss, read and checked in one place.

The importance ratio r is clipped to [1 - eps_low, 1 + eps_high]; DAPO decouples the two (0.2 / 0.28 in the
paper) so that low-probability tokens can grow. The dual clip caps the loss of a negative-advantage token whose
ratio exceeds ``clip_ratio_c``. The start-up check and the ``dapo`` loss both call :func:`clip_bounds`, so they
accept and refuse the same values. Pure: no torch, no verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ACTOR = "actor_rollout_ref.actor"

# The clip fractions the dapo loss logs (``recipe_dapo.loss.dapo``); the console and the run report import them.
CLIPFRAC = "actor/pg_clipfrac"
CLIPFRAC_EPS_HIGH = "actor/pg_clipfrac_eps_high"
CLIPFRAC_EPS_LOW = "actor/pg_clipfrac_eps_low"
CLIPFRAC_DUAL = "actor/pg_clipfrac_lower"  # verl's name for the dual clip's fraction


@dataclass(frozen=True)
class ClipBounds:
    """The clip parameters of one update: the band is [1 - eps_low, 1 + eps_high]; dual clip caps at c."""

    eps_low: float
    eps_high: float
    clip_ratio_c: float


def clip_problems(actor: Any) -> list[str]:
    """Every problem with the actor's clip settings (``clip_ratio_low`` / ``_high`` fall back to ``clip_ratio``)."""
    eps_low, eps_high, clip_ratio_c = _configured(actor)
    if eps_low is None or eps_high is None:
        return [
            f"{ACTOR}.clip_ratio_low / clip_ratio_high are not set: set both (the paper uses 0.2 and 0.28), or "
            "clip_ratio for both"
        ]
    problems = []
    if not 0.0 < float(eps_low) < 1.0:
        problems.append(
            f"{ACTOR}.clip_ratio_low={eps_low} must lie in (0, 1): the lower bound of the ratio is 1 - clip_ratio_low "
            "(0 freezes every token whose ratio fell); the paper uses 0.2"
        )
    if not float(eps_high) > 0.0:
        problems.append(f"{ACTOR}.clip_ratio_high={eps_high} must be > 0 (the paper uses 0.28)")
    elif float(eps_high) < float(eps_low) and _loss_mode(actor) != "cispo":  # CISPO: a far floor, a near ceiling
        problems.append(
            f"{ACTOR}.clip_ratio_high={eps_high} is below clip_ratio_low={eps_low}: did you swap them? Clip-higher "
            "widens the upper bound (the paper: low 0.2, high 0.28); for symmetric clipping set both equal"
        )
    if not float(clip_ratio_c) > 1.0:
        problems.append(
            f"{ACTOR}.clip_ratio_c={clip_ratio_c} must be greater than 1 (dual clip caps the loss of "
            "negative-advantage tokens whose ratio exceeds it); use e.g. 3.0, verl's default, or 10"
        )
    return problems


def clip_bounds(actor: Any) -> ClipBounds:
    """The checked clip bounds of an actor config (verl's ``ActorConfig`` or a DictConfig); ValueError if invalid."""
    problems = clip_problems(actor)
    if problems:
        raise ValueError("; ".join(problems))
    return ClipBounds(*(float(value) for value in _configured(actor)))


def _loss_mode(actor: Any) -> str | None:
    policy_loss = actor.get("policy_loss", None)
    return None if policy_loss is None else policy_loss.get("loss_mode", None)


def _configured(actor: Any) -> tuple:
    """(eps_low, eps_high, clip_ratio_c) as configured, the bounds falling back to ``clip_ratio`` as in verl."""
    clip_ratio = actor.get("clip_ratio", 0.2)
    low, high = actor.get("clip_ratio_low", None), actor.get("clip_ratio_high", None)
    return (clip_ratio if low is None else low, clip_ratio if high is None else high, actor.get("clip_ratio_c", 3.0))
