"""vLLM-CPU's KV cache sized in GiB from the run's shapes, and the free-memory check before workers start.

On a CPU, vLLM reads ``gpu_memory_utilization`` as a fraction of the *host's* memory and refuses to start
when that much is not free (a busy 24 GB machine: minutes into a run), or takes it all (30% of a 512 GB
host is ~150 GB). With ``kv_cache_memory_bytes`` set it allocates exactly that and skips the fraction. The
recipe sets it, on CPU, from what the run can have in flight at once::

    bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes of the rollout dtype
    sequences       = min(rollout.max_num_seqs, the largest batch sent at once:
                          max(generation round prompts x rollout.n, validation batch x val_kwargs.n))
    tokens          = sequences x max_model_len rounded up to whole 128-token blocks
                      (vLLM's largest CPU block; max_model_len = rollout.max_model_len or prompt + response)
    KV cache        = bytes per token x tokens

``dapo.cpu.kv_cache_gib`` overrides it with a fixed size (``auto``: the size above). The same sizing serves
the evaluation command (``recipe_dapo.evaluation.generation``: every sample of the run in flight, capped by
vLLM-CPU's default of 256 sequences). A smaller cache still works: vLLM then runs fewer sequences at once.

**Free memory.** Before any worker starts, :func:`check_cpu_memory` compares this machine's available
memory (``MemAvailable``, clamped to the cgroup limit of a container, as vLLM-CPU does) with the KV cache
plus the rollout's copy of the weights (refused when larger: vLLM would refuse, minutes later), and with
those plus the actor's training state (fp32 weights, gradients and two Adam moments: 16 bytes a parameter;
a warning when larger, as the estimate leaves out activations and Ray's own memory).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from recipe_dapo.config import select

logger = logging.getLogger(__name__)

GIB = 1 << 30
KV_BLOCK_TOKENS = 128
TRAINING_BYTES_PER_PARAM = 16  # fp32 weights, gradients, Adam first and second moments
KV_CACHE_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
SIZE_KEY = "dapo.cpu.kv_cache_gib"
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache and the weights' memory depend on, from a model's config.json and weight files."""

    layers: int
    kv_heads: int
    head_dim: int
    parameters: int
    dtype_bytes: int
    """Bytes per element of the stored weights (what vLLM's ``dtype=auto`` runs in)."""

    @classmethod
    def from_folder(cls, path: str) -> "ModelShape":
        with open(os.path.join(os.path.expanduser(path), "config.json")) as handle:
            config = json.load(handle)
        config = config.get("text_config", config)  # multimodal configs nest the language model's
        heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or int(config["hidden_size"]) // heads
        stored = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
        weight_bytes = sum(
            os.path.getsize(f)
            for pattern in ("*.safetensors", "*.bin")
            for f in glob.glob(os.path.join(os.path.expanduser(path), pattern))
        )
        return cls(
            layers=int(config["num_hidden_layers"]),
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            parameters=weight_bytes // stored,
            dtype_bytes=stored,
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def kv_cache_bytes(shape: ModelShape, dtype_bytes: int, sequences: int, max_model_len: int) -> int:
    """The KV cache of ``sequences`` sequences of ``max_model_len`` tokens (formula in the module docstring)."""
    tokens_per_sequence = math.ceil(max_model_len / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    return shape.kv_bytes_per_token(dtype_bytes) * max(int(sequences), 1) * tokens_per_sequence


def sequences_in_flight(config: DictConfig) -> int:
    """The most sequences the run sends to vLLM at once, capped by ``rollout.max_num_seqs``."""
    rollout = "actor_rollout_ref.rollout"
    train = int(select(config, "data.train_batch_size"))
    round_prompts = max(
        int(select(config, "data.gen_batch_size") or train),
        int(select(config, "dapo.dynamic_sampling.max_round_prompts") or 0),
    )
    val_batch = select(config, "data.val_batch_size")
    if val_batch is None:  # the whole validation set in one batch
        val_batch = _parquet_rows(select(config, "data.val_files"))
    largest = max(
        round_prompts * int(select(config, f"{rollout}.n", 1)),
        int(val_batch) * int(select(config, f"{rollout}.val_kwargs.n", 1) or 1),
    )
    return min(largest, int(select(config, f"{rollout}.max_num_seqs", largest) or largest))


def _parquet_rows(files) -> int:
    import pyarrow.parquet as pq

    paths = [files] if isinstance(files, str) else list(files or [])
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths if os.path.isfile(p)) or 1


def max_model_len(config: DictConfig) -> int:
    rollout = "actor_rollout_ref.rollout"
    explicit = select(config, f"{rollout}.max_model_len")
    if explicit:
        return int(explicit)
    return int(select(config, f"{rollout}.prompt_length")) + int(select(config, f"{rollout}.response_length"))


def rollout_dtype_bytes(config: DictConfig) -> int:
    return DTYPE_BYTES.get(str(select(config, "actor_rollout_ref.rollout.dtype", "bfloat16")), 2)


def planned_kv_cache_bytes(config: DictConfig, shape: ModelShape) -> int:
    """The KV cache the run will ask vLLM-CPU for: an explicit size, ``dapo.cpu.kv_cache_gib``, or sized."""
    explicit = select(config, KV_CACHE_KEY)
    if explicit:
        return int(explicit)
    size = select(config, SIZE_KEY, "auto")
    if size not in (None, "auto"):
        return int(float(size) * GIB)
    return kv_cache_bytes(shape, rollout_dtype_bytes(config), sequences_in_flight(config), max_model_len(config))


def apply_cpu_kv_cache(config: DictConfig) -> Optional[int]:
    """On ``trainer.device=cpu``, write the planned KV cache into vLLM's engine arguments; returns it."""
    if select(config, "trainer.device") != "cpu" or select(config, KV_CACHE_KEY):
        return select(config, KV_CACHE_KEY)
    model_path = os.path.expanduser(str(select(config, "actor_rollout_ref.model.path")))
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        return None  # nothing to size from; the start-up checks name the model path
    shape = ModelShape.from_folder(model_path)
    size = planned_kv_cache_bytes(config, shape)
    with open_dict(config):
        OmegaConf.update(config, KV_CACHE_KEY, size, force_add=True)
    logger.debug(  # the console's run line gives the size (tracking.console.run_summary)
        "vLLM-CPU KV cache: %.3f GiB (%d sequences x %d tokens; %s=auto)",
        size / GIB, sequences_in_flight(config), max_model_len(config), SIZE_KEY,
    )
    return size


def available_memory() -> int:
    """Bytes this process can still allocate: ``MemAvailable``, clamped by a cgroup limit (as vLLM-CPU reads it)."""
    import psutil

    available = psutil.virtual_memory().available
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        try:
            with open(limit_file) as limit, open(usage_file) as usage:
                raw = limit.read().strip()
                if raw != "max":
                    available = min(available, max(int(raw) - int(usage.read().strip()), 0))
            break
        except (OSError, ValueError):
            continue
    return available


def check_cpu_memory(config: DictConfig, problems: list[str], available: Optional[int] = None) -> None:
    """Refuse a CPU run whose KV cache and rollout weights do not fit in free memory (module docstring)."""
    if select(config, "trainer.device") != "cpu":
        return
    model_path = os.path.expanduser(str(select(config, "actor_rollout_ref.model.path")))
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        return  # no local model to size from; the model check reports a bad path
    shape = ModelShape.from_folder(model_path)
    kv = planned_kv_cache_bytes(config, shape)
    rollout_weights = shape.parameters * rollout_dtype_bytes(config)
    training = shape.parameters * TRAINING_BYTES_PER_PARAM
    available = available_memory() if available is None else available
    if kv + rollout_weights > available:
        problems.append(
            f"vLLM-CPU needs {kv / GIB:.2f} GiB of KV cache ({sequences_in_flight(config)} sequences x "
            f"{max_model_len(config)} tokens) plus {rollout_weights / GIB:.2f} GiB of weights, but this machine "
            f"has {available / GIB:.2f} GiB free; set {SIZE_KEY} to a smaller size in GiB (vLLM then runs fewer "
            "sequences at once), lower data.gen_batch_size / data.val_batch_size or the lengths, or free memory"
        )
    elif kv + rollout_weights + training > available:
        logger.warning(
            "the CPU run may not fit in memory: KV cache %.2f GiB + rollout weights %.2f GiB + training state "
            "%.2f GiB > %.2f GiB free", kv / GIB, rollout_weights / GIB, training / GIB, available / GIB,
        )
