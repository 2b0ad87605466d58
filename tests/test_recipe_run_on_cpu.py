"""One run object, two trainers: what a DAPO run does the same on verl's classic and v1 trainers lives once, in
``run.recipe_run.RecipeRun`` (its lifecycle: ``run.lifecycle``), and each trainer is a thin adapter of verl's hooks
and loop events onto it.

Pinned here (as torchtune pins the methods its recipes share): both adapters hold a ``RecipeRun``, implement the
same verl hooks for the shared concerns and forward the same loop events; neither adapter calls the functions those
concerns are made of (only the run object does), so a concern cannot grow a second implementation unnoticed; the
sampler is built from the same settings on both; and the run object's state really travels through a checkpoint.
What the two trainers do with the events (what they save and print) is compared in ``test_run_lifecycle_on_cpu``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose_recipe_config
from recipe_dapo.dynamic_sampling.config import SAMPLER_SETTINGS, sampler_config, sampler_settings
from recipe_dapo.preflight.sampling import rule_dynamic_sampling
from recipe_dapo.run import lifecycle, recipe_run
from recipe_dapo.run.recipe_run import RecipeRun
from recipe_dapo.trainers.adapter import HoldsRecipeRun

REPO_ROOT = Path(__file__).resolve().parents[1]
ADAPTER_MODULES = {
    "classic": REPO_ROOT / "recipe_dapo" / "trainers" / "classic" / "trainer.py",
    "v1": REPO_ROOT / "recipe_dapo" / "trainers" / "v1" / "trainer.py",
}

SHARED_HOOKS = ("fit", "_save_checkpoint", "_load_checkpoint", "_val_metrics_update")
"""verl hooks through which both adapters hand the shared concerns to the run object (verl names them alike)."""

RUN_METHODS = {
    "open_tracker", "watch_rollout", "run_begins", "step_begins", "generation_begins", "update_begins", "step_ends",
    "drive", "observe_update", "save_checkpoint", "load_checkpoint", "announce_resume", "validation_metrics",
    "count_trained_tokens", "filter_overlong",
}
"""What both adapters call on their ``recipe``: the shared concerns, one method each, and the lifecycle's events
(``run.lifecycle``: the flag's reads, the saves on a stop and the outcomes are the lifecycle's, behind them)."""

SHARED_CONCERN_PARTS = {
    "UpdateGuard", "TrainerWatch", "open_tracking", "watch_replica_calls", "RolloutLiveness", "save_recipe_state",
    "load_recipe_state", "guarded_save", "resume_line", "checkpoint_exists", "add_problem_metrics",
    "apply_overlong_filter", "stop_token_ids", "announce", "from_config",
    "Preempted", "StepGivenUp", "failed_outcome", "stopped_outcome", "given_up_outcome", "abandon_rollout",
    "checkpoint_previous_step", "stop_requested",
}
"""The functions and classes the shared concerns are made of: only the run object (``recipe_run``, ``lifecycle``)
uses them."""


def adapter_classes():
    from recipe_dapo.trainers.classic.trainer import RayDAPOTrainer
    from recipe_dapo.trainers.v1.trainer import DAPOTrainerV1, DAPOTrainerV1ColocateAsync

    return {"classic": [RayDAPOTrainer], "v1": [DAPOTrainerV1, DAPOTrainerV1ColocateAsync]}


def names_used(source: str) -> set[str]:
    """Every name and attribute a module's code mentions (calls, imports, references)."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used.update(alias.name for alias in node.names)
    return used


def recipe_calls(source: str) -> set[str]:
    """The methods a module calls on ``self.recipe``, or on ``RecipeRun`` itself (its static steps)."""
    calls = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        on_run = (isinstance(node.value, ast.Attribute) and node.value.attr == "recipe"
                  and isinstance(node.value.value, ast.Name) and node.value.value.id == "self")
        on_class = isinstance(node.value, ast.Name) and node.value.id == "RecipeRun"
        if on_run or on_class:
            calls.add(node.attr)
    return calls


def test_both_trainers_hold_a_recipe_run_and_adapt_the_same_verl_hooks():
    for kind, classes in adapter_classes().items():
        for cls in classes:
            assert issubclass(cls, HoldsRecipeRun), cls
            own = {name for klass in cls.__mro__ if klass.__module__.startswith("recipe_dapo.")
                   for name in vars(klass)}
            missing = set(SHARED_HOOKS) - own
            assert not missing, f"{kind} adapter {cls.__name__} does not adapt verl's {sorted(missing)}"


def test_both_adapters_hand_every_shared_concern_to_the_run_object():
    calls = {kind: recipe_calls(path.read_text()) for kind, path in ADAPTER_MODULES.items()}
    for kind, called in calls.items():
        assert RUN_METHODS <= called, f"the {kind} adapter does not use RecipeRun.{sorted(RUN_METHODS - called)}"
        assert called <= set(dir(RecipeRun)), sorted(called - set(dir(RecipeRun)))


def test_no_adapter_implements_a_shared_concern_itself():
    for kind, path in ADAPTER_MODULES.items():
        again = names_used(path.read_text()) & SHARED_CONCERN_PARTS
        assert not again, (f"the {kind} adapter uses {sorted(again)} itself: that concern is RecipeRun's "
                           "(run/recipe_run.py, run/lifecycle.py), where both trainers get it")
    run_object = names_used(inspect.getsource(recipe_run)) | names_used(inspect.getsource(lifecycle))
    assert SHARED_CONCERN_PARTS - {"from_config"} <= run_object


def test_the_concern_scan_sees_a_second_implementation():
    # Positive control: an adapter that counts skipped updates with its own guard and writes its own state.
    source = ("from recipe_dapo.run.step_metrics import UpdateGuard\n"
              "class T:\n"
              "    def __init__(self, config):\n"
              "        self.guard = UpdateGuard(config.dapo.health.max_skipped_updates)\n"
              "    def _save_checkpoint(self):\n"
              "        save_recipe_state(self.config, 1, {})\n"
              "        self.recipe.observe_update({}, 1)\n")
    assert names_used(source) & SHARED_CONCERN_PARTS == {"UpdateGuard", "save_recipe_state"}
    assert recipe_calls(source) == {"observe_update"}


# ------------------------------------------------------------------------------------------------ the sampler


def test_both_trainers_build_the_sampler_from_the_same_settings():
    config = compose_recipe_config(["data.seed=7", "data.gen_batch_size=null"])
    kwargs = OmegaConf.to_container(config.trainer.v1.sampler.sampler_kwargs, resolve=True)
    assert tuple(kwargs) == SAMPLER_SETTINGS  # the v1 trainer's kwargs are the classic trainer's settings
    settings = {key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
                for key, value in sampler_settings(config).items()}
    assert settings == kwargs
    classic, v1 = sampler_config(sampler_settings(config)), sampler_config(kwargs)
    assert classic == v1
    assert classic.seed == 7 and classic.skip_seed == 7  # data.seed reaches the prompt-skip draws on both


def test_one_builder_makes_the_sampler_config_for_the_trainers_and_the_start_up_rules():
    package = Path(recipe_run.__file__).resolve().parents[1]
    builders = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                      if "DynamicSamplingConfig.from_config(" in path.read_text())
    assert builders == ["dynamic_sampling/config.py"]
    # The start-up rule sees what the trainers would build, data.seed included: a seed the builder refuses is refused.
    config = compose_recipe_config(["data.seed=7"])
    assert list(rule_dynamic_sampling(config, None)) == []
    config.data.seed = "seven"
    with pytest.raises(ValueError):
        sampler_config(sampler_settings(config))
    assert list(rule_dynamic_sampling(config, None)) != []


# ------------------------------------------------------------------------------------------------ checkpoints


class _Trainer(HoldsRecipeRun):
    def __init__(self, config):
        self.config = config


def test_the_update_guard_travels_with_the_recipe_state_through_a_checkpoint(tmp_path):
    config = compose_recipe_config([f"trainer.default_local_dir={tmp_path}"])
    trainer = _Trainer(config)
    guard = trainer.recipe.update_guard
    guard.observe({"actor/grad_norm": float("nan")}, step=1)
    saved = []
    trainer.recipe.save_checkpoint(3, {"sampler": {"pooled": 2}}, lambda: saved.append(3) or (
        tmp_path / "global_step_3").mkdir(exist_ok=True) or (tmp_path / "latest_checkpointed_iteration.txt").write_text("3"))
    assert saved == [3] and not trainer.recipe.needs_checkpoint(3) and trainer.recipe.needs_checkpoint(4)

    resumed = _Trainer(config)
    state = resumed.recipe.load_checkpoint(3)
    assert state["sampler"] == {"pooled": 2}
    assert resumed.update_guard.state_dict() == {"in_a_row": 1, "total": 1}
    assert resumed.recipe.load_checkpoint(5) is None


def test_the_trainers_state_names_are_the_run_objects():
    trainer = _Trainer(compose_recipe_config([]))
    assert trainer.stopped_by is None and trainer.update_guard is trainer.recipe.update_guard
    trainer.stopped_by = "SIGTERM"
    assert trainer.recipe.stopped_by == "SIGTERM"

    class Raised:
        def requested(self):
            return "SIGINT"

    other = _Trainer(compose_recipe_config([]))
    other.preemption = Raised()
    assert other.recipe.stop_requested() == "SIGINT" and other.stopped_by == "SIGINT"


@pytest.mark.parametrize("enable", [True, False])
def test_the_overlong_filter_runs_only_when_enabled(enable):
    import torch
    from verl import DataProto

    config = compose_recipe_config([f"dapo.overlong_filter.enable={str(enable).lower()}",
                                    "actor_rollout_ref.rollout.response_length=4"])
    run = RecipeRun(config)
    run._stop_ids = [2]  # the tokenizer's end-of-sequence id
    batch = DataProto.from_dict(tensors={"responses": torch.tensor([[5, 6, 7, 8], [5, 2, 0, 0]]),
                                         "response_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])})
    metrics: dict = {}
    assert run.filter_overlong(batch, metrics) is enable
    expected = [[0, 0, 0, 0], [1, 1, 0, 0]] if enable else [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.batch["response_mask"].tolist() == expected
    assert bool(metrics) is enable


# ------------------------------------------------------------------------------------------------ the v1 adapter's fit


@pytest.mark.parametrize("ending", ["trained", "preempted", "failed"])
def test_the_v1_fit_logs_through_the_recipes_tracker_and_puts_verls_globals_back(tmp_path, monkeypatch, ending):
    """verl's v1 ``fit`` (stood in for: it opens its ``Tracking`` from its module global, as verl's does, and logs a
    step) runs with the recipe's tracker, TransferQueue timed and the stall watch set; afterwards verl's ``Tracking``
    and ``pprint`` and TransferQueue's functions are verl's again, and the run's outcome reached the tracker."""
    import transfer_queue as tq
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe_dapo.tracking.tracker import DAPOTracking
    from recipe_dapo.run.preemption import Preempted
    from recipe_dapo.run.rollout_health import StallWatch
    from recipe_dapo.trainers.v1.trainer import DAPOTrainerV1

    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    verls_tracking, verls_pprint, verls_kv_list = trainer_base.Tracking, trainer_base.pprint, tq.kv_list
    seen = {}

    def verls_fit(trainer, agent_loop_manager):
        trainer.logger = trainer_base.Tracking(project_name="p", experiment_name="e", default_backend=["file"],
                                               config={})
        trainer_base.pprint("Initial validation metrics: {...}")
        seen["timed"] = getattr(tq.kv_list, "timed_phase", None)
        trainer.logger.log({"training/global_step": 1}, step=1)
        if ending == "preempted":
            trainer.stopped_by = "SIGTERM"
            trainer.global_steps = 2
            raise Preempted("SIGTERM")
        if ending == "failed":
            raise RuntimeError("a worker died")

    monkeypatch.setattr(PPOTrainer, "fit", verls_fit)

    class Groups:
        watch = None

    class Buffer:
        groups = Groups()

    trainer = object.__new__(DAPOTrainerV1)
    trainer.config = compose_recipe_config(["trainer.use_v1=true", "trainer.project_name=p", "trainer.experiment_name=e",
                                            "trainer.logger=[file,console]"])
    trainer.global_steps, trainer.total_training_steps, trainer.replay_buffer = 0, 1, Buffer()
    outcomes = []
    # Every tracker's finish: verl's Tracking.__del__ calls it too, for the trackers of earlier tests whenever the
    # garbage collector frees them; this run's tracker is picked out below.
    monkeypatch.setattr(DAPOTracking, "finish",
                        lambda self, exit_code=0, outcome=None: outcomes.append((self, outcome)))
    if ending == "failed":
        with pytest.raises(RuntimeError, match="a worker died"):
            trainer.fit(agent_loop_manager=None)
    else:
        trainer.fit(agent_loop_manager=None)

    assert isinstance(trainer.logger, DAPOTracking) and seen["timed"] == "tq_read"
    outcomes = [outcome for tracker, outcome in outcomes if tracker is trainer.logger]
    assert isinstance(trainer.replay_buffer.groups.watch, StallWatch)
    assert (trainer_base.Tracking, trainer_base.pprint, tq.kv_list) == (verls_tracking, verls_pprint, verls_kv_list)
    assert (tmp_path / "p" / "e.jsonl").read_text().startswith('{"step":1')
    assert outcomes == {"trained": [], "preempted": ["stopped by SIGTERM after step 1"],
                        "failed": ["failed at step 0 (RuntimeError)"]}[ending]


# ------------------------------------------------------------------------------------------------ a continuation


def test_a_continuation_takes_the_validation_its_metrics_file_has_and_a_fresh_start_validates(tmp_path, monkeypatch):
    """A run finished at step 3 with a validation there, continued from that checkpoint (more steps): the validation
    before training is the file's, said in one line, not run again. Positive controls: a step the file has no
    validation for, and step 0 (a fresh start over an older file), validate."""
    import recipe_dapo.tracking.console as console
    from recipe_dapo.tracking.tracker import open_tracking

    said: list[str] = []
    monkeypatch.setattr(console, "announce", said.append)  # the run's console line
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    config = compose_recipe_config(["trainer.logger=[file]", f"trainer.default_local_dir={tmp_path / 'checkpoints'}"])
    first = open_tracking(config, resumed_step=0, total_steps=3)
    first.log(data={"val-core/chain/acc/mean@4": 0.5}, step=0)
    for step in (1, 2, 3):
        first.log(data={"reward/acc_mean": 0.1 * step}, step=step)
    first.log(data={"val-core/chain/acc/mean@4": 0.6, "val-aux/chain/acc/pass@4": 0.8}, step=3)
    first.finish()

    run = RecipeRun(config)
    run.tracker = open_tracking(config, resumed_step=3, total_steps=6)
    said.clear()  # (the tracker's own resume line)
    assert run.logged_validation(3) == {"val-core/chain/acc/mean@4": 0.6, "val-aux/chain/acc/pass@4": 0.8}
    assert said == ["validation at step 3: in the metrics file already (the run this one continues validated there); "
                    "not run again"]
    assert run.logged_validation(2) == {}
    assert run.logged_validation(0) == {}
    assert len(said) == 1
    run.tracker.finish()
