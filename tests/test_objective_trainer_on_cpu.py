"""The real ``RayDAPOTrainer`` (the stand-ins of tests/test_trainer_on_cpu.py for what needs a GPU) with
``objective=grpo_process`` and iterative RL: each step's advantages come from the chain scorer's step rewards through
verl's registered ``grpo_process`` estimator, and the reference worker group is reset after every second update and
at a resume, never otherwise."""

from __future__ import annotations

import torch

from test_trainer_on_cpu import RecordingTracker, build_trainer


class RecordingReferenceWorkerGroup:
    """The reference side of verl's ActorRolloutRef worker group: ref log-probs, and the recipe's reset."""

    def __init__(self, device, actor):
        self.device, self.actor = device, actor
        self.resets: list[int] = []  # the actor version the reference took at each reset

    def compute_ref_log_prob(self, batch_td):
        return self.actor.compute_log_prob(batch_td)

    def reset_reference_to_actor(self):
        self.resets.append(self.device.actor_version)
        return 1


PROMPT_WIDTH = 64


def pad_prompts_to_one_width(manager):
    """The stand-in pads a round's prompts to its longest; verl's agent loop pads them to one width (the chain task's
    prompts differ in length, and dynamic sampling concatenates rounds)."""
    generate = manager.generate_sequences

    def generate_sequences(batch):
        out = generate(batch)
        width = out.batch["prompts"].shape[1]
        extra = PROMPT_WIDTH - width
        pad = torch.nn.functional.pad
        out.batch["prompts"] = pad(out.batch["prompts"], (extra, 0), value=manager.tokenizer.pad_token_id)
        out.batch["input_ids"] = pad(out.batch["input_ids"], (extra, 0), value=manager.tokenizer.pad_token_id)
        out.batch["attention_mask"] = pad(out.batch["attention_mask"], (extra, 0), value=0)
        out.batch["position_ids"] = pad(out.batch["position_ids"], (extra, 0), value=0)
        return out

    manager.generate_sequences = generate_sequences


def chain_inputs(folder):
    from recipe_dapo.cpu.assets import tokenizer_as_verl_loads_it, write_dataset

    train_file, val_file = write_dataset(folder / "data", num_train=64, num_val=4, seed=0, task="chain")
    model_dir = folder / "model"
    model_dir.mkdir()
    return train_file, val_file, model_dir, tokenizer_as_verl_loads_it(model_dir, None, train_file)


def test_grpo_process_trains_on_step_rewards_and_the_reference_is_reset_every_second_update(tmp_path, monkeypatch):
    trainer, device = build_trainer(tmp_path, chain_inputs(tmp_path), monkeypatch, "objective=grpo_process",
                                    "dapo.objective.reference_reset_every=2")
    assert trainer.use_reference_policy
    pad_prompts_to_one_width(trainer.async_rollout_manager)
    reference = trainer.ref_policy_wg = RecordingReferenceWorkerGroup(device, trainer.actor_rollout_wg)
    advantages = []
    original = trainer.prepare_update

    def prepare_update(batch, metrics, timing):
        batch = original(batch, metrics, timing)
        advantages.append((batch.batch["token_level_rewards"].clone(), batch.batch["advantages"].clone()))
        return batch

    trainer.prepare_update = prepare_update
    trainer.fit()

    logged = RecordingTracker.logged
    trained_steps = [step for step in range(1, 6) if "process/step_right_fraction" in logged.get(step, {})]
    assert trained_steps, logged
    for rewards, advantage in advantages:
        # the responses are one "Answer: N" line each: one step, +1 right or -1 wrong, at the line's last token
        assert set(rewards[rewards != 0].tolist()) <= {1.0, -1.0}
        assert advantage.abs().sum() > 0
    # after steps 2 and 4 (step 4 trains nothing: the reference still takes the current policy, the one step 3 made)
    assert [step for step in range(1, 6) if logged.get(step, {}).get("actor/reference_reset")] == [2, 4]
    assert reference.resets == [2, 3]  # the actor's version (its number of updates) each reset copied


def test_without_a_reset_setting_the_reference_is_never_reset(tmp_path, monkeypatch):
    trainer, device = build_trainer(tmp_path, chain_inputs(tmp_path), monkeypatch, "objective=grpo")
    pad_prompts_to_one_width(trainer.async_rollout_manager)
    reference = trainer.ref_policy_wg = RecordingReferenceWorkerGroup(device, trainer.actor_rollout_wg)
    trainer.fit()
    assert device.actor_version > 0 and reference.resets == []
    assert not any("actor/reference_reset" in metrics for metrics in RecordingTracker.logged.values())
