"""The recipe's Hydra config composes verl's real ppo_trainer, its groups (size, ablation, sampling) compose in every
combination and mean what they say, and start-up checks refuse bad settings by key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import recipe_dapo.config
from recipe_dapo.preflight import DAPOConfigError, check_config
from conftest import REPO_ROOT, compose_recipe_config, ray_runtime_env_as_verl_builds_it, small_run


@pytest.fixture(scope="module")
def data_files(default_assets):
    # The model path too: the start-up check counts prompt tokens with the model's tokenizer.
    return [
        f"data.train_files={default_assets['train_file']}",
        f"data.val_files={default_assets['val_file']}",
        f"actor_rollout_ref.model.path={default_assets['model_path']}",
    ]


def test_config_composes_verl_ppo_trainer_with_dapo_defaults():
    config = compose_recipe_config()
    # verl's own sections are there (composed from the installed package, not copied).
    assert config.actor_rollout_ref.actor._target_ == "verl.workers.config.FSDPActorConfig"
    assert config.algorithm.filter_groups._target_ == "verl.trainer.config.FilterGroupsConfig"
    # The paper's algorithm settings (section 4.1).
    assert config.algorithm.adv_estimator == "grpo"
    assert config.algorithm.use_kl_in_reward is False and config.actor_rollout_ref.actor.use_kl_loss is False
    actor = config.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert actor.loss_agg_mode == "token-mean" and actor.policy_loss.loss_mode == "dapo"
    assert config.algorithm.filter_groups.enable and config.algorithm.filter_groups.metric == "acc"
    assert config.algorithm.filter_groups.max_num_gen_batches == 10
    assert config.reward.reward_manager.name == "recipe_dapo"
    assert config.reward.reward_kwargs.overlong_buffer_cfg.enable and config.reward.reward_kwargs.overlong_buffer_cfg.len == 4096
    # max_resp_len follows data.max_response_length (20,480 = 16,384 + 4,096 in the paper).
    assert OmegaConf.to_container(config, resolve=True)["reward"]["reward_kwargs"]["max_resp_len"] == 20480
    assert config.trainer.use_v1 is False


def test_cpu_platform_overlay_sets_what_vllm_cpu_and_fsdp2_need():
    config = compose_recipe_config(["platform=cpu"])
    assert config.trainer.device == "cpu"
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert config.ray_kwargs.ray_init.num_gpus == 1
    # The overlay leaves the algorithm alone.
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "dapo"


def test_cpu_overlay_gives_transfer_queue_one_storage_unit_per_node():
    # Each unit is a Ray actor process; verl's 8 stay on accelerator machines.
    def units(overrides):
        config = OmegaConf.to_container(compose_recipe_config(overrides), resolve=True)
        return config["transfer_queue"]["backend"]["SimpleStorage"]["num_data_storage_units"]

    assert units([]) == 8
    assert units(["platform=cpu"]) == 1
    assert units(["platform=cpu", "trainer.nnodes=2"]) == 2


def test_cpu_overlay_pins_the_cpu_platform_in_every_ray_worker():
    env_vars = ray_runtime_env_as_verl_builds_it(compose_recipe_config(["platform=cpu"]))["env_vars"]
    assert env_vars["VERL_PLATFORM"] == "cpu"
    # Merged into verl's defaults, not replacing them.
    assert "TOKENIZERS_PARALLELISM" in env_vars
    # Accelerator machines keep verl's own platform detection.
    assert "VERL_PLATFORM" not in ray_runtime_env_as_verl_builds_it(compose_recipe_config([])).get("env_vars", {})


def test_verl_rollout_dataclass_accepts_the_cpu_overlay():
    from verl.utils.config import omega_conf_to_dataclass

    config = compose_recipe_config(["platform=cpu"])
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.enable_sleep_mode is False and rollout.enforce_eager is True


def test_valid_small_configuration_passes_every_start_up_check(data_files):
    report = check_config(compose_recipe_config(small_run(data_files)))
    assert report.summary["responses per prompt"] == 8 and report.summary["dynamic sampling"] is True
    assert report.summary["loss"].startswith("dapo, token-mean")


@pytest.mark.parametrize(
    ("override", "named_key"),
    [
        ("algorithm.filter_groups.metric=nope", "algorithm.filter_groups.metric"),
        ("algorithm.filter_groups.metric=pred", "algorithm.filter_groups.metric"),
        ("reward.reward_kwargs.overlong_buffer_cfg.len=32", "overlong_buffer_cfg.len"),
        ("data.gen_batch_size=2", "data.gen_batch_size"),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=missing_loss", "policy_loss.loss_mode"),
        ("reward.reward_manager.name=missing_manager", "reward.reward_manager.name"),
        ("actor_rollout_ref.rollout.n=1", "rollout.n"),
        ("+dapo.dynamic_sampling.max_stalenes=2", "dapo.dynamic_sampling.max_stalenes"),  # '+' forces it in
        ("dapo.dynamic_sampling.on_exhausted=crash", "dapo.dynamic_sampling.on_exhausted"),
        ("actor_rollout_ref.actor.clip_ratio_c=0.5", "clip_ratio_c"),
        ("data.train_files=/nonexistent/train.parquet", "data.train_files"),
    ],
)
def test_wrong_override_is_refused_naming_the_key(data_files, override, named_key):
    config = compose_recipe_config(small_run(data_files, override))
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    assert named_key in str(refused.value)


def test_every_problem_is_reported_at_once(data_files):
    config = compose_recipe_config(
        small_run(data_files, "algorithm.filter_groups.metric=nope", "data.gen_batch_size=2")
    )
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert "algorithm.filter_groups.metric" in message and "data.gen_batch_size" in message


def test_bad_data_row_is_refused_with_file_row_and_field(tmp_path, data_files):
    import pandas as pd

    from recipe_dapo.cpu.assets import synthetic_rows

    rows = synthetic_rows(3, "train", seed=0)
    rows[1]["reward_model"] = {"ground_truth": "", "style": "rule"}
    bad = tmp_path / "bad.parquet"
    pd.DataFrame(rows).to_parquet(bad)
    config = compose_recipe_config(small_run(data_files, f"data.train_files={bad}"))
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert str(bad) in message and "row 1" in message and "ground_truth" in message


def test_the_dapo_section_is_typed_so_a_mistyped_key_or_a_wrong_type_fails_at_composition():
    """dapo: is built from recipe_dapo.config.settings: Hydra refuses unknown keys and values of the wrong type."""
    from hydra.errors import ConfigCompositionException

    for override, named in (
        ("dapo.dynamic_sampling.max_stalenes=2", "max_stalenes"),
        ("dapo.dynamic_sampling.safety_margin=lots", "safety_margin"),
    ):
        with pytest.raises(ConfigCompositionException) as refused:
            compose_recipe_config([override])
        assert named in str(refused.value) + str(refused.value.__cause__)


def test_the_dapo_sections_defaults_are_the_dataclass_defaults_and_nowhere_else():
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from recipe_dapo.config.settings import DapoSettings

    composed, defaults = OmegaConf.to_container(compose_recipe_config([]).dapo), asdict(DapoSettings())
    for section in ("seeded_rollouts", "overlong_filter", "dynamic_sampling", "preflight", "paths"):
        assert composed[section] == defaults[section], section  # dapo.name is the size's and the ablation's
    yaml_text = (Path(__file__).resolve().parents[1] / "recipe_dapo" / "config" / "dapo_trainer.yaml").read_text()
    assert "max_staleness:" not in yaml_text and "round_sizing:" not in yaml_text  # no second default


# ---------------------------------------------------------------------------------------------- config groups

CONFIG_DIR = Path(recipe_dapo.config.__file__).parent
SIZES = sorted(path.stem for path in (CONFIG_DIR / "size").glob("*.yaml"))
ABLATIONS = sorted(path.stem for path in (CONFIG_DIR / "ablation").glob("*.yaml"))
SAMPLINGS = sorted(path.stem for path in (CONFIG_DIR / "sampling").glob("*.yaml"))

# The switch of each DAPO technique, and its value when the technique is on (when off: the other value).
TECHNIQUES = {
    "overlong_filtering": ("dapo.overlong_filter.enable", True, False),
    "clip_higher": ("actor_rollout_ref.actor.clip_ratio_high", 0.28, 0.2),
    "soft_overlong": ("reward.reward_kwargs.overlong_buffer_cfg.enable", True, False),
    "token_level_loss": ("actor_rollout_ref.actor.loss_agg_mode", "token-mean", "seq-mean-token-mean"),
    "dynamic_sampling": ("algorithm.filter_groups.enable", True, False),
}
# Table 1 of the paper: each row adds one technique to the row above (AIME 2024 avg@32). Soft overlong punishment
# takes the place of overlong filtering, as in the authors' reference recipe and in full DAPO (see
# ablation/table1_soft_overlong.yaml).
TABLE1 = [
    ("grpo_baseline", 30, set()),
    ("table1_overlong_filtering", 36, {"overlong_filtering"}),
    ("table1_clip_higher", 38, {"overlong_filtering", "clip_higher"}),
    ("table1_soft_overlong", 41, {"clip_higher", "soft_overlong"}),
    ("table1_token_level_loss", 42, {"clip_higher", "soft_overlong", "token_level_loss"}),
    ("none", 50, {"clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling"}),
]
# An ablation's name and what follows it (verl's checkpoint folder and rollout trace name follow the experiment name).
NAME_KEYS = {"dapo.name.ablation", "trainer.experiment_name", "trainer.default_local_dir",
             "actor_rollout_ref.rollout.trace.experiment_name"}
# The data files each size reads, relative to dapo.paths.data_dir.
DATA_FILES = ("dapo-math-17k.parquet", "aime-2024.parquet", "math500.parquet", "train.parquet", "val.parquet")


@pytest.fixture(scope="module")
def group_data_dir(tmp_path_factory):
    """Every file a size names, as small valid verl RL parquets (the start-up check reads them row by row)."""
    import pandas as pd

    from recipe_dapo.cpu.assets import synthetic_rows

    out = tmp_path_factory.mktemp("group_data")
    for name in DATA_FILES:
        pd.DataFrame(synthetic_rows(4, name, seed=0)).to_parquet(out / name)
    return out


def flat(config) -> dict:
    """Resolved config as {dotted.key: value} (lists kept whole)."""
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(config, resolve=True), "")
    return out


def techniques_on(config) -> set[str]:
    state = set()
    for name, (key, on, off) in TECHNIQUES.items():
        value = OmegaConf.select(config, key)
        assert value in (on, off), f"{key}={value!r} is neither the technique's on ({on!r}) nor off ({off!r}) value"
        if value == on:
            state.add(name)
    return state


def test_groups_hold_the_expected_choices():
    assert SIZES == ["cpu_chain", "cpu_tiny", "paper_32b", "qwen2.5_1.5b_one_node", "qwen2.5_7b_math", "small_one_gpu"]
    assert set(ABLATIONS) == {row[0] for row in TABLE1} | {"no_dynamic_sampling", "no_token_level_loss",
                                                            "no_clip_higher", "no_overlong_shaping"}
    assert SAMPLINGS == ["paper", "recipe"]


# Every size x ablation pair; the sampling group touches only dapo.dynamic_sampling, so its other choice goes with
# every size and the two ablations that differ in dynamic sampling.
GROUP_CHOICES = [(size, ablation, "recipe") for size in SIZES for ablation in ABLATIONS] + [
    (size, ablation, sampling) for size in SIZES for ablation in ("none", "grpo_baseline") for sampling in SAMPLINGS
    if sampling != "recipe"
]


@pytest.mark.parametrize(("size", "ablation", "sampling"), GROUP_CHOICES)
def test_every_size_ablation_and_sampling_composes_and_passes_the_start_up_checks(size, ablation, sampling, group_data_dir):
    config = compose_recipe_config([f"size={size}", f"ablation={ablation}", f"sampling={sampling}",
                                    f"dapo.paths.data_dir={group_data_dir}"])
    values = flat(config)  # every interpolation resolves
    check_config(config)  # the data files the size names exist under dapo.paths.data_dir and are valid
    assert values["trainer.experiment_name"] == f"{values['dapo.name.ablation']}-{values['dapo.name.size']}"
    assert values["data.gen_batch_size"] >= values["data.train_batch_size"]


def test_table1_ladder_adds_one_technique_per_row_and_changes_nothing_else():
    rows = [(name, compose_recipe_config([f"ablation={name}"])) for name, _, _ in TABLE1]
    for (name, config), (_, _, expected) in zip(rows, TABLE1):
        assert techniques_on(config) == expected, name
    # verl's (unused) critic section follows the actor's loss_agg_mode.
    switches = {key for key, _, _ in TECHNIQUES.values()} | NAME_KEYS | {"critic.loss_agg_mode"}
    for (above, config_above), (name, config) in zip(rows, rows[1:]):
        before, after = flat(config_above), flat(config)
        changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
        # verl v1's sampler kwargs only point at the settings (algorithm.filter_groups, dapo.dynamic_sampling).
        changed = {key for key in changed if not key.startswith("trainer.v1.sampler.sampler_kwargs.")}
        assert changed - switches == set(), (above, name)


def test_readme_lists_table1_as_ablation_choices_with_the_papers_scores():
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"### Reproducing the paper's ablations \(Table 1\).*?```bash\n(.*?)```", readme, re.S).group(1)
    listed = re.findall(r"ablation=(\w+)\s.*\[(\d+)\]", block)
    assert [(name, int(score)) for name, score in listed] == [(name, score) for name, score, _ in TABLE1]


def test_leave_one_out_ablations_switch_off_exactly_their_technique():
    dapo = techniques_on(compose_recipe_config([]))
    assert dapo == TABLE1[-1][2]
    assert techniques_on(compose_recipe_config(["ablation=no_dynamic_sampling"])) == dapo - {"dynamic_sampling"}
    assert techniques_on(compose_recipe_config(["ablation=no_token_level_loss"])) == dapo - {"token_level_loss"}
    assert techniques_on(compose_recipe_config(["ablation=no_clip_higher"])) == dapo - {"clip_higher"}
    # Full DAPO shapes overlong responses with the soft punishment only (the filter is off): switching shaping off
    # leaves neither on.
    assert "overlong_filtering" not in dapo
    assert techniques_on(compose_recipe_config(["ablation=no_overlong_shaping"])) == dapo - {"soft_overlong"}


def test_table1_rows_equal_the_leave_one_out_ablations_they_coincide_with():
    def without_name(overrides):
        return {k: v for k, v in flat(compose_recipe_config(overrides)).items() if k not in NAME_KEYS}

    assert without_name(["ablation=table1_token_level_loss"]) == without_name(["ablation=no_dynamic_sampling"])
    assert without_name(["ablation=table1_soft_overlong"]) == without_name(
        ["ablation=[no_token_level_loss,no_dynamic_sampling]"]
    )


def test_paper_sampling_generates_whole_rounds_discards_surplus_and_stops_when_the_budget_is_spent():
    recipe = compose_recipe_config([]).dapo.dynamic_sampling
    paper = compose_recipe_config(["sampling=paper"]).dapo.dynamic_sampling
    assert (paper.round_sizing, paper.max_staleness, paper.on_exhausted) == ("whole", 0, "raise")
    assert (recipe.round_sizing, recipe.max_staleness, recipe.on_exhausted) == ("deficit", 1, "train_partial")


def test_derived_values_follow_the_keys_they_come_from():
    values = flat(compose_recipe_config(["size=qwen2.5_7b_math", "data.train_batch_size=64", "data.max_response_length=8192"]))
    assert values["data.gen_batch_size"] == 3 * 64
    assert values["actor_rollout_ref.rollout.max_num_batched_tokens"] == 1024 + 8192
    assert values["reward.reward_kwargs.max_resp_len"] == 8192
    # The paper's run: one token budget of prompt + response = 22,528 everywhere; offload on for actor, optimiser, ref.
    paper = flat(compose_recipe_config([]))
    for key in ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "actor_rollout_ref.rollout.max_num_batched_tokens"):
        assert paper[key] == 2048 + 20480, key
    offload = [flat(compose_recipe_config(["actor_rollout_ref.actor.fsdp_config.param_offload=false"]))[key] for key in (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor_rollout_ref.ref.fsdp_config.param_offload")]
    assert offload == [False, False] and paper["actor_rollout_ref.ref.fsdp_config.param_offload"] is True


def test_platform_cpu_wins_over_the_size_where_the_machine_requires_it():
    config = compose_recipe_config(["platform=cpu"])  # default size: the paper's 16 x 8 GPUs, vLLM TP 4
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (1, 1)
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1


def test_an_unknown_group_choice_lists_the_available_ones():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match=r"(?s)Could not find 'size/qwen_7b'.*qwen2.5_7b_math"):
        compose_recipe_config(["size=qwen_7b"])


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # 2,048 prompt + 20,480 response tokens (the paper's L_max): the token budget of one sequence.
        ("${recipe_dapo.sum:2048,20480}", 22528),
        # 3 x 512 prompts: the paper's generation round.
        ("${recipe_dapo.mul:3,512}", 1536),
        ("${recipe_dapo.sum:1,2,3}", 6),
        # 2 prompts x 8 responses over 2 ranks: the per-rank mini-batch.
        ("${recipe_dapo.div:16,2}", 8),
    ],
)
def test_recipe_resolvers_compute_sums_and_products(expression, expected):
    assert OmegaConf.create({"value": expression}).value == expected


def test_recipe_resolver_refuses_a_non_number_naming_what_to_fix():
    config = OmegaConf.create({"data": {"train_batch_size": "many"}, "gen": "${recipe_dapo.mul:3,${data.train_batch_size}}"})
    with pytest.raises(Exception, match=r"recipe_dapo.mul.*takes numbers.*'many'"):
        config.gen


@pytest.mark.parametrize("first", ["recipe_dapo", "omegaconf"])
def test_resolvers_exist_in_any_process_that_imports_the_recipe_whatever_it_imports_first(first):
    # A Ray worker that runs the task runner imports recipe_dapo.main_dapo and resolves the config there.
    second = "omegaconf" if first == "recipe_dapo" else "recipe_dapo"
    code = (f"import {first}, {second}; from omegaconf import OmegaConf; "
            "print(OmegaConf.create({'v': '${recipe_dapo.sum:1,2}'}).v)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "3", result.stderr


def test_division_resolver_refuses_a_remainder_instead_of_rounding():
    with pytest.raises(Exception, match=r"recipe_dapo.div:16,3.*16 is not a whole multiple of 3"):
        OmegaConf.create({"value": "${recipe_dapo.div:16,3}"}).value


def ray_init(overrides, monkeypatch, ray_address=None):
    if ray_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    config = compose_recipe_config(["platform=cpu", "size=cpu_tiny", *overrides])
    return OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)


@pytest.mark.parametrize(
    "overrides, gpus",
    [([], 1), (["trainer.n_gpus_per_node=2"], 2), (["trainer.nnodes=2", "trainer.n_gpus_per_node=1"], 2)],
)
def test_cpu_platform_starts_ray_with_one_stand_in_gpu_per_rank(overrides, gpus, monkeypatch):
    """`bash scripts/run_dapo_cpu.sh trainer.n_gpus_per_node=2` gets the Ray it needs without more overrides."""
    init = ray_init(overrides, monkeypatch)
    assert init["address"] is None
    assert init["num_gpus"] == gpus and init["num_cpus"] == 16 * gpus  # the default run (1 rank) keeps 1 GPU, 16 CPUs


@pytest.mark.parametrize("address, ray_address", [("10.0.0.1:6379", None), ("auto", None), (None, "10.0.0.1:6379")])
def test_cpu_platform_leaves_resources_to_the_nodes_when_joining_a_cluster(address, ray_address, monkeypatch):
    """ray.init refuses num_cpus / num_gpus when it connects to a running cluster: they must be null there."""
    overrides = ["trainer.nnodes=2"] + ([f"ray_kwargs.ray_init.address={address}"] if address else [])
    init = ray_init(overrides, monkeypatch, ray_address)
    assert init["num_gpus"] is None and init["num_cpus"] is None
    assert init["address"] == address


def test_ray_address_local_still_starts_a_ray_of_its_own(monkeypatch):
    init = ray_init(["ray_kwargs.ray_init.address=local"], monkeypatch, ray_address="10.0.0.1:6379")
    assert init["num_gpus"] == 1 and init["num_cpus"] == 16


def test_yaml_files_read_in_this_session_give_their_current_text(tmp_path):
    """The test session parses each YAML text once (tests/conftest.py): a file read again after an edit gives the new
    text, a caller's copy is its own, and a file that fails to parse is named in the error as before."""
    import yaml
    from omegaconf import OmegaConf

    path = tmp_path / "settings.yaml"
    path.write_text("a: 1\nb: [1, 2]\n")
    first = OmegaConf.load(path)
    first.b.append(3)
    assert OmegaConf.to_container(OmegaConf.load(path)) == {"a": 1, "b": [1, 2]}
    path.write_text("a: 2\nb: [1, 2]\n")
    assert OmegaConf.load(path).a == 2
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(yaml.constructor.ConstructorError, match=f'found duplicate key a\n  in "{path}", line 2'):
        OmegaConf.load(path)


def test_interpolations_resolve_against_each_config_and_a_broken_one_fails_every_time():
    """The test session parses each interpolation string once (tests/conftest.py): the same string still resolves to
    each config's own value, and one that does not parse fails each time it is resolved."""
    from omegaconf.errors import GrammarParseError

    one, other = OmegaConf.create({"a": 1, "b": "${a}"}), OmegaConf.create({"a": 2, "b": "${a}"})
    assert (one.b, other.b) == (1, 2)
    for _ in range(2):
        with pytest.raises(GrammarParseError):
            OmegaConf.create({"a": 1, "b": "${a"}).b
