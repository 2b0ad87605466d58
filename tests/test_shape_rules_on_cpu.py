"""recipe_dapo.preflight.shapes accepts exactly the cluster / batch shapes verl 0.9.1's own code runs.

The oracle runs verl's real batch functions on stand-in TensorDicts of the right sizes (a few tokens per row), per
rank, in the order the classic trainer and ``engine_workers.ActorRolloutRefWorker`` call them:

- ``verl.utils.seqlen_balancing``: ``calculate_workload`` / ``get_seqlen_balanced_partitions`` (``_balance_batch``),
- ``verl.workers.utils.padding.left_right_2_no_padding`` (the trainer's conversion before each worker call),
- ``verl.single_controller.base.decorator._split_args_kwargs_data_proto`` (the nd-compute dispatch per DP rank),
- ``verl.utils.tensordict_utils.make_iterator`` / ``assign_non_tensor`` (``TrainingWorker.train_mini_batch``),
- ``verl.workers.engine.utils.prepare_micro_batches`` (every FSDP engine forward, fixed or dynamic micro-batches),
- ``verl.protocol.DataProto.chunk`` (the agent loop's split of a generation round).

A few checks live inline in worker code that cannot be imported here in the time budget (``engine_workers`` and
``ray_trainer`` take 15-25 s to import); those the oracle restates, each with its source, and
``test_the_restated_verl_checks_are_still_in_verl`` fails when verl's text changes.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from recipe_dapo.preflight.shapes import shape_problems

from verl.protocol import DataProto
from verl.single_controller.base.decorator import _split_args_kwargs_data_proto
from verl.utils import tensordict_utils as tu
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.padding import left_right_2_no_padding

VERL = Path(__import__("verl").__file__).parent
DRAWS = 200


# ----------------------------------------------------------------------------- random shapes as configs


def draw(rng: random.Random) -> dict:
    """One random shape (values kept tiny so the oracle's tensors are a few hundred tokens)."""
    train = rng.randint(1, 12)
    mini = rng.choice([d for d in range(1, train + 1) if train % d == 0] + [rng.randint(1, train + 1)])
    dynamic = rng.random() < 0.3
    prompt, response = rng.randint(1, 4), rng.randint(1, 4)
    use_ref = rng.random() < 0.3
    return {
        "trainer": {"nnodes": rng.choice([1, 1, 2]), "n_gpus_per_node": rng.choice([1, 2, 2, 3, 4]),
                    "balance_batch": rng.random() < 0.7, "use_v1": rng.random() < 0.15},
        "data": {"train_batch_size": train, "gen_batch_size": train, "max_prompt_length": prompt,
                 "max_response_length": response},
        "algorithm": {"use_kl_in_reward": False, "filter_groups": {"enable": rng.random() < 0.8}},
        "dapo": {"dynamic_sampling": {"on_exhausted": rng.choice(["train_partial", "train_partial", "raise"]),
                                      "round_sizing": "deficit", "prompt_granularity": rng.choice([1, 1, 2])}},
        "actor_rollout_ref": {
            "model": {"path": "/nonexistent"},
            "actor": {
                "strategy": "fsdp2", "ppo_mini_batch_size": mini, "use_dynamic_bsz": dynamic, "use_kl_loss": use_ref,
                "ppo_micro_batch_size_per_gpu": rng.choice([1, 1, 2, 3, 4, 8, 16]),
                "ppo_max_token_len_per_gpu": rng.randint(2, 8),
                "ulysses_sequence_parallel_size": rng.choice([1, 1, 1, 2, 4]),
                "fsdp_config": {"fsdp_size": rng.choice([-1, -1, -1, 2, 3]), "ulysses_sequence_parallel_size": 1},
            },
            "ref": {
                "log_prob_micro_batch_size_per_gpu": rng.choice([1, 2, 4, 8, 16]),
                "log_prob_use_dynamic_bsz": dynamic if rng.random() < 0.9 else not dynamic,
                "log_prob_max_token_len_per_gpu": rng.randint(2, 8),
                "ulysses_sequence_parallel_size": rng.choice([1, 1, 2]),
                "fsdp_config": {"ulysses_sequence_parallel_size": 1},
            },
            "rollout": {
                "n": rng.choice([1, 2, 3, 4, 8]), "tensor_model_parallel_size": rng.choice([1, 1, 1, 2, 4]),
                "data_parallel_size": 1, "pipeline_model_parallel_size": 1,
                "log_prob_micro_batch_size_per_gpu": rng.choice([1, 1, 2, 3, 4, 8, 16]),
                "log_prob_use_dynamic_bsz": dynamic if rng.random() < 0.95 else not dynamic,
                "log_prob_max_token_len_per_gpu": rng.randint(2, 8),
                "agent": {"num_workers": rng.choice([1, 1, 1, 2, 4])},
            },
        },
    }


def draw_near_valid(rng: random.Random) -> dict:
    """A shape built to run, then (half the time) one value redrawn: the draws cluster around the boundary."""
    raw = draw(rng)
    trainer, data, arr = raw["trainer"], raw["data"], raw["actor_rollout_ref"]
    actor, rollout, ref = arr["actor"], arr["rollout"], arr["ref"]
    per_node, nnodes = rng.choice([1, 2, 4]), rng.choice([1, 1, 2])
    world = per_node * nnodes
    sp = rng.choice([d for d in (1, 2, 4) if world % d == 0])
    dp, n = world // sp, rng.choice([1, 2, 4, 8])
    mini = dp // math.gcd(dp, n) * rng.choice([1, 1, 2])
    train = mini * rng.choice([1, 2, 3])
    while (train * n) % world:
        train += mini
    per_rank_mini = mini * n // dp
    micro = rng.choice([d for d in range(1, per_rank_mini + 1) if per_rank_mini % d == 0])
    trainer.update(nnodes=nnodes, n_gpus_per_node=per_node)
    data.update(train_batch_size=train, gen_batch_size=train)
    actor.update(ppo_mini_batch_size=mini, ulysses_sequence_parallel_size=sp, ppo_micro_batch_size_per_gpu=micro,
                 ppo_max_token_len_per_gpu=data["max_prompt_length"] + data["max_response_length"])
    actor["fsdp_config"]["fsdp_size"] = -1
    rollout.update(tensor_model_parallel_size=rng.choice([d for d in (1, 2) if per_node % d == 0]),
                   log_prob_micro_batch_size_per_gpu=micro, log_prob_use_dynamic_bsz=actor["use_dynamic_bsz"],
                   log_prob_max_token_len_per_gpu=actor["ppo_max_token_len_per_gpu"])
    rollout["agent"]["num_workers"] = 1
    ref.update(ulysses_sequence_parallel_size=sp, log_prob_micro_batch_size_per_gpu=micro,
               log_prob_use_dynamic_bsz=actor["use_dynamic_bsz"], log_prob_max_token_len_per_gpu=actor["ppo_max_token_len_per_gpu"])
    if rng.random() < 0.5:  # redraw one value from the wild draw
        wild = draw(rng)
        section, key = rng.choice([
            (("trainer",), "n_gpus_per_node"), (("trainer",), "nnodes"), (("data",), "train_batch_size"),
            (("actor_rollout_ref", "actor"), "ppo_mini_batch_size"), (("actor_rollout_ref", "rollout"), "n"),
            (("actor_rollout_ref", "actor"), "ppo_micro_batch_size_per_gpu"),
            (("actor_rollout_ref", "actor"), "ulysses_sequence_parallel_size"),
            (("actor_rollout_ref", "rollout"), "log_prob_micro_batch_size_per_gpu"),
            (("actor_rollout_ref", "rollout"), "log_prob_max_token_len_per_gpu"),
            (("actor_rollout_ref", "ref"), "log_prob_micro_batch_size_per_gpu"),
            (("actor_rollout_ref", "rollout"), "tensor_model_parallel_size"),
        ])
        target, source = raw, wild
        for name in section:
            target, source = target[name], source[name]
        target[key] = source[key]
    return raw


# ----------------------------------------------------------------------------- the oracle: verl's own code


class Crash(Exception):
    """verl would fail on this shape."""


def stand_in_batch(rows: int, prompt: int, response: int, rng: random.Random) -> TensorDict:
    """A left/right-padded rollout batch as the trainer holds it; row 0 uses every prompt and response token."""
    width = prompt + response
    attention = torch.zeros(rows, width, dtype=torch.long)
    for row in range(rows):
        p = prompt if row == 0 else rng.randint(1, prompt)
        r = response if row == 0 else rng.randint(1, response)
        attention[row, prompt - p : prompt + r] = 1
    response_mask = attention[:, prompt:].clone()
    position_ids = torch.clamp(torch.cumsum(attention, dim=-1) - 1, min=0)
    return TensorDict(
        {"input_ids": torch.ones(rows, width, dtype=torch.long), "attention_mask": attention,
         "response_mask": response_mask, "position_ids": position_ids},
        batch_size=[rows],
    )


def micro_batches(rank_td: TensorDict, *, dynamic: bool, micro, tokens, sp: int) -> None:
    """What TrainingWorker.train_batch / infer_batch and FSDPEngine.forward_backward_batch do before the model."""
    tu.assign_non_tensor(rank_td, use_dynamic_bsz=dynamic, max_token_len_per_gpu=tokens,
                         micro_batch_size_per_gpu=micro, sp_size=sp)
    prepare_micro_batches(data=rank_td, dp_group=None, same_micro_num_in_dp=True)


def per_rank(td: TensorDict, dp: int) -> list[TensorDict]:
    """The nd-compute dispatch: one chunk per DP rank (ranks of one DP group get the same chunk)."""
    (chunks,), _ = _split_args_kwargs_data_proto(dp, td)
    return [chunk.unlock_() for chunk in chunks]  # a worker receives its chunk deserialized, i.e. unlocked


def verl_runs(raw, rng: random.Random) -> bool:
    try:
        _verl_run(OmegaConf.create(raw) if isinstance(raw, dict) else raw, rng)
    except (AssertionError, ValueError, Crash):  # what verl raises; anything else is a stand-in bug
        return False
    return True


def _verl_run(c, rng: random.Random) -> None:
    arr, actor, rollout, ref = c.actor_rollout_ref, c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout, c.actor_rollout_ref.ref
    world = c.trainer.nnodes * c.trainer.n_gpus_per_node
    n, train, mini = rollout.n, c.data.train_batch_size, actor.ppo_mini_batch_size
    # FSDPActorConfig.__post_init__: the section's SP wins when > 1; FSDPEngine: DP = world // SP, and
    # init_device_mesh(mesh_shape=(dp, sp)) / create_device_mesh((world // fsdp_size, fsdp_size)) need whole meshes.
    sp = actor.ulysses_sequence_parallel_size if actor.ulysses_sequence_parallel_size > 1 else actor.fsdp_config.ulysses_sequence_parallel_size
    ref_sp = ref.ulysses_sequence_parallel_size if ref.ulysses_sequence_parallel_size > 1 else ref.fsdp_config.ulysses_sequence_parallel_size
    use_ref = bool(actor.use_kl_loss)  # verl.trainer.ppo.utils.need_reference_policy
    for size in [sp] + ([ref_sp] if use_ref else []):
        if world % size:
            raise Crash("device mesh")
    fsdp_size = actor.fsdp_config.fsdp_size
    if 0 < fsdp_size < world and world % fsdp_size:
        raise Crash("fsdp mesh")
    dp, ref_dp = world // sp, world // ref_sp
    # ActorRolloutRefWorker.init_model asserts; RolloutReplica.__init__ asserts; launch_servers puts a replica's
    # server on the node of its first worker (a replica must not straddle nodes).
    assert actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz
    infer_world = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    assert world % infer_world == 0
    per_node = c.trainer.n_gpus_per_node
    assert infer_world % min(per_node, infer_world) == 0
    if infer_world < per_node and per_node % infer_world:
        raise Crash("replica straddles nodes")
    # verl's validate_config (fixed micro-batches, FSDP): train x n % n_gpus; ActorConfig.validate: train >= mini.
    if not actor.use_dynamic_bsz:
        assert (train * n) % world == 0
        if train < mini:
            raise ValueError("train_batch_size < ppo_mini_batch_size")
    # The agent loop chunks each generation round (a multiple of the prompt granularity, or the whole batch).
    ds = c.dapo.dynamic_sampling
    round_prompts = ds.prompt_granularity if c.algorithm.filter_groups.enable else train
    DataProto.from_single_dict({"x": torch.zeros(round_prompts * n, 1)}).chunk(rollout.agent.num_workers)

    # Every step's rows: the full step, and budget-limited partial steps of k whole mini-batches (the sampler's
    # groups_multiple_of). verl's v1 trainer pads to lcm(dp, mini x n) (trainer_base._get_required_batch_multiple).
    steps = [train * n]
    if c.algorithm.filter_groups.enable and ds.on_exhausted == "train_partial":
        steps += [k * mini * n for k in range(1, train) if k * mini < train]
    if c.trainer.use_v1:
        multiple = math.lcm(dp, mini * n)
        steps = [-(-rows // multiple) * multiple for rows in steps]
    prompt, response = c.data.max_prompt_length, c.data.max_response_length
    for rows in sorted(set(steps)):  # steps of equal rows meet the same checks
        td = stand_in_batch(rows, prompt, response, rng)
        if c.trainer.balance_batch or c.trainer.use_v1:  # RayPPOTrainer._balance_batch / v1 trainer_base
            seqlens = td["attention_mask"].sum(-1)
            partitions = get_seqlen_balanced_partitions(calculate_workload(seqlens), k_partitions=dp, equal_size=True)
            td = td[torch.tensor([i for part in partitions for i in part])]
        td = left_right_2_no_padding(td)
        # compute_log_prob (mesh "actor") -> TrainingWorker.infer_batch
        for rank_td in per_rank(td.clone(), dp):
            micro_batches(rank_td, dynamic=rollout.log_prob_use_dynamic_bsz, micro=rollout.log_prob_micro_batch_size_per_gpu,
                          tokens=rollout.log_prob_max_token_len_per_gpu, sp=sp)
        if use_ref:  # compute_ref_log_prob (mesh "ref"); init_model copies ref.log_prob_* into the ref engine
            for rank_td in per_rank(td.clone(), ref_dp):
                micro_batches(rank_td, dynamic=ref.log_prob_use_dynamic_bsz, micro=ref.log_prob_micro_batch_size_per_gpu,
                              tokens=ref.log_prob_max_token_len_per_gpu, sp=ref_sp)
        # update_actor (mesh "actor") -> TrainingWorker.train_mini_batch
        mini_rows = mini * n  # RayPPOTrainer._update_actor: mini_batch_size = ppo_mini_batch_size x rollout.n
        for rank, rank_td in enumerate(per_rank(td.clone(), dp)):
            assert mini_rows % dp == 0  # train_mini_batch
            for mini_td in tu.make_iterator(rank_td, mini_batch_size=mini_rows // dp, epochs=1, seed=42 + rank,
                                            dataloader_kwargs={"shuffle": False}):
                micro_batches(mini_td, dynamic=actor.use_dynamic_bsz, micro=actor.ppo_micro_batch_size_per_gpu,
                              tokens=actor.ppo_max_token_len_per_gpu, sp=sp)


# ----------------------------------------------------------------------------- the property


def test_shape_problems_accepts_exactly_what_verl_runs():
    rng = random.Random(20250527)
    outcomes = {True: 0, False: 0}
    for index in range(DRAWS):
        raw = OmegaConf.create(draw(rng) if index % 2 else draw_near_valid(rng))
        problems = shape_problems(raw)
        runs = verl_runs(raw, random.Random(index))
        assert (not problems) == runs, (
            f"draw {index}: verl {'runs' if runs else 'crashes'} but shape_problems says {problems or 'nothing'}\n"
            f"{OmegaConf.to_yaml(raw)}"
        )
        outcomes[runs] += 1
    assert min(outcomes.values()) >= DRAWS // 5, outcomes  # the draws exercise both sides


def test_every_refused_shape_names_a_fix_that_verl_then_runs():
    rng = random.Random(7)
    checked = 0
    for index in range(DRAWS):
        raw = draw(rng)
        problems = shape_problems(OmegaConf.create(raw))
        if len(problems) != 1 or " or " in problems[0] or "; set " not in problems[0]:
            continue
        key, value = problems[0].rsplit("; set ", 1)[1].split("=")
        fixed = OmegaConf.create(raw)
        OmegaConf.update(fixed, key, int(value))
        assert shape_problems(fixed) == [], (problems, shape_problems(fixed))
        assert verl_runs(OmegaConf.to_container(fixed), random.Random(index)), problems
        checked += 1
        if checked == 12:
            break
    assert checked == 12


# ----------------------------------------------------------------------------- the sizes and two refused shapes


SIZES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "recipe_dapo" / "config" / "size").glob("*.yaml"))


@pytest.fixture(scope="module")
def sizes():
    from conftest import compose_recipe_config

    return {size: compose_recipe_config([f"size={size}"] + (["platform=cpu"] if size == "cpu_tiny" else []))
            for size in SIZES}


def test_every_size_passes_at_its_declared_cluster_shape(sizes):
    assert set(sizes) >= {"cpu_tiny", "paper_32b"}
    for size, config in sizes.items():
        assert shape_problems(config) == [], size


def test_a_train_batch_that_is_not_whole_mini_batches_is_refused_with_its_fix(sizes):
    config = sizes["cpu_tiny"].copy()
    OmegaConf.update(config, "data.train_batch_size", 6)
    OmegaConf.update(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 4)
    OmegaConf.update(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 8)
    OmegaConf.update(config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 8)
    (problem,) = shape_problems(config)
    assert "data.train_batch_size=6 is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=4" in problem
    assert problem.endswith("set actor_rollout_ref.actor.ppo_mini_batch_size=3 or data.train_batch_size=8"), problem
    # ... and verl agrees: the full step (48 rows) is not whole mini-batches of 32 rows.
    with pytest.raises(AssertionError, match="48 % 32"):
        tu.make_iterator(stand_in_batch(48, 2, 2, random.Random(0)), mini_batch_size=32, epochs=1)


def test_fixed_micro_batches_larger_than_the_per_rank_mini_batch_are_refused_with_their_fix(sizes):
    config = sizes["cpu_tiny"].copy()
    OmegaConf.update(config, "trainer.n_gpus_per_node", 2)
    # cpu_tiny's own micro-batches follow the rank count (below); fixed at its single-rank 16 they no longer fit.
    for key in ("actor.ppo_micro_batch_size_per_gpu", "rollout.log_prob_micro_batch_size_per_gpu",
                "ref.log_prob_micro_batch_size_per_gpu"):
        OmegaConf.update(config, f"actor_rollout_ref.{key}", 16)
    problems = shape_problems(config)
    assert len(problems) == 2, problems
    update, log_prob = problems
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 does not divide the per-rank mini-batch of 8 rows" in update
    assert "set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8" in update
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 does not divide the 8 rows per rank" in log_prob
    assert "a partial step of 1 mini-batch" in log_prob
    assert log_prob.endswith("set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8")
    # verl: 8 rows per rank in micro-batches of 16.
    rank_td = left_right_2_no_padding(stand_in_batch(8, 2, 2, random.Random(0)))
    with pytest.raises(AssertionError, match="divisible by force_group_size"):
        micro_batches(rank_td, dynamic=False, micro=16, tokens=None, sp=1)


@pytest.mark.parametrize("nnodes, per_node", [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2)])
def test_the_tiny_size_fits_one_to_four_ranks_on_one_or_two_nodes(nnodes, per_node):
    """size=cpu_tiny's micro-batches are the per-rank mini-batch: `trainer.n_gpus_per_node=2` works as typed."""
    from conftest import compose_recipe_config

    config = compose_recipe_config(
        ["platform=cpu", "size=cpu_tiny", f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}"]
    )
    assert shape_problems(config) == []
    actor = OmegaConf.to_container(config.actor_rollout_ref, resolve=True)
    rows_per_rank = actor["actor"]["ppo_mini_batch_size"] * actor["rollout"]["n"] // (nnodes * per_node)
    assert actor["actor"]["ppo_micro_batch_size_per_gpu"] == rows_per_rank
    assert actor["rollout"]["log_prob_micro_batch_size_per_gpu"] == rows_per_rank
    assert actor["ref"]["log_prob_micro_batch_size_per_gpu"] == rows_per_rank
    # ... and verl's own micro-batching runs a rank's rows of a partial step of one mini-batch (the smallest step).
    micro_batches(left_right_2_no_padding(stand_in_batch(rows_per_rank, 2, 2, random.Random(0))),
                  dynamic=False, micro=rows_per_rank, tokens=None, sp=1)


def test_the_tiny_size_at_a_rank_count_that_does_not_divide_its_mini_batch_names_the_key():
    from conftest import compose_recipe_config

    from recipe_dapo.preflight import DAPOConfigError, check_rules

    config = compose_recipe_config(["platform=cpu", "size=cpu_tiny", "trainer.n_gpus_per_node=3"])
    with pytest.raises(DAPOConfigError) as error:
        check_rules(config)
    assert "16 is not a whole multiple of 3" in str(error.value)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in str(error.value)


def test_dynamic_batch_size_keeps_only_the_dp_rules_and_the_token_budget(sizes):
    config = sizes["cpu_tiny"].copy()
    OmegaConf.update(config, "trainer.n_gpus_per_node", 2)
    OmegaConf.update(config, "actor_rollout_ref.actor.use_dynamic_bsz", True)
    assert shape_problems(config) == []  # micro-batches by tokens: no micro-batch divisibility left
    OmegaConf.update(config, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 100)
    update, log_prob = shape_problems(config)  # the rollout's log-prob budget follows the actor's (verl's default)
    assert "longest sequence" in update and update.endswith("set actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160")
    assert log_prob.endswith("set actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=160"), log_prob


def test_sequence_parallel_and_heads_from_a_local_model_folder(tmp_path, sizes):
    (tmp_path / "config.json").write_text('{"num_attention_heads": 12, "num_key_value_heads": 2}')
    config = sizes["qwen2.5_7b_math"].copy()
    OmegaConf.update(config, "actor_rollout_ref.model.path", str(tmp_path))
    OmegaConf.update(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 8)
    problems = shape_problems(config)
    assert any("12 attention heads" in p and "ulysses_sequence_parallel_size=4" in p for p in problems), problems


def test_the_restated_verl_checks_are_still_in_verl():
    """The oracle restates these lines of verl 0.9.1 (too slow to import here); fail when verl changes them."""
    expected = {
        "workers/engine_workers.py": [
            "assert mini_batch_size % self.engine.get_data_parallel_size() == 0",
            "mini_batch_size_per_gpu = mini_batch_size // self.engine.get_data_parallel_size()",
            "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz",
            "assert self.world_size % infer_world_size == 0",
            "self.config.ref.ppo_micro_batch_size_per_gpu = self.config.ref.pop(",
        ],
        "workers/engine/fsdp/transformer_impl.py": [
            "return torch.distributed.get_world_size() // self.ulysses_sequence_parallel_size",
            "tu.assign_non_tensor(data, sp_size=self.ulysses_sequence_parallel_size)",
        ],
        "workers/config/actor.py": [
            "self.fsdp_config.ulysses_sequence_parallel_size = self.ulysses_sequence_parallel_size",
        ],
        "workers/rollout/replica.py": ["assert self.world_size % self.gpus_per_replica_node == 0"],
        "trainer/ppo/ray_trainer.py": [
            "ppo_mini_batch_size = ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n",
            "global_partition_lst = get_seqlen_balanced_partitions(workload_lst, k_partitions=dp_size, equal_size=True)",
        ],
        "trainer/ppo/v1/trainer_base.py": ["required_multiple = math.lcm(required_multiple, actor_global_mini_batch_size)"],
        "utils/config.py": ["real_train_batch_size = config.data.train_batch_size * config.actor_rollout_ref.rollout.n"],
    }
    for path, lines in expected.items():
        text = (VERL / path).read_text()
        for line in lines:
            assert line in text, f"verl/{path} no longer has: {line}"
