"""One GPU, side by side: the recipe's DAPO trainer vs verl 0.9.1's classic trainer on the same config.

Needs a machine with one CUDA GPU and the recipe installed with vLLM (``pip install -e ".[gpu,math]"``).

What it does, in one run:

1. builds a small Qwen2 on the Qwen2.5 vocabulary (``--tokenizer``, e.g. ../shared/data/qwen2.5-tokenizer),
   warmed up on the default run's synthetic arithmetic in the DAPO answer format, so that accuracy is mixed
   and dynamic sampling has groups to keep and to drop (``recipe_dapo.cpu.assets``);
2. ``recipe``: ``scripts/dapo_small_one_gpu.sh`` (the recipe's trainer, vLLM rollouts, dynamic sampling, the
   ``dapo`` loss, the ``recipe_dapo`` reward manager) for ``--steps`` training steps;
3. ``verl``: the same configuration on verl's own classic path: the recipe's composed config (``size=small_one_gpu``
   and the same overrides), passed as the overrides it makes to verl's ``ppo_trainer`` defaults, to
   ``python -m verl.trainer.main_ppo trainer.use_v1=false`` with verl's built-in ``dapo`` reward manager and
   the ``vanilla`` loss with the same clip settings. verl's classic trainer has no dynamic sampling: it
   generates ``train_batch_size`` prompts per step and trains on all of them;
4. samples ``nvidia-smi`` every half second for the peak GPU memory of each run and prints a table.

Step times exclude the first step (vLLM and kernel warm-up). Generation throughput is response tokens
generated per second of the ``gen`` timer: for the recipe every round's tokens, kept or dropped
(``dynamic_sampling/generated_tokens``); for verl the trained batch (it trains on all it generates).

    python bench/gpu_one_gpu.py --tokenizer ../shared/data/qwen2.5-tokenizer --steps 6

A watchdog stops an arm whose log stays silent for ``--stall-after`` seconds (default 300) or that runs past
``--arm-time-limit`` (default 1800): it writes the stack of every Python process in the arm's tree (driver, Ray,
vLLM; with ``py-spy`` installed) and ``nvidia-smi`` to ``<work-dir>/<arm>/stacks.txt``, stops the tree, runs the
other arm anyway, prints the table of the arms that finished and exits non-zero.

Status: on one H100 (vLLM 0.24.0, torch 2.11, no flash-attn package) the model build, Ray, the FSDP actor
and the vLLM server started, and the first rollout round of the recipe arm did not complete within three
minutes in two attempts. Since then the trainer's replica handling was rebuilt (``recipe_dapo/trainers/classic/rollout_replicas.py``):
it used to put the replicas to sleep after every round, so a second round in a step generated on sleeping replicas,
and a step that skipped its update left them asleep for the next; ``tests/test_trainer_on_cpu.py``
shows both on the old code. That bug strikes at the second round, not the first, so the first-round stall may have
another cause: run ``tests/gpu`` first, then this bench with ``--arms verl`` to see whether verl's own trainer stalls
the same way, and read ``stacks.txt``. No figures from it are published yet.

Last line: ``RESULT recipe_step_s=... verl_step_s=... step_time_ratio=... recipe_gen_tok_per_s=...
verl_gen_tok_per_s=... recipe_peak_gpu_gb=... verl_peak_gpu_gb=...``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]

# Small enough to start fast, large enough that the GPU does real work (head_dim 64).
MODEL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=1024, warmup_steps=400, warmup_batch_size=64, warmup_lr=2e-3)

# This comparison's run: scripts/dapo_small_one_gpu.sh's size=small_one_gpu, shrunk by these Hydra overrides.
SIZE = "size=small_one_gpu"
RUN_OVERRIDES = [
    "data.max_prompt_length=256", "data.max_response_length=256", "reward.reward_kwargs.overlong_buffer_cfg.len=64",
    "data.train_batch_size=64", "data.gen_batch_size=128", "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.optim.lr=5e-5",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.rollout.val_kwargs.n=4",
    "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
]
# Both arms: vLLM without CUDA-graph capture, so that the start-up fits a short GPU lease; PyTorch's SDPA
# attention without padding removal, so that the flash-attn package is not needed.
COMMON_OVERRIDES = [
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.agent.num_workers=2",
    "actor_rollout_ref.model.use_remove_padding=false",
    "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
]


def build_model(work_dir: Path, tokenizer: str) -> dict[str, str]:
    from recipe_dapo.cpu import assets as da

    spec = replace(da.TinyModelSpec(), **MODEL)
    return da.build_default_assets(work_dir / "assets", tokenizer, num_train=2048, num_val=64, spec=spec)


class GpuMemorySampler:
    """Peak of ``nvidia-smi``'s memory.used (GiB) while the context is open."""

    def __init__(self, period_s: float = 0.5):
        self.period_s, self.peak_mib, self._stop = period_s, 0.0, threading.Event()

    def _loop(self):
        if shutil.which("nvidia-smi") is None:
            return  # no NVIDIA GPU here: the peak stays 0
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            if out.strip():
                self.peak_mib = max(self.peak_mib, float(out.split()[0]))
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def peak_gib(self) -> float:
        return self.peak_mib / 1024


def compose_config(module: str, name: str, overrides: list[str], resolve: bool = True) -> dict:
    """A Hydra config composed as its entry point would, as plain values (interpolations kept with resolve=False)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module=module, version_base=None):
        return OmegaConf.to_container(compose(config_name=name, overrides=overrides), resolve=resolve)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def hydra_value(value) -> str:
    """A resolved value as Hydra override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"no Hydra syntax for {value!r}")


def as_verl_classic(recipe_overrides: list[str], skip_keys: tuple[str, ...] = ()) -> list[str]:
    """The recipe's composed config as overrides of verl's own ppo_trainer: verl's dapo reward manager, the vanilla loss.

    Every key whose value differs from verl's default, or whose default is an interpolation (it could follow another
    key elsewhere), is passed (``+key`` where verl's schema lacks it, as for the reward manager's ``reward_kwargs``);
    the recipe's own ``dapo.*`` section is left out (verl has no such keys).
    """
    recipe = flatten(compose_config("recipe_dapo.config", "dapo_trainer", recipe_overrides))
    verl = flatten(compose_config("verl.trainer.config", "ppo_trainer", [], resolve=False))
    recipe.update({"reward.reward_manager.name": "dapo", "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
                   "trainer.use_v1": False})
    def follows_another_key(key: str) -> bool:  # a section verl interpolates whole (it follows its source)
        parts = key.split(".")
        return any(isinstance(verl.get(".".join(parts[:i])), str) for i in range(1, len(parts)))

    overrides = []
    for key, value in recipe.items():
        if key.startswith("dapo.") or key in skip_keys or (key in verl and verl[key] == value) or follows_another_key(key):
            continue
        overrides.append(f"{'' if key in verl else '+'}{key}={hydra_value(value)}")
    return overrides


class ArmFailed(RuntimeError):
    """An arm that exited with an error, stalled or ran out of time; the message says where its evidence is."""


def proc_stat_fields(pid) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and every live descendant (a local Ray cluster's GCS, raylet and workers among them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = proc_stat_fields(entry.name) if entry.name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(children.get(pid, []))
    return tree


def dump_stacks(pids: list[int], path: Path) -> None:
    """Every Python process's stack (``py-spy dump``, when installed) and the GPU's state, for a post-mortem."""
    py_spy, lines = shutil.which("py-spy"), []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"=== pid {pid}: {cmdline[:300]}")
        if py_spy and ("python" in cmdline or cmdline.startswith("ray::")):
            dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            lines.append(dump.stdout or dump.stderr)
    if not py_spy:
        lines.append("(py-spy is not installed: `pip install py-spy` to get Python stacks here)")
    if shutil.which("nvidia-smi"):
        lines.append(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
    path.write_text("\n".join(lines))


def running(pid: int) -> bool:
    fields = proc_stat_fields(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has exited; it only waits for its parent to reap it


def stop_tree(pids: list[int], grace_s: float = 10) -> None:
    """SIGTERM to every process, then SIGKILL to those still there after ``grace_s``."""
    def signal_all(sig) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(running(pid) for pid in pids):
        time.sleep(0.5)
    signal_all(signal.SIGKILL)


def run_arm(name: str, command: list[str], env: dict, run_dir: Path, stall_after_s: float, time_limit_s: float) -> dict:
    """Run one arm; if its log stays silent for ``stall_after_s`` or it runs past ``time_limit_s``, dump the
    stacks of its whole process tree to ``stacks.txt``, stop it and raise :class:`ArmFailed`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path, log_path = run_dir / "metrics.jsonl", run_dir / "train.log"
    metrics_path.unlink(missing_ok=True)
    env = dict(env, VERL_FILE_LOGGER_PATH=str(metrics_path), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
    (run_dir / "command.txt").write_text(" ".join(command) + "\n")
    start = last_output = time.time()
    log_size, why = 0, None
    with GpuMemorySampler() as memory, open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                process.wait(timeout=2)
                break
            except subprocess.TimeoutExpired:
                pass
            now, size = time.time(), log_path.stat().st_size
            if size != log_size:
                log_size, last_output = size, now
            if now - last_output > stall_after_s:
                why = f"stalled: no output for {now - last_output:.0f} s"
            elif now - start > time_limit_s:
                why = f"ran past --arm-time-limit ({time_limit_s:.0f} s)"
            if why:
                tree = process_tree(process.pid)
                dump_stacks(tree, run_dir / "stacks.txt")
                stop_tree(tree)
                process.wait()
                break
    wall = time.time() - start
    tail = log_path.read_text(errors="replace")[-5000:]
    if why:
        raise ArmFailed(f"{name} {why} after {wall:.0f} s; stacks in {run_dir / 'stacks.txt'}; log tail:\n{tail}")
    if process.returncode != 0:
        raise ArmFailed(f"{name} failed ({process.returncode}); log tail:\n{tail}")
    (run_dir / "run.json").write_text(json.dumps({"wall_s": wall, "peak_gpu_gib": memory.peak_gib}))
    return load_arm(name, run_dir)


def load_arm(name: str, run_dir: Path) -> dict:
    """A finished run: its logged steps, wall time and peak GPU memory."""
    from recipe_dapo.tracking.run_log import read_metrics

    logged = read_metrics(run_dir / "metrics.jsonl")
    steps = [logged[step] for step in sorted(logged) if step > 0]
    return {"name": name, "steps": steps, **json.loads((run_dir / "run.json").read_text())}


def summarize(run: dict, responses_per_step: int) -> dict:
    """Mean figures over the timed steps; ``responses_per_step`` counts the verl arm's generated responses."""
    steps = run["steps"]
    timed = steps[1:] if len(steps) > 1 else steps  # the first step warms vLLM and the kernels up

    def avg(key, rows=timed):
        values = [row[key] for row in rows if key in row]
        return mean(values) if values else float("nan")

    def generated_tokens(row):
        if "dynamic_sampling/generated_tokens" in row:  # every round, kept or dropped
            return row["dynamic_sampling/generated_tokens"]
        return row["response_length/mean"] * responses_per_step  # verl trains on all it generates

    gen_tokens = [generated_tokens(row) for row in timed]
    gen_seconds = [row["timing_s/gen"] for row in timed]
    return {
        "arm": run["name"],
        "steps": len(steps),
        "step_s": avg("timing_s/step"),
        "gen_s": avg("timing_s/gen"),
        "update_s": avg("timing_s/update_actor"),
        "gen_tok_per_s": sum(gen_tokens) / sum(gen_seconds),
        "gen_rounds": avg("dynamic_sampling/num_gen_rounds"),
        "score_first": steps[0].get("critic/score/mean"),
        "score_last": steps[-1].get("critic/score/mean"),
        "entropy_last": steps[-1].get("actor/entropy"),
        "clipfrac": avg("actor/pg_clipfrac"),
        "actor_max_alloc_gib": max(row.get("perf/max_memory_allocated_gb", 0.0) for row in steps),
        "peak_gpu_gib": run["peak_gpu_gib"],
        "wall_s": run["wall_s"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="tokenizer folder for the built model (Qwen2.5's)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "gpu_one_gpu")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--arms", nargs="+", default=["recipe", "verl"], choices=["recipe", "verl"])
    parser.add_argument("--reuse", action="store_true", help="reuse an arm that already finished in --work-dir")
    parser.add_argument("--override", action="append", default=[], help="an extra Hydra override for both arms")
    parser.add_argument("--stall-after", type=float, default=300,
                        help="seconds of log silence after which an arm counts as stalled (stacks dumped, arm stopped)")
    parser.add_argument("--arm-time-limit", type=float, default=1800, help="seconds one arm may run in all")
    args = parser.parse_args(argv)
    work_dir = args.work_dir.resolve()

    start = time.time()
    assets = build_model(work_dir, args.tokenizer)
    print(f"model built in {time.time() - start:.0f} s: {assets['model_path']}", flush=True)
    env = dict(os.environ, PYTHON=sys.executable)
    paths = [f"actor_rollout_ref.model.path={hydra_value(assets['model_path'])}",
             f"data.train_files={hydra_value(assets['train_file'])}", f"data.val_files=[{hydra_value(assets['val_file'])}]"]
    extra = RUN_OVERRIDES + paths + [f"trainer.total_training_steps={args.steps}"] + COMMON_OVERRIDES + args.override
    config = compose_config("recipe_dapo.config", "dapo_trainer", [SIZE, *extra])
    n, train_batch_size = config["actor_rollout_ref"]["rollout"]["n"], config["data"]["train_batch_size"]
    runs, failures = {}, {}
    for arm in args.arms:
        run_dir = work_dir / arm
        if args.reuse and (run_dir / "run.json").exists():
            runs[arm] = load_arm(arm, run_dir)
            continue
        checkpoints = f"trainer.default_local_dir={run_dir / 'checkpoints'}"
        if arm == "recipe":
            command = ["bash", str(ROOT / "scripts" / "dapo_small_one_gpu.sh"), *extra, checkpoints]
        else:
            command = [sys.executable, "-m", "verl.trainer.main_ppo",
                       *as_verl_classic([SIZE, *extra], skip_keys=("trainer.default_local_dir",)), checkpoints]
        print(f"{arm}: {args.steps} steps ...", flush=True)
        try:
            runs[arm] = run_arm(arm, command, env, run_dir, args.stall_after, args.arm_time_limit)
        except ArmFailed as failure:  # the other arm still runs: whether it stalls too is half the diagnosis
            failures[arm] = str(failure)
            print(failure, flush=True)
            continue
        print(f"{arm}: done in {runs[arm]['wall_s']:.0f} s", flush=True)
    if runs:
        print_table(runs, n, train_batch_size)
    if failures:
        sys.exit(f"arms that did not finish: {', '.join(failures)} (see above)")


def print_table(runs: dict, n: int, train_batch_size: int) -> None:
    rows = {arm: summarize(run, responses_per_step=train_batch_size * n) for arm, run in runs.items()}
    columns = list(next(iter(rows.values())).keys())
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows.values():
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    for arm, run in runs.items():
        last = run["steps"][-1]
        keys = sorted(k for k in last if k.split("/")[0] in {"actor", "dynamic_sampling", "overlong", "reward", "critic"})
        print(f"\n{arm}: metrics of the last step")
        for key in keys:
            print(f"  {key} = {last[key]}")
    result = {}
    for arm, row in rows.items():
        result[f"{arm}_step_s"] = row["step_s"]
        result[f"{arm}_gen_tok_per_s"] = row["gen_tok_per_s"]
        result[f"{arm}_peak_gpu_gb"] = row["peak_gpu_gib"]
    if "recipe" in rows and "verl" in rows:
        result["step_time_ratio"] = rows["recipe"]["step_s"] / rows["verl"]["step_s"]
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
