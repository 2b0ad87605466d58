"""What a run prints: one short line per step, one per validation, and a summary at the end.

verl's ``console`` backend prints every metric of a step on one line (150-300 keys, 5-17k characters,
``np.float64(...)`` reprs). :class:`RunConsole` replaces it (the full dump stays in the other backends,
the metrics file first):

    step 3/40 | acc 0.438 | keep 0.50 in 2 rounds | clip low 0.0012 high 0.0150 | len 27.3 (10.0% cut) | 41.2 s
    validation at step 4 | synthetic_arithmetic: mean@4 0.044 pass@4 0.125 (31 problems)
    run finished: steps 1-40 in 1h02m | tokens: 1.21M generated, 0.40M trained (33%)
      validation, step 4 -> step 40: synthetic_arithmetic 0.044 -> 0.210 (+0.166); best mean synthetic_arithmetic 0.230 (step 32)
      checkpoint: /work/runs/dapo_cpu/checkpoints/global_step_40
      metrics file: /work/runs/dapo_cpu/recipe_dapo/dapo_cpu.jsonl
      to train further: raise trainer.total_training_steps and rerun the same command (...)

The summary repeats no line printed just before it: the final validation's own line is left out when it was the
last step's (the change line gives its means), the best mean when it is the final one (else it ends the change line).

The fields, from the step's metrics (a field whose metric is missing is left out):

- ``acc``: ``reward/acc_mean``, accuracy of every response generated in the step, before filtering;
- ``keep ... in N rounds``: ``dynamic_sampling/keep_rate`` and ``num_gen_rounds``;
- ``clip low / high``: ``actor/pg_clipfrac_eps_low`` / ``actor/pg_clipfrac_eps_high`` (the dapo loss);
- ``stale X% (lag <= k)``, only when not zero: ``policy_lag/stale_group_frac``, the share of the trained groups an
  older policy generated, and ``policy_lag/max`` (``recipe_dapo.policy_lag``);
- ``len``: ``response_length/mean`` of the trained batch and ``response_length/clip_ratio`` (cut at the limit);
- ``s``: ``timing_s/step``.

Validation lines show, per data source, ``val/<source>/mean@k`` and the largest ``pass@j`` (the recipe's
per-problem metrics); without them (a reward manager with no ``acc``), verl's ``val-core`` means.
Tokens: ``dynamic_sampling/generated_tokens`` (every response token generated, kept or filtered) against
``training/response_tokens`` (tokens that carried loss: the trainers count them after the overlong filter). Lines go through
``logging`` (logger ``recipe_dapo.tracking.console``), which prints them on stdout with no prefix.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from recipe_dapo.dynamic_sampling.sampler import GENERATED_TOKENS, KEEP_RATE, NUM_GEN_ROUNDS
from recipe_dapo.loss.clip import CLIPFRAC, CLIPFRAC_EPS_HIGH, CLIPFRAC_EPS_LOW
from recipe_dapo.policy_lag.names import MAX_LAG, STALE_GROUP_FRAC
from recipe_dapo.reward.metrics import ACC_MEAN
from recipe_dapo.tracking.lines import RecipeLineFormatter
from recipe_dapo.tracking.metric_names import (
    RESPONSE_LENGTH_CLIP_RATIO,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_TOKENS_METRIC,
    STEP_TIME,
    UPDATE_SKIPPED,
)

LOGGER_NAME = "recipe_dapo.tracking.console"
logger = logging.getLogger(LOGGER_NAME)


def number(value: Any) -> Optional[float]:
    """A finite-or-not float from a metric value (numpy scalars, 0-d tensors); None when not a number."""
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def format_step_line(step: int, total_steps: Optional[int], metrics: Mapping[str, Any]) -> str:
    """The one line of a training step (fields in the module docstring)."""
    get = lambda key: number(metrics.get(key))  # noqa: E731
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    if get(ACC_MEAN) is not None:
        parts.append(f"acc {_fmt(get(ACC_MEAN))}")
    keep, rounds = get(KEEP_RATE), get(NUM_GEN_ROUNDS)
    if keep is not None:
        plural = "" if rounds == 1 else "s"
        parts.append(f"keep {_fmt(keep, 2)}" + (f" in {int(rounds)} round{plural}" if rounds is not None else ""))
    low, high = get(CLIPFRAC_EPS_LOW), get(CLIPFRAC_EPS_HIGH)
    if low is not None or high is not None:
        parts.append(f"clip low {_fmt(low, 4)} high {_fmt(high, 4)}")
    elif get(CLIPFRAC) is not None:
        parts.append(f"clip {_fmt(get(CLIPFRAC), 4)}")
    stale = get(STALE_GROUP_FRAC)
    if stale:  # a share of the batch an older policy generated (the behaviour-policy correction weighs it)
        parts.append(f"stale {100 * stale:.0f}% (lag <= {int(get(MAX_LAG) or 0)})")
    length, cut = get(RESPONSE_LENGTH_MEAN), get(RESPONSE_LENGTH_CLIP_RATIO)
    if length is not None:
        parts.append(f"len {length:.1f}" + (f" ({100 * cut:.1f}% cut)" if cut is not None else ""))
    if get(STEP_TIME) is not None:
        parts.append(f"{get(STEP_TIME):.1f} s")
    if get(UPDATE_SKIPPED):
        parts.append("UPDATE SKIPPED: grad_norm not finite")
    return " | ".join(parts)


def validation_headlines(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{source: {"mean@k": ..., "pass@j": ..., "problems": ...}} from a step's metrics; {} without validation."""
    result: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        prefix, _, rest = key.partition("/")
        source, _, name = rest.rpartition("/")
        if prefix == "val" and source and (name.startswith(("mean@", "pass@")) or name == "num_problems"):
            value = number(value)
            if value is not None:
                result.setdefault(source, {})[name] = value
    if result:
        for source, values in result.items():  # keep mean@k and the largest pass@j only
            passes = sorted((name for name in values if name.startswith("pass@")), key=lambda n: int(n[5:]))
            for name in passes[:-1]:
                del values[name]
        return result
    for key, value in metrics.items():  # no per-problem metrics: verl's val-core means
        parts = key.split("/")
        if parts[0] == "val-core" and len(parts) >= 4 and parts[-1].startswith("mean@") and number(value) is not None:
            result.setdefault("/".join(parts[1:-2]), {})[f"{parts[-2]} {parts[-1]}"] = number(value)
    return result


def format_validation(headlines: Mapping[str, Mapping[str, float]]) -> str:
    """``source: mean@4 0.044 pass@4 0.125 (31 problems)`` per source, joined by `` | ``."""
    sources = []
    for source, values in headlines.items():
        fields = " ".join(f"{name} {_fmt(value)}" for name, value in values.items() if name != "num_problems")
        if "num_problems" in values:
            fields += f" ({int(values['num_problems'])} problems)"
        sources.append(f"{source}: {fields}")
    return " | ".join(sources)


def _headline_value(values: Mapping[str, float]) -> Optional[float]:
    """The value 'best' is judged by: mean@k (or verl's first mean)."""
    for name, value in values.items():
        if "mean@" in name:
            return value
    return None


def _tokens(count: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= limit:
            return f"{count / limit:.2f}{suffix}"
    return f"{int(count)}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def latest_checkpoint(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The ``global_step_*`` folder verl's tracker file points to, if any (read directly: verl's finder prints
    ``Checkpoint tracker file does not exist`` when there is none yet)."""
    from recipe_dapo.tracking.checkpoint_folders import latest_checkpoint as from_tracker_file

    return from_tracker_file(checkpoint_dir)


def announce(line: str) -> None:
    """One line on the run's console (stdout, no prefix), from any process of the run (Ray forwards a worker's)."""
    _ensure_handler()
    logger.info(line)


class RunConsole:
    """The ``console`` logger backend of :class:`recipe_dapo.tracking.DAPOTracking` (module docstring)."""

    def __init__(
        self,
        total_steps: Optional[int] = None,
        checkpoint_dir: Optional[str] = None,
        metrics_file: Optional[str] = None,
        stream=None,
        resume_mode: str = "auto",
    ):
        self.total_steps = total_steps
        self.checkpoint_dir = checkpoint_dir
        self.metrics_file = metrics_file
        self.resume_mode = resume_mode
        self.started = time.monotonic()
        self.steps: list[int] = []
        self.validations: list[tuple[int, dict[str, dict[str, float]]]] = []
        self.generated_tokens = 0.0
        self.trained_tokens = 0.0
        self._finished = False
        _ensure_handler(stream)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        try:
            self._log(data, step)
        except Exception:  # the console must never stop a run; the full metrics are in the other backends
            logger.exception("console: could not summarise the metrics of step %s", step)

    def _log(self, data: Mapping[str, Any], step: int) -> None:
        if any(key.startswith(("training/", "actor/", "dynamic_sampling/")) for key in data):
            self.steps.append(step)
            logger.info(format_step_line(step, self.total_steps, data))
            self.generated_tokens += number(data.get(GENERATED_TOKENS)) or 0.0
            self.trained_tokens += number(data.get(RESPONSE_TOKENS_METRIC)) or 0.0  # counted after the overlong filter
        headlines = validation_headlines(data)
        if headlines:
            self.validations.append((step, headlines))
            logger.info("validation at step %d | %s", step, format_validation(headlines))

    def summary_lines(self, outcome: Optional[str] = None) -> list[str]:
        """The end-of-run summary; ``outcome`` says how the run ended ("finished" when None: every step trained)."""
        if not self.steps:
            steps = "no training step"
        elif min(self.steps) == max(self.steps):
            steps = f"step {self.steps[0]}"
        else:
            steps = f"steps {min(self.steps)}-{max(self.steps)}"
        head = f"run {outcome or 'finished'}: {steps} in {_duration(time.monotonic() - self.started)}"
        if self.generated_tokens:
            share = f" ({100 * self.trained_tokens / self.generated_tokens:.0f}%)"
            generated, trained = _tokens(self.generated_tokens), _tokens(self.trained_tokens)
            head += f" | tokens: {generated} generated, {trained} trained{share}"
        lines = [head]
        if self.validations:
            step, final = self.validations[-1]
            moved = validation_change(self.validations[0], self.validations[-1])
            just_printed = self.steps and step == self.steps[-1]  # its own line came right before the summary
            if not (moved and just_printed):
                lines.append(f"  validation, final (step {step}): " + format_validation(final))
            best = []
            for source in final:
                scored = [(_headline_value(v[source]), s) for s, v in self.validations if source in v]
                scored = [(value, s) for value, s in scored if value is not None]
                if scored:
                    value, at = max(scored, key=lambda pair: pair[0])
                    if at != step:  # the best is not the final one (which the lines above give)
                        best.append(f"{source} {_fmt(value)} (step {at})")
            if moved and best:
                lines.append(f"{moved}; best mean " + ", ".join(best))
            elif moved or best:
                lines.append(moved or "  validation, best mean: " + ", ".join(best))
        else:
            lines.append("  validation: none in this process (trainer.test_freq)")
        checkpoint = latest_checkpoint(self.checkpoint_dir)
        lines.append(f"  checkpoint: {checkpoint or 'none saved (trainer.save_freq)'}")
        lines.append(f"  metrics file: {self.metrics_file or 'none (add file to trainer.logger)'}")
        lines.append("  " + resume_advice(checkpoint, self.resume_mode, completed=outcome is None))
        return lines

    def finish(self, outcome: Optional[str] = None) -> None:
        if self._finished:
            return
        self._finished = True
        for line in self.summary_lines(outcome):
            logger.info(line)

    @property
    def summary_printed(self) -> bool:
        """The end-of-run summary was printed (the driver then prints none: ``run.run_end``)."""
        return self._finished


def validation_change(first: tuple[int, Mapping[str, Mapping[str, float]]],
                      last: tuple[int, Mapping[str, Mapping[str, float]]]) -> Optional[str]:
    """The summary's line of what training changed: each source's mean from the run's first validation (before
    training when ``trainer.val_before_train``) to its last; None with fewer than two validations."""
    (first_step, before), (last_step, after) = first, last
    if first_step == last_step:
        return None
    moved = []
    for source, values in after.items():
        old, new = _headline_value(before.get(source, {})), _headline_value(values)
        if old is not None and new is not None:
            moved.append(f"{source} {_fmt(old)} -> {_fmt(new)} ({new - old:+.3f})")
    if not moved:
        return None
    when = "before training" if first_step == 0 else f"step {first_step}"
    return f"  validation, {when} -> step {last_step}: " + ", ".join(moved)


def resume_advice(checkpoint: Optional[str], resume_mode: str = "auto", completed: bool = False) -> str:
    """The summary's last line: the command that continues from ``checkpoint`` (verl's ``trainer.resume_mode``)."""
    if checkpoint is None:
        return "to resume: no checkpoint saved, a rerun starts from step 0 (trainer.save_freq sets how often to save)"
    if resume_mode == "resume_path":
        how = f"rerun with trainer.resume_from_path={checkpoint}"
    elif resume_mode == "auto":
        how = "rerun the same command (trainer.resume_mode=auto continues from it)"
    else:
        how = f"rerun with trainer.resume_mode=auto (trainer.resume_mode={resume_mode} starts over)"
    if completed:
        return f"to train further: raise trainer.total_training_steps and {how}"
    return f"to resume: {how}"


def _ensure_handler(stream=None) -> None:
    """Console lines on stdout, message only, whatever the root logger's level (verl sets WARNING)."""
    if not any(getattr(handler, "_recipe_dapo_console", False) for handler in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stdout)
        handler.setFormatter(RecipeLineFormatter())  # marked for the driver's console router (tracking/noise.py)
        handler._recipe_dapo_console = True
        logger.addHandler(handler)
    elif stream is not None:
        for handler in logger.handlers:
            if getattr(handler, "_recipe_dapo_console", False):
                handler.setStream(stream)
    logger.setLevel(logging.INFO)
    logger.propagate = False


__all__ = ["RunConsole", "announce", "format_step_line", "format_validation", "resume_advice", "validation_headlines"]


def run_summary(config: DictConfig) -> dict[str, object]:
    """The handful of values that say what the run will do."""

    def get(key: str):
        return OmegaConf.select(config, key)

    actor = "actor_rollout_ref.actor"
    summary = {
        "GPUs": f"{get('trainer.nnodes')} nodes x {get('trainer.n_gpus_per_node')}",
        "model": get("actor_rollout_ref.model.path"),
        "train / gen prompts": f"{get('data.train_batch_size')} / {get('data.gen_batch_size')}",
        "responses per prompt": get("actor_rollout_ref.rollout.n"),
        "mini-batch prompts": get(f"{actor}.ppo_mini_batch_size"),
        "prompt / response tokens": f"{get('data.max_prompt_length')} / {get('data.max_response_length')}",
        "loss": f"{get(f'{actor}.policy_loss.loss_mode')}, {get(f'{actor}.loss_agg_mode')}, "
        f"clip {get(f'{actor}.clip_ratio_low')} / {get(f'{actor}.clip_ratio_high')}",
        "dynamic sampling": f"{get('algorithm.filter_groups.enable')} (one round per step)"
        if get("dapo.dynamic_sampling.one_round") else get("algorithm.filter_groups.enable"),
        "keep rule / prompt skipping": f"{get('dapo.dynamic_sampling.keep_rule')} / "
        f"{get('dapo.dynamic_sampling.skip.enable')}",
        "overlong buffer": get("reward.reward_kwargs.overlong_buffer_cfg.enable"),
        "sequence / tensor parallel": f"{get(f'{actor}.ulysses_sequence_parallel_size')} / "
        f"{get('actor_rollout_ref.rollout.tensor_model_parallel_size')}",
    }
    kv_cache = get("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes")
    if get("trainer.device") == "cpu" and kv_cache:  # sized by recipe_dapo.cpu.memory (dapo.cpu.kv_cache_gib)
        summary["vLLM-CPU KV cache"] = f"{int(kv_cache) / 2 ** 30:.3f} GiB"
    return summary
