"""Prompt lengths in tokens, counted as verl's rollout counts them, fast enough for every start-up.

verl 0.9.1's agent loop turns a row's ``prompt`` messages into token ids with the model's chat template
(``apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **data.apply_chat_template_kwargs)``)
and, when they exceed ``rollout.prompt_length`` (``data.max_prompt_length`` unless overridden), keeps the
*last* tokens with one warning per sample: the start of the prompt, the question itself in DAPO's template,
is cut away. ``data.truncation`` is not applied there, and ``data.filter_overlong_prompts`` (off by default)
is the only other place lengths are looked at. The recipe counts every prompt at start-up instead
(``preflight``) and in ``python -m recipe_dapo.data validate --tokenizer ...``.

**How it counts.** One batched chat-template rendering of all rows to text, then the fast (Rust) tokenizer
on batches of texts, with ``add_special_tokens=False`` as verl's ``apply_chat_template`` does; the counts
equal verl's (tested against verl's own token builder). **The byte bound.** With a byte-level BPE tokenizer
(GPT-2, Qwen, Llama 3: ``ByteLevel`` pre-tokenizer, BPE model) every token spans at least one byte of the
normalized text, so a text of at most ``limit`` UTF-8 bytes after the tokenizer's normalizer has at most
``limit`` tokens: only longer texts are tokenized (on DAPO-Math-17k with the paper's 2,048-token limit, 23 of
17,917 rows). Other tokenizers are tokenized in full. ``bench/prompt_length_check.py`` measures both.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from recipe_dapo.data.validation import RLDataError

_ROWS_PER_BATCH = 4096
_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptLengths:
    """Prompts of one file over ``limit`` tokens: 0-based rows and their exact token counts."""

    path: str
    rows: int
    limit: int
    overlong_rows: np.ndarray
    overlong_tokens: np.ndarray
    tokenized: int
    """Rows actually tokenized (the others were under the byte bound)."""

    @property
    def num_overlong(self) -> int:
        return int(self.overlong_rows.size)


def render_prompts(tokenizer, conversations: Sequence[Any], chat_template_kwargs: Mapping | None = None) -> list[str]:
    """The chat-templated text of each conversation (with the generation prompt), as verl renders it."""
    ignored = ("tokenize", "return_dict", "return_tensors")  # verl drops them too: it renders, then tokenizes
    kwargs = {k: v for k, v in dict(chat_template_kwargs or {}).items() if k not in ignored}
    conversations = [_messages(c) for c in conversations]
    if not conversations:
        return []
    texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False, **kwargs)
    return [texts] if isinstance(texts, str) else list(texts)


def token_counts(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Exact token counts of rendered texts (no special tokens added), batched on the fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    counts = np.zeros(len(texts), dtype=np.int64)
    for start in range(0, len(texts), _ROWS_PER_BATCH):
        batch = list(texts[start : start + _ROWS_PER_BATCH])
        if backend is not None:
            encodings = backend.encode_batch(batch, add_special_tokens=False)
            counts[start : start + len(batch)] = [len(e.ids) for e in encodings]
        else:  # a slow (Python) tokenizer
            ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            counts[start : start + len(batch)] = [len(i) for i in ids]
    return counts


def byte_level_bpe(tokenizer) -> bool:
    """True when every token of ``tokenizer`` spans at least one byte (the byte bound of the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE" or backend.pre_tokenizer is None:
        return False
    return _has_byte_level(json.loads(backend.pre_tokenizer.__getstate__()))


def _has_byte_level(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_has_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_byte_level(v) for v in node)
    return False


def _normalized_size(normalizer):
    """UTF-8 size of a text after ``normalizer``; NFC (Qwen's) is checked with ``unicodedata`` first, as
    calling the tokenizer's normalizer on every row costs more than the rest of the bound."""
    if normalizer is None:
        return lambda text: len(text.encode("utf-8"))
    if json.loads(normalizer.__getstate__()).get("type") == "NFC":
        import unicodedata

        def nfc_size(text: str) -> int:
            return len((text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)).encode())

        return nfc_size
    return lambda text: len(normalizer.normalize_str(text).encode("utf-8"))


def overlong_prompts(
    tokenizer, conversations: Sequence[Any], limit: int, chat_template_kwargs: Mapping | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(rows, token_counts, tokenized)`` of the conversations longer than ``limit`` tokens."""
    texts = render_prompts(tokenizer, conversations, chat_template_kwargs)
    candidates = np.arange(len(texts))
    if byte_level_bpe(tokenizer):
        size = _normalized_size(tokenizer.backend_tokenizer.normalizer)
        sizes = np.fromiter((size(t) for t in texts), dtype=np.int64, count=len(texts))
        candidates = np.flatnonzero(sizes > limit)
    counts = token_counts(tokenizer, [texts[i] for i in candidates])
    over = counts > limit
    return candidates[over], counts[over], int(candidates.size)


def scan_prompt_lengths(
    path: str | os.PathLike,
    tokenizer,
    limit: int,
    prompt_key: str = "prompt",
    chat_template_kwargs: Mapping | None = None,
) -> PromptLengths:
    """The prompts of a verl RL parquet file longer than ``limit`` tokens (rows already validated)."""
    import pyarrow.parquet as pq

    parquet_file = pq.ParquetFile(path)
    rows, tokenized, offset = [], 0, 0
    tokens = []
    for batch in parquet_file.iter_batches(batch_size=_ROWS_PER_BATCH * 4, columns=[prompt_key]):
        conversations = batch.column(0).to_pylist()
        over, counts, done = overlong_prompts(tokenizer, conversations, limit, chat_template_kwargs)
        rows.append(over + offset)
        tokens.append(counts)
        tokenized += done
        offset += len(conversations)
    return PromptLengths(
        path=str(path),
        rows=offset,
        limit=int(limit),
        overlong_rows=np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64),
        overlong_tokens=np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64),
        tokenized=tokenized,
    )


def overlong_error(lengths: PromptLengths, limit_key: str, fix: str, shown: int = 5) -> RLDataError:
    """The error naming the file, the first overlong row, its token count and the key to raise."""
    row, count = int(lengths.overlong_rows[0]), int(lengths.overlong_tokens[0])
    others = ", ".join(
        f"{int(r)} ({int(t)})" for r, t in zip(lengths.overlong_rows[1:shown], lengths.overlong_tokens[1:shown])
    )
    more = lengths.num_overlong - 1
    problem = f"prompt is {count} tokens, over {limit_key}={lengths.limit}"
    if more:
        ellipsis = ", ..." if more >= shown else ""
        problem += f"; {more} more of the {lengths.rows} rows are too (rows (tokens): {others}{ellipsis})"
    longest = int(lengths.overlong_tokens.max())
    return RLDataError(lengths.path, row, "prompt", problem, fix.format(longest=longest))


def load_tokenizer(
    path: str, trust_remote_code: bool = False, custom_chat_template: str | None = None, local_files_only: bool = False
):
    """The tokenizer verl's workers use (``HFModelConfig``: ``hf_tokenizer`` plus ``custom_chat_template``);
    ``local_files_only`` never reaches the network (a hub id must then be in the Hugging Face cache)."""
    from verl.utils import hf_tokenizer

    extra = {"local_files_only": True} if local_files_only else {}
    tokenizer = hf_tokenizer(os.path.expanduser(path), trust_remote_code=trust_remote_code, **extra)
    if custom_chat_template is not None:
        tokenizer.chat_template = custom_chat_template
    return tokenizer


def _messages(conversation: Any) -> list[dict]:
    """A row's prompt as a list of plain dicts (parquet may give numpy arrays of structs)."""
    return [dict(message) for message in conversation]


# ----------------------------------------------------------------------------- the start-up rule's counting


def prompt_limit(config: DictConfig) -> tuple[int, str]:
    """The prompt length the rollout enforces and the key that sets it (``rollout.prompt_length`` follows
    ``data.max_prompt_length`` unless overridden; the smaller one cuts)."""
    data_limit = int(OmegaConf.select(config, "data.max_prompt_length"))
    rollout_limit = OmegaConf.select(config, "actor_rollout_ref.rollout.prompt_length")
    if rollout_limit is not None and int(rollout_limit) < data_limit:
        return int(rollout_limit), "actor_rollout_ref.rollout.prompt_length"
    return data_limit, "data.max_prompt_length"


def tokenizer_key(config: DictConfig) -> str:
    """The key that names the tokenizer: ``tokenizer_path`` when set, else the model path."""
    key = "tokenizer_path" if OmegaConf.select(config, "actor_rollout_ref.model.tokenizer_path") else "path"
    return f"actor_rollout_ref.model.{key}"


def tokenizer_path(config: DictConfig) -> str:
    model = OmegaConf.select(config, "actor_rollout_ref.model")
    return str(model.get("tokenizer_path") or model.path)


def prompt_length_problems(config: DictConfig, not_checked: list[str]) -> list[str]:
    """Count every prompt's tokens with the model's tokenizer (``recipe_dapo.data.prompt_length``).

    Over the limit, verl's rollout would keep each prompt's last tokens and cut its question away. Refused,
    naming file, row, token count and key, unless ``data.filter_overlong_prompts=true`` (verl's dataset then
    drops them: counted here) or ``data.truncation=left`` (what the rollout does: counted here).
    """
    problems: list[str] = []
    truncation = str(OmegaConf.select(config, "data.truncation", default="error"))
    filtering = bool(OmegaConf.select(config, "data.filter_overlong_prompts", default=False))
    if truncation not in ("error", "left"):
        problems.append(
            f"data.truncation={truncation}: verl's agent loop only cuts prompts on the left (keeping their last "
            "tokens); set data.truncation=error (refuse overlong prompts at start-up, the default) or left, "
            "or data.filter_overlong_prompts=true (drop them)"
        )
    files = [
        (key, path)
        for key in ("data.train_files", "data.val_files")
        for path in _paths(OmegaConf.select(config, key))
        if os.path.isfile(path)  # a missing file is rule_data_files' problem
    ]
    if not files:
        return problems
    model = OmegaConf.select(config, "actor_rollout_ref.model")
    path = os.path.expanduser(tokenizer_path(config))
    local = os.path.isdir(path)
    try:
        tokenizer = load_tokenizer(
            path, bool(model.get("trust_remote_code", False)), model.get("custom_chat_template"), local_files_only=not local
        )
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad path
        if not local:  # a hub id not in the cache: the check never downloads (verl's workers will)
            not_checked.append(f"{tokenizer_key(config)}: {path} (not a local folder nor in the Hugging Face "
                                      "cache: prompt tokens not counted before start)")
            _logger.warning("prompt tokens not counted at start-up: %s is not a local folder nor cached", path)
            return problems
        problems.append(
            f"actor_rollout_ref.model.path={model.path}: cannot load its tokenizer to count prompt tokens "
            f"({type(exc).__name__}: {exc}); point it (or actor_rollout_ref.model.tokenizer_path) at a model folder"
        )
        return problems
    limit, limit_key = prompt_limit(config)
    prompt_key = str(OmegaConf.select(config, "data.prompt_key", default="prompt"))
    template_kwargs = OmegaConf.select(config, "data.apply_chat_template_kwargs") or {}
    for key, path in files:
        try:
            lengths = scan_prompt_lengths(path, tokenizer, limit, prompt_key, template_kwargs)
        except Exception as exc:  # a row the chat template cannot render (bad rows are also reported above)
            problems.append(f"{key}: {path}: cannot count its prompt tokens ({type(exc).__name__}: {exc})")
            continue
        if not lengths.num_overlong:
            continue
        needed = int(OmegaConf.select(config, "data.train_batch_size")) if key == "data.train_files" else 1
        kept = lengths.rows - lengths.num_overlong
        if filtering and kept >= needed:
            _logger.warning(
                "%s: %s: dropping %d of %d prompts longer than %s=%d tokens (data.filter_overlong_prompts=true)",
                key, path, lengths.num_overlong, lengths.rows, limit_key, limit,
            )
        elif filtering:
            problems.append(
                f"{key}: {path}: only {kept} of {lengths.rows} prompts fit {limit_key}={limit} tokens, fewer than "
                f"the {needed} a step needs after data.filter_overlong_prompts drops the rest; raise {limit_key} "
                f"to {int(lengths.overlong_tokens.max())}"
            )
        elif truncation == "left":
            _logger.warning(
                "%s: %s: %d of %d prompts are longer than %s=%d tokens and will lose their first tokens "
                "(data.truncation=left)", key, path, lengths.num_overlong, lengths.rows, limit_key, limit,
            )
        else:
            fix = (
                f"raise {limit_key} to {{longest}} (the longest prompt), or set data.filter_overlong_prompts=true "
                "to drop these rows (data.truncation=left keeps their last tokens, cutting the question away)"
            )
            problems.append(f"{key}: {overlong_error(lengths, limit_key, fix)}")
    return problems


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]
