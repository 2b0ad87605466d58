"""The run report (recipe_dapo/report.py): panels, summary figures, side-by-side runs, the tokens axis, gaps.

The fixture tests/fixtures/metrics_cpu_run.jsonl is the metrics file of a real 6-step CPU run, made by:

    PYTHON=.venv/bin/python WORK_DIR=/tmp/report_run bash scripts/run_dapo_cpu.sh \
        trainer.total_training_steps=6 trainer.test_freq=3
    sed 1d /tmp/report_run/recipe_dapo/dapo_cpu.jsonl > tests/fixtures/metrics_cpu_run.jsonl

(the chain-arithmetic default task, float32 training, the behaviour-policy correction's policy_lag metrics, the
selection metrics; the first
line, the validation before training at step 0, left out, as the run had it before validating first)
(validation at steps 3 and 6, dapo loss, dynamic sampling; no overlong filter, so overlong/filtered_ratio is absent).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from recipe_dapo import report  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "metrics_cpu_run.jsonl"


def records(path=FIXTURE):
    """step -> merged metrics, read here without the recipe's reader."""
    merged = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(row["data"])
    return merged


def grid_axes(figure):
    """The panels' axes (titled) and, per panel, its lines including those of a second y axis."""
    titled = [ax for ax in figure.axes if ax.get_title()]
    lines = {ax.get_title(): [line for other in figure.axes if other.get_position().bounds == ax.get_position().bounds
                              for line in other.get_lines()] for ax in titled}
    return titled, lines


def test_the_real_run_fills_every_panel():
    figure = report.build_figure([report.load_run(FIXTURE)])
    titled, lines = grid_axes(figure)
    assert [ax.get_title() for ax in titled] == [panel.title for panel in report.PANELS]
    for title, panel_lines in lines.items():
        assert panel_lines and all(len(line.get_xdata()) for line in panel_lines), title
    metrics = records()
    steps = sorted(metrics)
    accuracy = lines[report.TRAIN_ACCURACY.title][0]
    assert accuracy.get_xdata().tolist() == steps
    assert accuracy.get_ydata().tolist() == [metrics[s]["reward/acc_mean"] for s in steps]
    # Validation at steps 3 and 6: mean@4 and pass@4 (the largest pass@j) of the one data source.
    mean, passes = lines[report.VALIDATION.title]
    assert mean.get_xdata().tolist() == [3, 6] and passes.get_linestyle() == "--"
    assert passes.get_ydata().tolist() == [metrics[s]["val/chain_arithmetic/pass@4"] for s in (3, 6)]
    # Keep rate, and rounds on the second y axis; three clip fractions; step time = generation + the rest.
    keep, rounds = lines[report.KEEP_RATE_AND_ROUNDS.title]
    assert rounds.get_ydata().tolist() == [metrics[s]["dynamic_sampling/num_gen_rounds"] for s in steps]
    assert len(lines[report.CLIP_FRACTIONS.title]) == 3
    generation, rest = lines[report.STEP_TIME_PANEL.title]
    assert np.allclose(generation.get_ydata() + rest.get_ydata(), [metrics[s]["timing_s/step"] for s in steps])
    # This run had no overlong filter: the overlong panel draws the truncated share and says what is missing.
    overlong = next(ax for ax in titled if ax.get_title() == report.OVERLONG.title)
    assert [t.get_text() for t in overlong.texts] == ["not logged: filtered from the loss"]


def test_the_summary_names_the_figures_of_the_metrics_file(tmp_path, capsys):
    run_dir = tmp_path / "my_run"
    (run_dir / "recipe_dapo").mkdir(parents=True)
    shutil.copy(FIXTURE, run_dir / "recipe_dapo" / "dapo_cpu.jsonl")  # the layout scripts/run_dapo_cpu.sh leaves
    report.main([str(run_dir)])
    assert capsys.readouterr().out.split() == ["wrote", str(run_dir / "run_report.png"),
                                               "wrote", str(run_dir / "run_report.md")]
    assert (run_dir / "run_report.png").stat().st_size > 50_000
    text = (run_dir / "run_report.md").read_text()
    metrics = records()
    steps = sorted(metrics)
    acc = [metrics[s]["reward/acc_mean"] for s in steps]
    keep = [metrics[s]["dynamic_sampling/keep_rate"] for s in steps if "dynamic_sampling/keep_rate" in metrics[s]]
    generated = sum(metrics[s]["dynamic_sampling/generated_tokens"] for s in steps)
    trained = sum(metrics[s]["training/response_tokens"] for s in steps)  # no overlong filter in this run
    seconds = sum(metrics[s]["timing_s/step"] + metrics[s].get("timing_s/testing", 0) for s in steps)
    last = metrics[6]
    expected = (
        f"| my_run | 6 (1-6) | {acc[-1]:.3f} / {max(acc):.3f} (step {steps[int(np.argmax(acc))]}) | "
        f"step 6: chain_arithmetic: mean@4 {last['val/chain_arithmetic/mean@4']:.3f} "
        f"pass@4 {last['val/chain_arithmetic/pass@4']:.3f} (121 problems) | {np.mean(keep):.3f} | "
        f"{generated:,.0f} | {trained:,.0f} ({100 * trained / generated:.0f}%) | "
        f"{int(round(seconds)) // 60}m{int(round(seconds)) % 60:02d}s |"
    )
    assert expected in text
    assert "![run report](run_report.png)" in text and str(run_dir / "recipe_dapo" / "dapo_cpu.jsonl") in text


def test_two_runs_share_the_axes_one_colour_each(tmp_path):
    other = tmp_path / "half_accuracy.jsonl"  # the same run with half the training accuracy
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for row in rows:
        if "reward/acc_mean" in row["data"]:
            row["data"]["reward/acc_mean"] /= 2
    other.write_text("".join(json.dumps(row) + "\n" for row in rows))
    runs = [report.load_run(FIXTURE), report.load_run(other)]
    figure = report.build_figure(runs)
    titled, lines = grid_axes(figure)
    assert all(titled[0].get_shared_x_axes().joined(titled[0], ax) for ax in titled)
    first, second = lines[report.TRAIN_ACCURACY.title]
    assert first.get_color() != second.get_color()
    assert np.allclose(second.get_ydata(), first.get_ydata() / 2)
    assert [text.get_text() for text in figure.legends[0].get_texts()] == ["metrics_cpu_run", "half_accuracy"]


def test_by_generated_tokens_the_x_axis_is_the_cumulative_generated_tokens(tmp_path):
    report.main([str(FIXTURE), "--x", "tokens", "--out", str(tmp_path)])
    metrics = records()
    cumulative = np.cumsum([metrics[s]["dynamic_sampling/generated_tokens"] for s in sorted(metrics)])
    figure = report.build_figure([report.load_run(FIXTURE)], axis="tokens")
    _, lines = grid_axes(figure)
    assert lines[report.ENTROPY_PANEL.title][0].get_xdata().tolist() == cumulative.tolist()
    assert lines[report.VALIDATION.title][0].get_xdata().tolist() == [cumulative[2], cumulative[5]]  # steps 3, 6
    assert (tmp_path / "run_report.png").exists() and "generated tokens" in (tmp_path / "run_report.md").read_text()


def test_a_run_without_some_metrics_gets_not_logged_panels(tmp_path):
    sparse = tmp_path / "sparse.jsonl"
    sparse.write_text("".join(json.dumps({"step": s, "data": {"reward/acc_mean": 0.1 * s, "actor/entropy": 1.0}}) + "\n"
                              for s in (1, 2, 3)))
    figure = report.build_figure([report.load_run(sparse)])
    titled, lines = grid_axes(figure)
    drawn = {ax.get_title() for ax in titled if not ax.texts}
    assert drawn == {report.TRAIN_ACCURACY.title, report.ENTROPY_PANEL.title}
    for ax in titled:
        if ax.get_title() not in drawn:
            assert ax.texts[0].get_text().startswith("not logged") and not lines[ax.get_title()]
    report.main([str(sparse)])
    row = next(line for line in (tmp_path / "run_report.md").read_text().splitlines() if line.startswith("| sparse"))
    assert row == "| sparse | 3 (1-3) | 0.300 / 0.300 (step 3) | none | " + " | ".join(["not logged"] * 4) + " |"
    with pytest.raises(SystemExit, match="--x tokens needs dynamic_sampling/generated_tokens"):
        report.main([str(sparse), "--x", "tokens"])


def test_without_matplotlib_the_report_writes_its_summary_and_names_the_command_that_adds_the_plots(
        monkeypatch, tmp_path, capsys):
    import subprocess
    import sys

    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.lines",
                 "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)
    report.main([str(FIXTURE), "--out", str(tmp_path)])  # no SystemExit: the summary is the report's main part
    printed = capsys.readouterr().out.strip()
    assert not (tmp_path / report.REPORT_PNG).exists()
    summary = (tmp_path / report.REPORT_MD).read_text()
    assert "| metrics_cpu_run | 6 (1-6) |" in summary and "![run report]" not in summary
    command = report.install_hint()
    assert printed == (f"wrote {tmp_path / report.REPORT_MD} (no plots: the run report's plots need matplotlib, which "
                       f"this environment lacks; to add them: {command})")
    assert command in summary
    # The command is this environment's own pip, and it runs: `<python> -m pip install 'matplotlib>=3.7'`.
    python, rest = command.split(" -m pip install ")
    assert Path(python).resolve() == Path(sys.executable).resolve() and rest == f"'{report.MATPLOTLIB}'"
    assert subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def test_every_install_draws_the_report():
    """matplotlib is in setup.py's install_requires, as the report asks for it: the environment the README's first
    command makes (scripts/install_cpu.sh, extras 'cpu') draws without another install."""
    import ast

    setup = ast.parse((Path(__file__).parents[1] / "setup.py").read_text())
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in setup.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and not isinstance(node.value, ast.Call)}
    call = next(node for node in ast.walk(setup) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    requires = next(keyword.value for keyword in call.keywords if keyword.arg == "install_requires")
    listed = []
    for element in requires.elts:
        if isinstance(element, ast.Starred):
            listed += constants[element.value.id]
        elif isinstance(element, ast.Constant):
            listed.append(element.value)
        else:
            listed.append(constants[element.id])
    assert report.MATPLOTLIB in listed, listed
    # The CPU pins hold a matplotlib that satisfies it (the offline wheelhouse installs the pinned one).
    pins = (Path(__file__).parents[1] / "scripts" / "constraints-cpu.txt").read_text().splitlines()
    assert any(line.startswith("matplotlib==3.") for line in pins)
