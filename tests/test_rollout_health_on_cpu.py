"""``run.rollout_health``: which rollout errors end a v1 run, the line that says so, and when the stream
probes the rollout's liveness (pure: no Ray cluster, no TransferQueue)."""

from __future__ import annotations

import pytest

from recipe_dapo.run.rollout_health import (
    RolloutDied,
    StallWatch,
    error_tag,
    fatal_failure_message,
    is_fatal,
    summarize_error,
)


def test_dead_actors_and_engines_are_fatal_and_one_bad_sample_is_not():
    from ray.exceptions import ActorDiedError, RayTaskError

    assert is_fatal(ActorDiedError())
    assert not is_fatal(ValueError("Prompt length (5000) leaves no room to generate"))

    class EngineDeadError(Exception):  # vLLM's name; Ray wraps the remote error into RayTaskError(<cause>)
        pass

    wrapped = RayTaskError("generate", "Traceback ...", EngineDeadError("EngineCore encountered an issue."),
                           proctitle="ray::vLLMHttpServer.generate()", pid=7, ip="10.0.0.1").as_instanceof_cause()
    assert is_fatal(wrapped)
    tag = error_tag(wrapped)
    assert tag["fatal_error"] is True and "EngineDeadError" in tag["error"]
    try:
        try:
            raise ActorDiedError()
        except ActorDiedError as cause:
            raise RuntimeError("generate failed") from cause
    except RuntimeError as chained:
        assert is_fatal(chained)  # a wrapper that chains a dead actor


def test_the_summary_is_one_line_with_the_error_and_where_ray_ran_it():
    text = ("\x1b[36mray::vLLMHttpServer.generate()\x1b[39m (pid=7, ip=10.0.0.1, actor_id=ab, repr=<vLLMHttpServer "
            "object at 0x1>)\n  File \"x.py\", line 1, in generate\nvllm.EngineDeadError: EngineCore died")
    summary = summarize_error(RuntimeError(text))
    assert summary == ("RuntimeError: vllm.EngineDeadError: EngineCore died "
                       "(raised in ray::vLLMHttpServer.generate() (pid=7, ip=10.0.0.1, actor_id=ab))")
    assert "\n" not in summarize_error(ValueError("a\n" * 1000)) and len(summarize_error(ValueError("x" * 5000))) == 600
    message = fatal_failure_message(3, [summary, summary], failed_groups=2, in_flight=14)
    assert message.startswith("rollout died at step 3: 2 prompt group(s) failed with RuntimeError: "
                              "vllm.EngineDeadError: EngineCore died")
    assert "(and 1 more like it)" in message and "14 still in flight" in message and "rerun the same command" in message
    named = fatal_failure_message(3, [summary], 1, 0, dead="the vLLM engine of rollout replica 0 (h:1) is dead: x")
    assert named.startswith("rollout died at step 3: the vLLM engine of rollout replica 0 (h:1) is dead: x; 1 prompt")


def test_the_probe_runs_only_after_a_stall_and_at_most_once_per_period():
    now = [0.0]
    calls = []
    watch = StallWatch(lambda: calls.append(now[0]), after_s=30, clock=lambda: now[0])
    for t in (10, 29.9):
        now[0] = t
        watch.check(in_flight=4)
    assert calls == []
    now[0] = 30
    watch.check(in_flight=0)  # nothing in flight: nothing to wait for
    assert calls == []
    watch.check(in_flight=4)
    now[0] = 45
    watch.check(in_flight=4)
    now[0] = 60
    watch.check(in_flight=4)
    assert calls == [30, 60]
    watch.progress()  # a group came back
    now[0] = 89
    watch.check(in_flight=4)
    assert calls == [30, 60] and watch.probes == 2

    def dead():
        raise RolloutDied("agent-loop worker 0 is dead")

    StallWatch(dead, after_s=0, clock=lambda: now[0]).check(in_flight=4)  # 0: no probe
    assert StallWatch(dead, after_s=0).diagnose() == "agent-loop worker 0 is dead"  # on demand, whatever after_s
    assert StallWatch(lambda: None, after_s=30).diagnose() is None and StallWatch(None, 30).diagnose() is None
    stalled = StallWatch(dead, after_s=30, clock=lambda: now[0])
    now[0] += 30
    with pytest.raises(RolloutDied, match="agent-loop worker 0 is dead"):
        stalled.check(in_flight=4)


# ------------------------------------------------------------------ a weight sync into a dead engine (both trainers)


class SyncIntoTheEngine:
    """verl's checkpoint manager as the trainers see it: ``update_weights(step)`` returns once every replica loaded the
    weights, and never when an engine died mid-sync (its server waits on the engine forever)."""

    def __init__(self, engine_health, takes_s: float = 0.0):
        self.engine_health, self.takes_s, self.calls = engine_health, takes_s, 0

    def update_weights(self, global_steps=None):
        import threading
        import time

        self.calls += 1
        if self.engine_health.status != 200:
            threading.Event().wait()  # the engine is gone: nothing ever answers
        time.sleep(self.takes_s)
        return {"timing_s/update_weights": self.takes_s, "step": global_steps}


def test_a_weight_sync_into_a_dead_engine_ends_with_the_engine_named_within_the_probe_interval(engine_health):
    import time

    from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

    manager = SyncIntoTheEngine(engine_health, takes_s=0.3)
    watch_replica_calls(manager, RolloutLiveness([], [], [engine_health.address], timeout_s=2), every_s=0.1)
    assert manager.update_weights(4) == {"timing_s/update_weights": 0.3, "step": 4}  # alive: verl's result, probes pass

    engine_health.status = 503
    began = time.monotonic()
    with pytest.raises(RolloutDied, match=r"engine of rollout replica 0 .* is dead: .*HTTP 503.* \(during the weight "
                                          r"sync to the rollout, which cannot finish\)"):
        manager.update_weights(5)
    assert time.monotonic() - began < 2.0
    assert manager.calls == 2


def test_a_watched_weight_sync_raises_verls_own_error_and_is_wrapped_once(engine_health):
    from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

    class Failing:
        def update_weights(self, global_steps=None):
            raise ValueError(f"weights of step {global_steps} do not fit")

    manager = Failing()
    probe = RolloutLiveness([], [], [engine_health.address], timeout_s=2)
    watch_replica_calls(manager, probe, every_s=0.1)
    wrapped = manager.update_weights
    watch_replica_calls(manager, probe, every_s=0.1)
    assert manager.update_weights is wrapped
    with pytest.raises(ValueError, match="weights of step 3 do not fit"):
        manager.update_weights(3)
    untouched = Failing()
    watch_replica_calls(untouched, RolloutLiveness([], [], []), every_s=0.1)  # nothing to probe: verl's call as it is
    no_probe = Failing()
    watch_replica_calls(no_probe, probe, every_s=0)  # dapo.health.rollout_probe_s=0: no probe
    assert "update_weights" not in vars(untouched) and "update_weights" not in vars(no_probe)


class ReplicaOnTheEngine:
    """A rollout replica as verl's checkpoint-engine manager drives it (``RolloutReplica``'s coroutines): each call
    returns while its vLLM engine answers, and never once the engine died (the server waits on the engine forever;
    seen at a colocate_async step's end, where verl aborts and sleeps the replicas)."""

    def __init__(self, engine_health):
        self.engine_health, self.calls = engine_health, []

    async def _on_the_engine(self, name: str) -> None:
        import asyncio

        self.calls.append(name)
        if self.engine_health.status != 200:
            await asyncio.Event().wait()

    async def sleep(self):
        await self._on_the_engine("sleep")

    async def wake_up(self):
        await self._on_the_engine("wake_up")

    async def abort_all_requests(self, reject_request=False):
        await self._on_the_engine(f"abort_all_requests(reject_request={reject_request})")

    async def resume_generation(self):
        await self._on_the_engine("resume_generation")

    async def release_kv_cache(self):
        await self._on_the_engine("release_kv_cache")

    async def resume_kv_cache(self):
        await self._on_the_engine("resume_kv_cache")


def verls_manager(replicas):
    """verl's own ``CheckpointEngineManager`` over ``replicas`` (the colocated trainers' "naive" backend)."""
    from types import SimpleNamespace

    from verl.checkpoint_engine.base import CheckpointEngineManager

    return CheckpointEngineManager(SimpleNamespace(backend="naive", custom_backend_module=None), None, replicas)


@pytest.mark.parametrize("call", ["abort_replicas", "sleep_replicas", "wake_up_replicas", "resume_generation_replicas",
                                  "release_kv_cache_replicas", "resume_kv_cache_replicas"])
def test_every_call_into_the_replicas_on_a_dead_engine_ends_naming_the_engine_and_the_call(engine_health, call):
    """Not only the weight sync: each of verl's calls that waits on every replica gets the probe. Positive control:
    the same call on an unwatched manager is still waiting after the time the watched one took to end."""
    import threading
    import time

    from recipe_dapo.compat.verl import REPLICA_CALLS
    from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

    replica = ReplicaOnTheEngine(engine_health)
    manager = verls_manager([replica])
    watch_replica_calls(manager, RolloutLiveness([], [], [engine_health.address], timeout_s=2), every_s=0.1)
    assert getattr(manager, call)() is None and len(replica.calls) == 1  # alive: verl's call returns
    engine_health.status = 503
    began = time.monotonic()
    with pytest.raises(RolloutDied, match=rf"engine of rollout replica 0 .* is dead: .*HTTP 503.* \(during "
                                          rf"{REPLICA_CALLS[call]}, which cannot finish\)"):
        getattr(manager, call)()
    took = time.monotonic() - began
    assert took < 2.0

    unwatched = threading.Thread(target=getattr(verls_manager([ReplicaOnTheEngine(engine_health)]), call),
                                 daemon=True)
    unwatched.start()
    unwatched.join(took + 0.5)
    assert unwatched.is_alive()


def test_a_watched_call_awaited_inside_verl_is_verls_coroutine_and_the_abort_refuses_later_requests_where_it_can(
        engine_health):
    """verl awaits its own calls inside others (``update_weights`` awaits ``self.abort_replicas()`` on a non-colocated
    backend): there the watched method hands back verl's coroutine. ``compat.verl.abort_replicas`` passes
    ``reject_request`` to verl 0.9.1's abort and leaves it out on verl 0.9.0's, which has no such parameter."""
    import asyncio

    from recipe_dapo.compat.verl import abort_replicas
    from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

    replica = ReplicaOnTheEngine(engine_health)
    manager = verls_manager([replica])
    watch_replica_calls(manager, RolloutLiveness([], [], [engine_health.address], timeout_s=2), every_s=0.1)

    async def inside_verl():
        await manager.abort_replicas()
        await manager.sleep_replicas()

    asyncio.run(inside_verl())
    abort_replicas(manager, reject_request=True)
    assert replica.calls == ["abort_all_requests(reject_request=False)", "sleep",
                             "abort_all_requests(reject_request=True)"]

    class Verl090Manager:  # verl 0.9.0's abort: no reject_request
        def __init__(self):
            self.aborted = 0

        def abort_replicas(self):
            self.aborted += 1

    older = Verl090Manager()
    abort_replicas(older, reject_request=True)
    assert older.aborted == 1


# ------------------------------------------------------------------ an engine that gives no answer (refused, time-out)


def test_an_engine_whose_port_is_closed_counts_dead_after_the_bound_and_is_named(engine_health):
    """The weight sync waits on an engine whose HTTP server is gone: every health check is refused. The first two are
    logged; the third in a row (``dapo.health.max_unanswered_health_checks=3``) ends the sync naming the address."""
    import time

    from recipe_dapo.run.rollout_liveness import RolloutLiveness, watch_replica_calls

    manager = SyncIntoTheEngine(engine_health)
    probe = RolloutLiveness([], [], [engine_health.address], timeout_s=2, max_unanswered=3)
    watch_replica_calls(manager, probe, every_s=0.1)
    manager.update_weights(1)  # alive
    engine_health.stop()
    began = time.monotonic()
    address = engine_health.address.replace(".", r"\.")
    with pytest.raises(RolloutDied, match=rf"engine of rollout replica 0 \({address}\) is dead: 3 health checks in a "
                                          rf"row got no answer \(http://{address}/health: connection refused, "
                                          r"connection refused, connection refused; dapo\.health\."
                                          r"max_unanswered_health_checks=3\) \(during the weight sync"):
        manager.update_weights(2)
    assert 0.3 <= time.monotonic() - began < 2.0  # three probes 0.1 s apart, not the first


def test_an_engine_that_never_answers_counts_dead_after_the_bound_and_one_answer_starts_the_count_again(
        engine_health):
    from recipe_dapo.run.rollout_liveness import RolloutLiveness

    probe = RolloutLiveness([], [], [engine_health.address], timeout_s=0.2, max_unanswered=3)
    engine_health.answering = False  # connections accepted, nothing ever answered
    probe()
    probe()
    engine_health.answering = True  # one answer: the engine is alive after all
    probe()
    engine_health.answering = False
    probe()
    probe()  # two in a row since the answer: not yet
    with pytest.raises(RolloutDied, match=r"is dead: 3 health checks in a row got no answer \(http://.*/health: "
                                          r"no answer within 0\.2 s, no answer within 0\.2 s, no answer within 0\.2 s"):
        probe()


def test_a_healthy_engine_is_never_counted_dead_and_zero_turns_the_count_off(engine_health):
    from recipe_dapo.run.rollout_liveness import RolloutLiveness

    healthy = RolloutLiveness([], [], [engine_health.address], timeout_s=2, max_unanswered=1)
    for _ in range(20):
        healthy()
    assert healthy.unanswered == {}
    never = RolloutLiveness([], [], [engine_health.address], timeout_s=2, max_unanswered=0)
    engine_health.stop()
    for _ in range(5):
        never()  # refused five times: logged only
    assert never.unanswered[engine_health.address] == ["connection refused"] * 5
