"""DAPO dynamic sampling (paper section 3.2) as pure logic: no Ray, no verl import.

Where things live:

- ``group_stats``    per-group statistics of the filter metric and the keep decision (vectorised)
- ``keep_rules``     which groups qualify: the registered rules (``docs/registries.md``), chosen by config
- ``sizing``         the keep-rate estimate and how many prompts the next round asks for
- ``buffer``         the FIFO pool of qualifying groups (surplus carry-over)
- ``sampler``        ``DynamicSampler``: the step protocol, metrics, state_dict
- ``rounds``         ``collect_step``: the round loop of a step over a round source (the classic trainer's, or a
                     simulated one); ``collect_streaming_step``: the same step over a streaming source (verl v1)
- ``prompt_stream``  ``PromptStream``: any number of prompts across dataloader batches and epochs
- ``skipping``       ``PromptSkipper``: per-prompt outcome history, skipping prompts before generation (GRESO)
- ``prompt_keys``    the stable key of a prompt (verl: ``data_source`` and ``extra_info.index``)
- ``batch_ops``      how the payload is touched (numpy arrays or verl ``DataProto``)
- ``config``         ``DynamicSamplingConfig``: ``algorithm.filter_groups.*`` + ``dapo.dynamic_sampling.*``

A new round-sizing rule goes in ``sizing.next_round_prompts`` with its name added to
``config.ROUND_SIZINGS``; a new keep rule is a function plus ``@register_keep_rule`` in ``keep_rules``; the
trainer only calls ``collect_step`` with its round source.
"""

from recipe_dapo.dynamic_sampling.batch_ops import DATAPROTO_OPS, NUMPY_OPS, BatchOps
from recipe_dapo.dynamic_sampling.config import DynamicSamplingConfig, DynamicSamplingConfigError, SkipSettings
from recipe_dapo.dynamic_sampling.group_stats import GroupStats, group_statistics, trajectory_metric
from recipe_dapo.dynamic_sampling.keep_rules import KEEP_RULES, GroupView, register_keep_rule, resolve_keep_rule
from recipe_dapo.dynamic_sampling.prompt_keys import PromptKeyError, prompt_key
from recipe_dapo.dynamic_sampling.prompt_stream import PromptStream
from recipe_dapo.dynamic_sampling.rounds import (
    CollectedStep,
    GroupStream,
    RoundSource,
    ScoredRound,
    collect_step,
    collect_streaming_step,
)
from recipe_dapo.dynamic_sampling.sampler import (
    METRIC_PREFIX,
    SKIP_METRIC_PREFIX,
    DynamicSampler,
    DynamicSamplingExhausted,
    DynamicSamplingStalled,
)
from recipe_dapo.dynamic_sampling.sizing import KeepRateEstimate, next_round_prompts
from recipe_dapo.dynamic_sampling.skipping import PromptSkipper

__all__ = [
    "KEEP_RULES",
    "SKIP_METRIC_PREFIX",
    "BatchOps",
    "DynamicSamplingConfigError",
    "GroupView",
    "PromptKeyError",
    "PromptSkipper",
    "SkipSettings",
    "prompt_key",
    "register_keep_rule",
    "resolve_keep_rule",
    "CollectedStep",
    "DATAPROTO_OPS",
    "NUMPY_OPS",
    "DynamicSampler",
    "DynamicSamplingConfig",
    "DynamicSamplingExhausted",
    "DynamicSamplingStalled",
    "GroupStats",
    "GroupStream",
    "KeepRateEstimate",
    "METRIC_PREFIX",
    "PromptStream",
    "RoundSource",
    "ScoredRound",
    "collect_step",
    "collect_streaming_step",
    "group_statistics",
    "next_round_prompts",
    "trajectory_metric",
]
