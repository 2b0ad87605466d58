"""The recipe's own configuration, the ``dapo:`` section, as typed dataclasses: the one home of every field's
default, docstring and check.

The Hydra config is built from these classes (``recipe_dapo.config`` stores :class:`DapoSettings` in Hydra's
ConfigStore and ``dapo_trainer.yaml`` composes it at ``dapo``), so the YAML repeats no default, a mistyped key is
refused by Hydra with a 'did you mean', and a value of the wrong type is refused at composition. verl's own
sections keep verl's dataclasses (``_target_``); ``reward.reward_kwargs`` is read by
``recipe_dapo.reward.settings.RewardSettings``. Pure: no verl, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING  # a value the size / ablation group must set

from recipe_dapo.dynamic_sampling.config import DynamicSamplingSettings


@dataclass
class OverlongFilterSettings:
    """``dapo.overlong_filter``: overlong filtering (paper section 3.4)."""

    enable: bool = False
    """Truncated responses (the whole length budget used without EOS) contribute no policy-gradient loss; they
    still count in their group's advantage baseline. Off by default, as in the paper's final recipe."""


@dataclass
class HealthSettings:
    """``dapo.health``: a run that stops learning stops."""

    max_skipped_updates: int = 3
    """Stop the run after this many steps in a row whose update verl skipped for a non-finite gradient norm (it prints
    ``grad_norm is not finite`` and zeroes the gradient); every skipped step is counted in
    ``training/skipped_updates`` and shown on its console line. 0: never stop."""
    max_steps_all_wrong: int = 2
    """Stop the run after this many steps in a row in which not one response scored (every round, before filtering)
    was right, each wrong or without an answer: the policy has stopped producing anything the reward scores (a
    checkpoint that loaded as NaN, a diverged update, ground truths the reward cannot read), and nothing qualifies to
    train on ("right": ``reward/acc_mean``, which for a user's reward function is its ``acc``, else ``score > 0``; a
    function whose scores are never positive needs 0 here). A non-finite ``actor/entropy`` stops the run at once. 0:
    never stop on wrong answers."""
    max_reward_failure_ratio: float = 0.5
    """Stop the run when more than this share of the last ``reward_failure_window`` samples a reward worker scored
    failed (a time-out, an exception, a score that is not finite in float32, a malformed ground truth: each such sample
    trains as a wrong answer, -1), naming the reward function and the share. 1: never stop."""
    reward_failure_window: int = 200
    """Samples per reward worker over which ``max_reward_failure_ratio`` is taken (judged once 50 are in)."""
    max_abandoned_reward_calls: int = 64
    """Stop the run when this many timed-out calls of a user's reward function are still running on abandoned threads
    in one reward worker (a Python thread cannot be stopped), naming the function and the share that timed out; so
    the threads a hanging function leaves are bounded. 0: no cap."""
    rollout_probe_s: float = 30.0
    """Both trainers, during every call into the rollout replicas (weight sync, abort, sleep, wake-up), and verl's v1
    trainer, when prompts are in flight and no group has come back for this many seconds: check that the agent-loop
    workers, the rollout servers and their vLLM engines are alive (again every as many seconds while it lasts); a dead
    one stops the run, naming it. A group failing with a dead engine's error stops it at once, whatever this is. 0: no
    probe."""
    max_unanswered_health_checks: int = 3
    """A vLLM engine whose health check (``GET /health``, in the ``rollout_probe_s`` probe) gets no answer this many
    times in a row (the connection refused, or no answer within 10 s) counts as dead: the run stops, naming the
    engine's address and what each check saw. An answer starts the count again. 0: never (an unanswered check is only
    logged)."""


@dataclass
class PreflightSettings:
    """``dapo.preflight``: start-up checks beyond the configuration rules."""

    check_worker_plugins: bool = True
    """Check in a Ray worker (the task runner), and in a fresh worker on every Ray node, that the recipe's verl plugins
    registered there too (``recipe_dapo/run/nodes.py``: names each node that lacks them, and the fix)."""


@dataclass
class PreemptionSettings:
    """``dapo.preemption``: what SIGTERM / SIGINT to the driver, or to its whole process group, does
    (``recipe_dapo.run.preemption``).

    During start-up the launch stops at once. During training the trainer finishes its current step, saves that
    step's checkpoint (unless saved), prints the end-of-run summary and the resume line, and the driver exits with
    ``128 + signal``; a second signal exits at once."""

    enable: bool = True
    """Install the driver's SIGTERM / SIGINT guard (``run.preemption``). ``false``: a signal acts as in verl (the
    driver dies; the last saved checkpoint stays, the end-of-run summary names it)."""

    grace_s: float = 30.0
    """Longest wait, in seconds, for the trainer to finish its step and save after the signal; then the driver exits
    without that save (the last good checkpoint is named). The default is a scheduler's usual notice (Kubernetes'
    ``terminationGracePeriodSeconds``, SLURM's ``KillWait``); keep it below your scheduler's own (SLURM
    ``--signal=TERM@<lead>``), and raise both when a step plus one checkpoint save takes longer."""


@dataclass
class CpuSettings:
    """``dapo.cpu``: settings of ``platform=cpu`` runs."""

    kv_cache_gib: Any = "auto"
    """vLLM-CPU's KV cache in GiB; ``auto`` sizes it from the run's shapes (the sequences one generation round or
    validation batch has in flight x ``max_model_len``; ``recipe_dapo.cpu.memory``)."""


@dataclass
class MemorySettings:
    """``dapo.memory``: the per-GPU memory plan (``recipe_dapo.preflight.memory_plan``), printed by a dry run and
    checked at start-up."""

    gpu_memory_gib: Optional[float] = None
    """Memory of one GPU in GiB, as torch reports it (79.2 for an 80 GB H100 or A100, 39.4 for 40 GB); the GPU launch
    scripts set their card's; null: read from this machine's GPU at start-up, and without one the plan is printed
    without headroom and the start-up check is skipped. This machine's GPU is read in a child process (no CUDA context
    in the driver); with the knob set, a smaller GPU here is named in one warning line."""
    enforce: bool = True
    """Refuse to start when a phase's planned peak exceeds the GPU, naming the phase, the term and the fix; false: a
    warning instead."""
    model_config: Optional[str] = None
    """A ``config.json`` (or its folder) for the plan when the model folder is not on this machine and is not one of
    the launch scripts' models; null: the model folder's own."""
    overhead_gib: float = 2.0
    """GiB per GPU the plan sets aside for what it does not count: CUDA contexts, NCCL buffers, allocator slack."""
    expected_prompt_tokens: Optional[int] = None
    """Mean prompt tokens of the data, for the plan's expected column beside the worst case (the start-up refuses on
    the worst case only); null: half of ``data.max_prompt_length``."""
    expected_response_tokens: Optional[int] = None
    """Mean response tokens, for the plan's expected column; null: half of ``data.max_response_length``, and no more
    than where the soft overlong punishment begins (``max_response_length - overlong_buffer_cfg.len``)."""
    kv_waves_expected: Optional[str] = None
    """Why this launch expects vLLM's KV cache to hold fewer full-length sequences than one replica runs at once: set,
    the start-up's warning about it (vLLM runs such a round in waves or preempts, slower but not a failure) is an INFO
    line that gives this reason with the plan's figures; null: the warning. The launch scripts whose shipped shape does
    so on their card set it."""


@dataclass
class ResumeSettings:
    """``dapo.resume``: what a rerun does with the checkpoint it resumes from (``recipe_dapo.run.checkpoint_guard``).

    At start-up the checkpoint's files are checked (a truncated torch file, a record that fails its CRC, NaN or inf in
    the weights or optimizer state, a missing ``dapo_state.pt``), its recorded
    shape (``rollout.n``, the batch sizes) is compared with the run's, and the free space with its size; each problem is
    refused in one line naming the file or key and the fix."""

    fallback_to_previous: bool = False
    """With ``trainer.resume_mode=auto``, when the latest checkpoint is damaged, resume from the previous complete one
    (the damaged folder is moved aside to ``global_step_<k>.damaged``); false: refuse, naming the damaged file and the
    previous complete checkpoint."""

    verify_records: bool = True
    """Read every record of the checkpoint's torch files back against its CRC-32, and check the weights and optimizer
    state for NaN or inf, before anything starts (one read of the checkpoint, on parallel threads: about 0.5 GiB/s per
    core for the weights and optimizer files); false: read only the files' indexes (a truncated file is still found,
    garbage inside one is not)."""


@dataclass
class PathsSettings:
    """``dapo.paths``: where the data and models are; the sizes and ``data.train_files`` build their paths from them."""

    data_dir: str = "data"
    """Folder of the prepared parquet files (``bash scripts/prepare_data.sh DIR``; the launcher passes ``$DATA_DIR``).
    Relative to the working directory."""
    models_dir: str = "models"
    """Folder of the Hugging Face model folders (the launcher passes ``$MODELS_DIR``)."""


@dataclass
class NameSettings:
    """``dapo.name``: the two parts of ``trainer.experiment_name`` (``<ablation>-<size>``); each size and ablation
    group sets its own."""

    size: str = MISSING
    """The size group's name (``size=``), set by that group."""
    ablation: str = MISSING
    """The ablation group's name (``ablation=``), set by that group."""


@dataclass
class ProcessRewardModelSettings:
    """``dapo.objective.prm``: the process reward model that scores each step with ``dapo.objective.step_scorer=prm``.
    The model is verl's served reward model (``reward.reward_model.*``: ``enable=true``, ``model_path``, vLLM);
    ``recipe_dapo.advantages.prm`` builds its inputs and reads its scores."""

    form: str = "classification"
    """How the model scores a step at its separator: ``classification``, a two-label token-classification head (the
    probability of label ``good_label``; Qwen2.5-Math-PRM), or ``token``, a language-model head (the probability of
    ``good_token`` against ``bad_token``; Math-Shepherd)."""
    separator: str = "<extra_0>"
    """Inserted after every step; the model scores the step at this token, which must be one token of the model's
    tokenizer (Qwen2.5-Math-PRM: ``<extra_0>``; Math-Shepherd: ``ки``)."""
    step_delimiter: str = "\\n"
    """Where a response is cut into steps, written with escapes (``\\n``: a line break): each non-blank piece between
    two delimiters is a step (the chain scorer's lines; Qwen2.5-Math-PRM's card cuts on a blank line, ``\\n\\n``)."""
    chat_template: bool = True
    """Build the model's input with its tokenizer's chat template (the question as the user's message, the steps,
    each followed by the separator, as the assistant's); false: ``question``, a newline, then each step followed by
    the separator and a newline."""
    system_prompt: Optional[str] = None
    """With ``chat_template``: a system message first (Qwen2.5-Math-PRM's card: ``Please reason step by step, and put
    your final answer within \\boxed{}.``); null: none."""
    good_label: int = 1
    """``form=classification``: the label whose probability is a step's reward."""
    good_token: str = "+"
    """``form=token``: the token whose probability (against ``bad_token``) is a step's reward."""
    bad_token: str = "-"
    """``form=token``: the other token of the pair."""
    max_length: Optional[int] = None
    """Tokens of a model input at most (null: no cut); a longer input is cut at its end and the steps whose separator
    was cut get no reward."""
    batch_size: int = 64
    """Responses per request to the served model."""
    timeout_s: float = 300.0
    """Seconds one request to the served model may take before the step fails the run."""


@dataclass
class ObjectiveSettings:
    """``dapo.objective``: what a policy objective needs beyond verl's keys (the ``objective=`` group sets those)."""

    step_scorer: str = "chain_rule"
    """With ``algorithm.adv_estimator=grpo_process``: how each reasoning step is scored (one reward per step at its
    last token, ``recipe_dapo.advantages.steps``). ``chain_rule``: the CPU task's chain arithmetic, each line's
    operation checked (+1 right, -1 wrong). ``prm``: a process reward model served as verl's reward model
    (``reward.reward_model.*``), the probability that each step is good (``dapo.objective.prm``)."""
    prm: ProcessRewardModelSettings = field(default_factory=ProcessRewardModelSettings)
    """The process reward model of ``step_scorer=prm``."""
    reference_reset_every: int = 0
    """Iterative RL: at the end of every N-th step the reference model of the KL term takes the current policy's
    weights (0: never). Needs the KL in the loss or the reward, without LoRA (``recipe_dapo.loss.reference_reset``)."""


@dataclass
class DapoSettings:
    """The ``dapo:`` section of the run config."""

    seeded_rollouts: bool = False
    """Sample every training response with its own seed from (``actor_rollout_ref.rollout.seed``, step, round), and
    every validation response with one from (that seed, validation batch), the same at each validation, so that a
    fixed-seed run repeats, validation figures included (classic trainer;
    ``recipe_dapo.trainers.classic.rollout_seeds``; ``platform=cpu`` turns it on)."""

    behaviour_correction: str = "auto"
    """Weigh every trained token by the policy that actually generated it (verl's rollout correction: truncated
    importance weights ``min(pi_old / pi_rollout, 2)`` per token, from the rollout engine's own log-probs). ``auto``:
    wherever rows generated by an older policy can be trained (``dynamic_sampling.max_staleness`` > 0, verl v1's
    ``colocate_async``); ``on``: always (it also corrects the engine's numeric mismatch on fresh rows); ``off``: never.
    An explicit ``algorithm.rollout_correction.rollout_is`` wins (``recipe_dapo.policy_lag.correction``)."""

    overlong_filter: OverlongFilterSettings = field(default_factory=OverlongFilterSettings)
    dynamic_sampling: DynamicSamplingSettings = field(default_factory=DynamicSamplingSettings)
    """Dynamic sampling beyond the paper; verl's ``algorithm.filter_groups`` holds enable / metric / budget."""
    health: HealthSettings = field(default_factory=HealthSettings)
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    resume: ResumeSettings = field(default_factory=ResumeSettings)
    cpu: CpuSettings = field(default_factory=CpuSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    paths: PathsSettings = field(default_factory=PathsSettings)
    name: NameSettings = field(default_factory=NameSettings)
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
