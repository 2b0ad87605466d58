"""The round loop of one DAPO training step, in one place (Algorithm 1, lines 2-8).

::

    sampler.begin_step(step)                                  # age the pool, open the step's budget
    while sampler.needs_more_rounds():                        # not full, budget left
        prompts = sampler.take_prompts(prompt_stream, sampler.prompts_for_next_round())  # less skipped prompts
        scored = generate_round(prompts)                      # G responses per prompt, scored
        sampler.add_round(scored.rollouts, ...)               # pool the qualifying groups
    batch, metrics = sampler.take_training_batch()            # carried-over groups first

``collect_step`` is that loop. It knows nothing about models: a *round source* is any callable that takes a
batch of prompts and returns a :class:`ScoredRound` (the rollouts, one group id and one filter-metric value per
row, and the response tokens it generated). The trainer's source generates with verl's rollout replicas and
scores with the reward manager; tests and ``bench/dynamic_sampling_sim.py`` pass simulated sources through the
same loop, so the loop exists once.

A second source goes beside the first, not into the trainer: streaming generation with early abort is a
callable that submits the round's prompts, judges each group as it finishes and aborts the rest once the
sampler's deficit is covered, then returns what finished as one ``ScoredRound``; a source that reads verl v1's
replay buffer returns the groups the buffer holds. The trainer's step (collect, sleep the replicas, update,
sync weights) does not change for either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from recipe_dapo.dynamic_sampling.prompt_stream import PromptStream
from recipe_dapo.dynamic_sampling.sampler import DynamicSampler


@dataclass
class ScoredRound:
    """What one round of generation and scoring produced.

    rollouts          payload rows (``n`` per prompt), opaque to the loop (verl: a ``DataProto``)
    group_ids         one id per row, shared by the responses of one prompt instance (verl: ``uid``)
    metric_values     the filter metric per row (``algorithm.filter_groups.metric``)
    generated_tokens  response tokens generated this round, kept or not (the cost side of dynamic sampling)
    columns           per-row arrays to report on everything scored, before filtering (verl: reward extra info)
    """

    rollouts: Any
    group_ids: Any
    metric_values: Any
    generated_tokens: int = 0
    columns: dict = field(default_factory=dict)


RoundSource = Callable[[Any], ScoredRound]
"""prompts -> ScoredRound: generate ``n`` responses per prompt and score them."""


@dataclass
class CollectedStep:
    """A step's training batch (None when no group could be trained), its sampling metrics, and the
    concatenated ``columns`` of every round scored this step (empty when the step ran no round)."""

    batch: Optional[Any]
    metrics: dict
    rounds: int
    scored_columns: dict


def collect_step(
    sampler: DynamicSampler,
    prompts: PromptStream,
    generate_round: RoundSource,
    step: int,
    groups_multiple_of: int = 1,
) -> CollectedStep:
    """Run rounds until the sampler holds a full batch or the step's budget is spent, then take the batch.

    A step may run no round at all (the batch comes entirely from groups carried over), one, or several.
    ``groups_multiple_of`` is the size a partial batch must split into (PPO mini-batches).
    """
    sampler.begin_step(step)
    columns: list[dict] = []
    rounds = 0
    while sampler.needs_more_rounds():
        scored = generate_round(sampler.take_prompts(prompts, sampler.prompts_for_next_round()))
        sampler.add_round(
            scored.rollouts,
            group_ids=scored.group_ids,
            metric_values=scored.metric_values,
            generated_tokens=scored.generated_tokens,
        )
        columns.append(scored.columns)
        rounds += 1
    batch, metrics = sampler.take_training_batch(groups_multiple_of=groups_multiple_of)
    return CollectedStep(batch=batch, metrics=metrics, rounds=rounds, scored_columns=_concat_columns(columns))


def _concat_columns(columns: list[dict]) -> dict:
    """Row-wise concatenation of the columns every round reported."""
    if not columns:
        return {}
    shared = set.intersection(*(set(c) for c in columns))
    return {key: np.concatenate([np.asarray(c[key]) for c in columns]) for key in sorted(shared)}
