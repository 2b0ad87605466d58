"""Rules of the cluster's shape and the batch sizes: what verl asserts inside the workers, after the cluster was
allocated and the model loaded, and what the machine's memory holds (``platform=cpu``)."""

from __future__ import annotations

from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select
from recipe_dapo.preflight.shapes import shape_problems


def rule_batch_sizes(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """A generation round holds at least one training batch of prompts (the mini-batch rules are ``shapes``)."""
    train = int(select(config, "data.train_batch_size"))
    gen = select(config, "data.gen_batch_size")
    if gen is not None and int(gen) < train:
        yield (
            f"data.gen_batch_size={gen} is smaller than data.train_batch_size={train}: a generation round must hold "
            "at least one training batch of prompts; raise data.gen_batch_size (the paper uses 3 x train_batch_size) "
            "or lower data.train_batch_size"
        )


def rule_cluster_shape(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Every cluster and batch shape verl would crash on (``shapes``: checked against verl's own code)."""
    return shape_problems(config)


def rule_cpu_memory(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """On CPU: vLLM's KV cache and the weights must fit in free memory (``recipe_dapo.cpu.memory``)."""
    from recipe_dapo.cpu.memory import check_cpu_memory

    problems: list[str] = []
    check_cpu_memory(config, problems)
    return problems


def rule_cpu_reference_model(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """On CPU no reference model can be built: verl 0.9.1's FSDP2 engine offloads a forward-only model (the reference)
    with ``CPUOffloadPolicy(pin_memory=True)``, and pinned memory needs an accelerator; the run would fail after its
    whole start-up ("Cannot access accelerator device when none is available"). FSDP1 for the reference
    (``actor_rollout_ref.ref.strategy=fsdp``) fails there too: verl builds it with ``sync_module_states=True``, which
    torch refuses for parameters on the CPU ("requires them to be on GPU")."""
    if str(select(config, "trainer.device", "cuda")) != "cpu":
        return
    wanting = [key for key in ("actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward")
               if select(config, key, False)]
    if wanting:
        yield (
            f"{' and '.join(f'{key}=true' for key in wanting)} on CPU (trainer.device=cpu): the KL needs a reference "
            "model, which verl 0.9.1's FSDP2 engine builds with pinned-memory CPU offload, and pinned memory needs an "
            "accelerator (the run would fail after its start-up: \"Cannot access accelerator device when none is "
            f"available\"); set {' and '.join(f'{key}=false' for key in wanting)} on CPU, or run on a GPU"
        )


def rule_cpu_seeded_prefill(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """On CPU, seeded rollouts need whole prefills: vLLM rewinds the seeded generator of a request it prefilled in
    part (``set_offset``), which a CPU generator does not have, so the first round whose prompts exceed
    ``max_num_batched_tokens`` would crash the rollout ("CPU Generator does not use offset")."""
    if str(select(config, "trainer.device", "cuda")) != "cpu" or not select(config, "dapo.seeded_rollouts", False):
        return
    if select(config, "trainer.use_v1", False):  # the v1 trainer does not seed rollouts (trainers/v1/trainer.py)
        return
    if select(config, "actor_rollout_ref.rollout.enable_chunked_prefill", True):
        yield (
            "actor_rollout_ref.rollout.enable_chunked_prefill=true with dapo.seeded_rollouts=true on CPU "
            "(trainer.device=cpu): vLLM rewinds a partly prefilled request's seeded generator with set_offset, which "
            "a CPU generator does not have, and the rollout crashes on the first round whose prompts exceed "
            "actor_rollout_ref.rollout.max_num_batched_tokens; set actor_rollout_ref.rollout.enable_chunked_prefill="
            "false (platform=cpu does) or dapo.seeded_rollouts=false"
        )
