"""Length shaping of the reward: penalties for responses that run into the length limit.

Soft overlong punishment (paper eq. 13, ``shape: soft``), with L_max the maximum response length and L_cache the
punishment buffer at its end::

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                  if |y| > L_max

The result is scaled by ``penalty_factor`` (1.0 in the paper) and added to the correctness reward. A shaping is
a function ``(response_length, max_resp_len, buffer_len, penalty_factor) -> float`` registered by name with the one
line that says what it does; ``docs/registries.md`` lists every registered shaping (``scripts/registries.py``).
"""

from __future__ import annotations

from typing import Callable, Optional

Shaping = Callable[[int, int, int, float], float]

SHAPINGS: dict[str, Shaping] = {}
"""name -> shaping function (``reward.reward_kwargs.overlong_buffer_cfg.shape``)."""

SHAPING_DOCS: dict[str, str] = {}
"""name -> what the shaping does, one line (``docs/registries.md`` shows it)."""


def register_shaping(name: str, doc: Optional[str] = None) -> Callable[[Shaping], Shaping]:
    """Register a length shaping under ``name``; ``doc``: what it does, one line (default: the first paragraph of the
    function's docstring)."""

    def decorator(function: Shaping) -> Shaping:
        if name in SHAPINGS and SHAPINGS[name] is not function:
            raise ValueError(f"overlong shaping {name!r} is already registered ({SHAPINGS[name].__module__})")
        SHAPINGS[name] = function
        meaning = doc if doc is not None else (function.__doc__ or "").strip().split("\n\n")[0]
        SHAPING_DOCS[name] = " ".join(meaning.split())
        return function

    return decorator


def get_shaping(name: str) -> Shaping:
    if name not in SHAPINGS:
        raise ValueError(
            f"reward.reward_kwargs.overlong_buffer_cfg.shape={name!r} is not a registered overlong shaping; "
            f"choose one of {sorted(SHAPINGS)} or register one with recipe_dapo.overlong.register_shaping"
        )
    return SHAPINGS[name]


def check_overlong_buffer(max_resp_len: int, buffer_len: int) -> None:
    """Refuse a buffer that leaves no room for an unpunished response (or a non-positive one)."""
    if buffer_len <= 0:
        raise ValueError(
            f"overlong buffer length must be positive, got {buffer_len}; "
            "set reward.reward_kwargs.overlong_buffer_cfg.enable=False to turn soft punishment off"
        )
    if buffer_len >= max_resp_len:
        raise ValueError(
            f"overlong buffer ({buffer_len} tokens) must be shorter than the maximum response length "
            f"({max_resp_len}); lower reward.reward_kwargs.overlong_buffer_cfg.len or raise "
            "reward.reward_kwargs.max_resp_len / data.max_response_length"
        )


@register_shaping("soft", doc="The paper's soft overlong punishment (eq. 13), times ``penalty_factor``: 0 up to "
                  "L_max - L_cache, then falling linearly to -1 at L_max, -1 beyond.")
def soft_overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """Paper eq. 13 for one response, times ``penalty_factor``; 0 when no shaping applies.

    >>> soft_overlong_penalty(12, max_resp_len=16, buffer_len=4)   # exactly L_max - L_cache
    0.0
    >>> soft_overlong_penalty(14, max_resp_len=16, buffer_len=4)   # half way into the buffer
    -0.5
    >>> soft_overlong_penalty(16, max_resp_len=16, buffer_len=4)   # at L_max
    -1.0
    >>> soft_overlong_penalty(17, max_resp_len=16, buffer_len=4)   # beyond L_max
    -1.0
    """
    check_overlong_buffer(max_resp_len, buffer_len)
    expected_len = max_resp_len - buffer_len
    if response_length <= expected_len:
        return 0.0
    if response_length > max_resp_len:
        return -1.0 * penalty_factor
    return (expected_len - response_length) / buffer_len * penalty_factor
