"""``RayDAPOTrainer``: DAPO's Algorithm 1 on top of verl 0.9.x's ``RayPPOTrainer``.

One training step, as the paper writes it::

    collect_filtered_batch   sample prompts, generate G responses each, score them, drop groups whose
                             responses all score the same, repeat until train_batch_size groups are in hand
    replicas.sleep           the rollout replicas free their memory for the actor
    prepare_update           old (and reference) log-probs, GRPO advantages
    filter_overlong          truncated responses contribute no loss (when overlong filtering is on)
    update_actor             the policy update, then weight sync to the rollout engine
    maybe_save, maybe_validate, log_step

The rollout replicas follow verl's protocol whatever the number of rounds in a step (``rollout_replicas``):
awake with the actor's current weights for every generation, asleep while the actor works.

Everything else (workers, weight sync, checkpoints, validation generation, metric helpers) is the base
class's; the algorithmic decisions live in pure modules (``dynamic_sampling``, ``overlong``,
``validation_metrics``). Settings the recipe does not support are refused at start-up (``preflight``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Optional

import numpy as np
import torch
from omegaconf import open_dict
from tqdm import tqdm

from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
)
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role, apply_kl_penalty, compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import extract_reward
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.skip.skip_manager import SkipManager

from recipe_dapo.advantages import GRPO_PROCESS, PRM_SCORER
from recipe_dapo.dynamic_sampling import (
    DATAPROTO_OPS,
    DynamicSampler,
    PromptStream,
    ScoredRound,
    collect_step,
    trajectory_metric,
)
from recipe_dapo.dynamic_sampling.selection import LENGTH_COLUMN, SOLVED_COLUMN, selection_metrics
from recipe_dapo.loss.reference_reset import reset_due
from recipe_dapo.policy_lag import POLICY_VERSION, row_lags, stamp
from recipe_dapo.run.nodes import log_placement
from recipe_dapo.run.recipe_run import RecipeRun
from recipe_dapo.run.step_metrics import GEN_TIMER, STEP_TIMER, TESTING_TIMER, scored_round_metrics
from recipe_dapo.run.validation_metrics import equal_samples_per_problem, with_problem_uids
from recipe_dapo.trainers.adapter import HoldsRecipeRun
from recipe_dapo.trainers.classic.rollout_replicas import RolloutReplicas
from recipe_dapo.trainers.classic.rollout_seeds import AGENT_NAME as SEEDED_AGENT_NAME
from recipe_dapo.trainers.classic.rollout_seeds import SEED_COLUMN, SEEDABLE_AGENT_LOOPS, round_seeds, \
    validation_seeds
from recipe_dapo.trainers.process_steps import build_step_scorer, served_model_awake, write_step_rewards

logger = logging.getLogger(__name__)


class RayDAPOTrainer(HoldsRecipeRun, RayPPOTrainer):
    """verl's PPO trainer with DAPO's dynamic sampling, overlong filtering and training-step accounting; what both
    trainers share (the run's lifecycle, update guard, tracker, liveness, recipe state, metrics) is its ``recipe``
    (``run.recipe_run.RecipeRun``), which this trainer's loop drives with its events."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampler = DynamicSampler(self.recipe.sampler_config, ops=DATAPROTO_OPS)
        self.prompt_stream = PromptStream(self._open_epoch, ops=DATAPROTO_OPS)
        self.recipe.stop_ids  # noqa: B018  (read now: a tokenizer without stop ids fails at start-up, not at step 1)
        self._rounds_generated_in_step: dict[int, int] = {}
        self._validation_batches: int | None = None  # during _validate with seeded rollouts: the batches seeded
        self._step_scorer = None  # grpo_process: dapo.objective.step_scorer, built once

    def _process_step_scorer(self):
        if self._step_scorer is None:
            self._step_scorer = build_step_scorer(self.config, getattr(self, "reward_loop_manager", None))
        return self._step_scorer

    # ------------------------------------------------------------------ set-up

    def init_workers(self):
        """verl's workers, rollout replicas and checkpoint manager; the replicas start asleep."""
        super().init_workers()
        self.replicas = RolloutReplicas(self.checkpoint_manager)
        # Which Ray node holds each actor rank and replica: one line, what a multi-node launch checks first.
        log_placement(self.actor_rollout_wg.workers, self.checkpoint_manager.replicas)
        self.recipe.hold_folder_as_writers(self.actor_rollout_wg.workers)  # a new run waits for them to end
        if self.config.algorithm.adv_estimator == GRPO_PROCESS:
            self._process_step_scorer()  # built now: a process reward model that cannot be read fails at start-up

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler):
        """The base counts steps in dataloader batches; DAPO counts optimizer steps of train_batch_size prompts.

        A step may consume several generation rounds, so "one epoch" of training steps is the dataset size
        divided by the training batch, and the LR schedule is sized in those steps.
        """
        super()._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)
        if self.config.trainer.total_training_steps is None:
            steps_per_epoch = max(len(self.train_dataset) // int(self.config.data.train_batch_size), 1)
            self.total_training_steps = steps_per_epoch * int(self.config.trainer.total_epochs)
            with open_dict(self.config):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps
            logger.info("total training steps (optimizer steps): %d", self.total_training_steps)
        # Copies of one validation problem share a uid, so verl and the recipe group them as one problem.
        self.val_dataloader.collate_fn = with_problem_uids(self.val_dataloader.collate_fn)

    def _open_epoch(self, epoch: int):
        """Batches of prompt rows for ``epoch`` (the stateful dataloader continues where it stopped)."""
        if hasattr(self.train_dataloader.sampler, "set_epoch"):
            self.train_dataloader.sampler.set_epoch(epoch)
        return (DataProto.from_single_dict(batch_dict) for batch_dict in self.train_dataloader)

    # ------------------------------------------------------------------ the loop

    def fit(self):
        """Train for ``total_training_steps`` optimizer steps (validation and saving as configured)."""
        self._init_dump_executor()  # verl's generation-dump executor (a second fit finds it shut down)
        self.global_steps = 0
        self._load_checkpoint()
        # Opened after the checkpoint: the metrics file keeps what earlier processes logged up to this step.
        self.tracker = self.recipe.open_tracker(resumed_step=self.global_steps, total_steps=self.total_training_steps)
        # A call into a dead engine (weight sync, sleep, abort) never returns: the liveness probe runs beside each.
        self.recipe.watch_rollout(getattr(self, "checkpoint_manager", None), getattr(self, "async_rollout_manager", None),
                                  getattr(self, "llm_server_manager", None))
        self.replicas.sync_weights(self.global_steps)
        self.reset_reference({}, resumed=True)
        SkipManager.init(self.config)

        if self.config.trainer.get("val_before_train", True) and not self.recipe.logged_validation(self.global_steps):
            val_metrics = self._validate()
            logger.info("initial validation: %s", val_metrics)
            self.tracker.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                self._shutdown_dump_executor()
                return

        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="DAPO training steps")
        self.recipe.run_begins()
        self.global_steps += 1
        self.max_steps_duration = 0
        try:
            self.recipe.drive(self, lambda: self._train_steps(progress))
        finally:
            progress.close()
            if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=True)
            self._shutdown_dump_executor()

    def _train_steps(self, progress: tqdm) -> None:
        """The steps from ``global_steps`` on; the run's lifecycle reads the stop flag before each (nothing is in
        flight between this loop's steps) and ends the run when a step stopped it."""
        while self.global_steps <= self.total_training_steps:
            self.recipe.step_begins(self, read_flag=True)
            SkipManager.set_step(self.global_steps)
            self.train_step()
            progress.update(1)
            if self.stopped_by:
                break
            self.global_steps += 1

    def rewind(self) -> None:
        """A step given up (``run.lifecycle``): the sampler, the prompt stream and the dataloader back where the step
        found them; the rollout replicas were put to sleep."""
        self.replicas.awake = False
        self._load_recipe_state(self._step_start)

    def train_step(self) -> dict:
        """One optimizer step of Algorithm 1; returns the metrics it logged."""
        metrics, timing = {}, {}
        is_last_step = self.global_steps >= self.total_training_steps
        with marked_timer(STEP_TIMER, timing):
            # Until the update, a stop request gives the step up: it starts again from this state on resume.
            self._step_start = self._recipe_state(compact=False)
            self._policy_version = self.sampler.policy_version  # the policy this step generates with and updates
            self.recipe.generation_begins(self.global_steps)
            batch = self.collect_filtered_batch(metrics, timing)
            self.recipe.update_begins()
            with marked_timer("rollout_sleep", timing):
                self.replicas.sleep()  # however many rounds ran (none, one, several): the actor needs the memory
            if batch is not None:
                batch = self.prepare_update(batch, metrics, timing)
                self.filter_overlong(batch, metrics)
                self.update_actor(batch, metrics, timing)
            else:
                # Under on_exhausted=train_partial too few groups qualified for one mini-batch: no update.
                logger.warning("step %d: too few qualifying groups for a mini-batch; skipping the update", self.global_steps)
            self.reset_reference(metrics)  # iterative RL, every N-th step whether or not it updated
            self.maybe_save(timing, is_last_step)
            stopping = self.recipe.step_ends(self, lambda: marked_timer("save_checkpoint", timing, color="green"))
        if not stopping:  # pre-empted: no validation, the time is the checkpoint's
            self.maybe_validate(metrics, timing, is_last_step)
        self.log_step(batch, metrics, timing)
        return metrics

    # ------------------------------------------------------------------ Algorithm 1, lines 2-8

    def collect_filtered_batch(self, metrics: dict, timing: dict) -> Optional[DataProto]:
        """Generate and score rounds until ``train_batch_size`` qualifying groups are pooled (dynamic sampling)."""
        collected = collect_step(
            self.sampler,
            self.prompt_stream,
            lambda prompts: self.generate_round(prompts, timing),
            step=self.global_steps,
            groups_multiple_of=self._groups_multiple(),
        )
        metrics.update(collected.metrics)
        if collected.rounds:  # reward metrics describe everything scored this step, before filtering
            metrics.update(scored_round_metrics(collected.scored_columns))
        if collected.batch is not None:  # what is trained against what finished (no partial rollouts: none recycled)
            trained = collected.batch
            metrics.update(selection_metrics(
                trained.batch["response_mask"].sum(-1).numpy(), collected.scored_columns.get(LENGTH_COLUMN),
                trained.non_tensor_batch.get(SOLVED_COLUMN), collected.scored_columns.get(SOLVED_COLUMN)))
        return collected.batch

    def _groups_multiple(self) -> int:
        """A partial batch must still split evenly into PPO mini-batches."""
        return int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def generate_round(self, prompts: DataProto, timing: dict) -> ScoredRound:
        """One round for the sampler: the scored rollouts, their uids, filter metric and generated tokens."""
        rollouts = self.generate_and_score(prompts, timing)
        return ScoredRound(
            rollouts=rollouts,
            group_ids=rollouts.non_tensor_batch["uid"],
            metric_values=trajectory_metric(
                self.config.algorithm.filter_groups.metric, rollouts.batch, rollouts.non_tensor_batch
            ),
            generated_tokens=int(rollouts.batch["response_mask"].sum()),
            columns={**rollouts.non_tensor_batch, LENGTH_COLUMN: rollouts.batch["response_mask"].sum(-1).numpy()},
        )

    def generate_and_score(self, prompts: DataProto, timing: dict) -> DataProto:
        """G responses per prompt from the rollout engine, with their rewards (one ``uid`` per prompt)."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        prompts.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        gen_batch = self._get_gen_batch(prompts).repeat(repeat_times=n, interleave=True)
        gen_batch.meta_info["global_steps"] = self.global_steps
        self._seed_rollouts(gen_batch)
        with marked_timer("wake_replicas", timing, color="red"):
            self.replicas.ready_for_generation(self.global_steps)  # a no-op unless asleep or behind the actor
        with marked_timer(GEN_TIMER, timing, color="red"), self.recipe.generation_window():
            output = self.async_rollout_manager.generate_sequences(gen_batch)
        # Per-round meta_info must not travel with the rollouts: rounds (and carried-over groups from
        # earlier steps) are concatenated later, and DataProto.concat requires equal meta_info.
        for key, seconds in output.meta_info.pop("timing", {}).items():
            timing[key] = timing.get(key, 0.0) + seconds
        output.meta_info.pop("global_steps", None)
        rollouts = prompts.repeat(repeat_times=n, interleave=True).union(output)
        if "response_mask" not in rollouts.batch.keys():
            rollouts.batch["response_mask"] = compute_response_mask(rollouts)
        with marked_timer("reward", timing, color="yellow"):
            if self.use_rm and "rm_scores" not in rollouts.batch.keys():
                self.replicas.sleep()  # a colocated reward model needs the replicas' memory (as in verl)
                rollouts = rollouts.union(self._compute_reward_colocate(rollouts))
            reward_tensor, reward_extra_info = extract_reward(rollouts)
        rollouts.batch["token_level_scores"] = reward_tensor
        # Which policy generated these rows: carried over or resumed, they keep it (``recipe_dapo.policy_lag``).
        rollouts.non_tensor_batch[POLICY_VERSION] = stamp(len(rollouts), self.sampler.policy_version)
        rollouts.non_tensor_batch.update({key: np.array(values) for key, values in reward_extra_info.items()})
        return rollouts

    def _seeds_rollouts(self) -> bool:
        rollout = self.config.actor_rollout_ref.rollout
        return bool(self.config.dapo.seeded_rollouts) and rollout.agent.default_agent_loop in SEEDABLE_AGENT_LOOPS

    def _seed_rollouts(self, gen_batch: DataProto) -> None:
        """Per-response vLLM seeds from (rollout seed, step, round), when ``dapo.seeded_rollouts`` is on."""
        if not self._seeds_rollouts():
            return
        round_in_step = self._rounds_generated_in_step.get(self.global_steps, 0)
        self._rounds_generated_in_step = {self.global_steps: round_in_step + 1}
        run_seed = self.config.actor_rollout_ref.rollout.seed
        self._give_seeds(gen_batch, round_seeds(run_seed, self.global_steps, round_in_step, len(gen_batch)))

    @staticmethod
    def _give_seeds(gen_batch: DataProto, seeds: np.ndarray) -> None:
        gen_batch.non_tensor_batch[SEED_COLUMN] = seeds
        gen_batch.non_tensor_batch["agent_name"] = np.full(len(gen_batch), SEEDED_AGENT_NAME, dtype=object)

    def _validate(self, *args, **kwargs):
        """verl's validation; with seeded rollouts each validation response is sampled with its own seed as well, the
        same at every validation of the run (``rollout_seeds.validation_seeds``)."""
        self._validation_batches = 0 if self._seeds_rollouts() else None
        try:
            return super()._validate(*args, **kwargs)
        finally:
            self._validation_batches = None

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        gen_batch = super()._get_gen_batch(batch)
        if self._validation_batches is not None:  # in _validate: one call per validation batch
            run_seed = self.config.actor_rollout_ref.rollout.seed
            self._give_seeds(gen_batch, validation_seeds(run_seed, self._validation_batches, len(gen_batch)))
            self._validation_batches += 1
        return gen_batch

    # ------------------------------------------------------------------ Algorithm 1, line 9

    def prepare_update(self, batch: DataProto, metrics: dict, timing: dict) -> DataProto:
        """Old / reference log-probs, token rewards, GRPO advantages, and the batch's data metrics."""
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = _images_seqlens(batch)
        # Each row's lag behind the policy being updated; the column stays here (the workers need none of it).
        lags = row_lags(self._policy_version, batch.non_tensor_batch.pop(POLICY_VERSION, None))
        response_mask = batch.batch["response_mask"].clone()  # before any rejection the correction applies

        rollout_corr_config = self.config.algorithm.get("rollout_correction", None)
        bypass_mode = bool(rollout_corr_config and rollout_corr_config.get("bypass_mode", False))
        if bypass_mode:
            # Two policies: the rollout log-probs serve as the proximal (old) policy.
            from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

            apply_bypass_mode(
                batch=batch,
                rollout_corr_config=rollout_corr_config,
                policy_loss_config=self.config.actor_rollout_ref.actor.policy_loss,
            )
        else:
            with marked_timer("old_log_prob", timing, color="blue"):
                batch = self._add_old_log_prob(batch, metrics)
        if self.use_reference_policy:
            with marked_timer(str(Role.RefPolicy), timing, color="olive"):
                batch = batch.union(self._compute_ref_log_prob(batch))

        with marked_timer("adv", timing, color="brown"):
            if self.config.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(
                    batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
                )
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            if self.config.algorithm.adv_estimator == GRPO_PROCESS:  # each step's reward at its last token
                served = self.config.dapo.objective.step_scorer == PRM_SCORER  # the reward model scores the steps
                with served_model_awake(self.reward_loop_manager) if served else contextlib.nullcontext():
                    metrics.update(write_step_rewards(batch, self.tokenizer, self._process_step_scorer()))
            if rollout_corr_config is not None and "rollout_log_probs" in batch.batch and not bypass_mode:
                from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

                batch, correction_metrics = compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)
                metrics.update(correction_metrics)
            batch = compute_advantage(
                batch,
                adv_estimator=self.config.algorithm.adv_estimator,
                gamma=self.config.algorithm.gamma,
                lam=self.config.algorithm.lam,
                num_repeat=self.config.actor_rollout_ref.rollout.n,
                norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
                config=self.config.algorithm,
            )
        tensors = batch.batch.keys()
        metrics.update(self.recipe.policy_lag_metrics(
            lags, batch.non_tensor_batch["uid"], response_mask,
            *(batch.batch[key] if key in tensors else None for key in ("old_log_probs", "rollout_log_probs"))))
        metrics.update(compute_data_metrics(batch=batch, use_critic=False))  # every trained response, unfiltered
        return batch

    def filter_overlong(self, batch: DataProto, metrics: dict) -> None:
        """Overlong filtering: truncated responses add no loss (when ``dapo.overlong_filter.enable``).

        Runs after the advantages, so truncated responses still count in their group's baseline, and after the
        batch's data metrics, which describe every trained response.
        """
        self.recipe.filter_overlong(batch, metrics)

    def _add_old_log_prob(self, batch: DataProto, metrics: dict) -> DataProto:
        """π_old log-probs recomputed by the actor (three-policy mode), with verl's entropy metric."""
        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
        actor_config = self.config.actor_rollout_ref.actor
        entropy = agg_loss(
            loss_mat=old_log_prob.batch["entropys"],
            loss_mask=batch.batch["response_mask"],
            loss_agg_mode=actor_config.loss_agg_mode,
            loss_scale_factor=actor_config.loss_scale_factor,
        )
        metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": old_log_prob_mfu})
        old_log_prob.batch.pop("entropys")
        batch = batch.union(old_log_prob)
        if "rollout_log_probs" in batch.batch.keys():
            from verl.utils.debug.metrics import calculate_debug_metrics

            metrics.update(calculate_debug_metrics(batch))
        return batch

    # ------------------------------------------------------------------ Algorithm 1, lines 10-11

    def update_actor(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        """The policy update, then the weight sync to the rollout engine."""
        with marked_timer("update_actor", timing, color="red"):
            actor_output = self._update_actor(batch)
        self.replicas.actor_updated()
        metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
        self.recipe.observe_update(metrics, self.global_steps)  # a skipped (non-finite) update is counted, or stops
        with marked_timer("update_weights", timing, color="red"):
            self.replicas.sync_weights(self.global_steps)
        rollout_data_dir = self.config.trainer.get("rollout_data_dir", None)
        if rollout_data_dir:
            reward_extra = {k: batch.non_tensor_batch[k] for k in batch.meta_info.get("reward_extra_keys", [])}
            self._log_rollout_data(batch, reward_extra, timing, rollout_data_dir)

    def reset_reference(self, metrics: dict, resumed: bool = False) -> None:
        """Iterative RL: the reference takes the policy's weights when ``recipe_dapo.loss.reference_reset`` says so."""
        if reset_due(self.global_steps, self.config.dapo.objective.reference_reset_every, resumed=resumed):
            self.ref_policy_wg.reset_reference_to_actor()
            metrics["actor/reference_reset"] = 1.0

    def maybe_save(self, timing: dict, is_last_step: bool) -> None:
        """Checkpoint on schedule (every save_freq steps, the last step, or before the allocation expires)."""
        save_freq = self.config.trainer.save_freq
        if save_freq <= 0:
            return
        expiring = should_save_ckpt_esi(
            max_steps_duration=self.max_steps_duration, redundant_time=self.config.trainer.esi_redundant_time
        )
        if is_last_step or self.global_steps % save_freq == 0 or expiring:
            with marked_timer("save_checkpoint", timing, color="green"):
                self._save_checkpoint()

    # ------------------------------------------------------------------ validation and logging

    def maybe_validate(self, metrics: dict, timing: dict, is_last_step: bool) -> None:
        test_freq = self.config.trainer.test_freq
        if test_freq > 0 and (is_last_step or self.global_steps % test_freq == 0):
            with marked_timer(TESTING_TIMER, timing, color="green"):
                self.replicas.ready_for_generation(self.global_steps)  # asleep if this step skipped its update
                metrics.update(self._validate())

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns):
        """verl's validation metrics over every problem, plus what papers report per source: mean@k, pass@k, maj@k.

        verl's metrics get k samples of every problem (``recipe_dapo.run.validation_metrics`` says why); the headline
        ``val-core/<source>/acc/mean@k`` is the per-problem mean over all samples of every problem.
        """
        equal = equal_samples_per_problem(data_sources, sample_uids, reward_extra_infos_dict)
        metric_dict = super()._val_metrics_update(*equal, sample_turns)
        # A static step: validation metrics need no run state (the trainer may be half-built in a test).
        return RecipeRun.validation_metrics(metric_dict, data_sources, sample_uids, reward_extra_infos_dict)

    def log_step(self, batch: Optional[DataProto], metrics: dict, timing: dict) -> None:
        self.max_steps_duration = max(self.max_steps_duration, timing.get("step", 0.0))
        metrics.update({"training/global_step": self.global_steps, "training/epoch": self.prompt_stream.epoch})
        if batch is not None:
            metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing))
            n_gpus = self.resource_pool_manager.get_n_gpus()
            metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=n_gpus))
            metrics.update(compute_variance_proxy_metrics(batch=batch, gradient_norm=metrics.get("actor/grad_norm")))
            if hasattr(self.train_dataset, "on_batch_end"):
                self.train_dataset.on_batch_end(batch=batch)
            self.recipe.count_trained_tokens(metrics, batch.batch["response_mask"].sum())  # after the overlong filter
        self.tracker.log(data=metrics, step=self.global_steps)
        self.recipe.observe_step(metrics, self.global_steps)  # a policy producing nothing scoreable stops the run
        self.recipe.step_logged(self, last_step=self.global_steps >= self.total_training_steps)

    # ------------------------------------------------------------------ checkpoint and resume

    def _save_checkpoint(self):
        """verl's checkpoint plus the sampler, the prompt stream and the dataloader position (``RecipeRun``: written
        first, so a run killed at any moment resumes from a complete checkpoint; a failed save raises one line)."""
        self.recipe.save_checkpoint(self.global_steps, self._recipe_state(), super()._save_checkpoint)

    def _recipe_state(self, compact: bool = True) -> dict:
        """Where the prompts stand: the sampler (pooled groups, counters), the prompt stream, the dataloader
        (``compact=False``: a state kept in memory, the pooled payloads not copied)."""
        return {
            "sampler": self.sampler.state_dict(compact),
            "prompt_stream": self.prompt_stream.state_dict(),
            "dataloader": self.train_dataloader.state_dict(),
        }

    def _load_recipe_state(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        for payload, born_step in self.sampler.pooled_payloads():
            if POLICY_VERSION not in payload.non_tensor_batch:
                # Pooled by a recipe without policy versions: as if every step before it had updated the policy.
                version = max(0, min(born_step - 1, self.sampler.policy_version))
                payload.non_tensor_batch[POLICY_VERSION] = stamp(len(payload), version)
        self.prompt_stream.load_state_dict(state["prompt_stream"])
        # The base skips the dataloader restore at "epoch boundaries" counted in its own batches, which do
        # not line up with DAPO's steps; the position saved with the sampler is authoritative.
        self.train_dataloader.load_state_dict(state["dataloader"])

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        state = self.recipe.load_checkpoint(self.global_steps)
        if state is None:
            return result
        self._load_recipe_state(state)
        stream = state["prompt_stream"]
        self.recipe.announce_resume(self.global_steps, self.sampler.pooled_groups,
                                    f"epoch {stream['epoch']}, {stream['prompts_taken']} prompts taken")
        return result


def _images_seqlens(batch: DataProto) -> list:
    seqlens = []
    for inputs in batch.non_tensor_batch.get("multi_modal_inputs", []):
        if "image_grid_thw" in inputs:
            seqlens.extend(inputs["images_seqlens"].tolist())
    return seqlens
