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

A *streaming* source has no round barrier: ``collect_streaming_step`` judges each group as soon as its ``n``
responses are scored and refills while other prompts still generate (verl's v1 trainer, whose replay buffer
holds finished groups in TransferQueue; ``recipe_dapo.trainers.v1``)::

    sampler.begin_step(step)
    loop:
        sampler.add_round(stream.poll(), counts_as_round=False)    # groups finished since the last poll
        full:      stop once nothing is in flight (drain=True: the in-flight groups are pooled as surplus);
                   drain=False (partial rollouts): stop now, what is in flight resumes next step, except the
                   prompts that would then exceed max_staleness (stream.overdue()): the step waits for those
        arriving:  groups came back and others are in flight: a wave is finishing, wait (at most SETTLE_POLLS)
        not full:  submit sampler.prompts_to_dispatch(in flight)  # deficit the in-flight prompts do not cover,
                                                                  # capped: pooled + in flight <= B * (1 + max_staleness)
                   stop when the budget is spent and nothing is in flight
        stream.wait()                                             # the poll interval
    batch, metrics = sampler.take_training_batch()                # oldest groups first

Why the cap and the wait: verl's agent loop on vLLM runs prompts in waves (a prompt submitted while a wave runs
starts with the next one; a wave's groups come back within a few polls of each other). A refill sized on a wave's
first groups, or prompts queued behind a running wave, used to be drained into the pool beyond what the next step
could train, and dropped as stale a step later. With the cap, whatever the in-flight prompts turn out to be, the
carry-out fits the next ``max_staleness`` steps, which train the oldest groups first: no qualifying group is dropped.

A streaming step's trainer (verl's v1) cannot skip an update, so a step whose budget is spent with some qualifying
groups pooled but fewer than a mini-batch (``groups_multiple_of``) gets the budget once more
(``DynamicSampler.extend_budget``, counted in ``dynamic_sampling/budget_extensions``); if it is still short, it stops
with :class:`DynamicSamplingExhausted` saying how many groups qualified and the mini-batch they fell short of. (The
classic trainer skips such a step's update instead, and the pooled groups train in a later step, within
``max_staleness`` steps of the step that generated them.)

Both loops use the same sampler, sizing, budget, pool and metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import numpy as np

from recipe_dapo.dynamic_sampling.prompt_stream import PromptStream
from recipe_dapo.dynamic_sampling.sampler import METRIC_PREFIX, DynamicSampler, DynamicSamplingExhausted

logger = logging.getLogger(__name__)

SETTLE_POLLS = 4
"""Streaming: while groups keep arriving with others still in flight (an engine wave finishing: verl's agent loop
writes a wave's groups within a few polls of each other), a refill waits up to this many polls, so that it is sized
on the whole wave rather than on its first groups (a refill sent then starts only with the next wave anyway)."""


@dataclass
class ScoredRound:
    """What one round of generation and scoring produced.

    rollouts          payload rows (``n`` per prompt), opaque to the loop (verl: a ``DataProto``)
    group_ids         one id per row, shared by the responses of one prompt instance (verl: ``uid``)
    metric_values     the filter metric per row (``algorithm.filter_groups.metric``)
    generated_tokens  response tokens generated this round, kept or not (the cost side of dynamic sampling)
    columns           per-row arrays to report on everything scored, before filtering (verl: reward extra info)
    born_steps        per-row training step the prompt was submitted in (None: this step; a streaming source whose
                      groups finish in a later step passes it, so their age counts from their submission)
    """

    rollouts: Any
    group_ids: Any
    metric_values: Any
    generated_tokens: int = 0
    columns: dict = field(default_factory=dict)
    born_steps: Any = None


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
        _pool_scored(sampler, scored, columns, counts_as_round=True)
        rounds += 1
    batch, metrics = sampler.take_training_batch(groups_multiple_of=groups_multiple_of)
    sampler.take_dropped_group_ids()  # a round source keeps nothing outside the pool: nothing to free, nothing to keep
    return CollectedStep(batch=batch, metrics=metrics, rounds=rounds, scored_columns=_concat_columns(columns))


class GroupStream(Protocol):
    """A streaming source of scored groups (prompts submitted one refill at a time, groups returned as they finish)."""

    def submit(self, prompts: int) -> None:
        """Start generating ``n`` responses for each of ``prompts`` fresh prompts."""

    def poll(self) -> Optional[ScoredRound]:
        """The groups whose responses all finished and were scored since the last poll (None: none)."""

    def release(self, group_ids) -> None:
        """The sampler did not keep these groups (returned by the last poll): their storage may be freed."""

    def in_flight(self) -> int:
        """Prompts submitted whose group has not been returned by :meth:`poll` yet."""

    def wait(self) -> None:
        """Block until a poll may find something new (a short sleep, or an event)."""

    def overdue(self) -> int:
        """Prompts in flight that could not be trained within ``max_staleness`` steps if the step ended now and they
        resumed in the next (``one_round``: the step waits for them). A source without partial rollouts has none."""


def collect_streaming_step(
    sampler: DynamicSampler,
    stream: GroupStream,
    step: int,
    groups_multiple_of: int = 1,
    drain: bool = True,
) -> CollectedStep:
    """The streaming loop of the module docstring: judge groups as they finish, refill to the deficit.

    ``drain=True`` (a synchronous trainer: the weights change after the step) waits for the prompts still in
    flight when the batch fills and pools their qualifying groups for the next step, instead of discarding them.
    ``drain=False`` (a source with partial rollouts: what is unfinished resumes next step under the new weights) ends
    the step when the batch is full, except while ``stream.overdue()`` prompts are in flight (finished first, so
    that none exceeds ``max_staleness``; their qualifying groups are pooled for the next step).
    """
    sampler.begin_step(step)
    columns: list[dict] = []
    rounds = 0
    started, filled = time.monotonic(), None
    log = _StreamLog(step, started)
    arriving = 0  # polls in a row that returned groups while others were still in flight
    while True:
        scored = stream.poll()
        arrived = scored is not None and len(scored.group_ids) > 0
        if arrived:
            stats = _pool_scored(sampler, scored, columns, counts_as_round=False)
            stream.release(stats.group_ids[~stats.keep])
            log.finished(stats.num_groups, stats.num_kept, after_full=filled is not None)
        in_flight = stream.in_flight()
        arriving = arriving + 1 if arrived and in_flight else 0
        if sampler.is_full():
            overdue = _overdue(stream) if not drain and in_flight else 0
            if filled is None:
                filled = time.monotonic()
                log.in_flight_at_full = in_flight
                log.overdue_at_full = overdue
            if (not drain and not overdue) or in_flight == 0:
                break
        elif 0 < arriving < SETTLE_POLLS:
            pass  # a wave is finishing: see the rest of it before sizing a refill on a partial view
        else:
            wanted = sampler.prompts_to_dispatch(in_flight)
            if wanted:
                stream.submit(wanted)
                sampler.record_dispatch(wanted)
                log.refill(wanted, in_flight, sampler)
                rounds += 1
                continue
            if in_flight == 0:  # the budget is spent and nothing is left to wait for
                if 0 < sampler.pooled_groups < groups_multiple_of and sampler.extend_budget():
                    logger.warning(
                        "step %d: the generation budget is spent with %d qualifying groups, fewer than a mini-batch "
                        "of %d, and verl's v1 trainer cannot skip an update: generating once more the budget "
                        "(counted in %sbudget_extensions)", step, sampler.pooled_groups, groups_multiple_of,
                        METRIC_PREFIX,
                    )
                    continue
                break
        stream.wait()
    ended = time.monotonic()
    short = sampler.pooled_groups
    batch, metrics = sampler.take_training_batch(groups_multiple_of=groups_multiple_of)
    if batch is None and short:
        raise DynamicSamplingExhausted(
            f"step {step}: {short} groups qualified, fewer than one mini-batch of {groups_multiple_of} "
            "(actor_rollout_ref.actor.ppo_mini_batch_size), within twice the algorithm.filter_groups."
            f"max_num_gen_batches={sampler.config.max_num_gen_batches} budget; verl's v1 trainer cannot skip an update "
            "(the classic trainer, trainer.use_v1=false, carries them to a later step). Raise max_num_gen_batches "
            "(0: no limit), lower ppo_mini_batch_size, or check that the filter metric "
            f"{sampler.config.metric!r} varies within groups"
        )
    # Seconds until the batch was full, and spent after it waiting for the prompts still in flight (their
    # qualifying groups are pooled for the next step).
    metrics[METRIC_PREFIX + "fill_s"] = (filled if filled is not None else ended) - started
    metrics[METRIC_PREFIX + "drain_s"] = ended - filled if filled is not None else 0.0
    metrics.update(log.metrics())
    return CollectedStep(batch=batch, metrics=metrics, rounds=rounds, scored_columns=_concat_columns(columns))


class _StreamLog:
    """Where a streaming step's generation went: one DEBUG line per refill (prompts submitted, in flight as the
    sampler saw them, groups finished and kept so far, pool size) and the step's metrics
    (``dynamic_sampling/submitted_prompts``, ``in_flight_at_full``, ``drained_groups``, ``drained_kept_groups``)."""

    def __init__(self, step: int, started: float):
        self.step, self.started = step, started
        self.submitted = self.finished_groups = self.kept_groups = 0
        self.drained_groups = self.drained_kept_groups = 0
        self.in_flight_at_full = self.overdue_at_full = 0

    def finished(self, groups: int, kept: int, after_full: bool) -> None:
        self.finished_groups += groups
        self.kept_groups += kept
        if after_full:
            self.drained_groups += groups
            self.drained_kept_groups += kept

    def refill(self, prompts: int, in_flight: int, sampler: DynamicSampler) -> None:
        self.submitted += prompts
        logger.debug(
            "step %d +%.2fs: submitted %d prompts (%d this step); in flight as seen %d, groups finished %d "
            "(kept %d), pooled %d, keep-rate estimate %.3f",
            self.step, time.monotonic() - self.started, prompts, self.submitted, in_flight, self.finished_groups,
            self.kept_groups, sampler.pooled_groups, sampler.keep_rate_estimate,
        )

    def metrics(self) -> dict[str, float]:
        return {
            METRIC_PREFIX + "submitted_prompts": float(self.submitted),
            METRIC_PREFIX + "in_flight_at_full": float(self.in_flight_at_full),
            METRIC_PREFIX + "overdue_at_full": float(self.overdue_at_full),
            METRIC_PREFIX + "drained_groups": float(self.drained_groups),
            METRIC_PREFIX + "drained_kept_groups": float(self.drained_kept_groups),
        }


def _overdue(stream: GroupStream) -> int:
    """``stream.overdue()``; 0 for a source that does not define it (no partial rollouts)."""
    method = getattr(stream, "overdue", None)
    return int(method()) if method is not None else 0


def _pool_scored(sampler: DynamicSampler, scored: ScoredRound, columns: list[dict], counts_as_round: bool):
    """Hand what a source scored to the sampler (which pools the qualifying groups); keep its columns for the step's
    reward metrics. Returns the groups' statistics."""
    stats = sampler.add_round(
        scored.rollouts,
        group_ids=scored.group_ids,
        metric_values=scored.metric_values,
        generated_tokens=scored.generated_tokens,
        counts_as_round=counts_as_round,
        born_steps=scored.born_steps,
    )
    columns.append(scored.columns)
    return stats


def _concat_columns(columns: list[dict]) -> dict:
    """Row-wise concatenation of the columns every round reported."""
    if not columns:
        return {}
    shared = set.intersection(*(set(c) for c in columns))
    return {key: np.concatenate([np.asarray(c[key]) for c in columns]) for key in sorted(shared)}
