"""``reward.reward_kwargs`` for the ``recipe_dapo`` reward manager, read and checked once at start-up.

Keys (all optional; the first five have the meaning they have for verl's own ``dapo`` manager)::

    reward:
      reward_kwargs:
        overlong_buffer_cfg:
          enable: false           # soft overlong punishment (paper eq. 13) on/off
          len: 4096               # L_cache, the punishment buffer at the end of the length budget
          penalty_factor: 1.0     # scale of the penalty (1.0 in the paper)
          shape: soft             # the registered length shaping (recipe_dapo.overlong.shaping; soft: eq. 13)
          log: false              # accepted for compatibility; overlong keys are always reported
        max_resp_len: null        # L_max; null means data.max_response_length
        verify_timeout_s: 2.0     # limit of one symbolic (math-verify) check
        symbolic_check: null      # null: use math-verify when installed; true: require it; false: never
        custom_score_timeout_s: 60.0  # limit of a user's reward.custom_reward_function per sample
        stall_warning_s: 120.0    # warn (once per stall) when no sample finishes scoring for this long

and, from the recipe's ``dapo.health`` (``recipe_dapo.config.settings.HealthSettings``), the limits that stop the run:
``max_reward_failure_ratio``, ``reward_failure_window`` and ``max_abandoned_reward_calls``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe_dapo.config import select
from recipe_dapo.config.settings import HealthSettings

from recipe_dapo.overlong.shaping import check_overlong_buffer, get_shaping
from recipe_dapo.reward.verifier import DEFAULT_TIMEOUT_S

_KWARGS = "reward.reward_kwargs"
DEFAULT_STALL_WARNING_S = 120.0


@dataclass(frozen=True)
class RewardSettings:
    """Everything the manager reads from the config, already checked."""

    overlong_enable: bool = False
    """Add the soft overlong penalty to the correctness score."""
    overlong_buffer_len: int = 0
    """L_cache in tokens (only meaningful when ``overlong_enable``)."""
    overlong_penalty_factor: float = 1.0
    """Multiplier of the penalty."""
    overlong_shape: str = "soft"
    """The registered length shaping (``recipe_dapo.overlong.shaping``): ``soft`` is the paper's eq. 13."""
    max_resp_len: int = 0
    """L_max in tokens, the end of the punishment buffer."""
    rollout_budget: int = 0
    """Tokens the rollout may generate; a response that used them all without EOS was truncated."""
    verify_timeout_s: float = DEFAULT_TIMEOUT_S
    """Wall-clock limit of one symbolic check of our verifier."""
    symbolic_check: bool | None = None
    """math-verify for non-identical answers: None = when installed, True = required, False = off."""
    custom_score_timeout_s: float = 60.0
    """Wall-clock limit of a user's ``compute_score`` for one sample."""
    stall_warning_s: float = DEFAULT_STALL_WARNING_S
    """Seconds without a finished sample (while some are in flight) before the watchdog warns."""
    max_failure_ratio: float = HealthSettings.max_reward_failure_ratio
    """``dapo.health.max_reward_failure_ratio``: a larger share of failed samples stops the run (1: never)."""
    failure_window: int = HealthSettings.reward_failure_window
    """``dapo.health.reward_failure_window``: samples of one worker over which that share is taken."""
    max_abandoned_calls: int = HealthSettings.max_abandoned_reward_calls
    """``dapo.health.max_abandoned_reward_calls``: timed-out calls of a user's function still running (0: no cap)."""

    @classmethod
    def from_config(cls, config: Any) -> RewardSettings:
        """Read ``reward.reward_kwargs`` (and the lengths it defaults to) from verl's trainer config."""
        max_response_length = config_value(config, "data.max_response_length")
        max_resp_len = config_value(config, f"{_KWARGS}.max_resp_len")
        if max_resp_len is None:
            max_resp_len = max_response_length
        rollout_budget = config_value(config, "actor_rollout_ref.rollout.response_length")
        if rollout_budget is None:
            rollout_budget = max_response_length
        for key, value in ((f"{_KWARGS}.max_resp_len", max_resp_len), ("data.max_response_length", rollout_budget)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{key} must be a positive number of tokens, got {value!r}; set it in the config")

        buffer = config_value(config, f"{_KWARGS}.overlong_buffer_cfg") or {}
        enable = bool(buffer.get("enable", False))
        buffer_len = buffer.get("len", 0) if enable else 0
        penalty_factor = float(buffer.get("penalty_factor", 1.0))
        shape = str(buffer.get("shape", "soft"))
        if enable:
            get_shaping(shape)  # an unknown name is refused with the registered ones
            if not isinstance(buffer_len, int) or isinstance(buffer_len, bool):
                raise ValueError(f"{_KWARGS}.overlong_buffer_cfg.len must be an integer, got {buffer_len!r}")
            check_overlong_buffer(max_resp_len, buffer_len)
            if penalty_factor < 0:
                raise ValueError(
                    f"{_KWARGS}.overlong_buffer_cfg.penalty_factor must be >= 0 (it scales a penalty), "
                    f"got {penalty_factor}"
                )

        seconds = {
            key: config_value(config, f"{_KWARGS}.{key}", default)
            for key, default in (
                ("verify_timeout_s", DEFAULT_TIMEOUT_S),
                ("custom_score_timeout_s", 60.0),
                ("stall_warning_s", DEFAULT_STALL_WARNING_S),
            )
        }
        for key, value in seconds.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{_KWARGS}.{key} must be a positive number of seconds, got {value!r}")
        verify_timeout_s, custom_timeout_s, stall_warning_s = (float(value) for value in seconds.values())
        symbolic_check = config_value(config, f"{_KWARGS}.symbolic_check")
        if symbolic_check not in (None, True, False):
            raise ValueError(
                f"{_KWARGS}.symbolic_check must be null (use math-verify when installed), true or false, "
                f"got {symbolic_check!r}"
            )
        health = {
            key: config_value(config, f"dapo.health.{key}", getattr(HealthSettings, key))
            for key in ("max_reward_failure_ratio", "reward_failure_window", "max_abandoned_reward_calls")
        }
        ratio = health["max_reward_failure_ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise ValueError(f"dapo.health.max_reward_failure_ratio must lie in [0, 1] (1: never stop), got {ratio!r}")
        for key, minimum in (("reward_failure_window", 1), ("max_abandoned_reward_calls", 0)):
            value = health[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"dapo.health.{key} must be an integer >= {minimum}, got {value!r}")
        return cls(
            max_failure_ratio=float(ratio),
            failure_window=health["reward_failure_window"],
            max_abandoned_calls=health["max_abandoned_reward_calls"],
            overlong_enable=enable,
            overlong_buffer_len=buffer_len,
            overlong_penalty_factor=penalty_factor,
            overlong_shape=shape,
            max_resp_len=max_resp_len,
            rollout_budget=rollout_budget,
            verify_timeout_s=verify_timeout_s,
            symbolic_check=symbolic_check,
            custom_score_timeout_s=custom_timeout_s,
            stall_warning_s=stall_warning_s,
        )


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``config.a.b.c`` or ``default`` when a level is missing or null (DictConfig or plain dicts)."""
    if isinstance(config, DictConfig):
        value = select(config, key, default=default)
        if isinstance(value, DictConfig):
            return OmegaConf.to_container(value, resolve=True)
        return default if value is None else value
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return default
        node = node[part]
    return node
