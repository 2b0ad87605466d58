"""The classic trainer's step-scoring hook for ``algorithm.adv_estimator=grpo_process``: each response's steps scored
as text and written into ``token_level_rewards`` (a step's reward at its last token, 0 elsewhere), which verl then
hands the registered ``grpo_process`` estimator (``recipe_dapo.advantages.estimator``).

A response's tokens are decoded one at a time so that a step's last character maps to the token that holds it; the
concatenated pieces are the text the scorer reads (exact for the ASCII of the chain task; a byte-level token that
splits a multi-byte character decodes to a replacement character there, which shifts nothing but that character).

A scorer with ``score_batch`` (``prm``, :class:`recipe_dapo.advantages.prm.ProcessRewardModelScorer`) scores the
whole batch in few model calls and reads the question (the last user message of verl's ``raw_prompt`` without the
DAPO template; the decoded prompt where there is none) rather than the templated prompt. :func:`build_step_scorer`
makes the configured scorer; for ``prm`` it asks the model verl serves as its reward model (``reward.reward_model``),
through verl's reward router, and :func:`served_model_awake` wakes that model for the scoring when verl keeps it
asleep between uses (``reward.reward_model.rollout.free_cache_engine``), as verl's own reward-model scoring does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Union

import torch

from recipe_dapo.advantages import PRM_SCORER
from recipe_dapo.advantages.steps import StepScorer, step_tensors, token_steps
from recipe_dapo.cpu.chain_task import score_response

SCORERS: dict[str, StepScorer] = {"chain_rule": score_response}
"""The rule scorers: ``dapo.objective.step_scorer`` -> its function (``prm`` is built by :func:`build_step_scorer`)."""


def build_step_scorer(config: Any, reward_loop_manager: Any = None) -> Any:
    """The scorer ``dapo.objective.step_scorer`` names; ``prm`` reads the model verl serves as its reward model at the
    router of ``reward_loop_manager`` (verl's ``RewardLoopManager``)."""
    name = config.dapo.objective.step_scorer
    if name != PRM_SCORER:
        return SCORERS[name]
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local

    from recipe_dapo.advantages.prm import PRMFormat, ProcessRewardModelScorer
    from recipe_dapo.advantages.prm_backends import ServedPRM

    address = getattr(reward_loop_manager, "reward_router_address", None)
    if not address:
        raise RuntimeError(
            "dapo.objective.step_scorer=prm needs the process reward model served by verl "
            "(reward.reward_model.enable=true); verl started no reward router"
        )
    model_path = config.reward.reward_model.model_path
    settings = config.dapo.objective.prm
    tokenizer = hf_tokenizer(copy_to_local(model_path), trust_remote_code=True)  # as verl's reward workers load it
    backend = ServedPRM(address, model_path, float(settings.timeout_s))
    return ProcessRewardModelScorer(tokenizer, PRMFormat.from_settings(settings, tokenizer), backend,
                                    int(settings.batch_size))


@contextlib.contextmanager
def served_model_awake(reward_loop_manager: Any) -> Iterator[None]:
    """The served reward model awake for the block (verl's ``RewardModelManager`` wakes it for its own scoring and
    puts it back to sleep after, freeing its GPU memory); nothing when verl serves none."""
    manager = getattr(reward_loop_manager, "reward_model_manager", None)
    if manager is None:
        yield
        return
    manager.wake_up()
    try:
        yield
    finally:
        manager.sleep()


def question_of(raw_prompt: Any) -> str | None:
    """The problem a chat asks (verl's ``raw_prompt``): its last user message, without the DAPO template
    (``recipe_dapo.data.template``), or None."""
    from recipe_dapo.data.template import strip_dapo_template

    if raw_prompt is None or isinstance(raw_prompt, str):
        return raw_prompt if raw_prompt is None else strip_dapo_template(raw_prompt)
    for message in reversed(list(raw_prompt)):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return strip_dapo_template(message["content"])
    return None


def write_step_rewards(batch: Any, tokenizer: Any, scorer: Union[str, StepScorer, Any]) -> dict[str, float]:
    """Replace ``batch.batch["token_level_rewards"]`` by the step rewards; returns the ``process/`` metrics.
    ``scorer``: a rule scorer's name, a :data:`~recipe_dapo.advantages.steps.StepScorer`, or a scorer with
    ``score_batch`` (``prm``)."""
    scorer = SCORERS[scorer] if isinstance(scorer, str) else scorer
    responses = batch.batch["responses"]
    width = responses.shape[-1]
    attention = batch.batch["attention_mask"]
    prompts = batch.batch["prompts"]
    prompt_attention = attention[:, : prompts.shape[-1]].bool()
    response_lengths = attention[:, -width:].sum(-1).tolist()
    raw_prompts = batch.non_tensor_batch.get("raw_prompt")
    batched = hasattr(scorer, "score_batch")
    prompt_texts, texts, token_pieces = [], [], []
    for row in range(responses.shape[0]):
        question = question_of(raw_prompts[row]) if batched and raw_prompts is not None else None
        prompt_texts.append(question if question is not None else tokenizer.decode(
            prompts[row][prompt_attention[row]].tolist(), skip_special_tokens=batched))
        pieces = [tokenizer.decode([token], skip_special_tokens=True)  # the EOS ending a response is no text
                  for token in responses[row, : int(response_lengths[row])].tolist()]
        token_pieces.append(pieces)
        texts.append("".join(pieces))
    all_steps = (scorer.score_batch(prompt_texts, texts) if batched
                 else [scorer(prompt, text) for prompt, text in zip(prompt_texts, texts)])
    right_above = float(getattr(scorer, "right_above", 0.0))
    rows = [token_steps(pieces, steps) for pieces, steps in zip(token_pieces, all_steps)]
    steps_per_row = [len(steps) for steps in all_steps]
    rewards, _ = step_tensors(rows, width)
    target = batch.batch["token_level_rewards"]
    batch.batch["token_level_rewards"] = rewards.to(device=target.device, dtype=target.dtype)
    total = max(sum(steps_per_row), 1)
    every_reward = [reward for steps in all_steps for _, reward in steps]
    return {
        "process/steps_per_response_mean": float(torch.tensor(steps_per_row, dtype=torch.float32).mean()),
        "process/step_right_fraction": sum(reward > right_above for reward in every_reward) / total,
        "process/step_reward_mean": sum(every_reward) / total,
        "process/responses_without_step": float(sum(count == 0 for count in steps_per_row)) / max(len(rows), 1),
    }
