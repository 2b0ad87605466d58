"""The dynamic sampler: collects exactly ``train_batch_size`` qualifying groups per training step.

The trainer drives it with named calls and applies its decisions to the payload::

    sampler.begin_step(global_steps)                  # drops groups older than max_staleness
    while sampler.needs_more_rounds():                # not full, budget left
        prompts = sampler.take_prompts(prompt_stream, sampler.prompts_for_next_round())
        rollouts = generate_and_score(prompts)        # n responses per prompt, one uid per prompt
        sampler.add_round(rollouts, group_ids=uids, metric_values=metric)
    batch, metrics = sampler.take_training_batch()    # buffered groups first (oldest first), then new

Which groups qualify is the configured keep rule (``keep_rules``). With ``skip.enable`` the sampler also keeps a
per-prompt history of group outcomes (``skipping.PromptSkipper``) and ``take_prompts`` leaves out prompts whose
recent groups predict that the next will not qualify, drawing the next prompts in their place.

Surplus qualifying groups stay pooled for later steps, and ``max_staleness`` is a hard bound: a group generated in
step ``s`` trains in step ``s + max_staleness`` at the latest, whatever happened in between (a partial step, a step
that trained nothing because fewer groups than a mini-batch qualified, a restore from a checkpoint). What can no longer
train within the bound leaves the pool when the step that makes it so closes, so the pool metrics
(``carried_out_groups``) count only groups that can still train; it is counted in ``dropped_stale_groups`` and said
once (a warning, then DEBUG). ``max_staleness=0`` is the paper's discard: every step trains only what it generated.
The payload is never modified, so tensors such as
``rollout_log_probs`` stay available for verl's rollout-correction options. When the step's
``max_num_gen_batches`` budget runs out before the batch is full, ``take_training_batch`` applies
``on_exhausted``: ``train_partial`` returns the groups collected (warned once, counted), ``raise`` raises
:class:`DynamicSamplingExhausted`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from recipe_dapo.dynamic_sampling.batch_ops import NUMPY_OPS, BatchOps
from recipe_dapo.dynamic_sampling.buffer import GroupBuffer
from recipe_dapo.dynamic_sampling.config import NAMESPACE, DynamicSamplingConfig
from recipe_dapo.dynamic_sampling.group_stats import GroupStats, group_statistics
from recipe_dapo.dynamic_sampling.sizing import MIN_KEEP_RATE, KeepRateEstimate, next_round_prompts, one_round_prompts
from recipe_dapo.dynamic_sampling.skipping import PromptSkipper, take_unskipped

logger = logging.getLogger(__name__)

METRIC_PREFIX = "dynamic_sampling/"
SKIP_METRIC_PREFIX = METRIC_PREFIX + "skip/"
# The step metrics the console and the run report read (every one is in ``_step_metrics``; a test checks it).
KEEP_RATE, NUM_GEN_ROUNDS, GENERATED_TOKENS = (METRIC_PREFIX + name for name in ("keep_rate", "num_gen_rounds",
                                                                                "generated_tokens"))
STATE_VERSION = 4
# 1: before prompt skipping (no skipper state); 3: ages counted in policy updates (4: in steps; the policy version
# is kept for the rows' lags)
READABLE_STATE_VERSIONS = (1, 2, 3, 4)


class DynamicSamplingExhausted(RuntimeError):
    """The step's generation budget is spent and ``on_exhausted=raise``."""


class DynamicSamplingStalled(RuntimeError):
    """``max_empty_rounds`` rounds in a row kept no group: the step would never fill."""


@dataclass
class _StepTally:
    """What the rounds of the open step produced (summed over rounds, never overwritten)."""

    rounds: int = 0
    generated_groups: int = 0
    kept_groups: int = 0
    solve_all_groups: int = 0
    solve_none_groups: int = 0
    trajectories: int = 0
    generated_tokens: int = 0
    metric_sum: float = 0.0
    dropped_stale_groups: int = 0
    empty_rounds_in_a_row: int = 0
    dispatched_prompts: int = 0
    empty_groups_in_a_row: int = 0
    extra_budget: int = 0
    budget_extensions: int = 0


@dataclass
class _Totals:
    """Counters over the whole run."""

    rounds: int = 0
    generated_groups: int = 0
    generated_tokens: int = 0
    qualifying_groups: int = 0
    trained_groups: int = 0
    dropped_stale_groups: int = 0
    partial_steps: int = 0


class DynamicSampler:
    """Decides which groups a training step uses and how many prompts each round generates."""

    def __init__(self, config: DynamicSamplingConfig, ops: BatchOps = NUMPY_OPS):
        config.validate()
        self.config = config
        self._ops = ops
        self._keep_rule = config.keep_decision()
        self.skipper = (
            PromptSkipper(config.skip, config.skip_seed, self._keep_rule, config.same_value_tolerance)
            if config.skip.enable
            else None
        )
        self._pool = GroupBuffer(ops)
        self._keep_rate = KeepRateEstimate(prior=config.keep_rate_prior)
        self._step_keep_rate = self._keep_rate.value
        self._step_resumed: Optional[int] = None
        self._totals = _Totals()
        self._tally = _StepTally()
        self._open_step: Optional[int] = None
        self._last_step: Optional[int] = None
        self._version = 0  # policy updates so far: steps whose batch held at least one group
        self._warned_partial = False
        self._warned_stale = False
        self._dropped_group_ids: list = []

    # ---------------------------------------------------------------- queries

    @property
    def policy_version(self) -> int:
        """Policy updates so far (steps whose batch held at least one group): the version of the policy that generates
        now, which every generated row is stamped with (``recipe_dapo.policy_lag``: a row's lag counts the updates
        since its policy, while ``max_staleness`` bounds its age in steps)."""
        return self._version

    def pooled_payloads(self) -> list[tuple[Any, int]]:
        """The pool's payloads with the training step each was generated in, oldest first (a trainer stamps rows that
        a checkpoint written before policy versions holds without one)."""
        return self._pool.payloads_by_step()

    @property
    def keep_rate_estimate(self) -> float:
        """Running estimate of the fraction of generated groups that qualify."""
        return self._keep_rate.value

    def run_counters(self) -> dict[str, int]:
        """Counters over the whole run: rounds, generated / qualifying / trained / dropped groups, partial
        steps."""
        return asdict(self._totals)

    @property
    def pooled_groups(self) -> int:
        """Qualifying groups waiting to be trained on (carried over plus this step's rounds)."""
        return self._pool.num_groups

    def pooled_group_ids(self) -> np.ndarray:
        """Ids of the pooled groups, oldest first."""
        return self._pool.group_ids()

    def is_full(self) -> bool:
        """True when the pool holds at least ``train_batch_size`` groups."""
        return self._pool.num_groups >= self.config.train_batch_size

    def out_of_rounds(self) -> bool:
        """True when the batch is not full and the step's ``max_num_gen_batches`` budget is spent."""
        return not self.is_full() and self.prompts_for_next_round() == 0

    def needs_more_rounds(self) -> bool:
        """True while another round should be generated: not full and budget left."""
        return not self.is_full() and not self.out_of_rounds()

    def prompts_for_next_round(self) -> int:
        """Prompts the next round should generate (see :mod:`.sizing`); 0 when full or out of budget."""
        self._require_open_step("prompts_for_next_round")
        missing = self.config.train_batch_size - self._pool.num_groups
        return next_round_prompts(self.config, missing, self._keep_rate.value, self._prompts_used())

    def prompts_to_dispatch(self, in_flight: int) -> int:
        """Streaming sources: prompts to submit now, with ``in_flight`` prompts submitted and not yet judged.

        The in-flight prompts are counted at the keep-rate estimate (all of them with the filter off), so a
        refill is sized to the deficit they are not expected to cover; 0 when they cover it, when the batch is
        full, or when the step's budget (which counts in-flight prompts) is spent. With ``one_round`` the step's
        submission is sized to fill the batch at ``one_round_confidence`` (``sizing.one_round_prompts``).
        """
        self._require_open_step("prompts_to_dispatch")
        if self.config.one_round:
            # What is unfinished at the end is aborted and resumes next step, not drained into the pool: no room cap.
            # Within the step the keep rate is the one the step began with: the first groups back are the short, easy
            # ones (often all right, not kept), and a rate read from them sizes refills many times too large. Once
            # nothing is in flight the whole round has been judged, and the updated estimate sizes the top-up.
            missing = self.config.train_batch_size - self._pool.num_groups
            keep_rate = self._round_keep_rate(in_flight)
            if self._tally.dispatched_prompts and in_flight * (keep_rate if self.config.enable else 1.0) >= missing:
                return 0  # another submission only when what is in flight is no longer expected to fill the batch
            if self._step_resumed is None:
                self._step_resumed = int(in_flight)
            return one_round_prompts(self.config, missing, in_flight, keep_rate, self._prompts_used(),
                                     self._overprovision())
        keep_rate = self._keep_rate.value if self.config.enable else 1.0
        expected = self._pool.num_groups + in_flight * max(keep_rate, MIN_KEEP_RATE)
        missing = math.ceil(self.config.train_batch_size - expected - 1e-9)
        if missing <= 0:
            return 0
        prompts = next_round_prompts(self.config, missing, self._keep_rate.value, self._prompts_used())
        room = self.dispatch_room(in_flight)
        if room is not None and prompts > room:
            # A whole number of granules within the room. With nothing in flight the room is more than
            # train_batch_size * max_staleness, which the config keeps >= prompt_granularity: the step always moves.
            prompts = room - room % self.config.prompt_granularity
        return max(prompts, 0)

    def _overprovision(self) -> float:
        """``one_round``: the multiple of the filling prompts a submission keeps in flight. ``one_round_overprovision``
        where it pays: on a judged keep rate (on the prior alone, a first step's surplus could age out) and where the
        last step left prompts in flight, which the source resumed (a source that finishes a step's prompts in one
        wave, as vLLM-CPU does, aborts nothing: there the extra prompts would only pool surplus, and age out). 1
        otherwise."""
        if self._keep_rate.generated > 0 and self._step_resumed:
            return float(self.config.one_round_overprovision)
        return 1.0

    def _round_keep_rate(self, in_flight: int) -> float:
        """``one_round``: the keep rate a submission is sized with (``prompts_to_dispatch``)."""
        return self._keep_rate.value if in_flight == 0 else self._step_keep_rate

    def dispatch_room(self, in_flight: int) -> Optional[int]:
        """Streaming sources: the most prompts that may still be submitted so that no qualifying group can be lost.

        Every prompt in flight might yet qualify, and whatever qualifies beyond this step's batch is trained by the
        next ``max_staleness`` steps only if it fits in them (they take the oldest groups first). So pooled groups
        plus prompts in flight plus new prompts stay within ``train_batch_size * (1 + max_staleness)``: a step's
        drain then never carries out more than the next ``max_staleness`` steps train, and no qualifying group is
        dropped as stale. None with ``max_staleness=0`` (the surplus is discarded by design: nothing to protect).
        (``prompt_granularity`` above ``train_batch_size * max_staleness`` is refused at start-up: one granule could
        then overflow the room.)
        """
        staleness = self.config.max_staleness
        if staleness == 0:
            return None
        cap = self.config.train_batch_size * (1 + staleness)
        return max(cap - self._pool.num_groups - int(in_flight), 0)

    def record_dispatch(self, prompts: int) -> None:
        """Streaming sources: ``prompts`` were submitted for generation (one round of the step's budget)."""
        self._require_open_step("record_dispatch")
        self._tally.rounds += 1
        self._tally.dispatched_prompts += int(prompts)
        self._totals.rounds += 1

    def take_dropped_group_ids(self) -> np.ndarray:
        """Ids of the pooled groups dropped as stale since the last call (a source frees their storage)."""
        dropped = np.concatenate(self._dropped_group_ids) if self._dropped_group_ids else np.empty(0, dtype=object)
        self._dropped_group_ids = []
        return dropped

    def _full_round_groups(self) -> int:
        # A streaming source's unit for max_empty_rounds: the round a round source would send for a whole batch
        # at the current keep-rate estimate (so "20 empty rounds" means the same number of groups either way).
        whole = next_round_prompts(self.config, self.config.train_batch_size, self._keep_rate.value, 0)
        return max(whole, self.config.min_round, 1)

    def _prompts_used(self) -> int:
        # Round sources generate what they ask for; streaming sources also count prompts still in flight. An
        # extension of the budget (extend_budget) is prompts not counted against it.
        return max(max(self._tally.generated_groups, self._tally.dispatched_prompts) - self._tally.extra_budget, 0)

    def extend_budget(self) -> bool:
        """For a trainer that cannot skip an update (verl's v1): once more the step's ``max_num_gen_batches`` budget,
        when it is spent with some qualifying groups pooled but fewer than a mini-batch. False when there is no
        budget (nothing to extend) or the step was already extended once."""
        self._require_open_step("extend_budget")
        budget = self.config.prompt_budget
        if budget is None or self._tally.budget_extensions:
            return False
        self._tally.extra_budget += budget
        self._tally.budget_extensions += 1
        return True

    def take_prompts(self, stream: Any, count: int) -> Any:
        """The ``count`` prompts of the next round from ``stream`` (``PromptStream.take``), less those the skipper
        leaves out, each replaced by the next prompt; without skipping, ``stream.take(count)``."""
        self._require_open_step("take_prompts")
        if self.skipper is None:
            return stream.take(count)
        return take_unskipped(stream, self.skipper, self._ops, count)

    # ---------------------------------------------------------------- the step

    def begin_step(self, step: int) -> None:
        """Open training step ``step``: age the keep-rate estimate and drop groups that are too old."""
        if self._open_step is not None:
            raise RuntimeError(
                f"begin_step({step}) called while step {self._open_step} is open; call take_training_batch() "
                "to close a step before opening the next"
            )
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"training steps must increase: got {step} after step {self._last_step}")
        self._open_step = step
        self._tally = _StepTally()
        if self.skipper is not None:
            self.skipper.begin_step()
        self._keep_rate.start_step(self.config.keep_rate_decay)
        self._step_keep_rate = self._keep_rate.value  # one_round: the rate the step sizes its round with
        self._step_resumed = None  # one_round: the prompts in flight at the step's first sizing
        # Nothing is this old in a run that went step by step (the step that made it so dropped it), but a pool
        # restored from a checkpoint written by an older version, or steps that jump, may hold such groups.
        self._drop_stale(born_before=step - self.config.max_staleness)

    def add_round(
        self,
        rollouts: Any,
        group_ids: Any,
        metric_values: Any,
        generated_tokens: int = 0,
        counts_as_round: bool = True,
        born_steps: Any = None,
    ) -> GroupStats:
        """Filter one round of rollouts and pool its qualifying groups (whole, contiguous, in order).

        ``group_ids`` and ``metric_values`` hold one entry per row of ``rollouts`` (verl: the ``uid``
        non-tensor field and the filter metric); ``generated_tokens`` is the round's response tokens, kept
        or not, for the cost metrics. Returns the round's group statistics.

        A streaming source passes the groups that finished since its last poll with ``counts_as_round=False``
        (its rounds are counted by :meth:`record_dispatch`); it stalls after ``max_empty_rounds`` rounds' worth of
        groups in a row that did not qualify, a round being what a round source would send for a whole batch at
        the current keep-rate estimate. ``born_steps`` (one per row; None: the open step) is the training step
        each group's prompt was submitted in, for a streaming source whose groups may finish steps later (verl v1's
        async mode): a group's age counts from it, and one that can no longer train within ``max_staleness`` is
        dropped as it arrives (counted).
        """
        self._require_open_step("add_round")
        num_rows = self._ops.length(rollouts)
        if num_rows != len(group_ids):
            raise ValueError(f"the round has {num_rows} trajectories but {len(group_ids)} group ids")
        stats = group_statistics(
            group_ids,
            metric_values,
            filter_enabled=self.config.enable,
            tolerance=self.config.same_value_tolerance,
            metric_name=self.config.metric,
            keep_rule=self._keep_rule,
        )
        self._refuse_reused_group_ids(stats.group_ids)
        if self.skipper is not None:
            keys = _group_prompt_keys(self._ops.prompt_keys(rollouts), stats)
            self.skipper.record(keys, right=stats.success_rate * stats.sizes, sizes=stats.sizes, qualified=stats.keep)

        group_born = self._group_born_steps(born_steps, stats, num_rows)
        if group_born is None:
            self._pool_kept(rollouts, stats, stats.keep, self._open_step, num_rows)
        else:  # one segment per birth step, oldest first; what is already too old to train is dropped
            for born in np.unique(group_born[stats.keep]):
                self._pool_kept(rollouts, stats, stats.keep & (group_born == born), int(born), num_rows)
            self._drop_stale(born_before=self._open_step - self.config.max_staleness)

        tally = self._tally
        if counts_as_round:
            tally.rounds += 1
            self._totals.rounds += 1
            tally.empty_rounds_in_a_row = 0 if stats.num_kept else tally.empty_rounds_in_a_row + 1
        else:
            tally.empty_groups_in_a_row = 0 if stats.num_kept else tally.empty_groups_in_a_row + stats.num_groups
        tally.generated_groups += stats.num_groups
        tally.kept_groups += stats.num_kept
        tally.solve_all_groups += int(np.count_nonzero(stats.solve_all))
        tally.solve_none_groups += int(np.count_nonzero(stats.solve_none))
        tally.trajectories += stats.num_trajectories
        tally.generated_tokens += int(generated_tokens)
        tally.metric_sum += stats.metric_sum
        self._totals.generated_groups += stats.num_groups
        self._totals.generated_tokens += int(generated_tokens)
        self._totals.qualifying_groups += stats.num_kept
        self._keep_rate.observe(stats.num_kept, stats.num_groups)
        logger.debug(
            "step %d round %d: kept %d of %d groups, pooled %d of %d",
            self._open_step, tally.rounds, stats.num_kept, stats.num_groups, self._pool.num_groups,
            self.config.train_batch_size,
        )
        if (
            tally.empty_rounds_in_a_row >= self.config.max_empty_rounds
            or tally.empty_groups_in_a_row >= self.config.max_empty_rounds * self._full_round_groups()
        ):
            self._stalled()
        return stats

    def _pool_kept(self, rollouts: Any, stats: GroupStats, selected: np.ndarray, born_step: int, num_rows: int) -> None:
        rows, offsets = stats.rows_of(selected)
        if not rows.shape[0]:
            return
        if rows.shape[0] == num_rows and np.array_equal(rows, np.arange(num_rows)):
            payload = rollouts  # every row kept, already grouped: no copy
        else:
            payload = self._ops.select(rollouts, rows)
        self._pool.add(payload, stats.group_ids[selected], offsets, born_step=born_step)

    def _group_born_steps(self, born_steps: Any, stats: GroupStats, num_rows: int) -> Optional[np.ndarray]:
        """Each group's birth step from per-row ``born_steps`` (None when absent or all the open step)."""
        if born_steps is None:
            return None
        born_steps = np.asarray(born_steps, dtype=np.int64)
        if born_steps.shape[0] != num_rows:
            raise ValueError(f"the round has {num_rows} trajectories but {born_steps.shape[0]} birth steps")
        group_born = born_steps[stats.order[stats.offsets[:-1]]]
        if np.any(group_born > self._open_step):
            raise ValueError(f"step {self._open_step}: a group's birth step {int(group_born.max())} is in the future")
        return None if np.all(group_born == self._open_step) else group_born

    def take_training_batch(self, groups_multiple_of: int = 1) -> tuple[Any, dict[str, float]]:
        """Close the step: the training batch (oldest groups first) and the step's metrics.

        The batch holds exactly ``train_batch_size`` groups, or, under ``on_exhausted=train_partial`` when
        the budget ran out, the groups collected cut down to a multiple of ``groups_multiple_of`` (the rest
        stays pooled); it is None when no group qualified. Under ``on_exhausted=raise`` a short batch raises
        :class:`DynamicSamplingExhausted`.
        """
        self._require_open_step("take_training_batch")
        step = self._open_step
        target = self.config.train_batch_size
        available = self._pool.num_groups
        partial = available < target
        if partial:
            if not self.out_of_rounds():
                raise RuntimeError(
                    f"take_training_batch() at step {step} with {available} of {target} groups while the "
                    "generation budget is not spent; generate rounds while needs_more_rounds() is True"
                )
            self._on_exhausted(step, available, target)
            count = available - available % max(int(groups_multiple_of), 1)
        else:
            count = target
        taken = self._pool.take(count)
        if not taken.pieces:
            batch = None
        elif len(taken.pieces) == 1:
            batch = taken.pieces[0]
        else:
            batch = self._ops.concat(taken.pieces)
        self._totals.trained_groups += int(taken.group_ids.shape[0])
        if taken.group_ids.shape[0]:
            self._version += 1  # the policy is updated with this batch (what its rows' lags count)
        # What the next step could not train within max_staleness leaves now, so that the pool carried out (and a
        # checkpoint of it) holds only groups that can still train.
        self._drop_stale(born_before=step + 1 - self.config.max_staleness)

        metrics = self._step_metrics(step, taken.born_steps, partial)
        if self.skipper is not None:
            skip_metrics = self.skipper.end_step(self._tally.generated_groups, self._tally.kept_groups)
            metrics.update({SKIP_METRIC_PREFIX + key: float(value) for key, value in skip_metrics.items()})
        self._last_step, self._open_step = step, None
        return batch, metrics

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self, compact: bool = True) -> dict:
        """Everything needed to continue identically: pooled groups with payloads, estimate, counters
        (``compact=False``: the pool's payloads shared, not copied: a state kept in memory, ``GroupBuffer``)."""
        return {
            "version": STATE_VERSION,
            "pool": self._pool.state_dict(compact),
            "keep_rate": self._keep_rate.state_dict(),
            "totals": asdict(self._totals),
            "tally": asdict(self._tally),
            "open_step": self._open_step,
            "last_step": self._last_step,
            "policy_version": self._version,
            "skipper": self.skipper.state_dict() if self.skipper is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") not in READABLE_STATE_VERSIONS:
            raise ValueError(
                f"dynamic sampler state has version {state.get('version')!r}, this code reads versions "
                f"{READABLE_STATE_VERSIONS}; resume with the recipe version that wrote the checkpoint"
            )
        self._pool.load_state_dict(state["pool"])
        self._keep_rate = KeepRateEstimate.from_state_dict(state["keep_rate"])
        self._totals = _Totals(**state["totals"])
        self._tally = _StepTally(**state["tally"])
        self._open_step = state["open_step"]
        self._last_step = state["last_step"]
        # Before version 3 every step counted as an update: the version was the last step.
        self._version = int(state.get("policy_version", self._last_step or 0))
        skipper_state = state.get("skipper")
        if self.skipper is not None and skipper_state is not None:
            self.skipper.load_state_dict(skipper_state)
        elif self.skipper is not None:
            logger.warning("the checkpoint has no prompt-skipping history (skipping was off): skipping starts afresh")

    # ---------------------------------------------------------------- helpers

    def _require_open_step(self, call: str) -> None:
        if self._open_step is None:
            raise RuntimeError(f"{call}() needs an open step; call begin_step(global_steps) first")

    def _refuse_reused_group_ids(self, new_ids: np.ndarray) -> None:
        # GRPO normalises advantages per uid over the whole batch, so two prompt instances sharing a uid
        # would be merged into one group.
        pooled = self._pool.group_ids()
        if pooled.shape[0] == 0:
            return
        reused = new_ids[np.isin(new_ids, pooled)]
        if reused.shape[0]:
            raise ValueError(
                f"group ids {reused[:3].tolist()} of this round are already pooled from an earlier round; "
                "give every prompt instance a fresh uid (verl's trainer uses uuid4)"
            )

    def _drop_stale(self, born_before: int) -> None:
        """Drop the pooled groups generated before step ``born_before`` (counted in the open step's
        ``dropped_stale_groups`` and the run's; the first drop of the run is a warning, the rest DEBUG)."""
        dropped_ids = self._pool.drop_born_before(born_before)
        dropped = int(dropped_ids.shape[0])
        if not dropped:
            return
        self._dropped_group_ids.append(dropped_ids)
        self._tally.dropped_stale_groups += dropped
        self._totals.dropped_stale_groups += dropped
        staleness = self.config.max_staleness
        if self._warned_stale:
            logger.debug("step %d: dropped %d qualifying groups that cannot train within max_staleness=%d steps",
                         self._open_step, dropped, staleness)
            return
        self._warned_stale = True
        logger.warning(
            "step %d: dropped %d qualifying groups that cannot train within %s.max_staleness=%d steps of the step "
            "that generated them%s (counted in %sdropped_stale_groups; warned once)",
            self._open_step, dropped, NAMESPACE, staleness,
            " (0: the paper's discard, every step trains only what it generated)" if staleness == 0 else "",
            METRIC_PREFIX,
        )

    def _stalled(self) -> None:
        tally = self._tally
        in_a_row = (
            f"{tally.empty_rounds_in_a_row} generation rounds in a row kept no group"
            if tally.empty_rounds_in_a_row
            else f"{tally.empty_groups_in_a_row} groups in a row did not qualify"
        )
        raise DynamicSamplingStalled(
            f"step {self._open_step}: {in_a_row} "
            f"({tally.generated_groups} groups generated this step, {self._pool.num_groups} of "
            f"{self.config.train_batch_size} in hand): every group's {self.config.metric!r} had no spread "
            f"(solve-all {tally.solve_all_groups}, solve-none {tally.solve_none_groups}). Check that the reward "
            "function scores this data (a wrong data_source or ground-truth format scores everything alike), that "
            "the filter metric varies within groups, and that rollout.n > 1 and temperature > 0; or raise "
            f"{NAMESPACE}.max_empty_rounds if the data really is this easy or hard"
        )

    def _on_exhausted(self, step: int, available: int, target: int) -> None:
        budget_key = "algorithm.filter_groups.max_num_gen_batches"
        if self.config.on_exhausted == "raise":
            raise DynamicSamplingExhausted(
                f"step {step}: only {available} of {target} groups qualified after generating "
                f"{self._tally.generated_groups} prompts ({budget_key}={self.config.max_num_gen_batches} x "
                f"gen_batch_size={self.config.gen_batch_size}); raise {budget_key} (0: no limit), set "
                f"{NAMESPACE}.on_exhausted=train_partial, or check that the filter metric "
                f"{self.config.metric!r} varies within groups"
            )
        self._totals.partial_steps += 1
        if not self._warned_partial:
            self._warned_partial = True
            logger.warning(
                "step %d: %s budget spent with %d of %d groups; training on the groups collected "
                "(on_exhausted=train_partial; counted in %spartial_steps, warned once)",
                step, budget_key, available, target, METRIC_PREFIX,
            )

    def _step_metrics(self, step: int, born_steps: np.ndarray, partial: bool) -> dict[str, float]:
        tally, totals = self._tally, self._totals
        trained = int(born_steps.shape[0])
        metrics = {
            "num_gen_rounds": tally.rounds,
            "generated_groups": tally.generated_groups,
            # Every response token generated this step, including those of groups the filter dropped: the
            # cost side of dynamic sampling (verl's response_length/* describe only the trained batch).
            "generated_tokens": tally.generated_tokens,
            "total_generated_tokens": totals.generated_tokens,
            "kept_groups": tally.kept_groups,
            "trained_groups": trained,
            "carried_in_groups": int(np.count_nonzero(born_steps < step)),
            "carried_out_groups": self._pool.num_groups,
            "dropped_stale_groups": tally.dropped_stale_groups,
            "mean_staleness": float((step - born_steps).mean()) if trained else 0.0,
            "partial_batch": float(partial),
            "partial_steps": totals.partial_steps,
            "budget_extensions": tally.budget_extensions,
            "total_gen_rounds": totals.rounds,
            "keep_rate_estimate": self._keep_rate.value,
            # Trained over qualifying groups so far; 1.0 before any group qualified (nothing wasted).
            "utilization": totals.trained_groups / totals.qualifying_groups if totals.qualifying_groups else 1.0,
        }
        if tally.generated_groups:  # ratios of a step without rounds (all from the buffer) are undefined
            metrics["keep_rate"] = tally.kept_groups / tally.generated_groups
            metrics["solve_all_ratio"] = tally.solve_all_groups / tally.generated_groups
            metrics["solve_none_ratio"] = tally.solve_none_groups / tally.generated_groups
            metrics["score_mean_before_filter"] = tally.metric_sum / tally.trajectories
        return {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}


def _group_prompt_keys(row_keys: np.ndarray, stats: GroupStats) -> np.ndarray:
    """The prompt key of each group of ``stats`` (its rows must share one)."""
    row_keys = np.asarray(row_keys)
    if row_keys.shape[0] != stats.num_trajectories:
        raise ValueError(f"got {row_keys.shape[0]} prompt keys for {stats.num_trajectories} trajectories")
    keys = row_keys[stats.order[stats.offsets[:-1]]]
    mixed = np.flatnonzero(np.repeat(keys, stats.sizes) != row_keys[stats.order])
    if mixed.size:
        group = int(np.searchsorted(stats.offsets, mixed[0], side="right") - 1)
        raise ValueError(
            f"group {stats.group_ids[group:group + 1].tolist()[0]!r} holds responses of different prompts (keys "
            f"{sorted(set(row_keys[stats.order[stats.offsets[group]:stats.offsets[group + 1]]].tolist()))[:3]}); "
            "one uid must stand for one prompt instance"
        )
    return keys
