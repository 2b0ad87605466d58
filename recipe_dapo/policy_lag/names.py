"""The names of the ``policy_lag/*`` metrics (``metrics`` computes them), importable without torch: the console and the
run report read them. :data:`METRICS` says what each means (``docs/registries.md`` renders it with the other metrics
of ``tracking.metric_names``)."""

LAG_PREFIX = "policy_lag/"
MAX_LAG = LAG_PREFIX + "max"
"""The largest lag trained in the step."""
STALE_GROUP_FRAC = LAG_PREFIX + "stale_group_frac"
"""Share of the step's trained groups an older policy generated (lag >= 1)."""
PER_LAG = ("groups", "log_is_weight_abs_mean", "is_weight_truncated_frac")
"""The names logged per lag k (``lag_key``)."""


def lag_key(lag: int, name: str) -> str:
    """``policy_lag/<lag>/<name>``: ``groups``, ``log_is_weight_abs_mean``, ``is_weight_truncated_frac``."""
    return f"{LAG_PREFIX}{int(lag)}/{name}"


PRODUCER = "recipe_dapo.policy_lag.metrics"

METRICS: tuple[tuple[str, str, str], ...] = (
    (MAX_LAG, PRODUCER, "the largest policy lag trained in the step (0 when everything is fresh)"),
    (STALE_GROUP_FRAC, PRODUCER, "share of the step's trained groups an older policy generated (lag >= 1)"),
    (lag_key(0, PER_LAG[0]).replace("/0/", "/<k>/"), PRODUCER,
     "trained groups whose oldest row has lag k (k = 0 logged every step)"),
    (lag_key(0, PER_LAG[1]).replace("/0/", "/<k>/"), PRODUCER,
     "mean |log w| over the valid tokens of rows with lag k, w the importance weight pi_old / pi_rollout (at k = 0 "
     "the rollout engine against the trainer on the same weights)"),
    (lag_key(0, PER_LAG[2]).replace("/0/", "/<k>/"), PRODUCER,
     "share of those tokens whose weight the behaviour-policy correction truncated or rejected (0 when none runs)"),
)
"""(name, producer module, one line of meaning) of every ``policy_lag/*`` metric; ``<k>`` stands for the lag."""
