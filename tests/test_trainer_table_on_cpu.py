"""The one table of trainers against what it names: real classes, verl's v1 trainer registry, the entry point."""

from __future__ import annotations

import pytest

from conftest import requires_verl_v1
from recipe_dapo.trainers.table import TRAINERS, V1_SAMPLER, V1_TRAINER_MODES, load, trainer_for, v1_entry


def test_every_entry_names_a_real_task_runner_and_trainer_class():
    for entry in TRAINERS:
        trainer = load(entry.trainer_class)
        assert trainer.__name__ == entry.class_name
        runner = load(entry.task_runner)
        assert hasattr(runner, "remote"), f"{entry.task_runner} is not a Ray actor class"


def test_v1_entries_are_registered_with_verl_under_their_names_and_classic_is_not():
    import verl.trainer.ppo.v1 as verl_v1

    load(v1_entry("sync").trainer_class)  # importing the module registers both v1 trainers
    for entry in TRAINERS:
        if entry.use_v1:
            assert verl_v1.get_trainer_cls(entry.registered_name) is load(entry.trainer_class)
        else:
            assert entry.registered_name is None
    assert set(V1_TRAINER_MODES) == {"sync", "colocate_async"}


def test_the_config_chooses_the_entry_and_unsupported_modes_have_none():
    from omegaconf import OmegaConf

    assert trainer_for(OmegaConf.create({"trainer": {"use_v1": False}})).key == "classic"
    assert trainer_for(OmegaConf.create({"trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}}})).key == "v1.sync"
    assert trainer_for(OmegaConf.create({"trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"}}})) is None


def test_the_recipe_config_sets_the_tables_v1_sampler():
    from conftest import compose_recipe_config

    config = compose_recipe_config(["size=cpu_tiny", "platform=cpu"])
    sampler = config.trainer.v1.sampler.custom_sampler
    assert (sampler.path, sampler.name) == V1_SAMPLER
    assert load(f"{V1_SAMPLER[0].removeprefix('pkg://')}:{V1_SAMPLER[1]}").__name__ == "DAPOReplayBuffer"


@requires_verl_v1
@pytest.mark.parametrize("mode,drains", [("sync", True), ("colocate_async", False)])
def test_the_replay_buffer_drains_as_the_table_says(mode, drains):
    from omegaconf import OmegaConf

    from recipe_dapo.trainers.v1.replay_buffer import DAPOReplayBuffer

    buffer = DAPOReplayBuffer(
        mode, OmegaConf.create({}), None, "drop",
        {"train_batch_size": 4, "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 0},
         "dynamic_sampling": {}, "ppo_mini_batch_size": 2},
        refill_fn=lambda count: None,
    )
    assert buffer.drain is drains is v1_entry(mode).drains
