"""The real ``RayDAPOTrainer`` (``fit`` -> ``train_step`` -> ``collect_filtered_batch`` ...) against rollout replicas
that follow verl 0.9.1's protocol, on CPU: replica lifecycle, checkpoint atomicity, resume.

Everything is real except what needs a GPU: the trainer is built by ``RayPPOTrainer.__init__`` from the recipe's
composed Hydra config, real parquet data, a real tokenizer and verl's dataloader; batches are ``DataProto``s;
responses are scored by the recipe's verifier; advantages, dynamic sampling and metrics are the real code. The
rollout replicas, the checkpoint-engine manager and the actor worker group are stand-ins that enforce verl's
protocol with sleep mode on (``free_cache_engine``), as GPU users run it:

- a replica refuses to generate while asleep, or with weights older than the actor's;
- ``update_weights`` loads the actor's weights and leaves the replicas awake; ``sleep_replicas`` frees them;
- the actor refuses to compute log-probs or train while the replicas are awake (their memory is the actor's).

The steps cover zero generation rounds (a batch entirely from carried-over groups), one round, several rounds,
a step whose budget runs out with nothing to train, and the step after it.
"""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest
import torch

from conftest import compose_recipe_config

pytestmark = pytest.mark.timeout(600)

TRAIN_GROUPS = 4  # data.train_batch_size
GEN_PROMPTS = 8  # data.gen_batch_size
N = 2  # rollout.n
MAX_RESPONSE = 8

# Fraction of each round's groups whose two responses differ (the rest are all right), per training step.
# Step 2 generates nothing: step 1 carried four qualifying groups over.
QUALIFYING_FRACTION = {1: 1.0, 3: 0.3, 4: 0.0, 5: 1.0}


class ProtocolViolation(AssertionError):
    """The trainer broke verl's replica / actor protocol."""


class Device:
    """What sits in GPU memory: the actor's weights version and the replicas' state; a log of every call."""

    def __init__(self):
        self.replicas_awake = False  # verl's init_workers ends with sleep_replicas()
        self.replica_weights = None
        self.actor_version = 0
        self.events: list[tuple] = []


class RecordingCheckpointManager:
    """``verl.checkpoint_engine.CheckpointEngineManager``'s protocol (sleep_replicas / update_weights)."""

    def __init__(self, device: Device):
        self.device = device

    def update_weights(self, global_steps=None):
        self.device.replica_weights = self.device.actor_version
        self.device.replicas_awake = True
        self.device.events.append(("update_weights", global_steps))
        return {}

    def sleep_replicas(self):
        self.device.replicas_awake = False
        self.device.events.append(("sleep",))


class RecordingRolloutManager:
    """``AgentLoopManager.generate_sequences`` with the reward loop: responses laid out and scored as verl does."""

    def __init__(self, device: Device, tokenizer, max_response: int):
        self.device = device
        self.tokenizer = tokenizer
        self.max_response = max_response
        self.requests: list[dict] = []  # per call: the per-row rollout seeds and agent loop names
        self.all_wrong = lambda step: False  # from which step every response is wrong (a policy that broke)

    def generate_sequences(self, batch):
        from verl import DataProto

        from recipe_dapo.reward import verify

        device = self.device
        step = batch.meta_info["global_steps"]
        if not device.replicas_awake:
            raise ProtocolViolation(f"step {step}: rollout sent to sleeping replicas (sleep mode frees their weights)")
        if device.replica_weights != device.actor_version:
            raise ProtocolViolation(
                f"step {step}: replicas hold weights v{device.replica_weights}, the actor is at v{device.actor_version}"
            )
        rows = len(batch)
        groups = rows // N
        qualifying = 0 if batch.meta_info.get("validate") else int(round(QUALIFYING_FRACTION[step] * groups))
        device.events.append(("generate", step, groups))
        self.requests.append({k: batch.non_tensor_batch.get(k) for k in ("rollout_seed", "agent_name")}
                             | {"validate": bool(batch.meta_info.get("validate")), "step": step})

        texts = []
        for row in range(rows):
            truth = str(batch.non_tensor_batch["reward_model"][row]["ground_truth"])
            # Qualifying groups: the first response is wrong, the second right; others: both right.
            wrong = (row // N) < qualifying and row % N == 0 or self.all_wrong(step)
            texts.append(f"Answer: {truth}9" if wrong else f"Answer: {truth}")
        pad = self.tokenizer.pad_token_id
        # verl 0.9.1's agent loop tokenizes the chat itself and left-pads the prompts.
        chats = [
            self.tokenizer.apply_chat_template(list(chat), add_generation_prompt=True, tokenize=True)
            for chat in batch.non_tensor_batch["raw_prompt"]
        ]
        chats = [list(c["input_ids"]) if isinstance(c, dict) or hasattr(c, "keys") else list(c) for c in chats]
        width = max(len(c) for c in chats)
        prompts = torch.full((rows, width), pad, dtype=torch.long)
        prompt_mask = torch.zeros((rows, width), dtype=torch.long)
        for row, ids in enumerate(chats):
            prompts[row, width - len(ids) :] = torch.tensor(ids)
            prompt_mask[row, width - len(ids) :] = 1
        responses = torch.full((rows, self.max_response), pad, dtype=torch.long)
        response_mask = torch.zeros((rows, self.max_response), dtype=torch.long)
        for row, text in enumerate(texts):
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: self.max_response - 1]
            ids.append(self.tokenizer.eos_token_id)
            responses[row, : len(ids)] = torch.tensor(ids)
            response_mask[row, : len(ids)] = 1
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)

        verdicts = [
            verify(text, batch.non_tensor_batch["reward_model"][row]["ground_truth"]) for row, text in enumerate(texts)
        ]
        rm_scores = torch.zeros((rows, self.max_response))
        lengths = response_mask.sum(dim=1)
        for row, verdict in enumerate(verdicts):
            rm_scores[row, lengths[row] - 1] = verdict.score
        extra = {
            "score": np.array([v.score for v in verdicts], dtype=np.float64),
            "acc": np.array([v.correct for v in verdicts]),
            "pred": np.array([v.pred for v in verdicts], dtype=object),
            "verify_error": np.array([v.error for v in verdicts], dtype=object),
        }
        return DataProto.from_dict(
            tensors={
                "prompts": prompts,
                "responses": responses,
                "response_mask": response_mask,
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": attention_mask,
                "position_ids": position_ids,
                "rm_scores": rm_scores,
            },
            non_tensors=extra,
            meta_info={"timing": {"agent_loop/generate_sequences": 0.01}, "reward_extra_keys": list(extra)},
        )


class RecordingActorWorkerGroup:
    """The actor side of verl's hybrid worker group: log-probs and updates on padding-free TensorDicts."""

    def __init__(self, device: Device, grad_norm=lambda version: 1.0, entropy=lambda version: 0.0):
        self.device = device
        self.grad_norm = grad_norm  # per update (the engine's clipped gradient norm; verl skips a non-finite one)
        self.entropy = entropy  # per actor version: every token's entropy (NaN: weights that are not numbers)
        self.trained_groups: list[int] = []
        self.trained_sequences: list[list[tuple]] = []  # per update: each row's token ids, in training order

    def _refuse_while_replicas_awake(self, call: str):
        if self.device.replicas_awake:
            raise ProtocolViolation(f"{call} while the rollout replicas are awake: their memory is the actor's now")

    def compute_log_prob(self, batch_td):
        from verl.utils import tensordict_utils as tu

        self._refuse_while_replicas_awake("compute_log_prob")
        self.device.events.append(("compute_log_prob",))
        input_ids = batch_td["input_ids"]  # nested: one row per sequence, no padding
        zeros = torch.nested.nested_tensor_from_jagged(
            torch.zeros(input_ids.values().shape[0]), offsets=input_ids.offsets()
        )
        entropy = torch.nested.nested_tensor_from_jagged(
            torch.full((input_ids.values().shape[0],), float(self.entropy(self.device.actor_version))),
            offsets=input_ids.offsets(),
        )
        return tu.get_tensordict({"log_probs": zeros, "entropy": entropy}, non_tensor_dict={"metrics": {"mfu": 0.0}})

    def update_actor(self, batch_td):
        from verl.utils import tensordict_utils as tu

        self._refuse_while_replicas_awake("update_actor")
        advantages = batch_td["advantages"]
        assert torch.isfinite(advantages).all() and advantages.abs().sum() > 0  # dynamic sampling kept spread
        self.device.actor_version += 1
        self.device.events.append(("update_actor", self.device.actor_version))
        self.trained_groups.append(batch_td.batch_size[0] // N)
        self.trained_sequences.append([tuple(row.tolist()) for row in batch_td["input_ids"].unbind()])
        metrics = {"mfu": 0.0, "pg_loss": 0.0, "grad_norm": self.grad_norm(self.device.actor_version)}
        return tu.get_tensordict({}, non_tensor_dict={"metrics": metrics})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        import os

        os.makedirs(local_path, exist_ok=True)
        torch.save({"version": self.device.actor_version}, os.path.join(local_path, "actor.pt"))

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        import os

        self.device.actor_version = torch.load(os.path.join(local_path, "actor.pt"))["version"]


class RecordingTracker:
    logged: dict[int, dict] = {}

    def __init__(self, *args, **kwargs):
        RecordingTracker.logged = {}

    def log(self, data, step):
        RecordingTracker.logged.setdefault(step, {}).update(data)

    def finish(self, exit_code=0, outcome=None):
        RecordingTracker.outcome = outcome


def make_inputs(folder):
    from recipe_dapo.cpu.assets import tokenizer_as_verl_loads_it, write_dataset

    train_file, val_file = write_dataset(folder / "data", num_train=64, num_val=4, seed=0)
    model_dir = folder / "model"
    model_dir.mkdir()
    tokenizer = tokenizer_as_verl_loads_it(model_dir, None, train_file)
    return train_file, val_file, model_dir, tokenizer


@pytest.fixture()
def inputs(tmp_path):
    return make_inputs(tmp_path)


def build_trainer(tmp_path, inputs, monkeypatch, *overrides):
    """The real trainer from the composed config, wired to the stand-ins as init_workers would wire real workers."""
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.ray_trainer import Role

    import recipe_dapo.tracking.tracker as tracker_module
    import recipe_dapo.trainers.classic.trainer as trainer_module
    from recipe_dapo.trainers.classic.rollout_replicas import RolloutReplicas

    train_file, val_file, model_dir, tokenizer = inputs
    config = compose_recipe_config(
        [
            f"data.train_files={train_file}",
            f"data.val_files={val_file}",
            f"data.train_batch_size={TRAIN_GROUPS}",
            f"data.gen_batch_size={GEN_PROMPTS}",
            "data.max_prompt_length=128",
            f"data.max_response_length={MAX_RESPONSE}",
            "data.dataloader_num_workers=0",
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.rollout.n={N}",
            "actor_rollout_ref.rollout.free_cache_engine=true",  # sleep mode on, as on a GPU
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "algorithm.filter_groups.max_num_gen_batches=2",
            "trainer.total_training_steps=5",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "trainer.balance_batch=false",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            *overrides,
        ]
    )
    trainer = trainer_module.RayDAPOTrainer(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}),
    )
    # What init_workers wires up on a cluster, with the protocol-enforcing stand-ins.
    device = Device()
    trainer.actor_rollout_wg = RecordingActorWorkerGroup(device)
    trainer.async_rollout_manager = RecordingRolloutManager(device, tokenizer, MAX_RESPONSE)
    trainer.checkpoint_manager = RecordingCheckpointManager(device)
    trainer.replicas = RolloutReplicas(trainer.checkpoint_manager)
    monkeypatch.setattr(tracker_module, "open_tracking", lambda *args, **kwargs: RecordingTracker())
    return trainer, device


@pytest.fixture()
def trainer_and_device(tmp_path, inputs, monkeypatch):
    return build_trainer(tmp_path, inputs, monkeypatch)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The default trainer fitted once for the module: (trainer, device, metrics logged per step)."""
    folder = tmp_path_factory.mktemp("fitted")
    with pytest.MonkeyPatch.context() as monkeypatch:
        trainer, device = build_trainer(folder, make_inputs(folder), monkeypatch)
        trainer.fit()
        yield trainer, device, dict(RecordingTracker.logged)


def test_every_rollout_meets_awake_replicas_with_current_weights_for_any_number_of_rounds(fitted):
    trainer, device, logged = fitted
    rounds = {step: int(logged[step]["dynamic_sampling/num_gen_rounds"]) for step in range(1, 6)}
    assert rounds[1] == 1  # a full batch and four surplus groups in one round
    assert rounds[2] == 0  # the four carried-over groups fill the batch: no generation at all
    assert rounds[3] >= 2  # few groups qualify: several rounds in one step
    assert rounds[4] >= 1 and logged[4]["dynamic_sampling/trained_groups"] == 0  # budget spent, nothing trained
    assert rounds[5] >= 1
    # Steps 1, 2, 3 and 5 trained; step 4 had nothing to train on and skipped its update.
    assert device.actor_version == 4
    assert all("actor/pg_loss" in logged[step] for step in (1, 2, 3, 5))
    assert "actor/pg_loss" not in logged[4]

    # verl's order inside every step: generation rounds, then one sleep, then the actor, then a weight sync.
    for step in (1, 3, 5):
        step_events = [e for e in device.events if e[0] != "generate" or e[1] == step]
        first_gen = step_events.index(next(e for e in step_events if e[:2] == ("generate", step)))
        after = [e[0] for e in step_events[first_gen:]]
        last_gen = len(after) - 1 - after[::-1].index("generate")
        assert "sleep" not in after[:last_gen], f"step {step}: replicas slept between rounds: {after}"
        assert after[last_gen + 1 : last_gen + 5] == ["sleep", "compute_log_prob", "update_actor", "update_weights"]


def test_a_step_without_rounds_still_frees_the_replicas_before_the_actor_trains(fitted):
    trainer, device, _ = fitted
    names = [e[0] for e in device.events]
    updates = [i for i, name in enumerate(names) if name == "update_actor"]
    # Step 2 (no round): the replicas were awake after step 1's sync and must sleep before the actor.
    between = names[updates[0] + 1 : updates[1]]
    assert "generate" not in between
    assert between == ["update_weights", "sleep", "compute_log_prob"]


def test_after_a_skipped_update_the_next_rollout_wakes_the_replicas_first(fitted):
    trainer, device, _ = fitted
    step5 = next(i for i, e in enumerate(device.events) if e[:2] == ("generate", 5))
    before = [e[0] for e in device.events[:step5]]
    # Step 4 ended asleep without an update; step 5's first rollout needs a wake-up, which is a weight sync.
    assert before[-1] == "update_weights" and before[-2] == "sleep"


def test_a_kill_while_saving_never_leaves_an_incomplete_checkpoint_marked_latest(trainer_and_device, monkeypatch):
    import recipe_dapo.trainers.classic.trainer as trainer_module

    trainer, device = trainer_and_device
    trainer.global_steps = 2
    real_save = torch.save

    def killed_while_writing_the_sampler_state(obj, path, *args, **kwargs):
        if "dapo_state" in str(path):
            raise KeyboardInterrupt("killed")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(trainer_module.torch, "save", killed_while_writing_the_sampler_state)
    with pytest.raises(KeyboardInterrupt):
        trainer._save_checkpoint()
    tracker = trainer.config.trainer.default_local_dir + "/latest_checkpointed_iteration.txt"
    import os

    assert not os.path.exists(tracker)  # a resume starts from scratch rather than from a half checkpoint


def test_a_resumed_run_trains_exactly_what_the_uninterrupted_run_trained(tmp_path, inputs, monkeypatch):
    whole, whole_device = build_trainer(tmp_path / "whole", inputs, monkeypatch, "trainer.save_freq=1")
    whole.fit()
    expected = whole.actor_rollout_wg.trained_sequences  # steps 1, 2, 3, 5 (step 4 trained nothing)

    first, _ = build_trainer(tmp_path / "split", inputs, monkeypatch, "trainer.save_freq=1", "trainer.total_training_steps=3")
    first.fit()
    resumed, resumed_device = build_trainer(tmp_path / "split", inputs, monkeypatch, "trainer.save_freq=1")
    resumed.fit()
    assert resumed.global_steps == 6 and resumed_device.actor_version == whole_device.actor_version
    assert first.actor_rollout_wg.trained_sequences + resumed.actor_rollout_wg.trained_sequences == expected


def test_seeded_rollouts_give_every_response_its_own_seed_repeatably_across_runs(tmp_path, inputs, monkeypatch):
    from recipe_dapo.trainers.classic.rollout_seeds import AGENT_NAME

    runs = []
    for name in ("first", "second"):
        trainer, _ = build_trainer(tmp_path / name, inputs, monkeypatch, "dapo.seeded_rollouts=true")
        trainer.fit()
        runs.append(trainer.async_rollout_manager.requests)
    first, second = runs
    assert len(first) == len(second) > 3
    for a, b in zip(first, second):
        assert a["rollout_seed"].tolist() == b["rollout_seed"].tolist()  # the same seeds in a repeated run
        assert len(set(a["rollout_seed"].tolist())) == len(a["rollout_seed"])  # the n responses of a prompt differ
        assert set(a["agent_name"]) == {AGENT_NAME}
    all_seeds = [seed for request in first for seed in request["rollout_seed"].tolist()]
    assert len(set(all_seeds)) == len(all_seeds)  # no two rounds of the run reuse a seed


def test_validation_responses_get_the_same_seeds_at_every_validation_and_in_a_rerun(tmp_path, inputs, monkeypatch):
    """With seeded rollouts the validation before training and the one at the last step sample every response with
    the same seeds (each differs: the n samples of a problem too), a rerun gives the same, and none is a training
    round's; without, validation is left to verl's agent loop as training is."""
    from recipe_dapo.trainers.classic.rollout_seeds import AGENT_NAME

    seeded = ("dapo.seeded_rollouts=true", "trainer.val_before_train=true", "trainer.test_freq=5")
    runs = []
    for name in ("first", "second"):
        trainer, _ = build_trainer(tmp_path / name, inputs, monkeypatch, *seeded)
        trainer.fit()
        runs.append(trainer.async_rollout_manager.requests)
    first, second = runs
    validations = [request for request in first if request["validate"]]
    assert [request["step"] for request in validations] == [0, 5], [request["step"] for request in first]
    before, after = (request["rollout_seed"].tolist() for request in validations)
    assert before == after and len(set(before)) == len(before)
    assert all(set(request["agent_name"]) == {AGENT_NAME} for request in validations)
    assert [request["rollout_seed"].tolist() for request in second] == [request["rollout_seed"].tolist()
                                                                        for request in first]
    training = {seed for request in first if not request["validate"] for seed in request["rollout_seed"].tolist()}
    assert training and training.isdisjoint(before)

    trainer, _ = build_trainer(tmp_path / "unseeded", inputs, monkeypatch, "dapo.seeded_rollouts=false",
                               *seeded[1:])
    trainer.fit()
    validations = [request for request in trainer.async_rollout_manager.requests if request["validate"]]
    assert len(validations) == 2 and all(request["rollout_seed"] is None for request in validations)


def test_validation_seeds_repeat_per_batch_and_are_no_training_rounds():
    """Pure: a validation batch's seeds are the same for the same run seed and batch, distinct per row, and apart
    from every training round's, which a validation tag of 0 would not be (SeedSequence pads entropy with zeros)."""
    import numpy as np

    from recipe_dapo.trainers.classic.rollout_seeds import round_seeds, validation_seeds

    batch = validation_seeds(7, 0, 64).tolist()
    assert batch == validation_seeds(7, 0, 64).tolist() and len(set(batch)) == 64
    assert set(batch).isdisjoint(validation_seeds(7, 1, 64).tolist())
    assert set(batch).isdisjoint(validation_seeds(8, 0, 64).tolist())
    training = {seed for step in range(50) for rounds in range(4) for seed in round_seeds(7, step, rounds, 64).tolist()}
    assert training.isdisjoint(batch)
    untagged = (np.random.SeedSequence([7, 0, 0, 0]).generate_state(64, dtype=np.uint32) & 0x7FFFFFFF).tolist()
    assert untagged == round_seeds(7, 0, 0, 64).tolist()  # the control: without the tag, batch 0 is step 0's round 0


def test_unseeded_rollouts_leave_verls_agent_loop_alone(fitted):
    trainer, _, _ = fitted
    assert all(request["rollout_seed"] is None for request in trainer.async_rollout_manager.requests)


SKIPPING = (
    "dapo.dynamic_sampling.skip.enable=true",
    "dapo.dynamic_sampling.skip.max_qualify_probability=0.9",  # with n = 2: a candidate after one uniform group
    "dapo.dynamic_sampling.skip.explore_init=0.2",
    "trainer.save_freq=1",
)


@pytest.fixture()
def few_prompts(tmp_path):
    """16 training rows: prompts come back every few steps, so that skipping has histories to act on."""
    from recipe_dapo.cpu.assets import tokenizer_as_verl_loads_it, write_dataset

    train_file, val_file = write_dataset(tmp_path / "data", num_train=16, num_val=4, seed=0)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    return train_file, val_file, model_dir, tokenizer_as_verl_loads_it(model_dir, None, train_file)


def test_prompt_skipping_reads_verls_prompt_ids_and_a_resumed_run_skips_and_trains_alike(tmp_path, few_prompts,
                                                                                          monkeypatch):
    whole, _ = build_trainer(tmp_path / "whole", few_prompts, monkeypatch, *SKIPPING)
    whole.fit()
    logged = RecordingTracker.logged
    skipped = [int(logged[step].get("dynamic_sampling/skip/skipped_prompts", 0)) for step in range(1, 6)]
    assert sum(skipped[3:]) > 0, skipped  # the resumed steps (4, 5) skip too
    keys = list(whole.sampler.skipper._records)
    assert 0 < len(keys) <= 16 and all(key.rsplit("#", 1)[1].isdigit() for key in keys), keys[:3]
    expected = whole.actor_rollout_wg.trained_sequences

    first, _ = build_trainer(tmp_path / "split", few_prompts, monkeypatch, *SKIPPING, "trainer.total_training_steps=3")
    first.fit()
    resumed, _ = build_trainer(tmp_path / "split", few_prompts, monkeypatch, *SKIPPING)
    resumed.fit()
    assert resumed.sampler.skipper.state_dict()["keys"] == whole.sampler.skipper.state_dict()["keys"]
    assert first.actor_rollout_wg.trained_sequences + resumed.actor_rollout_wg.trained_sequences == expected
    assert [int(RecordingTracker.logged[s].get("dynamic_sampling/skip/skipped_prompts", 0)) for s in (4, 5)] == skipped[3:]


def test_a_non_finite_update_is_counted_and_shown_and_training_goes_on(tmp_path, inputs, monkeypatch):
    from recipe_dapo.tracking.console import format_step_line

    trainer, device = build_trainer(tmp_path, inputs, monkeypatch)
    trainer.actor_rollout_wg = RecordingActorWorkerGroup(device, grad_norm=lambda v: float("nan") if v == 2 else 1.0)
    trainer.fit()
    logged = RecordingTracker.logged
    assert [logged[step].get("training/update_skipped") for step in (1, 2, 3, 5)] == [0.0, 1.0, 0.0, 0.0]
    assert logged[5]["training/skipped_updates"] == 1.0
    assert "UPDATE SKIPPED" in format_step_line(2, 5, logged[2]) and "UPDATE SKIPPED" not in format_step_line(3, 5, logged[3])


def test_updates_skipped_in_a_row_stop_the_run_saying_what_to_check(tmp_path, inputs, monkeypatch):
    from recipe_dapo.run.step_metrics import NonFiniteUpdates

    trainer, device = build_trainer(tmp_path, inputs, monkeypatch, "dapo.health.max_skipped_updates=2")
    trainer.actor_rollout_wg = RecordingActorWorkerGroup(device, grad_norm=lambda v: float("inf"))
    with pytest.raises(NonFiniteUpdates, match="the last 2 steps' updates were all skipped .* Check the rewards"):
        trainer.fit()
    assert trainer.global_steps == 2


def test_a_policy_whose_responses_are_all_wrong_for_two_steps_stops_the_run_instead_of_finishing(tmp_path, inputs,
                                                                                                  monkeypatch):
    """From step 2 not one response is right (what a checkpoint loaded as NaN generates): no group qualifies, the
    steps train nothing, and the run used to end "finished" after step 5. It stops at the second step that scored
    only wrong answers (step 2 trains from the pool without generating), saying what it saw and what to check."""
    from recipe_dapo.run.step_metrics import PolicyStopped

    trainer, _ = build_trainer(tmp_path, inputs, monkeypatch)
    trainer.async_rollout_manager.all_wrong = lambda step: step >= 2
    with pytest.raises(PolicyStopped, match=r"step 4: not one response was right in the last 2 steps \(\d+ groups "
                                            r"generated, 0% of the last step's without an answer\): the policy has "
                                            r"stopped producing anything the reward scores"):
        trainer.fit()
    assert trainer.global_steps == 4 and RecordingTracker.outcome == "failed at step 4 (PolicyStopped)"
    logged = RecordingTracker.logged
    assert "reward/acc_mean" not in logged[2] and [logged[step]["reward/acc_mean"] for step in (3, 4)] == [0.0, 0.0]


def test_a_non_finite_entropy_stops_the_run_at_that_step(tmp_path, inputs, monkeypatch):
    from recipe_dapo.run.step_metrics import PolicyStopped

    trainer, device = build_trainer(tmp_path, inputs, monkeypatch)
    trainer.actor_rollout_wg = RecordingActorWorkerGroup(device, entropy=lambda v: float("nan") if v >= 1 else 0.5)
    with pytest.raises(PolicyStopped, match=r"step 2: the policy's entropy \(actor/entropy\) is nan: its "
                                            "log-probabilities are not numbers"):
        trainer.fit()
    assert RecordingTracker.logged[1]["actor/entropy"] == 0.5 and trainer.global_steps == 2


def test_the_policy_watch_counts_only_steps_that_scored_and_a_right_answer_starts_it_again():
    from recipe_dapo.run.step_metrics import PolicyStopped, PolicyWatch

    watch = PolicyWatch(max_steps_all_wrong=2)
    watch.observe({"reward/acc_mean": 0.0}, 1)
    watch.observe({}, 2)  # a step all from the pool scored nothing: neither counts nor resets
    watch.observe({"reward/acc_mean": 0.01}, 3)  # one right response in the step: the count starts again
    watch.observe({"reward/acc_mean": 0.0}, 4)
    resumed = PolicyWatch(max_steps_all_wrong=2)
    resumed.load_state_dict(watch.state_dict())  # the count survives a resume
    with pytest.raises(PolicyStopped, match="step 5: not one response was right in the last 2 steps"):
        resumed.observe({"reward/acc_mean": 0.0, "reward/no_answer_ratio": 1.0}, 5)
    never = PolicyWatch(max_steps_all_wrong=0)
    for step in range(1, 10):
        never.observe({"reward/acc_mean": 0.0}, step)  # 0: never stops on wrong answers


# ------------------------------------------------------------------------------------------- faults


class SignalAfter:
    """``run.preemption.TrainerWatch`` as the trainer sees it: the driver's SIGTERM shows from the ``calls``-th
    read of the flag on (the trainer reads it before each step and after each step's save)."""

    def __init__(self, calls: int):
        self.calls, self.reads = calls, 0

    def requested(self):
        self.reads += 1
        return "SIGTERM" if self.reads >= self.calls else None


@pytest.mark.parametrize("reads, saved_step, outcome", [
    (4, 2, "stopped by SIGTERM after step 2"),  # during step 2: the step is finished, then saved
    (5, 2, "stopped by SIGTERM before step 3"),  # between steps 2 and 3: step 2 is saved, step 3 not begun
])
def test_sigterm_saves_the_last_step_and_the_rerun_trains_what_an_uninterrupted_run_trains(
        tmp_path, inputs, monkeypatch, reads, saved_step, outcome):
    import os

    from recipe_dapo.run.preemption import TrainerWatch

    whole, _ = build_trainer(tmp_path / "whole", inputs, monkeypatch)
    whole.fit()
    expected = whole.actor_rollout_wg.trained_sequences

    watch = SignalAfter(reads)
    monkeypatch.setattr(TrainerWatch, "open", classmethod(lambda cls: watch))
    stopped, _ = build_trainer(tmp_path / "split", inputs, monkeypatch)  # save_freq=0: no scheduled save
    stopped.fit()
    assert sorted(RecordingTracker.logged) == [1, 2] and RecordingTracker.outcome == outcome
    checkpoints = stopped.config.trainer.default_local_dir
    assert os.path.exists(f"{checkpoints}/global_step_{saved_step}/dapo_state.pt")
    assert open(f"{checkpoints}/latest_checkpointed_iteration.txt").read() == str(saved_step)

    monkeypatch.setattr(TrainerWatch, "open", classmethod(lambda cls: SignalAfter(10**9)))
    resumed, _ = build_trainer(tmp_path / "split", inputs, monkeypatch)
    resumed.fit()
    assert sorted(RecordingTracker.logged) == [3, 4, 5]
    assert stopped.actor_rollout_wg.trained_sequences + resumed.actor_rollout_wg.trained_sequences == expected


class FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: writes past it fail as the kernel fails them (ENOSPC)."""

    room = 1 << 12

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_while_saving_removes_the_half_written_step_and_says_so_in_one_line(tmp_path, inputs,
                                                                                       monkeypatch):
    """The actor's optimizer file is cut part-way (torch's writer fails with ``enforce fail at inline_container.cc``,
    as on a real full disk): the step's folder goes, verl's tracker still names the last good checkpoint, and the
    error is one line with the path, the cause, the space needed and the last good checkpoint."""
    from recipe_dapo.run.checkpoint_state import CheckpointWriteError

    trainer, device = build_trainer(tmp_path, inputs, monkeypatch, "trainer.total_training_steps=1", "trainer.save_freq=1")
    trainer.fit()
    checkpoints = trainer.config.trainer.default_local_dir
    good = os.path.join(checkpoints, "global_step_1")
    assert os.path.isdir(good)

    def save_on_a_full_disk(local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        torch.save({"version": device.actor_version}, os.path.join(local_path, "model.pt"))
        with FullDisk(os.path.join(local_path, "optim.pt"), "wb") as stream:
            torch.save({"exp_avg": torch.zeros(1 << 16)}, stream)

    trainer.actor_rollout_wg.save_checkpoint = save_on_a_full_disk
    trainer.global_steps = 2
    with pytest.raises(CheckpointWriteError) as raised:
        trainer._save_checkpoint()
    message = str(raised.value)
    assert "\n" not in message
    assert f"checkpoint {checkpoints}/global_step_2 not written (disk full: [enforce fail at inline_container.cc" in message
    needed = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(good) for f in files)
    assert f"needs about {needed / (1 << 20):.1f} MiB" in message
    assert f"last good checkpoint: {good} " in message
    assert not os.path.exists(os.path.join(checkpoints, "global_step_2"))
    assert open(os.path.join(checkpoints, "latest_checkpointed_iteration.txt")).read() == "1"


def test_a_full_disk_while_writing_the_samplers_state_fails_the_same_way(tmp_path, inputs, monkeypatch):
    import builtins

    import recipe_dapo.run.checkpoint_state as checkpoint_state
    from recipe_dapo.run.checkpoint_state import CheckpointWriteError

    trainer, _ = build_trainer(tmp_path, inputs, monkeypatch)
    trainer.global_steps = 1
    real_open = builtins.open
    monkeypatch.setattr(checkpoint_state, "open",
                        lambda path, mode="r", *a, **k: FullDisk(path, mode) if "dapo_state" in str(path) and "w" in mode
                        else real_open(path, mode, *a, **k), raising=False)
    with pytest.raises(CheckpointWriteError, match=r"global_step_1 not written \(disk full: .*last good checkpoint: none"):
        trainer._save_checkpoint()
    assert not os.path.exists(os.path.join(trainer.config.trainer.default_local_dir, "global_step_1"))
