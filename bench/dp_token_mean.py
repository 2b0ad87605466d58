"""Data parallelism against one rank on ragged batches, with a per-rank-mean control that must fail, on CPU.

    nice -n 10 .venv/bin/python bench/dp_token_mean.py                  # 5 seeds (the tolerances' spread)
    nice -n 10 .venv/bin/python bench/dp_token_mean.py --seeds 0        # one seed, as the test runs it
    nice -n 10 .venv/bin/python bench/dp_token_mean.py --fp32           # FSDP computing in float32

How long: 100-150 s a seed on the shared 2-core machine (seeds 1-4 took 856 s while a training run used it); each
seed runs its DP 1 process and its two DP 2 processes at once, mostly importing verl. The figures and the tolerances
they justify: tests/test_dp_token_mean_on_cpu.py.

What is real: verl 0.9.1's actor update as its engine worker runs it on ``platform=cpu``, in processes of a gloo
group (world size 1, then 2): ``verl.workers.engine_workers.TrainingWorker`` (what ``ActorRolloutRefWorker.
update_actor`` calls: ``train_mini_batch`` -> ``train_batch`` -> the FSDP2 engine's ``forward_backward_batch``, which
all-reduces the mini-batch's loss tokens into ``batch_num_tokens``, and ``optimizer_step``, which all-reduces the
gradients and clips them) built from the recipe's composed actor config (``platform=cpu size=cpu_chain``: FSDP2, fp32,
dynamic micro-batches of 80 tokens), with verl's ``ppo_loss`` calling the registered ``dapo`` policy loss (the
recipe's ``recipe_dapo.loss.dapo``), on a tiny random Qwen2 (hidden 32, 2 layers). The batch is a ``DataProto`` of
4 groups x 4 responses with ragged prompts (left-padded) and responses (right-padded), one response zeroed as the
overlong filter zeroes it, GRPO advantages from verl's ``compute_grpo_outcome_advantage`` and old log-probs near the
model's own (so that some ratios leave the clip band); the driver's steps are verl's: ``RayPPOTrainer._balance_batch``
(balancing on) or none (balancing off), ``DataProto.to_tensordict`` + ``left_right_2_no_padding`` and the dispatch's
``BatchData.chunk`` into one share per rank, with ``global_batch_size`` and ``mini_batch_size`` set as
``RayPPOTrainer._update_actor`` sets them (the whole batch: one mini-batch).

What is not: no Ray (the worker objects are built in plain processes: the same classes, no remote calls), no
rollout (the batch is synthetic), the learning rate is 0 (every case starts from the same weights; what is compared
is computed before the step: the gradient, the clipped-before norm ``grad_norm`` and the loss). One mini-batch, so
the update at DP 2 must equal the update at DP 1 up to float effects.

The control (``per-rank mean``): the same DP 2 run, its loss function handing ``ppo_loss`` the rank's own loss tokens
as ``batch_num_tokens`` and ``dp_size=1`` (what a naive token-mean does: each rank its masked mean, the ranks'
gradients averaged). Token-mean is where that matters: on ranks with unequal loss tokens the mean of per-rank means
is not the global mean. For ``seq-mean-token-mean`` the control hands the rank's own rows as ``global_batch_size``:
the dispatch gives every rank equally many rows, so that control equals the real one (listed to show it).

Per seed and case: the relative L2 difference of the full gradient (gathered from FSDP's shards before the step)
from DP 1's, and the relative differences of ``grad_norm``, ``actor/pg_loss`` (the policy loss as the worker reports
it) and the worker's ``loss`` (the ranks' losses averaged). Last line: ``RESULT real_<metric>_max=...
control_<metric>_min=... margin=... min_token_imbalance=... seeds=N`` (real: every real case; control: the
token-mean per-rank means; margin: the control's smallest gradient difference over the real cases' largest;
min_token_imbalance: the smallest ``(max - min) / max`` of the ranks' loss tokens).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import spawned_world  # bench/ is on the path: the folder of the script, or put there by the test

REPO_ROOT = Path(__file__).resolve().parents[1]
GROUPS, RESPONSES = 4, 4  # 16 rows: 8 per rank at DP 2
MAX_PROMPT, MAX_RESPONSE = 24, 24
# Dynamic micro-batches (the recipe's default; size=cpu_tiny fixes them instead): at most 64 tokens each, so every rank
# accumulates its gradient over several micro-batches.
MICRO_BATCH_TOKENS = 64
MODEL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
MODES = ("token-mean", "seq-mean-token-mean")
# (loss_agg_mode, balanced, per-rank mean) per DP 2 case
CASES = [(mode, balanced, control) for mode in MODES for balanced in (True, False) for control in (False, True)]


def case_name(mode: str, balanced: bool, control: bool) -> str:
    return f"{mode}, balancing {'on' if balanced else 'off'}, {'per-rank mean' if control else 'real'}"


# ------------------------------------------------------------------------------------------------------------- data


def build_model(folder: Path, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": 0, "<unk>": 1, **{f"t{i}": i for i in range(2, MODEL["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<pad>").save_pretrained(folder)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(Qwen2Config(**MODEL, torch_dtype="float32")).save_pretrained(folder)


def ragged_batch(folder: Path, seed: int):
    """A ``DataProto`` of GROUPS x RESPONSES rows: ragged prompts (left-padded) and responses (right-padded), long
    prompts paired with short responses and the reverse (balancing evens prompt + response, not the loss tokens),
    one response zeroed as the overlong filter zeroes it, GRPO advantages, old log-probs near the model's own."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    generator = torch.Generator().manual_seed(seed)
    rows = GROUPS * RESPONSES
    prompt_len = torch.zeros(rows, dtype=torch.long)
    response_len = torch.zeros(rows, dtype=torch.long)
    for group in range(GROUPS):
        long_prompt = group % 2 == 0
        for j in range(RESPONSES):
            row = group * RESPONSES + j
            prompt_len[row] = int(torch.randint(16, MAX_PROMPT + 1, (1,), generator=generator)) if long_prompt \
                else int(torch.randint(2, 6, (1,), generator=generator))
            response_len[row] = int(torch.randint(1, 7, (1,), generator=generator)) if long_prompt \
                else int(torch.randint(12, MAX_RESPONSE + 1, (1,), generator=generator))
    prompts = torch.zeros(rows, MAX_PROMPT, dtype=torch.long)
    prompt_mask = torch.zeros(rows, MAX_PROMPT, dtype=torch.long)
    responses = torch.zeros(rows, MAX_RESPONSE, dtype=torch.long)
    response_mask = torch.zeros(rows, MAX_RESPONSE, dtype=torch.long)
    for row in range(rows):
        p, r = int(prompt_len[row]), int(response_len[row])
        prompts[row, MAX_PROMPT - p:] = torch.randint(2, MODEL["vocab_size"], (p,), generator=generator)
        prompt_mask[row, MAX_PROMPT - p:] = 1
        responses[row, :r] = torch.randint(2, MODEL["vocab_size"], (r,), generator=generator)
        response_mask[row, :r] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)

    # Old log-probs: the model's own log-prob of each response token, moved by noise (ratios around 1, some out of
    # the clip band).
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    log_probs = torch.log_softmax(logits[:, MAX_PROMPT - 1:-1].float(), dim=-1)
    own = torch.gather(log_probs, -1, responses.unsqueeze(-1)).squeeze(-1)
    old_log_probs = (own + 0.3 * torch.randn(own.shape, generator=generator)) * response_mask

    # Scores 0/1 with at least one of each per group (so every group has advantages), then the overlong filter's
    # zeroed row: its advantage stays, its tokens leave the loss.
    scores = torch.randint(0, 2, (rows,), generator=generator).float()
    scores[::RESPONSES], scores[1::RESPONSES] = 1.0, 0.0
    uid = np.array([f"g{row // RESPONSES}" for row in range(rows)], dtype=object)
    token_scores = torch.zeros(rows, MAX_RESPONSE)
    token_scores[torch.arange(rows), response_len - 1] = scores
    advantages, returns = compute_grpo_outcome_advantage(token_scores, response_mask, uid)
    filtered = response_mask.clone()
    filtered[RESPONSES + 2] = 0
    return DataProto.from_dict(
        tensors=dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     prompts=prompts, responses=responses, response_mask=filtered, old_log_probs=old_log_probs,
                     advantages=advantages, returns=returns),
        non_tensors=dict(uid=uid),
    )


def rank_shares(batch, dp: int, balanced: bool) -> list:
    """The TensorDict each rank trains on, through verl's own driver steps (balance, to_tensordict, no-padding, the
    dispatch's chunk), with the non-tensor keys ``RayPPOTrainer._update_actor`` sets."""
    from types import SimpleNamespace

    from verl.protocol import BatchData
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    batch = copy.deepcopy(batch)  # balancing reorders in place
    if balanced and dp > 1:
        # verl's balance_batch on a stand-in trainer that answers only what it asks (the actor's DP size).
        trainer = SimpleNamespace(_get_dp_size=lambda worker_group, role: dp, actor_rollout_wg=None,
                                  use_prefix_grouper=False)
        RayPPOTrainer._balance_batch(trainer, batch, metrics={})
    batch_td = left_right_2_no_padding(batch.to_tensordict())
    rows = len(batch)
    tu.assign_non_tensor(batch_td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                         global_batch_size=rows, mini_batch_size=rows, epochs=1, seed=1,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True, temperature=1.0, multi_turn=False)
    return BatchData(batch_td).chunk(chunks=dp) if dp > 1 else [batch_td]


def loss_tokens(share) -> int:
    return int(share["response_mask"].sum())


# ----------------------------------------------------------------------------------------------------------- ranks


def actor_configs(model_path: str, modes, fp32: bool = False) -> dict[str, dict]:
    """loss_agg_mode -> the recipe's composed ``actor_rollout_ref`` config (``platform=cpu size=cpu_chain``) on the
    tiny model, lr 0, dynamic micro-batches, that loss_agg_mode; ``fp32``: FSDP computes in float32 instead of
    verl's default bfloat16 parameters (the recipe sets no ``fsdp_config.mixed_precision``)."""
    base = actor_config_dict(model_path)
    if fp32:
        base["actor"]["fsdp_config"]["mixed_precision"] = dict(param_dtype="fp32", reduce_dtype="fp32",
                                                               buffer_dtype="fp32")
    configs = {}
    for mode in modes:
        configs[mode] = copy.deepcopy(base)
        configs[mode]["actor"]["loss_agg_mode"] = mode
    return configs


def actor_config_dict(model_path: str) -> dict:
    """The recipe's composed actor config (``platform=cpu size=cpu_chain``) on the tiny model, lr 0."""
    from omegaconf import OmegaConf

    from recipe_dapo.config.compose import compose

    config = compose([
        "platform=cpu", "size=cpu_chain", f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.actor.optim.lr=0.0",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={MICRO_BATCH_TOKENS}",
    ])
    return OmegaConf.to_container(config.actor_rollout_ref, resolve=True)


def rank_main(rank: int, world: int, port: int, job: dict, out: str) -> None:
    os.environ.update(VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      TOKENIZERS_PARALLELISM="false")
    import logging

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from recipe_dapo.cpu import compat

    compat.apply()
    import recipe_dapo.loss.dapo  # noqa: F401  (registers `dapo` in verl's policy-loss registry)

    results = [run_case(rank, world, case) for case in job["cases"]]
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def build_worker(actor_rollout_ref: dict):
    """verl's TrainingWorker for the actor, configured as ``ActorRolloutRefWorker.init_model`` configures it."""
    from functools import partial

    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    conf = OmegaConf.create(actor_rollout_ref)
    model_config = omega_conf_to_dataclass(conf.model, dataclass_type=HFModelConfig)
    actor_config = omega_conf_to_dataclass(conf.actor)
    actor_config.model_config = model_config
    training = TrainingWorkerConfig(model_type="language_model", model_config=model_config,
                                    engine_config=actor_config.engine, optimizer_config=actor_config.optim,
                                    checkpoint_config=actor_config.checkpoint)
    training.engine_config.use_dynamic_bsz = conf.actor.use_dynamic_bsz
    training.engine_config.max_token_len_per_gpu = conf.actor.ppo_max_token_len_per_gpu
    training.engine_config.micro_batch_size_per_gpu = conf.actor.ppo_micro_batch_size_per_gpu
    training.engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    worker = TrainingWorker(config=training)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))
    return worker, actor_config


_WORKERS: dict = {}


def run_case(rank: int, world: int, case: dict) -> dict:
    """One update of this rank's share; the full gradient (gathered) as the optimizer step saw it, and the metrics."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    key = case["mode"]
    if key not in _WORKERS:
        _WORKERS[key] = build_worker(case["actor_rollout_ref"])
    worker, actor_config = _WORKERS[key]
    share = case["shares"][rank]
    if case["control"]:
        own_tokens, own_rows = loss_tokens(share), len(share)

        def per_rank_mean(model_output, data, dp_group=None):
            tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=own_tokens, global_batch_size=own_rows)
            return ppo_loss(actor_config, model_output, data, dp_group)

        worker.set_loss_fn(per_rank_mean)
    else:
        from functools import partial

        worker.set_loss_fn(partial(ppo_loss, config=actor_config))

    engine = worker.engine
    captured = {}
    original_step = engine.optimizer_step

    def optimizer_step():  # the gradients the real step clips and applies, gathered from FSDP's shards
        grads = []
        for param in engine.module.parameters():
            grad = param.grad
            grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            grads.append(grad.detach().flatten().double())
        captured["grad"] = torch.cat(grads)
        return original_step()

    engine.optimizer_step = optimizer_step
    try:
        output = worker.train_mini_batch(share.clone() if hasattr(share, "clone") else share)
    finally:
        engine.optimizer_step = original_step
    result = {"tokens": loss_tokens(share)}
    if rank == 0:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        from recipe_dapo.loss.dapo import compute_policy_loss_dapo

        result["dapo_registered"] = get_policy_loss_fn(actor_config.policy_loss.loss_mode) is compute_policy_loss_dapo
        metrics = tu.get(output, "metrics")
        result["metric_names"] = sorted(metrics)
        # ppo_loss names the policy loss "actor/pg_loss"; the worker adds "loss" and "grad_norm"
        result["metrics"] = {name.split("/")[-1]: float(value[0] if isinstance(value, list) else value)
                             for name, value in metrics.items() if name in ("actor/pg_loss", "grad_norm", "loss")}
        result["grad"] = captured["grad"].tolist()
    tokens = torch.tensor([result["tokens"]])
    gathered = [torch.zeros_like(tokens) for _ in range(world)]
    torch.distributed.all_gather(gathered, tokens)
    result["rank_tokens"] = [int(t) for t in gathered]
    return result


def start_world(world: int, cases: list[dict]):
    """One process per rank (spawned, a gloo group of its own); ``finish_world`` waits and reads rank 0's results."""
    return spawned_world.start(rank_main, world, {"cases": cases})


finish_world = spawned_world.finish


# ------------------------------------------------------------------------------------------------------------ study


def relative(a, b) -> float:
    import torch

    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


def measure(seed: int, cases=CASES, fp32: bool = False, folder: Path | None = None) -> list[dict]:
    """Every DP 2 case of ``cases`` against DP 1 on the same batch (one seed: model and data); one row each, with
    what the ranks saw (``rank_tokens``, ``dapo_registered``, ``metric_names``). The model is written to ``folder``
    (a temporary folder, removed afterwards, by default)."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix=f"dp_token_mean_{seed}_") as scratch:
            return measure(seed, cases, fp32, Path(scratch) / "model")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_model(folder, seed)
    batch = ragged_batch(folder, seed)
    modes = sorted({mode for mode, _, _ in cases}, key=MODES.index)
    configs = actor_configs(str(folder), modes, fp32)
    # Both worlds at once (each mostly imports verl and builds its engine: one core's work).
    dp1 = start_world(1, [dict(mode=mode, control=False, actor_rollout_ref=configs[mode],
                               shares=rank_shares(batch, 1, False)) for mode in modes])
    dp2 = start_world(2, [dict(mode=mode, control=control, actor_rollout_ref=configs[mode],
                               shares=rank_shares(batch, 2, balanced)) for mode, balanced, control in cases])
    reference = dict(zip(modes, finish_world(dp1)))
    dp2 = finish_world(dp2)
    rows = []
    for (mode, balanced, control), result in zip(cases, dp2):
        ref = reference[mode]
        tokens = result["rank_tokens"]
        rows.append(dict(
            seed=seed, mode=mode, balanced=balanced, control=control, rank_tokens=tokens,
            dapo_registered=result["dapo_registered"], metric_names=result["metric_names"],
            token_imbalance=(max(tokens) - min(tokens)) / max(tokens),
            grad=relative(result["grad"], ref["grad"]),
            grad_norm=abs(result["metrics"]["grad_norm"] / ref["metrics"]["grad_norm"] - 1),
            loss=abs(result["metrics"]["loss"] / ref["metrics"]["loss"] - 1),
            pg_loss=abs(result["metrics"]["pg_loss"] / ref["metrics"]["pg_loss"] - 1),
        ))
    return rows


METRICS = ("grad", "grad_norm", "pg_loss", "loss")


def spread(rows: list[dict], mode: str, control: bool) -> dict[str, tuple[float, float]]:
    picked = [row for row in rows if row["mode"] == mode and row["control"] == control]
    return {key: (min(row[key] for row in picked), max(row[key] for row in picked)) for key in METRICS}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--fp32", action="store_true",
                        help="FSDP computes in float32 (fsdp_config.mixed_precision) instead of verl's bfloat16")
    args = parser.parse_args(argv)
    start = time.monotonic()
    rows = [row for seed in args.seeds for row in measure(seed, fp32=args.fp32)]
    print(f"relative difference from DP 1 ({'float32' if args.fp32 else 'bfloat16'} parameters in FSDP's compute)")
    print(f"{'seed':>4}  {'case':<52} {'rank tokens':>12} " + " ".join(f"{key:>9}" for key in METRICS))
    for row in rows:
        name = case_name(row["mode"], row["balanced"], row["control"])
        print(f"{row['seed']:>4}  {name:<52} {str(row['rank_tokens']):>12} "
              + " ".join(f"{row[key]:>9.2e}" for key in METRICS))
    print()
    for mode in MODES:
        for control in (False, True):
            ranges = spread(rows, mode, control)
            count = sum(1 for row in rows if row["mode"] == mode and row["control"] == control)
            print(f"{mode + (', per-rank mean' if control else ', real'):<36} over {count} runs: "
                  + "  ".join(f"{key} {lo:.1e}..{hi:.1e}" for key, (lo, hi) in ranges.items()))
    real = [row for row in rows if not row["control"]]
    control = [row for row in rows if row["control"] and row["mode"] == "token-mean"]
    fields = {f"real_{key}_max": max(row[key] for row in real) for key in METRICS}
    fields.update({f"control_{key}_min": min(row[key] for row in control) for key in METRICS})
    fields["margin"] = fields["control_grad_min"] / fields["real_grad_max"]
    fields["min_token_imbalance"] = min(row["token_imbalance"] for row in rows)
    print(f"\n{len(args.seeds)} seed(s) in {time.monotonic() - start:.0f} s")
    print("RESULT " + " ".join(f"{key}={value:.2e}" for key, value in fields.items()) + f" seeds={len(args.seeds)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
