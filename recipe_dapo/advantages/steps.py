"""Step scorers: one reward per reasoning step, placed at the step's last token. Pure: no verl, no Ray.

A :class:`StepScorer` reads a prompt and a response as text and returns its steps as ``(index of the step's last
character in the response, reward)``, in order. :func:`step_tensors` turns the steps of a batch into the
``[batch, response_length]`` ``step_rewards`` / ``step_ends`` of
:func:`recipe_dapo.advantages.process.process_advantages`,
given each response's tokens as text (a step ends at the token that holds its last character).

The scorers (``recipe_dapo.advantages.STEP_SCORERS``; ``recipe_dapo.trainers.process_steps`` maps each name to its
function): ``chain_rule``, the CPU task's chain arithmetic, each line's operation checked
(``recipe_dapo.cpu.chain_task.score_response``), +1 right, -1 wrong; ``prm``, a process reward model, the
probability that each step is good (``recipe_dapo.advantages.prm``; it reads the question, the user's message, as
its prompt, and scores a batch of responses at once with ``score_batch``).

A step's reward must never be exactly 0: verl hands a registered estimator only ``token_level_rewards``, and
``recipe_dapo.advantages.estimator`` reads a non-zero reward as a step end.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Steps = list[tuple[int, float]]
StepScorer = Callable[[str, str], Steps]
"""``scorer(prompt_text, response_text) -> [(last character index, reward), ...]`` in order of the response."""

NONZERO = 1e-6
"""What an exactly-0 step reward becomes (a step end must carry a non-zero reward)."""

def token_steps(token_texts: Sequence[str], steps: Steps) -> list[tuple[int, float]]:
    """``(token index, reward)`` of each step: the token holding the step's last character. Steps whose last
    character lies beyond the tokens (a response cut mid-token) end at the last token; two steps ending in one token
    (a token spanning a line break) add their rewards there, nudged off 0."""
    ends: list[int] = []
    position = 0
    for text in token_texts:
        position += len(text)
        ends.append(position)  # token j holds the characters [ends[j-1], ends[j])
    out: dict[int, float] = {}
    token = 0
    for char, reward in steps:
        while token < len(ends) - 1 and ends[token] <= char:
            token += 1
        if not ends:
            break
        out[token] = out.get(token, 0.0) + float(reward)
    return [(token, reward if reward != 0.0 else NONZERO) for token, reward in sorted(out.items())]


def step_tensors(rows: Sequence[list[tuple[int, float]]], response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(step_rewards, step_ends)`` [len(rows), response_length] from each row's ``(token index, reward)`` steps."""
    rewards = torch.zeros(len(rows), response_length, dtype=torch.float32)
    for row, steps in enumerate(rows):
        for token, reward in steps:
            if not 0 <= token < response_length:
                raise ValueError(
                    f"row {row}: a step ends at token {token}, outside the response (length {response_length})"
                )
            rewards[row, token] = reward
    return rewards, rewards != 0
