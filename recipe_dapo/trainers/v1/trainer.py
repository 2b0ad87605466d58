"""DAPO on verl 0.9.1's v1 trainer (``trainer.use_v1=true``): ``DAPOTrainerV1`` (``trainer.v1.trainer_mode=sync``) and
``DAPOTrainerV1ColocateAsync`` (``colocate_async``), registered with verl's ``register_trainer`` as
``recipe_dapo.sync`` and ``recipe_dapo.colocate_async``.

verl v1's step is already the paper's algorithm once its replay buffer is DAPO's sampler::

    sample          DAPOReplayBuffer: submit prompts sized to the deficit, judge each group as it finishes,
                    refill, until train_batch_size qualifying groups are in hand (surplus kept for the next step)
    sleep replicas  verl's sync trainer (on_sample_end)
    old log-probs, advantages           verl
    update_actor    with overlong filtering: truncated responses contribute no loss
    update weights, save, validate, log verl (the recipe's state goes into the checkpoint, its metrics to the log)

These classes add only what differs from verl's trainers: no fixed-size first batch (the sampler submits its
own), the overlong filter around the actor update, the sampler's state in checkpoints, the recipe's validation
metrics (mean@k, pass@k, maj@k) and the recipe's tracker (console lines, the appending metrics file).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict

from verl import DataProto
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync, register_trainer

from recipe_dapo.compat.verl import before_dispatch, v1_tracking
from recipe_dapo.dynamic_sampling import METRIC_PREFIX
from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse, ResumePlan, groups_state, resume_plan
from recipe_dapo.overlong import TRUNCATED_COLUMN
from recipe_dapo.policy_lag import row_lags
from recipe_dapo.run.recipe_run import RecipeRun
from recipe_dapo.run.rollout_health import RolloutDied, StallWatch, is_fatal, summarize_error
from recipe_dapo.tracking.metric_names import RESPONSE_TOKENS_METRIC
from recipe_dapo.trainers.adapter import HoldsRecipeRun
from recipe_dapo.trainers.table import v1_entry
from recipe_dapo.trainers.v1.partial_rollout import PARTIAL_FIELD, DAPOFullyAsyncLLMServerClient
from recipe_dapo.trainers.v1.phase_timing import install_tq_timing, timed_step, uninstall_tq_timing
from recipe_dapo.trainers.v1.replay_buffer import DAPOReplayBuffer

logger = logging.getLogger(__name__)


class _DAPOOnV1(HoldsRecipeRun):
    """What DAPO changes in a verl v1 trainer, whatever its mode (mixed in before verl's trainer class); what both
    trainers share is its ``recipe`` (``run.recipe_run.RecipeRun``), whose lifecycle verl's loop events drive."""

    def __init__(self, config):
        super().__init__(config)
        if not isinstance(self.replay_buffer, DAPOReplayBuffer):
            raise TypeError(
                f"trainer.v1.sampler.custom_sampler gave {type(self.replay_buffer).__name__}; the recipe's v1 trainer "
                "needs recipe_dapo.trainers.v1.replay_buffer.DAPOReplayBuffer (the recipe's config sets it)"
            )
        if config.dapo.seeded_rollouts:
            logger.warning("dapo.seeded_rollouts applies to the classic trainer only: on verl's v1 trainer which prompts "
                           "a refill submits depends on the order in which groups finish, so runs do not repeat exactly")

    # ---------------------------------------------------------------- the step

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, with where its time went in this process beyond verl's timers (``phase_timing``:
        ``timing_s/tq_read``, ``tq_write``, ``gen_tq``, ``poll_wait``)."""
        self._step_metrics = metrics  # (verl's dict for the step: logged by on_step_end if the step ends there)
        metrics.update(self.__dict__.pop("_resume_metrics", None) or {})  # the first step after a resume
        return timed_step(super().step, self.replay_buffer, metrics, timing_raw)

    def on_init_end(self):
        """verl's workers are built (``init``): they hold the run folder's writers' lock, so that a new run waits for
        them to end; then verl's first weight sync."""
        self.recipe.hold_folder_as_writers(self.actor_rollout_wg.workers)
        super().on_init_end()

    def prepare_step(self) -> dict:
        """Nothing up front: the sampler submits prompts sized to what the step is missing."""
        return {}

    def _update_actor(self, batch, metrics: dict):
        """The actor update (a skipped, non-finite one is counted or stops the run: ``step_metrics.UpdateGuard``).
        From here on a stop request lets the step finish (it is saved)."""
        self.recipe.update_begins()
        result = self._update_actor_filtered(batch, metrics)
        self.recipe.observe_update(metrics, self.global_steps)
        self.recipe.observe_step(metrics, self.global_steps)  # the step's rewards and entropy are in by now
        return result

    def _update_actor_filtered(self, batch, metrics: dict):
        """verl's actor update; with overlong filtering, truncated responses are masked out of the loss for it.

        The masks in TransferQueue are put back afterwards, so verl's data metrics describe every trained response.
        """
        if not self.recipe.overlong_filter_on:
            return super()._update_actor(batch, metrics)
        original = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask", "extra_fields"]
        )
        masks, filter_metrics = self._overlong_masks(original)
        metrics.update(filter_metrics)
        self.recipe.count_trained_tokens(metrics, masks.values().sum())  # tokens that carry loss
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"response_mask": masks, "loss_mask": masks}, batch_size=len(batch.keys)))
        try:
            return super()._update_actor(batch, metrics)
        finally:
            restored = original["response_mask"]
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                            fields=TensorDict({"response_mask": restored, "loss_mask": restored},
                                              batch_size=len(batch.keys)))

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantages (and its rollout correction's weights), then the step's ``policy_lag/*`` metrics: each
        row's lag behind the policy being updated (version ``global_steps - 1``: verl syncs the weights of step s as
        version s) from the first weight version that generated it (``versions_of``)."""
        batch = super()._compute_advantage(batch, metrics)
        weighed = ["old_log_probs", "rollout_log_probs"] if self.config.actor_rollout_ref.rollout.calculate_log_probs \
            else []
        tensors = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["response_mask", *weighed]).to_padded_tensor()
        current = self.global_steps - 1
        lags = row_lags(current, versions_of(batch.tags, current))
        group_ids = np.array([key.split("_", 1)[0] for key in batch.keys], dtype=object)
        metrics.update(self.recipe.policy_lag_metrics(lags, group_ids, tensors["response_mask"],
                                                      *(tensors[key] if key in weighed else None
                                                        for key in ("old_log_probs", "rollout_log_probs"))))
        return batch

    def _overlong_masks(self, data) -> tuple[torch.Tensor, dict]:
        """The response masks with truncated responses zeroed (``recipe_dapo.overlong``'s rule), as nested rows."""
        responses, response_mask = data["responses"], data["response_mask"]
        width = int(self.config.actor_rollout_ref.rollout.response_length)
        lengths = [int(row.shape[0]) for row in responses.unbind()]
        padded = DataProto.from_dict(tensors={
            "responses": torch.nested.to_padded_tensor(responses, 0, output_size=(len(lengths), width)),
            "response_mask": torch.nested.to_padded_tensor(response_mask, 0, output_size=(len(lengths), width)),
        })
        infos = [getattr(value, "data", value) for value in list(data["extra_fields"])]
        truncated = [info.get("reward_extra_info", {}).get(TRUNCATED_COLUMN) for info in infos]
        if all(value is not None for value in truncated):
            padded.non_tensor_batch[TRUNCATED_COLUMN] = np.array(truncated, dtype=bool)
        metrics: dict = {}
        self.recipe.filter_overlong(padded, metrics)
        filtered = padded.batch["response_mask"].to(response_mask.dtype)
        rows = [filtered[i, :length] for i, length in enumerate(lengths)]
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged), metrics

    # ---------------------------------------------------------------- logging and validation

    def fit(self, agent_loop_manager):
        """verl's loop, logging through the recipe's tracker (console lines, the appending metrics file).

        verl's loop also pretty-prints every validation metric at the start and the end (hundreds of lines); the
        tracker's validation lines and end-of-run summary say it, and the metrics file has every value.

        The sampler's stream and verl's calls into the replicas (the weight sync, the abort and sleep at a colocated
        step's end) get the rollout's liveness probe (``dapo.health.rollout_probe_s``): a dead agent-loop worker,
        rollout server or vLLM engine stops the run instead of leaving it waiting for groups or for a call that never
        returns.
        """
        liveness = self.recipe.watch_rollout(getattr(self, "checkpoint_manager", None), agent_loop_manager,
                                             getattr(self, "llm_server_manager", None))
        self.replay_buffer.groups.watch = StallWatch(liveness, self.recipe.rollout_probe_s)
        self.recipe.run_begins()
        self.replay_buffer.groups.give_up = self.recipe.give_up
        verls_fit = super().fit
        install_tq_timing()  # this process's TransferQueue reads and writes, per step (timing_s/tq_read, tq_write)
        try:
            with v1_tracking(lambda: self.recipe.open_tracker(resumed_step=self.global_steps,
                                                              total_steps=self.total_training_steps)):
                self.recipe.drive(self, lambda: verls_fit(agent_loop_manager))
        finally:
            uninstall_tq_timing()

    # ---------------------------------------------------------------- the run's lifecycle (``run.lifecycle``)

    def on_step_end(self):
        """Where verl saves: on a pre-emption request, this step is saved (unless saved); the run stops before the
        next step, once verl logged this one (validation is skipped)."""
        self.recipe.step_ends(self)
        try:
            super().on_step_end()  # verl's weight sync, after verl saved the step
        except Exception:
            self._log_saved_step()
            raise

    def _log_saved_step(self) -> None:
        """A step saved but ending before verl logs it (its weight sync failed: a dead engine): its metrics go to the
        metrics file all the same, so that every step a rerun resumes after was logged."""
        if self.recipe.needs_checkpoint(self.global_steps) or getattr(self, "logger", None) is None:
            return
        metrics = {**getattr(self, "_step_metrics", {}), "training/global_step": self.global_steps}
        try:
            self.logger.log(data=metrics, step=self.global_steps)
        except Exception as error:  # the step's own error is the one to report
            logger.warning("step %d was saved but its metrics could not be logged: %s", self.global_steps, error)

    def on_step_begin(self):
        """verl's step begins (its flag is read while the step waits for its groups, not here: the step is then given
        up); until the update a stop request gives the step up, from the state captured here."""
        self.recipe.step_begins(self)
        super().on_step_begin()
        start = self.replay_buffer.step_start()
        self._step_start = None if start is None else {"replay_buffer": start,
                                                       "dataloader": self.train_dataloader.state_dict()}
        self.recipe.generation_begins(self.global_steps)

    def rewind(self) -> None:
        """A step given up (``run.lifecycle``) while it waited for its groups: in sync mode the sampler and the
        dataloader go back to where the step found them (its prompts return); in the async modes the state stays as
        it is (verl's TransferQueue snapshot keeps the prompts in flight). The actor has not changed since the step
        before."""
        start = getattr(self, "_step_start", None)
        if start is not None:
            self.replay_buffer.rewind(start["replay_buffer"])
            self.train_dataloader.load_state_dict(start["dataloader"])

    def on_sample_end(self):
        """verl's (colocate_async: abort what is still generating, then sleep the replicas); a rollout found dead there
        is ``RolloutDied`` naming it, as the sampler's stream and the liveness probe name one."""
        try:
            super().on_sample_end()
        except Exception as error:
            if not is_fatal(error):
                raise
            raise RolloutDied(f"rollout died at step {self.global_steps} while its generation was stopped: "
                              f"{summarize_error(error)}") from error

    def _validate(self, *args, **kwargs):
        if self.stopped_by:  # pre-empted: the time is the checkpoint's
            return {}
        if not hasattr(self, "_step_start"):  # verl's validation before training: run it unless the file has it
            logged = self.recipe.logged_validation(self.global_steps)
            if logged:
                return logged
        return super()._validate(*args, **kwargs)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        """verl's metrics, plus the response tokens that carried loss (``step_metrics.RESPONSE_TOKENS_METRIC``: counted
        by ``_update_actor`` after the overlong filter; without the filter, every trained response's tokens)."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if RESPONSE_TOKENS_METRIC not in metrics:
            self.recipe.count_trained_tokens(
                metrics, sum(int(tag.get("response_len", 0)) for tag in batch.tags if not tag.get("is_padding", False))
            )

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None):
        """verl's validation metrics plus what papers report per source: mean@k, pass@k, maj@k."""
        metric_dict = super()._val_metrics_update(
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts=expected_acc_counts
        )
        # A static step: validation metrics need no run state (the trainer may be half-built in a test).
        return RecipeRun.validation_metrics(metric_dict, data_sources, sample_uids, reward_extra_infos_dict)

    # ---------------------------------------------------------------- checkpoints

    def _save_checkpoint(self):
        """The sampler (with its pooled groups' trajectories) first, then verl's checkpoint (``RecipeRun``); a failed
        save (a full disk) removes the half-written folder and raises ``CheckpointWriteError`` (one line)."""
        state = {"replay_buffer": self.replay_buffer.state_dict(), **self._rollout_state()}
        self.recipe.save_checkpoint(self.global_steps, state, super()._save_checkpoint)

    def _rollout_state(self) -> dict:
        """What the checkpoint keeps of the rollout beyond verl's TransferQueue snapshot (sync: nothing)."""
        return {}

    def _restore_rollout_state(self, state: dict) -> str:
        """The counterpart of :meth:`_rollout_state` after a resume; what the resume line says of it."""
        return ""

    def _load_checkpoint(self):
        super()._load_checkpoint()
        state = self.recipe.load_checkpoint(self.global_steps)
        if state is None:
            return
        # In the async modes verl restored TransferQueue itself, with the prompts that were still generating.
        self.replay_buffer.load_state_dict(state["replay_buffer"], restored_in_flight=self._restored_tq_prompt_count)
        in_flight = f"{self._restored_tq_prompt_count} prompts restored in flight" if not self.replay_buffer.drain else (
            "no prompts in flight (sync)")
        restored = self._restore_rollout_state(state)
        if restored:
            in_flight += f"; {restored}"
        self.recipe.announce_resume(self.global_steps, self.replay_buffer.sampler.pooled_groups, in_flight)


PARTIALS_TIMEOUT_S = 120.0
"""Longest wait for the agent-loop workers' responses in flight when a checkpoint is saved."""
PARTIALS_TIMEOUT_STOPPING_S = 5.0
"""The same wait in the save of a run that was asked to stop (a signal): its grace (``dapo.preemption.grace_s``, 30 s
by default) is for the whole save; a worker answers in milliseconds when it answers at all."""


def in_flight_births(partition_id: str = "train") -> dict:
    """The groups still generating (prompt markers ``pending`` or ``running``, those verl re-issues on a resume): uid
    -> the step each was submitted in (its ``global_steps`` tag)."""
    items = (tq.kv_list(partition_id) or {}).get(partition_id, {})
    return {key: int(tag.get("global_steps", 0)) for key, tag in items.items()
            if tag.get("is_prompt", False) and tag.get("status") in ("pending", "running")}


def groups_state_of(live: dict, born: dict) -> dict:
    """``partial_responses.groups_state`` over the workers' answers (states, as the workers send them)."""
    return groups_state({uid: {int(session): PartialResponse.from_state(state) for session, state in sessions.items()}
                         for uid, sessions in live.items()}, born)


def put_partial_field(rows: dict, partition_id: str) -> None:
    """Write ``PARTIAL_FIELD`` into these prompt rows (uid -> the group's saved responses, session -> state)."""
    from tensordict import NonTensorData, NonTensorStack

    tq.kv_batch_put(keys=list(rows), partition_id=partition_id,
                    fields=TensorDict({PARTIAL_FIELD: NonTensorStack(*[NonTensorData(row) for row in rows.values()])},
                                      batch_size=len(rows)))


def versions_of(tags: list, current: int) -> np.ndarray:
    """Per row of a v1 batch, the policy version of its oldest token: verl's ``min_global_steps`` (the weight version
    the rollout server held when the row's first token was generated; a request resumed after an update spans
    several), else the version it was submitted under (``global_steps - 1``); ``current`` for verl's padding rows
    (they carry no loss); None for a row with neither (``row_lags`` refuses it)."""
    versions = []
    for tag in tags:
        if tag.get("is_padding", False):
            versions.append(int(current))
            continue
        first = tag.get("min_global_steps")
        if first is None and tag.get("global_steps") is not None:
            first = int(tag["global_steps"]) - 1
        versions.append(None if first is None else max(int(first), 0))
    return np.array(versions, dtype=object)


@register_trainer(v1_entry("sync").registered_name)
class DAPOTrainerV1(_DAPOOnV1, PPOTrainerSync):
    """verl's synchronous v1 trainer with DAPO's sampler: a step drains the prompts still generating when its batch
    is full (their qualifying groups are pooled for the next step), then the replicas sleep for the update."""


@register_trainer(v1_entry("colocate_async").registered_name)
class DAPOTrainerV1ColocateAsync(_DAPOOnV1, PPOTrainerColocateAsync):
    """verl's colocated async v1 trainer with DAPO's sampler: a step takes its batch as soon as it is full; prompts
    still generating are paused with the replicas and resume, with partial rollout, after the weight update, so their
    groups count toward the next steps (``DAPOReplayBuffer`` drops those older than verl's
    ``trainer.v1.sampler.max_off_policy_threshold``). A checkpoint keeps those responses (``partial_rollout``), and a
    resumed run continues them from their prefix."""

    def get_llm_client(self):
        """verl's resuming client, with the recipe's record of each attempt (``partial_rollout``)."""
        return self.llm_server_manager.get_client(client_cls=DAPOFullyAsyncLLMServerClient)

    # ---------------------------------------------------------------- responses in flight across a checkpoint

    def _rollout_state(self) -> dict:
        """The responses of the groups still generating (``dynamic_sampling.partial_responses``), read from the agent-
        loop workers; verl's snapshot keeps only their prompts. A worker that cannot be read (a dead rollout, no answer
        within ``PARTIALS_TIMEOUT_S``, or ``PARTIALS_TIMEOUT_STOPPING_S`` in a stopping run's save) is warned about
        and its groups' responses are not saved: a resume regenerates those from their prompts; the other workers'
        are saved."""
        born = in_flight_births()
        workers = list(getattr(getattr(self, "agent_loop_manager", None), "agent_loop_workers", None) or [])
        if not born or not workers:
            return {"partial_responses": {}}
        import ray

        refs = [worker.partial_responses.remote(list(born)) for worker in workers]
        stopping = getattr(getattr(self, "recipe", None), "stopped_by", None)
        wait_s = PARTIALS_TIMEOUT_STOPPING_S if stopping else PARTIALS_TIMEOUT_S
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        live: dict = {}
        failed: list[str] = []
        for ref in ready:
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError as error:
                failed.append(summarize_error(error))
                continue
            for uid, sessions in answer.items():
                live.setdefault(uid, {}).update(sessions)
        silent = len(refs) - len(ready)
        if failed or silent:
            why = failed + ([f"{silent} gave no answer within {wait_s:g} s"] if silent else [])
            logger.warning("step %d: %d of %d agent-loop workers could not be read for the responses still generating "
                           "(%s); the checkpoint keeps their groups' prompts only, a resume regenerates those",
                           self.global_steps, len(failed) + silent, len(refs), "; ".join(why))
        return {"partial_responses": groups_state_of(live, born)}

    def _restore_rollout_state(self, state: dict) -> str:
        """The rule for the saved responses (``partial_responses.resume_plan``), applied when verl re-issues the
        prompts (:meth:`_reissue_inflight_prompts`)."""
        saved = state.get("partial_responses")
        if not saved:
            self._partial_plan = None
            return ""
        self._partial_plan = resume_plan(saved, resume_step=self.global_steps + 1,
                                         max_staleness=int(self.replay_buffer.config.max_staleness),
                                         in_flight=in_flight_births())
        return self._partial_plan.summary()

    def _reissue_inflight_prompts(self, partition_id: str = "train") -> int:
        """verl's re-issue of the prompts restored in flight, each group's saved responses riding with its prompt row
        (``partial_rollout.PARTIAL_FIELD``) to the worker that runs it. A resumed group keeps the step it was submitted
        in (its marker's ``global_steps``, which verl's re-issue sets to the current step), so the staleness rules count
        its age from its submission (its first token may be later: an upper bound). Those markers are written back
        after verl's and before verl dispatches the prompts: a worker's own marker write (``running``) rewrites the
        whole tag, so a write racing it could be lost."""
        plan: ResumePlan | None = self.__dict__.pop("_partial_plan", None)
        if plan is None or partition_id != "train":
            return super()._reissue_inflight_prompts(partition_id)
        uids = list(in_flight_births(partition_id))
        born = {uid: step for uid, step in plan.born.items() if uid in set(uids)}
        if uids:
            put_partial_field({uid: {session: response.to_state() for session, response
                                     in plan.resumed.get(uid, {}).items()} for uid in uids}, partition_id)

        def hand_over() -> None:  # verl has read the rows (the batch carries the responses) and marked them pending
            if born:
                tq.kv_batch_put(keys=list(born), partition_id=partition_id,
                                tags=[{"global_steps": step} for step in born.values()])
            if uids:
                put_partial_field({uid: {} for uid in uids}, partition_id)  # the rows no longer carry them

        with before_dispatch(self.agent_loop_manager, hand_over):
            count = super()._reissue_inflight_prompts(partition_id)
        self._resume_metrics = plan.metrics(METRIC_PREFIX)
        return count

    def on_train_begin(self):
        """verl's prefetch window (``colocate_async.num_warmup_batches``), submitted through the sampler's stream so
        that its prompts count as in flight."""
        window = math.floor(
            float(self.config.trainer.v1.colocate_async.num_warmup_batches) * int(self.config.data.train_batch_size)
        )
        missing = max(0, window - self._restored_tq_prompt_count)
        if missing:
            self.replay_buffer.groups.submit(missing)
