"""Where things live: the package's top level stays small, and every command the documentation and the scripts name
(``python -m recipe_dapo.X``, setup.py's entry points) is a module that exists and runs, so a move or a rename that
forgets one of them fails here rather than on a user's cluster."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import recipe_dapo

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(recipe_dapo.__file__).parent

# The package's face, the entry point, the dry run, the verl plugin, the import hooks, and the run report
# (`python -m recipe_dapo.report`); everything else lives in a package named for its concept.
TOP_LEVEL = {"__init__", "main_dapo", "dry_run", "plugin", "import_hooks", "report"}

# `python -m recipe_dapo.x.y` in prose and shell, `"-m", "recipe_dapo.x.y"` in Python.
MODULE_COMMAND = re.compile(r"""-m"?,?\s+["']?(recipe_dapo(?:\.\w+)*)""")


def documented_files() -> list[Path]:
    files = [REPO_ROOT / "README.md", REPO_ROOT / "setup.py", *REPO_ROOT.glob("docs/**/*.md")]
    for folder in ("scripts", "bench", "data_prep", ".ci"):
        files += [path for path in (REPO_ROOT / folder).rglob("*") if path.is_file()
                  and (path.suffix in (".sh", ".py", ".md", ".yaml") or path.name == "run")]
    return sorted(files)


def commands_named() -> dict[str, list[str]]:
    """Each module named after ``-m``, with the files that name it."""
    named: dict[str, list[str]] = {}
    for path in documented_files():
        for module in MODULE_COMMAND.findall(path.read_text(errors="replace")):
            named.setdefault(module, []).append(str(path.relative_to(REPO_ROOT)))
    return named


def test_the_top_level_holds_six_modules_and_the_rest_is_in_packages():
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    assert modules == TOP_LEVEL, (f"new at the top level: {sorted(modules - TOP_LEVEL)} (move it into the package of "
                                  f"its concept); gone: {sorted(TOP_LEVEL - modules)}")
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert {"trainers", "preflight", "config", "loss", "tracking", "cpu", "data"} <= packages, packages


COMMANDS = commands_named()


def test_the_documents_and_scripts_name_the_commands_users_run():
    # The scan itself: if the pattern stopped matching, every command test below would pass on nothing.
    assert {"recipe_dapo.main_dapo", "recipe_dapo.dry_run", "recipe_dapo.report",
            "recipe_dapo.preflight.install"} <= set(COMMANDS), sorted(COMMANDS)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_named_command_is_a_module_that_runs(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"`python -m {module}` (named in {COMMANDS[module]}) does not exist"
    if spec.submodule_search_locations:  # a package runs through its __main__
        main = Path(spec.origin).parent / "__main__.py"
        assert main.exists(), f"`python -m {module}` (named in {COMMANDS[module]}): a package without __main__.py"
    else:
        source = Path(spec.origin).read_text()
        assert re.search(r"""^if __name__ == ["']__main__["']:""", source, re.M), (
            f"`python -m {module}` (named in {COMMANDS[module]}) has no `if __name__ == \"__main__\":`")


def entry_points() -> list[tuple[str, str]]:
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            targets = [item.split("=", 1)[1].strip() for items in ast.literal_eval(node.value).values()
                       for item in items]  # "name = module" or "name = module:function"
            return [(module, function) for module, _, function in (target.partition(":") for target in targets)]
    raise AssertionError("setup.py declares no entry_points")


def test_setup_entry_points_name_modules_and_functions_that_exist():
    points = entry_points()
    assert ("recipe_dapo.plugin", "") in points  # verl.plugins
    for module, attribute in points:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"setup.py entry point {module}: no such module"
        if attribute:
            defined = {node.name for node in ast.parse(Path(spec.origin).read_text()).body
                       if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
            assert attribute in defined, f"setup.py entry point {module}:{attribute}: {module} defines no {attribute}"
