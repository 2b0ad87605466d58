"""``DAPOReplayBuffer`` over a real TransferQueue (local Ray), with verl v1's storage layout.

The rollout side is played by the test: the buffer's refill function registers prompt markers and writes each
prompt's ``n`` trajectories as verl's ``AgentLoopWorkerTQ`` does (keys ``{uid}_{session}_0``, the reward manager's
``reward_extra_info`` in ``extra_fields``, ``response_len`` and step tags), with scripted accuracies, then marks the
group finished or failed. Everything else is the recipe's code on the real store: polling, judging, pooling the
surplus in TransferQueue, the batch handed to verl, freeing stale groups, and the checkpoint round trip.
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid

import numpy as np
import pytest
import torch
from conftest import requires_verl_v1

N = 4
BATCH = 3

pytestmark = [pytest.mark.timeout(300), requires_verl_v1]


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


def make_buffer(rollouts, trainer_mode="sync", **dynamic_sampling):
    from omegaconf import OmegaConf

    from recipe_dapo.trainers.v1.replay_buffer import DAPOReplayBuffer

    sampler_kwargs = OmegaConf.create({
        "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 0},
        "dynamic_sampling": {"poll_interval_s": 0.01, "safety_margin": 1.0, **dynamic_sampling},
        "train_batch_size": BATCH, "gen_batch_size": 16, "ppo_mini_batch_size": 1,
    })
    return DAPOReplayBuffer(trainer_mode=trainer_mode, trainer_config={}, max_off_policy_threshold=None,
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
    # max_staleness=3: pooled + in flight may reach 3 * (1 + 3) = 12, so the first refill is not capped.
    buffer = make_buffer(rollouts, max_staleness=3)
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
    # 8 qualified, 3 trained: max_staleness=0 (the paper's discard) drops the other 5 as the step closes, and their
    # trajectories leave the store with them: nothing but the batch is left.
    assert metrics["dynamic_sampling/dropped_stale_groups"] == 5 and metrics["dynamic_sampling/carried_out_groups"] == 0
    tq.kv_clear(keys=batch.keys, partition_id="train")
    assert not set(tq.kv_list("train").get("train", {}))
    rollouts.step = 2
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/carried_in_groups"] == 0 and len(batch.keys) == BATCH * N


def test_checkpoint_round_trip_puts_the_pooled_trajectories_back(transfer_queue):
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED])
    buffer = make_buffer(rollouts, max_staleness=3)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    state = buffer.state_dict()
    pooled = sorted(state["tags"])
    assert len(pooled) == (12 - BATCH) * N

    clear_partition(tq)  # a new process: the store is empty
    restored = make_buffer(rollouts, max_staleness=3)
    restored.load_state_dict(state)
    assert sorted(tq.kv_list("train")["train"]) == pooled
    second, metrics = restored.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/carried_in_groups"] == BATCH
    values = tq.kv_batch_get(keys=second.keys, partition_id="train", select_fields=["responses"])
    assert [int(row.shape[0]) for row in values["responses"].unbind()][:N] == [5, 6, 7, 8]
    assert len(rollouts.submitted) == 1
    # The restored groups' correctness came back with them: what the step trained is measured (selection/*).
    assert metrics["selection/trained_solve_rate"] == 0.5 and metrics["selection/trained_length_mean"] == 6.5


class StallingRollouts(ScriptedRollouts):
    """After ``finish`` more groups, prompts stay pending (a step still generating when a stop request comes)."""

    def __init__(self, tq, outcomes):
        super().__init__(tq, outcomes)
        self.finish: int | None = None

    def __call__(self, num_prompts: int) -> int:
        if self.finish is None:
            return super().__call__(num_prompts)
        finishing = min(num_prompts, self.finish)
        self.finish -= finishing
        super().__call__(finishing)
        for _ in range(num_prompts - finishing):
            uid = str(uuid.uuid4())
            self.tq.kv_batch_put(keys=[uid], partition_id="train",
                                 tags=[{"is_prompt": True, "status": "pending", "global_steps": self.step}])
        self.submitted.append(num_prompts - finishing)
        return num_prompts


def test_a_step_given_up_while_waiting_for_groups_goes_back_to_the_pool_it_started_from(transfer_queue):
    """Sync mode: a stop request while step 2 waits for its groups raises ``StepGivenUp`` at the next poll; the
    buffer rewound to the state taken as the step began saves the group step 1 pooled and not the one step 2 pooled
    meanwhile (its prompt is drawn again from the rewound dataloader: sync mode saves no TransferQueue). The async
    modes keep no start state (verl's TransferQueue snapshot keeps their prompts in flight)."""
    from recipe_dapo.run.preemption import GiveUpCheck, StepGivenUp

    tq = transfer_queue
    clear_partition(tq)
    rollouts = StallingRollouts(tq, [MIXED, ALL_RIGHT, ALL_RIGHT])
    buffer = make_buffer(rollouts, max_staleness=3)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert metrics["dynamic_sampling/carried_out_groups"] == 1  # 12 prompts, 4 qualified, 3 trained
    tq.kv_clear(keys=batch.keys, partition_id="train")
    pooled_at_start = sorted(buffer.state_dict()["tags"])

    start = buffer.step_start()
    rollouts.step, rollouts.finish = 2, 1
    requests = []
    buffer.groups.give_up = GiveUpCheck(lambda: requests.append(1) or "SIGTERM", poll_s=0.0).armed_for(2)
    with pytest.raises(StepGivenUp, match="SIGTERM in step 2's generation"):
        buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    assert requests, "the stop flag was never read"
    assert len(buffer.state_dict()["tags"]) == 2 * N  # (the positive control: step 2 pooled a group)
    buffer.rewind(start)
    state = buffer.state_dict()
    assert sorted(state["tags"]) == pooled_at_start and len(state["trajectories"]) == N
    assert buffer.sampler.pooled_groups == 1

    disarmed = GiveUpCheck(lambda: pytest.fail("a disarmed check read the flag"), poll_s=0.0)
    disarmed()  # (never armed: a step past its update finishes)
    buffer.drain = False
    assert buffer.step_start() is None


def test_refills_stop_where_the_drain_could_overflow_the_next_step(transfer_queue):
    """max_staleness=1: every prompt in flight might qualify, so pooled + in flight stay within 2 * BATCH and the
    surplus carried out always fits the next step (which trains it first): no qualifying group is dropped."""
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED])  # every group qualifies: the worst case for the carry-out
    buffer = make_buffer(rollouts, max_staleness=1)
    for step in (1, 2, 3):
        rollouts.step = step
        batch, metrics = buffer.sample(global_steps=step, partition_id="train", batch_size=BATCH)
        tq.kv_clear(keys=batch.keys, partition_id="train")
        assert metrics["dynamic_sampling/carried_out_groups"] <= BATCH
        assert metrics["dynamic_sampling/dropped_stale_groups"] == 0
    assert max(rollouts.submitted) <= 2 * BATCH  # safety_margin=1 and the 0.5 prior asked for 12


class LateRollouts:
    """``ScriptedRollouts`` whose groups are written ``delay_s`` after their submission, from another thread (as
    verl's agent-loop workers write them while the trainer polls)."""

    def __init__(self, rollouts: ScriptedRollouts, delay_s: float):
        self.rollouts, self.delay_s = rollouts, delay_s

    def __call__(self, num_prompts: int) -> int:
        threading.Timer(self.delay_s, self.rollouts, args=(num_prompts,)).start()
        return num_prompts


def test_a_step_reports_the_trainers_transferqueue_time_and_its_poll_waits(transfer_queue):
    """The recipe's v1 step adds ``timing_s/tq_read``, ``tq_write``, ``gen_tq`` and ``poll_wait`` (``phase_timing``):
    here the groups come back 0.3 s after their refill, so the buffer sleeps about that long between polls; the read
    after sampling counts in ``tq_read`` but not in ``gen_tq``; what came before the step is not counted."""
    from recipe_dapo.trainers.v1.phase_timing import CLOCK, install_tq_timing, timed_step, uninstall_tq_timing

    tq = transfer_queue
    clear_partition(tq)
    buffer = make_buffer(LateRollouts(ScriptedRollouts(tq, [MIXED]), delay_s=0.3), max_staleness=1)
    install_tq_timing()
    try:
        tq.kv_list("train")  # before the step
        CLOCK.add("poll_wait", 100.0)

        def step(metrics, timing_raw):
            batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
            tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["responses"])  # after sampling
            tq.kv_clear(keys=batch.keys, partition_id="train")
            return batch

        timing_raw: dict = {}
        timed_step(step, buffer, {}, timing_raw)
    finally:
        uninstall_tq_timing()
    assert 0.25 <= timing_raw["poll_wait"] < 5.0  # the wave's 0.3 s, not the 100 s added before the step
    assert timing_raw["tq_read"] > 0 and timing_raw["tq_write"] > 0
    assert 0 < timing_raw["gen_tq"] < timing_raw["tq_read"] + timing_raw["tq_write"]
    assert not getattr(tq.kv_list, "timed_phase", None)  # uninstalled


# ---------------------------------------------------------------- a dead rollout stops the step
#
# verl's agent loop marks a group ``failure`` when a session raises and the buffer drops and refills it: with a dead
# engine every refill fails too, and a dead agent-loop worker never marks its groups at all. Both used to leave
# ``sample`` waiting (4 minutes of nothing after kill -9 of VLLM::EngineCore on the v1 trainer, before).

BOUND_S = 20.0  # seconds from the first submit to the error; today's code never returns


class OneGenerateLoop:
    """An agent loop (verl's registry instantiates it) that makes one generate call, as the single-turn loop does."""

    def __init__(self, server_manager, **_):
        self.server_manager = server_manager

    async def run(self, sampling_params, **kwargs):
        return await self.server_manager.generate(str(uuid.uuid4()), prompt_ids=[1, 2, 3],
                                                  sampling_params=sampling_params)


class ServerClient:
    """verl's LLMServerClient reduced to its remote call: ``server.generate.remote`` on a rollout server actor."""

    def __init__(self, server):
        self.server = server

    async def generate(self, request_id, **kwargs):
        return await self.server.generate.remote(request_id=request_id, **kwargs)


class AgentLoopRefill:
    """verl's refill (``_submit_batch_to_rollout``): prompt markers, then each prompt's ``_run_prompt`` on the agent-loop
    worker's event loop, fire-and-forget."""

    def __init__(self, tq, worker):
        import asyncio
        import threading

        self.tq, self.worker, self.submitted = tq, worker, []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.first_submit = None

    def __call__(self, num_prompts: int) -> int:
        import asyncio
        import time

        self.first_submit = self.first_submit or time.monotonic()
        self.submitted.append(num_prompts)
        for index in range(num_prompts):
            uid = str(uuid.uuid4())
            self.tq.kv_batch_put(keys=[uid], partition_id="train",
                                 tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}])
            prompt = {"uid": uid, "agent_name": "recipe_dapo_test_one_generate", "global_steps": 1}
            trajectory = {"step": 1, "sample_index": index, "rollout_n": 0, "validate": False}
            asyncio.run_coroutine_threadsafe(self.worker._run_prompt(prompt, {"temperature": 1.0}, trajectory), self.loop)
        return num_prompts


def agent_loop_worker(server):
    """The recipe's agent-loop worker class (``DAPOAgentLoopWorkerTQ``), in this process, with verl's ``_run_prompt`` and
    ``_run_agent_loop`` and only the attributes they read before the server call."""
    from omegaconf import OmegaConf

    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from recipe_dapo.trainers.v1.agent_loop import DAPOAgentLoopWorkerTQ

    _agent_loop_registry["recipe_dapo_test_one_generate"] = {"_target_": f"{__name__}.OneGenerateLoop"}
    worker = object.__new__(DAPOAgentLoopWorkerTQ.__ray_actor_class__)
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": N, "val_kwargs": {"n": 1}}}, "data": {}})
    worker.llm_client = ServerClient(server)
    worker.tokenizer = worker.processor = worker.hf_model_type = worker.dataset_cls = None
    worker.tools = []
    return worker


def test_a_dead_engine_stops_the_step_at_once_naming_the_server_and_the_error(transfer_queue):
    """The rollout server's engine is dead (vLLM's EngineDeadError from every generate, as after kill -9 of
    VLLM::EngineCore): the first group back raises RolloutDied naming it, instead of refilling forever."""
    import time

    import ray

    from recipe_dapo.run.rollout_health import RolloutDied

    @ray.remote
    class DeadEngineServer:
        def __init__(self):
            from vllm.v1.engine.exceptions import EngineDeadError

            self.error = EngineDeadError

        async def generate(self, **_):
            raise self.error()

    tq = transfer_queue
    clear_partition(tq)
    server = DeadEngineServer.remote()
    ray.get(server.__ray_ready__.remote())  # vLLM imported: the clock below measures the buffer, not the import
    rollouts = AgentLoopRefill(tq, agent_loop_worker(server))
    buffer = make_buffer(rollouts)  # max_num_gen_batches=0: no budget would ever end the refills
    with pytest.raises(RolloutDied) as raised:
        buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    elapsed = time.monotonic() - rollouts.first_submit
    message = str(raised.value)
    assert re.match(r"rollout died at step 1: \d+ prompt group\(s\) failed with RayTaskError\(EngineDeadError\)", message)
    assert "EngineDeadError" in message and "DeadEngineServer.generate" in message  # the error and where it ran
    assert "rerun the same command" in message
    assert elapsed < BOUND_S, elapsed
    assert len(rollouts.submitted) == 1  # no refill after the first group came back failed


@pytest.mark.timeout(120)
def test_a_dead_agent_loop_worker_is_found_by_the_liveness_probe_and_named(transfer_queue):
    """The agent-loop worker holding the prompts dies: no group ever reaches a terminal status. The stream's probe
    (run when nothing came back for ``rollout_probe_s``) finds the dead actor and raises, naming it."""
    import time

    import ray

    from recipe_dapo.run.rollout_liveness import RolloutLiveness
    from recipe_dapo.run.rollout_health import RolloutDied, StallWatch

    @ray.remote
    class AgentLoopWorker:
        def take(self, uids):
            return len(uids)

    tq = transfer_queue
    clear_partition(tq)
    worker = AgentLoopWorker.remote()
    submitted = []

    def refill(num_prompts):
        submitted.append(time.monotonic())
        uids = [str(uuid.uuid4()) for _ in range(num_prompts)]
        tq.kv_batch_put(keys=uids, partition_id="train",
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids])
        ray.get(worker.take.remote(uids))
        ray.kill(worker)  # dies holding them
        return num_prompts

    buffer = make_buffer(refill)
    buffer.groups.watch = StallWatch(RolloutLiveness([worker], [], []), after_s=1.0)
    with pytest.raises(RolloutDied, match=r"agent-loop worker 0 \(AgentLoopWorker [0-9a-f]+\) is dead: .*ActorDiedError"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert time.monotonic() - submitted[0] < BOUND_S
    assert buffer.groups.watch.probes == 1


def test_the_probe_names_a_replica_whose_vllm_engine_fails_its_health_check(engine_health):
    """vLLM's HTTP server answers ``GET /health`` with 503 once its engine is dead; 200 is alive; one check that
    cannot reach the server is not enough to call it dead (``dapo.health.max_unanswered_health_checks`` in a row are)."""
    from recipe_dapo.run.rollout_liveness import RolloutLiveness
    from recipe_dapo.run.rollout_health import RolloutDied

    live, unreachable = engine_health.address, "127.0.0.1:1"  # port 1: nothing listens
    RolloutLiveness([], [], [live], timeout_s=5)()  # alive: no error
    engine_health.status = 503
    with pytest.raises(RolloutDied, match=r"engine of rollout replica 0 \(127\.0\.0\.1:\d+\) is dead: .*HTTP 503"):
        RolloutLiveness([], [], [live], timeout_s=5)()
    RolloutLiveness([], [], [unreachable], timeout_s=5)()  # one unanswered check: logged, counted, not yet dead


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_async_groups_submitted_in_an_earlier_step_count_their_age_from_it(transfer_queue, max_staleness):
    """verl v1's async mode: two groups submitted in step 1 (TransferQueue tags their step) finish in step 2. Their
    age counts from step 1: max_staleness=0 drops them as they arrive (counted, their trajectories freed) and step 2
    trains only what it submitted; max_staleness=1 trains them, one step old."""
    tq = transfer_queue
    clear_partition(tq)
    rollouts = ScriptedRollouts(tq, [MIXED])
    buffer = make_buffer(rollouts, max_staleness=max_staleness)
    buffer.drain = False
    early = rollouts(2)  # written finished, tagged global_steps=1, before step 2 polls
    assert early == 2
    early_uids = set(rollouts.uids)
    buffer.groups.resume_in_flight(2)  # in flight, as verl's restored async prompts are
    rollouts.step = 2
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    trained = {key.split("_", 1)[0] for key in batch.keys}
    if max_staleness == 0:
        # (the step's own surplus is dropped too as it closes: max_staleness=0 carries nothing over)
        assert metrics["dynamic_sampling/dropped_stale_groups"] >= 2 and not trained & early_uids
        assert not {key.split("_", 1)[0] for key in tq.kv_list("train")["train"]} & early_uids  # freed
    else:
        assert trained >= early_uids and metrics["dynamic_sampling/carried_in_groups"] == 2


class ResumedRollouts(ScriptedRollouts):
    """Groups written as verl's partial rollout leaves a response resumed after a weight update: generated from
    version ``step - 1`` to ``step`` (``min_global_steps`` < ``max_global_steps``)."""

    def __call__(self, num_prompts: int) -> int:
        done = super().__call__(num_prompts)
        listing = self.tq.kv_list("train")["train"]
        for key, tag in listing.items():
            if key.split("_", 1)[0] not in self.uids[-num_prompts:]:
                continue
            if tag.get("is_prompt"):  # submitted in the step before
                self.tq.kv_put(key=key, partition_id="train", tag={**tag, "global_steps": self.step - 1})
            else:
                self.tq.kv_put(key=key, partition_id="train", tag={**tag, "min_global_steps": self.step - 1})
        return done


def test_one_round_waits_only_for_overdue_prompts_and_counts_the_recycled_responses_it_trains(transfer_queue):
    """colocate_async with one_round: prompt markers still generating from step 1 are overdue at step 2 (aborted
    again they would train two updates late); one from step 2 is not. Two groups resumed across the update (tagged
    1 -> 2) finish before step 2 polls: trained first (the oldest), counted as recycled, with the step's lengths."""
    tq = transfer_queue
    clear_partition(tq)
    with pytest.raises(ValueError, match="colocate_async"):
        make_buffer(ScriptedRollouts(tq, [MIXED]), max_staleness=1, one_round=True)
    running = {uid: step for uid, step in ((str(uuid.uuid4()), 1), (str(uuid.uuid4()), 1), (str(uuid.uuid4()), 2))}
    for uid, step in running.items():
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": step})
    buffer = make_buffer(ScriptedRollouts(tq, [MIXED]), trainer_mode="colocate_async", max_staleness=1,
                         one_round=True)
    buffer.groups.resume_in_flight(len(running))
    buffer.groups.step = 2
    assert buffer.groups.poll() is None and buffer.groups.overdue() == 2
    resumed = ResumedRollouts(tq, [MIXED])
    resumed.step = 2
    resumed(2)
    for uid in running:  # they finish (empty: counted as failed and dropped), so the step can end
        tq.kv_put(key=uid, partition_id="train", tag={"status": "failure"})
    buffer.groups.resume_in_flight(len(running) + 2)
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=BATCH)
    trained = {key.split("_", 1)[0] for key in batch.keys}
    assert set(resumed.uids) <= trained
    assert metrics["selection/recycled_responses"] == 2 * N
    assert metrics["selection/trained_length_mean"] == pytest.approx(6.5)
    assert metrics["selection/length_ks"] == 0.0 and metrics["selection/trained_solve_rate"] == 0.5
    clear_partition(tq)
