"""The evaluation counts one data file one way wherever it says how many: rows, problems (distinct prompts: rows that
repeat one pool their responses) and responses (``--n`` per row), the same figures on the console line said once
before generation, on the progress bars, in the result table's header and its ``num_problems``, in ``report.json``,
on the data set's page and in the generations file; rows left out (``--max-rows``) or pooled are said once, with how
many and why.

The input is the CPU run's validation file as ``scripts/run_dapo_cpu.sh`` builds it (128 rows of the chain task, some
repeating a problem), tokenized by a real BPE tokenizer. Only vLLM is replaced: a stand-in for ``vllm.LLM`` whose
``generate`` draws the progress bars vLLM 0.31 draws (``Rendering prompts`` over the prompts, then ``Processed
prompts`` with one request per response, ``n`` added as each prompt finishes) and returns its outputs' fields; the
evaluation's own code (the engine settings, ``generation.generate``, scoring, report) runs as ``python -m`` does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

# vllm, as far as the evaluation touches it, with vLLM 0.31's progress bars (vllm/entrypoints/offline_utils.py).
SCRIPT = r'''
import runpy, sys, types
from tqdm.auto import tqdm

class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16):
        self.n, self.temperature, self.top_p, self.max_tokens = n, temperature, top_p, max_tokens

class Output:
    def __init__(self, text, token_ids, finish_reason):
        self.text, self.token_ids, self.finish_reason = text, token_ids, finish_reason

class RequestOutput:
    def __init__(self, outputs):
        self.outputs = outputs

class LLM:
    def __init__(self, **settings):
        self.settings = settings

    def generate(self, prompts, params, use_tqdm=True):
        bar = use_tqdm if callable(use_tqdm) else tqdm
        rendered = [prompt for prompt in (bar(prompts, desc="Rendering prompts") if use_tqdm else prompts)]
        # vLLM fans a prompt out into n requests and counts requests; a prompt finishes with its n outputs
        pbar = bar(total=len(rendered) * params.n, desc="Processed prompts", dynamic_ncols=True,
                   postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s") if use_tqdm else None
        outputs = []
        for index, prompt in enumerate(rendered):
            outputs.append(RequestOutput([Output(f"Answer: {(index + sample) % 7}", [1, 2, 3], "stop")
                                          for sample in range(params.n)]))
            if pbar is not None:
                pbar.update(params.n)
        if pbar is not None:
            pbar.close()
        return outputs

vllm = types.ModuleType("vllm")
inputs = types.ModuleType("vllm.inputs")
vllm.LLM, vllm.SamplingParams, vllm.inputs, inputs.TokensPrompt = LLM, SamplingParams, inputs, dict
sys.modules.update({"vllm": vllm, "vllm.inputs": inputs})
sys.argv = ["evaluate", *sys.argv[1:]]
runpy.run_module("recipe_dapo.evaluation.evaluate", run_name="__main__", alter_sys=True)
'''

REPO_ROOT = Path(__file__).resolve().parents[1]  # this checkout's recipe, whatever the editable install points to
N, MAX_ROWS = 4, 100
COUNT_WORDS = r"(rows?|problems?|responses?|samples?|prompts?|sequences?|items?|examples?)"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The README's evaluation command on the CPU run's validation file, with --max-rows: its console (stdout and
    stderr), output folder and data file."""
    from recipe_dapo.cpu.assets import synthetic_rows, train_bpe_tokenizer

    tmp = tmp_path_factory.mktemp("evaluation_counts")
    rows = synthetic_rows(128, "val", 0, "chain")  # what run_dapo_cpu.sh writes to assets/data/val.parquet
    data = tmp / "val.parquet"
    pd.DataFrame(rows).to_parquet(data)
    model = tmp / "model"
    train_bpe_tokenizer(model, [row["prompt"][0]["content"] for row in rows] + ["Answer: 1"])
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 2,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 512,
        "torch_dtype": "float32"}))
    out = tmp / "eval"
    args = ["--model", str(model), "--data", str(data), "--n", str(N), "--top-p", "1.0", "--max-response-length",
            "48", "--max-rows", str(MAX_ROWS), "--out", str(out)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DAPO_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    completed = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300,
                               env=environment, cwd=tmp)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed, out, data


def expected_counts(data) -> dict[str, int]:
    """The file's figures, counted here from the parquet: what every output must say."""
    frame = pd.read_parquet(data)
    kept = frame.head(MAX_ROWS)
    problems = kept.apply(lambda row: (row["data_source"], row["prompt"][-1]["content"]), axis=1).nunique()
    return {"rows_in_file": len(frame), "rows": len(kept), "problems": problems, "responses_per_row": N,
            "responses": len(kept) * N}


def bars(stderr: str) -> dict[str, tuple[int, int, str]]:
    """Each progress bar's last state: description -> (done, total, unit)."""
    found = {}
    for state in re.split(r"[\r\n]", stderr):
        match = re.match(r"(?P<desc>[^:]+): +\d+%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) \[[^\]]*?"
                         r"(?:(?P<unit>[a-z]+)/s|s/(?P<unit2>[a-z]+))", state.strip())
        if match:
            found[match["desc"]] = (int(match["n"]), int(match["total"]), match["unit"] or match["unit2"])
    return found


def test_the_file_is_counted_in_rows_problems_and_responses_the_same_everywhere(evaluated):
    completed, out, data = evaluated
    want = expected_counts(data)
    assert want["rows"] > want["problems"], "the CPU run's file repeats problems: the case this test is about"
    repeated = want["rows"] - want["problems"]
    console = completed.stdout + completed.stderr

    # Said once, before generation: the figures, the rows left out and the rows pooled, with why.
    said = (f"val: {want['rows']} rows x {N} responses = {want['responses']} responses, {want['problems']} problems; "
            f"the first {want['rows']} of the file's {want['rows_in_file']} rows (--max-rows); {repeated} rows repeat "
            "the problem of an earlier row, and the metrics pool each problem's responses")
    assert completed.stdout.splitlines().count(said) == 1, completed.stdout
    assert console.count("--max-rows") == 1 and console.count("repeat") == 1, console

    # The result table's header and its num_problems.
    assert f"## val: {want['rows']} rows x {N} responses = {want['responses']} responses, {want['problems']} problems" \
        in completed.stdout.splitlines(), completed.stdout
    assert f"| num_problems | {want['problems']} |" in completed.stdout, completed.stdout

    # Every progress bar counts responses, all of them.
    drawn = bars(completed.stderr)
    assert drawn and all(bar == (want["responses"], want["responses"], "response") for bar in drawn.values()), drawn

    # No other figure with a count word: every "<number> <word>" on the console is one of the file's figures.
    figures = {("row", want["rows"]), ("row", want["rows_in_file"]), ("row", repeated), ("problem", want["problems"]),
               ("response", N), ("response", want["responses"])}
    for number, word in re.findall(rf"\b(\d+) {COUNT_WORDS}\b", console):
        assert (word.rstrip("s"), int(number)) in figures, f"{number} {word} in:\n{console}"

    # The files: report.json, the data set's page, one generations line per response.
    entry = json.loads((out / "report.json").read_text())["datasets"]["val"]
    assert {key: entry[key] for key in want} == want
    assert entry["metrics"]["chain_arithmetic"]["num_problems"] == want["problems"]
    assert said.split(": ", 1)[1] in (out / "val.md").read_text()
    generations = [json.loads(line) for line in (out / "val.generations.jsonl").read_text().splitlines()]
    assert len(generations) == want["responses"]
    assert len({g["row"] for g in generations}) == want["rows"]
    assert len({g["problem"] for g in generations}) == want["problems"]
    assert {g["response_index"] for g in generations} == set(range(N))
