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
    assert {"trainers", "run", "preflight", "config", "loss", "tracking", "cpu", "data"} <= packages, packages


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


# ------------------------------------------------------------------------------------------------ import direction

RECIPE_PACKAGES = sorted({path.parent.name for path in PACKAGE.glob("*/__init__.py")} | TOP_LEVEL - {"__init__"})

GROUND = {"config", "dynamic_sampling", "overlong", "loss", "policy_lag", "advantages"}
"""The algorithm's and the configuration's packages: the rest of the recipe builds on them."""
BELOW_EVERYTHING = {"compat", "import_hooks"}
"""The one door to other packages' internals and the post-import hooks: they import nothing of the recipe above."""
ALLOWED_IMPORTS = {
    **{package: GROUND | BELOW_EVERYTHING for package in GROUND},
    "compat": {"compat"},
    "import_hooks": {"compat", "import_hooks"},
}
"""package -> the recipe packages its modules may import (absent: any)."""
FORBIDDEN_IMPORTS = {
    "tracking": {"trainers", "run", "preflight", "main_dapo", "dry_run", "report"},
    "run": {"trainers"},
}
"""package -> recipe packages its modules must not import (what a run shows sits below what runs it; the run's
lifecycle sits below the trainers that drive it)."""


def recipe_imports(source: str) -> set[str]:
    """The recipe packages (or top-level modules) a module imports, at module level or inside functions."""
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] if node.module != "recipe_dapo" else [f"recipe_dapo.{a.name}" for a in node.names]
        else:
            continue
        imported.update(module.split(".")[1] for module in modules
                        if module.startswith("recipe_dapo.") and len(module.split(".")) > 1)
    return imported


def import_direction_violations(package: str, source: str) -> list[str]:
    imported = recipe_imports(source) - {package}
    bad = set()
    if package in ALLOWED_IMPORTS:
        bad |= imported - ALLOWED_IMPORTS[package]
    bad |= imported & FORBIDDEN_IMPORTS.get(package, set())
    return sorted(bad)


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def recipe_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def test_ground_packages_and_tracking_import_nothing_above_them():
    problems = []
    for path in recipe_modules():
        package = package_of(path)
        for bad in import_direction_violations(package, path.read_text()):
            problems.append(f"{path.relative_to(REPO_ROOT)} ({package}) imports recipe_dapo.{bad}")
    assert problems == [], "imports that run upward (move what is shared into the lower package):\n" + "\n".join(problems)


def test_the_import_direction_rules_flag_an_upward_import():
    # Positive control: the rules above see a violation, at module level and inside a function.
    assert import_direction_violations("tracking", "from recipe_dapo.trainers.table import TRAINERS\n") == [
        "trainers"]
    assert import_direction_violations("tracking", "from recipe_dapo.run.step_metrics import STEP_TIME\n") == ["run"]
    assert import_direction_violations("run", "def f():\n    from recipe_dapo.trainers.v1 import trainer\n") == [
        "trainers"]
    assert import_direction_violations("dynamic_sampling", "def f():\n    import recipe_dapo.tracking.console\n") == [
        "tracking"]
    assert import_direction_violations("loss", "from recipe_dapo import preflight\n") == ["preflight"]
    assert import_direction_violations("config", "from recipe_dapo.dynamic_sampling import DynamicSamplingConfig\n") == []
    assert set(GROUND) | set(FORBIDDEN_IMPORTS) <= set(RECIPE_PACKAGES)


# ------------------------------------------------------------------------------------------------ other packages' internals

def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the recipe modules it imports, at module level or inside functions (``from recipe_dapo.pkg import x``
    is module ``recipe_dapo.pkg.x`` when that is a module, else the package ``recipe_dapo.pkg``)."""
    graph = {}
    for module, source in sources.items():
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    imported.add(full if full in sources else node.module)
        graph[module] = {name for name in imported if name in sources and name != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another in a circle (strongly connected components of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_recipe_modules_import_one_another_in_a_circle_function_level_imports_included():
    graph = import_graph({module_name(path): path.read_text() for path in recipe_modules()})
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the graph is the recipe's, not empty
    assert import_circles(graph) == [], (
        "modules that import one another in a circle (an import inside a function closes a circle too): move what both "
        "need below both")


def test_the_circle_check_finds_a_circle_closed_by_an_import_inside_a_function():
    # Positive control: the shape the recipe once had (dry_run -> preflight -> memory_plan -> dry_run, the last a
    # function-level import), and a package whose __init__ is imported by name.
    sources = {
        "recipe_dapo.dry_run": "from recipe_dapo.preflight import check\n",
        "recipe_dapo.preflight": "from recipe_dapo.preflight.memory_plan import plan\n",
        "recipe_dapo.preflight.memory_plan": "def compose_size():\n    from recipe_dapo.dry_run import compose\n",
        "recipe_dapo.config": "",
        "recipe_dapo.config.compose": "import recipe_dapo.config\n",
    }
    assert import_circles(import_graph(sources)) == [
        ["recipe_dapo.dry_run", "recipe_dapo.preflight", "recipe_dapo.preflight.memory_plan"]]


DOCUMENTED_PRIVATE = {"os._exit": "Python documents it as the way a forked child (or a process that must not run exit "
                                  "handlers) exits"}
"""Private-looking names of other packages that their documentation makes public."""
DOCUMENTED_ASSIGNABLE = {"sys.stdout", "sys.stderr"}
"""Module attributes that their documentation says a program may replace."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _python_dunders() -> set[str]:
    """The ``__names__`` Python itself defines (its data model, modules, functions, classes, exceptions), which any code
    may use; any other dunder is a package's own internal (Ray's ``__ray_ready__``, say)."""
    import types

    names = {"__file__", "__path__", "__all__", "__version__", "__wrapped__", "__spec__", "__loader__", "__package__",
             "__builtins__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__", "__next__", "__await__",
             "__getitem__", "__setitem__", "__delitem__", "__len__", "__contains__", "__call__", "__get__", "__set__",
             "__delete__", "__set_name__", "__fspath__", "__index__", "__post_init__", "__dataclass_fields__",
             "__slots__", "__orig_bases__", "__origin__", "__args__", "__self__", "__func__", "__qualname__"}
    for obj in (object, type, types.ModuleType("m"), _python_dunders, BaseException(), property, int, str, dict, list,
                tuple, set, bytes, float, slice, range, types.MethodType, types.CodeType):
        names.update(name for name in dir(obj) if name.startswith("__") and name.endswith("__"))
    return names


PYTHON_DUNDERS = _python_dunders()


def _foreign_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and name not in PYTHON_DUNDERS


def reaches_into_other_packages(source: str) -> list[str]:
    """Where a module touches another package's private names or replaces its module attributes (``recipe_dapo/compat``
    is where that belongs): private imports, ``mod._x`` on a name imported from another package, assignments to an
    imported module's or class's attributes, and ``setattr`` on them."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the dotted module path or object it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "recipe_dapo":
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
                bound[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            if node.module.split(".")[0] == "recipe_dapo":
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if any(_private(part) for part in dotted.split(".")):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                bound[alias.asname or alias.name] = dotted

    def dotted_name(node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in bound:
            return ".".join([bound[node.id], *reversed(parts)])
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = dotted_name(node)
            if dotted and _private(node.attr) and dotted not in DOCUMENTED_PRIVATE:
                found.append(f"line {node.lineno}: {dotted}")
            elif _foreign_dunder(node.attr):  # on any object: a handle's __ray_ready__ is Ray's, whatever holds it
                found.append(f"line {node.lineno}: .{node.attr} (another package's dunder internal)")
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                dotted = dotted_name(element) if isinstance(element, ast.Attribute) else None
                if dotted and dotted not in DOCUMENTED_ASSIGNABLE:
                    found.append(f"line {node.lineno}: replaces {dotted}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in bound):
            found.append(f"line {node.lineno}: {node.func.id} on {bound[node.args[0].id]}")
    return sorted(set(found), key=lambda line: int(line.split(":")[0].split()[1]))


def test_outside_compat_no_module_touches_another_packages_private_names():
    problems = []
    for path in recipe_modules():
        if package_of(path) == "compat":
            continue
        problems += [f"{path.relative_to(REPO_ROOT)} {where}" for where in reaches_into_other_packages(path.read_text())]
    assert problems == [], ("reaches into other packages outside recipe_dapo/compat (move each behind a function there, "
                            "declared with @touches):\n" + "\n".join(problems))


def test_the_internals_scan_flags_private_access_and_patching():
    # Positive control: each kind of reach the scan exists to find.
    source = (
        "import os, sys\n"
        "import ray._private.utils as ray_utils\n"
        "import torch.distributed as dist\n"
        "import verl.trainer.ppo.v1.trainer_base as base\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "from verl.trainer.ppo.ray_trainer import RayPPOTrainer\n"
        "import transfer_queue as tq\n"
        "def f(self):\n"
        "    RayPPOTrainer._save_checkpoint(self)\n"
        "    dist.init_process_group = None\n"
        "    base.Tracking, base.pprint = None, None\n"
        "    setattr(tq, 'kv_put', None)\n"
        "    sys.stderr = None\n"
        "    os._exit(0)\n"
        "    handle = tq.handle()\n"
        "    handle.__ray_ready__.remote(), handle.__class__, handle.__dict__\n"
        "    class W(RayPPOTrainer.__ray_actor_class__): pass\n"
    )
    assert {line.split(": ", 1)[1] for line in reaches_into_other_packages(source)} == {
        "import ray._private.utils",
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry",
        "verl.trainer.ppo.ray_trainer.RayPPOTrainer._save_checkpoint",
        "replaces torch.distributed.init_process_group",
        "replaces verl.trainer.ppo.v1.trainer_base.Tracking",
        "replaces verl.trainer.ppo.v1.trainer_base.pprint",
        "setattr on transfer_queue",
        ".__ray_ready__ (another package's dunder internal)",
        ".__ray_actor_class__ (another package's dunder internal)",
    }


# ------------------------------------------------------------------------------------------------ the package map


def _package_map():
    spec = importlib.util.spec_from_file_location("package_map", REPO_ROOT / "scripts" / "package_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_architecture_md_is_the_package_map_rendered_from_the_code():
    package_map = _package_map()
    rendered = package_map.render()
    assert (REPO_ROOT / "docs" / "architecture.md").read_text() == rendered, (
        "docs/architecture.md is stale: python scripts/package_map.py > docs/architecture.md")
    for folder in sorted(p.parent for p in PACKAGE.glob("*/__init__.py")):  # every package is on the map, described
        assert f"## `recipe_dapo.{folder.name}`" in rendered
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), f"{folder.name} has no docstring"
    assert "| `run.preemption` |" in rendered and "| `compat.verl` |" in rendered


# ------------------------------------------------------------------------------------------------ the suite's own runs

ENVIRON_METHODS = {"update", "pop", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"}


def environment_writes(source: str) -> list[str]:
    """Each place ``source`` changes its own process's environment (``os.environ`` written, ``os.putenv``)."""
    def is_environ(node) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
                 and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ"))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and is_environ(node.value):
            found.append(f"line {node.lineno}: os.environ[...] {'set' if isinstance(node.ctx, ast.Store) else 'del'}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ENVIRON_METHODS and is_environ(node.func.value):
                found.append(f"line {node.lineno}: os.environ.{node.func.attr}")
            elif node.func.attr in ("putenv", "unsetenv") and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "os":
                found.append(f"line {node.lineno}: os.{node.func.attr}")
    return sorted(found, key=lambda line: int(line.split(":")[0].split()[1]))


def test_the_background_runs_never_change_the_test_processs_environment():
    """The e2e suite's shared runs train in background threads of the test session while the unit tests run, some of
    which start Ray in the session's own process: an environment variable set by a background thread, even for a
    moment, reaches whatever such a test starts then (a RAY_AUTH_MODE seen by some of its cluster's processes and not
    others kills its actors before they start). The runs pass environments to their subprocesses instead."""
    problems = []
    for path in sorted((REPO_ROOT / "tests" / "e2e").glob("*.py")):
        problems += [f"{path.relative_to(REPO_ROOT)} {where}" for where in environment_writes(path.read_text())]
    assert problems == [], "give the subprocess an env= instead:\n" + "\n".join(problems)


def test_the_environment_scan_finds_every_kind_of_write():
    # Positive control: each kind of write the scan exists to find, and the reads and copies it must leave alone.
    source = (
        "import os\n"
        "from os import environ\n"
        "os.environ['A'] = '1'\n"
        "del os.environ['A']\n"
        "os.environ.update(B='1')\n"
        "environ.pop('B', None)\n"
        "os.environ.setdefault('C', '1')\n"
        "os.putenv('D', '1')\n"
        "env = dict(os.environ, E='1')\n"
        "env.update(F='1')\n"
        "value = os.environ.get('G')\n"
    )
    assert environment_writes(source) == [
        "line 3: os.environ[...] set", "line 4: os.environ[...] del", "line 5: os.environ.update",
        "line 6: os.environ.pop", "line 7: os.environ.setdefault", "line 8: os.putenv"]
