"""The start-up rules: every check a configuration must pass before anything heavy starts, grouped by the section
they check (``versions``: the installed verl, ``cluster``, ``inputs``, ``algorithm``, ``process_reward``: the process
reward model of ``step_scorer=prm``, ``sampling``, ``reward``,
``trainers``, ``checkpoints``: the checkpoint a run resumes from, ``memory_rule``: the per-GPU memory plan, and
``verl``: the rules that need verl imported).

A real start-up (``python -m recipe_dapo.main_dapo``) and a dry run (``DRY_RUN=1`` / ``python -m
recipe_dapo.dry_run``) call the same :func:`check_config`. The only difference is what happens to an input file
absent from this machine: an error at start-up, "not checked" in a dry run (cluster paths often exist only on
the cluster). Every problem is listed at once with its key and its fix, and the entry points print the list and
exit with status 1, without a traceback.

The rules run in two tiers:

1. :data:`RULES`: they need only OmegaConf and pyarrow, so a mistake here is reported in a few seconds, before
   verl, torch or vLLM are imported (and before the default CPU run builds its assets).
2. :data:`VERL_RULES`, only when tier 1 passed: the registries, verl's worker dataclasses and its own
   ``validate_config``, and the prompt lengths counted with the model's tokenizer (transformers).

A new rule is a function ``rule(config, report) -> iterable of problem strings`` in its section's module, listed in
one of the tuples below.

Beside the rules, :mod:`recipe_dapo.preflight.install` checks an installed environment rather than a configuration
(``python -m recipe_dapo.preflight.install``: verl's version, vLLM, transformers, the accelerator, the plugins).
"""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from recipe_dapo.preflight.algorithm import rule_algorithm, rule_behaviour_correction, rule_clip, rule_objective
from recipe_dapo.preflight.base import CheckReport, DAPOConfigError, Rule
from recipe_dapo.preflight.checkpoints import rule_checkpoint_resume
from recipe_dapo.preflight.cluster import rule_batch_sizes, rule_cluster_shape, rule_cpu_memory, \
    rule_cpu_reference_model, rule_cpu_seeded_prefill
from recipe_dapo.preflight.inputs import rule_data_files, rule_model_path, rule_prompt_lengths
from recipe_dapo.preflight.memory_rule import rule_memory_plan
from recipe_dapo.preflight.process_reward import rule_process_reward_model, rule_process_reward_tokenizer
from recipe_dapo.preflight.reward import rule_legacy_keys, rule_reward
from recipe_dapo.preflight.sampling import rule_dynamic_sampling, rule_filter_metric, rule_prompt_keys
from recipe_dapo.preflight.trainers import rule_ignored_options, rule_one_round, rule_preemption, rule_trainer, \
    rule_v1_installed
from recipe_dapo.preflight.verl import rule_registries, rule_verl_configs
from recipe_dapo.preflight.versions import rule_verl_version

__all__ = ["CheckReport", "DAPOConfigError", "RULES", "VERL_RULES", "check_config"]

RULES: tuple[Rule, ...] = (
    rule_verl_version,
    rule_trainer,
    rule_one_round,
    rule_ignored_options,
    rule_preemption,
    rule_algorithm,
    rule_batch_sizes,
    rule_clip,
    rule_objective,
    rule_process_reward_model,
    rule_behaviour_correction,
    rule_dynamic_sampling,
    rule_filter_metric,
    rule_reward,
    rule_legacy_keys,
    rule_cluster_shape,
    rule_data_files,
    rule_prompt_keys,
    rule_model_path,
    rule_cpu_memory,
    rule_cpu_reference_model,
    rule_cpu_seeded_prefill,
    rule_checkpoint_resume,
    rule_memory_plan,
)
VERL_RULES: tuple[Rule, ...] = (rule_registries, rule_v1_installed, rule_verl_configs, rule_prompt_lengths,
                                rule_process_reward_tokenizer)


def check_config(
    config: DictConfig, *, absent_inputs_ok: bool = False, dry_run: bool = False, where: str = "the driver"
) -> CheckReport:
    """Run every rule; raise :class:`DAPOConfigError` listing every problem found.

    Tier 1 runs first and needs no verl import; tier 2 (with verl) runs only when tier 1 passed. Before tier 2 the
    process settles its platform (``platform=cpu`` pins the CPU platform) and checks that the plugins registered.
    """
    report = CheckReport(absent_inputs_ok=absent_inputs_ok, dry_run=dry_run)
    resolved = _resolved(config)  # once for both tiers (resolving verl's whole config is most of a check's time)
    _raise_if_any(_run(RULES, resolved, report))

    from recipe_dapo.cpu.device import use_configured_device
    from recipe_dapo.plugin import check_plugins_registered
    from recipe_dapo.tracking.console import run_summary

    use_configured_device(config)
    check_plugins_registered(where=where)
    _raise_if_any(_run(VERL_RULES, resolved, report))
    report.summary = run_summary(resolved)
    return report


def check_rules(config: DictConfig, report: CheckReport | None = None) -> CheckReport:
    """Tier 1 alone (no verl import): what the entry point checks before it builds or downloads anything."""
    report = report or CheckReport()
    _raise_if_any(_run(RULES, _resolved(config), report))
    return report


def _resolved(config: DictConfig) -> DictConfig:
    try:
        # The task runner resolves the whole config; a broken interpolation should fail here, not there.
        return OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    except Exception as exc:
        raise DAPOConfigError([f"an interpolation does not resolve: {exc}"]) from None


def _run(rules: Sequence[Rule], config: DictConfig, report: CheckReport) -> list[str]:
    problems: list[str] = []
    for rule in rules:
        for problem in rule(config, report) or ():
            if problem not in problems:
                problems.append(problem)
    return problems


def _raise_if_any(problems: list[str]) -> None:
    if problems:
        raise DAPOConfigError(problems)
