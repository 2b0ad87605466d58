"""A resume keeps everything the run logged, through verl's real ``Tracking``.

The scenario: a run logs steps 0 (validation) to 3, saves its checkpoint at step 2 and is
killed after logging step 3; the resumed process starts from the step-2 checkpoint, validates at step 2
(val_before_train) and logs steps 3 and 4 again.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from recipe_dapo.tracking.run_log import read_metrics, superseded_path
from recipe_dapo.tracking.tracker import DAPOTracking


@pytest.fixture
def logger_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    return tmp_path


def open_run(resumed_step: int) -> DAPOTracking:
    return DAPOTracking("proj", "exp", default_backend=["file"], resumed_step=resumed_step)


def train_metrics(step: int, process: str) -> dict:
    return {"actor/pg_loss": np.float64(step / 10), "training/global_step": step, "process": process}


def killed_then_resumed(logger_root):
    first = open_run(resumed_step=0)
    first.log({"val/src/mean@4": 0.1}, step=0)
    for step in (1, 2, 3):
        first.log(train_metrics(step, "first"), step=step)
    first.log({"val/src/mean@4": 0.2}, step=2)  # test_freq=2: validation logged with step 2
    first.logger["file"].fp.close()  # killed: no finish()

    resumed = open_run(resumed_step=2)
    resumed.log({"val/src/mean@4": 0.21}, step=2)  # val_before_train after loading the checkpoint
    for step in (3, 4):
        resumed.log(train_metrics(step, "resumed"), step=step)
    resumed.finish()
    return logger_root / "proj" / "exp.jsonl"


def test_resume_keeps_every_step_logged_up_to_the_checkpoint(logger_root):
    metrics = read_metrics(killed_then_resumed(logger_root))
    assert sorted(metrics) == [0, 1, 2, 3, 4]
    assert metrics[0]["val/src/mean@4"] == 0.1
    assert metrics[1]["process"] == metrics[2]["process"] == "first"
    assert metrics[2]["actor/pg_loss"] == pytest.approx(0.2)
    # Step 2's validation was repeated by the resumed process on the same weights: the later line wins.
    assert metrics[2]["val/src/mean@4"] == 0.21
    assert metrics[3]["process"] == metrics[4]["process"] == "resumed"


def test_lines_logged_after_the_checkpoint_are_set_aside_not_lost(logger_root):
    path = killed_then_resumed(logger_root)
    main = [json.loads(line) for line in path.read_text().splitlines()]
    # The metrics file is the history the checkpoints belong to: one step-3 line, the resumed one.
    # first process: 0, 1, 2, (3 set aside), 2 (validation); resumed: 2 (validation), 3, 4.
    assert [r["step"] for r in main] == [0, 1, 2, 2, 2, 3, 4]
    assert [r["data"].get("process") for r in main if r["step"] == 3] == ["resumed"]
    aside = [json.loads(line) for line in open(superseded_path(path))]
    assert [(r["step"], r["data"]["process"]) for r in aside] == [(3, "first")]
    assert aside[0]["superseded"]["resumed_from_step"] == 2


def test_a_fresh_start_over_an_old_file_sets_all_of_it_aside(logger_root):
    old = open_run(resumed_step=0)
    old.log(train_metrics(1, "old"), step=1)
    old.finish()
    new = open_run(resumed_step=0)
    new.log(train_metrics(1, "new"), step=1)
    new.finish()
    path = logger_root / "proj" / "exp.jsonl"
    assert read_metrics(path)[1]["process"] == "new"
    assert [json.loads(line)["data"]["process"] for line in open(superseded_path(path))] == ["old"]


def test_a_line_cut_by_a_kill_is_set_aside_and_later_lines_stay_readable(logger_root):
    first = open_run(resumed_step=0)
    first.log(train_metrics(1, "first"), step=1)
    first.logger["file"].fp.write(b'{"step": 2, "data": {"actor/pg')  # killed in the middle of a write
    first.logger["file"].fp.close()
    resumed = open_run(resumed_step=1)
    resumed.log(train_metrics(2, "resumed"), step=2)
    resumed.finish()
    path = logger_root / "proj" / "exp.jsonl"
    assert {step: m["process"] for step, m in read_metrics(path).items()} == {1: "first", 2: "resumed"}
    aside = [json.loads(line) for line in open(superseded_path(path))]
    assert aside[0]["raw"].startswith('{"step": 2')


def test_records_keep_verls_file_logger_format(logger_root, monkeypatch):
    from verl.utils.tracking import FileLogger

    tracking = open_run(resumed_step=0)
    tracking.log({"a": np.float64(0.5), "b": np.int64(3)}, step=7)
    tracking.finish()
    ours = (logger_root / "proj" / "exp.jsonl").read_bytes()
    assert json.loads(ours) == {"step": 7, "data": {"a": 0.5, "b": 3}}
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(logger_root / "verl.jsonl"))
    verls = FileLogger("proj", "exp")  # the same record through verl's own file backend: the same bytes
    verls.log({"a": np.float64(0.5), "b": np.int64(3)}, step=7)
    verls.finish()
    assert (logger_root / "verl.jsonl").read_bytes() == ours
