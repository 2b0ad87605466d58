"""What a rerun checks about the checkpoint it resumes from (``run.checkpoint_guard``, the start-up rule
``preflight.checkpoints``), and one run per checkpoint folder (``run.run_lock``, taken by
``preflight.checkpoints.hold_run_folder``): on real files in tmp folders,
with checkpoints written the way the trainers write them (``checkpoint_state.save_recipe_state`` and torch files laid
out as verl's FSDP checkpoint manager lays them out)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose_recipe_config, small_run


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from recipe_dapo.cpu.assets import tokenizer_as_verl_loads_it, write_dataset

    folder = tmp_path_factory.mktemp("data")
    train, val = write_dataset(folder, num_train=16, num_val=4, seed=0)
    (folder / "model").mkdir()
    tokenizer_as_verl_loads_it(folder / "model", None, train)
    return [f"data.train_files={train}", f"data.val_files={val}", f"actor_rollout_ref.model.path={folder / 'model'}"]


def config_for(checkpoints, *overrides):
    return OmegaConf.create({
        "trainer": {"default_local_dir": str(checkpoints), "resume_mode": "auto", "resume_from_path": None,
                    "save_freq": 5},
        "data": {"train_batch_size": 4},
        "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"ppo_mini_batch_size": 2}},
        "dapo": {"resume": {"fallback_to_previous": False}},
    }) if not overrides else OmegaConf.merge(config_for(checkpoints), OmegaConf.from_dotlist(list(overrides)))


def save_checkpoint(config, step: int, weights: int = 1000) -> str:
    """A checkpoint as the trainers write one: the recipe's state and shape, verl's actor files, then the tracker."""
    from recipe_dapo.run.checkpoint_state import save_recipe_state, step_folder

    save_recipe_state(config, step, {"sampler": {"pool": []}})
    folder = step_folder(config.trainer.default_local_dir, step)
    os.makedirs(os.path.join(folder, "actor"), exist_ok=True)
    for kind in ("model", "optim", "extra_state"):
        torch.save({"w": torch.zeros(weights)}, os.path.join(folder, "actor", f"{kind}_world_size_1_rank_0.pt"))
    torch.save({"dataloader": 1}, os.path.join(folder, "data.pt"))
    with open(os.path.join(config.trainer.default_local_dir, "latest_checkpointed_iteration.txt"), "w") as stream:
        stream.write(str(step))
    return folder


def truncate(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as stream:
        stream.truncate(size // 2)


def problems(config, dry_run=False) -> list[str]:
    from recipe_dapo.run.checkpoint_guard import checkpoint_problems

    return list(checkpoint_problems(config, dry_run=dry_run))


# ----------------------------------------------------------------------------- the run's shape


@pytest.mark.parametrize("key, value", [("actor_rollout_ref.rollout.n", 16), ("data.train_batch_size", 8),
                                        ("actor_rollout_ref.actor.ppo_mini_batch_size", 4)])
def test_a_resume_that_changes_the_runs_shape_is_refused_naming_the_key(tmp_path, key, value):
    config = config_for(tmp_path)
    folder = save_checkpoint(config, 3)
    assert problems(config) == []  # positive control: the same shape resumes
    found = problems(config_for(tmp_path, f"{key}={value}"))
    assert len(found) == 1
    old = OmegaConf.select(config, key)
    assert found[0].startswith(f"{key}={value} but the checkpoint to resume from ({folder}) was made with {key}={old}")
    assert "trainer.resume_mode=disable" in found[0]
    assert problems(config_for(tmp_path, f"{key}={value}", "trainer.resume_mode=disable")) == []


def test_the_start_up_rules_refuse_a_changed_n_before_any_worker_starts(data, tmp_path):
    """Through the real composed config and the one rule set: only tier 1 runs before the refusal (no verl)."""
    from recipe_dapo.preflight import DAPOConfigError, check_config

    overrides = small_run(data, f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=1")
    config = compose_recipe_config(overrides)
    save_checkpoint(OmegaConf.create(OmegaConf.to_container(config, resolve=True)), 2)
    check_config(config)
    with pytest.raises(DAPOConfigError, match=r"actor_rollout_ref.rollout.n=4 but the checkpoint to resume from .* "
                                              r"was made with actor_rollout_ref.rollout.n=8"):
        check_config(compose_recipe_config(overrides + ["actor_rollout_ref.rollout.n=4"]))


# ----------------------------------------------------------------------------- a rerun of a finished run


def test_a_rerun_of_a_finished_run_says_there_is_nothing_to_train_and_how_to_train_further(tmp_path):
    from recipe_dapo.run.checkpoint_guard import nothing_left_to_train

    config = config_for(tmp_path, "trainer.total_training_steps=6")
    assert nothing_left_to_train(config) is None  # no checkpoint: a fresh start
    save_checkpoint(config, 3)
    assert nothing_left_to_train(config) is None  # positive control: steps 4-6 are left
    folder = save_checkpoint(config, 6)
    line = nothing_left_to_train(config)
    assert line.startswith(f"nothing to train: the checkpoint this run resumes from, {folder}, already holds step 6 of "
                           "trainer.total_training_steps=6")
    assert "trainer.total_training_steps=12" in line and "trainer.resume_mode=disable" in line
    assert nothing_left_to_train(config_for(tmp_path, "trainer.total_training_steps=8")) is None
    assert nothing_left_to_train(config_for(tmp_path, "trainer.total_training_steps=6",
                                            "trainer.resume_mode=disable")) is None


def test_the_driver_ends_a_rerun_with_nothing_to_train_before_any_worker_starts(data, tmp_path):
    """The real entry point on the real composed config: one line, exit 0, no Ray started (it would take a minute)."""
    overrides = small_run(data, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=2",
                          "trainer.save_freq=1")
    save_checkpoint(OmegaConf.create(OmegaConf.to_container(compose_recipe_config(overrides), resolve=True)), 2)
    done = subprocess.run([sys.executable, "-m", "recipe_dapo.main_dapo", *overrides], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path,  # the run's log file goes under the working folder
                          env={**os.environ, "RAY_ADDRESS": "", "DAPO_CONSOLE_FILTER": "0"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "nothing to train: the checkpoint this run resumes from" in done.stdout
    assert "Started a local Ray instance" not in done.stdout + done.stderr


# ----------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("damage", ["actor/optim_world_size_1_rank_0.pt", "dapo_state.pt", "missing state"])
def test_a_damaged_latest_checkpoint_is_named_with_the_previous_complete_one(tmp_path, damage):
    config = config_for(tmp_path)
    previous = save_checkpoint(config, 5)
    latest = save_checkpoint(config, 10)
    assert problems(config) == []
    if damage == "missing state":
        os.remove(os.path.join(latest, "dapo_state.pt"))
        name, why = "dapo_state.pt", "is missing"
    else:
        truncate(os.path.join(latest, damage))
        name, why = damage, "is truncated or corrupt"
    with pytest.raises(Exception):
        torch.load(os.path.join(latest, "actor/optim_world_size_1_rank_0.pt" if "optim" in damage else "dapo_state.pt"),
                   weights_only=False)  # what verl's resume would have met, deep in a worker
    found = problems(config)
    assert len(found) == 1
    assert found[0].startswith(f"the checkpoint to resume from, {latest}, is damaged: {name} {why}")
    assert f"the previous complete checkpoint is {previous}" in found[0]
    assert f"trainer.resume_from_path={previous}" in found[0] and "dapo.resume.fallback_to_previous=true" in found[0]


def test_with_the_knob_the_previous_complete_checkpoint_is_taken_and_the_damaged_one_moved_aside(tmp_path):
    from recipe_dapo.run.checkpoint_guard import resume_folder

    config = config_for(tmp_path, "dapo.resume.fallback_to_previous=true")
    save_checkpoint(config, 4)
    previous = save_checkpoint(config, 8)
    latest = save_checkpoint(config, 12)
    truncate(os.path.join(latest, "actor", "model_world_size_1_rank_0.pt"))
    # A dry run changes nothing: it reports the problem.
    assert "is damaged" in problems(config, dry_run=True)[0] and os.path.isdir(latest)
    assert problems(config) == []
    assert resume_folder(config) == previous
    assert not os.path.exists(latest) and os.path.isdir(latest + ".damaged")
    with open(os.path.join(tmp_path, "latest_checkpointed_iteration.txt")) as stream:
        assert stream.read() == "8"


def test_without_an_earlier_complete_checkpoint_the_message_says_start_afresh(tmp_path):
    config = config_for(tmp_path, "dapo.resume.fallback_to_previous=true")
    latest = save_checkpoint(config, 3)
    open(os.path.join(latest, "actor", "optim_world_size_1_rank_0.pt"), "w").close()
    found = problems(config)
    assert found == [f"the checkpoint to resume from, {latest}, is damaged: actor/optim_world_size_1_rank_0.pt is "
                     "empty; there is no earlier complete checkpoint: start afresh with trainer.resume_mode=disable"]


def write_inside_a_tensor(path: str, garbage: bytes) -> str:
    """Overwrite bytes in the middle of the file's largest tensor record, the zip index left intact; the record."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        record = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as stream:
        stream.seek(record.header_offset + 26)
        name_length, extra_length = (int.from_bytes(stream.read(2), "little") for _ in range(2))
        stream.seek(record.header_offset + 30 + name_length + extra_length + record.file_size // 4)
        stream.write(garbage)
    return record.filename


def test_garbage_inside_a_tensor_with_the_index_intact_is_named_by_its_record_before_anything_loads(tmp_path):
    """4 KiB of garbage inside the optimizer's tensor: torch loads the file without a word, as NaN; the start-up check
    reads every record against its CRC and names the file, the record and the previous complete checkpoint."""
    config = config_for(tmp_path)
    previous = save_checkpoint(config, 5, weights=8192)
    latest = save_checkpoint(config, 10, weights=8192)
    assert problems(config) == []  # positive control: the same files, undamaged
    optim = os.path.join(latest, "actor", "optim_world_size_1_rank_0.pt")
    record = write_inside_a_tensor(optim, b"\xff" * 4096)
    loaded = torch.load(optim, weights_only=False)["w"]  # what verl's resume would have trained on
    assert int(torch.isnan(loaded).sum()) == 1024
    found = problems(config)
    assert len(found) == 1
    assert found[0].startswith(f"the checkpoint to resume from, {latest}, is damaged: actor/optim_world_size_1_rank_0.pt "
                               f"is corrupt: record {record} fails its CRC-32")
    assert f"the previous complete checkpoint is {previous}" in found[0]
    # With the knob off only the indexes are read: the damage goes through (what the check above adds).
    assert problems(config_for(tmp_path, "dapo.resume.verify_records=false")) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_weights_saved_with_nan_or_inf_are_refused_naming_the_record(tmp_path, dtype):
    """A state saved after the run diverged: its CRCs are right, its numbers are not."""
    config = config_for(tmp_path)
    latest = save_checkpoint(config, 3)
    model = os.path.join(latest, "actor", "model_world_size_1_rank_0.pt")
    weights = torch.zeros(64, dtype=dtype)
    torch.save({"w": weights, "b": torch.ones(4, dtype=dtype)}, model)
    assert problems(config) == []  # finite: fine
    weights[7], weights[9] = float("nan"), float("-inf")
    torch.save({"w": weights, "b": torch.ones(4, dtype=dtype)}, model)
    found = problems(config)
    assert len(found) == 1 and "actor/model_world_size_1_rank_0.pt holds 2 non-finite values (NaN or inf) in record" in found[0]
    assert "there is no earlier complete checkpoint" in found[0]


def test_the_start_up_rules_refuse_a_checkpoint_with_garbage_inside_before_any_worker_starts(data, tmp_path):
    from recipe_dapo.preflight import DAPOConfigError, check_config

    overrides = small_run(data, f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=1")
    config = compose_recipe_config(overrides)
    latest = save_checkpoint(OmegaConf.create(OmegaConf.to_container(config, resolve=True)), 2, weights=8192)
    check_config(config)
    write_inside_a_tensor(os.path.join(latest, "actor", "model_world_size_1_rank_0.pt"), os.urandom(4096))
    with pytest.raises(DAPOConfigError, match=r"actor/model_world_size_1_rank_0.pt is corrupt: record \S+ fails its "
                                              r"CRC-32"):
        check_config(config)


def test_loading_a_corrupt_recipe_state_names_the_file(tmp_path):
    from recipe_dapo.run.checkpoint_state import load_recipe_state

    config = config_for(tmp_path)
    latest = save_checkpoint(config, 2)
    truncate(os.path.join(latest, "dapo_state.pt"))
    with pytest.raises(RuntimeError, match=rf"^{latest}/dapo_state.pt cannot be loaded \("):
        load_recipe_state(config, 2)


# ----------------------------------------------------------------------------- free space


def test_a_disk_with_less_free_space_than_the_last_checkpoint_is_refused_at_start_up(tmp_path, monkeypatch):
    from recipe_dapo.run import checkpoint_guard

    config = config_for(tmp_path)
    latest = save_checkpoint(config, 6, weights=100_000)
    size = checkpoint_guard.folder_bytes(latest)
    assert size > 3 * 100_000 * 4  # three actor files of 100k float32s
    monkeypatch.setattr(checkpoint_guard, "free_bytes", lambda path: size - 1)
    found = problems(config)
    assert found == [f"trainer.default_local_dir={tmp_path} has {size / 2**20:.1f} MiB free, but the next checkpoint "
                     f"needs about {size / 2**20:.1f} MiB (the size of {latest}): free space there or point "
                     "trainer.default_local_dir to a larger disk, then rerun"]
    monkeypatch.setattr(checkpoint_guard, "free_bytes", lambda path: size)
    assert problems(config) == []  # the real disk_usage is read otherwise: positive control of the comparison
    assert problems(config_for(tmp_path, "trainer.save_freq=-1")) == []  # a run that never saves needs no space


# ----------------------------------------------------------------------------- one run per folder


HOLDER = textwrap.dedent("""
    import sys, time
    from recipe_dapo.run.run_lock import RunLock
    lock = RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    sys.stdin.readline()  # until the test closes our stdin
""")


def test_a_second_launch_into_a_held_folder_is_refused_naming_the_first_runs_pid_and_host(tmp_path):
    import socket

    from recipe_dapo.preflight.base import DAPOConfigError
    from recipe_dapo.preflight.checkpoints import hold_run_folder

    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
        with pytest.raises(DAPOConfigError) as refused:
            hold_run_folder(config)
        message = str(refused.value)
        assert f"trainer.default_local_dir={tmp_path} is in use by another run (PID {first.pid} on host " \
               f"{socket.gethostname()}, started " in message
        assert len([line for line in message.splitlines() if line.startswith("  - ")]) == 1
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    # The first run ended (its lock went with its process): the folder is free again.
    lock = hold_run_folder(config)
    try:
        assert lock.held
    finally:
        lock.release()


def test_a_run_killed_without_cleanup_leaves_no_lock_behind(tmp_path):
    from recipe_dapo.run.run_lock import RunLock

    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    first.kill()
    first.wait(timeout=30)
    assert os.path.exists(tmp_path / ".dapo_run.lock")  # the file stays, the lock does not
    RunLock(str(tmp_path)).acquire().release()


WRITER = textwrap.dedent("""
    import sys, time
    from recipe_dapo.run.run_lock import hold_as_writer
    hold_as_writer(sys.argv[1])  # a worker of a run whose driver is gone, still writing its shard
    print("writing", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def test_a_new_driver_waits_until_the_workers_of_a_killed_run_stop_writing(tmp_path, capsys):
    """The first run's driver is gone (its lock with it) but one of its workers writes on for 2 s: the new driver's
    lock covers the folder only once that worker has ended."""
    from recipe_dapo.preflight.checkpoints import hold_run_folder

    worker = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "2"], stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "writing"
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
    lock = hold_run_folder(config)
    try:
        assert worker.poll() is not None, "the new run's lock was taken while the old worker still wrote"
        assert f"waiting for the processes of an earlier run to stop writing into {tmp_path}" in capsys.readouterr().out
    finally:
        lock.release()
        worker.wait(timeout=30)
    lock = hold_run_folder(config)  # positive control: nothing writing, no wait
    lock.release()
    assert "waiting" not in capsys.readouterr().out


def test_workers_that_never_stop_writing_are_refused_after_the_wait(tmp_path):
    from recipe_dapo.run.run_lock import FolderInUse, wait_for_writers

    worker = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "writing"
        with pytest.raises(FolderInUse, match=rf"trainer.default_local_dir={tmp_path}: processes of an earlier run .* "
                                              r"still write into it after 1 s"):
            wait_for_writers(str(tmp_path), wait_s=1.0)
    finally:
        worker.kill()
        worker.wait(timeout=30)
    assert wait_for_writers(str(tmp_path), wait_s=1.0) < 1.0


def test_a_writer_that_cannot_take_the_lock_warns_and_goes_on(tmp_path, caplog):
    from recipe_dapo.run.run_lock import hold_as_writer

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with caplog.at_level("WARNING", logger="recipe_dapo.run.run_lock"):
        hold_as_writer(str(blocker / "checkpoints"))  # the folder cannot be made: no lock, no failure
    assert "cannot hold the writers' lock in" in caplog.text
