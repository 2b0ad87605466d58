"""Iterative RL: when the reference is reset (the pure schedule), what a configuration needs for it (start-up rules),
and the reset itself on verl's real FSDP2 engines: after the actor moved, the KL between the actor and the reference is
positive; after ``copy_policy_into_reference`` it is exactly zero."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from conftest import REPO_ROOT, compose_recipe_config, fresh_pythons, small_run
from recipe_dapo.loss.reference_reset import reference_reset_problems, reset_due
from recipe_dapo.preflight import DAPOConfigError, check_rules


def test_the_reference_is_reset_after_every_nth_step_and_at_a_resume():
    assert [step for step in range(1, 13) if reset_due(step, 4)] == [4, 8, 12]
    assert not any(reset_due(step, 0) for step in range(0, 10))
    assert reset_due(5, 4, resumed=True) and not reset_due(0, 4, resumed=True) and not reset_due(5, 0, resumed=True)


def test_a_reset_needs_a_reference_model_of_its_own_in_the_classic_trainer():
    ok = dict(uses_reference=True, lora=False, use_v1=False)
    assert reference_reset_problems(0, uses_reference=False, lora=True, use_v1=True) == []
    assert reference_reset_problems(10, **ok) == []
    assert "use_kl_loss" in reference_reset_problems(10, **{**ok, "uses_reference": False})[0]
    assert "LoRA" in reference_reset_problems(10, **{**ok, "lora": True})[0]
    assert "trainer.use_v1" in reference_reset_problems(10, **{**ok, "use_v1": True})[0]
    assert "whole number" in reference_reset_problems(-1, **ok)[0]


@pytest.fixture(scope="module")
def data_files(default_assets):
    return [f"data.train_files={default_assets['train_file']}", f"data.val_files={default_assets['val_file']}",
            f"actor_rollout_ref.model.path={default_assets['model_path']}"]


def test_the_start_up_check_accepts_a_reset_with_grpos_kl_and_refuses_one_without_a_reference(data_files):
    check_rules(compose_recipe_config(small_run(data_files, "objective=grpo",
                                                "dapo.objective.reference_reset_every=10")))
    with pytest.raises(DAPOConfigError, match="dapo.objective.reference_reset_every=10 resets a reference model"):
        check_rules(compose_recipe_config(small_run(data_files, "dapo.objective.reference_reset_every=10")))


RESET_ON_FSDP2 = textwrap.dedent("""
    import json, logging, os, sys, warnings
    sys.path.insert(0, os.path.join({repo!r}, "bench"))
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    from recipe_dapo.cpu import compat
    compat.apply()
    import dp_token_mean as bench
    from pathlib import Path
    from transformers import AutoModelForCausalLM
    from recipe_dapo.trainers.classic.reference_worker import copy_policy_into_reference

    folder = Path({folder!r})
    bench.build_model(folder, seed=0)
    config = bench.actor_config_dict(str(folder))
    actor, _ = bench.build_worker(config)      # verl's TrainingWorker on its FSDP2 engine, as the actor's
    reference, _ = bench.build_worker(config)  # and the reference's (same model, sharded alike)

    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, bench.MODEL["vocab_size"], (4, 16), generator=generator)

    def log_probs(engine_module):
        # the engine's weights, gathered from their shards into a plain Hugging Face model
        state = {{name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()
                 for name, t in engine_module.state_dict().items()}}
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        model.load_state_dict(state)
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[:, :-1]
        return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    def kl(policy, ref):  # the k3 estimate of KL(policy || reference) on the tokens, and its largest log-ratio
        log_ratio = ref - policy
        return float((torch.exp(log_ratio) - log_ratio - 1).mean()), float(log_ratio.abs().max())

    before = kl(log_probs(actor.engine.module), log_probs(reference.engine.module))
    with torch.no_grad():  # the actor moves (as an update moves it), the reference does not
        for parameter in actor.engine.module.parameters():
            local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
            local.add_(0.05 * torch.randn(local.shape, generator=generator).to(local.dtype))
    moved = kl(log_probs(actor.engine.module), log_probs(reference.engine.module))
    copied = copy_policy_into_reference(actor.engine.module, reference.engine.module)
    after = kl(log_probs(actor.engine.module), log_probs(reference.engine.module))
    dtensors = sum(hasattr(p, "to_local") for p in reference.engine.module.parameters())
    print(json.dumps(dict(before=before, moved=moved, after=after, copied=copied, dtensors=dtensors)))
    torch.distributed.destroy_process_group()
""")


def test_after_a_reset_the_kl_between_policy_and_reference_is_zero_on_verls_fsdp2_engines(tmp_path):
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               TOKENIZERS_PARALLELISM="false")
    (line,) = fresh_pythons((RESET_ON_FSDP2.format(repo=str(REPO_ROOT), folder=str(tmp_path / "model")), env))
    result = json.loads(line)
    assert result["dtensors"] > 0  # the engines really shard (FSDP2 DTensors), not plain tensors
    assert result["before"][0] == 0.0  # the same initial weights
    assert result["moved"][0] > 1e-6  # positive control: the moved actor is measurably away from the reference
    assert result["after"] == [0.0, 0.0]  # exactly: every weight copied
    assert result["copied"] > 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
