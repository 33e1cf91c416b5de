"""What ``fedcxr flare simulate|poc`` shows while FLARE trains in other processes (:mod:`fedcxr.flare.run`)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from fedcxr.flare import run as flare_run
from fedcxr.flare.run import wait_with_progress
from fedcxr.pipeline.run_log import ROUNDS_LOGGER, round_line
from fedcxr.rundir import write_metrics


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    """The waits between two looks at the files are the test's ticks: no real sleep."""
    monkeypatch.setattr(flare_run, "time", SimpleNamespace(time=time.time, sleep=lambda seconds: None))


def _row(r: int) -> dict:
    return {"round": r, "train": {"a": {"loss": 0.5 - r / 10}}, "val": {"b": {"mean_auroc": 0.6 + r / 10}},
            "seconds": 1.0}


def test_off_a_terminal_each_round_is_one_line_as_train_prints_it(tmp_path, caplog):
    """The server writes metrics.jsonl round by round (the file absent at first: no error); the waiting
    command logs each round's line once, as it ends, on the console when no bar is shown."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = SimpleNamespace(rounds=2)
    ticks = iter([None, [_row(0)], [_row(0)], [_row(0), _row(1)], "done"])

    def server_progress() -> bool:   # called once per tick: the server's next write
        step = next(ticks)
        if isinstance(step, list):
            write_metrics(run_dir, step)
        return step == "done"

    with caplog.at_level(logging.INFO, logger=ROUNDS_LOGGER):
        wait_with_progress(None, [(cfg, run_dir)], progress=False, done=server_progress)
    lines = [r for r in caplog.records if r.name == ROUNDS_LOGGER]
    assert [r.getMessage() for r in lines] == [round_line(_row(0), 2), round_line(_row(1), 2)]
    assert lines[0].getMessage().startswith("round 1/2 (1.0 s): loss a 0.500; val AUROC b 0.600")
    assert all(r.console is True for r in lines)   # no bar (progress off): the console shows them


def test_a_resumed_run_does_not_repeat_its_earlier_rounds_and_several_runs_are_named(tmp_path, caplog):
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):
        run_dir.mkdir()
        write_metrics(run_dir, [_row(0)])
    cfg = SimpleNamespace(rounds=2)
    calls = iter([False, True])

    def server_progress() -> bool:
        write_metrics(first, [_row(0), _row(1)])
        return next(calls)

    with caplog.at_level(logging.INFO, logger=ROUNDS_LOGGER):
        wait_with_progress(None, [(cfg, first), (cfg, second)], progress=False, done=server_progress, resume=True)
    assert [r.getMessage() for r in caplog.records if r.name == ROUNDS_LOGGER] == \
        [f"first: {round_line(_row(1), 2)}"]
