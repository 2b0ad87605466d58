"""Shared fixtures: the repository root, the offline data beside it, and the recipe's composed config."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The e2e suite's shared training runs, defined once for the session here: a session fixture imported into two test
# modules would be two fixtures, each launching its run (tests/e2e/e2e_runs.py).
sys.path.insert(0, str(REPO_ROOT / "tests" / "e2e"))
from e2e_runs import (  # noqa: E402,F401
    TIMELINE, ablation_smoke_run, classic_run, classic_sigterm_run, session_order, shared_runs, shared_runs_read_by,
    v1_engine_kill_run, v1_run, v1_sigterm_run, verl_overlay,
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: multi-minute end-to-end runs (real Ray, vLLM, training); they live in tests/e2e and tests/gpu; "
        "`-m 'not e2e'` runs the unit tests alone",
    )


def pytest_terminal_summary(terminalreporter, config):
    """The background queue's timeline (seconds from the session's start), to see whether the tests waited for it."""
    runs = config.stash.get(TIMELINE, None)
    if runs is not None and runs.timeline:
        terminalreporter.section("shared runs (seconds from the session's start)")
        for line in runs.summary():
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    """The e2e tests last, the shared runs they read training in the background meanwhile; among them first those
    whose runs end first (``session_order``)."""
    items.sort(key=session_order(items))


@pytest.fixture(scope="session", autouse=True)
def _shared_runs_train_meanwhile(request):
    """At the session's first test, the shared runs its e2e tests will read start training in the background
    (tests/e2e/e2e_runs.py SharedRuns), one after the other, while the tests before them run."""
    wanted = shared_runs_read_by(request.session.items)
    if wanted:
        runs = request.getfixturevalue("shared_runs")
        for name in wanted:
            runs.start(name)


def _v1_trainer_supported() -> bool:
    from recipe_dapo.preflight.versions import installed_verl, v1_trainer_supported

    return v1_trainer_supported(installed_verl())


requires_verl_v1 = pytest.mark.skipif(
    not _v1_trainer_supported(),
    reason="the installed verl's v1 trainer lacks the hooks the recipe's v1 trainer needs: the start-up check refuses "
    "trainer.use_v1=true there (recipe_dapo.preflight.versions.V1_TRAINER_MIN_VERL)",
)
"""Tests of the recipe's v1 trainer and replay buffer: skipped on a verl where ``trainer.use_v1=true`` is refused."""


def shared_data_dir() -> Path | None:
    """The offline data (../shared/data beside the repository, or $SHARED_DATA_DIR); None when absent."""
    for candidate in (REPO_ROOT.parent / "shared" / "data", os.environ.get("SHARED_DATA_DIR")):
        if candidate and (Path(candidate) / "eval").is_dir():
            return Path(candidate)
    return None


SHARED = shared_data_dir()


def compose_recipe_config(overrides: list[str] = ()):
    """The recipe's real Hydra config (verl's ppo_trainer from the installed package + DAPO defaults). Each override
    list is composed once per session (Hydra parses some 40 YAML files per composition, most of a second; the suite
    asks for several lists more than once); every call gets a copy of its own to change."""
    import copy

    return copy.deepcopy(_composed(tuple(overrides)))


class _ParsedYaml:
    """What OmegaConf sees as its ``yaml`` module in this test session: PyYAML, except that ``load`` parses each text
    once and hands every caller a deep copy of the result. A composition parses some 40 YAML files of verl's and the
    recipe's, a third of its time, and the session composes a few hundred configurations from the same files; keyed
    by the text itself, an edited or new file is parsed anew. A text that fails to parse is parsed again from the
    caller's stream, so that the error names the file as PyYAML's own would."""

    def __init__(self, real):
        self.real, self.parsed = real, {}

    def __getattr__(self, name):
        return getattr(self.real, name)

    def load(self, stream, Loader):
        import copy

        text = stream if isinstance(stream, str) else stream.read()
        if text not in self.parsed:
            try:
                self.parsed[text] = self.real.load(text, Loader=Loader)
            except self.real.YAMLError:
                if isinstance(stream, str):
                    raise
                stream.seek(0)
                return self.real.load(stream, Loader=Loader)
        return copy.deepcopy(self.parsed[text])


def _parse_yaml_once_per_text() -> None:
    import omegaconf.omegaconf as omegaconf_module

    if not isinstance(omegaconf_module.yaml, _ParsedYaml):
        omegaconf_module.yaml = _ParsedYaml(omegaconf_module.yaml)


def _parse_interpolations_once() -> None:
    """OmegaConf parses an interpolation (``${...}``) with its ANTLR grammar each time it resolves one; resolving verl's
    whole config parses some 400, most of a start-up check's time, and the session resolves a few hundred configs with
    the same strings. Here each string is parsed once (a parse tree is only read when resolved; one that fails to
    parse is not kept, so it fails again)."""
    import omegaconf._utils
    import omegaconf.base

    if not hasattr(omegaconf.base.parse, "cache_info"):
        cached = functools.lru_cache(maxsize=None)(omegaconf.base.parse)
        omegaconf.base.parse = omegaconf._utils.parse = cached


_parse_yaml_once_per_text()
_parse_interpolations_once()


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]):
    from recipe_dapo.config.compose import compose

    return compose(list(overrides))


def small_run(data_overrides, *extra) -> list[str]:
    """Overrides of a valid small configuration (the default CPU run's sizes on a 2-GPU node, no model parallelism:
    the tiny model has 2 attention heads) on the given data, plus ``extra``."""
    return [
        *data_overrides,
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "data.max_response_length=32",
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "reward.reward_kwargs.overlong_buffer_cfg.len=8",
        *extra,
    ]


def fresh_pythons(*runs: tuple[str, dict], timeout: float = 300) -> list[str]:
    """Run each ``(code, env)`` in a fresh interpreter (``python -c code`` with exactly ``env``), all at once (each
    mostly imports verl, one core's work: two at a time halve the wait on 2 cores); the last stdout line of each, in
    order. A failing one fails the test with its stderr."""
    import subprocess

    started = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for code, env in runs]
    lines = []
    try:
        for process in started:
            out, err = process.communicate(timeout=timeout)
            assert process.returncode == 0, err[-3000:]
            lines.append(out.strip().splitlines()[-1])
    finally:  # a failed or timed-out one leaves none of the others running
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return lines


def ray_runtime_env_as_verl_builds_it(config) -> dict:
    """The runtime env verl's run_ppo passes to ray.init: its defaults with ray_init.runtime_env on top."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    merged = OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.get("runtime_env", {}))
    return OmegaConf.to_container(merged)


@pytest.fixture(scope="module")
def transfer_queue():
    """verl's TransferQueue on a Ray cluster of the test module's own (v1's group store, as the v1 trainer runs it)."""
    import ray
    import transfer_queue as tq

    # address="local": a cluster of its own, never one another process on the machine started (`ray start`).
    ray.init(address="local", num_cpus=4, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


@pytest.fixture(scope="session")
def default_assets(tmp_path_factory):
    """The default run's inputs (synthetic data, BPE tokenizer, warmed-up tiny Qwen2), built once per session."""
    from recipe_dapo.cpu.assets import build_default_assets

    return build_default_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture
def engine_health():
    """A stand-in for vLLM's HTTP server's ``GET /health`` (200 while the engine runs, 503 once it died): ``.address``
    (host:port) and ``.status``, which the test sets; ``.answering = False``: requests are accepted and never answered
    (until it is set back); ``.stop()``: the server closes its port (connections are refused; ``status`` is None)."""
    import http.server
    import threading
    from types import SimpleNamespace

    answer, closed = threading.Event(), threading.Event()
    answer.set()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            while not answer.wait(0.05):
                if closed.is_set():
                    return
            self.send_response(state.status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *_):
            pass

    class State(SimpleNamespace):
        @property
        def answering(self) -> bool:
            return answer.is_set()

        @answering.setter
        def answering(self, value: bool) -> None:
            answer.set() if value else answer.clear()

        def stop(self) -> None:
            if not closed.is_set():
                closed.set()
                server.shutdown()
                server.server_close()
            self.status = None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state = State(status=200, address=f"127.0.0.1:{server.server_address[1]}")
    try:
        yield state
    finally:
        state.stop()
