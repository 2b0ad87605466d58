"""The one rule set (``recipe_dapo.preflight``): the same refusals at start-up and in a dry run, every problem at
once, fast (no verl import for the recipe's own rules), no traceback, and a 'did you mean' for mistyped keys."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, compose_recipe_config, small_run


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from recipe_dapo.cpu.assets import tokenizer_as_verl_loads_it, write_dataset

    folder = tmp_path_factory.mktemp("data")
    train, val = write_dataset(folder, num_train=16, num_val=4, seed=0)
    (folder / "model").mkdir()
    tokenizer_as_verl_loads_it(folder / "model", None, train)  # the tokenizer the prompt-length rule counts with
    return [f"data.train_files={train}", f"data.val_files={val}", f"actor_rollout_ref.model.path={folder / 'model'}"]


def refusal(overrides, **kwargs) -> str:
    from recipe_dapo.preflight import DAPOConfigError, check_config

    with pytest.raises(DAPOConfigError) as refused:
        check_config(compose_recipe_config(overrides), **kwargs)
    return str(refused.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        # Mistakes once accepted somewhere: each must be refused by the one rule set.
        ("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode=separate_async"),
        ("trainer.v1.sampler.max_off_policy_strategy=wait", "it does not hold a step back"),
        ("trainer.v1.sampler.custom_sampler.name=ReplayBuffer", "the recipe's v1 trainer samples with"),
        ("actor_rollout_ref.actor.clip_ratio_high=0.1", "did you swap them?"),
        ("actor_rollout_ref.actor.clip_ratio_low=0", "clip_ratio_low=0 must lie in (0, 1)"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=8", "ppo_mini_batch_size=8 is larger than data.train_batch_size=4"),
        ("+custom_reward_function.path=/my/reward.py", "set reward.custom_reward_function.path instead"),
        ("algorithm.filter_groups.metric=nope", "algorithm.filter_groups.metric='nope'"),
        ("dapo.dynamic_sampling.max_empty_rounds=0", "max_empty_rounds must be >= 1"),
        ("dapo.preemption.grace_s=0", "dapo.preemption.grace_s=0.0: the driver waits"),
    ],
)
def test_each_mistake_is_refused_with_its_key_and_fix(data, override, expected):
    v1 = ["trainer.use_v1=true"] if override.startswith("trainer.v1") else []
    if "max_off_policy_strategy" in override:
        v1.append("trainer.v1.trainer_mode=colocate_async")
    message = refusal(small_run(data, *v1, override))
    assert expected in message


def test_v1_trainer_in_sync_and_colocate_async_modes_passes_and_the_log_says_which_trainer(data):
    from recipe_dapo.preflight import check_config
    from recipe_dapo.trainers.table import trainer_for

    config = compose_recipe_config(small_run(data, "trainer.use_v1=true"))
    check_config(config)
    assert "recipe_dapo.trainers.v1.trainer.DAPOTrainerV1 (trainer.use_v1=true, trainer_mode=sync)" in (
        trainer_for(config).log_line())
    async_config = compose_recipe_config(small_run(data, "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"))
    check_config(async_config)
    assert "DAPOTrainerV1ColocateAsync" in trainer_for(async_config).log_line()
    assert "RayDAPOTrainer (trainer.use_v1=false" in trainer_for(compose_recipe_config(small_run(data))).log_line()
    for seq_final in ("algorithm.filter_groups.metric=seq_final_reward",):
        assert "judged before the KL" in refusal(small_run(data, "trainer.use_v1=true", seq_final))
    assert "nothing would be skipped" in refusal(
        small_run(data, "trainer.use_v1=true", "dapo.dynamic_sampling.skip.enable=true")
    )


def test_a_kl_to_the_reference_model_is_refused_on_cpu_before_anything_starts(data):
    """verl 0.9.1 cannot build the reference model on CPU (pinned-memory offload of a forward-only model); without this
    rule the run fails after its whole start-up. Positive control: the same preset without the KL passes."""
    from recipe_dapo.preflight.cluster import rule_cpu_reference_model

    cpu = ["platform=cpu", "objective=grpo"]
    message = refusal(small_run(data, *cpu))
    assert "actor_rollout_ref.actor.use_kl_loss=true on CPU" in message and "use_kl_loss=false" in message
    assert "algorithm.use_kl_in_reward=true on CPU" in refusal(small_run(data, "platform=cpu",
                                                                         "algorithm.use_kl_in_reward=true"))
    kl_free = compose_recipe_config(small_run(data, *cpu, "actor_rollout_ref.actor.use_kl_loss=false",
                                              "actor_rollout_ref.actor.kl_loss_coef=0"))
    assert list(rule_cpu_reference_model(kl_free, None)) == []
    assert list(rule_cpu_reference_model(compose_recipe_config(small_run(data, "objective=grpo")), None)) == []  # GPU


def test_one_round_runs_on_v1_colocate_async_only_and_says_what_to_add_elsewhere(data):
    """Positive control first: the mode passes where it can run (partial rollout), then each trainer that cannot is
    refused naming the two overrides, and a verl off-policy threshold that would drop what the bound keeps."""
    from recipe_dapo.preflight import check_config

    one_round = "dapo.dynamic_sampling.one_round=true"
    check_config(compose_recipe_config(small_run(data, "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async",
                                                 one_round)))
    classic = refusal(small_run(data, one_round))
    assert "on the classic trainer" in classic and "trainer.use_v1=true trainer.v1.trainer_mode=colocate_async" in classic
    assert "trainer.v1.trainer_mode=sync" in refusal(small_run(data, "trainer.use_v1=true", one_round))
    tight = refusal(small_run(data, "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async", one_round,
                              "trainer.v1.sampler.max_off_policy_threshold=1"))
    assert "Set trainer.v1.sampler.max_off_policy_threshold=2" in tight
    assert "max_staleness=0" in refusal(small_run(data, "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async",
                                                  one_round, "dapo.dynamic_sampling.max_staleness=0"))


@pytest.mark.parametrize("metric", ["reward", "seq_reward", "seq_final_reward", "overlong_reward"])
def test_filtering_on_a_score_the_overlong_punishment_shapes_is_refused_in_one_line_naming_the_fix(data, metric):
    """With the punishment on (the recipe's default), all-correct groups differing only in length have a spread on
    these metrics. Positive control: the same metric passes with the punishment off, or with the explicit knob, and
    ``acc`` (the recipe's default) passes with the punishment on, so the rule keys on exactly the combination."""
    from recipe_dapo.preflight import check_config

    message = refusal(small_run(data, f"algorithm.filter_groups.metric={metric}"))
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1, message
    assert f"algorithm.filter_groups.metric={metric} filters on the score shaped by the overlong punishment" in problems[0]
    assert "set algorithm.filter_groups.metric=acc" in problems[0]
    assert "dapo.dynamic_sampling.allow_shaped_filter_metric=true" in problems[0]
    for allowed in ("reward.reward_kwargs.overlong_buffer_cfg.enable=false",
                    "dapo.dynamic_sampling.allow_shaped_filter_metric=true"):
        config = compose_recipe_config(small_run(data, f"algorithm.filter_groups.metric={metric}", allowed))
        assert check_config(config).summary["dynamic sampling"] is True
    assert check_config(compose_recipe_config(small_run(data))).summary["dynamic sampling"] is True


def test_the_shaped_metric_refusal_is_a_recipe_rule_that_runs_before_verl_is_imported():
    """The rule needs only the composed config: tier 1 (``check_rules``), so a dry run refuses it in seconds."""
    from recipe_dapo.preflight import DAPOConfigError, check_rules

    config = compose_recipe_config(["algorithm.filter_groups.metric=reward", "dapo.paths.data_dir=/nowhere"])
    with pytest.raises(DAPOConfigError, match="algorithm.filter_groups.metric=reward filters on the score shaped"):
        check_rules(config)


def test_every_problem_of_the_recipes_rules_is_listed_once_in_one_refusal(data):
    message = refusal(
        small_run(
            data,
            "actor_rollout_ref.actor.clip_ratio_low=0.3",
            "actor_rollout_ref.actor.clip_ratio_high=0.1",
            "data.gen_batch_size=2",
            "algorithm.filter_groups.metric=nope",
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=separate_async",
        )
    )
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == 4 and len(set(problems)) == 4, message
    for key in ("clip_ratio_high=0.1", "data.gen_batch_size=2", "metric='nope'", "trainer_mode=separate_async"):
        assert key in message


def test_a_dry_run_differs_from_a_start_up_only_in_absent_input_files(data):
    from recipe_dapo.preflight import check_config

    overrides = small_run(data[1:], "data.train_files=/cluster/only/train.parquet")  # val file and model kept
    assert "does not exist" in refusal(overrides)
    report = check_config(compose_recipe_config(overrides), absent_inputs_ok=True, where="the dry run")
    assert any("/cluster/only/train.parquet" in item for item in report.not_checked)
    # Everything else is the same rule: a bad value is refused in both.
    assert "did you swap" in refusal(overrides + ["actor_rollout_ref.actor.clip_ratio_high=0.1"], absent_inputs_ok=True)


REFUSE_WITHOUT_VERL = r"""
import sys
from conftest import compose_recipe_config
from recipe_dapo.preflight import DAPOConfigError, check_config
try:
    check_config(compose_recipe_config(sys.argv[1:]))
except DAPOConfigError as error:
    print("REFUSED", "verl" in sys.modules, "torch" in sys.modules, "ray" in sys.modules)
"""


def test_the_recipes_rules_refuse_before_verl_torch_or_ray_are_imported(data):
    result = subprocess.run(
        [sys.executable, "-c", REFUSE_WITHOUT_VERL, *small_run(data, "actor_rollout_ref.actor.clip_ratio_high=0.1")],
        cwd=REPO_ROOT / "tests", capture_output=True, text=True, timeout=300,
    )
    assert result.stdout.strip().splitlines()[-1] == "REFUSED False False False", result.stdout + result.stderr


def test_the_entry_point_refuses_with_a_list_exit_status_1_and_no_traceback(data, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recipe_dapo.main_dapo", *small_run(data, "actor_rollout_ref.actor.ppo_mini_batch_size=8")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert result.returncode == 1
    assert "recipe_dapo refused the configuration:" in result.stderr
    assert "ppo_mini_batch_size=8" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_a_mistyped_key_gets_a_did_you_mean(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "recipe_dapo.dry_run", "algorithm.filter_groups.metrc=acc", "platform=cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},  # this checkout's recipe, whatever the install points to
    )
    assert result.returncode == 1
    assert "did you mean algorithm.filter_groups.metric?" in result.stderr, result.stderr
    # The recipe's 'did you mean' comes first: Hydra's advice to add a '+' (a new key) follows it.
    assert result.stderr.index("did you mean") < result.stderr.index("To append to your config use +"), result.stderr


def test_the_runs_entry_point_puts_the_did_you_mean_before_hydras_advice(capsys, monkeypatch):
    """``python -m recipe_dapo.main_dapo`` (run_dapo_cpu.sh's command) through its own Hydra entry point, in this
    process; the job itself is never reached."""
    from recipe_dapo import main_dapo

    monkeypatch.setattr(sys, "argv", ["main_dapo", "platform=cpu", "trainer.total_training_stepz=2"])
    monkeypatch.setattr(main_dapo, "run", lambda config: pytest.fail("the job ran"))
    with pytest.raises(SystemExit) as stopped:
        main_dapo.main()
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.index("did you mean trainer.total_training_steps?") < err.index("To append to your config use +"), err
    assert not isinstance(sys.stderr, main_dapo._HeldStderr)


def test_unknown_override_keys_are_matched_among_their_siblings_first():
    from recipe_dapo.config.suggest import unknown_override_keys

    config = compose_recipe_config([])
    lines = unknown_override_keys(
        ["actor_rollout_ref.actor.clip_ration_low=0.1", "platform=cpu", "+new.key=1", "data.train_batch_size=8"],
        config,
        groups=["platform"],
    )
    assert len(lines) == 1
    assert "did you mean actor_rollout_ref.actor.clip_ratio_low" in lines[0]


def test_v1_without_transferqueue_installed_is_refused_with_the_install_command(data, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transfer_queue" else real_find_spec(name, *a))
    message = refusal(small_run(data, "trainer.use_v1=true"))
    assert "pip install 'transferqueue" in message


# ----------------------------------------------------------------------------- keep rules and prompt skipping


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["dapo.dynamic_sampling.keep_rule=bnad"], ["'bnad' is not a registered keep rule; did you mean 'band'?"]),
        (
            ["dapo.dynamic_sampling.keep_rule=band", "+dapo.dynamic_sampling.keep_rule_args={low:0.9,high:0.1}"],
            ["low=0.9 is above high=0.1: did you swap them?"],
        ),
        (
            ["dapo.dynamic_sampling.keep_rule=band", "+dapo.dynamic_sampling.keep_rule_args.high=1.5"],
            ["high=1.5 is outside [0, 1]"],
        ),
        (
            ["dapo.dynamic_sampling.skip.explore_min=0", "dapo.dynamic_sampling.skip.target_keep_rate=1.2"],
            ["skip.target_keep_rate must lie in (0.0, 1.0]", "skip.explore_min must lie in (0.0, 1.0]"],
        ),
        (
            ["dapo.dynamic_sampling.skip.enable=true", "algorithm.filter_groups.enable=false"],
            ["skip.enable=true needs algorithm.filter_groups.enable=true"],
        ),
    ],
)
def test_keep_rule_and_skip_mistakes_are_each_refused_with_their_key(data, overrides, expected):
    message = refusal(small_run(data, *overrides))
    for text in expected:
        assert text in message
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == len(expected), message


def test_skipping_is_accepted_on_data_whose_rows_carry_a_prompt_id(data):
    from recipe_dapo.preflight import check_config

    report = check_config(compose_recipe_config(small_run(data, "dapo.dynamic_sampling.skip.enable=true")))
    assert report.summary["keep rule / prompt skipping"] == "spread / True"


def test_skipping_is_refused_on_rows_without_a_prompt_id_or_with_one_shared_by_two_prompts(data, tmp_path):
    import pandas as pd

    train = next(o.split("=", 1)[1] for o in data if o.startswith("data.train_files="))
    rows = pd.read_parquet(train)
    no_index = rows.copy()
    no_index["extra_info"] = [{"split": "train"}] * len(rows)
    no_index.to_parquet(tmp_path / "no_index.parquet")
    # A second file numbered like the first but with its prompts rotated by one row: each id names two prompts.
    shifted = rows.copy()
    shifted["prompt"] = list(rows["prompt"][1:]) + [rows["prompt"][0]]
    shifted.to_parquet(tmp_path / "shifted.parquet")

    skip = "dapo.dynamic_sampling.skip.enable=true"
    message = refusal(small_run(data, skip, f"data.train_files={tmp_path / 'no_index.parquet'}"))
    assert f"{len(rows)} training rows have no extra_info.index" in message and "no_index.parquet row 0" in message
    both = f"data.train_files=[{train},{tmp_path / 'shifted.parquet'}]"
    message = refusal(small_run(data, skip, both))
    assert "training rows share their prompt id (data_source#extra_info.index) with a different prompt" in message
    # Copies of one problem under one id are the DAPO releases' layout, not a collision.
    from recipe_dapo.preflight import check_config

    check_config(compose_recipe_config(small_run(data, skip, f"data.train_files=[{train},{train}]")))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["trainer.use_v1=true", "trainer.v1.sampler.sync_refill_failed_groups=true"],
         "trainer.v1.sampler.sync_refill_failed_groups=True has no effect with v1.sync"),
        (["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async", "trainer.v1.separate_async.parameter_sync_step=2"],
         "trainer.v1.separate_async.parameter_sync_step=2 has no effect with v1.colocate_async"),
        (["trainer.use_v1=true", "trainer.v1.sampler.max_off_policy_threshold=2"],
         "trainer.v1.sampler.max_off_policy_threshold=2 has no effect with v1.sync"),
        (["trainer.v1.trainer_mode=colocate_async"], "trainer.v1.trainer_mode=colocate_async has no effect with classic"),
        (["trainer.v1.colocate_async.num_warmup_batches=2"], "has no effect with classic"),
        (["algorithm.filter_groups.max_inflight_gen_batches=4"], "max_inflight_gen_batches=4 has no effect with classic"),
    ],
)
def test_an_option_the_chosen_trainer_ignores_is_refused_naming_the_key(data, overrides, key):
    assert key in refusal(small_run(data, *overrides))


def test_options_the_chosen_trainer_honours_pass(data):
    from recipe_dapo.preflight import check_config

    for overrides in (["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async",
                       "trainer.v1.sampler.max_off_policy_threshold=2", "trainer.v1.colocate_async.num_warmup_batches=2"],
                      ["algorithm.filter_groups.max_num_gen_batches=3"]):
        assert check_config(compose_recipe_config(small_run(data, *overrides))).summary


def test_seeded_rollouts_on_cpu_with_chunked_prefill_are_refused_and_platform_cpu_turns_it_off(data):
    """vLLM rewinds a partly prefilled request's seeded generator with set_offset, which a CPU generator lacks: the
    DP 1 scale run crashed there ("CPU Generator does not use offset") once a round's prompts outgrew the budget."""
    from recipe_dapo.preflight import check_config

    cpu = small_run(data, "platform=cpu", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                    "dapo.cpu.kv_cache_gib=1")
    config = compose_recipe_config(cpu)
    assert config.dapo.seeded_rollouts and config.actor_rollout_ref.rollout.enable_chunked_prefill is False
    report = check_config(config)
    assert report is not None
    message = refusal([*cpu, "actor_rollout_ref.rollout.enable_chunked_prefill=true"])
    assert "enable_chunked_prefill=true with dapo.seeded_rollouts=true on CPU" in message
    assert "set actor_rollout_ref.rollout.enable_chunked_prefill=false" in message
    # Unseeded rollouts, or the v1 trainer (which does not seed them), may chunk prefills on CPU.
    for other in ("dapo.seeded_rollouts=false", "trainer.use_v1=true"):
        check_config(compose_recipe_config([*cpu, "actor_rollout_ref.rollout.enable_chunked_prefill=true", other]))


def test_a_dry_run_refuses_a_ground_truth_the_reward_cannot_read_unless_a_reward_function_of_the_users_reads_it(
        data, tmp_path):
    """A dict ground truth used to pass the dry run and stop the run only after a full start-up."""
    import pandas as pd

    from recipe_dapo.preflight import check_config

    train = next(o.split("=", 1)[1] for o in data if o.startswith("data.train_files="))
    rows = pd.read_parquet(train)
    rows["reward_model"] = [{"ground_truth": {"answer": str(rm["ground_truth"])}, "style": "rule"}
                            for rm in rows["reward_model"]]
    rows.to_parquet(tmp_path / "dict_answers.parquet")
    overrides = small_run(data, f"data.train_files={tmp_path / 'dict_answers.parquet'}")
    message = refusal(overrides, absent_inputs_ok=True, where="the dry run")
    assert "dict_answers.parquet" in message and "row 0" in message and "'reward_model.ground_truth'" in message
    assert "ground truth is a dict ({'answer': " in message
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(ground_truth['answer'] in solution_str)\n")
    check_config(compose_recipe_config(overrides + [f"reward.custom_reward_function.path={reward}"]))
