"""Rules of the cluster's shape and the batch sizes: what verl asserts inside the workers, after the cluster was
allocated and the model loaded, and what the machine's memory holds (``platform=cpu``)."""

from __future__ import annotations

import math
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select


def rule_batch_sizes(config: DictConfig, report: CheckReport) -> Iterable[str]:
    train = int(select(config, "data.train_batch_size"))
    gen = select(config, "data.gen_batch_size")
    if gen is not None and int(gen) < train:
        yield (
            f"data.gen_batch_size={gen} is smaller than data.train_batch_size={train}: a generation round must hold "
            "at least one training batch of prompts; raise data.gen_batch_size (the paper uses 3 x train_batch_size) "
            "or lower data.train_batch_size"
        )
    mini = int(select(config, "actor_rollout_ref.actor.ppo_mini_batch_size"))
    if mini > train:
        yield (
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train} "
            "(both in prompts): one step could not fill one update; lower the mini-batch (the paper: 512 prompts "
            "per step in 16 mini-batches of 32)"
        )


def rule_cluster_shape(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Divisibility rules verl asserts inside the workers, after the cluster was allocated and the model loaded."""
    nnodes, per_node = int(select(config, "trainer.nnodes")), int(select(config, "trainer.n_gpus_per_node"))
    n_gpus = nnodes * per_node
    n = int(select(config, "actor_rollout_ref.rollout.n"))
    rollout = select(config, "actor_rollout_ref.rollout")
    infer_world = int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size) * int(
        rollout.pipeline_model_parallel_size
    )
    if n_gpus % infer_world:
        yield (
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} "
            f"(x data/pipeline parallel = {infer_world} GPUs per vLLM replica) does not divide the {n_gpus} GPUs "
            f"(trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node}); choose a divisor"
        )
    if infer_world > per_node:
        yield (
            f"one vLLM replica needs {infer_world} GPUs but a node has trainer.n_gpus_per_node={per_node}; "
            "lower actor_rollout_ref.rollout.tensor_model_parallel_size"
        )
    actor = select(config, "actor_rollout_ref.actor")
    # The actor-level key (deprecated in verl, still honoured) wins over fsdp_config's when it is larger than 1.
    sp = max(
        int(actor.get("ulysses_sequence_parallel_size", 1) or 1),
        int(select(config, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1),
    )
    if n_gpus % sp:
        yield f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp} does not divide the {n_gpus} GPUs; choose a divisor"
    elif actor.get("strategy") in ("fsdp", "fsdp2"):
        dp = n_gpus // sp
        mini_batch = int(actor.ppo_mini_batch_size) * n
        if mini_batch % dp:
            yield (
                f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} x rollout.n={n} = "
                f"{mini_batch} responses is not divisible by the actor's {dp} data-parallel ranks ({n_gpus} GPUs / "
                f"sequence parallel {sp}); make the mini-batch a multiple of {dp // math.gcd(dp, n)} prompts"
            )
    workers = int(select(config, "actor_rollout_ref.rollout.agent.num_workers", 1) or 1)
    for key, prompts in _round_sizes(config):
        if (prompts * n) % workers:
            yield (
                f"{key}={prompts} prompts x rollout.n={n} responses do not split evenly over "
                f"actor_rollout_ref.rollout.agent.num_workers={workers} agent-loop workers; change one of them"
            )


def _round_sizes(config: DictConfig) -> list[tuple[str, int]]:
    """Prompt counts every generation round is a multiple of (so prompts x n must split over the workers)."""
    train = int(select(config, "data.train_batch_size"))
    if not select(config, "algorithm.filter_groups.enable", False):
        return [("data.train_batch_size", train)]
    if select(config, "dapo.dynamic_sampling.round_sizing", "deficit") == "whole":
        return [("data.gen_batch_size", int(select(config, "data.gen_batch_size") or train))]
    granularity = "dapo.dynamic_sampling.prompt_granularity"
    return [(granularity, int(select(config, granularity, 1)))]


def rule_cpu_memory(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """On CPU: vLLM's KV cache and the weights must fit in free memory (``recipe_dapo.cpu.memory``)."""
    from recipe_dapo.cpu.memory import check_cpu_memory

    problems: list[str] = []
    check_cpu_memory(config, problems)
    return problems
