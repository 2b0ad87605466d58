"""The ``recipe_dapo`` reward manager: decode, verify, add the soft overlong penalty (verl reward-loop registry).

verl 0.9.1 builds one manager in each reward-loop worker (a Ray actor; ``reward.num_workers`` of them) and
calls ``await manager.run_single(one_sample)`` per response -- streamed from the agent loop as each rollout
finishes, or per chunk in ``RewardLoopManager.compute_rm_score``. So scoring scales with
``reward.num_workers`` processes; threads inside one worker share a GIL and only overlap waiting.

Per sample::

    reward = score + overlong_reward
    score = +1 if the answer is right else -1          (our verifier, or the user's custom_reward_function)
    overlong_reward = soft_overlong_penalty(|y|, max_resp_len, overlong_buffer_cfg.len) * penalty_factor
                      (0 when overlong_buffer_cfg.enable is false)

``reward_extra_info`` has the same keys for every sample (verl takes the schema from the first one):
``score``, ``acc``, ``pred``, ``overlong_reward``, ``overlong`` (used the whole rollout budget without an
EOS token), ``response_length`` (tokens), ``verify_error`` (``""`` unless verification failed, timed out or
the ground truth is malformed; such a sample scores -1 and the run goes on) and ``symbolic_skipped`` (only
the symbolic step could have matched the answer, and it is off).

A user's ``compute_score`` (``reward.custom_reward_function.path``) runs on threads of its own
(:class:`recipe_dapo.reward.bounded_calls.BoundedCaller`), at most ``reward_kwargs.custom_score_timeout_s`` per
sample; decoding and our verifier run on this module's own executor, so a hanging user function can never
take the threads they need.

What a failure trains as: a time-out, an exception, or a score that is not finite once stored as float32 (NaN,
+/-inf, or beyond +/-3.4e38 such as 1e39) costs that sample: it scores -1, exactly a wrong answer's score (plus the
overlong penalty of its length), ``acc`` is False and ``verify_error`` says why. So within a group a failed sample
pushes the others' advantages up like a wrong answer would. Two limits stop the run instead, each with one line that
names the function and the share that failed (:class:`~recipe_dapo.reward.bounded_calls.RewardFunctionBroken`, which
this manager never turns into a score): more than ``dapo.health.max_reward_failure_ratio`` of the last
``dapo.health.reward_failure_window`` samples of this worker failed (:mod:`recipe_dapo.reward.health`), or
``dapo.health.max_abandoned_reward_calls`` timed-out calls of the user's function are still running on abandoned
threads. A watchdog thread warns once when no sample finishes for
``reward_kwargs.stall_warning_s`` while some are in flight, naming them.

With our verifier the end of the response is decoded first (its last ``TAIL_CHARS`` characters), and the
whole response only when that end holds no answer: decoding 20k tokens takes about 3 ms, the last thousand
about 0.2 ms, verifying about 0.03 ms.

Failures are logged at a bounded rate (:mod:`recipe_dapo.reward.failures`): the first few with detail and
traceback, then counts.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from recipe_dapo.overlong import TRUNCATED_COLUMN, get_shaping, is_truncated
from recipe_dapo.reward import symbolic
from recipe_dapo.reward.bounded_calls import (
    DEFAULT_MAX_RUNNING,
    BoundedCaller,
    CallTimeout,
    ProgressWatch,
    RewardFunctionBroken,
)
from recipe_dapo.reward.failures import FailureLog
from recipe_dapo.reward.health import FailureWindow
from recipe_dapo.reward.metrics import REWARD_EXTRA_KEYS  # noqa: F401  (the per-sample keys, in one home)
from recipe_dapo.reward.settings import RewardSettings, config_value
from recipe_dapo.reward.verifier import MAX_REPORTED_CHARS, TAIL_CHARS, Verdict, verify

logger = logging.getLogger(__name__)

_reward_failures = FailureLog(logger, "reward computation failed; scored -1")
_custom_timeouts = FailureLog(logger, "custom compute_score timed out; scored -1")
_non_finite_scores = FailureLog(logger, "reward function returned a non-finite score; scored -1")

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: verl's reward tensors are float32, so a larger score becomes inf there."""

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def reward_executor() -> ThreadPoolExecutor:
    """The threads that decode and run our verifier in this process; no user function ever runs on them."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=DEFAULT_MAX_RUNNING, thread_name_prefix="recipe_dapo-reward")
        return _executor


@register("recipe_dapo")
class RecipeDAPORewardManager(RewardManagerBase):
    """DAPO rewards: +1/-1 answer correctness plus the soft overlong penalty (paper eq. 13)."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.settings = RewardSettings.from_config(config)
        self.length_shaping = get_shaping(self.settings.overlong_shape)
        if self.settings.symbolic_check and not symbolic.math_verify_installed():
            raise ValueError(
                "reward.reward_kwargs.symbolic_check=true needs math-verify: pip install 'recipe_dapo[math]', "
                "or set it to null (use it when installed) or false"
            )
        # verl hands us its default_compute_score unless the user configured their own function.
        has_custom_function = bool(config_value(config, "reward.custom_reward_function.path"))
        self.custom_compute_score = compute_score if has_custom_function else None
        function = reward_function_label(config) if has_custom_function else "the recipe's verifier"
        self.custom_caller = BoundedCaller(
            self.settings.custom_score_timeout_s, name="custom compute_score",
            max_abandoned=self.settings.max_abandoned_calls, label=function,
        )
        self.failures = FailureWindow(self.settings.max_failure_ratio, self.settings.failure_window, function)
        self.progress = ProgressWatch(self.settings.stall_warning_s, logger, lambda: self.custom_caller.abandoned)
        self.stop_token_ids = stop_token_ids(tokenizer, config_value(config, "actor_rollout_ref.model.path"))
        if self.custom_compute_score is None:
            if self._symbolic_enabled():
                symbolic.default_checker().start()  # import sympy in the background, not in the first step
            else:
                warn_symbolic_off(self.settings.symbolic_check)

    def _symbolic_enabled(self) -> bool:
        if self.settings.symbolic_check is None:
            return symbolic.math_verify_installed()
        return self.settings.symbolic_check

    async def run_single(self, data: DataProto) -> dict:
        item = data[-1:][0]  # multi-turn outputs: the last sequence carries the reward, as in verl's managers
        response_ids = item.batch["responses"]
        width = response_ids.shape[-1]
        length = int(item.batch["attention_mask"][-width:].sum())
        valid_ids = response_ids[:length]  # a view: only the decoded tail becomes a Python list
        ground_truth = _ground_truth(item.non_tensor_batch)

        last_token = int(valid_ids[-1]) if length else None
        truncated = is_truncated(length, last_token, self.settings.rollout_budget, self.stop_token_ids)
        overlong_reward = 0.0
        if self.settings.overlong_enable:
            overlong_reward = self.length_shaping(
                length,
                self.settings.max_resp_len,
                self.settings.overlong_buffer_len,
                self.settings.overlong_penalty_factor,
            )
        kind = "verify" if self.custom_compute_score is None else "custom compute_score"
        token = self.progress.begin(kind, f"data_source={item.non_tensor_batch.get('data_source')!r}")
        try:
            if self.custom_compute_score is None:
                verdict = await asyncio.get_running_loop().run_in_executor(
                    reward_executor(), self._verify_tokens, valid_ids, ground_truth
                )
                score = verdict.score
            else:
                score, verdict = await self._custom_score(item.non_tensor_batch, valid_ids, ground_truth)
        except RewardFunctionBroken:
            raise  # the run stops with its one line
        except Exception as error:  # decoding or a user's function failed: one sample lost, never the run
            _reward_failures.report(f"{type(error).__name__}: {error}", exc_info=error)
            verdict = Verdict(False, "", "error", f"{type(error).__name__}: {error}"[:MAX_REPORTED_CHARS])
            score = verdict.score
        finally:
            self.progress.end(token)
        self.failures.record(verdict.error)  # too many failures in this worker stop the run

        return {
            "reward_score": score + overlong_reward,
            "reward_extra_info": {
                "score": score,
                "acc": verdict.correct,
                "pred": verdict.pred,
                "overlong_reward": float(overlong_reward),
                TRUNCATED_COLUMN: truncated,
                "response_length": length,
                "verify_error": verdict.error,
                "symbolic_skipped": verdict.symbolic_skipped,
            },
        }

    def _verify_tokens(self, token_ids: Sequence[int], ground_truth: Any) -> Verdict:
        text = decode_tail(self.tokenizer, token_ids, min_chars=TAIL_CHARS)
        verdict = self._verify_text(text, ground_truth)
        if verdict.method == "no_answer" and len(text) >= TAIL_CHARS:  # the answer may be further back
            verdict = self._verify_text(self.tokenizer.decode(_as_list(token_ids), skip_special_tokens=True), ground_truth)
        return verdict

    def _verify_text(self, text: str, ground_truth: Any) -> Verdict:
        return verify(
            text, ground_truth, symbolic_check=self.settings.symbolic_check, timeout_s=self.settings.verify_timeout_s
        )

    async def _custom_score(
        self, non_tensor: dict, token_ids: Sequence[int], ground_truth: Any
    ) -> tuple[float, Verdict]:
        """The user's score (any float) and what we report of it; ``acc`` defaults to ``score > 0``."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(
            reward_executor(), functools.partial(self.tokenizer.decode, _as_list(token_ids), skip_special_tokens=True)
        )
        kwargs = dict(
            data_source=non_tensor.get("data_source"),
            solution_str=text,
            ground_truth=ground_truth,
            extra_info=non_tensor.get("extra_info", {}),
        )
        timeout_s = self.settings.custom_score_timeout_s
        try:
            if inspect.iscoroutinefunction(self.custom_compute_score):
                try:  # cancelled at the time-out (a coroutine that blocks the event loop cannot be bounded)
                    result = await asyncio.wait_for(self.custom_compute_score(**kwargs), timeout=timeout_s)
                except asyncio.TimeoutError:
                    raise CallTimeout(f"time-out: custom compute_score still running after {timeout_s:g} s") from None
            else:  # on threads of its own: a call that hangs is abandoned and holds nothing others need
                result = await self.custom_caller.call(self.custom_compute_score, **kwargs)
        except CallTimeout as timeout:
            abandoned = self.custom_caller.abandoned
            _custom_timeouts.report(
                f"{timeout} (data_source={kwargs['data_source']!r}; {abandoned} timed-out calls still running in "
                "this worker); raise reward.reward_kwargs.custom_score_timeout_s or make the function faster"
            )
            return -1.0, Verdict(False, "", "error", str(timeout))
        if isinstance(result, dict):
            score = float(result["score"])
            verdict = Verdict(
                bool(result.get("acc", score > 0)),
                str(result.get("pred", ""))[:MAX_REPORTED_CHARS],
                "custom",
                str(result.get("verify_error", ""))[:MAX_REPORTED_CHARS],
            )
        else:
            score = float(result)
            verdict = Verdict(score > 0, "", "custom")
        if not math.isfinite(score) or abs(score) > FLOAT32_MAX:  # verl stores rewards as float32: 1e39 is inf there
            problem = f"non-finite score ({score})" if not math.isfinite(score) else f"score {score:g} is not finite in float32"
            _non_finite_scores.report(
                f"{problem} from custom compute_score for data_source={kwargs['data_source']!r}, "
                f"ground_truth={ground_truth!r}, response ending {text[-200:]!r}"
            )
            return -1.0, Verdict(False, verdict.pred, "error", problem)
        return score, verdict


def reward_function_label(config: Any) -> str:
    """How a user's reward function is named in the messages that stop the run: its file and function name."""
    path = config_value(config, "reward.custom_reward_function.path")
    name = config_value(config, "reward.custom_reward_function.name", "compute_score")
    return f"custom reward function {name} in {path} (reward.custom_reward_function)"


def warn_symbolic_off(symbolic_check: bool | None) -> None:
    """The loud start-up warning of a manager whose verifier runs without its symbolic step."""
    reason = "reward.reward_kwargs.symbolic_check=false" if symbolic_check is False else "math-verify is not installed"
    logger.warning(
        "\n%s\nSYMBOLIC ANSWER CHECK IS OFF (%s): answers that only symbolic maths can match are scored -1.\n"
        "Each such answer is counted in reward/symbolic_skipped_count. Install the 'math' extra "
        "(pip install 'recipe_dapo[math]'; scripts/install_cpu.sh includes it) or set symbolic_check=null.\n%s",
        "=" * 100, reason, "=" * 100,
    )


def _ground_truth(non_tensor: dict) -> Any:
    try:
        return non_tensor["reward_model"]["ground_truth"]
    except (KeyError, TypeError) as error:
        raise KeyError(
            "each sample needs reward_model.ground_truth (verl's RL parquet layout); "
            f"got non_tensor_batch keys {sorted(non_tensor)}"
        ) from error


def decode_tail(tokenizer: Any, token_ids: Sequence[int], min_chars: int) -> str:
    """Decode just enough of the end of a response: its last ``min_chars`` characters equal the full decode's.

    Starts from ``min_chars // 2 + 8`` tokens (text averages 3-4 characters a token) and takes four times
    more until the text is long enough or everything is decoded. A cut inside a multi-byte character
    turns its first bytes into replacement characters, so 4 characters more than asked are required.
    ``token_ids`` may be a list or a 1-D tensor (only the decoded slice is converted).
    """
    total = len(token_ids)
    take = min(total, min_chars // 2 + 8)
    while True:
        text = tokenizer.decode(_as_list(token_ids[total - take :]), skip_special_tokens=True)
        if take == total or len(text) >= min_chars + 4:
            return text
        take = min(total, take * 4)


def _as_list(token_ids: Sequence[int]) -> list[int]:
    return token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)


def stop_token_ids(tokenizer: Any, model_path: str | None = None) -> frozenset[int]:
    """Token ids that end a generation: the tokenizer's EOS plus ``eos_token_id`` of a local
    ``generation_config.json`` (vLLM stops on those; Qwen2.5-Instruct lists two)."""
    ids = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    if model_path and os.path.isfile(os.path.join(str(model_path), "generation_config.json")):
        try:
            with open(os.path.join(str(model_path), "generation_config.json"), encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id")
            ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
        except (OSError, ValueError, TypeError):
            logger.warning("could not read eos_token_id from %s/generation_config.json", model_path)
    if not ids:
        raise ValueError(
            "the tokenizer has no eos_token_id, so truncated responses cannot be told apart; "
            "use a tokenizer with an EOS token (actor_rollout_ref.model.tokenizer_path)"
        )
    return frozenset(ids)
