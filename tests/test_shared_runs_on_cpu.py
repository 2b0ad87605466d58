"""The e2e suite's background queue (tests/e2e/e2e_runs.py ``SharedRuns``): a test that would wait for a run still in
progress runs the queue's next runs itself meanwhile, only those whose needs have ended, and what it ran is read as
the queue's runs are."""

from __future__ import annotations

import threading

import e2e_runs
import pytest
from e2e_runs import SharedRuns


def test_a_waiting_test_runs_the_next_queued_run_and_leaves_one_whose_need_still_runs(tmp_path_factory, monkeypatch):
    released, ran_in = threading.Event(), {}

    def long_run(runs, work_dir, assets, env):
        ran_in["long"] = threading.current_thread().name
        # Ends only once "next" has run: with a queue of one lane and nobody taking "next" off it, this waits out
        # the timeout and the test fails.
        assert released.wait(timeout=30), "the queue's next run did not run while the test waited"
        return "long done"

    def next_run(runs, work_dir, assets, env):
        ran_in["next"] = threading.current_thread().name
        released.set()
        return "next done"

    def after_long(runs, work_dir, assets, env):
        ran_in["after"] = threading.current_thread().name
        return runs.result("long") + ", then after"

    def failing(runs, work_dir, assets, env):
        raise RuntimeError("a job that fails")

    for name, needs, function in (("long", (), long_run), ("after", ("long",), after_long),
                                  ("next", (), next_run), ("failing", (), failing)):
        monkeypatch.setitem(e2e_runs.JOBS, name, (needs, function))
    runs = SharedRuns(tmp_path_factory, assets={})
    try:
        for name in ("long", "after", "next", "failing"):
            runs.start(name)
        assert runs.result("long") == "long done"
        assert runs.result("after") == "long done, then after"
        assert runs.result("next") == "next done"
        with pytest.raises(RuntimeError, match="a job that fails"):  # a taken run's failure reaches its reader
            runs.result("failing")
    finally:
        runs.close()
    main = threading.main_thread().name
    assert ran_in["long"] != main and ran_in["next"] == main, ran_in
    assert ran_in["after"] != main, "a run whose need was still running was taken off the queue"
    marked = {line.split(":")[0]: "run by a test" in line for line in runs.summary()}
    assert marked["next"] and not marked["long"] and not marked["after"], runs.summary()


class Interrupted(BaseException):
    """Stands for what is not an error of the run: Ctrl-C, a test's timeout."""


def test_an_interrupt_in_a_taken_run_reaches_the_waiting_test_and_the_runs_readers(tmp_path_factory, monkeypatch):
    released = threading.Event()

    def long_run(runs, work_dir, assets, env):
        assert released.wait(timeout=30)
        return "long done"

    def interrupted(runs, work_dir, assets, env):
        released.set()
        raise Interrupted()

    for name, function in (("long", long_run), ("interrupted", interrupted)):
        monkeypatch.setitem(e2e_runs.JOBS, name, ((), function))
    runs = SharedRuns(tmp_path_factory, assets={})
    try:
        runs.start("long")
        runs.start("interrupted")
        with pytest.raises(Interrupted):  # not kept back while the test goes on waiting
            runs.result("long")
        with pytest.raises(Interrupted):  # and the interrupted run does not look like one still to come
            runs.result("interrupted")
        assert runs.result("long") == "long done"
    finally:
        runs.close()


class _Collected:
    """What the session's order reads of a collected test: its fixtures (with those they use), its markers, its
    parameters."""

    def __init__(self, name: str, fixtures: tuple = (), e2e: bool = True, trained_run: str | None = None):
        self.name, self.fixturenames, self.e2e = name, list(fixtures), e2e
        if trained_run:
            self.callspec = type("CallSpec", (), {"params": {"trained_run": trained_run}})()

    def get_closest_marker(self, name):
        return pytest.mark.e2e if name == "e2e" and self.e2e else None


def test_the_e2e_tests_that_read_no_queued_run_go_first_and_the_others_by_when_their_runs_end(monkeypatch):
    # The jobs their e2e modules register when collected (a unit-test session does not import them).
    for name in ("scale_job", "verl_api_tests"):
        if name not in e2e_runs.JOBS:
            monkeypatch.setitem(e2e_runs.JOBS, name, (("verl_overlay",), None))
    # In module order, as pytest collects them (the scale module before the evaluation command's, etc.).
    collected = [
        _Collected("scale: reads the two-node job", ("scale_job", "verl_overlay", "shared_runs")),
        _Collected("scale: against DP 1", ("scale_job", "classic_run", "shared_runs")),
        _Collected("evaluation command: no queued run", ("tmp_path",)),
        _Collected("e2e: v1 sigterm", ("v1_run", "v1_sigterm_run", "shared_runs")),
        _Collected("e2e: trained run", ("trained_run", "shared_runs"), trained_run="v1"),
        _Collected("verl 0.9.0: the refusal", ("verl_overlay", "shared_runs")),
        _Collected("a unit test", ("tmp_path",), e2e=False),
        _Collected("ablation smoke", ("ablation_smoke_run", "shared_runs")),
    ]
    ordered = [item.name for item in sorted(collected, key=e2e_runs.session_order(collected))]
    assert ordered == [
        "a unit test",
        "evaluation command: no queued run",
        "ablation smoke",
        "e2e: trained run",
        "e2e: v1 sigterm",
        "verl 0.9.0: the refusal",
        "scale: reads the two-node job",
        "scale: against DP 1",
    ]
