"""The recipe's sites in other packages' internals (``recipe_dapo.compat``) against the installed packages: each symbol
exists and takes the parameters the recipe passes, the one copied ``__init__`` still equals verl's, the recipe's
subclasses of verl classes use no private name that is not declared, and ``docs/compat.md`` is the generated list.

CI runs this module on verl 0.9.0 too (``tests/e2e/verl_compat_tests.txt``): a verl release that moves, renames or
reshapes one of these symbols fails here, naming it, before any training run meets it."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from recipe_dapo import compat
from recipe_dapo.compat import Site
from recipe_dapo.compat import verl as compat_verl

REPO_ROOT = Path(__file__).resolve().parents[1]
SITES = compat.sites()

_MISSING = object()


def _unwrap_actor(obj):
    """A Ray actor class (``@ray.remote``) stands for the class it was made from."""
    return getattr(obj, "__ray_actor_class__", obj)


def _assigned_in_source(cls: type, name: str) -> bool:
    """``self.<name> = ...`` in the source of ``cls`` or a base: an instance attribute the class sets."""
    for klass in inspect.getmro(cls):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if f"self.{name} =" in source or f"self.{name}: " in source:
            return True
    return False


def resolve(symbol: str):
    """The object a dotted symbol names (importable module first, then attributes); an instance attribute that a
    class sets in its code resolves to that class. ``_MISSING`` when it is not there."""
    parts = symbol.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for index, attribute in enumerate(parts[cut:]):
            obj = _unwrap_actor(obj)
            value = getattr(obj, attribute, _MISSING)
            is_last = index == len(parts) - cut - 1
            if value is _MISSING:
                if is_last and inspect.isclass(obj) and _assigned_in_source(obj, attribute):
                    return obj
                return _MISSING
            obj = value
        return _unwrap_actor(obj)
    return _MISSING


def parameter_names(function) -> list[str]:
    names = [p.name for p in inspect.signature(function).parameters.values()
             if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return names[1:] if names[:1] == ["self"] else names


def shape_problem(site: Site):
    """What is wrong with ``site``'s symbol in the installed packages (None: it has the shape the recipe expects)."""
    obj = resolve(site.symbol)
    if obj is _MISSING:
        return None if site.optional else f"{site.symbol} does not exist"
    if site.params is None:
        return None
    if not callable(obj):
        return f"{site.symbol} is not callable"
    names = parameter_names(obj)
    if names[:len(site.params)] != list(site.params):
        return f"{site.symbol} takes {names}, the recipe passes {list(site.params)}"
    return None


def test_the_sites_are_found_and_cover_every_target_package():
    # The registry itself: if the modules stopped declaring, every contract test below would pass on nothing.
    packages = {site.package for site in SITES}
    assert {"verl", "ray", "vllm", "torch", "transfer_queue", "Python"} <= packages, packages
    assert len(SITES) >= 30
    assert all(site.checked and site.why and site.where for site in SITES)


def predates(site: Site) -> bool:
    """The installed release of the site's package is older than every release it was checked on (verl 0.9.0 for a
    site of the v1 trainer, which needs verl 0.9.1): the recipe does not use the site there."""
    from packaging.version import InvalidVersion, Version

    try:
        installed = Version(importlib.metadata.version(site.package))
        return installed < min(Version(version) for version in site.checked)
    except (InvalidVersion, importlib.metadata.PackageNotFoundError, ValueError):
        return False


@pytest.mark.parametrize("site", SITES, ids=lambda site: f"{site.how}:{site.symbol}")
def test_each_site_has_the_shape_the_recipe_expects(site):
    if site.package == "vllm":
        pytest.importorskip("vllm.model_executor.layers.utils", reason="vLLM is not installed here")
    if predates(site):
        pytest.skip(f"{site.symbol} is used from {site.package} {min(site.checked)} on")
    assert shape_problem(site) is None, shape_problem(site)


def test_the_shape_check_flags_a_missing_symbol_and_a_changed_signature():
    # Positive control: the check above can fail.
    gone = Site("verl.utils.tracking.NoSuchLogger", "calls", ("0.9.1",), "control", "tests")
    renamed = Site("verl.utils.tracking.Tracking", "calls", ("0.9.1",), "control", "tests",
                   params=("project", "experiment_name"))
    private_gone = Site("verl.trainer.ppo.ray_trainer.RayPPOTrainer._no_such_hook", "overrides", ("0.9.1",),
                        "control", "tests", params=())
    assert shape_problem(gone) == "verl.utils.tracking.NoSuchLogger does not exist"
    assert "takes ['project_name', 'experiment_name'" in shape_problem(renamed)
    assert shape_problem(private_gone) is not None
    assert shape_problem(Site(gone.symbol, "reads", ("0.9.1",), "control", "tests", optional=True)) is None
    # A site checked only on a later release is skipped on this one, never one checked on this release or before.
    assert predates(Site("verl.utils.tracking.Tracking", "calls", ("99.0",), "control", "tests"))
    assert not predates(Site("verl.utils.tracking.Tracking", "calls", ("0.9.0", "0.9.1"), "control", "tests"))


def test_instance_attributes_resolve_only_where_the_classs_code_sets_them():
    assert resolve("ray.actor.ActorHandle._ray_actor_creation_function_descriptor") is not _MISSING
    assert resolve("ray.actor.ActorHandle._no_such_descriptor") is _MISSING


VERLS_AGENT_LOOP_WORKER_TQ_INIT = ["super().__init__(*args, **kwargs)", "tq.init()", "self.background_tasks = set()"]


def test_the_copied_agent_loop_worker_init_still_equals_verls():
    """``compat.verl.init_agent_loop_worker_tq`` copies verl's ``AgentLoopWorkerTQ.__init__``: when verl's changes, the
    copy must change with it."""
    worker_class = resolve(compat_verl.AGENT_LOOP_WORKER_TQ)
    tree = ast.parse(textwrap.dedent(inspect.getsource(worker_class.__init__)))
    assert [ast.unparse(statement) for statement in tree.body[0].body] == VERLS_AGENT_LOOP_WORKER_TQ_INIT
    ours = ast.parse(textwrap.dedent(inspect.getsource(compat_verl.init_agent_loop_worker_tq)))
    calls = [ast.unparse(s) for s in ours.body[0].body if not isinstance(s, (ast.Expr, ast.ImportFrom, ast.Import))
             or isinstance(getattr(s, "value", None), ast.Call)]
    assert calls == ["AgentLoopWorker.__init__(worker, *args, **kwargs)", "tq.init()", "worker.background_tasks = set()"]
    copies = [site.symbol for site in SITES if site.how == "copies"]
    assert sorted(copies) == sorted([f"{compat_verl.AGENT_LOOP_WORKER_TQ}.__init__", compat_verl.COPIED_FIT]), (
        "a new copied piece of another package needs a test comparing it with the original, like this one (and "
        "test_the_classic_adapters_copy_of_verls_fit_step_was_read_against_this_verls_fit)")


# ---------------------------------------------------------------------------------------- the recipe's subclasses

EXTERNAL_ROOTS = ("verl", "ray", "vllm", "transfer_queue", "torch", "tensordict", "transformers", "omegaconf")


def recipe_subclasses_of_other_packages() -> list[tuple[str, str]]:
    """(module, class) for every top-level class of the recipe (outside ``compat``) with a base imported from verl, Ray,
    vLLM, TransferQueue, torch or another dependency: the classes whose private names this module checks."""
    package = REPO_ROOT / "recipe_dapo"
    found = []
    for path in sorted(package.rglob("*.py")):
        if "compat" in path.relative_to(package).parts:
            continue
        tree = ast.parse(path.read_text())
        external = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in EXTERNAL_ROOTS:
                external.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                external.update((alias.asname or alias.name).split(".")[0] for alias in node.names
                                if alias.name.split(".")[0] in EXTERNAL_ROOTS)
        module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in tree.body:
            roots = [base for base in node.bases] if isinstance(node, ast.ClassDef) else []
            # A base made by a call (``actor_class(AgentLoopWorkerTQ)``, a remote class's plain class) derives from
            # the class it is given.
            roots = [arg for base in roots for arg in (base.args if isinstance(base, ast.Call) else [base])]
            while any(isinstance(base, ast.Attribute) for base in roots):
                roots = [base.value if isinstance(base, ast.Attribute) else base for base in roots]
            if any(isinstance(base, ast.Name) and base.id in external for base in roots):
                found.append((module, node.name))
    return found


RECIPE_SUBCLASSES = recipe_subclasses_of_other_packages()


def private_names_used(cls: type) -> set[str]:
    """``_name`` (not dunder) that the recipe's classes in ``cls``'s MRO use on ``self``/``cls``/``super()`` or define."""
    used = set()
    for klass in inspect.getmro(cls):
        if not klass.__module__.startswith("recipe_dapo."):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                or (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super")
            ):
                name = node.attr
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            if name and name.startswith("_") and not name.startswith("__"):
                used.add(name)
    return used


def recipe_defined(cls: type, name: str) -> bool:
    """The recipe defines ``name`` itself (a method or an attribute it assigns) and no external class has it."""
    external = [klass for klass in inspect.getmro(cls) if not klass.__module__.startswith("recipe_dapo.")]
    if any(name in vars(klass) for klass in external) or any(_assigned_in_source(k, name) for k in external
                                                               if k is not object):
        return False
    return True


def undeclared_private_names(cls: type) -> list[str]:
    declared = {site.symbol.rsplit(".", 1)[-1] for site in SITES}
    return sorted(name for name in private_names_used(cls) if not recipe_defined(cls, name) and name not in declared)


def test_the_subclass_scan_finds_the_trainers_and_the_agent_loop_worker():
    assert {("recipe_dapo.trainers.classic.trainer", "RayDAPOTrainer"), ("recipe_dapo.trainers.v1.trainer", "DAPOTrainerV1"),
            ("recipe_dapo.trainers.v1.agent_loop", "_DAPOAgentLoopWorkerTQ"),
            ("recipe_dapo.trainers.v1.replay_buffer", "DAPOReplayBuffer")} <= set(RECIPE_SUBCLASSES)


@pytest.mark.parametrize("module, name", RECIPE_SUBCLASSES)
def test_the_recipes_subclasses_of_verl_use_only_declared_private_names(module, name):
    cls = getattr(importlib.import_module(module), name)
    cls = _unwrap_actor(cls)
    assert undeclared_private_names(cls) == [], (
        f"{module}.{name} uses private names of the verl classes it derives from that recipe_dapo/compat/verl.py "
        "does not declare: declare each (with the parameters the recipe relies on) so the contract test checks it")


def test_the_private_name_scan_flags_an_undeclared_verl_hook(tmp_path, monkeypatch):
    # Positive control: a recipe subclass calling a verl private method that compat does not declare.
    path = tmp_path / "probe.py"
    path.write_text("from verl.trainer.ppo.ray_trainer import RayPPOTrainer\n\n\n"
                    "class Probe(RayPPOTrainer):\n"
                    "    def fit(self):\n"
                    "        self._start_profiling()\n"
                    "        self._update_actor(None)\n"
                    "        self._own_helper = 1\n")
    spec = importlib.util.spec_from_file_location("recipe_dapo._compat_probe", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert undeclared_private_names(module.Probe) == ["_start_profiling"]


# ---------------------------------------------------------------------------------------- the generated list


def test_docs_compat_md_is_the_generated_list():
    generated = compat.render()
    on_disk = (REPO_ROOT / "docs" / "compat.md").read_text()
    assert on_disk == generated, "docs/compat.md is stale: python -m recipe_dapo.compat > docs/compat.md"
    assert "`verl.trainer.ppo.v1.trainer_base.Tracking`" in generated  # the rendering lists what is declared


def test_ray_still_gives_every_actor_class_the_members_compat_ray_uses():
    """``compat.ray.actor_class``, ``ready`` and ``run_in_actor`` use the members Ray's ``_modify_class`` adds to every
    actor class; the site check above sees only that the function exists, this one that it still defines them."""
    import ray.actor

    source = inspect.getsource(ray.actor._modify_class)
    for member in ("__ray_actor_class__ = ", "def __ray_ready__(self)", "def __ray_call__("):
        assert member in source, f"ray.actor._modify_class no longer defines {member!r}: update recipe_dapo/compat/ray.py"


def fit_source_sha256() -> str:
    import hashlib

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return hashlib.sha256(textwrap.dedent(inspect.getsource(RayPPOTrainer.fit)).encode()).hexdigest()


def test_the_classic_adapters_copy_of_verls_fit_step_was_read_against_this_verls_fit():
    """The classic adapter repeats the phases of verl's ``RayPPOTrainer.fit`` it keeps (``compat.verl.COPIED_FIT``); a
    verl whose ``fit`` differs from the one the copy was read against fails here, naming what to compare."""
    installed = importlib.metadata.version("verl")
    recorded = compat_verl.COPIED_FIT_SHA256.get(installed)
    assert recorded is not None, (f"the classic adapter's copy of verl's fit step was checked on "
                                  f"{sorted(compat_verl.COPIED_FIT_SHA256)}, not on verl {installed}: compare "
                                  "RayDAPOTrainer.prepare_update/update_actor/log_step with this verl's fit, then record "
                                  "its hash in recipe_dapo/compat/verl.py COPIED_FIT_SHA256")
    assert fit_source_sha256() == recorded, (f"verl {installed}'s RayPPOTrainer.fit is not the one the classic adapter's "
                                             "copy was read against: compare and record the new hash")
