"""The classic trainer's step-scoring hook for ``algorithm.adv_estimator=grpo_process``: each response's steps scored
as text and written into ``token_level_rewards`` (a step's reward at its last token, 0 elsewhere), which verl then
hands the registered ``grpo_process`` estimator (``recipe_dapo.advantages.estimator``).

A response's tokens are decoded one at a time so that a step's last character maps to the token that holds it; the
concatenated pieces are the text the scorer reads (exact for the ASCII of the chain task; a byte-level token that
splits a multi-byte character decodes to a replacement character there, which shifts nothing but that character).
"""

from __future__ import annotations

from typing import Any

import torch

from recipe_dapo.advantages.steps import StepScorer, step_tensors, token_steps
from recipe_dapo.cpu.chain_task import score_response

SCORERS: dict[str, StepScorer] = {"chain_rule": score_response}
"""``dapo.objective.step_scorer`` -> its function (the names: ``recipe_dapo.advantages.STEP_SCORERS``)."""


def write_step_rewards(batch: Any, tokenizer: Any, scorer_name: str) -> dict[str, float]:
    """Replace ``batch.batch["token_level_rewards"]`` by the step rewards; returns the ``process/`` metrics."""
    scorer = SCORERS[scorer_name]
    responses = batch.batch["responses"]
    width = responses.shape[-1]
    attention = batch.batch["attention_mask"]
    prompts = batch.batch["prompts"]
    prompt_attention = attention[:, : prompts.shape[-1]].bool()
    response_lengths = attention[:, -width:].sum(-1).tolist()
    rows, steps_per_row, right = [], [], 0
    for row in range(responses.shape[0]):
        prompt = tokenizer.decode(prompts[row][prompt_attention[row]].tolist(), skip_special_tokens=False)
        pieces = [tokenizer.decode([token], skip_special_tokens=True)  # the EOS ending a response is no text
                  for token in responses[row, : int(response_lengths[row])].tolist()]
        steps = scorer(prompt, "".join(pieces))
        right += sum(reward > 0 for _, reward in steps)
        steps_per_row.append(len(steps))
        rows.append(token_steps(pieces, steps))
    rewards, _ = step_tensors(rows, width)
    target = batch.batch["token_level_rewards"]
    batch.batch["token_level_rewards"] = rewards.to(device=target.device, dtype=target.dtype)
    total = max(sum(steps_per_row), 1)
    return {
        "process/steps_per_response_mean": float(torch.tensor(steps_per_row, dtype=torch.float32).mean()),
        "process/step_right_fraction": right / total,
        "process/responses_without_step": float(sum(count == 0 for count in steps_per_row)) / max(len(rows), 1),
    }
