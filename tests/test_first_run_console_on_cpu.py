"""The first launch of the default run (``bash scripts/run_dapo_cpu.sh``) fits on one screen: its console, the
build of the inputs included, is at most 30 lines on a terminal, and off a terminal its start-up prints a line a
minute at most.

The run is put together from what it prints: the build of the inputs (the real build, at a small size), the
recorded run's start-up (``tests/fixtures/console_cpu_run.txt``, each line at the time its own timestamp gives) with
the start-up lines today's code prints from the default configuration, then the default run's 12 steps and 3
validations rendered by the recipe's console from the recorded metrics (``tests/fixtures/metrics_cpu_run.jsonl``),
with the trainer's step bar as verl's task runner prints it, and the line at exit. All of it goes through the driver's
console router, as in a run.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from conftest import REPO_ROOT, compose_recipe_config
from test_console_noise_on_cpu import ANSI, _CLOCK, recorded_run
from recipe_dapo.tracking.noise import TAG, TAG_ENV, ConsoleRouter, LogFile, RoutedStream, RunOutput, _at_exit

METRICS = REPO_ROOT / "tests" / "fixtures" / "metrics_cpu_run.jsonl"
BUDGET = 30
RAY = "\x1b[36m(DAPOTaskRunner pid=29834)\x1b[0m "


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def terminal_lines(text: str) -> list[str]:
    """The lines a terminal keeps of ``text``: a line rewritten in place (``\\r``, erase) is one line, its last text."""
    lines = []
    for line in text.split("\n")[:-1]:
        lines.append(re.sub(r"\x1b\[K", "", line).split("\r")[-1])
    return lines


def build_console(tmp_path, monkeypatch, tty: bool) -> list[str]:
    """What the first build of the inputs prints (the script's heading line, then the build), at a small size."""
    from recipe_dapo.cpu import assets

    stream = Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger(assets.__name__).addHandler(handler)
    logging.getLogger(assets.__name__).setLevel(logging.INFO)
    try:
        spec = replace(assets.TinyModelSpec(), warmup_steps=20, warmup_target_acc=0.0, warmup_check_every=2,
                       warmup_check_problems=4, warmup_check_max_tokens=4)
        stream.write(f"inputs: building the default data, tokenizer and tiny model in {tmp_path} (once; ...)\n")
        assets.build_default_assets(tmp_path, None, num_train=16, num_val=4, spec=spec, task="chain", num_warmup=32)
    finally:
        logging.getLogger(assets.__name__).removeHandler(handler)
    return terminal_lines(stream.getvalue())


def start_up_lines() -> list[str]:
    """The recipe's start-up lines for the default run, as today's driver prints them (``main_dapo.run``)."""
    from recipe_dapo.policy_lag import correction_line
    from recipe_dapo.preflight.base import CheckReport
    from recipe_dapo.tracking.console import run_summary
    from recipe_dapo.trainers.table import trainer_for

    config = compose_recipe_config(["platform=cpu", "size=cpu_chain", "actor_rollout_ref.model.path=/runs/assets/model"])
    OmegaConf.update(config, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes", 8388608,
                     force_add=True)
    resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    report = CheckReport(summary=run_summary(resolved))
    return [*report.summary_lines(), trainer_for(config).log_line(), correction_line(resolved)]


def default_run_lines(tmp_path) -> list[str]:
    """What the default run's task runner prints from its first validation on: the recipe's lines (rendered by its
    console from the recorded metrics) and verl's step bar, with Ray's prefix."""
    from recipe_dapo.tracking.console import RunConsole
    from recipe_dapo.tracking.run_log import set_aside_superseded

    records = [json.loads(line)["data"] for line in METRICS.read_text().splitlines()]
    steps = [{k: v for k, v in data.items() if not k.startswith("val")} for data in records]
    midway, final = ({k: v for k, v in records[i].items() if k.startswith("val")} for i in (2, -1))
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "global_step_12").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("12")
    out = io.StringIO()
    console = RunConsole(total_steps=12, checkpoint_dir=str(checkpoints), metrics_file="/runs/dapo_cpu.jsonl",
                         stream=out)
    set_aside_superseded(tmp_path / "dapo_cpu.jsonl", 0)  # the metrics file's line (a first run: none)
    lines = [RAY + line for line in out.getvalue().splitlines()]
    out.seek(0), out.truncate()
    console.log(midway, step=0)  # trainer.val_before_train
    for step in range(1, 13):
        console.log({**steps[(step - 1) % len(steps)], **{6: midway, 12: final}.get(step, {})}, step=step)
        lines += [RAY + line for line in out.getvalue().splitlines()]
        bar = "#" * step + " " * (12 - step)
        lines.append(f"{RAY}DAPO training steps: {100 * step // 12:3d}%|{bar}| {step}/12 [00:{3 * step:02d}<00:30]")
        out.seek(0), out.truncate()
    console.finish()
    return lines + [RAY + line for line in out.getvalue().splitlines()]


def run_console(tmp_path, tty: bool) -> tuple[list[str], float]:
    """The console of the run after the build, and the seconds its start-up took."""
    recorded = recorded_run()
    first_step = next(i for i, (_, line) in enumerate(recorded) if TAG + "step " in line)
    start_up = [(err, line) for err, line in recorded[:first_step]
                if TAG not in line and "][recipe_dapo." not in line]  # today's recipe lines below instead
    log_line = next(line for _, line in recorded if TAG + "log file: " in line)
    recipe = [(False, log_line)] + [(False, TAG + line) for line in start_up_lines()]

    now = [0.0]
    router, log_file, console = ConsoleRouter(clock=lambda: now[0]), LogFile(), Terminal() if tty else io.StringIO()
    router.tty = tty
    streams = {False: RoutedStream(console, router, log_file, False), True: RoutedStream(console, router, log_file, True)}
    start = None
    for is_stderr, line in recipe + start_up:
        stamp = _CLOCK.search(ANSI.sub("", line))
        if stamp:
            seconds = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
            start = seconds if start is None else start
            while now[0] + 1 <= seconds - start:  # the heartbeat thread's tick: a line, or the status rewritten
                now[0] += 1
                beat = router.heartbeat()
                if beat:
                    streams[False].emit(beat)
                if tty:
                    streams[False].redraw()
        streams[is_stderr].write(line + "\n")
    took = now[0]
    for line in default_run_lines(tmp_path):
        streams[False].write(line + "\n")
    log_file.attach(str(tmp_path / "run.log"))
    _at_exit(RunOutput(router, log_file, console))
    return terminal_lines(console.getvalue()), took


@pytest.fixture
def marked(monkeypatch):
    monkeypatch.setenv(TAG_ENV, "1")  # as the driver sets it for the run's processes
    monkeypatch.delenv("DAPO_CONSOLE_RECORD", raising=False)


def test_the_first_launch_on_a_terminal_is_at_most_30_lines(tmp_path, monkeypatch, marked):
    build = build_console(tmp_path / "assets", monkeypatch, tty=True)
    run, _ = run_console(tmp_path, tty=True)
    console = build + run
    assert len(console) <= BUDGET, "\n".join(console)
    # Nothing that matters is lost: the build's end, where the log is, the shape, each step and validation, the
    # start-up's time, the summary and the exit line.
    assert build[-1].startswith("inputs: warm-up done, 2 steps")
    assert [line.split(" |")[0] for line in run if line.startswith("step ")] == [f"step {k}/12" for k in range(1, 13)]
    assert [line.split(" |")[0] for line in run if line.startswith("validation at")] == [
        "validation at step 0", "validation at step 6", "validation at step 12"]
    assert any(line.startswith("start-up: ") and "vLLM engines" in line for line in run), run
    assert any("vLLM-CPU KV cache: 0.008 GiB" in line for line in run)
    assert run[0].startswith("log file: ") and run[-1].startswith("log file: ")
    assert any(line.startswith("run finished: steps 1-12 in ") and "generated" in line for line in run)
    assert any(line.startswith("  validation, before training -> step 12: chain_arithmetic") for line in run)
    assert not any("DAPO training steps" in line for line in console)  # each step has its own line


def test_off_a_terminal_the_start_up_prints_a_line_a_minute_at_most(tmp_path, marked):
    run, took = run_console(tmp_path, tty=False)
    start_up = [line for line in run if line.startswith("start-up")]
    assert took > 100  # the recorded start-up: about two minutes
    assert 1 <= len(start_up) <= took // 60 + 1, start_up
    assert start_up[-1].startswith("start-up: ") and not any("\r" in line for line in run)
    assert len(run) <= BUDGET
