"""The first build of the default run's inputs on the console: it says what it does, and its warm-up shows its
progress as one line rewritten in place on a terminal, and as a few lines (not one per check) anywhere else."""

from __future__ import annotations

import io
import logging

from recipe_dapo.cpu.assets import WarmupProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_the_warm_up_logs_a_line_a_minute_and_its_last_update(caplog):
    clock, stream = Clock(), io.StringIO()
    progress = WarmupProgress(stream, every_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="recipe_dapo.cpu.assets"):
        for check in range(16):  # 16 checks 15 s apart: a 4-minute warm-up
            clock.now = 15.0 * check
            progress.update(f"check {check}")
        progress.close()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["check 0", "check 4", "check 8", "check 12", "check 15"]
    assert stream.getvalue() == ""  # nothing written around the logging


def test_on_a_terminal_the_warm_up_is_one_line_rewritten_in_place(caplog):
    terminal = Terminal()
    progress = WarmupProgress(terminal, every_s=60.0, clock=Clock())
    with caplog.at_level(logging.INFO, logger="recipe_dapo.cpu.assets"):
        for check in range(16):
            progress.update(f"check {check}")
        progress.close()
    assert not caplog.records
    text = terminal.getvalue()
    assert text.count("\r") == 16 and text.count("\n") == 1 and text.endswith("check 15\n")


def test_the_first_build_says_what_it_does_and_its_warm_up_is_not_a_line_per_check(tmp_path, caplog):
    from dataclasses import replace

    from recipe_dapo.cpu.assets import TinyModelSpec, build_default_assets

    # 20 steps checked every 2 (10 checks) against a target never met, off a terminal, within a minute
    spec = replace(TinyModelSpec(), warmup_steps=20, warmup_target_acc=1.01, warmup_check_every=2,
                   warmup_check_problems=4, warmup_check_max_tokens=4)
    with caplog.at_level(logging.INFO, logger="recipe_dapo.cpu.assets"):
        build_default_assets(tmp_path, None, num_train=16, num_val=4, spec=spec, task="chain", num_warmup=32)
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("inputs: writing 16 training and 4 validation rows (chain)") for line in lines)
    assert any("training a 512-token BPE tokenizer" in line for line in lines)
    assert any(line.startswith("inputs: warming up the model: supervised steps on 32 worked solutions until it "
                               "answers 101% of 4 held-out problems right (checked every 2 steps") for line in lines)
    checks = [line for line in lines if line.startswith("inputs: warm-up step")]
    assert 1 <= len(checks) <= 3, checks  # the first, the last (and one a minute), not 10
    assert checks[-1].startswith("inputs: warm-up step 20 ")
