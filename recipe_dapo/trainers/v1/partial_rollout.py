"""Partial responses across a checkpoint, on verl's own resume path (``colocate_async``).

verl's ``FullyAsyncLLMServerClient.generate`` resumes an aborted request by sending ``prompt + tokens so far`` again,
merging what each attempt returns; the partial response is a local variable of that coroutine (the module docstring of
``dynamic_sampling.partial_responses`` says where it lives and what verl's TransferQueue snapshot keeps). This module
adds, in the agent-loop worker's process:

- :class:`DAPOFullyAsyncLLMServerClient`: verl's client with :class:`_RecordedAttempts` between it and the base
  client, so that every attempt verl's resume loop makes passes through it. Inside a rollout session
  (:func:`session_scope`, set by the recipe's agent-loop worker around each session) it records the attempt in the
  worker's :class:`PartialBook`; and when the session was resumed from a checkpoint, it answers verl's first attempts
  with the saved ones (the tokens, log-probs and weight version of each, ``stop_reason="aborted"``) without asking a
  server, so verl's loop continues with ``prompt + saved prefix`` and tags the response with the saved first version.
  An attempt whose prompt is not the session's prompt plus the tokens so far (another turn of a multi-turn loop, a
  changed prompt) is not replayed: the saved response is left unused and logged.
- :class:`PartialBook`: per session (``uid``, session index) the response so far (``PartialResponse``) and the saved
  one to replay; a checkpoint reads it through the worker (``DAPOAgentLoopWorkerTQ.partial_responses``).
- :data:`PARTIAL_FIELD`: the field of a prompt's TransferQueue row through which a resumed run hands its saved
  responses to the worker that verl's re-issue sends the prompt to (verl passes a prompt row's fields to every session
  of the group as keyword arguments).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Dict, Optional, Tuple

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from recipe_dapo.dynamic_sampling.partial_responses import PartialResponse, PrefixMismatch

logger = logging.getLogger(__name__)

PARTIAL_FIELD = "dapo_partial_responses"
"""A prompt row's field in TransferQueue: its group's saved responses (session -> ``PartialResponse.to_state()``)."""

SessionKey = Tuple[str, int]

_SESSION: contextvars.ContextVar[Optional[SessionKey]] = contextvars.ContextVar("recipe_dapo_rollout_session",
                                                                                 default=None)


class PartialBook:
    """One worker's sessions: the response so far of each, and the saved responses still to replay."""

    def __init__(self):
        self.live: Dict[SessionKey, PartialResponse] = {}
        self._replay: Dict[SessionKey, Tuple[PartialResponse, int]] = {}  # saved response, segments replayed
        self.replayed_sessions = 0
        self.unused_sessions = 0
        self._routing_warned = False

    def seed(self, key: SessionKey, saved: PartialResponse) -> None:
        """A resumed session: its saved response is replayed before any server is asked."""
        self._replay[key] = (saved, 0)

    def replay(self, key: SessionKey, prompt_ids: list) -> Optional[TokenOutput]:
        """The saved attempt that answers this one, or None (nothing saved, all replayed, or another prompt)."""
        if key not in self._replay:
            return None
        saved, done = self._replay[key]
        sent_so_far = list(saved.prompt_ids) + [t for segment in saved.segments[:done] for t in segment.token_ids]
        if list(prompt_ids) != sent_so_far:
            self._replay.pop(key)
            self.unused_sessions += 1
            logger.warning("session %s: the saved response was generated for another prompt (%d tokens, not %d); "
                           "it is regenerated", key, len(saved.prompt_ids), len(prompt_ids))
            return None
        segment = saved.segments[done]
        last = done + 1 == len(saved.segments)
        if last:
            self._replay.pop(key)
            self.replayed_sessions += 1
        else:
            self._replay[key] = (saved, done + 1)
        stop_reason = saved.stop_reason if last and saved.finished else "aborted"
        return TokenOutput(token_ids=list(segment.token_ids), log_probs=None if segment.log_probs is None
                           else list(segment.log_probs), stop_reason=stop_reason,
                           num_preempted=segment.num_preempted, extra_fields={"global_steps": segment.version})

    def record(self, key: SessionKey, prompt_ids: list, output: TokenOutput) -> None:
        """An attempt came back (from a server or replayed): a new response when its prompt does not continue the
        session's (a new turn), else appended."""
        response = self.live.get(key)
        if response is None or response.finished or list(prompt_ids) != response.expected_prompt():
            response = self.live[key] = PartialResponse(list(prompt_ids))
        if output.routed_experts is not None:
            # The prefix's expert routing is not saved: such a response cannot be resumed faithfully.
            self.live.pop(key, None)
            if not self._routing_warned:
                self._routing_warned = True
                logger.warning("responses with MoE routing replay are not kept across a checkpoint (their prefix's "
                               "expert routing is not saved): a resume regenerates them from their prompts")
            return
        try:
            response.record(prompt_ids, output.token_ids, output.log_probs, output.extra_fields.get("global_steps"),
                            output.stop_reason, output.num_preempted)
        except (PrefixMismatch, ValueError) as error:
            self.live.pop(key, None)
            logger.warning("session %s: its response is not recorded (%s)", key, error)

    def discard_group(self, uid: str) -> None:
        for key in [key for key in self.live if key[0] == uid]:
            self.live.pop(key)
        for key in [key for key in self._replay if key[0] == uid]:
            self._replay.pop(key)
            self.unused_sessions += 1

    def groups(self) -> Dict[str, Dict[int, PartialResponse]]:
        """Per group, each session's response so far; a resumed session whose replay has not ended (verl's loop waits a
        second after each aborted attempt) counts with its whole saved response, which its replay will reach."""
        out: Dict[str, Dict[int, PartialResponse]] = {}
        for (uid, session), response in self.live.items():
            out.setdefault(uid, {})[session] = response
        for (uid, session), (saved, _) in self._replay.items():
            recorded = out.get(uid, {}).get(session)
            if recorded is None or recorded.num_tokens < saved.num_tokens:
                out.setdefault(uid, {})[session] = saved
        return out


@contextlib.contextmanager
def session_scope(book: Optional[PartialBook], uid: str, session_id: int, saved: Optional[dict]):
    """Around one rollout session of a training prompt: attempts are recorded under (uid, session), and the session's
    saved response (``saved``: session -> state, the group's :data:`PARTIAL_FIELD`) is replayed first."""
    if book is None:
        yield
        return
    key = (str(uid), int(session_id))
    state = (saved or {}).get(int(session_id))
    if state is not None:
        book.seed(key, PartialResponse.from_state(state))
    token = _SESSION.set(key)
    try:
        yield
    finally:
        _SESSION.reset(token)


class _RecordedAttempts(LLMServerClient):
    """Each attempt verl's resume loop makes (see the module docstring)."""

    @property
    def partials(self) -> PartialBook:
        # Made in the worker's process (the client is pickled into each agent-loop worker without it).
        book = self.__dict__.get("_partial_book")
        if book is None:
            book = self.__dict__["_partial_book"] = PartialBook()
        return book

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_partial_book", None)
        return state

    async def generate(self, request_id, *, prompt_ids: list, sampling_params: dict, **kwargs: Any) -> TokenOutput:
        key = _SESSION.get()
        if key is None:
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        book = self.partials
        output = book.replay(key, prompt_ids)
        if output is None:
            output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                            **kwargs)
        book.record(key, prompt_ids, output)
        return output


class DAPOFullyAsyncLLMServerClient(FullyAsyncLLMServerClient, _RecordedAttempts):
    """verl's resuming client; its attempts go through :class:`_RecordedAttempts` (MRO: this class, verl's
    ``FullyAsyncLLMServerClient``, ``_RecordedAttempts``, verl's ``LLMServerClient``)."""
