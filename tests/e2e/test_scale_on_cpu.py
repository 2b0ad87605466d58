"""The recipe at scale on CPU, as an operator runs it: two data-parallel ranks on a two-node Ray cluster whose nodes
have verl 0.9.0 (the older release the recipe supports, as on an existing cluster) but not the recipe, the CPU run
sent as a Ray job, and its step 1 against one rank (``classic_run``, on the main environment's verl 0.9.1).

One training launch of its own (its DP 1 reference is the session's ``classic_run``, whose shape it shares:
``TRAINERS["classic"]`` in tests/e2e/e2e_runs.py) and one short job that stops at the start-up check, both sent in the
background while the unit tests run (``run_scale_job``, one of tests/e2e/e2e_runs.py's JOBS; the tests read its
record):

- **The cluster** (``OperatorCluster``): ``ray start --head --num-gpus=1 ...`` and ``ray start --address=HEAD
  --num-gpus=1 ...`` on this machine, each node a raylet of its own with its own ports and stand-in GPU, both from a
  virtual environment that has verl, vLLM, Ray and every other dependency of the main one but NOT the recipe
  (``verl_only_python``: its site-packages links every entry of the main one except the recipe's editable install
  and its dist-info, so neither ``import recipe_dapo`` nor the ``verl.plugins`` entry point exists there; checked),
  and whose verl is the session's verl 0.9.0 overlay (tests/e2e/e2e_runs.py, ``verl_overlay``; the main verl when
  the package index is unreachable). This job is the suite's training run on verl 0.9.0: the driver, the task runner
  and the workers import the nodes' verl (checked through the files verl's warnings name).
- **The Ray job**: ``scripts/ray_job_submit.sh scripts/run_dapo_cpu.sh trainer.nnodes=2 trainer.n_gpus_per_node=1``
  with the repository as the job's working directory and ``scripts/runtime_env.yaml`` (``VERL_USE_EXTERNAL_MODULES=
  recipe_dapo.plugin``): DP 2 (FSDP2 over gloo across the nodes), one vLLM-CPU rollout replica per node, dynamic
  sampling, overlong filtering and budget-limited partial steps (one mini-batch of the two a full step holds).
- **The same job without VERL_USE_EXTERNAL_MODULES** (a runtime env that only ships the code): the driver's check of
  every node (``run/nodes.CheckedOnEveryNode``, once Ray is up and before the task runner starts) names every
  node that lacks the recipe, with the fix, and the job ends before any worker group or step.

Exactness, on identical rollouts (seeded, checked equal): step 1 is one mini-batch holding the whole batch, so the
update at DP 2 must equal the update at DP 1 up to float effects. What this shows: the job's dispatch, its gloo
all-reduce across the two nodes and the nodes' verl 0.9.0 compute step 1 as one rank on verl 0.9.1 does. What it
cannot show: that the token-level loss is normalised by the whole mini-batch's token count. verl's ``balance_batch``
is on and every prompt of the default data has the same token count, so the two ranks hold nearly equal loss-token
counts (balancing counts the tokens of a response the overlong filter zeroed, the loss does not), where a per-rank
token mean is within a hair of the global one; this comparison would pass with one. That is checked on ranks with
unequal token counts, balancing on and off, with a per-rank-mean control that must fail the same tolerances, by
tests/test_dp_token_mean_on_cpu.py (its spread over repeats: bench/dp_token_mean.py). The tolerances here come from
measured figures (one run each, 2026-11-24, on the tiny model's step 1): what legitimate regrouping moves, and what
a broken loss moved on another split than the job's.

- Legitimate: DP 2 against DP 1 moved ``actor/pg_loss`` by 7.6e-7 relative and ``actor/grad_norm`` by 4.0e-4; DP 1
  in two micro-batches instead of one moved them by 3.8e-7 and 1.0e-5. In both, 44-47 of the 107,072 weights got
  an Adam step of the other sign (a gradient within float noise of 0: Adam's first step is about ``lr * sign(g)``),
  and the other weights' updates differed by 7-8e-4 relative L2. Why DP 2's gradient norm moves 40 times more than
  two micro-batches do is not explained (the loss, the rows and the scale are the same). verl's FSDP engine computes
  with bfloat16 parameters here (``fsdp_config.mixed_precision`` is unset): in tests/test_dp_token_mean_on_cpu.py's
  setting DP 2 moved the gradient by about 2e-3 relative, and by 9e-8 with FSDP computing in float32.
- Across releases: with the nodes on verl 0.9.0 and the DP 1 reference on verl 0.9.1, the figures were the same to
  the digits above (7.6e-7, 4.0e-4, 44 weights, 8.3e-4; one run): the two releases compute step 1 alike, so the
  comparison still isolates DP. A release that changed the step would fail it, naming the metric.
- Broken: a per-rank token-mean (each rank normalising by its own loss tokens, then the ranks averaged), computed
  in-process with the same tiny model on 32 rows split in two (not the job's balanced ranks, on which it would move
  less): the gradient norm moved by 1.1e-2, the gradient by 2.0e-2 relative, and 478 weights (0.45 %) got an Adam
  step of the other sign. A loss scaled wrongly by the DP size doubles ``grad_norm``, which this comparison does
  catch; a sampler that hands the ranks other rows fails the rollout comparison first.

So: ``pg_loss`` within 1e-4, ``grad_norm`` within 3e-3 (7x the measured DP 2 figure, 3.7x under that split's
per-rank mean), at most 1 in 1,000 moved weights with a step of the other sign (the measured 0.04 % and 0.45 %), and
the others within 3e-3 relative L2.

Not run here (so CI stays short): the non-exact variants themselves. GPU numerics, NCCL and real multi-host
networking are not covered by any CPU test (README, "At scale").
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

# (classic_run, the DP 1 reference, and verl_overlay, the nodes' verl: session fixtures, tests/conftest.py)
from e2e_runs import OLDER_VERL, REPO_ROOT, TRAINERS, in_background, kill_group, logged_steps, site_packages

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1800),
]

# Each node as an operator would declare it on a GPU machine with one GPU: `--num-gpus=1` (a stand-in on CPU), and
# enough logical CPUs for verl's placement-group bundles (the CPU platform's 16 per rank, config/platform/cpu.yaml).
NODE_RESOURCES = ("--num-cpus=16", "--num-gpus=1", f"--object-store-memory={256 * 1024**2}")
# The main environment's entries that make the recipe importable (its editable install) or discoverable by verl
# (its dist-info, which holds the `verl.plugins` entry point).
RECIPE_ENTRIES = re.compile(r"^(recipe_dapo[-_.].*|__editable__[._]+recipe_dapo.*)$")
# Ray 2.60's `ray start --head` turns token authentication on when ~/.ray/auth_token exists (any earlier local
# ray.init() on this machine writes one), and then every client must send it; the test cluster (its dashboard on
# 127.0.0.1, up for minutes) runs without: set in the environments of the nodes and of the job's processes, never in
# this process's (``OperatorCluster.alive_nodes``).
RAY_AUTH = {"RAY_AUTH_MODE": "disabled"}
# What the test's own environment sets that a cluster node would not have.
NOT_ON_THE_CLUSTER = ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS", "VERL_USE_EXTERNAL_MODULES",
                      "VERL_USE_EXTERNAL_PLUGINS", "DAPO_CONSOLE_TAG", "DAPO_LOG_FILE", "VERL_FILE_LOGGER_ROOT")


# verl's own entries in a site-packages folder (the package and its metadata).
VERL_ENTRIES = re.compile(r"^verl(-[\d.]+\.dist-info)?$")


def node_verl(overlay) -> str:
    """The verl release the cluster's nodes have: the older one the recipe supports (verl 0.9.0, as on an existing
    cluster) when the session could fetch it, else the main environment's."""
    import importlib.metadata

    return OLDER_VERL if overlay.python else importlib.metadata.version("verl")


def make_verl_only_python(folder: Path, verl_overlay) -> Path:
    """A Python environment with everything the main one has except the recipe, and verl 0.9.0 (the session's
    ``verl_overlay``) instead of the main verl where the package index was reachable: the cluster nodes'
    environment."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site, base_site = site_packages(python), site_packages(sys.executable)
    verl_from = verl_overlay.site or base_site
    hidden = []
    for entry in base_site.iterdir():
        if RECIPE_ENTRIES.match(entry.name):
            hidden.append(entry.name)
        elif not VERL_ENTRIES.match(entry.name) and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    for entry in verl_from.iterdir():
        if VERL_ENTRIES.match(entry.name):
            (site / entry.name).symlink_to(entry)
    assert any(name.endswith(".dist-info") for name in hidden), f"no recipe_dapo dist-info in {base_site}: {hidden}"
    return python


def cluster_env(python: Path, base: dict) -> dict[str, str]:
    """The environment a node's `ray start` runs in: the verl-only Python first on PATH (so the job's `python3` is
    it), and none of the settings of ``base`` (the test session's) that would make the recipe importable or change the
    run."""
    env = {key: value for key, value in base.items() if key not in NOT_ON_THE_CLUSTER}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(RAY_USAGE_STATS_ENABLED="0", **RAY_AUTH)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OperatorCluster:
    """A head and a second node started with `ray start --block` (each in a process group of its own, so that
    stopping them ends exactly their processes; no `ray stop`, which would end every Ray on this machine)."""

    def __init__(self, python: Path, cwd: Path, base_env: dict):
        self.python, self.cwd = python, cwd
        self.base_env, self.env = base_env, cluster_env(python, base_env)
        # Short: Ray's unix sockets live under it (a socket path may not exceed 107 characters).
        self.temp_dir = tempfile.mkdtemp(prefix="rdj", dir="/tmp")
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, name: str, *args: str) -> None:
        log = self.cwd / f"ray_start_{name}.log"
        self.logs.append(log)
        command = [str(self.python), "-m", "ray.scripts.scripts", "start", "--block", *NODE_RESOURCES,
                   "--temp-dir", self.temp_dir, "--node-ip-address=127.0.0.1", "--min-worker-port=0",
                   "--max-worker-port=0",
                   f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                   f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}", *args]
        with open(log, "w") as out:
            self.processes.append(subprocess.Popen(command, cwd=self.cwd, env=self.env, stdout=out,
                                                   stderr=subprocess.STDOUT, start_new_session=True))

    def start(self) -> None:
        self._start("head", "--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
                    "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--ray-client-server-port={free_port()}",
                    "--disable-usage-stats")
        self.wait_for_nodes(1)
        # One log monitor per host (both nodes log to the same session folder here: a second would print every
        # worker line twice on the driver).
        self._start("second", f"--address=127.0.0.1:{self.gcs_port}", "--include-log-monitor=false")
        self.nodes = self.wait_for_nodes(2)

    def wait_for_nodes(self, count: int, timeout: float = 240) -> dict[str, bool]:
        """node id -> is head, once ``count`` nodes are alive (asked through the dashboard: no ray.init here)."""
        deadline = time.monotonic() + timeout
        while True:
            for process, log in zip(self.processes, self.logs):
                assert process.poll() is None, f"`ray start` exited ({process.returncode}):\n{log.read_text()[-3000:]}"
            alive = self.alive_nodes()
            if len(alive) >= count:
                return alive
            assert time.monotonic() < deadline, f"{count} Ray node(s) not alive after {timeout:.0f} s"
            time.sleep(2)

    def alive_nodes(self) -> dict[str, bool]:
        """The dashboard's node list (its state API over plain HTTP: the cluster runs without token authentication).
        Not Ray's client, which takes its authentication mode from this process's environment: this runs in a
        background thread of the test session, where setting RAY_AUTH_MODE even for a moment would reach a
        ``ray.init`` a unit test makes meanwhile, whose cluster processes then disagree about authentication (its
        actors die as "out of scope" before they start)."""
        try:
            with urllib.request.urlopen(f"{self.dashboard}/api/v0/nodes?limit=100&detail=false", timeout=10) as reply:
                nodes = json.load(reply)["data"]["result"]["result"]
        except (OSError, ValueError, KeyError, TypeError):  # not up yet, or mid start-up
            return {}
        return {node["node_id"]: node["is_head_node"] for node in nodes if node["state"] == "ALIVE"}

    def stop(self) -> None:
        for process in reversed(self.processes):  # `ray start --block` ends its node's processes on SIGTERM
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            kill_group(process.pid)  # and whatever of the node's process group outlived it
        # Any process of this cluster that left the group: Ray's processes name the cluster's temp dir (unique to
        # this test) on their command lines.
        for pid in self.cluster_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def cluster_pids(self) -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if self.temp_dir.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids


def submit(work_dir: Path, assets: dict, cluster: OperatorCluster, *overrides: str, runtime_env: Path | None = None,
           timeout: int = 1200) -> subprocess.CompletedProcess:
    """``bash scripts/ray_job_submit.sh scripts/run_dapo_cpu.sh OVERRIDES`` from this (recipe-installed) environment,
    waiting for the job; the job's output is what `ray job submit` follows."""
    env = dict(
        {key: value for key, value in cluster.base_env.items() if key not in ("RAY_ADDRESS", "PYTHONPATH")},
        PYTHON=sys.executable,
        WORK_DIR=str(work_dir),
        MODEL_PATH=assets["model_path"],
        TRAIN_FILE=assets["train_file"],
        VAL_FILE=assets["val_file"],
        RAY_ADDRESS=cluster.dashboard,
        SUBMIT_NO_WAIT="0",
        **RAY_AUTH,
        **({"RUNTIME_ENV": str(runtime_env)} if runtime_env else {}),
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    completed = subprocess.run(
        ["bash", "scripts/ray_job_submit.sh", "scripts/run_dapo_cpu.sh", *overrides],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    (work_dir / "submit.log").write_text(completed.stdout + completed.stderr)
    return completed


def job_overrides(work_dir: Path) -> tuple[str, ...]:
    """classic_run's trainer and shape (its step 1 is the DP 1 reference), 2 steps, each saved, no validation."""
    return (*TRAINERS["classic"], "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=1",
            "dapo.overlong_filter.enable=true", f"trainer.rollout_data_dir={work_dir / 'rollouts'}",
            "trainer.nnodes=2", "trainer.n_gpus_per_node=1")


def environment_probe(python: Path, env: dict) -> subprocess.CompletedProcess:
    """What the nodes' Python imports as verl (its version and file), the ``verl.plugins`` entry points it finds, and
    its ``import recipe_dapo`` (which must fail), in the environment a node runs in."""
    return subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m, verl\n"
         "print(m.version('verl'), verl.__file__)\n"
         "print([ep.value for ep in m.entry_points(group='verl.plugins')])\n"
         "import recipe_dapo\n"],
        cwd="/", env=cluster_env(python, env), capture_output=True, text=True, timeout=300,
    )


@in_background("verl_overlay", name="scale_job")
def run_scale_job(runs, base: Path, default_assets: dict, env: dict) -> dict:
    """The cluster's nodes, the refused job's output, and the DP 2 job's folder, output and log file; run in the
    background while the unit tests run (tests/e2e/e2e_runs.py JOBS), on the nodes' environment (``python``)."""
    verl_only_python = make_verl_only_python(base / "verl_only", runs.result("verl_overlay"))
    environment = environment_probe(verl_only_python, env)
    cluster = OperatorCluster(verl_only_python, base, env)
    try:
        cluster.start()
        # First the cheap one: the code shipped, but nothing makes `import verl` load the recipe's plugin.
        bare_env = base / "runtime_env_without_plugin.yaml"
        runtime_env = yaml.safe_load((REPO_ROOT / "scripts" / "runtime_env.yaml").read_text())
        del runtime_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"]
        bare_env.write_text(yaml.safe_dump(runtime_env))
        start = time.monotonic()
        refused = submit(base / "refused", default_assets, cluster, *job_overrides(base / "refused"),
                         runtime_env=bare_env, timeout=600)
        refused_s = time.monotonic() - start
        work_dir = base / "dp2"
        completed = submit(work_dir, default_assets, cluster, *job_overrides(work_dir))
        assert completed.returncode == 0, f"the job failed:\n{(completed.stdout + completed.stderr)[-6000:]}"
    finally:
        cluster.stop()  # also on failure: a live cluster would take the next plain ray.init() on this machine
    leftover = cluster.cluster_pids()
    log_file = work_dir / "recipe_dapo" / "dapo_cpu.log"
    return {
        "python": verl_only_python,
        "environment": environment,
        "nodes": cluster.nodes,
        "leftover": leftover,
        "refused": refused,
        "refused_s": refused_s,
        "refused_dir": base / "refused",
        "work_dir": work_dir,
        "output": completed.stdout + completed.stderr,
        "log": log_file.read_text() if log_file.exists() else "",
    }


@pytest.fixture(scope="module")
def scale_job(shared_runs) -> dict:
    return shared_runs.result("scale_job")


@pytest.fixture(scope="module")
def verl_only_python(scale_job) -> Path:
    return scale_job["python"]


def test_the_cluster_environment_has_verl_but_not_the_recipe(scale_job, verl_only_python, verl_overlay):
    probe = scale_job["environment"]  # (the job asked its nodes' Python before starting them: ``environment_probe``)
    assert "No module named 'recipe_dapo'" in probe.stderr, probe.stderr[-3000:]
    version, origin = probe.stdout.splitlines()[0].split()
    assert version == node_verl(verl_overlay) and origin.startswith(str(verl_only_python.parents[1])), probe.stdout
    assert "recipe_dapo" not in probe.stdout  # no verl.plugins entry point of the recipe either


def test_the_job_ran_on_the_nodes_verl_in_the_driver_and_the_workers(scale_job, verl_only_python):
    """The job's driver, task runner and workers imported the nodes' verl (0.9.0 where the session could fetch it):
    verl's warnings name their files, under the nodes' environment."""
    site = site_packages(verl_only_python)
    assert "trainers.classic.trainer.RayDAPOTrainer (" in scale_job["output"]  # the start-up line names the trainer
    node_verl_dir = f"{site}/verl/"
    assert node_verl_dir + "trainer/ppo/ray_trainer.py" in scale_job["log"], scale_job["log"][-3000:]
    assert node_verl_dir + "workers/" in scale_job["log"], scale_job["log"][-3000:]


def test_a_job_without_the_plugin_is_refused_naming_every_node_before_training(scale_job):
    refused = scale_job["refused"]
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert "not registered on 2 of 2 Ray node(s)" in output, output[-6000:]
    named = set(re.findall(r"Ray node (\w+) \(", output))
    assert named == set(scale_job["nodes"]), (named, scale_job["nodes"])
    assert "VERL_USE_EXTERNAL_MODULES=recipe_dapo.plugin" in output and "scripts/ray_job_submit.sh" in output
    # Before any worker group: no placement line, no step, no metrics file.
    assert "placement: node" not in output and "DAPO training steps" not in output
    assert not (scale_job["refused_dir"] / "recipe_dapo" / "dapo_cpu.jsonl").exists()


def test_the_cluster_is_gone_once_the_runs_ended(scale_job):
    assert scale_job["leftover"] == []  # no process naming the cluster's temp dir


def test_the_job_registered_the_recipe_on_every_node(scale_job):
    assert re.search(r"recipe_dapo is registered on every Ray node \(2\)", scale_job["log"]), scale_job["log"][-3000:]


def test_ranks_and_replicas_land_on_both_nodes(scale_job):
    lines = [line for line in scale_job["log"].splitlines() if "placement: node" in line]
    assert lines, "the trainer printed no placement line"
    placement = dict(re.findall(r"node (\w+): actor ranks \[([\d, ]*)\]", lines[-1]))
    replicas = dict(re.findall(r"node (\w+): actor ranks \[[\d, ]*\], rollout replicas \[([\d, ]*)\]", lines[-1]))
    assert set(placement) == set(scale_job["nodes"]), (lines[-1], scale_job["nodes"])
    assert sorted(placement.values()) == ["0", "1"]  # one actor rank per node
    assert sorted(replicas.values()) == ["0", "1"]  # one rollout replica per node, beside its rank


def test_dp2_job_trains_with_the_recipes_loss_and_reward_in_partial_steps_of_whole_mini_batches(scale_job):
    steps = logged_steps(scale_job["work_dir"])
    assert [step for step in sorted(steps) if step > 0] == [1, 2]
    first = steps[1]
    # Step 1: the budget (16 prompts) ran out with 4..7 qualifying groups: one mini-batch of 4 trained at DP 2.
    assert first["dynamic_sampling/partial_batch"] == 1.0 and first["dynamic_sampling/trained_groups"] == 4
    for step, metrics in steps.items():
        if not metrics.get("dynamic_sampling/trained_groups"):
            continue
        assert metrics["dynamic_sampling/trained_groups"] % 4 == 0  # whole mini-batches, so both ranks get rows
        assert metrics["dynamic_sampling/generated_groups"] >= metrics["dynamic_sampling/kept_groups"]
        assert "overlong/filtered_ratio" in metrics
        # Only the `dapo` loss reports these (recipe_dapo/loss/dapo.py), only the `recipe_dapo` reward manager
        # these (its reward_extra_info): both resolved in the workers of both nodes (a worker without them
        # fails the step: verl raises on an unknown loss or reward manager).
        assert "actor/clipped_high_token_prob_mean" in metrics, step
        assert "reward/no_answer_ratio" in metrics and "overlong/penalized_ratio" in metrics, step
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(metrics[key]), key


def dumped_rollouts(work_dir: Path, step: int) -> list[tuple]:
    """The trained rows of ``step`` (verl's rollout_data_dir dump), in a DP-independent order."""
    rows = [json.loads(line) for line in (work_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    return sorted((row["input"], row["output"], row["score"]) for row in rows)


def hf_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    weights = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def test_step1_at_dp2_matches_dp1_on_identical_rollouts(scale_job, classic_run, default_assets):
    dp1_scale_reference = classic_run[0]
    dp1, dp2 = logged_steps(dp1_scale_reference)[1], logged_steps(scale_job["work_dir"])[1]
    # Identical rollouts: the same trained rows (prompt, response, score) at both DP sizes.
    assert dumped_rollouts(scale_job["work_dir"], 1) == dumped_rollouts(dp1_scale_reference, 1)
    for key in ("response_length/mean", "critic/score/mean", "dynamic_sampling/trained_groups"):
        assert dp2[key] == pytest.approx(dp1[key], rel=1e-9), key
    # One update on them: the same loss and gradient norm up to float effects (tolerances: the module docstring).
    for key, tolerance in (("actor/pg_loss", 1e-4), ("actor/grad_norm", 3e-3)):
        assert dp2[key] == pytest.approx(dp1[key], rel=tolerance, abs=1e-7), (key, dp1[key], dp2[key])

    import torch

    folder = Path("checkpoints") / "global_step_1" / "actor" / "huggingface"
    before = hf_weights(Path(default_assets["model_path"]))  # where both runs started
    after1, after2 = hf_weights(dp1_scale_reference / folder), hf_weights(scale_job["work_dir"] / folder)
    assert after1.keys() == after2.keys()
    update1 = torch.cat([(after1[k].float() - before[k].float()).flatten() for k in sorted(after1) if k in before])
    update2 = torch.cat([(after2[k].float() - before[k].float()).flatten() for k in sorted(after1) if k in before])
    moved = update1.abs() > 0
    assert moved.sum() > 1000, "step 1 at DP 1 barely moved the weights: nothing to compare"
    # Adam's first step moves each weight by about lr * sign(gradient): a weight whose gradient is within float
    # noise of 0 may move by +lr at one DP size and -lr at the other. At most 1 in 1,000 of the moved weights may
    # differ by more than a tenth of lr; every other one must match to 3e-3 relative (L2 over them).
    lr = dp1["actor/lr"]
    differs = (update2 - update1).abs() > 0.1 * lr
    assert differs.sum().item() <= max(1, int(1e-3 * moved.sum().item())), (
        f"{differs.sum().item()} of {moved.sum().item()} moved weights got another step-1 update at DP 2 than at DP 1"
    )
    same = ~differs
    relative = ((update2[same] - update1[same]).norm() / update1[same].norm()).item()
    assert relative < 3e-3, f"DP 2's step-1 update differs from DP 1's by {relative:.2e} (relative L2)"
