"""The evaluation command's console is as quiet as training's: its own lines, warnings and errors that need the user,
progress bars and the result tables; every line of vLLM (whose engine runs in a process of its own, writing to the
file descriptors) goes to ``--out``/evaluation.log.

vLLM itself is replaced by a child process that prints what vLLM's engine process printed in a real CPU evaluation
(``python -m recipe_dapo.evaluation.evaluate --model <tiny Qwen2> --data aime-2024.parquet --n 2 --max-rows 2``), so
the test takes seconds; the module runs as ``python -m`` does (its ``__main__`` block).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from recipe_dapo.data import apply_dapo_template

REPO_ROOT = Path(__file__).resolve().parents[1]

# What vLLM's engine processes printed in the real evaluation (descriptor 1 or 2, line).
VLLM_LINES = [
    (1, "(EngineCore pid=15226) INFO 11-25 18:38:46 [core.py:129] Initializing a V1 LLM engine (v0.31.0) with "
        "config: model='/tmp/nc/tiny', speculative_config=None"),
    (1, "(EngineCore pid=15226) INFO 11-25 18:38:46 [ompmultiprocessing.py:185] OpenMP thread binding info: "),
    (2, "Triton is installed, but `triton.backends` could not be imported. Disabling Triton."),
    (1, "(VllmWorker-0 pid=15421) WARNING 11-25 18:39:16 [indexer_topk.py:35] Failed to import the DeepSelect "
        "extension (vllm._deepselect_C): No module named 'vllm._deepselect_C'"),
    (2, "[W1125 18:39:18.252108810 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation "
        "on the NUMA nodes (0)."),
    (1, "(Worker pid=15421) WARNING 11-25 18:39:18 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For "
        "best performance, please follow the section `set LD_PRELOAD`"),
    (1, "(Worker pid=15421) INFO 11-25 18:39:18 [cpu_model_runner.py:69] Starting to load model /tmp/nc/tiny..."),
    (1, "(EngineCore pid=15226) WARNING 11-25 18:39:25 [cpu.py:207] Triton is not installed. triton-cpu is expected "
        "on x86 CPUs."),
    (2, "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  9.69it/s]"),
    (1, "(MainProcess pid=16428) WARNING 11-25 18:44:09 [utils.py:663] [shutdown] Process manager: force killing "
        "remaining process EngineCore pid 16920"),
]

SCRIPT = r'''
import json, runpy, subprocess, sys
import transformers
from recipe_dapo.evaluation import generation

class Tokenizer:  # stands in for the model's tokenizer: no files needed
    @classmethod
    def from_pretrained(cls, path):
        return cls()
    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return messages[-1]["content"]
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}

def make_engine(settings):  # vLLM's engine process: a child writing to the descriptors
    code = "import os, sys, json\nfor fd, line in json.loads(sys.argv[1]): os.write(fd, (line + '\\n').encode())"
    subprocess.run([sys.executable, "-c", code, json.dumps(LINES)], check=True)
    return object()

def generate(llm, prompts, n, temperature, top_p, max_tokens):
    return [[generation.Completion("Answer: 2", 3, False) for _ in range(n)] for _ in prompts]

LINES = json.loads(sys.argv[1])
transformers.AutoTokenizer = Tokenizer
generation.make_engine, generation.generate = make_engine, generate
sys.argv = ["evaluate", *sys.argv[2:]]
runpy.run_module("recipe_dapo.evaluation.evaluate", run_name="__main__", alter_sys=True)
'''


def evaluate_as_a_user_would(tmp_path, **env):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "toy.parquet"
    pd.DataFrame([{"data_source": "toy", "prompt": [{"role": "user", "content": apply_dapo_template("1 + 1?")}],
                   "reward_model": {"ground_truth": "2", "style": "rule"}}]).to_parquet(data, index=False)
    out = tmp_path / "eval"
    args = ["--model", str(model), "--data", str(data), "--n", "2", "--max-response-length", "8", "--out", str(out)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DAPO_")}
    # this checkout's recipe, whatever the editable install points to
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    completed = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(VLLM_LINES), *args], capture_output=True,
                               text=True, timeout=300, env={**environment, **env}, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    return completed, out


def test_the_evaluation_console_shows_its_own_lines_and_keeps_vllms_in_the_log_file(tmp_path):
    completed, out = evaluate_as_a_user_would(tmp_path)
    log = out / "evaluation.log"
    console = [line for line in completed.stdout.splitlines() if line.strip()]
    assert console[0] == f"log file: {log}: every line of vLLM (DAPO_CONSOLE_FILTER=0 shows them here)"
    assert console[1] == f"evaluating {tmp_path / 'model'}"
    assert console[2] == "toy: 1 problem x 2 responses = 2 responses"
    assert "## toy: 1 problem x 2 responses = 2 responses" in console and "| mean@2 | 1.0000 |" in console
    assert console[-2] == f"report: {out / 'report.json'}"
    assert console[-1].startswith(f"log file: {log} (") and "not shown here" in console[-1]
    # Nothing of the engine process on the console (its warnings here are known noise), all of it in the log file.
    shown = completed.stdout + completed.stderr
    logged = log.read_text()
    for _, line in VLLM_LINES:
        assert line not in shown, line
        assert line in logged, line
    assert json.loads((out / "report.json").read_text())["datasets"]["toy"]["metrics"]["toy"]["mean@2"] == 1.0


def test_with_the_filter_off_the_engine_process_lines_reach_the_console(tmp_path):
    completed, _ = evaluate_as_a_user_would(tmp_path, DAPO_CONSOLE_FILTER="0")
    shown = completed.stdout + completed.stderr
    assert all(line in shown for _, line in VLLM_LINES)


def test_an_engine_error_reaches_the_console(tmp_path, monkeypatch):
    error = "(EngineCore pid=15226) ERROR 11-25 18:39:25 [core.py:1] EngineCore failed to start."
    monkeypatch.setattr(sys.modules[__name__], "VLLM_LINES", VLLM_LINES + [(2, error)])
    completed, _ = evaluate_as_a_user_would(tmp_path)
    assert error in completed.stderr


def test_the_model_a_run_trained_is_found_from_its_checkpoints_folder(tmp_path):
    """``--model runs/dapo_cpu/checkpoints`` evaluates the latest checkpoint's Hugging Face copy (verl's layout:
    ``global_step_N/actor/huggingface``); a checkpoint saved without it gets the command that merges it."""
    from recipe_dapo.evaluation.evaluate import resolve_model_path

    checkpoints = tmp_path / "checkpoints"
    for step in (2, 4):
        hf = checkpoints / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
    (checkpoints / "global_step_4" / "actor" / "huggingface" / "model.safetensors").write_bytes(b"")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("4")
    latest = str(checkpoints / "global_step_4" / "actor" / "huggingface")
    assert resolve_model_path(str(checkpoints)) == latest
    assert resolve_model_path(str(checkpoints / "global_step_4")) == latest
    assert resolve_model_path(str(checkpoints / "global_step_4" / "actor")) == latest
    assert resolve_model_path(latest) == latest  # a Hugging Face folder as it is
    write_merge_inputs(checkpoints / "global_step_2" / "actor")
    with pytest.raises(ValueError, match=r"saved without its Hugging Face weights; merge it: python -m "
                                         r"verl.model_merger merge --backend fsdp --local_dir .*global_step_2/actor"):
        resolve_model_path(str(checkpoints / "global_step_2"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def write_merge_inputs(actor, world_size: int = 2) -> None:
    """What verl's FSDP checkpoint manager writes and its merger reads: the world size, every rank's model shard, the
    Hugging Face config."""
    import torch

    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    (actor / "huggingface" / "config.json").write_text("{}")
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world_size}))
    for rank in range(world_size):
        torch.save({"w": torch.ones(4096)}, actor / f"model_world_size_{world_size}_rank_{rank}.pt")


@pytest.mark.parametrize("damage", ["a shard missing", "a shard damaged inside", "no world size"])
def test_a_half_written_checkpoint_gets_what_is_missing_and_the_previous_one_that_merges(tmp_path, damage):
    """verl's merger on a half-written checkpoint fails without naming the file: the advice names it instead, and
    offers the previous checkpoint whose merge works."""
    from recipe_dapo.evaluation.evaluate import resolve_model_path

    checkpoints = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        write_merge_inputs(checkpoints / f"global_step_{step}" / "actor")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("6")
    latest, previous = checkpoints / "global_step_6" / "actor", checkpoints / "global_step_4" / "actor"
    with pytest.raises(ValueError, match=rf"merge it: python -m verl.model_merger merge --backend fsdp --local_dir "
                                         rf"{latest} --target_dir {latest}_merged"):
        resolve_model_path(str(checkpoints))  # positive control: whole, the merge command
    if damage == "a shard missing":
        (latest / "model_world_size_2_rank_1.pt").unlink()
        named = f"1 of the 2 model shards are missing (first: {latest}/model_world_size_2_rank_1.pt)"
    elif damage == "a shard damaged inside":
        shard = latest / "model_world_size_2_rank_0.pt"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2: len(data) // 2 + 4096] = b"\xff" * 4096
        shard.write_bytes(bytes(data))
        named = f"{latest}/model_world_size_2_rank_0.pt is corrupt: record"
    else:
        (latest / "fsdp_config.json").write_text("{}")
        named = f"{latest}/fsdp_config.json has no world size"
    with pytest.raises(ValueError) as refused:
        resolve_model_path(str(checkpoints))
    message = str(refused.value)
    assert "it cannot be merged: " + named in message
    assert (f"the previous checkpoint that can be merged is {previous}: python -m verl.model_merger merge --backend "
            f"fsdp --local_dir {previous} --target_dir {previous}_merged") in message
