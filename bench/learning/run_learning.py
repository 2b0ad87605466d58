"""DAPO vs GRPO on CPU: train both arms with fixed seeds on the same generated-token budget, then plot.

Task and model: the default run's synthetic one-digit arithmetic ("What is a op b?", op in + - *, in the DAPO
prompt format) and its tiny Qwen2 (2 layers, hidden 64, 512-token BPE), but with a longer supervised warm-up
(``--warmup-steps``, default 500) so that the policy starts at roughly 30% accuracy at temperature 1: with
the default 150 steps almost every group of 8 scores all-wrong and there is little to learn from.

Arms (everything else equal; ``dapo`` loss in both, which with a symmetric clip is vanilla PPO-clip):

- ``dapo``: the recipe's defaults (clip 0.2/0.28, token-mean, dynamic sampling, soft overlong penalty);
- ``grpo``: clip 0.2/0.2, seq-mean-token-mean, no dynamic sampling, no overlong shaping or filtering.

Budget: a DAPO step generates more than ``train_batch_size`` groups (it regenerates until the batch holds
only groups with mixed rewards), so DAPO runs first for ``--dapo-steps`` steps and GRPO then gets
``round(generated responses of the DAPO run / (train_batch_size * n))`` steps, i.e. the same number of
generated responses. The summary puts generated tokens on the x axis of every curve (exact for both arms:
``dynamic_sampling/generated_tokens`` counts the groups the filter dropped too, see summarize.py) so the arms
are compared at equal generated tokens at every point, not only at the end.

Defaults (what docs/learning/ablation.md shows for this task): 48 distinct problems (``--num-facts``), 8 prompts x 8
responses per step, 4 PPO mini-batches per step (with one, the ratio is always 1 and nothing is clipped),
lr 1e-4 (at 1e-3 both arms first lost accuracy), responses up to 32 tokens, DAPO 60 steps. Needs matplotlib
(``pip install 'recipe_dapo[report]'``, part of the ``test`` extra).

Run (from the repository root; about 17 minutes of training on 2 cores for one seed, plus the one-off
warm-up; each training runs under ``nice -n 19`` in its own folder with its own local Ray):

    python bench/learning/run_learning.py --seeds 0 1           # both arms and seeds, the plot and the table
    python bench/learning/run_learning.py --seeds 0 1 --summarize-only
    python bench/learning/run_learning.py --lr 1e-3 --dapo-steps 40 --work-dir runs/learning_lr1e-3

Outputs: runs/learning/<arm>_s<seed>/{metrics.jsonl,train.log}, docs/learning/learning_curves.png and the pair's
block in docs/learning/ablation.md.

``--pair skip`` compares prompt skipping on against off instead: arms ``dapo`` (the recipe's defaults,
skipping off) and ``dapo_skip`` (the same plus ``SKIP``), two seeds, at an equal generated-token budget: ``dapo`` runs
``--dapo-steps`` steps, and ``dapo_skip`` then trains until it has generated as many tokens (it generates fewer per
step). It first runs as many steps as ``dapo``, saving a checkpoint at the end; if its tokens fall short, it resumes
from that checkpoint for the steps its tokens per step say are missing (constant learning rate, so the extension
changes nothing else). The summary compares the arms at the baseline's step count (skipping: fewer tokens) and at
its generated tokens (equal budget): its block in docs/learning/ablation.md and skipping_curves.png. About 40-50
minutes on 2 cores for two seeds (each arm about 7-10 minutes a seed, plus a restart), plus the one-off warm-up:

    python bench/learning/run_learning.py --pair skip --seeds 0 1

Both pairs use the same folder (the default ``--work-dir``), so the ``dapo`` runs of the first are the baseline of the
second: the arm they share is trained once.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import summarize  # noqa: E402  (bench/learning/summarize.py)

logger = logging.getLogger("run_learning")

# The config groups of every run: the default CPU run's sizes (size=cpu_tiny) on the CPU platform; the overrides
# below then set this experiment's sizes.
GROUPS = ["platform=cpu", "size=cpu_tiny"]

# Overrides shared by both arms (sizes for 2 CPU cores; the platform=cpu overlay does the rest).
COMMON = [
    "data.max_prompt_length=128",
    "data.val_batch_size=128",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "trainer.val_before_train=true",
    "trainer.logger=[console,file]",
]

# What turns the recipe's DAPO defaults into the GRPO baseline.
GRPO = [
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.2",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "algorithm.filter_groups.enable=false",
    "reward.reward_kwargs.overlong_buffer_cfg.enable=false",
    "dapo.overlong_filter.enable=false",
]

# What turns the recipe's DAPO defaults into the prompt-skipping arm. With n = 8 a prompt becomes a skip candidate
# after two all-right (or all-wrong) groups in a row at a predicted chance to qualify below 0.2: the default (0.1)
# needs about nine, and a training row of this task comes up only about six times in 60 steps.
SKIP = [
    "dapo.dynamic_sampling.skip.enable=true",
    "dapo.dynamic_sampling.skip.max_qualify_probability=0.2",
]
ARM_OVERRIDES = {"dapo": [], "grpo": GRPO, "dapo_skip": SKIP}
BUDGET_TOLERANCE = 0.02  # the skip arm stops once it is within 2% of the baseline's generated tokens
MAX_EXTENSIONS = 3


def build_assets(out: Path, warmup_steps: int, num_val: int, seed: int = 0) -> dict[str, str]:
    """The default run's data, tokenizer and tiny Qwen2 with a longer warm-up (reused when unchanged)."""
    from recipe_dapo.cpu import assets as da

    spec = replace(da.TinyModelSpec(), warmup_steps=warmup_steps)
    return da.build_default_assets(out, None, num_train=512, num_val=num_val, seed=seed, spec=spec)


def restrict_to_facts(assets: dict[str, str], out: Path, num_facts: int, seed: int = 0) -> dict[str, str]:
    """Train and validate on the first ``num_facts`` distinct problems of the training set.

    With all 300 one-digit facts a 40-step run of 8 prompts sees each fact about once, and a tiny model does not
    transfer between facts: nothing moves. On a small set each fact comes back every few steps, so the policy
    improvement is measurable (validation then measures the policy on the facts it trains on, not
    generalisation). The validation set holds each fact once.
    """
    import pandas as pd
    from recipe_dapo.cpu import assets as da

    rows = da.synthetic_rows(512, "train", seed)
    facts = list(dict.fromkeys(da.arithmetic_problem_from_row(row)[0] for row in rows))[:num_facts]
    train = [row for row in rows if da.arithmetic_problem_from_row(row)[0] in facts]
    val = [next(row for row in rows if da.arithmetic_problem_from_row(row)[0] == fact) for fact in facts]
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(train).to_parquet(out / "train.parquet")
    pd.DataFrame(val).to_parquet(out / "val.parquet")
    return dict(assets, train_file=str(out / "train.parquet"), val_file=str(out / "val.parquet"))


def arm_overrides(arm: str, seed: int, steps: int, args, assets: dict[str, str], run_dir: Path,
                  resumable: bool = False) -> list[str]:
    """The Hydra overrides of one run (after ``GROUPS``)."""
    return [
        f"data.train_files={assets['train_file']}",
        f"data.val_files={assets['val_file']}",
        f"actor_rollout_ref.model.path={assets['model_path']}",
        f"data.max_response_length={args.max_response_length}",
        f"reward.reward_kwargs.overlong_buffer_cfg.len={args.overlong_buffer}",
        f"data.train_batch_size={args.train_batch_size}",
        f"data.gen_batch_size={args.train_batch_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.mini_batch_size}",
        f"actor_rollout_ref.rollout.n={args.n}",
        # one micro-batch per mini-batch (verl needs the mini-batch's responses divisible by it)
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.mini_batch_size * args.n}",
        # the same for log-probs: a partial step (whole mini-batches) divides into them too
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.mini_batch_size * args.n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.mini_batch_size * args.n}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"algorithm.filter_groups.max_num_gen_batches={args.max_gen_batches}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"trainer.experiment_name={arm}_s{seed}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        f"trainer.save_freq={steps if resumable else -1}",
        *COMMON,
        *ARM_OVERRIDES[arm],
        *args.overrides,
    ]


def train_arm(arm: str, seed: int, steps: int, args, assets: dict[str, str], resumable: bool = False,
              fresh: bool = False) -> Path:
    """One training run under ``nice -n 19`` in its own folder (and its own local Ray); returns the folder.

    ``resumable``: save a checkpoint at the last step, and continue from the folder's checkpoint when there is one
    (``fresh`` deletes it first)."""
    run_dir = args.work_dir / f"{arm}_s{seed}"
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and summarize.last_step(metrics) >= steps and not fresh:
        logger.info("%s seed %d: reusing %s", arm, seed, metrics)
        return run_dir
    if fresh:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        for stale in (metrics, run_dir / "wall_seconds.txt"):
            stale.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = arm_overrides(arm, seed, steps, args, assets, run_dir, resumable)
    command = ["nice", "-n", "19", sys.executable, "-m", "recipe_dapo.main_dapo", *GROUPS, *overrides]
    (run_dir / "command.txt").write_text(shlex.join(command) + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0",
               VERL_FILE_LOGGER_PATH=str(metrics))
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray
    logger.info("%s seed %d: %d steps -> %s", arm, seed, steps, run_dir)
    start = time.time()
    with open(run_dir / "train.log", "a" if resumable else "w") as log:
        # Own session: the run's Ray processes can be ended afterwards without touching anybody else's.
        process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            returncode = process.wait()
        finally:
            _end_session(process.pid)
    wall = run_dir / "wall_seconds.txt"
    earlier = float(wall.read_text()) if resumable and wall.exists() else 0.0  # a resumed run adds its time
    wall.write_text(f"{earlier + time.time() - start:.0f}\n")
    if returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed ({returncode}); see {run_dir / 'train.log'}")
    return run_dir


def train_to_budget(arm: str, seed: int, budget_tokens: float, first_steps: int, args, assets: dict[str, str]) -> Path:
    """Train ``arm`` until it has generated ``budget_tokens`` (within BUDGET_TOLERANCE): ``first_steps`` steps, then
    resumed from its checkpoint for as many steps as its tokens per step say are missing."""
    steps, fresh = first_steps, args.force
    metrics = args.work_dir / f"{arm}_s{seed}" / "metrics.jsonl"
    if metrics.exists() and not fresh:  # extended by an earlier invocation: continue from there
        steps = max(steps, summarize.last_step(metrics))
    for _ in range(MAX_EXTENSIONS + 1):
        run_dir = train_arm(arm, seed, steps, args, assets, resumable=True, fresh=fresh)
        fresh = False
        spent = summarize.load_run(run_dir / "metrics.jsonl", args.n, args.train_batch_size).generated_tokens.sum()
        if spent >= budget_tokens * (1 - BUDGET_TOLERANCE):
            break
        missing = math.ceil((budget_tokens - spent) / (spent / steps))
        logger.info("%s seed %d: %d of %d tokens after %d steps: %d more steps", arm, seed, spent, budget_tokens,
                    steps, missing)
        steps += missing
    return run_dir


def _end_session(sid: int) -> None:
    """Stop what is left of one run's session (Ray's raylet, GCS and workers it started), by process id."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    pids = [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) == sid and int(p) != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(summarize.PAIRS), default="dapo-grpo",
                        help="dapo-grpo: DAPO against the GRPO baseline; skip: DAPO with prompt skipping against without")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dapo-steps", type=int, default=60)
    parser.add_argument("--train-batch-size", type=int, default=8, help="prompts (groups) per step")
    parser.add_argument("--mini-batch-size", type=int, default=2,
                        help="prompts per PPO mini-batch: train_batch_size / this = policy updates per step; with one "
                        "update per step the ratio is always 1 and nothing is ever clipped")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-response-length", type=int, default=32)
    parser.add_argument("--overlong-buffer", type=int, default=8, help="L_cache of the soft overlong penalty")
    parser.add_argument("--max-gen-batches", type=int, default=8, help="generation rounds allowed per DAPO step")
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=500)
    parser.add_argument("--num-val", type=int, default=128)
    parser.add_argument("--num-facts", type=int, default=48, help="train/validate on this many distinct problems (0: all)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "learning")
    parser.add_argument("--docs-dir", type=Path, default=ROOT / "docs" / "learning")
    parser.add_argument("--force", action="store_true", help="retrain runs that already have metrics")
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both arms")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work_dir = args.work_dir.resolve()

    start = time.time()
    if not args.summarize_only:
        assets = build_assets(args.work_dir / "assets", args.warmup_steps, args.num_val)
        if args.num_facts:
            assets = restrict_to_facts(assets, args.work_dir / "assets" / f"facts{args.num_facts}", args.num_facts)
        for seed in args.seeds:
            dapo_dir = train_arm("dapo", seed, args.dapo_steps, args, assets, fresh=args.force)
            budget = summarize.load_run(dapo_dir / "metrics.jsonl", args.n, args.train_batch_size)
            if args.pair == "skip":
                tokens = float(budget.generated_tokens.sum())
                logger.info("DAPO seed %d generated %d tokens: the skipping arm trains to the same", seed, tokens)
                train_to_budget("dapo_skip", seed, tokens, args.dapo_steps, args, assets)
                continue
            grpo_steps = max(1, round(budget.total_generated_responses / (args.train_batch_size * args.n)))
            logger.info("DAPO seed %d generated %d responses: GRPO gets %d steps", seed,
                        budget.total_generated_responses, grpo_steps)
            train_arm("grpo", seed, grpo_steps, args, assets, fresh=args.force)
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--summarize-only"]
    command = "python bench/learning/run_learning.py " + shlex.join(given)  # the command that trains
    summarize.write_outputs(args.work_dir, args.docs_dir, args.seeds, args.n, args.train_batch_size, command.strip(),
                            pair=summarize.PAIRS[args.pair])
    logger.info("done in %.0f s", time.time() - start)


if __name__ == "__main__":
    main()
