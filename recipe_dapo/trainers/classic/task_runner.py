"""verl's task runner with the DAPO trainer: a Ray actor that builds verl's workers and datasets exactly as verl's
own task runner does and trains with :class:`recipe_dapo.trainers.classic.trainer.RayDAPOTrainer`.

Kept apart from ``main_dapo`` so that the entry point checks the configuration before importing Ray and verl.
"""

from __future__ import annotations

import logging
import os
import socket

import ray
from omegaconf import DictConfig, OmegaConf

# Before any verl module: importing verl's trainer asks verl for its platform, and on a node where `import verl` did
# not load the recipe (no entry point, no VERL_USE_EXTERNAL_MODULES) `VERL_PLATFORM=cpu` would be an unknown platform
# and this actor would die importing (the driver's check of every node ran before: run/nodes.py).
from recipe_dapo.plugin import check_plugins_registered  # noqa: I001  (registers the CPU platform and the hooks)

from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
from verl.utils.config import validate_config


logger = logging.getLogger(__name__)


@ray.remote(num_cpus=1)
class DAPOTaskRunner(BaseTaskRunner):
    """verl's task runner with the DAPO trainer; runs as a Ray actor, so it is also our worker-side check."""

    def run(self, config: DictConfig) -> None:
        from recipe_dapo.run.run_end import TrainerEnd

        # An error leaving the runner tells the driver whether the trainer printed the end-of-run summary; if not (it
        # failed before), the driver prints one with the resume line (``run.run_end``).
        with TrainerEnd() as end:
            self.train(config, end)

    def train(self, config: DictConfig, end) -> None:
        """Build verl's workers, the datasets and the trainer (``end.trainer``), then train."""
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        from recipe_dapo.trainers.classic.trainer import RayDAPOTrainer

        logger.info("DAPO task runner on %s (pid %d)", socket.gethostname(), os.getpid())
        if config.dapo.preflight.check_worker_plugins:
            # verl swallows plugin import errors at DEBUG level; a Ray worker without our plugins would
            # silently train with the wrong loss or fail much later with "unknown reward manager".
            check_plugins_registered(where="a Ray worker (the task runner)")
        OmegaConf.resolve(config)

        actor_rollout_cls, worker_group_cls = self.add_actor_rollout_worker(config)
        if config.dapo.objective.reference_reset_every > 0:  # iterative RL: a reference the trainer can reset
            from recipe_dapo.trainers.classic.reference_worker import use_resettable_reference

            use_resettable_reference(self.role_worker_mapping)
        self.add_reward_model_resource_pool(config)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        resource_pool_manager = self.init_resource_pool_mgr(config)

        def dataset(files, is_train: bool):
            max_samples = config.data.get("train_max_samples" if is_train else "val_max_samples", -1)
            return create_rl_dataset(files, config.data, tokenizer, processor, is_train=is_train, max_samples=max_samples)

        train_dataset = dataset(config.data.train_files, is_train=True)
        val_dataset = dataset(config.data.val_files, is_train=False)
        trainer = RayDAPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=worker_group_cls,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )
        end.trainer = trainer
        trainer.init_workers()
        trainer.fit()
