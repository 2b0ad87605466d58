"""The ``recipe_dapo`` reward manager on real verl objects: a config composed from verl's own Hydra
``ppo_trainer``, the Qwen2.5 tokenizer, a padded ``DataProto`` batch, and verl's ``RewardLoopWorker`` calling
the manager exactly as a reward-loop Ray actor does (one ``run_single`` per sample, gathered)."""

from __future__ import annotations

import asyncio
import os
import re
import textwrap

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict
from transformers import AutoTokenizer

from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.utils.ray_utils import get_event_loop

import recipe_dapo.reward.manager  # noqa: F401  (registers "recipe_dapo", as plugin.py does)
from recipe_dapo.overlong import overlong_metrics, truncated_rows
from recipe_dapo.reward.manager import REWARD_EXTRA_KEYS, decode_tail, is_truncated
from recipe_dapo.reward.metrics import reward_metrics
from recipe_dapo.reward.settings import RewardSettings

TOKENIZER_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "qwen2.5-tokenizer")
if not os.path.isdir(TOKENIZER_DIR):
    TOKENIZER_DIR = "/work/shared/data/qwen2.5-tokenizer"

MAX_RESPONSE_LENGTH = 32  # L_max, also the rollout budget (data.max_response_length)
BUFFER_LEN = 8  # L_cache: responses longer than 24 tokens are punished
PROMPT_LENGTH = 16


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def base_config():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"data.max_response_length={MAX_RESPONSE_LENGTH}",
                f"data.max_prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.model.path={TOKENIZER_DIR}",
                "reward.reward_manager.name=recipe_dapo",
                "reward.num_workers=1",
                "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                f"+reward.reward_kwargs.overlong_buffer_cfg.len={BUFFER_LEN}",
                "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                "+reward.reward_kwargs.overlong_buffer_cfg.log=false",
                "+reward.reward_kwargs.max_resp_len=null",
            ],
        )
    return config


def with_overrides(config, **dotted):
    config = OmegaConf.create(OmegaConf.to_container(config))  # deep copy, interpolations kept
    with open_dict(config):
        for key, value in dotted.items():
            OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    return config


def response_ids(tokenizer, text: str, length: int, end_with_eos: bool) -> list[int]:
    """``text`` tokenised, padded with filler before it to exactly ``length`` tokens (EOS last if asked)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    tail = ids + ([tokenizer.eos_token_id] if end_with_eos else [])
    filler = tokenizer(" ok", add_special_tokens=False)["input_ids"] * length
    assert len(tail) <= length
    return filler[: length - len(tail)] + tail


def padded_batch(tokenizer, rows: list[tuple[list[int], object]]) -> DataProto:
    """verl's padded layout: left-padded prompts, right-padded responses, one attention mask over both."""
    prompt = tokenizer("Solve it.", add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id
    prompts, responses, attention = [], [], []
    for ids, _ in rows:
        prompts.append([pad] * (PROMPT_LENGTH - len(prompt)) + prompt)
        responses.append(ids + [pad] * (MAX_RESPONSE_LENGTH - len(ids)))
        attention.append([0] * (PROMPT_LENGTH - len(prompt)) + [1] * len(prompt) + [1] * len(ids)
                         + [0] * (MAX_RESPONSE_LENGTH - len(ids)))
    prompts, responses, attention = (torch.tensor(x) for x in (prompts, responses, attention))
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
        },
        non_tensors={
            "data_source": np.array(["math_dapo"] * len(rows), dtype=object),
            "reward_model": np.array([{"ground_truth": gt, "style": "rule"} for _, gt in rows], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(rows))], dtype=object),
        },
    )


def score_like_verl(config, batch: DataProto) -> DataProto:
    """What ``RewardLoopManager.compute_rm_score`` does with one worker, without Ray."""
    worker = RewardLoopWorker(config)
    outputs = get_event_loop().run_until_complete(worker.compute_score_batch(batch))
    manager_cls = get_reward_manager_cls(config.reward.reward_manager.name)
    rm_scores = manager_cls.assemble_rm_scores(batch, [o["reward_score"] for o in outputs])
    infos = [o["reward_extra_info"] for o in outputs]
    keys = list(infos[0].keys())  # verl takes the schema from the first sample
    return DataProto.from_dict(
        tensors={"rm_scores": rm_scores},
        non_tensors={key: np.array([info[key] for info in infos]) for key in keys},
        meta_info={"reward_extra_keys": keys},
    )


def test_manager_scores_a_padded_batch_with_correctness_plus_soft_overlong_penalty(tokenizer, base_config):
    rows = [
        (response_ids(tokenizer, "So.\nAnswer: 42", 10, True), "42"),  # right, short
        (response_ids(tokenizer, "Answer: 41", 10, True), 42),  # wrong (int ground truth)
        (response_ids(tokenizer, "I give up", 10, True), "42"),  # no answer
        (response_ids(tokenizer, "Answer: 42", 28, True), "42"),  # right, 4 tokens into the buffer
        (response_ids(tokenizer, "Answer: 42", 32, True), "42"),  # right, exactly L_max, ended by EOS
        (response_ids(tokenizer, "Answer: 42", 32, False), "42"),  # right, cut at L_max without EOS
    ]
    batch = padded_batch(tokenizer, rows)
    result = score_like_verl(base_config, batch)

    # reward = score + overlong_reward, overlong_reward = clamp(((32 - 8) - |y|) / 8, -1, 0):
    #   |y| = 10 -> 0;  |y| = 28 -> (24 - 28) / 8 = -0.5;  |y| = 32 -> (24 - 32) / 8 = -1.0
    expected_penalty = [0.0, 0.0, 0.0, -0.5, -1.0, -1.0]
    expected_score = [1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
    expected_reward = [s + p for s, p in zip(expected_score, expected_penalty)]  # [1, -1, -1, 0.5, 0, 0]
    info = result.non_tensor_batch
    assert result.meta_info["reward_extra_keys"] == list(REWARD_EXTRA_KEYS)
    assert info["score"].tolist() == expected_score
    assert info["acc"].tolist() == [True, False, False, True, True, True]
    assert info["pred"].tolist() == ["42", "41", "", "42", "42", "42"]
    assert info["overlong_reward"].tolist() == pytest.approx(expected_penalty)
    assert info["response_length"].tolist() == [10, 10, 10, 28, 32, 32]
    assert info["verify_error"].tolist() == [""] * 6
    # Only the last response was truncated; the one of exactly L_max tokens ended on its own.
    assert info["truncated"].tolist() == [False, False, False, False, False, True]
    assert info["truncated"].tolist() == truncated_rows(
        batch.batch["responses"], batch.batch["attention_mask"][:, PROMPT_LENGTH:], [tokenizer.eos_token_id]
    ).tolist()
    # verl puts each reward on the last valid response token.
    rm_scores = result.batch["rm_scores"]
    last = torch.tensor([10, 10, 10, 28, 32, 32]) - 1
    assert rm_scores[torch.arange(6), last].tolist() == pytest.approx(expected_reward)
    assert rm_scores.sum().item() == pytest.approx(sum(expected_reward))

    metrics = {**reward_metrics(info), **overlong_metrics(info)}
    assert metrics["reward/verify_error_ratio"] == 0.0
    assert metrics["reward/no_answer_ratio"] == pytest.approx(1 / 6)
    assert metrics["overlong/truncated_ratio"] == pytest.approx(1 / 6)
    assert metrics["overlong/penalized_ratio"] == pytest.approx(3 / 6)


def test_soft_penalty_at_the_buffer_start_inside_it_at_l_max_and_beyond(tokenizer, base_config):
    # L_max = max_resp_len = 24 below the rollout budget of 32, L_cache = 8, so the buffer is (16, 24]:
    #   |y| = 16 -> 0 (exactly L_max - L_cache);  20 -> (16 - 20) / 8 = -0.5;  24 -> -1.0;  30 -> -1.0 (beyond)
    config = with_overrides(base_config, reward__reward_kwargs__max_resp_len=24)
    lengths = [16, 20, 24, 30]
    rows = [(response_ids(tokenizer, "Answer: 42", n, True), "42") for n in lengths]
    info = score_like_verl(config, padded_batch(tokenizer, rows)).non_tensor_batch
    assert info["overlong_reward"].tolist() == pytest.approx([0.0, -0.5, -1.0, -1.0])
    assert info["response_length"].tolist() == lengths
    assert info["truncated"].tolist() == [False] * 4  # all ended with EOS inside the rollout budget


def test_streamed_unpadded_sample_uses_the_config_budget_to_detect_truncation(tokenizer, base_config):
    # The agent loop sends each finished response unpadded with an all-ones mask (agent_loop._compute_score).
    manager_cls = get_reward_manager_cls("recipe_dapo")
    manager = manager_cls(base_config, tokenizer, compute_score=None)

    def streamed(ids):
        prompt = tokenizer("Solve it.", add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([prompt + ids])
        return DataProto.from_dict(
            tensors={
                "prompts": torch.tensor([prompt]),
                "responses": torch.tensor([ids]),
                "attention_mask": torch.ones_like(input_ids),
                "input_ids": input_ids,
                "position_ids": torch.arange(input_ids.shape[1])[None],
            },
            non_tensors={
                "data_source": np.array(["math_dapo"], dtype=object),
                "reward_model": np.array([{"ground_truth": "7"}], dtype=object),
            },
        )

    short_cut = asyncio.run(manager.run_single(streamed(response_ids(tokenizer, "Answer: 7", 20, False))))
    full_cut = asyncio.run(manager.run_single(streamed(response_ids(tokenizer, "Answer: 7", 32, False))))
    assert short_cut["reward_extra_info"]["truncated"] is False  # 20 < 32 tokens: a width-20 tensor is not a cut
    assert full_cut["reward_extra_info"]["truncated"] is True
    assert full_cut["reward_score"] == pytest.approx(1.0 - 1.0)


def test_max_resp_len_defaults_to_data_max_response_length_and_can_be_set(base_config):
    assert RewardSettings.from_config(base_config).max_resp_len == MAX_RESPONSE_LENGTH
    config = with_overrides(base_config, reward__reward_kwargs__max_resp_len=24)
    settings = RewardSettings.from_config(config)
    assert (settings.max_resp_len, settings.rollout_budget, settings.overlong_buffer_len) == (24, 32, 8)


def test_without_reward_kwargs_the_penalty_is_off_and_lengths_come_from_data(base_config):
    config = with_overrides(base_config)
    with open_dict(config):
        del config.reward["reward_kwargs"]
    settings = RewardSettings.from_config(config)
    assert (settings.overlong_enable, settings.max_resp_len, settings.rollout_budget) == (False, 32, 32)
    assert (settings.symbolic_check, settings.verify_timeout_s) == (None, 2.0)


@pytest.mark.parametrize("buffer_len", [MAX_RESPONSE_LENGTH, MAX_RESPONSE_LENGTH + 1, 0])
def test_construction_refuses_a_buffer_not_shorter_than_the_maximum_length(tokenizer, base_config, buffer_len):
    config = with_overrides(base_config, reward__reward_kwargs__overlong_buffer_cfg__len=buffer_len)
    with pytest.raises(ValueError, match="overlong_buffer_cfg"):
        get_reward_manager_cls("recipe_dapo")(config, tokenizer, compute_score=None)


def test_disabled_buffer_adds_no_penalty_but_still_reports_truncation(tokenizer, base_config):
    config = with_overrides(base_config, reward__reward_kwargs__overlong_buffer_cfg__enable=False)
    batch = padded_batch(tokenizer, [(response_ids(tokenizer, "Answer: 42", 32, False), "42")])
    info = score_like_verl(config, batch).non_tensor_batch
    assert (info["score"][0], info["overlong_reward"][0], info["truncated"][0]) == (1.0, 0.0, True)


def test_bad_reward_kwargs_fail_at_start_up_naming_the_key(tokenizer, base_config):
    config = with_overrides(base_config, reward__reward_kwargs__symbolic_check="sometimes")
    with pytest.raises(ValueError, match="reward.reward_kwargs.symbolic_check"):
        get_reward_manager_cls("recipe_dapo")(config, tokenizer, compute_score=None)
    config = with_overrides(base_config, reward__reward_kwargs__verify_timeout_s=0)
    with pytest.raises(ValueError, match="reward.reward_kwargs.verify_timeout_s"):
        get_reward_manager_cls("recipe_dapo")(config, tokenizer, compute_score=None)


def test_a_users_custom_reward_function_replaces_ours_and_its_failures_score_minus_one(
    tokenizer, base_config, tmp_path
):
    module = tmp_path / "my_reward.py"
    module.write_text(textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            if "crash" in solution_str:
                raise ValueError("cannot parse")
            return {"score": 0.25 + bonus, "acc": True, "pred": "mine", "extra": 1}
    """))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__custom_reward_function__reward_kwargs={"bonus": 0.5},
    )
    rows = [(response_ids(tokenizer, "Answer: 1", 10, True), "2"), (response_ids(tokenizer, "crash", 10, True), "2")]
    info = score_like_verl(config, padded_batch(tokenizer, rows)).non_tensor_batch
    assert list(info) == list(REWARD_EXTRA_KEYS)  # the schema stays fixed: the user's "extra" key is dropped
    assert info["score"].tolist() == [0.75, -1.0]
    assert info["pred"].tolist() == ["mine", ""]
    assert info["verify_error"].tolist() == ["", "ValueError: cannot parse"]


def test_decode_tail_equals_the_end_of_the_full_decode(tokenizer):
    # Multi-byte characters split across tokens, digits (one token each), and a special token inside.
    text = ("解题过程：设 x=３，则 x² = 9。🙂 " * 40) + "1234567890" * 30 + "<|im_end|>" + "\nAnswer: 42"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    for min_chars in (10, 100, 500, 5000):
        tail = decode_tail(tokenizer, torch.tensor(ids), min_chars=min_chars)
        assert full.endswith(tail[-min_chars:]) and len(tail) >= min(len(full), min_chars)
        assert tail[-min_chars:] == full[-min_chars:]


def test_is_truncated_needs_the_whole_budget_and_no_stop_token():
    stop = frozenset({2})
    assert is_truncated(3, 5, rollout_budget=3, stop_ids=stop)
    assert not is_truncated(3, 2, rollout_budget=3, stop_ids=stop)  # ended by EOS exactly at the budget
    assert not is_truncated(2, 5, rollout_budget=3, stop_ids=stop)
    assert is_truncated(4, 5, rollout_budget=3, stop_ids=stop)


def test_our_compute_score_plugs_in_as_a_custom_reward_function_by_package_path(tokenizer, base_config):
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path="pkg://recipe_dapo.reward",
        reward__custom_reward_function__name="compute_score",
    )
    rows = [(response_ids(tokenizer, "Answer: 7", 10, True), 7), (response_ids(tokenizer, "Answer: 8", 10, True), 7)]
    info = score_like_verl(config, padded_batch(tokenizer, rows)).non_tensor_batch
    assert info["score"].tolist() == [1.0, -1.0]
    assert info["pred"].tolist() == ["7", "8"]


def test_requiring_math_verify_when_it_is_missing_fails_at_start_up(tokenizer, base_config, monkeypatch):
    from recipe_dapo.reward import symbolic

    monkeypatch.setattr(symbolic, "math_verify_installed", lambda: False)
    config = with_overrides(base_config, reward__reward_kwargs__symbolic_check=True)
    with pytest.raises(ValueError, match="symbolic_check=true needs math-verify"):
        get_reward_manager_cls("recipe_dapo")(config, tokenizer, compute_score=None)


def test_reward_metrics_count_errors_time_outs_missing_answers_and_overlong():
    columns = {
        "verify_error": np.array(["", "time-out: symbolic checker still checking at the limit", "ValueError: x", ""]),
        "pred": np.array(["1", "2", "", ""]),
        "acc": np.array([True, False, False, False]),
        "truncated": np.array([False, False, True, False]),
        "overlong_reward": np.array([0.0, -0.5, -1.0, 0.0]),
    }
    # 2 of 4 errors, 1 of them a time-out; 2 of 4 empty preds; 1 right; 1 truncated; 2 penalised, mean -1.5/4
    assert {**reward_metrics(columns), **overlong_metrics(columns)} == {
        "reward/verify_error_ratio": 0.5,
        "reward/verify_timeout_ratio": 0.25,
        "reward/no_answer_ratio": 0.5,
        "reward/acc_mean": 0.25,
        "overlong/truncated_ratio": 0.25,
        "overlong/penalized_ratio": 0.5,
        "overlong/reward_mean": -0.375,
    }


def streamed_sample(tokenizer, response_ids: list[int], ground_truth) -> DataProto:
    """One sample as the agent loop streams it: unpadded, all-ones attention mask."""
    prompt = tokenizer("Solve it.", add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([prompt + response_ids])
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt]),
            "responses": torch.tensor([response_ids]),
            "attention_mask": torch.ones_like(input_ids),
            "input_ids": input_ids,
            "position_ids": torch.arange(input_ids.shape[1])[None],
        },
        non_tensors={
            "data_source": np.array(["math_dapo"], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth}], dtype=object),
        },
    )


def test_an_answer_far_from_the_end_is_found_by_decoding_the_whole_response(tokenizer, base_config):
    # The manager decodes the last TAIL_CHARS characters first; with no answer there it
    # must decode the rest instead of scoring "no answer".
    manager = get_reward_manager_cls("recipe_dapo")(base_config, tokenizer, compute_score=None)
    text = "Answer: 42\n" + "Let me double-check everything once more. " * 120  # ~5,000 characters after it
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    result = asyncio.run(manager.run_single(streamed_sample(tokenizer, ids, "42")))
    assert (result["reward_extra_info"]["acc"], result["reward_extra_info"]["pred"]) == (True, "42")


def test_without_math_verify_the_manager_warns_at_start_up_and_counts_skipped_answers(
    tokenizer, base_config, monkeypatch, caplog
):
    from recipe_dapo.reward import symbolic

    monkeypatch.setattr(symbolic, "math_verify_installed", lambda: False)
    rows = [
        (response_ids(tokenizer, "Answer: 2\\sin(x)\\cos(x)", 20, True), "\\sin(2x)"),  # needs sympy
        (response_ids(tokenizer, "Answer: x + x", 20, True), "2x"),  # decided by the rules
        (response_ids(tokenizer, "Answer: 41", 20, True), "42"),
    ]
    with caplog.at_level("WARNING", logger="recipe_dapo.reward.manager"):
        info = score_like_verl(base_config, padded_batch(tokenizer, rows)).non_tensor_batch
    assert any("SYMBOLIC ANSWER CHECK IS OFF" in r.getMessage() for r in caplog.records)
    assert info["symbolic_skipped"].tolist() == [True, False, False]
    assert info["acc"].tolist() == [False, True, False]
    assert reward_metrics(info)["reward/symbolic_skipped_count"] == 1.0


def test_custom_function_time_outs_and_exceptions_are_logged_at_a_bounded_rate(
    tokenizer, base_config, tmp_path, caplog
):
    # Time-outs were counted but never logged; every exception logged a full traceback
    from recipe_dapo.reward import manager as manager_module

    module = tmp_path / "slow_reward.py"
    module.write_text(textwrap.dedent("""
        import time

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if "slow" in solution_str:
                time.sleep(1.0)
            raise ValueError("cannot parse " + solution_str[-3:])
    """))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__custom_score_timeout_s=0.2,
    )
    manager_module._reward_failures.count = manager_module._custom_timeouts.count = 0
    rows = [(response_ids(tokenizer, "slow", 10, True), "1")] + [
        (response_ids(tokenizer, f"crash {i}", 10, True), "1") for i in range(12)
    ]
    with caplog.at_level("WARNING", logger="recipe_dapo.reward.manager"):
        info = score_like_verl(config, padded_batch(tokenizer, rows)).non_tensor_batch
    messages = [r.getMessage() for r in caplog.records]
    assert info["verify_error"][0].startswith("time-out") and all(e.startswith("ValueError") for e in info["verify_error"][1:])
    assert any("custom compute_score timed out" in m and "custom_score_timeout_s" in m for m in messages)
    failures = [r for r in caplog.records if "reward computation failed" in r.getMessage()]
    # 3 with tracebacks, then one summary line with the count instead of 9 more tracebacks
    assert [r.exc_info is not None for r in failures] == [True, True, True, False]
    assert "more since the last report (4 in all)" in failures[-1].getMessage()
    assert manager_module._reward_failures.count == 12


def score_within(config, batch: DataProto, limit_s: float, worker=None) -> tuple[dict, float]:
    """``score_like_verl``'s columns, or a test failure (not a hang) when scoring takes over ``limit_s``."""
    import time

    worker = worker or RewardLoopWorker(config)
    start = time.monotonic()
    try:
        outputs = get_event_loop().run_until_complete(
            asyncio.wait_for(worker.compute_score_batch(batch), timeout=limit_s)
        )
    except asyncio.TimeoutError:
        pytest.fail(f"scoring did not finish within {limit_s} s: the run would stall")
    elapsed = time.monotonic() - start
    infos = [o["reward_extra_info"] for o in outputs]
    columns = {key: np.array([info[key] for info in infos]) for key in infos[0]}
    columns["reward_score"] = np.array([o["reward_score"] for o in outputs])
    return columns, elapsed


HANGING_REWARD = """
    import math, os, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if "hang" in solution_str:
            while not os.path.exists({release!r}):  # "forever": until the test ends
                time.sleep(0.05)
        if "exit" in solution_str:
            raise SystemExit(3)
        if "nan" in solution_str:
            return math.nan
        if "inf" in solution_str:
            return {{"score": -math.inf, "acc": True, "pred": "x"}}
        if "huge" in solution_str:
            return 1e39  # finite in Python, inf in verl's float32 reward tensor
        if "raise" in solution_str:
            raise ValueError("cannot parse")
        return 0.5 if solution_str.strip().endswith(str(ground_truth)) else -0.25
"""


def test_custom_functions_that_hang_never_starve_decoding_and_every_sample_is_scored(tokenizer, base_config, tmp_path):
    # A timed-out call used to keep its thread in the event loop's default executor; with more
    # hanging samples than that executor has threads, the good samples queued behind them timed out too, and the
    # next step's decoding waited behind them for good: the run stalled.
    release = tmp_path / "release"
    module = tmp_path / "hanging_reward.py"
    module.write_text(textwrap.dedent(HANGING_REWARD.format(release=str(release))))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__custom_score_timeout_s=0.3,
        reward__reward_kwargs__overlong_buffer_cfg__enable=False,
    )
    default_executor_threads = min(32, (os.cpu_count() or 1) + 4)
    hanging = default_executor_threads + 3
    rows = [(response_ids(tokenizer, f"hang {i}", 10, True), "1") for i in range(hanging)]
    rows += [(response_ids(tokenizer, "Answer: 7", 10, True), "7"), (response_ids(tokenizer, "Answer: 8", 10, True), "7")]
    worker = RewardLoopWorker(config)  # one reward-loop worker, two steps
    try:
        info, elapsed = score_within(config, padded_batch(tokenizer, rows), limit_s=20.0, worker=worker)
        next_step, _ = score_within(config, padded_batch(tokenizer, rows[-2:]), limit_s=10.0, worker=worker)
    finally:
        release.write_text("")  # lets the abandoned threads end
    assert info["score"].tolist() == [-1.0] * hanging + [0.5, -0.25]
    assert info["reward_score"].tolist() == [-1.0] * hanging + [0.5, -0.25]
    # What a time-out trains as: a wrong answer (score -1, acc False), told apart only by verify_error.
    assert info["acc"][:hanging].tolist() == [False] * hanging
    assert all(e == "time-out: custom compute_score still running after 0.3 s" for e in info["verify_error"][:hanging])
    assert info["verify_error"][hanging:].tolist() == ["", ""]
    assert reward_metrics(info)["reward/verify_timeout_ratio"] == hanging / len(rows)
    # each hanging call costs its time-out: two rounds of them here, far below the 20 s limit
    assert elapsed < 0.3 * 2 + 5.0
    assert next_step["score"].tolist() == [0.5, -0.25]


def test_non_finite_scores_count_as_failures_scored_minus_one(tokenizer, base_config, tmp_path, caplog):
    # A NaN reward reached the advantages and poisoned the whole batch silently
    from recipe_dapo.reward import manager as manager_module

    manager_module._non_finite_scores.count = 0  # the first few are logged in detail
    module = tmp_path / "nan_reward.py"
    module.write_text(textwrap.dedent(HANGING_REWARD.format(release=str(tmp_path / "unused"))))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__overlong_buffer_cfg__enable=False,
    )
    rows = [
        (response_ids(tokenizer, "Answer: 7", 10, True), "7"),
        (response_ids(tokenizer, "got nan", 10, True), "7"),
        (response_ids(tokenizer, "got inf", 10, True), "7"),
        (response_ids(tokenizer, "Answer: 8", 10, True), "7"),
        (response_ids(tokenizer, "exit", 10, True), "7"),  # sys.exit() in a user function ends one sample, not the worker
        (response_ids(tokenizer, "got huge", 10, True), "7"),
    ]
    with caplog.at_level("WARNING", logger="recipe_dapo.reward.manager"):
        info, _ = score_within(config, padded_batch(tokenizer, rows), limit_s=20.0)
    assert info["score"].tolist() == [0.5, -1.0, -1.0, -0.25, -1.0, -1.0]
    assert info["reward_score"].tolist() == [0.5, -1.0, -1.0, -0.25, -1.0, -1.0]
    assert info["acc"].tolist() == [True, False, False, False, False, False]  # the dict's acc=True does not survive -inf
    assert info["verify_error"].tolist() == [
        "", "non-finite score (nan)", "non-finite score (-inf)", "", "RuntimeError: custom compute_score raised SystemExit: 3",
        "score 1e+39 is not finite in float32",
    ]
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(1e39))  # why 1e39 is a failure: verl's reward tensor would hold inf
    assert reward_metrics(info)["reward/verify_error_ratio"] == 4 / 6  # counted where the stop message points
    logged = [r.getMessage() for r in caplog.records if "non-finite score" in r.getMessage()]
    assert len(logged) == 3 and "math_dapo" in logged[0] and "got nan" in logged[0]


def test_the_watchdog_warns_once_naming_the_calls_that_make_no_progress(tokenizer, base_config, tmp_path, caplog):
    release = tmp_path / "release"
    module = tmp_path / "hanging_reward.py"
    module.write_text(textwrap.dedent(HANGING_REWARD.format(release=str(release))))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__custom_score_timeout_s=2.5,
        reward__reward_kwargs__stall_warning_s=0.4,
    )
    rows = [(response_ids(tokenizer, f"hang {i}", 10, True), "1") for i in range(2)]
    rows.append((response_ids(tokenizer, "Answer: 7", 10, True), "7"))
    try:
        with caplog.at_level("WARNING", logger="recipe_dapo.reward.manager"):
            info, _ = score_within(config, padded_batch(tokenizer, rows), limit_s=20.0)
    finally:
        release.write_text("")
    stalls = [r.getMessage() for r in caplog.records if "made no progress" in r.getMessage()]
    assert len(stalls) == 1, stalls
    assert "2 calls in flight (custom compute_score: 2)" in stalls[0]
    assert "data_source='math_dapo'" in stalls[0] and "stall_warning_s" in stalls[0]
    assert info["verify_error"][:2].tolist() == ["time-out: custom compute_score still running after 2.5 s"] * 2


def test_progress_watch_warns_once_per_stall_and_names_the_oldest_call():
    import logging

    from recipe_dapo.reward.bounded_calls import ProgressWatch

    now = [100.0]
    watch = ProgressWatch(10.0, logging.getLogger("test"), abandoned=lambda: 3, clock=lambda: now[0])
    assert watch.stalled_message() is None  # nothing in flight: idle is no stall
    first = watch.begin("verify", "data_source='aime24'")
    now[0] = 105.0
    watch.begin("custom compute_score")
    now[0] = 109.0
    assert watch.stalled_message() is None
    now[0] = 111.0
    message = watch.stalled_message()
    assert message.startswith("reward scoring made no progress for 11 s: 2 calls in flight")
    assert "(custom compute_score: 1, verify: 1)" in message and "the oldest (verify, data_source='aime24') has run for 11 s" in message
    assert "3 timed-out custom compute_score calls are still running" in message
    now[0] = 200.0
    assert watch.stalled_message() is None  # one warning per stall
    watch.end(first)  # progress
    now[0] = 209.0
    assert watch.stalled_message() is None
    now[0] = 211.0
    assert "1 calls in flight" in watch.stalled_message()


@pytest.mark.parametrize("value", [0, -1.0, "soon", float("nan"), True])
def test_stall_warning_s_must_be_a_positive_number_of_seconds(tokenizer, base_config, value):
    config = with_overrides(base_config, reward__reward_kwargs__stall_warning_s=value)
    with pytest.raises(ValueError, match="reward.reward_kwargs.stall_warning_s must be a positive number of seconds"):
        get_reward_manager_cls("recipe_dapo")(config, tokenizer, compute_score=None)
    assert RewardSettings.from_config(base_config).stall_warning_s == 120.0


# ----------------------------------------------------------------------------- limits that stop the run


def _caller_threads(prefix: str = "recipe_dapo-custom_compute_score") -> int:
    import threading

    return sum(1 for thread in threading.enumerate() if thread.name.startswith(prefix) and thread.is_alive())


def _hammer(caller, function, calls: int) -> tuple[list, int]:
    """``calls`` calls of ``function`` through ``caller``, all at once; their outcomes and the peak of live threads."""
    import threading

    peak = [0]

    async def one():
        try:
            return await caller.call(function)
        except Exception as error:  # noqa: BLE001 - the outcome is what the test reads
            return error
        finally:
            peak[0] = max(peak[0], _caller_threads())

    async def all_calls():
        return await asyncio.gather(*(one() for _ in range(calls)))

    outcomes = asyncio.run(all_calls())
    assert threading.active_count() >= 1
    return outcomes, peak[0]


def test_hung_calls_past_the_cap_stop_the_run_and_the_threads_left_alive_are_bounded():
    """A real function that hangs until released: 60 calls with a cap of 5 abandoned calls and 3 running at once.
    Positive control in the same test: without a cap (the behaviour before the cap existed) every hung call keeps
    its thread, so the same 60 calls leave 60 threads alive."""
    import threading
    import time

    from recipe_dapo.reward.bounded_calls import BoundedCaller, CallTimeout, RewardFunctionBroken

    release = threading.Event()
    hang = lambda: release.wait(30)  # noqa: E731
    try:
        capped = BoundedCaller(0.05, max_running=3, name="custom compute_score", max_abandoned=5,
                               label="custom reward function compute_score in /tmp/hang.py")
        outcomes, peak = _hammer(capped, hang, 60)
        broken = [o for o in outcomes if isinstance(o, RewardFunctionBroken)]
        assert broken and all(isinstance(o, (CallTimeout, RewardFunctionBroken)) for o in outcomes)
        assert peak <= 3 + 5 and _caller_threads() <= 3 + 5, (peak, _caller_threads())
        message = str(broken[0])
        assert "\n" not in message
        assert message.startswith("custom reward function compute_score in /tmp/hang.py: ")
        assert "dapo.health.max_abandoned_reward_calls=5" in message
        assert re.search(r" (\d+) of \1 \(100%\) calls timed out after 0.05 s", message), message
        release.set()
        for _ in range(100):
            if not _caller_threads():
                break
            time.sleep(0.05)
        assert capped.abandoned == 0  # a released call gives its count back

        release.clear()
        uncapped = BoundedCaller(0.05, max_running=3, name="custom compute_score")
        outcomes, _ = _hammer(uncapped, hang, 60)
        assert all(isinstance(o, CallTimeout) for o in outcomes)
        assert _caller_threads() == 60 == uncapped.abandoned
    finally:
        release.set()


def test_the_manager_stops_on_the_abandoned_call_cap_naming_the_reward_function(tokenizer, base_config, tmp_path):
    """Through verl's RewardLoopWorker and the recipe's manager, with a real hanging function file: past
    ``dapo.health.max_abandoned_reward_calls`` the batch raises instead of scoring every later sample -1."""
    from recipe_dapo.reward.bounded_calls import RewardFunctionBroken

    release = tmp_path / "release"
    module = tmp_path / "hanging_reward.py"
    module.write_text(textwrap.dedent(HANGING_REWARD.format(release=str(release))))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__custom_score_timeout_s=0.1,
        dapo__health__max_abandoned_reward_calls=4,
    )
    rows = [(response_ids(tokenizer, f"hang {i}", 10, True), "1") for i in range(40)]
    try:
        worker = RewardLoopWorker(config)
        with pytest.raises(RewardFunctionBroken) as stopped:
            get_event_loop().run_until_complete(
                asyncio.wait_for(worker.compute_score_batch(padded_batch(tokenizer, rows)), timeout=30))
        assert _caller_threads() <= worker.reward_manager.custom_caller.max_running + 4
    finally:
        release.write_text("")
    message = str(stopped.value)
    assert f"custom reward function compute_score in {module}" in message
    assert "dapo.health.max_abandoned_reward_calls=4" in message, message
    assert "(100%) calls timed out after 0.1 s" in message, message


@pytest.mark.parametrize("max_ratio", [0.5, 1.0])
def test_a_reward_function_failing_on_most_samples_stops_the_run_past_the_failure_ratio(
    tokenizer, base_config, tmp_path, max_ratio
):
    """A function that raises on 4 samples of 5: with ``dapo.health.max_reward_failure_ratio=0.5`` the worker stops
    once 50 samples are judged, naming the function, the share and the last error; at 1.0 (never stop: what every
    run did before the limit existed) all 80 samples are scored, the failures as wrong answers (-1)."""
    from recipe_dapo.reward.bounded_calls import RewardFunctionBroken

    module = tmp_path / "raising_reward.py"
    module.write_text(textwrap.dedent(HANGING_REWARD.format(release=str(tmp_path / "unused"))))
    config = with_overrides(
        base_config,
        reward__custom_reward_function__path=str(module),
        reward__reward_kwargs__overlong_buffer_cfg__enable=False,
        dapo__health__max_reward_failure_ratio=max_ratio,
        dapo__health__reward_failure_window=100,
    )
    rows = [(response_ids(tokenizer, "Answer: 7" if i % 5 == 0 else "raise", 10, True), "7") for i in range(80)]
    if max_ratio == 1.0:
        info, _ = score_within(config, padded_batch(tokenizer, rows), limit_s=60.0)
        assert info["score"].tolist() == [0.5 if i % 5 == 0 else -1.0 for i in range(80)]
        assert reward_metrics(info)["reward/verify_error_ratio"] == 0.8
        return
    with pytest.raises(RewardFunctionBroken) as stopped:
        score_within(config, padded_batch(tokenizer, rows), limit_s=60.0)
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith(f"custom reward function compute_score in {module} (reward.custom_reward_function) "
                              "failed on "), message
    # The calls run concurrently, so which 50 samples were judged first varies: the share reported is the one judged,
    # above half, and no more failures than the rows hold (4 in 5) nor fewer than the 16 successes leave.
    failed, judged, percent = map(int, re.search(r"failed on (\d+) of (\d+) \((\d+)%\)", message).groups())
    assert judged >= 50 and failed > judged / 2 and judged - 16 <= failed <= judged, message
    assert percent == round(100 * failed / judged), message
    assert "of the last samples this reward worker scored, above dapo.health.max_reward_failure_ratio=0.5" in message
    assert "the last: ValueError: cannot parse" in message


def test_the_failure_window_judges_only_the_last_samples_and_only_once_enough_are_in():
    from recipe_dapo.reward.bounded_calls import RewardFunctionBroken
    from recipe_dapo.reward.health import FailureWindow

    window = FailureWindow(0.5, window=10, function="f", min_samples=4)
    for error in ("x", "x", ""):
        window.record(error)  # 2 of 3 failed, but fewer than 4 judged
    window.record("")  # 2 of 4: not above half
    for _ in range(10):
        window.record("")  # the two failures leave the window
    assert (window.failed, window.samples) == (0, 10)
    for _ in range(5):
        window.record("boom")  # 5 of 10: not above half
    with pytest.raises(RewardFunctionBroken, match=r"f failed on 6 of 10 \(60%\) .* the last: boom"):
        window.record("boom")
    with pytest.raises(ValueError, match="max_reward_failure_ratio must lie in"):
        FailureWindow(1.5, 10, "f")


def test_on_verl_v1_a_broken_reward_function_fails_its_group_as_fatal_so_the_run_stops():
    """On v1 a reward error fails its prompt group, which the sampler would drop and replace; the agent-loop worker's
    tag marks RewardFunctionBroken fatal (also inside Ray's wrapper), so the buffer stops the step with its line.
    Positive control: an ordinary reward exception is not fatal (one group lost, the run goes on)."""
    from recipe_dapo.reward.bounded_calls import RewardFunctionBroken
    from recipe_dapo.run.rollout_health import FATAL_TAG, ERROR_TAG, error_tag

    broken = RewardFunctionBroken("custom reward function compute_score in /r.py: 5 of 5 (100%) calls timed out")
    tag = error_tag(broken)
    assert tag[FATAL_TAG] is True and "5 of 5 (100%) calls timed out" in tag[ERROR_TAG]
    try:
        try:
            raise broken
        except RewardFunctionBroken as cause:
            raise RuntimeError("ray::RewardLoopWorker.compute_score() failed") from cause
    except RuntimeError as wrapped:
        assert error_tag(wrapped)[FATAL_TAG] is True
    assert error_tag(ValueError("cannot parse"))[FATAL_TAG] is False
    from recipe_dapo.run.rollout_health import fatal_failure_message

    message = fatal_failure_message(4, [tag[ERROR_TAG]], 3, 10)
    assert message.startswith("the reward function stopped the run at step 4: 3 prompt group(s) failed with "
                              "RewardFunctionBroken: custom reward function compute_score in /r.py")
    assert fatal_failure_message(4, ["RuntimeError: x"], 1, 0).startswith("rollout died at step 4")
