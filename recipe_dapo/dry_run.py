"""Dry run: compose the exact config a launch would train with and check it, without Ray, GPUs or the model.

    python -m recipe_dapo.dry_run [the same Hydra overrides as recipe_dapo.main_dapo]
    DRY_RUN=1 bash scripts/<launch script>.sh                 # what the launch scripts run in dry-run mode

It composes ``config/dapo_trainer.yaml`` exactly as the entry point does (an unknown key fails here, with a
'did you mean'), then runs the start-up rules of ``recipe_dapo.preflight`` — the same rules, in the same order, as
a real launch — with one difference: a data file or model folder absent from *this* machine is reported as "not
checked" instead of failing (cluster paths usually exist only on the cluster); one that exists is validated as
at start-up, and prompt tokens are counted only when the tokenizer is a local folder (a hub id is never fetched
here). ``DAPO_DRY_RUN_REQUIRE_FILES=1`` makes an absent file an error again.

Exit status 0 when the configuration is valid, 1 otherwise (each problem names its key and its fix).
``DAPO_DRY_RUN_PRINT_CONFIG=1`` also prints the resolved configuration as YAML, like Hydra's ``--cfg job``.
``DAPO_DRY_RUN_RULES_ONLY=1`` composes and runs tier 1 only (``preflight.check_rules``: no verl, torch or tokenizer,
about 2 s; absent inputs not checked) and prints nothing when they pass: what ``scripts/run_dapo_cpu.sh`` runs before
it builds the default model and data, so that a mistyped key or a refused setting is reported first.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe_dapo.config.compose import compose as compose_config
from recipe_dapo.main_dapo import main as run_main, release_stderr
from recipe_dapo.main_dapo import refusals_exit_cleanly
from recipe_dapo.preflight import CheckReport, check_config, check_rules
from recipe_dapo.preflight.memory_rule import plan_lines
from recipe_dapo.policy_lag import correction_line

logger = logging.getLogger(__name__)

REQUIRE_FILES_ENV = "DAPO_DRY_RUN_REQUIRE_FILES"
PRINT_CONFIG_ENV = "DAPO_DRY_RUN_PRINT_CONFIG"
RULES_ONLY_ENV = "DAPO_DRY_RUN_RULES_ONLY"

# Hydra settings of the dry run only: no outputs/ folder, no log file, no Hydra logging set-up. They go
# first on the command line, so a user's own hydra.* override still wins.
QUIET_HYDRA_OVERRIDES = (
    "hydra.output_subdir=null",
    "hydra.run.dir=.",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
)

DryRunReport = CheckReport  # what the dry run checked and what it could not check on this machine


def dry_run(config: DictConfig, require_files: bool | None = None) -> CheckReport:
    """Check ``config`` as a launch would, without Ray; raise ``DAPOConfigError`` listing every problem."""
    if require_files is None:
        require_files = os.environ.get(REQUIRE_FILES_ENV, "0") not in ("", "0", "false")
    return check_config(config, absent_inputs_ok=not require_files, dry_run=True, where="the dry run")


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The config ``python -m recipe_dapo.main_dapo <overrides>`` would train with (``recipe_dapo.config.compose``)."""
    return compose_config(overrides)


def log_report(report: CheckReport) -> None:
    for name, value in report.summary.items():
        logger.info("  %-26s %s", name, value)
    for item in report.not_checked:
        logger.warning("not checked: %s", item)
    logger.info("dry run OK: the configuration composes and passes every check%s",
                f" ({len(report.not_checked)} input(s) not checked here)" if report.not_checked else "")


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    release_stderr()  # Hydra composed the config: its stderr is no longer held (main_dapo.main)
    if os.environ.get(PRINT_CONFIG_ENV, "0") not in ("", "0", "false"):
        try:
            sys.stdout.write(OmegaConf.to_yaml(config, resolve=True))
        except Exception:  # an interpolation that does not resolve: the checks below name it
            sys.stdout.write(OmegaConf.to_yaml(config))
    if os.environ.get(RULES_ONLY_ENV, "0") not in ("", "0", "false"):
        with refusals_exit_cleanly():
            check_rules(config, CheckReport(absent_inputs_ok=True, dry_run=True))
        return
    with refusals_exit_cleanly():
        report = dry_run(config)
    log_report(report)
    logger.info("%s", correction_line(config))
    for line in plan_lines(config):  # the per-GPU memory plan (recipe_dapo.preflight.memory_plan)
        logger.info("%s", line)


if __name__ == "__main__":
    # verl warns on every need_critic() call that a GRPO run has no critic; the dry run calls it several times.
    warnings.filterwarnings("ignore", message="Disabled critic")
    logging.basicConfig(level=logging.INFO, format="[dry-run] %(levelname)s %(message)s", stream=sys.stderr)
    sys.argv[1:1] = QUIET_HYDRA_OVERRIDES
    run_main(_hydra_main)
