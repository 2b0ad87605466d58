"""verl internals the recipe depends on: what it replaces or copies, and the private hooks of verl's trainers that the
recipe's trainers override or call (the adapter seam of ``trainers.classic.trainer`` and ``trainers.v1.trainer``).

verl gives a recipe no public extension point for most of a training step: its trainers' steps are private methods,
which the recipe's subclasses override or call. They are listed here with :func:`declare`, with the parameters the
recipe relies on, so that ``tests/test_compat_on_cpu.py`` fails on the verl release that changes one of them.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

from recipe_dapo.compat import declare, touches

logger = logging.getLogger(__name__)

VERL = ("0.9.0", "0.9.1")
"""The verl releases every site below was checked on (CI runs the contract tests on both)."""
V1_ONLY = ("0.9.1",)
"""Sites of the v1 trainer that verl 0.9.0 lacks (the recipe's v1 trainer needs verl 0.9.1: ``preflight.versions``)."""

CLASSIC = "verl.trainer.ppo.ray_trainer.RayPPOTrainer"
V1 = "verl.trainer.ppo.v1.trainer_base.PPOTrainer"
AGENT_LOOP_WORKER_TQ = "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopWorkerTQ"
CLASSIC_ADAPTER = "recipe_dapo.trainers.classic.trainer.RayDAPOTrainer"
V1_ADAPTER = "recipe_dapo.trainers.v1.trainer.DAPOTrainerV1"


# ------------------------------------------------------------------------------------------------ registries


@touches("verl.experimental.agent_loop.agent_loop._agent_loop_registry", how="reads", checked=VERL,
         why="verl has no public lookup of its agent-loop registry; the start-up check confirms the seeded loop is in it")
def registered_agent_loops() -> dict:
    """verl's agent-loop registry: name -> config (``{"_target_": ...}``)."""
    from verl.experimental.agent_loop import agent_loop

    return agent_loop._agent_loop_registry


# ------------------------------------------------------------------------------------------------ CPU platform


@touches("verl.utils.attention_utils._fallback_unpad_input", how="reads", checked=VERL, optional=True,
         why="present from verl 0.9.1: verl then falls back to pure torch without flash-attn itself")
@touches("verl.utils.attention_utils._get_attention_functions", how="replaces", checked=VERL, params=(),
         why="verl 0.9.0 imports flash_attn (CUDA wheels only) for its padding helpers, with no fallback")
def padding_without_flash_attn(functions: tuple) -> bool:
    """Give verl's padding helpers ``functions`` (index_first_axis, pad_input, rearrange, unpad_input) where verl would
    import flash-attn without a fallback and flash-attn is absent; True when replaced."""
    import importlib.util

    import verl.utils.attention_utils as attention_utils

    if hasattr(attention_utils, "_fallback_unpad_input") or importlib.util.find_spec("flash_attn") is not None:
        return False
    attention_utils._get_attention_functions = lambda: functions
    return True


# ------------------------------------------------------------------------------------------------ tracking


@touches("verl.trainer.ppo.v1.trainer_base.pprint", how="replaces", checked=VERL, params=(),
         why="verl's v1 fit pretty-prints every validation metric (hundreds of lines); the recipe's console says it")
@touches("verl.trainer.ppo.v1.trainer_base.Tracking", how="replaces", checked=VERL,
         params=("project_name", "experiment_name", "default_backend", "config"),
         why="verl's v1 fit builds its Tracking from this module global (no hook); the recipe's appends on resume")
@contextlib.contextmanager
def v1_tracking(open_tracking: Callable[[], Any]) -> Iterator[None]:
    """While the block runs, verl's v1 ``fit`` opens ``open_tracking()`` as its tracker and logs its pretty-printed
    validation dumps at DEBUG; verl's are put back afterwards."""
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    verl_tracking, verl_pprint = trainer_base.Tracking, trainer_base.pprint
    trainer_base.Tracking = lambda **_: open_tracking()
    trainer_base.pprint = lambda text: logger.debug("%s", text)
    try:
        yield
    finally:
        trainer_base.Tracking, trainer_base.pprint = verl_tracking, verl_pprint


# ---------------------------------------------------------------------------------------------- calls into the replicas

MANAGER = "verl.checkpoint_engine.base.CheckpointEngineManager"
REPLICA_CALLS = {
    "update_weights": "the weight sync to the rollout",
    "abort_replicas": "aborting the rollout's requests",
    "sleep_replicas": "putting the rollout replicas to sleep",
    "wake_up_replicas": "waking the rollout replicas",
    "resume_generation_replicas": "resuming the rollout's generation",
    "release_kv_cache_replicas": "releasing the rollout's KV cache",
    "resume_kv_cache_replicas": "restoring the rollout's KV cache",
}
"""verl's checkpoint-engine manager's calls that wait on every rollout replica (name -> what it does, in words), each
of which a dead engine leaves waiting forever (seen: ``abort_replicas`` at a colocate_async step's end)."""


@touches(f"{MANAGER}.update_weights", how="wraps", checked=VERL, params=("global_steps",),
         why="verl's trainers call it directly; the recipe runs the rollout's liveness probe beside it (on one manager)")
@touches(f"{MANAGER}.abort_replicas", how="wraps", checked=VERL, params=(),
         why="as update_weights (verl 0.9.1 adds reject_request, which the recipe passes only where it exists)")
@touches(f"{MANAGER}.sleep_replicas", how="wraps", checked=VERL, params=(), why="as update_weights")
@touches(f"{MANAGER}.wake_up_replicas", how="wraps", checked=VERL, params=(), why="as update_weights")
@touches(f"{MANAGER}.resume_generation_replicas", how="wraps", checked=VERL, params=(), why="as update_weights")
@touches(f"{MANAGER}.release_kv_cache_replicas", how="wraps", checked=VERL, params=(), why="as update_weights")
@touches(f"{MANAGER}.resume_kv_cache_replicas", how="wraps", checked=VERL, params=(), why="as update_weights")
def wrap_replica_calls(checkpoint_manager: Any, wrap: Callable[[Callable, str], Callable]) -> Callable[[], None]:
    """Make each of the manager's calls of :data:`REPLICA_CALLS` that it has (this one object, not the class)
    ``wrap(verl's, what it does)``; returns the function that puts verl's back. A call already wrapped stays as it
    is."""
    restores = []
    for name, what in REPLICA_CALLS.items():
        current = getattr(checkpoint_manager, name, None)
        if current is None or getattr(current, "recipe_dapo_wrapped", None) is not None:
            continue
        wrapped = wrap(current, what)
        wrapped.recipe_dapo_wrapped = current
        restores.append(_set_on_object(checkpoint_manager, name, wrapped))

    def restore() -> None:
        for undo in reversed(restores):
            undo()

    return restore


def abort_replicas(checkpoint_manager: Any, reject_request: bool) -> None:
    """verl's ``abort_replicas``, refusing the requests that come after it where verl has that (``reject_request``:
    verl 0.9.1; on 0.9.0 the abort alone)."""
    import inspect

    abort = checkpoint_manager.abort_replicas
    target = getattr(abort, "recipe_dapo_wrapped", abort)
    try:
        takes = "reject_request" in inspect.signature(target).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as verl 0.9.0 would
        takes = False
    if takes:
        abort(reject_request=reject_request)
    else:
        abort()


def _set_on_object(target: Any, name: str, value: Callable) -> Callable[[], None]:
    """Set ``target.name`` on this one object; returns the function that puts back what was there (the object's own
    attribute, or none, so that its class's serves again), unless something else replaced ``value`` meanwhile."""
    own = vars(target).get(name, _ABSENT)
    setattr(target, name, value)

    def restore() -> None:
        if vars(target).get(name) is value:
            if own is _ABSENT:
                delattr(target, name)
            else:
                setattr(target, name, own)

    return restore


_ABSENT = object()


@touches("verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ.generate_sequences", how="wraps", checked=V1_ONLY,
         params=("prompts",),
         why="verl's re-issue of the prompts in flight at a checkpoint reads their rows, marks them pending at the "
             "current step and dispatches them in one call; the recipe writes each resumed group's submission step "
             "back between the marking and the dispatch (a worker's marker write, once dispatched, rewrites the whole "
             "tag)")
@contextlib.contextmanager
def before_dispatch(agent_loop_manager: Any, action: Callable[[], None]):
    """While the block runs, ``agent_loop_manager.generate_sequences`` (this one object) runs ``action()`` and then
    verl's dispatch."""
    dispatch = agent_loop_manager.generate_sequences

    def dispatched_after(prompts):
        action()
        return dispatch(prompts)

    restore = _set_on_object(agent_loop_manager, "generate_sequences", dispatched_after)
    try:
        yield
    finally:
        restore()


# ------------------------------------------------------------------------------------------------ the copied fit step

COPIED_FIT = f"{CLASSIC}.fit"
COPIED_FIT_SHA256 = {"0.9.1": "b5678ef1a7c07ab61e2b2cd37233a9c980c6dd71eeeee9d1a02a6f829d5ffd32"}
"""verl release -> sha256 of ``inspect.getsource(RayPPOTrainer.fit)`` (dedented) that the classic adapter's copy of its
step (``prepare_update``: old and reference log-probs, rollout correction, KL in the reward, advantages;
``update_actor``; ``log_step``'s metrics) was read against. verl's ``fit`` is one 400-line loop with no hook per phase,
so the recipe's step repeats those calls; when verl's ``fit`` changes, the contract test fails until the copy is
compared with the new one and the hash recorded here."""
declare(COPIED_FIT, how="copies", checked=tuple(COPIED_FIT_SHA256), where=CLASSIC_ADAPTER,
        why="the classic adapter's train_step repeats the phases of verl's fit it keeps (old/ref log-probs, rollout "
            "correction, advantages, the update, the step's metrics) around DAPO's sampler and overlong filter")


# ------------------------------------------------------------------------------------------------ v1 agent loop


@touches(f"{AGENT_LOOP_WORKER_TQ}.__init__", how="copies", checked=VERL,
         why="verl's __init__ uses zero-argument super(), which fails in a Ray worker for a subclass of its actor class")
def init_agent_loop_worker_tq(worker: Any, *args, **kwargs) -> None:
    """What verl's ``AgentLoopWorkerTQ.__init__`` does (its parent's ``__init__``, TransferQueue's client, the set of
    background tasks), for a recipe subclass; the contract test compares this with verl's source."""
    import transfer_queue as tq
    from verl.experimental.agent_loop import AgentLoopWorker

    AgentLoopWorker.__init__(worker, *args, **kwargs)
    tq.init()
    worker.background_tasks = set()


declare(f"{AGENT_LOOP_WORKER_TQ}._run_agent_loop", how="overrides", checked=VERL,
        params=("sampling_params", "trajectory"), where="recipe_dapo.trainers.v1.agent_loop._DAPOAgentLoopWorkerTQ",
        why="the one place a session's exception is seen in the agent-loop worker; the recipe records its summary; "
            "around each training session it also scopes the record of its attempts (partial_rollout)")
declare(f"{AGENT_LOOP_WORKER_TQ}._run_prompt", how="overrides", checked=V1_ONLY,
        params=("prompt", "sampling_params", "trajectory", "trace"),
        where="recipe_dapo.trainers.v1.agent_loop._DAPOAgentLoopWorkerTQ",
        why="a group's sessions have all settled: the record of their attempts is freed")
declare("verl.workers.rollout.llm_server.LLMServerClient.generate", how="overrides", checked=V1_ONLY,
        params=("request_id", "prompt_ids", "sampling_params"),
        where="recipe_dapo.trainers.v1.partial_rollout._RecordedAttempts",
        why="FullyAsyncLLMServerClient.generate calls it once per attempt (prompt + tokens so far; an aborted one is "
            "sent again after the update): the recipe records each attempt and answers a resumed session's first "
            "ones with its saved tokens, so that a checkpoint keeps and resumes the responses still generating")
declare(f"{V1}._reissue_inflight_prompts", how="overrides", checked=V1_ONLY, params=("partition_id",),
        where="recipe_dapo.trainers.v1.trainer.DAPOTrainerV1ColocateAsync",
        why="the restored prompt rows carry their groups' saved responses to the workers verl sends them to; a resumed "
            "group keeps the step it was submitted in")


# ------------------------------------------------------------------------------------------------ trainer hooks

_CLASSIC_HOOKS = {
    "_create_dataloader": ("overrides", ("train_dataset", "val_dataset", "collate_fn", "train_sampler"),
                           "the recipe sizes the LR schedule in optimizer steps and groups validation copies"),
    "_save_checkpoint": ("overrides", (), "the recipe's sampler state is written first, inside a guarded save"),
    "_load_checkpoint": ("overrides", (), "the recipe's sampler state and dataloader position are restored"),
    "_val_metrics_update": ("overrides", ("data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns"),
                            "mean@k, pass@k, maj@k per source, over equal samples per problem"),
    "_validate": ("calls", (), "validation generation and scoring"),
    "_get_gen_batch": ("calls", ("batch",), "the generation columns of a prompt batch"),
    "_compute_reward_colocate": ("calls", ("batch",), "a colocated reward model's scores"),
    "_balance_batch": ("calls", ("batch", "metrics"), "tokens balanced across data-parallel ranks"),
    "_compute_old_log_prob": ("calls", ("batch",), "the actor's log-probs of the rollouts"),
    "_compute_ref_log_prob": ("calls", ("batch",), "the reference policy's log-probs"),
    "_update_actor": ("calls", ("batch",), "the policy update"),
    "_log_rollout_data": ("calls", ("batch", "reward_extra_infos_dict", "timing_raw", "rollout_data_dir"),
                          "trainer.rollout_data_dir dumps"),
    "_init_dump_executor": ("calls", (), "verl's generation-dump executor, reopened when fit starts"),
    "_shutdown_dump_executor": ("calls", (), "verl's generation-dump executor, drained when fit ends"),
}
_V1_HOOKS = {
    "_update_actor": ("overrides", ("batch", "metrics"),
                      "overlong filtering masks truncated responses around verl's update; the update guard counts it"),
    "_compute_advantage": ("overrides", ("batch", "metrics"),
                           "after verl's advantages and rollout-correction weights, the step's policy_lag/* metrics"),
    "_validate": ("overrides", (), "skipped once the run is pre-empted"),
    "_compute_metrics": ("overrides", ("batch", "metrics", "timing_raw", "global_steps", "epoch"),
                         "the response tokens that carried loss"),
    "_val_metrics_update": ("overrides", ("data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns",
                                          "expected_acc_counts"), "mean@k, pass@k, maj@k per source"),
    "_save_checkpoint": ("overrides", (), "the replay buffer's state is written first, inside a guarded save"),
    "_load_checkpoint": ("overrides", (), "the replay buffer's state is restored"),
    "_restored_tq_prompt_count": ("reads", None, "how many prompts verl restored in flight from TransferQueue"),
}
for _name, (_how, _params, _why) in _CLASSIC_HOOKS.items():
    declare(f"{CLASSIC}.{_name}", how=_how, checked=VERL, params=_params, why=_why, where=CLASSIC_ADAPTER)
_V1_ONLY_HOOKS = ("_val_metrics_update", "_restored_tq_prompt_count")  # 0.9.0: no expected_acc_counts, no count
for _name, (_how, _params, _why) in _V1_HOOKS.items():
    declare(f"{V1}.{_name}", how=_how, checked=V1_ONLY if _name in _V1_ONLY_HOOKS else VERL, params=_params, why=_why,
            where=V1_ADAPTER)

HOOKS = {CLASSIC: tuple(_CLASSIC_HOOKS), V1: (*_V1_HOOKS, "_reissue_inflight_prompts"),
         AGENT_LOOP_WORKER_TQ: ("_run_agent_loop", "_run_prompt", "__init__")}
"""verl class -> its private names the recipe's subclasses use (the layout test checks the trainers use no other)."""
