"""DAPO's dynamic sampling as verl v1's replay buffer (``trainer.v1.sampler.custom_sampler``).

verl v1 keeps every generated trajectory in TransferQueue and asks its replay buffer for a training batch once per
step (``ReplayBuffer.sample``). :class:`DAPOReplayBuffer` answers with the recipe's sampler, over a streaming source
(:class:`TransferQueueGroups`): a group is judged as soon as its ``n`` responses are scored, refills are sized to the
deficit that the prompts still in flight are not expected to cover (``DynamicSampler.prompts_to_dispatch``), the
``max_num_gen_batches`` budget and ``on_exhausted`` apply, and the qualifying surplus stays in TransferQueue and in
the sampler's pool for the next step (at most ``max_staleness`` steps), instead of being deleted. Refills stop where
the pooled groups plus every prompt in flight could exceed ``train_batch_size * (1 + max_staleness)`` (the drain then
never carries out more than the next steps train, oldest first: no qualifying group is dropped), and wait for the rest
of a wave whose groups are coming back (``collect_streaming_step``). The per-refill log is at DEBUG
(``recipe_dapo.dynamic_sampling.rounds``); ``dynamic_sampling/submitted_prompts``, ``in_flight_at_full``,
``drained_groups`` and ``drained_kept_groups`` say per step where generation went. The round loop
itself is ``dynamic_sampling.collect_streaming_step``, shared with the tests' simulated streams.

Validation batches (partition ``val``) are sampled by verl's own code, unfiltered.

Set up by the recipe's config (``recipe_dapo/config/dapo_trainer.yaml``)::

    trainer.v1.sampler.custom_sampler.path: pkg://recipe_dapo.trainers.v1.replay_buffer
    trainer.v1.sampler.custom_sampler.name: DAPOReplayBuffer
    trainer.v1.sampler.sampler_kwargs: references to algorithm.filter_groups, dapo.dynamic_sampling and the sizes
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable, Optional

import numpy as np
import torch
import transfer_queue as tq
from transfer_queue import KVBatchMeta

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from recipe_dapo.dynamic_sampling import (
    METRIC_PREFIX,
    DynamicSampler,
    DynamicSamplingExhausted,
    ScoredRound,
    collect_streaming_step,
    trajectory_metric,
)
from recipe_dapo.dynamic_sampling.group_stats import SEQUENCE_METRICS
from recipe_dapo.dynamic_sampling.config import sampler_config
from recipe_dapo.dynamic_sampling.selection import LENGTH_COLUMN, SOLVED_COLUMN, selection_metrics
from recipe_dapo.run.step_metrics import scored_round_metrics
from recipe_dapo.run.rollout_health import ERROR_TAG, FATAL_TAG, RolloutDied, StallWatch, fatal_failure_message
from recipe_dapo.trainers.table import V1_TRAINER_MODES, v1_entry
from recipe_dapo.trainers.v1.phase_timing import CLOCK, POLL_WAIT

logger = logging.getLogger(__name__)

TRAIN = "train"


def _uid_of(key: str) -> str:
    return key.split("_", 1)[0]


def _session_order(key: str) -> tuple:
    # Keys are {uid}_{session}_{index}; a group's rows go in session order, as verl's own batches do.
    return tuple(int(part) if part.isdigit() else part for part in key.split("_")[1:])


class TransferQueueGroups:
    """A ``GroupStream`` over TransferQueue: prompts submitted through verl's refill function, groups polled when
    their status turns terminal.

    A group whose rollout failed (status ``failure``) is removed with its trajectories and counted; it is never
    trained and never crashes the step, unless its error says the rollout itself is gone (a dead vLLM engine or Ray
    actor, written into the group's marker by the recipe's agent-loop worker: ``rollout_health``), which raises
    :class:`RolloutDied` naming it. While prompts are in flight and no group comes back, ``watch`` runs the
    rollout's liveness probe (``dapo.health.rollout_probe_s``), which raises the same when a worker, server or engine
    is dead (a group whose worker died never reaches a terminal status). With ``max_span`` (the async modes: verl's
    ``max_off_policy_threshold``), a group submitted more than ``max_span - 1`` steps before the current ``step`` is removed and counted too.
    """

    def __init__(self, submit_fn: Callable[[int], Any], metric: Optional[str], poll_interval_s: float,
                 partition_id: str = TRAIN, max_span: Optional[int] = None):
        self._submit_fn = submit_fn
        self._metric = metric
        self._poll_interval_s = poll_interval_s
        self._partition_id = partition_id
        self._submitted = 0
        self._returned = 0
        self.max_span = max_span
        self.step = 0
        self.failed_groups = 0
        self.off_policy_groups = 0
        self.tags: dict[str, dict] = {}  # trajectory key -> TransferQueue tag, for groups judged and not yet freed
        self.solved: dict[str, float] = {}  # trajectory key -> its correctness, for the same groups
        self._keys_of: dict[str, list[str]] = {}  # uid -> its trajectory keys
        self.overdue_after: Optional[int] = None  # one_round: max_staleness (``overdue``)
        self._overdue = 0
        self.watch = StallWatch(None, 0.0)  # the trainer sets the rollout's liveness probe
        self.give_up: Callable[[], None] = lambda: None  # the trainer's pre-emption check (``preemption.GiveUpCheck``)

    # ---------------------------------------------------------------- GroupStream

    def submit(self, prompts: int) -> None:
        self._submit_fn(int(prompts))
        self._submitted += int(prompts)
        self.watch.progress()

    def in_flight(self) -> int:
        return self._submitted - self._returned

    def wait(self) -> None:
        """The poll interval (``timing_s/poll_wait``); then, if nothing has come back for a while, the liveness probe
        (raises RolloutDied), and the pre-emption check (raises ``StepGivenUp``: between two polls, the step's state
        is whole)."""
        with CLOCK.timing(POLL_WAIT):
            time.sleep(self._poll_interval_s)
        self.watch.check(self.in_flight())
        self.give_up()

    def overdue(self) -> int:
        """Prompts still generating (as of the last poll) that, aborted now and resumed next step, would be trained
        more than ``max_staleness`` policy updates after their first token: verl tags a prompt with the step that
        submitted it (``global_steps``; its first tokens come from that step's weights, version ``global_steps - 1``),
        and a step ending at ``step`` trains what it aborted at ``step + 1`` at the earliest."""
        return self._overdue

    def poll(self) -> Optional[ScoredRound]:
        listing = tq.kv_list(self._partition_id) or {}
        items = listing.get(self._partition_id, {})
        if self.overdue_after is not None:
            self._overdue = sum(
                1 for tag in items.values()
                if tag.get("is_prompt", False) and tag.get("status") not in ("finished", "failure")
                and self.step + 1 - int(tag.get("global_steps", self.step)) > self.overdue_after
            )
        terminal: dict[str, str] = {}
        trajectories: dict[str, list[str]] = defaultdict(list)
        for key, tag in items.items():
            if tag.get("is_prompt", False):
                if tag.get("status") in ("finished", "failure"):
                    terminal[key] = tag["status"]
            else:
                trajectories[_uid_of(key)].append(key)
        if not terminal:
            return None
        self.watch.progress()
        self._returned += len(terminal)
        failed = {uid for uid, status in terminal.items() if status == "failure" or not trajectories.get(uid)}
        fatal = [str(items[uid].get(ERROR_TAG)) for uid in failed if items[uid].get(FATAL_TAG)]
        if fatal:
            dead = self.watch.diagnose()  # which replica or worker, when the probe can tell
            raise RolloutDied(fatal_failure_message(self.step, fatal, len(fatal), self.in_flight(), dead))
        too_old = set()
        if self.max_span is not None:
            too_old = {uid for uid in terminal if uid not in failed
                       and self.step - int(items[uid].get("global_steps", self.step)) + 1 > self.max_span}
        finished = [uid for uid in terminal if uid not in failed and uid not in too_old]
        dropped_keys = [key for uid in failed | too_old for key in trajectories.get(uid, [])]
        tq.kv_clear(keys=[*terminal, *dropped_keys], partition_id=self._partition_id)  # prompt markers: judged now
        self.off_policy_groups += len(too_old)
        if failed:
            self.failed_groups += len(failed)
            errors = [str(items[uid][ERROR_TAG]) for uid in failed if items[uid].get(ERROR_TAG)]
            logger.warning("%d prompt group(s) failed in rollout; dropped and counted (dynamic_sampling/failed_groups)%s",
                           len(failed), f"; first error: {errors[0]}" if errors else "")
        if not finished:
            return None

        keys: list[str] = []
        for uid in finished:
            group = sorted(trajectories[uid], key=_session_order)
            self._keys_of[uid] = group
            keys.extend(group)
        for key in keys:
            self.tags[key] = items[key]
        columns, metric_values = self._scores(keys)
        columns[LENGTH_COLUMN] = np.array([int(items[key].get("response_len", 0)) for key in keys], dtype=np.int64)
        if SOLVED_COLUMN in columns:
            self.solved.update(zip(keys, np.asarray(columns[SOLVED_COLUMN], dtype=np.float64).tolist()))
        return ScoredRound(
            rollouts=np.array(keys, dtype=object),
            group_ids=np.array([_uid_of(key) for key in keys], dtype=object),
            metric_values=metric_values,
            generated_tokens=int(sum(int(items[key].get("response_len", 0)) for key in keys)),
            columns=columns,
            # The step each prompt was submitted in (verl tags it): in the async mode a group finishes steps later,
            # and max_staleness counts from its submission.
            born_steps=np.array([min(int(items[_uid_of(key)].get("global_steps", self.step)), self.step)
                                 for key in keys], dtype=np.int64),
        )

    # ---------------------------------------------------------------- batches and storage

    def batch_meta(self, keys: np.ndarray) -> KVBatchMeta:
        """The training batch verl's pipeline reads: these trajectories, with their tags."""
        keys = [str(key) for key in keys]
        tags = [self.tags.pop(key) for key in keys]
        for key in keys:
            self.solved.pop(key, None)
        for uid in {_uid_of(key) for key in keys}:
            self._keys_of.pop(uid, None)
        return KVBatchMeta(partition_id=self._partition_id, keys=keys, tags=tags)

    def release(self, uids) -> None:
        """Remove groups from TransferQueue: those the filter did not keep, and pooled ones the sampler dropped
        (older than ``max_staleness``)."""
        keys = [key for uid in uids for key in self._keys_of.pop(str(uid), [])]
        for key in keys:
            self.tags.pop(key, None)
            self.solved.pop(key, None)
        if keys:
            tq.kv_clear(keys=keys, partition_id=self._partition_id)

    def keys_of(self, uids) -> list[str]:
        return [key for uid in uids for key in self._keys_of.get(str(uid), [])]

    def selection(self, keys, scored_columns: dict) -> dict[str, float]:
        """``dynamic_sampling.selection``'s metrics for the trajectories ``keys`` about to be trained, against every
        trajectory scored this step (``scored_columns``). A trajectory resumed after a weight update spans several
        policy versions (verl's ``min_global_steps`` < ``max_global_steps``): it counts as recycled."""
        tags = [self.tags[str(key)] for key in keys]
        solved = [self.solved.get(str(key)) for key in keys]
        recycled = sum(1 for tag in tags if tag.get("min_global_steps") is not None
                       and tag.get("max_global_steps") is not None
                       and int(tag["max_global_steps"]) > int(tag["min_global_steps"]))
        return selection_metrics(
            [int(tag.get("response_len", 0)) for tag in tags], scored_columns.get(LENGTH_COLUMN),
            None if any(value is None for value in solved) else solved, scored_columns.get(SOLVED_COLUMN), recycled)

    def resume_in_flight(self, prompts: int) -> None:
        """After a resume in an async mode: verl restored (and re-issues) this many prompt groups still generating."""
        self._submitted, self._returned = int(prompts), 0

    def restore(self, tags: dict[str, dict]) -> None:
        """After a resume: the tags of the pooled groups put back into TransferQueue."""
        for key, tag in tags.items():
            self.tags[key] = tag
            self._keys_of.setdefault(_uid_of(key), []).append(key)
        for uid in self._keys_of:
            self._keys_of[uid].sort(key=_session_order)

    def _scores(self, keys: list[str]) -> tuple[dict, np.ndarray]:
        """The reward manager's per-trajectory extra info (columns) and the filter metric."""
        sequence_metric = self._metric in SEQUENCE_METRICS
        fields = ["extra_fields", "rm_scores"] if sequence_metric else ["extra_fields"]
        data = tq.kv_batch_get(keys=keys, partition_id=self._partition_id, select_fields=fields)
        infos = []
        for value in list(data["extra_fields"]):
            extra = getattr(value, "data", value)
            infos.append(extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {})
        shared = set.intersection(*(set(info) for info in infos)) if infos else set()
        columns = {name: np.array([info[name] for info in infos]) for name in sorted(shared)}
        if self._metric is None:
            return columns, np.zeros(len(keys))
        tensors = {}
        if sequence_metric:
            sums = [float(row.sum()) for row in list(data["rm_scores"])]
            tensors = {"rm_scores": torch.tensor(sums, dtype=torch.float64).unsqueeze(-1)}
        return columns, trajectory_metric(self._metric, tensors, columns)


class DAPOReplayBuffer(ReplayBuffer):
    """verl v1's replay buffer with the recipe's dynamic sampler for training batches (see the module docstring)."""

    def __init__(self, trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                 sampler_kwargs, poll_interval: float = 2.0, refill_fn=None, **verl_kwargs):
        super().__init__(trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                         sampler_kwargs, poll_interval=poll_interval, refill_fn=refill_fn)
        if trainer_mode not in V1_TRAINER_MODES:
            raise ValueError(
                f"trainer.v1.trainer_mode={trainer_mode!r}: the recipe's DAPO sampler runs on verl v1 in "
                f"{V1_TRAINER_MODES} (see recipe_dapo.trainers.table; the start-up rules refuse this)"
            )
        if refill_fn is None:
            raise ValueError("DAPOReplayBuffer needs verl's refill_fn to submit prompts")
        # sync: the weights change after every step, so a step waits for the prompts still generating (their groups
        # are pooled); colocate_async: they pause with the replicas and resume after the update (partial rollout).
        self.drain = v1_entry(trainer_mode).drains
        kwargs = dict(sampler_kwargs or {})
        self.config = sampler_config(kwargs)  # the keys of sampler_settings, as the classic trainer's
        self.sampler = DynamicSampler(self.config)
        self.groups = TransferQueueGroups(
            refill_fn,
            metric=self.config.metric if self.config.enable else None,
            poll_interval_s=float(self.config.poll_interval_s),
            max_span=None if self.drain else max_off_policy_threshold,
        )
        if self.config.one_round:
            if self.drain:
                raise ValueError(f"dapo.dynamic_sampling.one_round=true needs trainer.v1.trainer_mode=colocate_async "
                                 f"(partial rollout), not {trainer_mode} (the start-up rules refuse this)")
            self.groups.overdue_after = int(self.config.max_staleness)
        self.groups_multiple_of = int(kwargs.get("ppo_mini_batch_size") or 1)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id != TRAIN:
            return super().sample(global_steps, partition_id, batch_size)
        if batch_size != self.config.train_batch_size:
            raise ValueError(
                f"verl asked for {batch_size} groups but data.train_batch_size is {self.config.train_batch_size}"
            )
        self.groups.step = global_steps
        self.groups.watch.progress()  # the time between steps (the update; paused prompts in colocate_async) is no stall
        collected = collect_streaming_step(
            self.sampler, self.groups, global_steps, groups_multiple_of=self.groups_multiple_of, drain=self.drain
        )
        self.groups.release(self.sampler.take_dropped_group_ids())
        metrics = dict(collected.metrics)
        metrics[METRIC_PREFIX + "failed_groups"] = float(self.groups.failed_groups)
        metrics[METRIC_PREFIX + "in_flight_prompts"] = float(self.groups.in_flight())
        if not self.drain:
            metrics[METRIC_PREFIX + "off_policy_dropped_groups"] = float(self.groups.off_policy_groups)
        if collected.scored_columns:
            metrics.update(scored_round_metrics(collected.scored_columns))
        if collected.batch is not None and len(collected.batch):
            metrics.update(self.groups.selection(collected.batch, collected.scored_columns))
        if collected.batch is None or len(collected.batch) == 0:
            raise DynamicSamplingExhausted(
                f"step {global_steps}: no group qualified within algorithm.filter_groups.max_num_gen_batches="
                f"{self.config.max_num_gen_batches}; verl's v1 trainer cannot skip a step's update (the classic "
                "trainer, trainer.use_v1=false, does). Raise max_num_gen_batches (0: no limit) or check that the "
                f"filter metric {self.config.metric!r} varies within groups"
            )
        return self.groups.batch_meta(collected.batch), metrics

    # ---------------------------------------------------------------- a step given up in generation

    def step_start(self) -> Optional[dict]:
        """What a step given up in generation goes back to, taken as the step begins: in sync mode the sampler (its
        pooled groups' trajectories stay in TransferQueue until a step takes or drops them, which a given-up step
        never reaches); in the async modes nothing (``None``): verl's TransferQueue snapshot keeps the prompts the
        step submitted, in flight, so the state at the moment of giving up is the one to save."""
        return self.sampler.state_dict(compact=False) if self.drain else None

    def rewind(self, start: Optional[dict]) -> None:
        """Back to :meth:`step_start`'s state (sync mode): the groups this step pooled are forgotten (never saved:
        verl saves no TransferQueue in sync mode) and its prompts are drawn again from the rewound dataloader."""
        if start is not None:
            self.sampler.load_state_dict(start)

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        """The sampler, the pooled groups' tags and correctness (``selection`` metrics) and, in sync mode (where verl saves
        no TransferQueue), their trajectories."""
        state = self.sampler.state_dict()
        keys = [str(key) for segment in state["pool"] for key in segment["payload"]]
        return {
            "sampler": state,
            "tags": {key: self.groups.tags[key] for key in keys},
            "solved": {key: self.groups.solved[key] for key in keys if key in self.groups.solved},
            "trajectories": tq.kv_batch_get(keys=keys, partition_id=TRAIN) if keys and self.drain else None,
        }

    def load_state_dict(self, state: dict, restored_in_flight: int = 0) -> None:
        """Restore the sampler; in sync mode put the pooled trajectories back, in the async modes (verl restored
        TransferQueue) count the restored prompts as in flight and free what no pooled or generating group owns."""
        self.sampler.load_state_dict(state["sampler"])
        tags = state["tags"]
        if tags and state.get("trajectories") is not None:
            keys = list(tags)
            tq.kv_batch_put(keys=keys, partition_id=TRAIN, fields=state["trajectories"], tags=[tags[k] for k in keys])
        self.groups.restore(tags)
        self.groups.solved.update(state.get("solved") or {})  # (a checkpoint from before it was saved: none)
        if not self.drain:
            self.groups.resume_in_flight(restored_in_flight)
            items = (tq.kv_list(TRAIN) or {}).get(TRAIN, {})
            owners = {_uid_of(key) for key in tags} | {key for key, tag in items.items() if tag.get("is_prompt")}
            orphans = [key for key, tag in items.items() if not tag.get("is_prompt") and _uid_of(key) not in owners]
            if orphans:  # the trajectories of the batch trained at the checkpoint's step
                tq.kv_clear(keys=orphans, partition_id=TRAIN)
