"""Rules of the process reward model (``dapo.objective.step_scorer=prm``): the model verl serves as its reward model
scores each step (``recipe_dapo.advantages.prm``), so verl's reward-model keys, the objective and the platform must
agree with it; the separator and the (good, bad) tokens must each be one token of the model's tokenizer (tier 2:
it loads the tokenizer)."""

from __future__ import annotations

import os
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select

RM = "reward.reward_model"
PRM = "dapo.objective.prm"
RECIPE_REWARD_FUNCTION = "pkg://recipe_dapo.reward"
"""The recipe's verifier as verl's custom reward function (``recipe_dapo.reward.verifier.compute_score``)."""


def _prm_selected(config: DictConfig) -> bool:
    from recipe_dapo.advantages import PRM_SCORER

    return select(config, "dapo.objective.step_scorer", None) == PRM_SCORER


def rule_process_reward_model(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """``step_scorer=prm`` with verl's served reward model, the process-supervised objective, and a GPU."""
    from recipe_dapo.advantages import GRPO_PROCESS

    if not _prm_selected(config):
        return
    from recipe_dapo.advantages.prm import FORMS  # (imports torch: only for a run that asks for the PRM scorer)

    estimator = select(config, "algorithm.adv_estimator")
    if estimator != GRPO_PROCESS:
        yield (
            f"dapo.objective.step_scorer=prm with algorithm.adv_estimator={estimator}: only the process-supervised "
            f"objective reads step rewards, so the process reward model would be served for nothing; use "
            f"objective={GRPO_PROCESS}, or dapo.objective.step_scorer=chain_rule"
        )
    if str(select(config, "trainer.device", "cuda")) == "cpu":
        yield (
            "dapo.objective.step_scorer=prm on CPU (trainer.device=cpu, platform=cpu): verl serves the process "
            f"reward model ({RM}) with vLLM on GPUs; run it on a GPU machine, or use "
            "dapo.objective.step_scorer=chain_rule on CPU"
        )
    if not select(config, f"{RM}.enable", False):
        yield (
            f"dapo.objective.step_scorer=prm needs the process reward model served by verl: set {RM}.enable=true "
            f"with {RM}.model_path and {RM}.rollout.name=vllm (docs/objectives.md)"
        )
    if not select(config, f"{RM}.model_path", None):
        yield (
            f"dapo.objective.step_scorer=prm without {RM}.model_path: set it to the process reward model's folder "
            f"(e.g. Qwen2.5-Math-PRM-7B); its tokenizer builds the inputs and verl serves it"
        )
    engine = select(config, f"{RM}.rollout.name", None)
    if engine != "vllm":
        yield (
            f"dapo.objective.step_scorer=prm with {RM}.rollout.name={engine or 'unset'}: the steps are scored with "
            f"vLLM's token-level pooling (POST /pooling, task token_classify); set {RM}.rollout.name=vllm"
        )
    if select(config, f"{RM}.enable", False) and not select(config, "reward.custom_reward_function.path", None):
        yield (
            f"{RM}.enable=true without reward.custom_reward_function.path: verl 0.9.1 then scores every response "
            "with the reward model's one score per sequence (/classify) instead of the answer verifier, which a "
            "process reward model does not serve; keep the recipe's verifier for the outcome with "
            f"reward.custom_reward_function.path={RECIPE_REWARD_FUNCTION} "
            "reward.custom_reward_function.name=compute_score"
        )
    form = select(config, f"{PRM}.form", "classification")
    if form not in FORMS:
        yield f"{PRM}.form={form!r} is not one of {list(FORMS)}: classification (Qwen2.5-Math-PRM) or token"
    if not select(config, f"{PRM}.separator", None):
        yield f"{PRM}.separator is empty; set the token inserted after every step (Qwen2.5-Math-PRM: <extra_0>)"
    if not select(config, f"{PRM}.step_delimiter", None):
        yield f"{PRM}.step_delimiter is empty; set the text that ends a step (\\n: a line break)"
    if form == "token" and select(config, f"{PRM}.good_token") == select(config, f"{PRM}.bad_token"):
        yield f"{PRM}.good_token and {PRM}.bad_token are both {select(config, f'{PRM}.good_token')!r}; give two tokens"
    if form == "classification" and int(select(config, f"{PRM}.good_label", 1)) < 0:
        yield f"{PRM}.good_label={select(config, f'{PRM}.good_label')} must be a label index (0 or more)"
    if int(select(config, f"{PRM}.batch_size", 1)) < 1:
        yield f"{PRM}.batch_size={select(config, f'{PRM}.batch_size')} must be at least 1"
    max_length = select(config, f"{PRM}.max_length", None)
    if max_length is not None and int(max_length) < 2:
        yield f"{PRM}.max_length={max_length} leaves no room for a step; set null (no cut) or the model's length"
    if not float(select(config, f"{PRM}.timeout_s", 1.0)) > 0:
        yield f"{PRM}.timeout_s={select(config, f'{PRM}.timeout_s')} must be above 0"


def rule_process_reward_tokenizer(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The separator (and, for ``form=token``, the good and bad tokens) are single tokens of the model's tokenizer,
    and ``good_label`` is one of its labels (``config.json``); a model that is not a local folder is not checked."""
    if not _prm_selected(config):
        return []
    path = select(config, f"{RM}.model_path", None)
    if not path:
        return []  # refused by rule_process_reward_model
    path = os.path.expanduser(str(path))
    if not os.path.isdir(path):
        report.not_checked.append(f"{RM}.model_path: {path} (not a local folder: separator tokens not checked here)")
        return []
    from transformers import AutoTokenizer

    from recipe_dapo.advantages.prm import PRMFormat

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    except Exception as exc:  # noqa: BLE001 (the message says which folder and why)
        return [f"{RM}.model_path={path}: its tokenizer does not load ({type(exc).__name__}: {exc})"]
    try:
        fmt = PRMFormat.from_settings(select(config, PRM), tokenizer)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if fmt.form == "classification":
        labels = _label_count(path)
        if labels is not None and not fmt.good_label < labels:
            problems.append(
                f"{PRM}.good_label={fmt.good_label}, but the model at {RM}.model_path has {labels} labels "
                f"(config.json num_labels / id2label); choose one of 0..{labels - 1}"
            )
    return problems


def _label_count(path: str) -> int | None:
    import json

    try:
        with open(os.path.join(path, "config.json")) as handle:
            model_config = json.load(handle)
    except (OSError, ValueError):
        return None
    if "id2label" in model_config:
        return len(model_config["id2label"])
    return int(model_config.get("num_labels", 2))  # transformers' default, which it does not write out
