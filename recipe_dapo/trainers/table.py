"""The one table of the recipe's trainers: which trainer a configuration runs, and everything that follows from it.

The entry point (which task runner to start), the start-up rules (which modes are supported), verl's trainer
registry (the names the v1 trainers register under), the v1 replay buffer (whether a step drains the prompts still
generating) and the start-up log line all read :data:`TRAINERS`. Pure: no verl, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf

V1_SAMPLER = ("pkg://recipe_dapo.trainers.v1.replay_buffer", "DAPOReplayBuffer")
"""``trainer.v1.sampler.custom_sampler`` (path, name): the recipe's dynamic sampling as verl v1's replay buffer."""


@dataclass(frozen=True)
class TrainerEntry:
    """One way the recipe trains."""

    key: str
    """``classic`` or ``v1.<trainer.v1.trainer_mode>``."""
    use_v1: bool
    """``trainer.use_v1`` that selects it."""
    mode: Optional[str]
    """``trainer.v1.trainer_mode`` that selects it (None for the classic trainer)."""
    task_runner: str
    """The Ray task runner the entry point starts (module:class)."""
    trainer_class: str
    """The trainer class (module:class)."""
    drains: bool
    """When a step's batch is full, it waits for the prompts still generating and pools their qualifying groups
    (False: they keep generating, paused with the replicas, and count toward later steps)."""
    how: str
    """What it does, for the start-up log line."""

    @property
    def registered_name(self) -> Optional[str]:
        """The name it is registered under in verl's v1 trainer registry (None for the classic trainer)."""
        return f"recipe_dapo.{self.mode}" if self.use_v1 else None

    @property
    def class_name(self) -> str:
        return self.trainer_class.rpartition(":")[2]

    def log_line(self) -> str:
        """One line for the start-up log: which trainer runs, and why."""
        module, _, name = self.trainer_class.partition(":")
        if self.use_v1:
            why = f"trainer.use_v1=true, trainer_mode={self.mode}"
        else:
            why = "trainer.use_v1=false, the recipe's default"
        return f"trainer: {module}.{name} ({why}): {self.how}"


_CLASSIC = "recipe_dapo.trainers.classic"
_V1 = "recipe_dapo.trainers.v1"

TRAINERS: tuple[TrainerEntry, ...] = (
    TrainerEntry(
        key="classic", use_v1=False, mode=None,
        task_runner=f"{_CLASSIC}.task_runner:DAPOTaskRunner", trainer_class=f"{_CLASSIC}.trainer:RayDAPOTrainer",
        drains=True,
        how="verl's classic RayPPOTrainer, generation rounds until the batch is full; verl 0.9.1 marks it "
        "deprecated (a FutureWarning, in the log file), the recipe keeps it while it is faster per step "
        "(bench/peer_side_by_side.py); trainer.use_v1=true switches to verl's v1 trainer",
    ),
    TrainerEntry(
        key="v1.sync", use_v1=True, mode="sync",
        task_runner=f"{_V1}.task_runner:DAPOTaskRunnerV1", trainer_class=f"{_V1}.trainer:DAPOTrainerV1",
        drains=True,
        how="verl's v1 trainer: TransferQueue, groups judged as they finish, refills sized to the deficit",
    ),
    TrainerEntry(
        key="v1.colocate_async", use_v1=True, mode="colocate_async",
        task_runner=f"{_V1}.task_runner:DAPOTaskRunnerV1", trainer_class=f"{_V1}.trainer:DAPOTrainerV1ColocateAsync",
        drains=False,
        how="verl's v1 trainer: TransferQueue, the batch taken when full, prompts in flight resume after the update",
    ),
)

V1_TRAINER_MODES: tuple[str, ...] = tuple(entry.mode for entry in TRAINERS if entry.use_v1)
"""The verl v1 modes the recipe's trainers and sampler support."""


# Options of verl's sections that a trainer or the recipe's sampler honours: (key prefix, the trainers that honour it,
# what to do instead). An option changed from verl's default for a trainer that does not honour it is refused at
# start-up (``preflight.trainers.rule_ignored_options``): a run must never accept a setting and then ignore it.
OPTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("trainer.v1.trainer_mode", ("v1.sync", "v1.colocate_async"),
     "it selects verl's v1 trainer mode; set trainer.use_v1=true to train on verl's v1 trainer"),
    ("trainer.v1.sync.", ("v1.sync",), "it configures trainer_mode=sync"),
    ("trainer.v1.colocate_async.", ("v1.colocate_async",), "it configures trainer_mode=colocate_async"),
    ("trainer.v1.separate_async.", (), "the recipe does not run trainer_mode=separate_async"),
    ("trainer.v1.sampler.max_off_policy_threshold", ("v1.colocate_async",),
     "in sync mode every trained group comes from the current policy or the recipe's pool "
     "(dapo.dynamic_sampling.max_staleness bounds its age)"),
    ("trainer.v1.sampler.max_off_policy_strategy", ("v1.colocate_async",),
     "in sync mode nothing is off-policy beyond dapo.dynamic_sampling.max_staleness"),
    ("trainer.v1.sampler.sync_refill_failed_groups", (),
     "the recipe's sampler always refills what failed groups leave missing (counted in dynamic_sampling/failed_groups)"),
    ("algorithm.filter_groups.max_inflight_gen_batches", (),
     "the recipe's sampler sizes what is in flight from the deficit (dapo.dynamic_sampling.round_sizing, "
     "safety_margin, max_round_prompts)"),
)


def v1_entry(mode: str) -> Optional[TrainerEntry]:
    """The v1 trainer of ``trainer.v1.trainer_mode=mode`` (None when the recipe has none)."""
    return next((entry for entry in TRAINERS if entry.use_v1 and entry.mode == mode), None)


def trainer_for(config: DictConfig) -> Optional[TrainerEntry]:
    """The trainer a configuration runs (None for a v1 mode the recipe does not support: the start-up rules say why)."""
    if not OmegaConf.select(config, "trainer.use_v1", default=False):
        return TRAINERS[0]
    return v1_entry(str(OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync")))


def load(fqn: str):
    """The class a ``module:Class`` string of the table names."""
    import importlib

    module, _, name = fqn.partition(":")
    return getattr(importlib.import_module(module), name)
