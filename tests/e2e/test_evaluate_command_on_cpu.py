"""``python -m recipe_dapo.evaluation.evaluate`` end to end on CPU, and its checks before vLLM starts.

The model is a randomly initialised 2-layer Qwen2 (hidden 64, 2 heads -> head_dim 32, which vLLM-CPU
attention accepts) with the real Qwen2.5 tokenizer from the shared data folder, so prompts and chat
templates are tokenized as in a real run. Its answers are noise: the scores are near zero, and the test
checks the pipeline (report, tables, generations, consistency of the metrics with the samples). The
end-to-end test starts vLLM once (about 30-90 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recipe_dapo.data import RLDataError, apply_dapo_template, convert_dataset
from recipe_dapo.evaluation import evaluate, generation

from conftest import SHARED  # noqa: E402
MAX_RESPONSE_LENGTH = 12

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(SHARED is None, reason="shared data not found at ../shared/data or $SHARED_DATA_DIR"),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(SHARED / "qwen2.5-tokenizer")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model_dir = tmp_path_factory.mktemp("tiny_qwen2")
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def bad_parquet(path: Path) -> Path:
    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": apply_dapo_template(problem)}],
            "reward_model": {"ground_truth": answer, "style": "rule"},
        }
        for problem, answer in (("1+1?", "2"), ("2+2?", ""))
    ]
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def evaluate_args(model: Path, data: list[Path], out: Path, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--data",
        *map(str, data),
        "--n",
        "2",
        "--temperature",
        "1.0",
        "--top-p",
        "0.7",
        "--max-response-length",
        str(MAX_RESPONSE_LENGTH),
        "--dtype",
        "float32",
        "--out",
        str(out),
        *extra,
    ]


def no_engine(*_args, **_kwargs):
    raise AssertionError("vLLM must not start when the inputs are bad")


def test_bad_row_is_reported_before_the_engine_starts(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generation, "make_engine", no_engine)
    data = bad_parquet(tmp_path / "bad.parquet")

    assert evaluate.main(evaluate_args(tiny_model, [data], tmp_path / "out")) == 2

    error = capsys.readouterr().err
    assert f"{data}, row 1, field 'reward_model.ground_truth': ground truth is empty" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flag, value, message",
    [("--top-p", "0", "--top-p must be in (0, 1]"), ("--n", "0", "--n must be >= 1")],
)
def test_impossible_sampling_settings_are_refused_naming_the_flag(
    tiny_model, tmp_path, capsys, monkeypatch, flag, value, message
):
    monkeypatch.setattr(generation, "make_engine", no_engine)
    args = evaluate_args(tiny_model, [SHARED / "eval" / "aime-2024.parquet"], tmp_path / "out", flag, value)

    assert evaluate.main(args) == 2
    assert message in capsys.readouterr().err


def test_prompt_longer_than_the_limit_names_its_row(tiny_model, tmp_path):
    args = evaluate.build_parser().parse_args(
        evaluate_args(
            tiny_model, [SHARED / "eval" / "aime-2024.parquet"], tmp_path / "out", "--max-prompt-length", "20"
        )
    )

    with pytest.raises(RLDataError, match=r"row 0, field 'prompt': prompt is \d+ tokens, over --max-prompt-length 20"):
        evaluate.prepare(args)


def test_unmerged_verl_checkpoint_is_refused_with_the_merge_command(tmp_path):
    import torch

    checkpoint = tmp_path / "global_step_10" / "actor"
    (checkpoint / "huggingface").mkdir(parents=True)
    (checkpoint / "huggingface" / "config.json").write_text("{}")
    (checkpoint / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    torch.save({"w": torch.ones(4)}, checkpoint / "model_world_size_1_rank_0.pt")

    with pytest.raises(ValueError, match="merge it: python -m verl.model_merger merge --backend fsdp"):
        evaluate.check_model_path(str(checkpoint))
    (checkpoint / "model_world_size_1_rank_0.pt").write_bytes(b"")  # half-written: the advice names what is missing
    with pytest.raises(ValueError, match=rf"it cannot be merged: {checkpoint}/model_world_size_1_rank_0.pt is "
                                         "truncated or corrupt .*; no earlier checkpoint of the run can be merged"):
        evaluate.check_model_path(str(checkpoint))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluation_command_writes_its_report_tables_and_generations_on_cpu(tiny_model, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e .[cpu] on a CPU machine)")
    gsm8k = convert_dataset("gsm8k", tmp_path / "data", local_dir=str(SHARED), progress=False).output_path
    aime = SHARED / "eval" / "aime-2024.parquet"
    out = tmp_path / "eval"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")

    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipe_dapo.evaluation.evaluate",
            *evaluate_args(tiny_model, [aime, Path(gsm8k)], out, "--max-rows", "2"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["datasets"]) == {"aime-2024", "gsm8k"}
    for name, data_source in (("aime-2024", "aime24"), ("gsm8k", "gsm8k")):
        entry = report["datasets"][name]
        metrics = entry["metrics"][data_source]
        assert (entry["rows"], entry["problems"], entry["responses_per_row"], entry["responses"]) == (2, 2, 2, 4)
        assert set(metrics) == {
            "mean@2",
            "pass@1",
            "pass@2",
            "maj@2",
            "response_length_mean",
            "truncated_ratio",
            "num_problems",
        }
        assert metrics["num_problems"] == 2

        samples = read_jsonl(out / f"{name}.generations.jsonl")
        assert [(s["row"], s["response_index"]) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(1 <= s["num_tokens"] <= MAX_RESPONSE_LENGTH for s in samples)
        assert all(s["num_tokens"] == MAX_RESPONSE_LENGTH for s in samples if s["truncated"])
        # The report's numbers are the samples' numbers.
        assert metrics["mean@2"] == pytest.approx(np.mean([s["acc"] for s in samples]))
        assert metrics["truncated_ratio"] == pytest.approx(np.mean([s["truncated"] for s in samples]))
        assert metrics["response_length_mean"] == pytest.approx(np.mean([s["num_tokens"] for s in samples]))
        assert 0.0 <= metrics["pass@1"] <= metrics["pass@2"] <= 1.0

        table = (out / f"{name}.md").read_text()
        assert f"| metric | {data_source} |" in table and "| mean@2 |" in table
    assert "## gsm8k: 2 problems x 2 responses = 4 responses" in completed.stdout
    # A successful evaluation ends quietly: the engine is shut down before the interpreter exits (else vLLM's monitor
    # reports its process gone).
    log = (out / evaluate.LOG_FILE).read_text() if (out / evaluate.LOG_FILE).exists() else ""
    assert "exited unexpectedly" not in completed.stdout + completed.stderr + log
