"""The names of the ``policy_lag/*`` metrics (``metrics`` computes them), importable without torch: the console and the
run report read them."""

LAG_PREFIX = "policy_lag/"
MAX_LAG = LAG_PREFIX + "max"
"""The largest lag trained in the step."""
STALE_GROUP_FRAC = LAG_PREFIX + "stale_group_frac"
"""Share of the step's trained groups an older policy generated (lag >= 1)."""


def lag_key(lag: int, name: str) -> str:
    """``policy_lag/<lag>/<name>``: ``groups``, ``log_is_weight_abs_mean``, ``is_weight_truncated_frac``."""
    return f"{LAG_PREFIX}{int(lag)}/{name}"
