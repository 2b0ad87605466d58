"""Seeded rollouts: every training response is sampled with its own seed, derived from the run's seed.

vLLM samples with one random stream per engine, so which request draws which numbers depends on arrival order
and batching: two runs with the same config differ from the first step, and a resumed run cannot be compared
with an uninterrupted one. With ``dapo.seeded_rollouts`` the trainer gives each response of a round a seed::

    seeds = SeedSequence([actor_rollout_ref.rollout.seed, global_step, round_in_step]).generate_state(rows)

(distinct per response, so the ``n`` responses of a prompt still differ); each validation response gets one too
(:func:`validation_seeds`: the same at every validation of a run, so two validations differ by the policy and not by
the draw, and a rerun reports the same figures). The ``recipe_dapo_seeded`` agent loop
(``seeded_agent_loop``: verl's single-turn loop, in verl's agent-loop registry) passes it to vLLM as
``SamplingParams.seed``. This module is pure (numpy, and the registered name from the plugin).
On CPU this makes generation repeatable; on GPUs vLLM's numerics still depend on batch composition unless
``actor_rollout_ref.rollout.full_determinism`` is on, and per-request generators cost some sampling speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recipe_dapo.plugin import SEEDED_AGENT_LOOP as AGENT_NAME  # the plugin names what it registers

SEED_COLUMN = "rollout_seed"
SEEDABLE_AGENT_LOOPS = ("single_turn_agent",)
"""verl agent loops the seeded loop can stand in for (it is verl's single-turn loop plus the seed)."""


def round_seeds(run_seed: int, global_step: int, round_in_step: int, rows: int) -> np.ndarray:
    """One seed per response row of a round, reproducible from (run seed, step, round) and distinct per row."""
    sequence = np.random.SeedSequence([int(run_seed), int(global_step), int(round_in_step)])
    return (sequence.generate_state(rows, dtype=np.uint32) & 0x7FFFFFFF).astype(np.int64)


VALIDATION = 0x56414C
"""Marks validation seeds apart from training ones: SeedSequence pads its entropy with zeros to four words, so a
training round's ``[seed, step, round]`` is ``[seed, step, round, 0]``, and no validation batch's is."""


def validation_seeds(run_seed: int, batch_index: int, rows: int) -> np.ndarray:
    """One seed per response row of validation batch ``batch_index`` (verl's validation dataloader is not shuffled):
    the same at every validation of the run, distinct per row and from every training round's seeds."""
    sequence = np.random.SeedSequence([int(run_seed), int(batch_index), 0, VALIDATION])
    return (sequence.generate_state(rows, dtype=np.uint32) & 0x7FFFFFFF).astype(np.int64)


def with_seed(sampling_params: dict[str, Any], seed: Any) -> dict[str, Any]:
    """``sampling_params`` plus vLLM's per-request ``seed`` (unchanged when ``seed`` is None)."""
    if seed is None:
        return sampling_params
    return {**sampling_params, "seed": int(seed)}
