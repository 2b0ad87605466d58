"""The Ray task runner of ``trainer.use_v1=true``: verl's v1 set-up (TransferQueue, the agent-loop manager that writes
into it) with the recipe's trainer, chosen from verl's trainer registry by ``trainer.v1.trainer_mode``."""

from __future__ import annotations

import logging
import os
import socket

import ray
from omegaconf import DictConfig, OmegaConf

from recipe_dapo.plugin import check_plugins_registered

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=1)
class DAPOTaskRunnerV1:
    """Builds the recipe's v1 trainer, verl's agent-loop manager and TransferQueue, then trains."""

    def run(self, config: DictConfig) -> None:
        from recipe_dapo.run.run_end import TrainerEnd

        # An error leaving the runner tells the driver whether the trainer printed the end-of-run summary; if not (it
        # failed before), the driver prints one with the resume line (``run.run_end``).
        with TrainerEnd() as end:
            self.train(config, end)

    def train(self, config: DictConfig, end) -> None:
        """Build the trainer (``end.trainer``), the agent-loop manager and TransferQueue, then train."""
        import transfer_queue as tq

        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.import_utils import load_class_from_fqn

        from recipe_dapo.trainers.table import v1_entry
        import recipe_dapo.trainers.v1.trainer  # noqa: F401  (registers the recipe's trainers with verl)
        from recipe_dapo.trainers.v1.agent_loop import DAPOAgentLoopManagerTQ

        logger.info("DAPO v1 task runner on %s (pid %d)", socket.gethostname(), os.getpid())
        if config.dapo.preflight.check_worker_plugins:
            check_plugins_registered(where="a Ray worker (the v1 task runner)")
        trainer_cls = get_trainer_cls(v1_entry(config.trainer.v1.trainer_mode).registered_name)
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        tq.init(config.transfer_queue)
        trainer = None
        succeeded = False
        try:
            trainer = trainer_cls(config=config)
            end.trainer = trainer
            trainer.init()
            manager_fqn = config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")
            # The recipe's manager: verl's, whose failed groups also say why (a dead engine stops the run).
            manager_cls = (load_class_from_fqn(manager_fqn, "AgentLoopManager") if manager_fqn
                           else DAPOAgentLoopManagerTQ)
            agent_loop_manager = manager_cls.create(
                config=config,
                llm_client=trainer.get_llm_client(),
                teacher_client=trainer.get_teacher_client(),
                reward_loop_worker_handles=trainer.get_reward_handles(),
            )
            trainer.fit(agent_loop_manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()
