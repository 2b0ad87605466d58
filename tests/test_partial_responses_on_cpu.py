"""Responses still generating at a checkpoint (verl v1 ``colocate_async``): saved with the recipe's state and resumed
from their prefix.

The rollout server is the only fake (:class:`PrefixEngine`, standing in for vLLM): a deterministic model whose next
token is a function of the whole context, that ends a request early as vLLM's abort does, parks what arrives while it
is paused, and refuses to generate again for a prompt whose response it already started (a resumed request must be
sent its prefix). Everything else is real: verl's ``FullyAsyncLLMServerClient`` resume loop (the recipe's client
derives from it), ``TokenOutput``, the recipe's state file, and (in the last test) TransferQueue on a local Ray with
verl's own ``_reissue_inflight_prompts``, ``AgentLoopWorkerTQ.generate_sequences``, ``_run_prompt`` and
``_run_agent_loop`` (the agent loop it instantiates makes one generate call, as the single-turn loop does).
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import requires_verl_v1
from omegaconf import OmegaConf

pytestmark = [pytest.mark.timeout(300), requires_verl_v1]

PROMPT = [11, 12, 13, 14]
OTHER_PROMPT = [21, 22, 23]
RESPONSE_LENGTH = 12


def next_token(context: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 7 + len(context)) % 97 + 3


def log_prob(context: list[int]) -> float:
    return -math.pi / (len(context) + 1.0) * 1.000000119  # not exactly representable in float32


class PrefixEngine:
    """A fake rollout server with vLLM's protocol as verl's client sees it (``generate`` returns a ``TokenOutput``
    with ``extra_fields["global_steps"]``; an aborted request comes back with ``stop_reason="aborted"`` and the tokens
    so far). ``abort_after``: per prompt, the tokens its first request generates before it is aborted; ``paused``:
    requests park."""

    def __init__(self, version: int):
        self.version = version
        self.abort_after: dict[tuple[int, ...], int] = {}  # a prompt's first request: tokens before its abort
        self.paused = asyncio.Event()
        self.paused.set()
        self.started: set[tuple[int, ...]] = set()  # prompts whose response this engine began
        self.requests: list[list[int]] = []
        self.generate = SimpleNamespace(remote=self._generate)

    async def _generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        await self.paused.wait()
        prompt_ids = list(prompt_ids)
        self.requests.append(prompt_ids)
        if tuple(prompt_ids) in self.started:
            raise AssertionError(f"request {prompt_ids} restarts a response this engine already began: the resumed "
                                 "request was not sent its prefix")
        self.started.add(tuple(prompt_ids))
        budget = int(sampling_params["max_tokens"])
        context, tokens, log_probs = list(prompt_ids), [], []
        limit = min(budget, self.abort_after.pop(tuple(prompt_ids), budget))
        for _ in range(limit):
            log_probs.append(log_prob(context))
            tokens.append(next_token(context))
            context.append(tokens[-1])
        aborted = limit < budget
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason="aborted" if aborted else "completed",
                           num_preempted=0, extra_fields={"global_steps": self.version})


class Balancer:
    """verl's load balancer's calls, for one server."""

    def __init__(self, server):
        self.server = server
        self.require_acquire_fields = SimpleNamespace(remote=self._fields)
        self.require_release_fields = SimpleNamespace(remote=self._fields)
        self.acquire_server = SimpleNamespace(remote=self._acquire)
        self.release_server = SimpleNamespace(remote=lambda **_: None)

    async def _fields(self):
        return []

    async def _acquire(self, **_):
        return "server-0", self.server


def client_for(engine):
    from recipe_dapo.trainers.v1.partial_rollout import DAPOFullyAsyncLLMServerClient

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "response_length": RESPONSE_LENGTH,
                                                                 "full_determinism": False}}})
    return DAPOFullyAsyncLLMServerClient(config=config, load_balancer_handle=Balancer(engine))


def uninterrupted() -> tuple[list[int], list[float]]:
    context, tokens, log_probs = list(PROMPT), [], []
    for _ in range(RESPONSE_LENGTH):
        log_probs.append(log_prob(context))
        tokens.append(next_token(context))
        context.append(tokens[-1])
    return tokens, log_probs


async def start_and_abort(client, engine, sessions=(("g", 0, PROMPT, 5),)):
    """Sessions generating when the step ends (uid, session, prompt, tokens generated before the abort): each aborted,
    then the replicas pause for the update (verl's retry parks)."""
    from recipe_dapo.trainers.v1.partial_rollout import session_scope

    async def run(uid, session, prompt):
        with session_scope(client.partials, uid, session, None):
            return await client.generate("req", prompt_ids=list(prompt), sampling_params={"logprobs": True})

    seen = len(engine.requests)
    engine.abort_after = {tuple(prompt): tokens for _, _, prompt, tokens in sessions}
    tasks = [asyncio.create_task(run(uid, session, prompt)) for uid, session, prompt, _ in sessions]
    while len(engine.requests) < seen + len(sessions):
        await asyncio.sleep(0.01)
    engine.paused.clear()  # the replicas sleep for the update: the retries park
    await asyncio.sleep(0.05)
    return tasks[0] if len(tasks) == 1 else tasks


# ---------------------------------------------------------------------------------------------- the pure record


def test_a_partial_response_keeps_tokens_log_probs_and_per_token_versions_through_its_state():
    from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse, PrefixMismatch

    response = PartialResponse(list(PROMPT))
    response.record(PROMPT, [5, 6, 7], [-0.1, -0.25, -1e-9], version=3, stop_reason="aborted")
    response.record(PROMPT + [5, 6, 7], [8, 9], [-0.3, -0.7], version=4, stop_reason="aborted")
    with pytest.raises(PrefixMismatch):
        response.record(PROMPT, [1], [-1.0], version=5, stop_reason="aborted")  # a restart, not a continuation
    assert response.versions == [3, 3, 3, 4, 4] and response.first_version() == 3 and not response.finished
    back = PartialResponse.from_state(response.to_state())
    assert back == response
    assert back.log_probs == [-0.1, -0.25, -1e-9, -0.3, -0.7]  # exact floats


def test_the_staleness_rule_resumes_within_the_bound_and_drops_and_counts_beyond_it():
    from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse, groups_state, resume_plan

    def response(tokens):
        r = PartialResponse(list(PROMPT))
        r.record(PROMPT, list(range(tokens)), [-1.0] * tokens, version=1, stop_reason="aborted")
        return r

    saved = groups_state({"young": {0: response(3), 1: response(0)}, "old": {0: response(4), 2: response(2)},
                          "done": {0: response(1)}}, born={"young": 5, "old": 3, "gone": 5})
    assert set(saved) == {"young", "old"} and set(saved["young"]["sessions"]) == {0}  # empty sessions, finished groups
    plan = resume_plan(saved, resume_step=6, max_staleness=2)
    assert set(plan.resumed) == {"young"} and plan.born == {"young": 5}
    metrics = plan.metrics("dynamic_sampling/")
    assert metrics["dynamic_sampling/resumed_partial_responses"] == 1
    assert metrics["dynamic_sampling/resumed_partial_tokens"] == 3
    assert metrics["dynamic_sampling/dropped_partial_responses"] == 2
    assert metrics["dynamic_sampling/dropped_partial_tokens"] == 6
    assert plan.summary() == ("partial responses resumed from their prefix: 1 (3 tokens), dropped as older than "
                              "max_staleness: 2 (6 tokens)")
    assert set(resume_plan(saved, resume_step=6, max_staleness=3).resumed) == {"young", "old"}
    assert not resume_plan(saved, resume_step=6, max_staleness=3, in_flight=["other"]).resumed


# ---------------------------------------------------------------------------------------------- verl's resume loop


def test_an_aborted_request_is_recorded_as_verls_client_keeps_it_and_resumes_within_the_run():
    """Within a run (no checkpoint): verl's loop resumes the aborted request itself; the record follows it."""
    async def scenario():
        engine = PrefixEngine(version=3)
        client = client_for(engine)
        task = await start_and_abort(client, engine)
        live = client.partials.groups()["g"][0]
        assert live.token_ids == uninterrupted()[0][:5] and live.versions == [3] * 5 and not live.finished
        engine.version = 4
        engine.paused.set()  # weights updated, generation resumes
        output = await task
        assert output.token_ids == uninterrupted()[0]
        assert output.extra_fields["min_global_steps"] == 3 and output.extra_fields["max_global_steps"] == 4
        assert client.partials.groups()["g"][0].versions == [3] * 5 + [4] * (RESPONSE_LENGTH - 5)

    asyncio.run(scenario())


def test_saved_then_loaded_partials_are_bit_identical_and_the_resumed_request_carries_the_prefix(tmp_path):
    from recipe_dapo.dynamic_sampling.partial_responses import groups_state, resume_plan
    from recipe_dapo.run.checkpoint_state import load_recipe_state, save_recipe_state
    from recipe_dapo.trainers.v1.partial_rollout import session_scope

    config = OmegaConf.create({
        "trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto", "resume_from_path": None},
        "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2}},
    })

    async def before_the_checkpoint():
        engine = PrefixEngine(version=3)
        client = client_for(engine)
        task = await start_and_abort(client, engine)
        live = client.partials.groups()
        task.cancel()  # the process ends
        return live, engine.started

    live, started = asyncio.run(before_the_checkpoint())
    save_recipe_state(config, 4, {"partial_responses": groups_state(live, born={"g": 4})})
    loaded = load_recipe_state(config, 4)["partial_responses"]
    saved = loaded["g"]["sessions"][0]
    assert loaded["g"]["born"] == 4
    assert torch.equal(saved["token_ids"], torch.tensor(uninterrupted()[0][:5]))
    assert saved["log_probs"].dtype == torch.float64
    assert saved["log_probs"].tolist() == uninterrupted()[1][:5]  # bit-identical
    assert saved["versions"].tolist() == [3] * 5

    plan = resume_plan(loaded, resume_step=5, max_staleness=1)

    async def after_the_resume():
        engine = PrefixEngine(version=4)
        engine.started = set(started)  # the same model: a restart from the prompt is refused
        client = client_for(engine)
        states = {session: response.to_state() for session, response in plan.resumed["g"].items()}
        with session_scope(client.partials, "g", 0, states):
            output = await client.generate("req", prompt_ids=list(PROMPT), sampling_params={"logprobs": True})
        return engine, output

    engine, output = asyncio.run(after_the_resume())
    assert engine.requests == [PROMPT + uninterrupted()[0][:5]]  # the server was sent the prefix, once
    assert output.token_ids == uninterrupted()[0] and output.log_probs == uninterrupted()[1]
    assert output.extra_fields["min_global_steps"] == 3 and output.extra_fields["max_global_steps"] == 4


def test_a_saved_response_for_another_prompt_is_not_replayed():
    from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse
    from recipe_dapo.trainers.v1.partial_rollout import session_scope

    saved = PartialResponse([1, 2, 3])
    saved.record([1, 2, 3], [4, 5], [-0.5, -0.5], version=2, stop_reason="aborted")

    async def run():
        engine = PrefixEngine(version=4)
        client = client_for(engine)
        with session_scope(client.partials, "g", 0, {0: saved.to_state()}):
            output = await client.generate("req", prompt_ids=list(PROMPT), sampling_params={"logprobs": True})
        return engine, client, output

    engine, client, output = asyncio.run(run())
    assert engine.requests == [PROMPT] and output.token_ids == uninterrupted()[0]
    assert client.partials.unused_sessions == 1 and output.extra_fields["min_global_steps"] == 4


def test_a_finished_session_of_an_unfinished_group_is_kept_and_not_regenerated():
    from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse
    from recipe_dapo.trainers.v1.partial_rollout import session_scope

    tokens, log_probs = uninterrupted()
    saved = PartialResponse(list(PROMPT))
    saved.record(PROMPT, tokens[:4], log_probs[:4], version=2, stop_reason="aborted")
    saved.record(PROMPT + tokens[:4], tokens[4:], log_probs[4:], version=3, stop_reason="completed")

    async def run():
        engine = PrefixEngine(version=4)
        client = client_for(engine)
        with session_scope(client.partials, "g", 1, {1: saved.to_state()}):
            output = await client.generate("req", prompt_ids=list(PROMPT), sampling_params={"logprobs": True})
        return engine, output

    engine, output = asyncio.run(run())
    assert engine.requests == [] and output.token_ids == tokens and output.log_probs == log_probs
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (2, 3)


def test_a_checkpoint_during_a_replay_saves_the_whole_saved_response_not_the_part_replayed_so_far():
    """verl's loop waits a second after each aborted attempt, so a resumed session of several saved attempts is still
    replaying when a step the pool filled saves again: the record holds the part replayed, the save must hold all."""
    from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse
    from recipe_dapo.trainers.v1.partial_rollout import PartialBook

    tokens, log_probs = uninterrupted()
    saved = PartialResponse(list(PROMPT))
    saved.record(PROMPT, tokens[:3], log_probs[:3], version=2, stop_reason="aborted")
    saved.record(PROMPT + tokens[:3], tokens[3:7], log_probs[3:7], version=3, stop_reason="aborted")
    book = PartialBook()
    book.seed(("g", 0), saved)
    first = book.replay(("g", 0), list(PROMPT))
    book.record(("g", 0), list(PROMPT), first)  # one of two attempts replayed
    assert book.live[("g", 0)].num_tokens == 3
    kept = book.groups()["g"][0]
    assert kept.token_ids == tokens[:7] and kept.versions == [2] * 3 + [3] * 4
    second = book.replay(("g", 0), list(PROMPT) + tokens[:3])
    book.record(("g", 0), list(PROMPT) + tokens[:3], second)  # replay over: the record is the response again
    assert book.groups()["g"][0] == saved and book.replayed_sessions == 1


def test_a_worker_that_cannot_be_read_at_a_checkpoint_costs_its_own_groups_only(transfer_queue, caplog):
    import ray

    tq = transfer_queue
    listing = (tq.kv_list("train") or {}).get("train", {})
    if listing:
        tq.kv_clear(keys=list(listing), partition_id="train")
    tq.kv_batch_put(keys=["alive", "lost"], partition_id="train",
                    tags=[{"is_prompt": True, "status": "running", "global_steps": 4}] * 2)

    @ray.remote
    def dead_worker(uids):
        raise RuntimeError("the agent-loop worker died")

    async def scenario():
        engine = PrefixEngine(version=3)
        client = client_for(engine)
        tasks = await start_and_abort(client, engine, [("alive", 0, PROMPT, 5)])
        dead = SimpleNamespace(partial_responses=SimpleNamespace(remote=dead_worker.remote))
        state = bare_trainer(4, SimpleNamespace(agent_loop_workers=[WorkerHandle(client), dead]))._rollout_state()
        tasks.cancel()
        return state

    with caplog.at_level("WARNING"):
        state = asyncio.run(scenario())
    assert set(state["partial_responses"]) == {"alive"}  # the readable worker's responses are saved
    assert "1 of 2 agent-loop workers could not be read" in caplog.text and "worker died" in caplog.text


def test_a_stopping_runs_save_waits_seconds_not_minutes_for_a_worker_that_does_not_answer(transfer_queue, caplog):
    """A signal's grace (30 s by default) is for the whole save: a hung worker must not use it up."""
    import time

    import ray

    from recipe_dapo.trainers.v1.trainer import PARTIALS_TIMEOUT_STOPPING_S

    tq = transfer_queue
    listing = (tq.kv_list("train") or {}).get("train", {})
    if listing:
        tq.kv_clear(keys=list(listing), partition_id="train")
    tq.kv_batch_put(keys=["g"], partition_id="train", tags=[{"is_prompt": True, "status": "running", "global_steps": 4}])
    started = []

    @ray.remote
    def hung_worker(uids):
        time.sleep(60)

    def remote(uids):
        started.append(hung_worker.remote(uids))
        return started[-1]

    trainer = bare_trainer(4, SimpleNamespace(agent_loop_workers=[SimpleNamespace(
        partial_responses=SimpleNamespace(remote=remote))]))
    trainer.__dict__["_recipe_run"] = SimpleNamespace(stopped_by="SIGTERM")  # the run was signalled
    began = time.monotonic()
    with caplog.at_level("WARNING"):
        state = trainer._rollout_state()
    took = time.monotonic() - began
    for ref in started:
        ray.cancel(ref, force=True)
    assert state == {"partial_responses": {}}
    assert PARTIALS_TIMEOUT_STOPPING_S <= took < PARTIALS_TIMEOUT_STOPPING_S + 10, took
    assert f"1 gave no answer within {PARTIALS_TIMEOUT_STOPPING_S:g} s" in caplog.text


# ---------------------------------------------------------------------------------------------- TransferQueue and verl


class WorkerHandle:
    """An agent-loop worker's actor handle as the trainer calls it: the recipe worker's own ``partial_responses``
    over the worker's client, answered through Ray's object store."""

    def __init__(self, client):
        import types

        from recipe_dapo.trainers.v1.agent_loop import _DAPOAgentLoopWorkerTQ

        worker = SimpleNamespace(llm_client=client)
        worker._partial_book = types.MethodType(_DAPOAgentLoopWorkerTQ._partial_book, worker)
        method = types.MethodType(_DAPOAgentLoopWorkerTQ.partial_responses, worker)
        self.partial_responses = SimpleNamespace(remote=lambda uids: __import__("ray").put(method(uids)))


def bare_trainer(step, manager, max_staleness=1):
    from recipe_dapo.trainers.v1.trainer import DAPOTrainerV1ColocateAsync

    trainer = object.__new__(DAPOTrainerV1ColocateAsync)
    trainer.trainer_mode = "colocate_async"
    trainer.global_steps = step
    trainer.agent_loop_manager = manager
    trainer.replay_buffer = SimpleNamespace(config=SimpleNamespace(max_staleness=max_staleness))
    return trainer


LOOP_NAME = "recipe_dapo_test_prompt_loop"


class PromptLoop:
    """An agent loop (verl's registry instantiates it) that generates once for ``PROMPT``, as the single-turn loop does
    for its tokenized prompt; ``seen`` keeps the keyword arguments verl ran it with."""

    seen: list = []

    def __init__(self, server_manager, **_):
        self.server_manager = server_manager

    async def run(self, sampling_params, **kwargs):
        PromptLoop.seen.append(kwargs)
        return await self.server_manager.generate("req", prompt_ids=list(PROMPT), sampling_params=sampling_params)


def rollout_config():
    return OmegaConf.create({"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
                             "val_kwargs": {"n": 1, "top_p": 1.0, "top_k": -1, "temperature": 0.0},
                             "agent": {"default_agent_loop": LOOP_NAME}})


def runs_as_verls_worker_reads_them(batch) -> dict:
    """verl's ``AgentLoopWorkerTQ.generate_sequences`` on the re-issued batch: uid -> the arguments of the group's
    ``_run_prompt`` (the prompt dict, the sampling parameters, the trajectory)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from recipe_dapo.compat.ray import actor_class

    runs = {}

    async def run_prompt(prompt, sampling_params, trajectory, trace=False):
        runs[prompt["uid"]] = (prompt, sampling_params, trajectory)

    worker = SimpleNamespace(config=OmegaConf.create({"actor_rollout_ref": {"rollout": rollout_config()}}),
                             background_tasks=set(), _run_prompt=run_prompt)

    async def run():
        await actor_class(AgentLoopWorkerTQ).generate_sequences(worker, batch)
        await asyncio.gather(*list(worker.background_tasks))

    asyncio.run(run())
    return runs


def recipe_agent_loop_worker(client):
    """The recipe's agent-loop worker class in this process, with verl's ``_run_prompt`` and ``_run_agent_loop`` and the
    attributes they read; verl's post-processing (reward, TransferQueue rows) is replaced by a record of its input."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from recipe_dapo.trainers.v1.agent_loop import DAPOAgentLoopWorkerTQ

    _agent_loop_registry[LOOP_NAME] = {"_target_": f"{__name__}.PromptLoop"}
    worker = object.__new__(DAPOAgentLoopWorkerTQ.__ray_actor_class__)
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout_config()}, "data": {}})
    worker.llm_client = client
    worker.tokenizer = worker.processor = worker.hf_model_type = worker.dataset_cls = None
    worker.tools = []
    worker.outputs = []

    async def postprocess(output, validate, **kwargs):
        worker.outputs.append((output, kwargs))

    worker._agent_loop_postprocess = postprocess
    return worker


def test_a_checkpoint_in_transfer_queue_resumes_the_partial_through_verls_reissue(transfer_queue, tmp_path):
    import numpy as np
    from verl.utils import tensordict_utils as tu

    from recipe_dapo.run.checkpoint_state import load_recipe_state, save_recipe_state
    from recipe_dapo.trainers.v1.partial_rollout import PARTIAL_FIELD

    tq = transfer_queue
    listing = (tq.kv_list("train") or {}).get("train", {})
    if listing:
        tq.kv_clear(keys=list(listing), partition_id="train")
    config = OmegaConf.create({
        "trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto", "resume_from_path": None},
        "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2}},
    })
    # Three groups in flight at the end of step 4, their prompt rows as verl's _submit_batch_to_rollout writes them:
    # "young" (submitted in step 4) and "old" (step 2) generating, "idle" with nothing generated yet.
    uids, born = ["young", "old", "idle"], {"young": 4, "old": 2, "idle": 4}
    rows = tu.get_tensordict({"uid": np.array(uids, dtype=object), "index": np.arange(3),
                              "raw_prompt": np.array([[{"role": "user", "content": u}] for u in uids], dtype=object)})
    tq.kv_batch_put(keys=uids, partition_id="train", fields=rows,
                    tags=[{"is_prompt": True, "status": "running", "global_steps": born[u]} for u in uids])

    async def before_the_checkpoint():
        engine = PrefixEngine(version=3)
        client = client_for(engine)
        tasks = await start_and_abort(client, engine, [("young", 0, PROMPT, 5), ("old", 0, OTHER_PROMPT, 2)])
        live = client.partials.groups()
        trainer = bare_trainer(4, SimpleNamespace(agent_loop_workers=[WorkerHandle(client)]))
        state = trainer._rollout_state()
        for task in tasks:
            task.cancel()
        return live, state, engine.started

    live, state, started = asyncio.run(before_the_checkpoint())
    save_recipe_state(config, 4, state)
    tq.save_checkpoint(str(tmp_path / "transfer_queue"))
    tq.kv_clear(keys=uids, partition_id="train")  # a new process: verl restores its snapshot
    tq.load_checkpoint(str(tmp_path / "transfer_queue"))
    loaded = load_recipe_state(config, 4)["partial_responses"]
    assert set(loaded) == {"young", "old"}
    for uid in ("young", "old"):
        saved, recorded = loaded[uid]["sessions"][0], live[uid][0]
        assert saved["token_ids"].tolist() == recorded.token_ids
        assert saved["log_probs"].tolist() == recorded.log_probs  # bit-identical floats
        assert saved["versions"].tolist() == recorded.versions == [3] * len(recorded.token_ids)

    captured, at_dispatch = [], []

    def dispatch(batch):  # verl's manager hands the batch to the workers, whose first act rewrites each marker's tag
        at_dispatch.append(({uid: dict(tag) for uid, tag in tq.kv_list("train")["train"].items()},
                            tq.kv_batch_get(keys=uids, partition_id="train", select_fields=[PARTIAL_FIELD])))
        captured.append(batch)

    manager = SimpleNamespace(generate_sequences=dispatch)
    trainer = bare_trainer(4, manager, max_staleness=1)
    line = trainer._restore_rollout_state({"partial_responses": loaded})
    assert line == ("partial responses resumed from their prefix: 1 (5 tokens), dropped as older than max_staleness: "
                    "1 (2 tokens)")
    trainer.global_steps = 5  # verl's fit: the first step after the checkpoint's
    assert trainer._reissue_inflight_prompts() == 3
    tags = tq.kv_list("train")["train"]
    assert {uid: tags[uid]["global_steps"] for uid in uids} == {"young": 4, "old": 5, "idle": 5}
    # Written before the dispatch, not after: once dispatched, a worker's marker write (status running) rewrites the
    # whole tag and could undo a write that raced it.
    (tags_then, fields_then), = at_dispatch
    assert {uid: tags_then[uid]["global_steps"] for uid in uids} == {"young": 4, "old": 5, "idle": 5}
    assert all(not getattr(row, "data", row) for row in fields_then[PARTIAL_FIELD])
    assert manager.generate_sequences is dispatch  # the manager's own dispatch is back
    assert trainer._resume_metrics["dynamic_sampling/resumed_partial_responses"] == 1
    assert trainer._resume_metrics["dynamic_sampling/resumed_partial_tokens"] == 5
    assert trainer._resume_metrics["dynamic_sampling/dropped_partial_responses"] == 1

    runs = runs_as_verls_worker_reads_them(captured[0])
    assert set(runs) == set(uids) and not runs["old"][0][PARTIAL_FIELD] and not runs["idle"][0][PARTIAL_FIELD]

    async def after_the_resume():
        engine = PrefixEngine(version=4)
        engine.started = set(started)  # the same model: a restart from the prompt is refused
        worker = recipe_agent_loop_worker(client_for(engine))
        await worker._run_prompt(*runs["young"])  # as verl's generate_sequences calls it
        return engine, worker

    PromptLoop.seen.clear()
    engine, worker = asyncio.run(after_the_resume())
    assert engine.requests == [PROMPT + uninterrupted()[0][:5]]  # the server was sent the prefix, once
    (output, kwargs), = worker.outputs
    assert PARTIAL_FIELD not in kwargs and PARTIAL_FIELD not in PromptLoop.seen[0]  # not into the trajectory
    assert output.token_ids == uninterrupted()[0] and output.log_probs == uninterrupted()[1]
    assert output.extra_fields["min_global_steps"] == 3 and output.extra_fields["max_global_steps"] == 4
    assert tq.kv_list("train")["train"]["young"]["status"] == "finished"
    assert not worker.llm_client.partials.groups()  # the group ended: its record is freed
    left = tq.kv_batch_get(keys=uids, partition_id="train", select_fields=[PARTIAL_FIELD])[PARTIAL_FIELD]
    assert all(not getattr(row, "data", row) for row in left)  # handed over: the rows no longer carry them


def test_the_resuming_client_reaches_a_ray_worker_as_verls_client_without_its_record(transfer_queue):
    """verl hands the trainer's client to each agent-loop worker actor (pickled): there it is still verl's resuming
    client with the recipe's layer beneath it, and starts with an empty record of its own."""
    import ray

    from recipe_dapo.trainers.v1.partial_rollout import DAPOFullyAsyncLLMServerClient

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "response_length": RESPONSE_LENGTH}}})
    client = DAPOFullyAsyncLLMServerClient(config=config, load_balancer_handle=None)
    client.partials.live[("g", 0)] = object()  # (the driver's: never shipped)

    @ray.remote
    def in_a_worker(shipped):
        return [klass.__name__ for klass in type(shipped).__mro__], len(shipped.partials.live)

    mro, recorded = ray.get(in_a_worker.remote(client))
    assert mro[:4] == ["DAPOFullyAsyncLLMServerClient", "FullyAsyncLLMServerClient", "_RecordedAttempts",
                       "LLMServerClient"] and recorded == 0
