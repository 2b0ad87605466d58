"""Data preparation: converters on the shared offline copies, answer normalisation, bad-input errors.

The shared copies are read in place from ``../shared/data`` (or ``$SHARED_DATA_DIR``); tests that need
them skip with the reason when neither exists. Synthetic bad files are written to ``tmp_path``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from recipe_dapo.data import (
    DATASETS,
    RLDataError,
    apply_dapo_template,
    convert_dataset,
    gsm8k_final_answer,
    normalize_ground_truth,
    prepare_all,
    strip_dapo_template,
    validate_rl_parquet,
)
from recipe_dapo.data.cli import main as data_cli
from recipe_dapo.data.template import DAPO_PROMPT_PREFIX, DAPO_PROMPT_SUFFIX

from conftest import REPO_ROOT, SHARED  # noqa: E402

needs_shared = pytest.mark.skipif(SHARED is None, reason="shared data not found at ../shared/data or $SHARED_DATA_DIR")

# Row counts published for each set: DAPO-Math-17k has 17,917 problems (17,290 distinct texts:
# distinct problems may share a text, so deduplication is by problem id, see recipe_dapo.data.convert).
PUBLISHED_ROW_COUNTS = {
    "dapo-math-17k": 17_917,
    "aime-2024": 30,
    "aime-2025": 30,
    "amc23": 40,
    "math500": 500,
    "gsm8k": 1_319,
}


def prompt_text(row) -> str:
    return row["prompt"][0]["content"]


def write_parquet(path: Path, records: list[dict]) -> Path:
    pd.DataFrame(records).to_parquet(path, index=False)
    return path


def good_rl_record(problem: str = "1+1?", answer: str = "2") -> dict:
    return {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": apply_dapo_template(problem)}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": 0},
    }


# ---------------------------------------------------------------- converters on the shared copies


@needs_shared
@pytest.mark.parametrize("name", list(PUBLISHED_ROW_COUNTS))
def test_each_converter_writes_the_published_row_count_of_valid_templated_rows(name, tmp_path):
    result = convert_dataset(name, tmp_path, local_dir=str(SHARED), progress=False)

    assert result.rows_written == PUBLISHED_ROW_COUNTS[name]
    assert validate_rl_parquet(result.output_path) == PUBLISHED_ROW_COUNTS[name]
    frame = pd.read_parquet(result.output_path)
    assert set(frame["data_source"]) == {DATASETS[name].data_source}
    prompts = frame.apply(prompt_text, axis=1)
    assert prompts.map(lambda p: p.startswith(DAPO_PROMPT_PREFIX) and p.endswith(DAPO_PROMPT_SUFFIX)).all()
    assert prompts.map(lambda p: p.count("The last line of your response should be of the form") == 1).all()
    assert frame["extra_info"].map(lambda info: info["index"]).tolist() == list(range(len(frame)))
    ground_truths = frame["reward_model"].map(lambda rm: rm["ground_truth"])
    assert (ground_truths.map(normalize_ground_truth) == ground_truths).all()


@needs_shared
def test_aime_960_row_release_collapses_to_its_30_problems(tmp_path):
    source = SHARED / "eval" / "aime-2024-dapo-960.parquet"
    result = convert_dataset("aime-2024", tmp_path, input_path=str(source), progress=False)

    # 30 problems x 32 copies, each copy keeping its problem's extra_info.index.
    assert (result.rows_read, result.rows_written) == (960, 30)
    frame = pd.read_parquet(result.output_path)
    assert frame.apply(prompt_text, axis=1).nunique() == 30


@needs_shared
def test_bare_and_templated_dapo_copies_give_the_same_problems_and_answers(tmp_path):
    templated = convert_dataset("dapo-math-17k", tmp_path / "a", local_dir=str(SHARED), progress=False)
    bare = convert_dataset(
        "dapo-math-17k",
        tmp_path / "b",
        input_path=str(SHARED / "dapo-math-17k" / "dapo-math-17k.svs-dedup.parquet"),
        progress=False,
    )
    a, b = pd.read_parquet(templated.output_path), pd.read_parquet(bare.output_path)

    assert len(a) == len(b) == 17_917
    assert (
        a["reward_model"].map(lambda rm: rm["ground_truth"]).tolist()
        == b["reward_model"].map(lambda rm: rm["ground_truth"]).tolist()
    )
    # The templated release keeps its own whitespace inside the template; the problems agree once stripped.
    bare_problems = b["extra_info"].map(lambda info: info["raw_problem"])
    assert (a["extra_info"].map(lambda info: info["raw_problem"].strip()) == bare_problems).all()


@needs_shared
def test_original_release_repetition_is_undone_by_problem_id(tmp_path):
    # The original release repeats every problem ~100 times under one index; three tiled copies of the
    # first 500 problems stand in for it and must give those 500 problems back.
    frame = pd.read_parquet(SHARED / "dapo-math-17k" / "dapo-math-17k.parquet").head(500)
    repeated = write_parquet(tmp_path / "repeated.parquet", pd.concat([frame] * 3).to_dict(orient="records"))

    result = convert_dataset("dapo-math-17k", tmp_path / "out", input_path=str(repeated), progress=False)

    assert (result.rows_read, result.rows_written) == (1_500, 500)


@needs_shared
def test_per_row_ids_fall_back_to_prompt_deduplication_with_a_warning(tmp_path, caplog):
    frame = pd.read_parquet(SHARED / "dapo-math-17k" / "dapo-math-17k.parquet").head(500)
    records = pd.concat([frame] * 3).to_dict(orient="records")
    for row, record in enumerate(records):
        record["extra_info"] = {"index": f"uuid-{row}"}  # every copy has its own id
    repeated = write_parquet(tmp_path / "per_row_ids.parquet", records)
    distinct_texts = frame.apply(prompt_text, axis=1).nunique()

    with caplog.at_level(logging.WARNING, logger="recipe_dapo.data.convert"):
        result = convert_dataset("dapo-math-17k", tmp_path / "out", input_path=str(repeated), progress=False)

    assert result.rows_written == distinct_texts
    assert "deduplicating by prompt text instead" in caplog.text


@needs_shared
def test_prepare_data_script_writes_all_six_files_from_the_local_folder(tmp_path):
    # PATH without this interpreter: the script finds it through PYTHON (else the repository's .venv).
    env = dict(os.environ, DAPO_DATA_LOCAL_DIR=str(SHARED), PYTHON=sys.executable, PATH="/usr/bin:/bin")
    completed = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "prepare_data.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 0, completed.stderr[-2000:]
    written = sorted(p.name for p in tmp_path.glob("*.parquet"))
    assert written == sorted(spec.output_file for spec in DATASETS.values())
    for name, count in PUBLISHED_ROW_COUNTS.items():
        assert validate_rl_parquet(tmp_path / DATASETS[name].output_file) == count


@needs_shared
def test_shared_verl_layout_files_pass_the_validator_as_they_are():
    assert validate_rl_parquet(SHARED / "eval" / "aime-2024-dapo-960.parquet") == 960
    assert validate_rl_parquet(SHARED / "eval" / "amc23.parquet") == 40


# ---------------------------------------------------------------- template and answers


def test_template_is_applied_once_and_never_doubled():
    wrapped = apply_dapo_template("  What is 2+2? \n")

    assert wrapped == DAPO_PROMPT_PREFIX + "What is 2+2?" + DAPO_PROMPT_SUFFIX
    assert apply_dapo_template(wrapped) == wrapped
    assert apply_dapo_template(DAPO_PROMPT_PREFIX + "What is 2+2?") == wrapped  # half-wrapped input
    assert strip_dapo_template(wrapped) == "What is 2+2?"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("025", "25"),  # AIME leading zeros
        ("-007", "-7"),
        ("+3", "3"),
        ("-0", "0"),
        ("1,319", "1319"),  # thousands separators
        ("1{,}000", "1000"),
        ("12\\,345", "12345"),
        ("1,5", "1,5"),  # not a group of three digits: a pair, left alone
        ("0,111", "0,111"),  # a decimal comma or a list, not 111 (the verifier's rule too)
        ("0{,}111", "0{,}111"),
        (" $42$ ", "42"),
        ("\\boxed{17}", "17"),
        ("\\boxed{1}+\\boxed{2}", "\\boxed{1}+\\boxed{2}"),  # the box does not wrap the whole answer
        (27.0, "27"),  # a float cell from a Hub copy
        (204, "204"),
        ("2.50", "2.5"),
        ("27.000", "27"),
        (".5", "0.5"),
        ("\\frac{14}{3}", "\\frac{14}{3}"),  # LaTeX untouched
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ],
)
def test_ground_truths_are_normalised_to_one_spelling(raw, expected):
    assert normalize_ground_truth(raw) == expected


@pytest.mark.parametrize(
    "raw", ["025", "-007", "+3", "-0", "1,319", "-1,319.5", "1,000,000", "0,111", "1,5", "12,3456", "1{,}319"]
)
def test_the_verifier_spells_integers_and_grouped_numbers_as_the_converters_do(raw):
    # One implementation of these rules (recipe_dapo.data.answers), used by both
    from recipe_dapo.reward import normalize_answer

    assert normalize_answer(raw) == normalize_ground_truth(raw)


@needs_shared
def test_the_verifier_accepts_every_original_answer_against_its_normalised_ground_truth():
    # Normalisation must never change what counts as correct: for each shared answer that it rewrites
    # ("025", "18.90", ".35625", "1,000" ...), the recipe's verifier accepts the original spelling as a
    # response against the normalised ground truth.
    from recipe_dapo.reward import verify

    raw_answers = set()
    for name in (
        "dapo-math-17k/dapo-math-17k.parquet",
        "eval/aime-2024.parquet",
        "eval/aime-2025.parquet",
        "eval/amc23.parquet",
        "eval/math500-aime24-aime25.svs.parquet",
    ):
        raw_answers |= set(pd.read_parquet(SHARED / name)["reward_model"].map(lambda rm: rm["ground_truth"]))
    for name, key in (("math500_test.jsonl", "answer"), ("gsm8k_test.jsonl", "answer")):
        for line in (SHARED / "eval" / name).read_text().splitlines():
            answer = json.loads(line)[key]
            raw_answers.add(answer.rsplit("####", 1)[1].strip() if "####" in answer else answer)
    rewritten = {raw: normalize_ground_truth(raw) for raw in raw_answers if normalize_ground_truth(raw) != raw}

    assert rewritten, "expected some answers to be rewritten (leading zeros, separators, decimals)"
    rejected = {
        raw: normal
        for raw, normal in rewritten.items()
        if not verify(f"Answer: {raw}", normal, symbolic_check=False).correct
    }
    assert rejected == {}


def test_gsm8k_final_answer_is_the_number_after_the_last_marker():
    assert gsm8k_final_answer("She sells 1,000 eggs.\n#### 1,200") == "1200"
    assert gsm8k_final_answer("no marker here") == ""


# ---------------------------------------------------------------- bad input


def test_missing_column_names_the_file_and_the_column(tmp_path):
    record = good_rl_record()
    del record["reward_model"]
    path = write_parquet(tmp_path / "no_reward_model.parquet", [record])

    with pytest.raises(RLDataError) as caught:
        validate_rl_parquet(path)

    assert (caught.value.path, caught.value.row, caught.value.field) == (str(path), None, "reward_model")
    assert "column is missing" in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(
    "break_row, field, problem",
    [
        (lambda r: r.update(prompt=[{"role": "user", "content": "   "}]), "prompt[0].content", "prompt is empty"),
        (lambda r: r.update(prompt=[]), "prompt", "prompt is empty"),
        (lambda r: r["reward_model"].update(ground_truth=None), "reward_model.ground_truth", "ground truth is missing"),
        (lambda r: r["reward_model"].update(ground_truth=" "), "reward_model.ground_truth", "ground truth is empty"),
        (lambda r: r.update(data_source=""), "data_source", "non-empty string"),
        # A missing answer written as text, and prompts verl's chat template misreads
        (lambda r: r["reward_model"].update(ground_truth="nan"), "reward_model.ground_truth", "'nan' (a missing value"),
        (lambda r: r["reward_model"].update(ground_truth=" None "), "reward_model.ground_truth", "' None ' (a missing"),
        (lambda r: r["reward_model"].update(ground_truth="NULL"), "reward_model.ground_truth", "'NULL' (a missing"),
        (lambda r: r["reward_model"].update(ground_truth="NaN"), "reward_model.ground_truth", "'NaN' (a missing"),
        (
            lambda r: r.update(prompt=[{"role": "system", "content": "Be brief."}, {"role": "bot", "content": "1+1?"}]),
            "prompt[1].role",
            "role 'bot' is not one of system, user, assistant, tool",
        ),
        (
            lambda r: r.update(prompt=[{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]),
            "prompt[1].role",
            "the last message is the 'assistant' one, not the 'user' one",
        ),
    ],
    ids=[
        "blank-content", "no-messages", "missing-ground-truth", "empty-ground-truth", "empty-data-source",
        "nan-text", "none-text", "null-text", "NaN-text", "unknown-role", "last-message-not-user",
    ],
)
def test_bad_row_names_the_file_the_row_and_the_field(tmp_path, break_row, field, problem):
    records = [good_rl_record("a?"), good_rl_record("b?"), good_rl_record("c?")]
    break_row(records[2])
    path = write_parquet(tmp_path / "bad.parquet", records)

    with pytest.raises(RLDataError) as caught:
        validate_rl_parquet(path)

    assert (caught.value.row, caught.value.field) == (2, field)
    message = str(caught.value)
    assert str(path) in message and "row 2" in message and f"'{field}'" in message and problem in message


def test_a_nan_number_ground_truth_is_refused_with_its_row(tmp_path):
    records = [good_rl_record("a?"), good_rl_record("b?"), good_rl_record("c?")]
    for record, answer in zip(records, (2.0, float("nan"), 3.0)):
        record["reward_model"]["ground_truth"] = answer  # a float NaN kept as a value, not turned into a null
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "nan.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)

    with pytest.raises(RLDataError) as caught:
        validate_rl_parquet(path)

    assert (caught.value.row, caught.value.field) == (1, "reward_model.ground_truth")
    assert str(path) in str(caught.value) and "ground truth is NaN" in str(caught.value)


@pytest.mark.parametrize("ground_truth, problem", [
    ({"answer": "42", "unit": "cm"}, "ground truth is a dict ({'answer': '42', 'unit': 'cm'})"),
    (True, "ground truth is a boolean (True)"),
    ([{"answer": "1"}, {"answer": "2"}], "an item of the list: ground truth is a dict ({'answer': '1'})"),
], ids=["dict", "boolean", "list-of-dicts"])
def test_a_ground_truth_shape_the_reward_cannot_read_is_refused_with_its_row(tmp_path, ground_truth, problem):
    """What the recipe's reward would score as malformed (-1) on every response, after a full start-up."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [good_rl_record("a?"), good_rl_record("b?")]
    for record in records:
        record["reward_model"]["ground_truth"] = ground_truth
    path = tmp_path / "shape.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    with pytest.raises(RLDataError) as caught:
        validate_rl_parquet(path)
    assert (caught.value.row, caught.value.field) == (0, "reward_model.ground_truth")
    assert problem in str(caught.value) and "the reward reads a string, a number or a list of them" in str(caught.value)
    # A user's reward function reads what it reads: only missing and empty ground truths are refused for it.
    assert validate_rl_parquet(path, readable_shapes_only=False) == 2


def test_the_data_rule_refuses_exactly_the_ground_truth_shapes_the_reward_cannot_read():
    """One rule on both sides: over many shapes, a ground truth passes the data rule iff the reward's parser reads it
    (missing values in disguise aside: the data rule refuses those too, the parser would score them)."""
    import decimal
    import fractions

    import numpy as np

    from recipe_dapo.data.validation import ground_truth_problem
    from recipe_dapo.reward.verifier import MalformedGroundTruth, ground_truth_answers

    shapes = ["42", " x+1 ", 3, 2.5, np.int64(7), np.float32(1.5), decimal.Decimal("1.5"), fractions.Fraction(1, 3),
              ["1", 2], ("a", "b"), np.array(["1", "2"]), [["1"], "2"], "caf\u00e9".encode(), b"\xff\xfe",
              {"answer": "1"}, True, np.bool_(False), {1, 2}, frozenset(), [True], ["1", {"a": 1}], object(),
              None, "", [], " "]
    passed_rule = [ground_truth_problem(shape) is None for shape in shapes]
    readable = []
    for shape in shapes:
        try:
            ground_truth_answers(shape)
            readable.append(True)
        except MalformedGroundTruth:
            readable.append(False)
    assert passed_rule == readable, [(repr(s), r, p) for s, r, p in zip(shapes, readable, passed_rule) if r != p]
    assert sum(readable) >= 10 and readable.count(False) >= 10  # both kinds are there


def test_multi_turn_prompts_with_known_roles_ending_with_the_user_pass(tmp_path):
    record = good_rl_record()
    record["prompt"] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "tool", "content": "ok"},
        {"role": "user", "content": "and 2+2?"},
    ]
    assert validate_rl_parquet(write_parquet(tmp_path / "chat.parquet", [record])) == 1


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize(
    "bad_record, field, problem",
    [
        ({"problem": "x?"}, "answer", "ground truth is missing"),
        ({"problem": "x?", "answer": ""}, "answer", "ground truth is empty"),
        ({"problem": "", "answer": "3"}, "problem", "prompt is empty"),
        ({"problem": "x?", "answer": "None"}, "answer", "ground truth is 'None' (a missing value written as text)"),
        ({"problem": "x?", "answer": float("nan")}, "answer", "ground truth is NaN"),
    ],
    ids=["missing-answer", "empty-answer", "empty-problem", "none-text-answer", "nan-answer"],
)
def test_bad_jsonl_row_is_refused_by_the_converter_with_its_row_and_field(tmp_path, bad_record, field, problem):
    path = write_jsonl(tmp_path / "math.jsonl", [{"problem": "1+1?", "answer": "2"}, bad_record])

    with pytest.raises(RLDataError) as caught:
        convert_dataset("math500", tmp_path / "out", input_path=str(path), progress=False)

    assert (caught.value.path, caught.value.row, caught.value.field) == (str(path), 1, field)
    assert problem in str(caught.value)
    assert not (tmp_path / "out" / "math500.parquet").exists()


def test_gsm8k_answer_without_its_final_marker_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "How many?", "answer": "Three, no marker."}])

    with pytest.raises(RLDataError, match=r"row 0, field 'answer': ground truth is empty"):
        convert_dataset("gsm8k", tmp_path / "out", input_path=str(path), progress=False)


def test_source_without_a_problem_column_is_refused_before_reading_rows(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"text": "1+1?", "answer": "2"}])

    with pytest.raises(RLDataError, match="no problem column"):
        convert_dataset("math500", tmp_path / "out", input_path=str(path), progress=False)


@needs_shared
def test_incomplete_local_folder_fails_before_any_file_is_written(tmp_path):
    local = tmp_path / "local"
    (local / "eval").mkdir(parents=True)
    (local / "eval" / "aime-2024.parquet").symlink_to(SHARED / "eval" / "aime-2024.parquet")

    with pytest.raises(FileNotFoundError, match=r"aime-2025: none of .*eval/aime-2025.parquet"):
        prepare_all(tmp_path / "out", local_dir=str(local), names=["aime-2024", "aime-2025"], progress=False)

    assert not (tmp_path / "out").exists()


def test_command_line_reports_a_bad_file_in_one_line_and_exits_2(tmp_path, capsys):
    record = good_rl_record()
    record["reward_model"] = {"ground_truth": "", "style": "rule"}
    path = write_parquet(tmp_path / "bad.parquet", [record])

    assert data_cli(["validate", str(path)]) == 2

    error = capsys.readouterr().err.strip()
    assert (
        error == f"error: {path}, row 0, field 'reward_model.ground_truth': ground truth is empty. "
        "Fix: give the row its reference answer or drop the row"
    )


# ---------------------------------------------------------------- without network


def prepare_script(out_dir, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", "DAPO_DATA_LOCAL_DIR")}
    environment.update(PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "prepare_data.sh"), str(out_dir)], env=environment,
                          capture_output=True, text=True, timeout=120)


LOCAL_HINT = ("without network, prepare from local copies: DAPO_DATA_LOCAL_DIR=DIR bash scripts/prepare_data.sh "
              "OUT_DIR (or python -m recipe_dapo.data prepare OUT_DIR --local-dir DIR)")


def test_without_network_data_preparation_says_so_in_one_line_and_how_to_use_a_local_folder(tmp_path):
    # An endpoint nothing listens on: the connection is refused at once, as on a machine without network.
    completed = prepare_script(tmp_path / "out", HF_ENDPOINT="http://127.0.0.1:9")
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.splitlines() == [completed.stderr.strip()], completed.stderr  # one line, no retries
    assert completed.stderr.startswith("error: cannot reach the Hugging Face Hub (http://127.0.0.1:9: ")
    assert LOCAL_HINT in completed.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_with_the_hub_offline_and_nothing_cached_the_same_line(tmp_path):
    completed = prepare_script(tmp_path / "out", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
                               HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"))
    assert completed.returncode == 2 and completed.stdout == ""
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert completed.stderr.startswith("error: cannot reach the Hugging Face Hub (HF_HUB_OFFLINE is set and ")
    assert LOCAL_HINT in completed.stderr


def test_the_local_folder_the_line_points_to_needs_no_network(tmp_path):
    local = tmp_path / "local" / "eval"
    local.mkdir(parents=True)
    pd.DataFrame({"problem": ["What is 1 + 1?", "What is 2 + 3?"], "answer": ["2", "5"]}).to_parquet(
        local / "aime-2024.parquet", index=False)
    completed = subprocess.run(
        [sys.executable, "-m", "recipe_dapo.data", "prepare", str(tmp_path / "out"), "--only", "aime-2024"],
        env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "DAPO_DATA_LOCAL_DIR": str(tmp_path / "local")},
        capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert validate_rl_parquet(tmp_path / "out" / "aime-2024.parquet") == 2
    # The layout the line refers to is in the command's help.
    shown = subprocess.run([sys.executable, "-m", "recipe_dapo.data", "prepare", "--help"], capture_output=True,
                           text=True, timeout=60).stdout
    assert all(spec.local_files[0] in shown for spec in DATASETS.values()), shown
