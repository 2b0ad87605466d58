"""The multi-node start-up check's verdicts and the placement line, from the probes' and Ray's own records."""

from __future__ import annotations

import pytest

from conftest import fresh_pythons
from recipe_dapo.run.nodes import placement_summary, plugin_problems

NODES = [
    {"NodeID": "aa11", "NodeManagerAddress": "10.0.0.1", "NodeManagerHostname": "head"},
    {"NodeID": "bb22", "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "worker-1"},
    {"NodeID": "cc33", "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "worker-2"},
]
OK = {"missing": [], "error": None}


def test_every_node_registered_is_no_problem():
    assert plugin_problems(NODES, {node["NodeID"]: OK for node in NODES}, "the task runner") is None


def test_only_the_nodes_without_the_recipe_are_named_with_the_fix():
    reports = {
        "aa11": OK,
        "bb22": {"missing": ["recipe_dapo.plugin"], "error": "`import verl` did not load recipe_dapo.plugin"},
        # cc33 never answered: counted as lacking, not as fine
    }
    message = plugin_problems(NODES, reports, "the task runner")
    assert "not registered on 2 of 3 Ray node(s) (checked from the task runner)" in message
    assert "Ray node bb22 (10.0.0.2, worker-1): missing ['recipe_dapo.plugin']" in message
    assert "Ray node cc33 (10.0.0.3, worker-2)" in message and "the probe did not run" in message
    assert "aa11" not in message
    assert "pip install -e ." in message and "scripts/ray_job_submit.sh" in message
    assert "VERL_USE_EXTERNAL_MODULES=recipe_dapo.plugin" in message


def test_the_probe_in_a_fresh_process_sees_what_import_verl_registered():
    """Outside Ray the probe needs a node id; the rest is what a fresh worker on a node would report."""
    code = (
        "import ray, sys\n"
        "ray.get_runtime_context = lambda: type('C', (), {'get_node_id': lambda self: 'n0'})()\n"
        "from recipe_dapo.run.nodes import probe_this_process\n"
        "assert 'recipe_dapo.plugin' not in sys.modules  # the probe's module registers nothing by itself\n"
        "report = probe_this_process()\n"
        "print(report['missing'], report['plugin_loaded'])\n"
    )
    def env(**extra):
        import os

        environ = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
        return dict(environ, **extra, VERL_PLATFORM="cpu")

    installed, bare, shipped = fresh_pythons(
        (code, env()),
        (code, env(VERL_USE_EXTERNAL_PLUGINS="none")),
        # The job's runtime env (scripts/runtime_env.yaml) registers it without the entry point.
        (code, env(VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES="recipe_dapo.plugin")),
    )
    assert installed == "[] True"
    assert bare == "['recipe_dapo.plugin'] False"
    assert shipped == "[] True"


def test_placement_groups_ranks_and_replicas_by_node():
    summary = placement_summary(["aa11", "bb22"], [(0, "aa11"), (1, "bb22")])
    assert summary == {
        "aa11": {"actor_ranks": [0], "rollout_replicas": [0]},
        "bb22": {"actor_ranks": [1], "rollout_replicas": [1]},
    }
    # A replica larger than a node has one server per node: listed once on each.
    assert placement_summary(["aa11", "aa11"], [(0, "aa11"), (0, "aa11")]) == {
        "aa11": {"actor_ranks": [0, 1], "rollout_replicas": [0]}
    }


def test_the_driver_checks_every_node_before_the_task_runner_starts(monkeypatch):
    """verl's run_ppo calls ``task_runner_class.remote()`` (or ``.options(...).remote()``): the node check runs
    first and a refusal means no task runner was asked for; with the check off it is not run."""
    from recipe_dapo.plugin import PluginNotLoadedError
    from recipe_dapo.run import nodes

    calls = []

    class Runner:
        def __init__(self, options=None):
            self.options_given = options

        def options(self, **options):
            return Runner(options)

        def remote(self, *args):
            calls.append(("runner", self.options_given))
            return "handle"

    def check(where):
        calls.append(("check", where))
        if refuse:
            raise PluginNotLoadedError("recipe_dapo is not registered on 1 of 2 Ray node(s)")

    monkeypatch.setattr(nodes, "check_every_node", check)
    refuse = True
    with pytest.raises(PluginNotLoadedError):
        nodes.CheckedOnEveryNode(Runner()).remote()
    assert calls == [("check", "the driver, before the task runner starts")]
    refuse, calls[:] = False, []
    assert nodes.CheckedOnEveryNode(Runner()).options(runtime_env={"nsight": {}}).remote() == "handle"
    assert calls == [("check", "the driver, before the task runner starts"), ("runner", {"runtime_env": {"nsight": {}}})]
    calls.clear()
    nodes.CheckedOnEveryNode(Runner(), enabled=False).remote()
    assert calls == [("runner", None)]
