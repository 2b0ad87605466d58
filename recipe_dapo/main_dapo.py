"""Entry point: ``python -m recipe_dapo.main_dapo [hydra overrides]``.

Hydra composes ``config/dapo_trainer.yaml`` (verl's ``ppo_trainer`` + DAPO defaults); the recipe checks the
configuration before any worker starts; verl's ``run_ppo`` starts Ray and runs :class:`DAPOTaskRunner`,
which builds verl's workers and datasets exactly as verl's own task runner does and trains with
:class:`recipe_dapo.trainer.RayDAPOTrainer`.
"""

from __future__ import annotations

if __name__ == "__main__":
    # First, before verl is imported: importing it already prints known noise (console_noise lists it).
    from recipe_dapo.console_noise import install_console_filter

    install_console_filter()

import logging  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402

import hydra  # noqa: E402
import ray  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from verl.trainer.main_ppo_v0 import BaseTaskRunner  # noqa: E402
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402

from recipe_dapo.cpu.memory import apply_cpu_kv_cache  # noqa: E402
from recipe_dapo.cpu.platform import use_configured_device  # noqa: E402
from recipe_dapo.preflight import check_config, check_plugins_registered  # noqa: E402

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=1)
class DAPOTaskRunner(BaseTaskRunner):
    """verl's task runner with the DAPO trainer; runs as a Ray actor, so it is also our worker-side check."""

    def run(self, config: DictConfig) -> None:
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        from recipe_dapo.trainer import RayDAPOTrainer

        logger.info("DAPO task runner on %s (pid %d)", socket.gethostname(), os.getpid())
        if config.dapo.preflight.check_worker_plugins:
            # verl swallows plugin import errors at DEBUG level; a Ray worker without our plugins would
            # silently train with the wrong loss or fail much later with "unknown reward manager".
            check_plugins_registered(where="a Ray worker (the task runner)")
        OmegaConf.resolve(config)

        actor_rollout_cls, worker_group_cls = self.add_actor_rollout_worker(config)
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
        trainer.init_workers()
        trainer.fit()


def run(config: DictConfig) -> None:
    """Check the configuration, then train (verl's run_ppo starts Ray and the task runner)."""
    from verl.trainer.main_ppo import run_ppo

    use_configured_device(config)
    apply_cpu_kv_cache(config)
    check_plugins_registered(where="the driver")
    check_config(config)
    run_ppo(config, task_runner_class=DAPOTaskRunner)


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
