"""Responses still generating at a checkpoint (verl v1 ``colocate_async``): saved with the recipe's state and resumed
from their prefix.

The rollout server is the only fake (:class:`PrefixEngine`, standing in for vLLM): a deterministic model whose next
token is a function of the whole context, that ends a request early as vLLM's abort does, parks what arrives while it
is paused, and refuses to generate again for a prompt whose response it already started (a resumed request must be
sent its prefix). Everything else is real: verl's ``FullyAsyncLLMServerClient`` resume loop (the recipe's client
derives from it), ``TokenOutput``, the recipe's state file, and (in the last test) TransferQueue on a local Ray with
verl's own ``_reissue_inflight_prompts`` and ``AgentLoopWorkerTQ.generate_sequences``.
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
RESPONSE_LENGTH = 12


def next_token(context: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 7 + len(context)) % 97 + 3


def log_prob(context: list[int]) -> float:
    return -math.pi / (len(context) + 1.0) * 1.000000119  # not exactly representable in float32


class PrefixEngine:
    """A fake rollout server with vLLM's protocol as verl's client sees it (``generate`` returns a ``TokenOutput``
    with ``extra_fields["global_steps"]``; an aborted request comes back with ``stop_reason="aborted"`` and the tokens
    so far). ``abort_after``: tokens generated before the next request is aborted; ``paused``: requests park."""

    def __init__(self, version: int):
        self.version = version
        self.abort_after: int | None = None
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
        limit = budget if self.abort_after is None else min(budget, self.abort_after)
        for _ in range(limit):
            log_probs.append(log_prob(context))
            tokens.append(next_token(context))
            context.append(tokens[-1])
        aborted = self.abort_after is not None and limit < budget
        self.abort_after = None
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


async def start_and_abort(client, engine, uid="g", session=0, aborted_after=5):
    """A session generating when the step ends: aborted after ``aborted_after`` tokens, its retry parked."""
    from recipe_dapo.trainers.v1.partial_rollout import session_scope

    engine.abort_after = aborted_after

    async def run():
        with session_scope(client.partials, uid, session, None):
            return await client.generate("req", prompt_ids=list(PROMPT), sampling_params={"logprobs": True})

    task = asyncio.create_task(run())
    while not engine.requests:
        await asyncio.sleep(0.01)
    engine.paused.clear()  # the replicas sleep for the update: the retry parks
    await asyncio.sleep(0.05)
    return task


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
    assert "1 partial responses (3 tokens) resumed" in plan.summary() and "2 (6 tokens) dropped" in plan.summary()
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
