"""Overlong responses (DAPO section 3.4), in one home: shaping the reward, telling truncation, filtering the loss.

- ``shaping``     length penalties added to the correctness reward, in a small registry (``docs/registries.md``);
                  a new variant is one function ``(length, max_resp_len, buffer_len, factor) -> float`` plus
                  ``@register_shaping("name")``, chosen with ``reward.reward_kwargs.overlong_buffer_cfg.shape``
- ``truncation``  the one rule for "truncated": the response used the whole rollout budget and did not end in a
                  stop token; the reward manager applies it per response (the ``truncated`` column) and the
                  filter reads that column (or applies the same rule to the batch's tensors)
- ``filter``      overlong filtering: truncated responses add no policy-gradient loss
- ``metrics``     every ``overlong/*`` metric, from the reward columns and the filter

Pure maths on numbers, except ``truncation.truncated_rows`` and ``filter``, which import torch when called.
"""

from recipe_dapo.overlong.filter import apply_overlong_filter
from recipe_dapo.overlong.metrics import overlong_metrics
from recipe_dapo.overlong.shaping import (
    SHAPINGS,
    check_overlong_buffer,
    get_shaping,
    register_shaping,
    soft_overlong_penalty,
)
from recipe_dapo.overlong.truncation import TRUNCATED_COLUMN, is_truncated, truncated_rows

__all__ = [
    "SHAPINGS",
    "TRUNCATED_COLUMN",
    "apply_overlong_filter",
    "check_overlong_buffer",
    "get_shaping",
    "is_truncated",
    "overlong_metrics",
    "register_shaping",
    "soft_overlong_penalty",
    "truncated_rows",
]
