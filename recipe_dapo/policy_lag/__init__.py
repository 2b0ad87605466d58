"""The behaviour policy of every trained token, and the correction for it, in one home. Pure: numpy and torch only.

A row the recipe trains may come from an older policy than the one being updated: a qualifying group carried over
by dynamic sampling (``dapo.dynamic_sampling.max_staleness`` > 0), a group pooled in a checkpoint and resumed, a
prompt that verl v1's asynchronous mode resumed after an update. Every generated row is stamped with its *policy
version* (``versions``: the policy updates done before the weights that generated it); at the update the trainer
computes each row's *lag* (updates since then), the per-lag metrics (``metrics``), and verl's rollout correction
weighs each token by the behaviour policy that actually sampled it. ``correction`` decides, at start-up, whether the
recipe turns that correction on and says why.

The package imports numpy only: the start-up rules and the config's resolver use ``correction`` before torch is
imported; ``metrics`` (torch) is imported where the metrics are computed.
"""

from recipe_dapo.policy_lag.correction import (
    CORRECTION_MODES,
    DEFAULT_IS_LEVEL,
    configured_level,
    correction_line,
    correction_not_reached,
    default_rollout_is,
    reuse_reasons,
)
from recipe_dapo.policy_lag.versions import POLICY_VERSION, UnknownBehaviourPolicy, row_lags, stamp

__all__ = [
    "CORRECTION_MODES",
    "DEFAULT_IS_LEVEL",
    "POLICY_VERSION",
    "UnknownBehaviourPolicy",
    "configured_level",
    "correction_line",
    "correction_not_reached",
    "default_rollout_is",
    "reuse_reasons",
    "row_lags",
    "stamp",
]
