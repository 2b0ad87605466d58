"""Evaluate a model on verl RL parquet files: sample with vLLM, score with the recipe's verifier, report.

    python -m recipe_dapo.evaluation.evaluate --model PATH --data a.parquet [b.parquet ...] \\
        --n 32 --temperature 1.0 --top-p 0.7 --max-response-length 20480 --out DIR

``PATH`` is a Hugging Face model folder or Hub id, or what a run trained: its checkpoints folder
(``trainer.default_local_dir``, e.g. ``runs/dapo_cpu/checkpoints``: the latest checkpoint), a ``global_step_N``
folder or its ``actor`` folder, read from the Hugging Face copy verl saves there (``huggingface/``, with
``hf_model`` in ``actor_rollout_ref.actor.checkpoint.save_contents``); a checkpoint without it must first be merged
with ``python -m verl.model_merger merge --backend fsdp --local_dir .../actor --target_dir MERGED``. The paper's
AIME setting is the 30-problem file with ``--n 32 --temperature 1.0 --top-p 0.7`` (or the 960-row file
with ``--n 1``: both report the same mean@32, see ``metrics``). Everything is checked (arguments, every
data row, prompt lengths, the verifier import) before vLLM starts. Output layout: see ``report``.

**Counts.** A file's *rows* are its lines; a *problem* is a distinct prompt (rows that repeat one, as the 960-row
AIME file does, add their responses to it: the metrics group by problem); a *response* is one sample of the model,
``--n`` per row. Each file's figures are said once, before vLLM starts, with why rows are left out or pooled
(:class:`FileCounts`); the same figures head its result table and fill ``report.json``, and the progress bars count
responses.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from recipe_dapo.data.validation import RLDataError, validate_rl_parquet
from recipe_dapo.evaluation.metrics import per_source_metrics, problem_ids_from_prompts
from recipe_dapo.evaluation.report import dataset_markdown, metrics_table, unique_names, write_json, write_jsonl

logger = logging.getLogger("recipe_dapo.evaluation")


@dataclass(frozen=True)
class EvalRow:
    """One problem of a data file, as the evaluation needs it."""

    data_source: str
    messages: list[dict[str, str]]
    ground_truth: str
    extra_info: dict[str, Any] | None


@dataclass(frozen=True)
class EvalDataset:
    name: str
    path: str
    rows: list[EvalRow]
    rows_in_file: int
    """The file's rows before ``--max-rows``."""


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


@dataclass(frozen=True)
class FileCounts:
    """What one data file gives the evaluation, in the words every output uses (module docstring): rows, problems,
    responses. ``figures()`` heads the result table; ``said_once()``, the console's line before vLLM starts, adds why
    rows are left out (``--max-rows``) or pooled (a repeated problem)."""

    rows_in_file: int
    rows: int
    problems: int
    responses_per_row: int

    @property
    def responses(self) -> int:
        return self.rows * self.responses_per_row

    @property
    def repeated_rows(self) -> int:
        return self.rows - self.problems

    def figures(self) -> str:
        """``128 rows x 4 responses = 512 responses, 121 problems`` (``32 problems x 4 responses = 128 responses``
        when no row repeats a problem)."""
        unit = "problem" if self.repeated_rows == 0 else "row"
        text = (f"{_count(self.rows, unit)} x {_count(self.responses_per_row, 'response')} = "
                f"{_count(self.responses, 'response')}")
        return text if self.repeated_rows == 0 else f"{text}, {_count(self.problems, 'problem')}"

    def said_once(self) -> str:
        """:meth:`figures`, then the file's rows that are left out or pooled, with how many and why."""
        reasons = []
        if self.rows < self.rows_in_file:
            reasons.append(f"the first {self.rows} of the file's {self.rows_in_file} rows (--max-rows)")
        if self.repeated_rows:
            repeat = "repeats" if self.repeated_rows == 1 else "repeat"
            reasons.append(f"{_count(self.repeated_rows, 'row')} {repeat} the problem of an earlier row, and the "
                           "metrics pool each problem's responses")
        return self.figures() + "".join(f"; {reason}" for reason in reasons)

    def as_report(self) -> dict[str, int]:
        return {"rows_in_file": self.rows_in_file, "rows": self.rows, "problems": self.problems,
                "responses_per_row": self.responses_per_row, "responses": self.responses}


def problem_indices(dataset: EvalDataset) -> list[int]:
    """Each row's problem, numbered in order of first appearance: rows with one data source and prompt text are one
    problem, as the metrics group them (``metrics.problem_ids_from_prompts``)."""
    if not dataset.rows:
        return []
    ids = problem_ids_from_prompts([row.data_source for row in dataset.rows], [row.messages for row in dataset.rows])
    numbers: dict[str, int] = {}
    return [numbers.setdefault(problem_id, len(numbers)) for problem_id in ids.tolist()]


def file_counts(dataset: EvalDataset, responses_per_row: int) -> FileCounts:
    """``dataset``'s :class:`FileCounts` at ``responses_per_row`` (``--n``)."""
    return FileCounts(dataset.rows_in_file, len(dataset.rows), len(set(problem_indices(dataset))), responses_per_row)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recipe_dapo.evaluation.evaluate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True,
                        help="Hugging Face model folder or Hub id, or a run's checkpoints folder (its latest model)")
    parser.add_argument("--tokenizer", help="tokenizer folder or id (default: --model)")
    parser.add_argument("--data", required=True, nargs="+", help="verl RL parquet files")
    parser.add_argument("--n", type=int, default=1, help="responses per row (paper, AIME 30-row file: 32)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.7)
    parser.add_argument("--max-response-length", type=int, required=True, help="tokens per response (paper: 20480)")
    parser.add_argument("--max-prompt-length", type=int, help="refuse prompts longer than this many tokens")
    parser.add_argument("--out", required=True, help="output folder (report.json, <data>.md, generations)")
    parser.add_argument("--max-rows", type=int, help="evaluate only the first rows of each file (smoke tests)")
    parser.add_argument("--dtype", default="auto", help="vLLM dtype: auto, bfloat16, float16, float32")
    parser.add_argument("--seed", type=int, default=0, help="vLLM engine seed")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument(
        "--kv-cache-gib", type=float, help="KV-cache size in GiB (default on CPU: sized for the samples in flight)"
    )
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (always on for CPU)")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse impossible settings, naming the flag."""
    rules = [
        (args.n >= 1, "--n must be >= 1"),
        (args.temperature >= 0, "--temperature must be >= 0"),
        (0 < args.top_p <= 1, "--top-p must be in (0, 1]"),
        (args.max_response_length >= 1, "--max-response-length must be >= 1"),
        (args.max_prompt_length is None or args.max_prompt_length >= 1, "--max-prompt-length must be >= 1"),
        (args.max_rows is None or args.max_rows >= 1, "--max-rows must be >= 1"),
        (args.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
        (0 < args.gpu_memory_utilization <= 1, "--gpu-memory-utilization must be in (0, 1]"),
        (args.kv_cache_gib is None or args.kv_cache_gib > 0, "--kv-cache-gib must be > 0"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)
    args.model = resolve_model_path(args.model)


def trained_model_folder(folder: str) -> str | None:
    """The Hugging Face folder a verl checkpoint holds, when ``folder`` is one: the checkpoints folder of a run
    (``trainer.default_local_dir``: its latest checkpoint, as ``latest_checkpointed_iteration.txt`` names it), a
    ``global_step_N`` folder or its ``actor`` folder -> ``.../actor/huggingface``. None for any other folder."""
    tracker = os.path.join(folder, "latest_checkpointed_iteration.txt")
    if os.path.isfile(tracker):
        with open(tracker, encoding="utf-8") as handle:
            folder = os.path.join(folder, f"global_step_{handle.read().strip()}")
    if os.path.isdir(os.path.join(folder, "actor")):
        folder = os.path.join(folder, "actor")
    hf_folder = os.path.join(folder, "huggingface")
    return hf_folder if os.path.isdir(hf_folder) else None


def resolve_model_path(model: str) -> str:
    """``model``, or the Hugging Face model inside it when it is a verl checkpoint (:func:`trained_model_folder`),
    checked: a folder must hold a config and weights; an unmerged checkpoint gets the command that merges it."""
    expanded = os.path.expanduser(model)
    hf_folder = trained_model_folder(expanded) if os.path.isdir(expanded) else None
    if hf_folder is not None:
        weights = glob.glob(os.path.join(hf_folder, "*.safetensors")) + glob.glob(os.path.join(hf_folder, "*.bin"))
        if not weights:
            actor = os.path.dirname(hf_folder)
            raise ValueError(
                f"--model {model}: the checkpoint {actor} was saved without its Hugging Face weights; "
                + merge_advice(actor)
                + " (or train with actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model])"
            )
        logger.info("--model %s: the trained model in %s", model, hf_folder)
        return hf_folder
    check_model_path(model)
    return model


def merge_problems(actor: str) -> list[str]:
    """What verl's FSDP merger (``python -m verl.model_merger merge --backend fsdp``) needs from the checkpoint folder
    ``actor`` and does not find, one line each: ``fsdp_config.json`` with the world size, every rank's
    ``model_world_size_<W>_rank_<r>.pt`` whole (its index, and every record against its CRC: the merger's own error for a
    damaged shard names no file), and the Hugging Face config in ``huggingface/``."""
    from recipe_dapo.run.checkpoint_records import verify_files

    config_path = os.path.join(actor, "fsdp_config.json")
    try:
        with open(config_path, encoding="utf-8") as handle:
            world_size = int(json.load(handle)["world_size"])
    except FileNotFoundError:
        return [f"{config_path} is missing (verl writes it with the shards; a checkpoint without it is half-written)"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"{config_path} has no world size ({type(error).__name__}: {error})"]
    problems = []
    shards = [os.path.join(actor, f"model_world_size_{world_size}_rank_{rank}.pt") for rank in range(world_size)]
    missing = [path for path in shards if not os.path.isfile(path)]
    if missing:
        problems.append(f"{len(missing)} of the {world_size} model shards are missing (first: {missing[0]})")
    found = verify_files([(path, False) for path in shards if path not in missing])
    problems.extend(f"{path} {problem}" for path, problem in found.items())
    if not os.path.isfile(os.path.join(actor, "huggingface", "config.json")):
        problems.append(f"{os.path.join(actor, 'huggingface', 'config.json')} is missing (the merger reads the model's "
                        "architecture from it)")
    return problems


def merge_advice(actor: str) -> str:
    """The command that merges the checkpoint folder ``actor`` into a Hugging Face model, when its inputs are whole;
    else what is missing, and the previous checkpoint of the run that can be merged, if any."""
    command = "python -m verl.model_merger merge --backend fsdp --local_dir {0} --target_dir {0}_merged"
    problems = merge_problems(actor)
    if not problems:
        return "merge it: " + command.format(actor)
    step_folder = os.path.dirname(actor) if os.path.basename(actor) == "actor" else actor
    match = re.fullmatch(r"global_step_(\d+)", os.path.basename(step_folder))
    offer = "no earlier checkpoint of the run can be merged"
    if match:
        for name in sorted(os.listdir(os.path.dirname(step_folder)), key=_step_number, reverse=True):
            number = _step_number(name)
            earlier = os.path.join(os.path.dirname(step_folder), name, "actor")
            if 0 <= number < int(match.group(1)) and os.path.isdir(earlier) and not merge_problems(earlier):
                offer = f"the previous checkpoint that can be merged is {earlier}: " + command.format(earlier)
                break
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"it cannot be merged: {problems[0]}{more}; {offer}"


def _step_number(name: str) -> int:
    match = re.fullmatch(r"global_step_(\d+)", name)
    return int(match.group(1)) if match else -1


def check_model_path(model: str) -> None:
    """A local model folder must hold a Hugging Face config; an unmerged verl checkpoint gets the merge command."""
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        if os.path.isfile(os.path.join(expanded, "config.json")):
            return
        if glob.glob(os.path.join(expanded, "model_world_size_*_rank_*.pt")):
            raise ValueError(f"--model {model} is a verl FSDP checkpoint; " + merge_advice(expanded.rstrip("/")))
        raise ValueError(f"--model {model} has no config.json: give a Hugging Face model folder")
    if os.path.exists(expanded) or model.startswith(("/", "./", "../", "~")):
        raise ValueError(f"--model {model}: no such model folder")
    logger.info("--model %s is not a local folder; vLLM will fetch it from the Hugging Face Hub", model)


def load_eval_dataset(path: str, name: str, max_rows: int | None) -> EvalDataset:
    """Validate every row of ``path`` (raises ``RLDataError``), then keep the first ``max_rows``."""
    import pandas as pd

    validate_rl_parquet(path)
    frame = pd.read_parquet(path)
    rows_in_file = len(frame)
    if max_rows is not None:
        frame = frame.head(max_rows)
    rows = []
    for record in frame.to_dict(orient="records"):
        extra_info = record.get("extra_info")
        rows.append(
            EvalRow(
                data_source=str(record["data_source"]),
                messages=[{"role": str(m["role"]), "content": str(m["content"])} for m in record["prompt"]],
                ground_truth=str(record["reward_model"]["ground_truth"]),
                extra_info=dict(extra_info) if isinstance(extra_info, Mapping) else None,
            )
        )
    return EvalDataset(name, path, rows, rows_in_file)


def chat_prompt_ids(tokenizer, dataset: EvalDataset, max_prompt_length: int | None) -> list[list[int]]:
    """Chat-templated prompt token ids; a prompt over ``max_prompt_length`` is an error naming its row."""
    prompt_ids = []
    for row_index, row in enumerate(dataset.rows):
        text = tokenizer.apply_chat_template(row.messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            raise RLDataError(
                dataset.path,
                row_index,
                "prompt",
                f"prompt is {len(ids)} tokens, over --max-prompt-length {max_prompt_length}",
                "raise --max-prompt-length or drop the row",
            )
        prompt_ids.append(ids)
    return prompt_ids


def score_dataset(dataset: EvalDataset, completions: Sequence[Sequence[Any]], compute_score) -> list[dict[str, Any]]:
    """One record per response (fields in ``report``), rows in order, a row's responses in order."""
    from recipe_dapo.evaluation.scoring import score_response

    samples = []
    problems = problem_indices(dataset)
    progress = tqdm(total=sum(len(c) for c in completions), desc=f"score {dataset.name}", unit="response")
    for row_index, (row, row_completions) in enumerate(zip(dataset.rows, completions)):
        for response_index, completion in enumerate(row_completions):
            verdict = score_response(compute_score, row.data_source, completion.text, row.ground_truth, row.extra_info)
            samples.append(
                {
                    "row": row_index,
                    "problem": problems[row_index],
                    "response_index": response_index,
                    "data_source": row.data_source,
                    "prompt": row.messages,
                    "ground_truth": row.ground_truth,
                    "response": completion.text,
                    "score": verdict.score,
                    "acc": verdict.acc,
                    "pred": verdict.pred,
                    "num_tokens": completion.num_tokens,
                    "truncated": completion.truncated,
                }
            )
            progress.update()
    progress.close()
    return samples


def dataset_metrics(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per-data-source metrics of scored samples; maj@k only when the verifier extracted answers."""
    data_sources = [s["data_source"] for s in samples]
    preds = [s["pred"] for s in samples]
    return per_source_metrics(
        data_sources=data_sources,
        prompt_ids=problem_ids_from_prompts(data_sources, [s["prompt"] for s in samples]),
        acc=[s["acc"] for s in samples],
        preds=preds if any(p is not None for p in preds) else None,
        response_lengths=[s["num_tokens"] for s in samples],
        truncated=[s["truncated"] for s in samples],
    )


@dataclass(frozen=True)
class PreparedEvaluation:
    """Everything checked and tokenized; only generation is left."""

    args: argparse.Namespace
    datasets: list[EvalDataset]
    prompt_ids: list[list[list[int]]]
    compute_score: Any
    tokenizer_path: str


def prepare(args: argparse.Namespace) -> PreparedEvaluation:
    """Every check that can fail before vLLM starts: arguments, rows, verifier import, prompt lengths."""
    from transformers import AutoTokenizer

    from recipe_dapo.evaluation.scoring import load_compute_score

    check_arguments(args)
    datasets = [load_eval_dataset(path, name, args.max_rows) for path, name in zip(args.data, unique_names(args.data))]
    compute_score = load_compute_score()
    tokenizer_path = args.tokenizer or args.model
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    prompt_ids = [chat_prompt_ids(tokenizer, dataset, args.max_prompt_length) for dataset in datasets]
    return PreparedEvaluation(args, datasets, prompt_ids, compute_score, tokenizer_path)


def run(prepared: PreparedEvaluation) -> dict[str, Any]:
    """Generate, score and write the report (layout in ``report``); returns the report dict."""
    from recipe_dapo.evaluation.generation import EngineSettings, close_engine, generate, make_engine

    args, datasets = prepared.args, prepared.datasets
    started = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    longest_prompt = max(len(ids) for dataset_ids in prepared.prompt_ids for ids in dataset_ids)
    engine = make_engine(
        EngineSettings(
            model=args.model,
            tokenizer=prepared.tokenizer_path,
            max_model_len=(args.max_prompt_length or longest_prompt) + args.max_response_length,
            dtype=args.dtype,
            seed=args.seed,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_gib=args.kv_cache_gib,
            enforce_eager=args.enforce_eager,
            sequences=sum(len(dataset.rows) for dataset in datasets) * args.n,
        )
    )
    engine_ready = time.monotonic()
    # One generate call for all files: the engine batches across data sets.
    flat_prompts = [ids for dataset_ids in prepared.prompt_ids for ids in dataset_ids]
    try:
        flat_completions = generate(engine, flat_prompts, args.n, args.temperature, args.top_p,
                                    args.max_response_length)
    finally:
        close_engine(engine)
    generated = time.monotonic()

    settings = dict(vars(args))
    report: dict[str, Any] = {"settings": settings, "datasets": {}}
    offset = 0
    for dataset in datasets:
        completions = flat_completions[offset : offset + len(dataset.rows)]
        offset += len(dataset.rows)
        samples = score_dataset(dataset, completions, prepared.compute_score)
        per_source = dataset_metrics(samples)
        counts = file_counts(dataset, args.n)
        report["datasets"][dataset.name] = {"file": dataset.path, **counts.as_report(), "metrics": per_source}
        with open(os.path.join(args.out, f"{dataset.name}.md"), "w", encoding="utf-8") as handle:
            handle.write(dataset_markdown(dataset.name, dataset.path, settings, per_source, counts.said_once()))
        # The prompt is the data file's row `row`; repeating it on every sample would multiply the file size.
        written = ({key: value for key, value in sample.items() if key != "prompt"} for sample in samples)
        write_jsonl(os.path.join(args.out, f"{dataset.name}.generations.jsonl"), written)
    finished = time.monotonic()
    report["elapsed_s"] = {
        "engine_start": round(engine_ready - started, 2),
        "generation": round(generated - engine_ready, 2),
        "scoring_and_report": round(finished - generated, 2),
    }
    write_json(os.path.join(args.out, "report.json"), report)
    return report


LOG_FILE = "evaluation.log"
"""Every line of vLLM's output goes here, in ``--out``, when the console is filtered (``python -m``)."""


def _console_logging() -> None:
    """The recipe's log lines as console lines (message only, marked for the console filter); the rest WARNING+."""
    from recipe_dapo.tracking.noise import RecipeLineFormatter

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    recipe = logging.getLogger("recipe_dapo")
    if not any(getattr(handler, "_recipe_dapo_console", False) for handler in recipe.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(RecipeLineFormatter())
        handler._recipe_dapo_console = True
        recipe.addHandler(handler)
    recipe.setLevel(logging.INFO)
    recipe.propagate = False


def main(argv: Sequence[str] | None = None, quiet_console: bool = False) -> int:
    """The command line. With ``quiet_console`` (``python -m``), once the arguments parse (``--help`` prints as
    argparse does), the console shows the recipe's lines, warnings, errors and progress bars, and every line of vLLM
    goes to ``--out``/evaluation.log (``DAPO_CONSOLE_FILTER=0``: all on the console)."""
    from recipe_dapo.tracking.noise import attach_log_path, install_console_filter, recipe_line

    args = build_parser().parse_args(argv)
    if quiet_console:  # before vLLM is imported; its engine processes write to the descriptors
        install_console_filter(argv=[], child_processes=True)
    _console_logging()
    try:
        prepared = prepare(args)
    except (RLDataError, ValueError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    attach_log_path(os.path.join(args.out, LOG_FILE), what="vLLM")
    logger.info("evaluating %s", args.model)
    for dataset in prepared.datasets:
        logger.info("%s: %s", dataset.name, file_counts(dataset, args.n).said_once())
    report = run(prepared)
    for dataset in prepared.datasets:
        name, entry = dataset.name, report["datasets"][dataset.name]
        print(recipe_line(f"\n## {name}: {file_counts(dataset, args.n).figures()}\n"))
        print(recipe_line(metrics_table(entry["metrics"]).rstrip("\n")))
    print(recipe_line(f"\nreport: {os.path.join(args.out, 'report.json')}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(quiet_console=True))
