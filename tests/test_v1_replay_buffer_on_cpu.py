"""``DAPOReplayBuffer`` over a real TransferQueue (local Ray), with verl v1's storage layout.

The rollout side is played by the test: the buffer's refill function registers prompt markers and writes each
prompt's ``n`` trajectories as verl's ``AgentLoopWorkerTQ`` does (keys ``{uid}_{session}_0``, the reward manager's
``reward_extra_info`` in ``extra_fields``, ``response_len`` and step tags), with scripted accuracies, then marks the
group finished or failed. Everything else is the recipe's code on the real store: polling, judging, pooling the
surplus in TransferQueue, the batch handed to verl, freeing stale groups, and the checkpoint round trip.
"""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest
import torch
from conftest import requires_verl_v1

N = 4
BATCH = 3

pytestmark = [pytest.mark.timeout(300), requires_verl_v1]


@pytest.fixture(scope="module")
def transfer_queue():
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=4, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


class ScriptedRollouts:
    """Writes finished groups into TransferQueue; group i's accuracies come from ``outcomes`` (cycled)."""

    def __init__(self, tq, outcomes, fail_every: int = 0):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.tq, self.to_tensordict = tq, list_of_dict_to_tensordict
        self.outcomes = itertools.cycle(outcomes)
        self.fail_every = fail_every
        self.submitted: list[int] = []
        self.uids: list[str] = []
        self.step = 1

    def __call__(self, num_prompts: int) -> int:
        self.submitted.append(num_prompts)
        for _ in range(num_prompts):
            uid = str(uuid.uuid4())
            self.uids.append(uid)
            self.tq.kv_batch_put(keys=[uid], partition_id="train",
                                 tags=[{"is_prompt": True, "status": "pending", "global_steps": self.step}])
            if self.fail_every and len(self.uids) % self.fail_every == 0:
                self.tq.kv_put(key=uid, partition_id="train", tag={"status": "failure"})
                continue
            acc = next(self.outcomes)
            keys, fields, tags = [], [], []
            for session in range(N):
                length = 5 + session
                keys.append(f"{uid}_{session}_0")
                fields.append({
                    "responses": torch.arange(length),
                    "response_mask": torch.ones(length, dtype=torch.int64),
                    "rm_scores": torch.tensor([0.0] * (length - 1) + [2.0 * acc[session] - 1.0]),
                    "extra_fields": {"reward_extra_info": {"acc": float(acc[session]), "score": 2.0 * acc[session] - 1.0,
                                                           "truncated": False}},
                    "uid": uid,
                })
                tags.append({"status": "success", "response_len": length, "global_steps": self.step,
                             "min_global_steps": self.step, "max_global_steps": self.step})
            self.tq.kv_batch_put(keys=keys, partition_id="train", fields=self.to_tensordict(fields), tags=tags)
            self.tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
        return num_prompts


def make_buffer(rollouts, **dynamic_sampling):
    from omegaconf import OmegaConf

    from recipe_dapo.trainers.v1.replay_buffer import DAPOReplayBuffer

    sampler_kwargs = OmegaConf.create({
        "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 0},
        "dynamic_sampling": {"poll_interval_s": 0.01, "safety_margin": 1.0, **dynamic_sampling},
        "train_batch_size": BATCH, "gen_batch_size": 16, "ppo_mini_batch_size": 1,
    })
    return DAPOReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                            max_off_policy_strategy="drop", sampler_kwargs=sampler_kwargs, refill_fn=rollouts)


def clear_partition(tq):
    listing = tq.kv_list("train") or {}
    keys = list(listing.get("train", {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id="train")


MIXED, ALL_RIGHT, ALL_WRONG = (1, 0, 1, 0), (1, 1, 1, 1), (0, 0, 0, 0)


def test_batch_holds_only_qualifying_groups_in_session_order_and_the_surplus_stays_in_the_store(transfer_queue):
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED, ALL_RIGHT, ALL_WRONG, MIXED])
    buffer = make_buffer(rollouts)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)

    assert len(batch.keys) == BATCH * N
    uids = [key.split("_")[0] for key in batch.keys[::N]]
    assert all(batch.keys[i * N:(i + 1) * N] == [f"{uid}_{s}_0" for s in range(N)] for i, uid in enumerate(uids))
    scores = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["extra_fields"])
    acc = np.array([value["reward_extra_info"]["acc"] for value in list(scores["extra_fields"])]).reshape(BATCH, N)
    assert (acc.std(axis=1) > 0).all()  # only groups with spread are trained
    assert [tag["response_len"] for tag in batch.tags[:N]] == [5, 6, 7, 8]

    # safety_margin=1 with the 0.5 prior asks for 12 prompts: 6 qualify, 3 are trained, 3 carried over.
    assert rollouts.submitted[0] == 12
    assert metrics["dynamic_sampling/generated_groups"] == 12
    assert metrics["dynamic_sampling/kept_groups"] == 6
    assert metrics["dynamic_sampling/carried_out_groups"] == 3
    assert metrics["dynamic_sampling/generated_tokens"] == 12 * (5 + 6 + 7 + 8)
    assert metrics["reward/acc_mean"] == pytest.approx(np.mean([sum(MIXED), 4, 0, sum(MIXED)]) / 4)
    listing = tq.kv_list("train")["train"]
    assert not any(tag.get("is_prompt") for tag in listing.values())  # every prompt marker was judged and removed
    pooled = buffer.groups.keys_of(buffer.sampler.state_dict()["pool"][0]["group_ids"])
    assert set(listing) == set(batch.keys) | set(pooled)  # filtered groups deleted, surplus kept

    # The next step trains the carried-over groups first, without generating anything.
    tq.kv_clear(keys=batch.keys, partition_id="train")
    second, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert sorted(second.keys) == sorted(pooled)
    assert metrics["dynamic_sampling/num_gen_rounds"] == 0 and metrics["dynamic_sampling/carried_in_groups"] == BATCH
    assert len(rollouts.submitted) == 1


def test_failed_groups_are_counted_and_dropped_and_stale_groups_are_freed(transfer_queue):
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED], fail_every=3)
    buffer = make_buffer(rollouts, max_staleness=0)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/failed_groups"] == 4  # 12 submitted, every third failed
    assert len(batch.keys) == BATCH * N
    tq.kv_clear(keys=batch.keys, partition_id="train")
    surplus = set(tq.kv_list("train")["train"])
    assert surplus  # 8 qualified, 3 trained: 5 groups pooled
    rollouts.step = 2
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/dropped_stale_groups"] == 5  # max_staleness=0: the paper's discard
    assert not surplus & set(tq.kv_list("train")["train"])  # and their trajectories left the store


def test_checkpoint_round_trip_puts_the_pooled_trajectories_back(transfer_queue):
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED])
    buffer = make_buffer(rollouts)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    state = buffer.state_dict()
    pooled = sorted(state["tags"])
    assert len(pooled) == (12 - BATCH) * N

    clear_partition(tq)  # a new process: the store is empty
    restored = make_buffer(rollouts)
    restored.load_state_dict(state)
    assert sorted(tq.kv_list("train")["train"]) == pooled
    second, metrics = restored.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/carried_in_groups"] == BATCH
    values = tq.kv_batch_get(keys=second.keys, partition_id="train", select_fields=["responses"])
    assert [int(row.shape[0]) for row in values["responses"].unbind()][:N] == [5, 6, 7, 8]
    assert len(rollouts.submitted) == 1
