"""Every cluster and batch shape verl 0.9.1 would crash on, refused at start-up with the smallest fix.

Pure: OmegaConf and integers (and, for the attention-head rules, a local model folder's ``config.json`` when one
is there). :func:`shape_problems` is the one entry point.

Where each rule comes from (verl 0.9.1; the classic trainer runs ``verl.workers.engine_workers.ActorRolloutRefWorker``,
verl 0.9.1 has no legacy-worker switch):

- DP size: ``FSDPEngine.get_data_parallel_size`` = world / ulysses SP (``workers/engine/fsdp/transformer_impl.py``);
  the world is ``trainer.nnodes x trainer.n_gpus_per_node`` (one global pool). The actor's SP is
  ``actor.ulysses_sequence_parallel_size`` when > 1, else ``actor.fsdp_config.ulysses_sequence_parallel_size``
  (``FSDPActorConfig.__post_init__``); the reference model's the same from ``ref``. ``init_device_mesh`` needs
  world % SP == 0 and, for ``fsdp_size`` in (0, world), world % fsdp_size == 0 (``create_device_mesh``).
- Dispatch: ``make_nd_compute_dataproto_dispatch_fn`` chunks the batch into DP pieces, ``chunk_tensordict`` asserts
  rows % DP == 0; ``_balance_batch`` (``get_seqlen_balanced_partitions(equal_size=True)``) asserts the same.
- Update: ``TrainingWorker.train_mini_batch`` asserts (mini x n) % DP == 0, then ``make_iterator`` asserts
  (rows / DP) % (mini x n / DP) == 0: every step must be whole mini-batches.
- Micro-batches (``prepare_micro_batches``): fixed ones need (rows per rank) % micro == 0, for each update
  mini-batch and for the whole per-rank batch of a log-prob pass; dynamic ones (by tokens) need
  max_token_len_per_gpu x SP >= the longest sequence (``rearrange_micro_batches``): no divisibility is left.
- verl's ``validate_config`` (fixed micro-batches): train x n % GPUs == 0, and ``ActorConfig`` wants the per-GPU
  micro-batch keys (the engine workers ignore the deprecated global ones); ``ActorRolloutRefWorker.init_model``
  asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz.
- Rollout: ``init_model`` asserts world % (TP x DP x PP) == 0; ``RolloutReplica`` asserts a replica larger than a
  node is whole nodes, and a smaller one must not straddle two nodes (its server runs on one node). The agent loop
  ``DataProto.chunk``\\ s every generation round over ``rollout.agent.num_workers``.
- Heads (local ``config.json``): Ulysses needs heads % SP == 0 and kv heads % SP == 0 or SP % kv heads == 0
  (``models/transformers/monkey_patch.py``); vLLM needs heads % TP == 0.

Steps: the classic trainer trains exactly the step's rows; a budget-limited partial step (dynamic sampling with
``on_exhausted=train_partial``) is k whole mini-batches, 1 <= k x mini < train. verl's v1 trainer pads every
step up to a multiple of lcm(DP, mini x n) (``_get_required_batch_multiple``) instead of failing on it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Callable, Optional

from omegaconf import DictConfig

from recipe_dapo.preflight.base import select as _select

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"

# Shape field -> the config key a fix sets.
KEYS = {
    "nnodes": "trainer.nnodes",
    "per_node": "trainer.n_gpus_per_node",
    "n": f"{ROLLOUT}.n",
    "train": "data.train_batch_size",
    "mini": f"{ACTOR}.ppo_mini_batch_size",
    "micro_update": f"{ACTOR}.ppo_micro_batch_size_per_gpu",
    "micro_logprob": f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
    "micro_ref": f"{REF}.log_prob_micro_batch_size_per_gpu",
    "tokens_update": f"{ACTOR}.ppo_max_token_len_per_gpu",
    "tokens_logprob": f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
    "tokens_ref": f"{REF}.log_prob_max_token_len_per_gpu",
    "sp": f"{ACTOR}.ulysses_sequence_parallel_size",
    "ref_sp": f"{REF}.ulysses_sequence_parallel_size",
    "fsdp_size": f"{ACTOR}.fsdp_config.fsdp_size",
    "tp": f"{ROLLOUT}.tensor_model_parallel_size",
    "agent_workers": f"{ROLLOUT}.agent.num_workers",
}


@dataclass(frozen=True)
class Shape:
    """The integers and switches the shape rules read from a configuration."""

    nnodes: int
    per_node: int
    n: int
    train: int
    mini: int
    sp: int = 1
    sp_key: str = KEYS["sp"]
    fsdp_size: int = -1
    use_ref: bool = False
    ref_in_actor: bool = False
    ref_sp: int = 1
    ref_sp_key: str = KEYS["ref_sp"]
    dynamic: bool = False  # actor.use_dynamic_bsz
    logprob_dynamic: bool = False  # rollout.log_prob_use_dynamic_bsz
    ref_dynamic: bool = False  # ref.log_prob_use_dynamic_bsz
    micro_update: Optional[int] = None
    micro_logprob: Optional[int] = None
    micro_ref: Optional[int] = None
    deprecated_micro: tuple = ()  # (key, value) of the global micro-batch keys that are set
    tokens_update: Optional[int] = None
    tokens_logprob: Optional[int] = None
    tokens_ref: Optional[int] = None
    seq_len: int = 0  # prompt + response tokens: the longest sequence a step can hold
    tp: int = 1
    rollout_dp: int = 1
    rollout_pp: int = 1
    agent_workers: int = 1
    rounds: tuple = ()  # (key, prompts) every generation round is a multiple of
    partial_steps: bool = False
    use_v1: bool = False
    heads: Optional[int] = None
    kv_heads: Optional[int] = None

    @property
    def world(self) -> int:
        return self.nnodes * self.per_node

    @property
    def dp(self) -> int:
        return self.world // self.sp if self.sp > 0 and self.world % self.sp == 0 else 0

    @property
    def ref_dp(self) -> int:
        if self.ref_in_actor:
            return self.dp
        return self.world // self.ref_sp if self.ref_sp > 0 and self.world % self.ref_sp == 0 else 0

    @property
    def infer_world(self) -> int:
        return self.tp * self.rollout_dp * self.rollout_pp


def _int_or_none(value) -> Optional[int]:
    return None if value is None else int(value)


def _sp(config, section: str) -> tuple[int, str]:
    """The SP size the engine uses (FSDPActorConfig.__post_init__: the section's key wins when > 1)."""
    outer = int(_select(config, f"{section}.ulysses_sequence_parallel_size", 1) or 1)
    if outer > 1:
        return outer, f"{section}.ulysses_sequence_parallel_size"
    return int(_select(config, f"{section}.fsdp_config.ulysses_sequence_parallel_size", 1) or 1), (
        f"{section}.fsdp_config.ulysses_sequence_parallel_size"
    )


def _round_sizes(config) -> tuple:
    """Prompt counts every generation round is a multiple of (the recipe's sampler)."""
    train = int(_select(config, "data.train_batch_size"))
    if not _select(config, "algorithm.filter_groups.enable", False):
        return (("data.train_batch_size", train),)
    if _select(config, "dapo.dynamic_sampling.round_sizing", "deficit") == "whole":
        return (("data.gen_batch_size", int(_select(config, "data.gen_batch_size") or train)),)
    key = "dapo.dynamic_sampling.prompt_granularity"
    return ((key, int(_select(config, key, 1) or 1)),)


def _heads(config) -> tuple[Optional[int], Optional[int]]:
    """(attention heads, kv heads) from a local model folder's config.json; (None, None) when not knowable."""
    path = _select(config, "actor_rollout_ref.model.path")
    if not isinstance(path, str):
        return None, None
    path = os.path.join(os.path.expanduser(path), "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            hf = json.load(handle)
    except (OSError, ValueError):
        return None, None
    hf = hf.get("text_config", hf) if "num_attention_heads" not in hf else hf
    heads = hf.get("num_attention_heads")
    return _int_or_none(heads), _int_or_none(hf.get("num_key_value_heads", heads))


def read_shape(config: DictConfig, *, read_model_config: bool = True) -> Shape:
    """The :class:`Shape` of a (resolved) configuration."""
    lora_rank = int(_select(config, "actor_rollout_ref.model.lora.rank", 0) or 0) or int(
        _select(config, "actor_rollout_ref.model.lora_rank", 0) or 0
    )
    sp, sp_key = _sp(config, ACTOR)
    ref_sp, ref_sp_key = _sp(config, REF)
    dynamic_sampling = bool(_select(config, "algorithm.filter_groups.enable", False))
    deprecated = tuple(
        (key, _select(config, key))
        for key in (f"{ACTOR}.ppo_micro_batch_size", f"{ROLLOUT}.log_prob_micro_batch_size", f"{REF}.log_prob_micro_batch_size")
        if _select(config, key) is not None
    )
    heads, kv_heads = _heads(config) if read_model_config else (None, None)
    return Shape(
        nnodes=int(_select(config, "trainer.nnodes")),
        per_node=int(_select(config, "trainer.n_gpus_per_node")),
        n=int(_select(config, f"{ROLLOUT}.n", 1)),
        train=int(_select(config, "data.train_batch_size")),
        mini=int(_select(config, f"{ACTOR}.ppo_mini_batch_size")),
        sp=sp,
        sp_key=sp_key,
        fsdp_size=int(_select(config, f"{ACTOR}.fsdp_config.fsdp_size", -1)),
        use_ref=bool(_select(config, "algorithm.use_kl_in_reward", False) or _select(config, f"{ACTOR}.use_kl_loss", False)),
        ref_in_actor=lora_rank > 0 or _select(config, "actor_rollout_ref.model.lora_adapter_path") is not None,
        ref_sp=ref_sp,
        ref_sp_key=ref_sp_key,
        dynamic=bool(_select(config, f"{ACTOR}.use_dynamic_bsz", False)),
        logprob_dynamic=bool(_select(config, f"{ROLLOUT}.log_prob_use_dynamic_bsz", False)),
        ref_dynamic=bool(_select(config, f"{REF}.log_prob_use_dynamic_bsz", False)),
        micro_update=_int_or_none(_select(config, KEYS["micro_update"])),
        micro_logprob=_int_or_none(_select(config, KEYS["micro_logprob"])),
        micro_ref=_int_or_none(_select(config, KEYS["micro_ref"])),
        deprecated_micro=deprecated,
        tokens_update=_int_or_none(_select(config, KEYS["tokens_update"])),
        tokens_logprob=_int_or_none(_select(config, KEYS["tokens_logprob"])),
        tokens_ref=_int_or_none(_select(config, KEYS["tokens_ref"])),
        seq_len=int(_select(config, "data.max_prompt_length")) + int(_select(config, "data.max_response_length")),
        tp=int(_select(config, f"{ROLLOUT}.tensor_model_parallel_size", 1)),
        rollout_dp=int(_select(config, f"{ROLLOUT}.data_parallel_size", 1) or 1),
        rollout_pp=int(_select(config, f"{ROLLOUT}.pipeline_model_parallel_size", 1) or 1),
        agent_workers=int(_select(config, f"{ROLLOUT}.agent.num_workers", 1) or 1),
        rounds=_round_sizes(config),
        partial_steps=dynamic_sampling and _select(config, "dapo.dynamic_sampling.on_exhausted", "train_partial") == "train_partial",
        use_v1=bool(_select(config, "trainer.use_v1", False)),
        heads=heads,
        kv_heads=kv_heads,
    )


def step_rows(shape: Shape) -> list[tuple[str, int]]:
    """(what, rows) of every batch a training step can hand the workers."""
    unit = shape.mini * shape.n
    steps = [("a full step", shape.train * shape.n)]
    if shape.partial_steps:
        k = 1
        while k * shape.mini < shape.train:
            steps.append((f"a partial step of {k} mini-batch{'es' if k > 1 else ''}", k * unit))
            k += 1
    if shape.use_v1 and shape.dp and unit:  # verl's v1 trainer pads a step to lcm(DP, mini x n)
        multiple = math.lcm(shape.dp, unit)
        steps = [(what, -(-rows // multiple) * multiple) for what, rows in steps]
    return steps


# ----------------------------------------------------------------------------- the rules
#
# A rule is (fields a fix may change, check); check(shape) returns the problem without its fix, or None.


def _first_failing(steps, ok: Callable[[int], bool]) -> Optional[tuple[str, int]]:
    return next(((what, rows) for what, rows in steps if not ok(rows)), None)


def _rule_sp_world(s: Shape):
    if s.sp < 1 or s.world % s.sp:
        return (f"{s.sp_key}={s.sp} does not divide the {s.world} GPUs (trainer.nnodes={s.nnodes} x "
                f"trainer.n_gpus_per_node={s.per_node}): verl's device mesh is (world / SP) x SP")


def _rule_ref_sp_world(s: Shape):
    if s.use_ref and not s.ref_in_actor and (s.ref_sp < 1 or s.world % s.ref_sp):
        return f"{s.ref_sp_key}={s.ref_sp} does not divide the {s.world} GPUs of the reference model"


def _rule_fsdp_size(s: Shape):
    if s.fsdp_size == 0 or (0 < s.fsdp_size < s.world and s.world % s.fsdp_size):
        return (f"{KEYS['fsdp_size']}={s.fsdp_size} does not divide the {s.world} GPUs (verl's FSDP mesh is "
                "world / fsdp_size x fsdp_size; -1 shards over all GPUs)")


def _rule_heads(s: Shape):
    if s.heads is None:
        return None
    if s.sp > 1 and (s.heads % s.sp or (s.kv_heads and s.kv_heads % s.sp and s.sp % s.kv_heads)):
        return (f"{s.sp_key}={s.sp} does not split the model's {s.heads} attention heads / {s.kv_heads} kv heads "
                "(Ulysses needs heads % SP == 0 and kv heads % SP == 0 or SP % kv heads == 0)")
    if s.heads % s.tp:
        return f"{KEYS['tp']}={s.tp} does not divide the model's {s.heads} attention heads (vLLM tensor parallel)"


def _rule_rollout_world(s: Shape):
    if s.infer_world < 1 or s.world % s.infer_world:
        return (f"{KEYS['tp']}={s.tp} x {ROLLOUT}.data_parallel_size={s.rollout_dp} x "
                f"{ROLLOUT}.pipeline_model_parallel_size={s.rollout_pp} = {s.infer_world} GPUs per vLLM replica "
                f"does not divide the {s.world} GPUs (trainer.nnodes={s.nnodes} x trainer.n_gpus_per_node={s.per_node})")


def _rule_replica_nodes(s: Shape):
    if s.infer_world < 1 or s.world % s.infer_world:
        return None  # _rule_rollout_world
    if s.infer_world > s.per_node and s.infer_world % s.per_node:
        return (f"a vLLM replica of {s.infer_world} GPUs ({KEYS['tp']}={s.tp} x data x pipeline parallel) spans "
                f"nodes of trainer.n_gpus_per_node={s.per_node} but is not whole nodes")
    if s.infer_world < s.per_node and s.per_node % s.infer_world:
        return (f"vLLM replicas of {s.infer_world} GPUs ({KEYS['tp']}={s.tp} x data x pipeline parallel) do not "
                f"tile a node of trainer.n_gpus_per_node={s.per_node}: one would straddle two nodes")


def _rule_agent_workers(s: Shape):
    for key, prompts in s.rounds:
        if (prompts * s.n) % s.agent_workers:
            return (f"{key}={prompts} prompts x {KEYS['n']}={s.n} responses per generation round do not split "
                    f"evenly over {KEYS['agent_workers']}={s.agent_workers} agent-loop workers (DataProto.chunk)")


def _rule_train_vs_mini(s: Shape):
    if s.mini < 1 or (s.mini > s.train and not (s.use_v1 and s.dynamic)):  # v1 pads; ActorConfig.validate (fixed)
        return (f"{KEYS['mini']}={s.mini} is larger than {KEYS['train']}={s.train} (both in prompts): "
                "a step cannot fill one update")
    if not s.use_v1 and s.train % s.mini:
        return (f"{KEYS['train']}={s.train} is not a multiple of {KEYS['mini']}={s.mini} (in prompts; x "
                f"{KEYS['n']}={s.n} = {s.train * s.n} vs {s.mini * s.n} rows): every full step fails verl's "
                "mini-batch iterator")


def _rule_mini_vs_dp(s: Shape):
    if s.dp and (s.mini * s.n) % s.dp:
        return (f"{KEYS['mini']}={s.mini} x {KEYS['n']}={s.n} = {s.mini * s.n} rows per mini-batch do not split "
                f"over the actor's {s.dp} data-parallel ranks ({s.world} GPUs / SP {s.sp})")


def _rule_steps_vs_dp(s: Shape):
    """A step's rows over the actor's ranks (dispatch, balance_batch) and the reference model's ranks."""
    for role, dp in (("actor's", s.dp), ("reference model's", s.ref_dp if s.use_ref else 0)):
        if not dp:
            continue
        failing = _first_failing(step_rows(s), lambda rows: rows % dp == 0)
        if failing:
            return (f"{failing[0]} ({failing[1]} rows = prompts x {KEYS['n']}={s.n}) does not split over the "
                    f"{role} {dp} data-parallel ranks")


def _rule_micro_update(s: Shape):
    if s.dynamic or not s.dp or not s.micro_update or (s.mini * s.n) % s.dp:
        return None
    per_rank = s.mini * s.n // s.dp
    if per_rank % s.micro_update:
        return (f"{KEYS['micro_update']}={s.micro_update} does not divide the per-rank mini-batch of {per_rank} rows "
                f"({KEYS['mini']}={s.mini} x {KEYS['n']}={s.n} / {s.dp} ranks; use_dynamic_bsz=false)")


def _rule_micro_logprob(s: Shape):
    return _micro_infer(s, s.logprob_dynamic, s.micro_logprob, "micro_logprob", s.dp, "old log-prob")


def _rule_micro_ref(s: Shape):
    if not s.use_ref:
        return None
    if s.ref_in_actor:  # the reference log-probs run on the actor (LoRA): the rollout's micro-batches
        return None
    return _micro_infer(s, s.ref_dynamic, s.micro_ref, "micro_ref", s.ref_dp, "reference log-prob")


def _micro_infer(s: Shape, dynamic: bool, micro, field: str, dp: int, what: str):
    if dynamic or not dp or not micro:
        return None
    failing = _first_failing(step_rows(s), lambda rows: rows % dp or (rows // dp) % micro == 0)
    if failing:
        return (f"{KEYS[field]}={micro} does not divide the {failing[1] // dp} rows per rank of {failing[0]} "
                f"({failing[1]} rows / {dp} ranks) in the {what} pass (use_dynamic_bsz=false)")


def _rule_micro_keys(s: Shape):
    if s.deprecated_micro:
        key, value = s.deprecated_micro[0]
        return f"{key}={value} is a global micro-batch size that verl 0.9.1's engine workers ignore"
    if not s.dynamic and s.micro_update is None:
        return f"{KEYS['micro_update']} is null with {ACTOR}.use_dynamic_bsz=false"
    if not s.logprob_dynamic and s.micro_logprob is None:
        return f"{KEYS['micro_logprob']} is null with {ROLLOUT}.log_prob_use_dynamic_bsz=false"
    if s.use_ref and not s.ref_in_actor and not s.ref_dynamic and s.micro_ref is None:
        return f"{KEYS['micro_ref']} is null with {REF}.log_prob_use_dynamic_bsz=false"
    for field in ("micro_update", "micro_logprob", "micro_ref"):
        if getattr(s, field) is not None and getattr(s, field) < 1:
            return f"{KEYS[field]}={getattr(s, field)} must be at least 1"


def _rule_dynamic_switches(s: Shape):
    if s.dynamic != s.logprob_dynamic:
        return (f"{ACTOR}.use_dynamic_bsz={s.dynamic} differs from {ROLLOUT}.log_prob_use_dynamic_bsz="
                f"{s.logprob_dynamic}: verl's actor worker asserts they are equal")


def _rule_validate_config(s: Shape):
    if not s.dynamic and (s.train * s.n) % s.world:
        return (f"{KEYS['train']}={s.train} x {KEYS['n']}={s.n} = {s.train * s.n} rows is not divisible by the "
                f"{s.world} GPUs (verl's validate_config, use_dynamic_bsz=false)")


def _tokens_rule(dynamic_field: str, tokens_field: str, sp_field: str, what: str, needs_ref: bool = False):
    def rule(s: Shape):
        if needs_ref and (not s.use_ref or s.ref_in_actor):
            return None
        tokens, sp = getattr(s, tokens_field), getattr(s, sp_field)
        if getattr(s, dynamic_field) and (tokens is None or tokens * sp < s.seq_len):
            return (f"{KEYS[tokens_field]}={tokens} x SP {sp} is less than the longest sequence, data.max_prompt_length "
                    f"+ data.max_response_length = {s.seq_len} tokens: a full-length {what} sequence fails verl's "
                    "dynamic micro-batching (use_dynamic_bsz=true)")

    return rule


RULES: tuple[tuple[tuple[str, ...], Callable[[Shape], Optional[str]]], ...] = (
    (("sp",), _rule_sp_world),
    (("ref_sp",), _rule_ref_sp_world),
    (("fsdp_size",), _rule_fsdp_size),
    (("tp",), _rule_rollout_world),
    (("tp",), _rule_replica_nodes),
    (("sp", "tp"), _rule_heads),
    (("agent_workers",), _rule_agent_workers),
    (("mini", "train"), _rule_train_vs_mini),
    (("mini",), _rule_mini_vs_dp),
    (("mini", "train"), _rule_steps_vs_dp),
    (("micro_update", "mini"), _rule_micro_update),
    (("micro_logprob",), _rule_micro_logprob),
    (("micro_ref",), _rule_micro_ref),
    ((), _rule_micro_keys),
    ((), _rule_dynamic_switches),
    (("train",), _rule_validate_config),
    (("tokens_update",), _tokens_rule("dynamic", "tokens_update", "sp", "training")),
    (("tokens_logprob",), _tokens_rule("logprob_dynamic", "tokens_logprob", "sp", "log-prob")),
    (("tokens_ref",), _tokens_rule("ref_dynamic", "tokens_ref", "ref_sp", "reference log-prob", needs_ref=True)),
)

# Fixed advice for the rules whose fix is not one integer.
_ADVICE = {
    _rule_micro_keys: "set the *_micro_batch_size_per_gpu key instead (and null the global one)",
    _rule_dynamic_switches: f"leave {ROLLOUT}.log_prob_use_dynamic_bsz to follow {ACTOR}.use_dynamic_bsz",
}


def _failing(shape: Shape) -> set:
    return {check for _, check in RULES if check(shape)}


def _candidates(current: int, field: str, shape: Shape) -> list[int]:
    """Values to try for a field, nearest to the current one first (smaller first on a tie)."""
    if field in ("sp", "ref_sp", "tp", "fsdp_size", "agent_workers"):
        values = [d for d in range(1, shape.world + 1)] + ([-1] if field == "fsdp_size" else [])
        if field == "agent_workers":
            values = list(range(1, max(current, 1) * 2 + 1))
    elif field.startswith("tokens"):
        sp = shape.ref_sp if field == "tokens_ref" else shape.sp
        return [-(-shape.seq_len // max(sp, 1))]
    else:
        values = list(range(1, max(current or 1, shape.train, 1) * 4 + 1))
    # On a tie: a smaller micro- or mini-batch (less memory), a larger train batch (no fewer prompts per step).
    larger_first = -1 if field == "train" else 1
    return sorted((v for v in values if v != current), key=lambda v: (abs(v - (current or 0)), larger_first * v))


def _fix(shape: Shape, fields: tuple[str, ...], check) -> str:
    """The smallest change of one field that makes this rule pass and breaks no rule that passed."""
    before = _failing(shape)
    fixes = []
    for field in fields:
        current = getattr(shape, field)
        for value in _candidates(current, field, shape):
            after = _failing(replace(shape, **{field: value}))
            if check not in after and after <= before:
                key = shape.sp_key if field == "sp" else shape.ref_sp_key if field == "ref_sp" else KEYS[field]
                fixes.append(f"{key}={value}")
                break
    if not fixes:
        return _ADVICE.get(check, "change the cluster or batch shape")
    return "set " + " or ".join(fixes)


def shape_problems(config: DictConfig) -> list[str]:
    """Every cluster / batch shape in ``config`` that verl would crash on, each with the keys, values and fix."""
    return shape_problems_of(read_shape(config))


def shape_problems_of(shape: Shape) -> list[str]:
    """:func:`shape_problems` for an already-read :class:`Shape` (tests, and callers that vary one value)."""
    return [f"{p}; {_fix(shape, f, c) if f else _ADVICE[c]}" for f, c in RULES if (p := c(shape))]
