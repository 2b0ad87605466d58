"""What runs on which Ray node: the start-up plugin check on every node, and where the workers and replicas landed.

A multi-node run reaches the recipe on each node separately: installed there (the ``verl.plugins`` entry point), or
shipped in the Ray job's runtime environment (``scripts/ray_job_submit.sh``, whose ``scripts/runtime_env.yaml``
sets ``VERL_USE_EXTERNAL_MODULES=recipe_dapo.plugin``). A node without it starts verl's workers fine and fails much
later ("unknown policy loss dapo", "unknown reward manager"), or trains with something else. So the driver asks one
fresh Ray worker on EVERY alive node, once Ray is up and before the task runner starts (:class:`CheckedOnEveryNode`),
whether ``import verl`` registered the recipe there, and names each node that did not, with the fix.

The probe runs in a fresh process (``max_calls=1``: Ray's pooled workers may have imported the recipe already)
and imports ``verl`` before anything of the recipe that registers, as verl's own workers do; only this module
(which imports no registry) is imported first, to unpickle the probe. Pure formatting (:func:`plugin_problems`,
:func:`placement_summary`) is kept apart from the Ray calls so that it is tested without a cluster.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any, Iterable, Optional

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0
FIX = (
    "install the recipe into the Python environment every node's Ray workers use (`pip install -e .` or the same "
    "image on every node), or ship it with the job's runtime environment (`bash scripts/ray_job_submit.sh ...`: "
    "scripts/runtime_env.yaml sets VERL_USE_EXTERNAL_MODULES=recipe_dapo.plugin), and leave VERL_USE_EXTERNAL_PLUGINS "
    "unset, 'auto' or including 'recipe_dapo' on every node"
)


def probe_this_process() -> dict[str, Any]:
    """What ``import verl`` registered of the recipe in this process (run on each node by :func:`check_every_node`)."""
    import ray

    report: dict[str, Any] = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "plugins_policy": os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto"),
        "missing": [],
        "error": None,
    }
    try:
        import verl  # noqa: F401  (loads the verl.plugins entry points, or VERL_USE_EXTERNAL_MODULES)

        report["plugin_loaded"] = "recipe_dapo.plugin" in sys.modules
        if not report["plugin_loaded"]:
            report["missing"] = ["recipe_dapo.plugin"]
            report["error"] = (
                "`import verl` did not load recipe_dapo.plugin (no 'verl.plugins' entry point for recipe_dapo in "
                f"this environment, or VERL_USE_EXTERNAL_PLUGINS={report['plugins_policy']!r} excludes it)"
            )
            return report
        from recipe_dapo.plugin import registered_components, registration_errors

        report["missing"] = [name for name, ok in registered_components().items() if not ok]
        errors = registration_errors()
        if errors:
            report["error"] = f"registering failed: {errors}"
    except Exception as exc:  # verl or the recipe's modules fail to import on this node
        report["missing"] = report["missing"] or ["recipe_dapo.plugin"]
        report["error"] = repr(exc)
    return report


def plugin_problems(nodes: Iterable[dict[str, Any]], reports: dict[str, dict[str, Any]], where: str) -> Optional[str]:
    """The error for the nodes whose probe says the recipe is not registered (None when every node has it).

    ``nodes``: ``ray.nodes()`` entries (``NodeID``, ``NodeManagerAddress``, ``NodeManagerHostname``);
    ``reports``: node id -> :func:`probe_this_process`'s answer, or ``{"missing": [...], "error": str}`` for a node
    whose probe failed or did not answer.
    """
    nodes = list(nodes)
    bad = []
    for node in nodes:
        report = reports.get(node["NodeID"]) or {"missing": ["recipe_dapo.plugin"], "error": "the probe did not run"}
        if report.get("missing"):
            bad.append(
                f"  - Ray node {node['NodeID']} ({node.get('NodeManagerAddress', '?')}, "
                f"{node.get('NodeManagerHostname', '?')}): missing {report['missing']}"
                + (f": {report['error']}" if report.get("error") else "")
            )
    if not bad:
        return None
    return (
        f"recipe_dapo is not registered on {len(bad)} of {len(nodes)} Ray node(s) (checked from {where}); verl's "
        "workers there would not find the `dapo` loss, the `recipe_dapo` reward manager or the seeded agent loop:\n"
        + "\n".join(bad)
        + f"\nFix: {FIX}."
    )


def check_every_node(where: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """Probe every alive Ray node; raise :class:`recipe_dapo.plugin.PluginNotLoadedError` naming the nodes without
    the recipe. Returns the probes' reports (one per node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from recipe_dapo.plugin import PluginNotLoadedError

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    probe = ray.remote(num_cpus=0, max_calls=1, max_retries=0)(probe_this_process)
    refs = {
        node["NodeID"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        ).remote()
        for node in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    reports: dict[str, dict[str, Any]] = {}
    for node_id, ref in refs.items():
        if ref not in ready:
            reports[node_id] = {"missing": ["recipe_dapo.plugin"], "error": f"the probe did not answer in {timeout_s:.0f} s"}
            ray.cancel(ref, force=True)
            continue
        try:
            reports[node_id] = ray.get(ref)
        except Exception as exc:  # e.g. the probe cannot be unpickled: recipe_dapo is not importable there
            reports[node_id] = {"missing": ["recipe_dapo"], "error": f"the probe failed: {_first_line(exc)}"}
    problem = plugin_problems(nodes, reports, where)
    if problem:
        raise PluginNotLoadedError(problem)
    # printed: verl's workers log at WARN, and this line is what a multi-node launch wants to see
    print(f"recipe_dapo is registered on every Ray node ({len(nodes)}): {', '.join(sorted(reports))}", flush=True)
    return list(reports.values())


class CheckedOnEveryNode:
    """A task runner class as verl's ``run_ppo`` starts it (``.remote()``, or ``.options(...).remote()``), with every
    Ray node probed from the driver first: once ``run_ppo`` has joined or started the cluster and before the task
    runner exists. Checked there, not in the task runner: unpickling the task runner imports verl's trainer, which on
    a node without the recipe can fail before any check of the recipe's runs ("Unknown platform 'cpu'")."""

    def __init__(self, runner_class: Any, enabled: bool = True):
        self.runner_class, self.enabled = runner_class, enabled

    def options(self, **options: Any) -> "CheckedOnEveryNode":
        return CheckedOnEveryNode(self.runner_class.options(**options), self.enabled)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self.enabled:
            check_every_node(where="the driver, before the task runner starts")
        return self.runner_class.remote(*args, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # A RayTaskError's text ends with the remote exception: keep the last informative line.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else repr(exc)


def placement_summary(actor_nodes: list[str], server_nodes: list[tuple[int, str]]) -> dict[str, dict[str, list[int]]]:
    """node id -> {"actor_ranks": [...], "rollout_replicas": [...]} from the actor ranks' and replica servers' nodes."""
    summary: dict[str, dict[str, list[int]]] = {}
    for rank, node in enumerate(actor_nodes):
        summary.setdefault(node, {"actor_ranks": [], "rollout_replicas": []})["actor_ranks"].append(rank)
    for replica, node in server_nodes:
        entry = summary.setdefault(node, {"actor_ranks": [], "rollout_replicas": []})
        if replica not in entry["rollout_replicas"]:
            entry["rollout_replicas"].append(replica)
    return summary


def log_placement(actor_workers: list, replicas: list) -> dict[str, dict[str, list[int]]]:
    """Log (and return) which Ray node holds each actor rank and each rollout replica's server(s).

    One printed line, ``placement: node <id>: actor ranks [...], rollout replicas [...]; ...``: what a multi-node launch
    wants to see first (every node used, ranks where expected).
    """
    import ray

    from recipe_dapo.compat.ray import run_in_actor

    def node_of(actor) -> Any:
        return run_in_actor(actor, lambda self: ray.get_runtime_context().get_node_id())

    actor_nodes = ray.get([node_of(worker) for worker in actor_workers])
    servers = [(replica.replica_rank, server) for replica in replicas for server in getattr(replica, "servers", [])]
    server_nodes = list(zip([rank for rank, _ in servers], ray.get([node_of(server) for _, server in servers])))
    summary = placement_summary(actor_nodes, server_nodes)
    print(
        "placement: "
        + "; ".join(
            f"node {node}: actor ranks {entry['actor_ranks']}, rollout replicas {entry['rollout_replicas']}"
            for node, entry in summary.items()
        ),
        flush=True,
    )
    return summary
