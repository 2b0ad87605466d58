"""Inputs for the embedded default run: synthetic math data, a tokenizer and a tiny Qwen2 warmed up on it.

The default run (``bash scripts/run_dapo_cpu.sh``) must need nothing from outside the repository and the
package registries, so it builds its inputs on first use, deterministically from a seed:

- ``train.parquet`` / ``val.parquet``: synthetic problems in verl's RL layout that the real reward path
  ("Answer: <integer>") scores: the default run's chain arithmetic (:mod:`recipe_dapo.cpu.chain_task`), or
  one-digit ``arithmetic`` wrapped in the DAPO prompt template (quicker to build; what the tests train on);
- a tokenizer: the given one (e.g. the Qwen2.5 tokenizer) or, when none is given, a byte-level BPE
  trained on the synthetic data with ``tokenizers`` and a ChatML-style chat template;
- a Qwen2 model sized for two CPU cores (head_dim 32: vLLM-CPU's attention rejects 16), warmed up with
  supervised steps on worked solutions (``TASK_INPUTS``), so that it starts at a mixed accuracy.

``python -m recipe_dapo.cpu.assets --out DIR [--task chain] [--tokenizer PATH]`` prints the three paths as shell
assignments; an existing, complete folder is reused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from recipe_dapo.data.template import apply_dapo_template, is_dapo_templated, strip_dapo_template

logger = logging.getLogger(__name__)

DATA_SOURCE = "synthetic_arithmetic"

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the default model: small enough for 2 cores, head_dim 32 for vLLM-CPU."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 1024
    seed: int = 0
    # Supervised warm-up on worked solutions, so that the policy starts with the answer format and a
    # mixed accuracy: a random model never answers right, and then every group scores the same.
    warmup_steps: int = 150
    warmup_batch_size: int = 32
    warmup_lr: float = 3e-3
    # With a target, the warm-up stops at the first check (every warmup_check_every steps) where responses sampled at
    # temperature 1 to warmup_check_problems held-out problems, up to warmup_check_max_tokens tokens, are right at
    # least that often; warmup_steps is then the most it takes. The starting accuracy is measured, not a property of
    # a step count: over a thousand steps, the CPU's own floating-point kernels take two machines to different models.
    warmup_target_acc: Optional[float] = None
    warmup_check_every: int = 100
    warmup_check_problems: int = 128
    warmup_check_max_tokens: int = 48


CLI_SPEC_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "intermediate_size", "warmup_steps")
"""TinyModelSpec fields settable from the command line (a larger model for a GPU, a longer warm-up)."""


def arithmetic_problem(rng: random.Random) -> tuple[str, int]:
    """One problem with an integer answer: a sum, difference or product of one-digit numbers."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    op = rng.choice("+-*")
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", answer


def worked_solution(problem: str, answer: int) -> str:
    """The response format the warm-up teaches: the expression, its value, and the DAPO answer line."""
    expression = problem.removeprefix("What is ").removesuffix("?")
    return f"{expression} = {answer}\nAnswer: {answer}"


TASKS = ("arithmetic", "chain")
"""The synthetic tasks: ``arithmetic`` (one operation on one-digit numbers, a fixed short answer) and ``chain``
(multi-step chains of one-digit additions and subtractions written out line by line, :mod:`recipe_dapo.cpu.chain_task`:
response lengths that vary several-fold; the default run's task and the learning study's)."""


@dataclass(frozen=True)
class TaskInputs:
    """How many rows of each split a task's inputs hold, and the model warmed up for it."""

    num_train: int = 512
    num_val: int = 32
    num_warmup: int = 0  # 0: warm up on the training rows; else on this many problems of their own
    spec: TinyModelSpec = TinyModelSpec()


TASK_INPUTS = {
    # Quick to build (about 20 s): what the tests train on.
    "arithmetic": TaskInputs(),
    # The default run's and the learning study's inputs: a model 4x the arithmetic one's width, warmed up on 4,096
    # problems of its own until it answers 45% of held-out problems right at temperature 1 (a few minutes on 2 cores,
    # once); 128 validation rows (drawn at random, so a few repeat a problem: 121 distinct in the default build), so
    # that a validation's mean@4 has a standard error of about 0.02.
    "chain": TaskInputs(num_val=128, num_warmup=4096,
                        spec=TinyModelSpec(hidden_size=128, num_attention_heads=4, intermediate_size=256,
                                           warmup_steps=2500, warmup_target_acc=0.45)),
}
"""Each task's inputs as ``python -m recipe_dapo.cpu.assets --task TASK`` builds them (its flags override them)."""


def _problems(num_rows: int, split: str, seed: int, task: str) -> list[tuple[str, int, str]]:
    """``(problem, answer, data_source)`` of each row of ``task``."""
    if task == "arithmetic":
        rng = random.Random(f"{seed}-{split}")
        return [(*arithmetic_problem(rng), DATA_SOURCE) for _ in range(num_rows)]
    if task == "chain":
        from recipe_dapo.cpu import chain_task

        return [(p.text, p.answer, chain_task.DATA_SOURCE) for p in chain_task.problems(num_rows, seed, split)]
    raise ValueError(f"unknown synthetic task {task!r}; expected one of {TASKS}")


def synthetic_rows(num_rows: int, split: str, seed: int, task: str = "arithmetic") -> list[dict]:
    """verl RL rows (data_source, prompt, ability, reward_model, extra_info) of ``task``'s problems."""
    rows = []
    for index, (problem, answer, source) in enumerate(_problems(num_rows, split, seed, task)):
        rows.append(
            {
                "data_source": source,
                # chain: the bare problem, a short prompt (the warm-up teaches the answer line), so that a step
                # on two cores spends its time on the responses
                "prompt": [{"role": "user", "content": problem if task == "chain" else apply_dapo_template(problem)}],
                "ability": "math",
                "reward_model": {"ground_truth": str(answer), "style": "rule"},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


def warmup_solution(problem: str, answer: int, task: str, rng: random.Random) -> str:
    """The supervised target of one warm-up example: the worked solution (for ``chain``, in a style drawn at random,
    so the warmed-up policy starts out writing either)."""
    if task == "chain":
        from recipe_dapo.cpu import chain_task

        return chain_task.solution(chain_task.parse_problem(problem), rng.choice(chain_task.STYLES))
    return worked_solution(problem, answer)


def arithmetic_problem_from_row(row: dict) -> tuple[str, int]:
    content = row["prompt"][0]["content"]
    problem = strip_dapo_template(content) if is_dapo_templated(content) else content
    return problem, int(row["reward_model"]["ground_truth"])


def write_dataset(out_dir: Path, num_train: int, num_val: int, seed: int, task: str = "arithmetic") -> tuple[Path, Path]:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / "train.parquet", out_dir / "val.parquet"
    pd.DataFrame(synthetic_rows(num_train, "train", seed, task)).to_parquet(train)
    pd.DataFrame(synthetic_rows(num_val, "val", seed, task)).to_parquet(val)
    return train, val


def train_bpe_tokenizer(out_dir: Path, texts: list[str], vocab_size: int = 512):
    """A byte-level BPE with ChatML special tokens, saved as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The token ids of a chat prompt as verl builds them (the chat template, then the assistant turn opened)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def sampled_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, seed: int) -> float:
    """Share of ``rows`` (verl RL rows) that one response sampled at temperature 1, cut at ``max_new_tokens``, gets
    right by the recipe's verifier: what the run's first validation (mean@k at temperature 1) will measure."""
    import torch

    from recipe_dapo.reward.verifier import verify

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [prompt_ids(tokenizer, list(row["prompt"])) for row in rows]
    width = max(len(ids) for ids in prompts)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=max_new_tokens, eos_token_id=eos,
                             pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    right = [verify(text, row["reward_model"]["ground_truth"], symbolic_check=False).correct
             for text, row in zip(texts, rows)]
    return sum(right) / len(right)


class WarmupProgress:
    """The build's progress: on a terminal, one line rewritten in place at each update and note (what it writes,
    the tokenizer, each warm-up check, the end), so that the whole build is one line there; anywhere else (a pipe,
    a log file), each note is a log line, and the warm-up's updates a log line at most every ``every_s`` seconds and
    the last one at the end, so that a warm-up of a few minutes prints a few lines, not one per check."""

    def __init__(self, stream=None, every_s: float = 60.0, clock=time.monotonic):
        import sys

        self.stream = sys.stderr if stream is None else stream
        self.every_s, self.clock = every_s, clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_logged: Optional[float] = None
        self._pending: Optional[str] = None
        self._width = 0

    def update(self, text: str) -> None:
        if self.tty:
            import shutil

            text = text[: max(shutil.get_terminal_size().columns - 1, 20)]  # a wrapped line cannot be rewritten
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = max(self._width, len(text))
            return
        now = self.clock()
        if self._last_logged is None or now - self._last_logged >= self.every_s:
            logger.info(text)
            self._last_logged, self._pending = now, None
        else:
            self._pending = text

    def note(self, text: str) -> None:
        """A step of the build: the status line on a terminal, a log line elsewhere."""
        if self.tty:
            self.update(text)
        else:
            self.close()
            logger.info(text)

    def close(self) -> None:
        """End the line (a terminal) or log the last update that was held back (elsewhere)."""
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        elif self._pending:
            logger.info(self._pending)
        self._pending, self._width = None, 0


def warm_up(model, tokenizer, spec: TinyModelSpec, examples: list[tuple[list[dict], str]],
            check_rows: list[dict] = (), progress: Optional[WarmupProgress] = None) -> dict:
    """Supervised fine-tuning on (chat prompt, worked solution) pairs, loss on the answer only; with
    ``spec.warmup_target_acc``, until :func:`sampled_accuracy` on ``check_rows`` reaches it. Returns what it did
    (steps, last loss, the accuracy last measured)."""
    import torch

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sequences = []
    for messages, solution in examples:
        response_ids = tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos]
        sequences.append((prompt_ids(tokenizer, messages), response_ids))
    generator = torch.Generator().manual_seed(spec.seed)
    # On a GPU machine the warm-up of a larger model (e.g. on the Qwen2.5 vocabulary) takes seconds there.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr)
    model.train()
    started, report_every = time.monotonic(), max(spec.warmup_steps // 10, 1)
    checking = spec.warmup_target_acc is not None and len(check_rows) > 0
    accuracy = None
    progress = WarmupProgress() if progress is None else progress
    if checking:  # (on a terminal each check's update says the target and the limit)
        progress.note(f"inputs: warming up the model: supervised steps on {len(examples)} worked solutions until it "
                      f"answers {100 * spec.warmup_target_acc:.0f}% of {len(check_rows)} held-out problems right "
                      f"(checked every {spec.warmup_check_every} steps, at most {spec.warmup_steps} steps)")
    else:
        progress.note(f"inputs: warming up the model: {spec.warmup_steps} supervised steps on {len(examples)} worked "
                      f"solutions")
    for step in range(1, spec.warmup_steps + 1):
        picks = torch.randint(len(sequences), (spec.warmup_batch_size,), generator=generator).tolist()
        width = max(len(sequences[i][0]) + len(sequences[i][1]) for i in picks)
        input_ids = torch.full((len(picks), width), tokenizer.pad_token_id)
        labels = torch.full((len(picks), width), -100)
        attention = torch.zeros((len(picks), width), dtype=torch.long)
        for row, i in enumerate(picks):
            prompt, response_ids = sequences[i]
            ids = prompt + response_ids
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, len(prompt) : len(ids)] = torch.tensor(response_ids)
            attention[row, : len(ids)] = 1
        input_ids, labels, attention = input_ids.to(device), labels.to(device), attention.to(device)
        # Logits only where a label exists: with a 150k-token vocabulary, full-sequence logits dominate.
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        targets = labels[:, 1:]
        answer_positions = targets != -100
        logits = model.lm_head(hidden[:, :-1][answer_positions])
        loss = torch.nn.functional.cross_entropy(logits, targets[answer_positions])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if checking and step % spec.warmup_check_every == 0:
            accuracy = sampled_accuracy(model, tokenizer, list(check_rows), spec.warmup_check_max_tokens,
                                        spec.seed + step)
            progress.update(f"inputs: warm-up step {step} (at most {spec.warmup_steps}), loss {loss.item():.3f}, "
                            f"sampled accuracy {accuracy:.2f} (target {spec.warmup_target_acc:.2f}) "
                            f"({time.monotonic() - started:.0f} s)")
            if accuracy >= spec.warmup_target_acc:
                break
        elif not checking and step % report_every == 0 and step < spec.warmup_steps:  # not a silent warm-up
            progress.update(f"inputs: warm-up step {step}/{spec.warmup_steps}, loss {loss.item():.3f} "
                            f"({time.monotonic() - started:.0f} s)")
    model.to("cpu").eval()
    done = f"inputs: warm-up done, {step} steps in {time.monotonic() - started:.0f} s, last loss {loss.item():.3f}"
    if checking and (accuracy is None or accuracy < spec.warmup_target_acc):
        progress.close()
        logger.warning("inputs: the warm-up stopped at its limit of %d steps with sampled accuracy %s, below the "
                       "target %.2f", spec.warmup_steps, "unmeasured" if accuracy is None else f"{accuracy:.2f}",
                       spec.warmup_target_acc)
        logger.info("%s", done)
    else:
        progress.note(done)  # on a terminal the build's line ends with it
    progress.close()
    return {"steps": step, "loss": round(loss.item(), 4), "sampled_accuracy": accuracy}


def bpe_training_texts(train_file: Path, solutions: list[str] = ()) -> list[str]:
    """The prompts of the training set, every answer line the task can produce, and the given worked solutions."""
    import pandas as pd

    texts = [row[0]["content"] for row in pd.read_parquet(train_file)["prompt"]]
    return texts + [f"{n} = {n}\nAnswer: {n}" for n in range(-100, 101)] + list(solutions)


def tokenizer_as_verl_loads_it(model_dir: Path, tokenizer_path: str | None, train_file: Path,
                               solutions: list[str] = ()):
    """The tokenizer saved into ``model_dir``, reloaded exactly as verl and vLLM will load it.

    verl and vLLM read the tokenizer with ``AutoTokenizer`` from the model folder, and transformers 5 picks
    the class from the model's config there: a fresh ``tokenizers`` BPE comes back as ``Qwen2Tokenizer``,
    which pre-tokenises " 5" as "Ġ" + "5". A warm-up with the in-memory BPE would teach the model token
    ids it never sees in training, so the warm-up uses the reloaded tokenizer.
    """
    from transformers import AutoTokenizer, Qwen2Config

    if tokenizer_path:
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(model_dir)
    else:
        train_bpe_tokenizer(model_dir, bpe_training_texts(train_file, solutions))
    Qwen2Config().save_pretrained(model_dir)  # placeholder until the model is saved: it sets the class
    return AutoTokenizer.from_pretrained(model_dir)


def build_tiny_model(out_dir: Path, tokenizer, spec: TinyModelSpec, warmup_examples=(), check_rows=(),
                     progress: Optional[WarmupProgress] = None) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    warmed = warm_up(model, tokenizer, spec, warmup_examples, check_rows, progress) if spec.warmup_steps > 0 \
        else {"steps": 0}
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards" for a one-file model: a line on the console
    try:
        model.save_pretrained(out_dir)
    finally:
        transformers_logging.enable_progress_bar()
    tokenizer.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    return warmed


def build_default_assets(
    out_dir: str | os.PathLike,
    tokenizer_path: str | None = None,
    num_train: int = 512,
    num_val: int = 32,
    seed: int = 0,
    spec: TinyModelSpec = TinyModelSpec(),
    task: str = "arithmetic",
    num_warmup: int = 0,
) -> dict[str, str]:
    """Build (or reuse) the data, tokenizer and model of the default run; returns their paths.

    The warm-up trains on the training rows' worked solutions, or with ``num_warmup`` > 0 on that many problems of
    their own (split ``warmup``: the same distribution, none of them a training or validation row)."""
    out = Path(out_dir).resolve()
    manifest_path = out / "manifest.json"
    wanted = {
        # Bumped when the build changes, so that folders built by an older version are rebuilt.
        "builder_version": 4,
        "tokenizer_source": str(Path(tokenizer_path).resolve()) if tokenizer_path else "bpe",
        "task": task,
        "num_train": num_train,
        "num_val": num_val,
        "num_warmup": num_warmup,
        "seed": seed,
        "spec": asdict(spec),
    }
    paths = {
        "model_path": str(out / "model"),
        "train_file": str(out / "data" / "train.parquet"),
        "val_file": str(out / "data" / "val.parquet"),
    }
    if manifest_path.exists() and json.loads(manifest_path.read_text()).get("wanted") == wanted:
        logger.info("reusing default-run assets in %s", out)
        return paths

    progress = WarmupProgress()  # on a terminal the build is one line rewritten in place
    progress.note(f"inputs: writing {num_train} training and {num_val} validation rows ({task}) to {out / 'data'}")
    train, _ = write_dataset(out / "data", num_train, num_val, seed, task)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    style_rng = random.Random(f"{seed}-styles")
    warmup_rows = synthetic_rows(num_warmup, "warmup", seed, task) if num_warmup else synthetic_rows(
        num_train, "train", seed, task)
    examples = [
        (list(row["prompt"]), warmup_solution(*arithmetic_problem_from_row(row), task, style_rng))
        for row in warmup_rows
    ]
    # chain: the BPE also learns the solutions' lines (the arithmetic task's answer lines are in its texts already).
    solutions = [text for _, text in examples] if task == "chain" else []
    progress.note("inputs: " + (f"copying the tokenizer from {tokenizer_path}" if tokenizer_path else
                                "training a 512-token BPE tokenizer on the problems and their worked solutions"))
    tokenizer = tokenizer_as_verl_loads_it(model_dir, tokenizer_path, train, solutions)
    check_rows = synthetic_rows(spec.warmup_check_problems, "warmup_check", seed, task) \
        if spec.warmup_target_acc is not None else []
    warmed = build_tiny_model(model_dir, tokenizer, spec, examples, check_rows, progress)
    progress.close()
    manifest_path.write_text(json.dumps({"wanted": wanted, "paths": paths, "warm_up": warmed,
                                         "model_sha256": file_sha256(model_dir / "model.safetensors")}, indent=2))
    return paths


def file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the data, tokenizer and model")
    parser.add_argument("--tokenizer", default=None, help="an existing tokenizer folder (default: train a BPE)")
    parser.add_argument("--task", choices=TASKS, default="arithmetic",
                        help="the synthetic task (see TASKS); its inputs are TASK_INPUTS[task], which the flags below "
                             "override")
    parser.add_argument("--num-train", type=int, default=None)
    parser.add_argument("--num-val", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup", type=int, default=None,
                        help="warm up on this many problems of their own (0: on the training rows)")
    for name in CLI_SPEC_FIELDS:  # --hidden-size, --num-hidden-layers, ... (the model's shape)
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    preset = TASK_INPUTS[args.task]
    spec = replace(preset.spec, **{name: getattr(args, name) for name in CLI_SPEC_FIELDS
                                   if getattr(args, name) is not None})
    paths = build_default_assets(
        args.out, args.tokenizer,
        preset.num_train if args.num_train is None else args.num_train,
        preset.num_val if args.num_val is None else args.num_val,
        args.seed, spec, args.task,
        preset.num_warmup if args.num_warmup is None else args.num_warmup,
    )
    for key, value in paths.items():
        print(f"{key.upper()}={value}")


if __name__ == "__main__":
    main()
