"""The README's two set-up commands are the ones CI and users run."""

from __future__ import annotations

import re

from conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def quick_start_commands() -> list[str]:
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_quick_start_has_a_run_command_and_a_test_command():
    run_command, test_command = quick_start_commands()
    assert run_command == "bash scripts/install_cpu.sh && bash scripts/run_dapo_cpu.sh"
    assert test_command.startswith("bash scripts/install_cpu.sh cpu,test && ") and "pytest tests" in test_command


def test_ci_runs_the_readme_test_command():
    _, test_command = quick_start_commands()
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert test_command in ci_script


def test_every_script_the_readme_names_exists():
    for path in set(re.findall(r"(scripts/[\w./-]+\.sh)", README)):
        assert (REPO_ROOT / path).exists(), path


def knob_rows() -> list[list[str]]:
    """The cells of the README's knob table (technique, override, paper, recipe default, what it does)."""
    block = README.split("## The DAPO knobs", 1)[1].split("\n#", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("| ")]


def test_the_knob_table_documents_every_keep_rule_and_skip_setting_with_its_default():
    from dataclasses import fields

    from recipe_dapo.dynamic_sampling.config import DynamicSamplingSettings, SkipSettings

    def shown(value) -> str:
        return {True: "true", False: "false", None: "null"}.get(value, str(value)) if not isinstance(value, dict) else "{}"

    rows = knob_rows()
    settings = [(f"keep_rule{suffix}", getattr(DynamicSamplingSettings(), f"keep_rule{suffix}"), "")
                for suffix in ("", "_args")]
    settings += [(f.name, getattr(SkipSettings(), f.name), "skip.") for f in fields(SkipSettings)]
    for name, default, section in settings:
        row = next((r for r in rows if f"dapo.dynamic_sampling.{section}" in r[1]
                    and (f"{section}{name}`" in r[1] or f"`{name}`" in r[1])), None)
        assert row is not None, f"README knob table has no row for dapo.dynamic_sampling.{section}{name}"
        assert shown(default) in row[3], (name, default, row[3])


def test_the_settings_page_holds_the_generated_table_of_every_dapo_setting():
    """Every field and default of every dapo.* section is in docs/settings.md (which the README's Settings section
    links), as generated from the typed settings."""
    from recipe_dapo.config.knobs import settings_rows, with_table

    settings = (REPO_ROOT / "docs" / "settings.md").read_text()
    assert with_table(settings) == settings, "run: python -m recipe_dapo.config.knobs --write docs/settings.md"
    keys = [key for key, _, _ in settings_rows()]
    assert "dapo.dynamic_sampling.skip.explore_step" in keys and "dapo.overlong_filter.enable" in keys
    assert all(f"| `{key}` |" in settings for key in keys)
    assert "](docs/settings.md)" in README


def test_the_readme_is_for_users():
    """A table of contents whose links reach its headings, a length one can read, and nothing that speaks of the
    project's tracker or of folders only its developers have."""
    headings = re.findall(r"^#{2,3} (.+)$", README, re.M)

    def anchor(title: str) -> str:
        return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")

    anchors = {anchor(title) for title in headings}
    contents = README.split("## Contents", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\]\(#([^)]+)\)", contents)
    assert len(links) >= 8 and set(links) <= anchors, set(links) - anchors
    assert len(README.splitlines()) <= 320
    assert not re.search(r"\bissues? \d+", README, re.I)
    assert "../shared" not in README
    assert not re.search(r"\b[0-9a-f]{7}\b", README), "no commit hashes (history goes in CHANGELOG.md)"
    for path in re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", README):
        assert (REPO_ROOT / path).exists(), path


def test_the_gpu_section_says_what_has_run_on_a_gpu_and_what_has_not():
    """What has run on a GPU is the actor's update and the memory plan on one H200 (docs/memory_plan.md records that
    run); no full training step has completed on one, so nothing may say the recipe runs, or was tested, there."""
    gpu = README.split("## On GPUs", 1)[1].split("\n## ", 1)[0]
    assert "**What has run on a GPU:**" in gpu and "**What has not:**" in gpu
    has_run, has_not = gpu.split("**What has run on a GPU:**", 1)[1].split("**What has not:**", 1)
    assert "actor's update" in has_run and "memory plan" in has_run and "H200" in has_run
    assert "full training step" in has_not.split("\n\n", 1)[0]
    memory_plan = (REPO_ROOT / "docs" / "memory_plan.md").read_text()
    assert "## Checked on a GPU" in memory_plan and "card=NVIDIA_H200" in memory_plan  # the run that backs it
    for claim in ("It runs on GPUs", "is tested with vllm", "tested on GPU"):
        assert claim.lower() not in README.lower(), claim
