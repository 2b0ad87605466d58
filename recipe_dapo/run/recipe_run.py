"""What a DAPO run does the same whichever verl trainer drives it, written once: :class:`RecipeRun`.

Both trainers (``classic.trainer.RayDAPOTrainer`` on verl's ``RayPPOTrainer``, ``v1.trainer.DAPOTrainerV1*`` on verl's
v1 trainers) hold one ``RecipeRun`` and are thin adapters of verl's hooks and loop events onto it. It owns:

- the run's lifecycle (``lifecycle.RunLifecycle``, its base): when the run stops for pre-emption, what it saves then,
  giving up a step that is still generating, the failure outcome, and the outcome lines the tracker prints;

- the sampler's config, built from the run config by ``dynamic_sampling.config.sampler_config`` (the v1 trainer's
  replay buffer builds it from ``trainer.v1.sampler.sampler_kwargs`` with the same function);
- the update guard (``step_metrics.UpdateGuard``: skipped non-finite updates counted, too many stop the run) and the
  policy watch (``step_metrics.PolicyWatch``: no right response for some steps, or a non-finite entropy, stops it);
- the tracker (``tracking.tracker``);
- the rollout's liveness probe beside verl's calls into the replicas: syncs, aborts, sleeps (``rollout_liveness``);
- the recipe's state in checkpoints with the update guard's, the guarded save, and the resume line;
- the validation metrics papers report (mean@k, pass@k, maj@k), the stop ids and the overlong filter, and the count of
  response tokens that carried loss.

A new run-wide concern (a health guard, say) goes here, with its settings and a test, and both trainers have it.
No Ray, verl trainer or vLLM import at module level: the adapters bring those.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from omegaconf import DictConfig

from recipe_dapo.dynamic_sampling.config import DynamicSamplingConfig, sampler_config, sampler_settings
from recipe_dapo.loss.dapo import BEHAVIOUR_WEIGHTED
from recipe_dapo.policy_lag import configured_level, correction_not_reached
from recipe_dapo.policy_lag.metrics import lag_metrics
from recipe_dapo.tracking.metric_names import RESPONSE_TOKENS_METRIC
from recipe_dapo.run.checkpoint_state import guarded_save, load_recipe_state, resume_line, save_recipe_state
from recipe_dapo.run.lifecycle import RunLifecycle
from recipe_dapo.run.step_metrics import PolicyWatch, UpdateGuard

VALIDATION_PREFIXES = ("val/", "val-core/", "val-aux/")
"""Where verl and the recipe log validation metrics."""

class BehaviourCorrectionNotApplied(RuntimeError):
    """A behaviour-policy correction is configured but its weights did not reach the policy loss."""


class RecipeRun(RunLifecycle):
    """The run-wide state and decisions both trainers share (module docstring); its lifecycle, the events the trainers
    forward from verl's loop, is :class:`~recipe_dapo.run.lifecycle.RunLifecycle`'s. ``tokenizer`` gives the stop
    ids."""

    def __init__(self, config: DictConfig, tokenizer: Any = None):
        super().__init__(config)
        self.tokenizer = tokenizer
        self.update_guard = UpdateGuard(config.dapo.health.max_skipped_updates)
        self.policy_watch = PolicyWatch(config.dapo.health.max_steps_all_wrong)
        self._stop_ids: Optional[list[int]] = None
        correction = config.get("algorithm", {}).get("rollout_correction", None)
        self.correction_level = configured_level(correction)  # the IS level whose weights must reach the loss
        # verl's rollout_is_threshold (the YAML's 2.0 unless overridden); read only where a level is configured
        self.correction_threshold = correction.get("rollout_is_threshold") if correction else None

    # ------------------------------------------------------------------ the sampler

    @property
    def sampler_config(self) -> DynamicSamplingConfig:
        return sampler_config(sampler_settings(self.config))

    # ------------------------------------------------------------------ the update guard

    def observe_update(self, metrics: dict, step: int) -> None:
        """After an actor update: a skipped (non-finite) update is counted, or stops the run (``UpdateGuard``); a
        configured behaviour-policy correction whose weights did not reach the loss stops it (``policy_lag``)."""
        self.update_guard.observe(metrics, step)
        problem = correction_not_reached(self.correction_level, metrics, BEHAVIOUR_WEIGHTED)
        if problem:
            raise BehaviourCorrectionNotApplied(f"step {step}: {problem}")

    # ------------------------------------------------------------------ the behaviour policy (``policy_lag``)

    def policy_lag_metrics(self, lags, group_ids, response_mask, old_log_probs=None, rollout_log_probs=None) -> dict:
        """The step's ``policy_lag/*`` metrics, from the rows' lags and (when the rollout sent them) the log
        importance weights ``log pi_old - log pi_rollout`` the correction weighs by."""
        log_weight = None
        if old_log_probs is not None and rollout_log_probs is not None:
            log_weight = old_log_probs.float() - rollout_log_probs.float()
        return lag_metrics(lags, group_ids, response_mask, log_weight, self.correction_level,
                           self.correction_threshold)

    def hold_folder_as_writers(self, workers: list) -> None:
        """This process and each of ``workers`` (Ray actor handles: verl's actor workers, which write the model and
        optimizer shards) hold the writers' lock of ``trainer.default_local_dir`` for their lifetime, so a new run's
        driver waits for them to end (``run_lock.wait_for_writers``)."""
        import ray

        from recipe_dapo.compat.ray import run_in_actor
        from recipe_dapo.run.run_lock import hold_as_writer

        folder = self.config.trainer.get("default_local_dir")
        if not folder:
            return
        folder = os.path.abspath(str(folder))
        hold_as_writer(folder)
        ray.get([run_in_actor(worker, lambda actor, path=folder: hold_as_writer(path)) for worker in workers])

    def observe_step(self, metrics: dict, step: int) -> None:
        """After a step's metrics are complete: a policy that produces nothing scoreable stops the run
        (``PolicyWatch``)."""
        self.policy_watch.observe(metrics, step)

    # ------------------------------------------------------------------ the tracker

    def open_tracker(self, resumed_step: int, total_steps: Optional[int]):
        """The run's tracker (``tracking.tracker``), opened after the checkpoint is loaded."""
        from recipe_dapo.tracking.tracker import open_tracking

        self.tracker = open_tracking(self.config, resumed_step=resumed_step, total_steps=total_steps)
        return self.tracker

    def logged_validation(self, step: int) -> dict:
        """The validation metrics the run's metrics file already holds for ``step`` when the run resumed there from a
        checkpoint (a continuation of a run that validated at that step), else {}; the console says it is not run again.
        Step 0 always validates (a fresh start: an older run's lines there describe another model)."""
        from recipe_dapo.tracking.console import announce
        from recipe_dapo.tracking.run_log import read_metrics

        path = getattr(getattr(self.tracker, "logger", {}).get("file"), "filepath", None) if self.tracker else None
        if step <= 0 or path is None or not os.path.exists(path):
            return {}
        logged = {key: value for key, value in read_metrics(path).get(step, {}).items()
                  if key.startswith(VALIDATION_PREFIXES)}
        if logged:
            announce(f"validation at step {step}: in the metrics file already (the run this one continues validated "
                     "there); not run again")
        return logged

    @property
    def summary_printed(self) -> bool:
        """The run's tracker printed the end-of-run summary (the task runner tells the driver: ``run_end``)."""
        return bool(getattr(self.tracker, "summary_printed", False))

    # ------------------------------------------------------------------ the rollout's liveness

    def watch_rollout(self, checkpoint_manager: Any, agent_loop_manager: Any, llm_server_manager: Any):
        """Run the rollout's liveness probe beside every call of verl's into the replicas
        (``dapo.health.rollout_probe_s``; the weight sync, the abort and sleep at a colocated step's end): such a call
        into a dead engine never returns. Returns the probe (the v1 trainer's stream runs it too)."""
        from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

        liveness = RolloutLiveness.of(agent_loop_manager, llm_server_manager,
                                      max_unanswered=self.config.dapo.health.max_unanswered_health_checks)
        watch_replica_calls(checkpoint_manager, liveness, self.rollout_probe_s)
        return liveness

    @property
    def rollout_probe_s(self) -> float:
        return float(self.config.dapo.health.rollout_probe_s)

    # ------------------------------------------------------------------ checkpoints (``checkpoint_state``)

    def save_checkpoint(self, step: int, state: dict, verl_save: Callable[[], None]) -> None:
        """The recipe's ``state`` (with the update guard's) first, then verl's checkpoint; a failed save (a full disk)
        removes the half-written folder and raises ``CheckpointWriteError`` with one line saying why."""
        state = {**state, "update_guard": self.update_guard.state_dict(), "policy_watch": self.policy_watch.state_dict()}

        def save():
            save_recipe_state(self.config, step, state)
            verl_save()

        guarded_save(self.config.trainer.default_local_dir, step, save,
                     model_path=self.config.actor_rollout_ref.model.path)

    def load_checkpoint(self, step: int) -> Optional[dict]:
        """The recipe's state saved with step ``step`` (None: no checkpoint), with the update guard restored."""
        state = load_recipe_state(self.config, step)
        if state is not None:
            self.update_guard.load_state_dict(state.get("update_guard", {}))
            self.policy_watch.load_state_dict(state.get("policy_watch", {}))
        return state

    @staticmethod
    def announce_resume(step: int, pooled_groups: int, where: str) -> None:
        """The resume line on the run's console."""
        from recipe_dapo.tracking.console import announce

        announce(resume_line(step, pooled_groups, where))

    # ------------------------------------------------------------------ metrics

    @staticmethod
    def validation_metrics(verl_metrics: dict, data_sources, sample_uids, reward_extra_infos_dict) -> dict:
        """verl's validation metrics plus what papers report per source: mean@k, pass@k, maj@k."""
        from recipe_dapo.run.validation_metrics import add_problem_metrics

        return add_problem_metrics(verl_metrics, data_sources, sample_uids, reward_extra_infos_dict)

    @staticmethod
    def count_trained_tokens(metrics: dict, tokens: int) -> None:
        """The step's response tokens that carried loss (after the overlong filter): ``training/response_tokens``."""
        metrics[RESPONSE_TOKENS_METRIC] = int(tokens)

    # ------------------------------------------------------------------ overlong filtering (``recipe_dapo.overlong``)

    @property
    def stop_ids(self) -> list[int]:
        """The token ids that end a response (the tokenizer's and the model's generation config's)."""
        if self._stop_ids is None:
            from recipe_dapo.reward.manager import stop_token_ids

            self._stop_ids = stop_token_ids(self.tokenizer, self.config.actor_rollout_ref.model.path)
        return self._stop_ids

    @property
    def overlong_filter_on(self) -> bool:
        return bool(self.config.dapo.overlong_filter.enable)

    def filter_overlong(self, batch, metrics: dict) -> bool:
        """Overlong filtering of a padded ``DataProto``: truncated responses' masks zeroed in place (when
        ``dapo.overlong_filter.enable``), the filter's metrics added. True when it ran."""
        if not self.overlong_filter_on:
            return False
        from recipe_dapo.overlong import apply_overlong_filter

        max_len = int(self.config.actor_rollout_ref.rollout.response_length)
        metrics.update(apply_overlong_filter(batch, self.stop_ids, max_response_length=max_len))
        return True
