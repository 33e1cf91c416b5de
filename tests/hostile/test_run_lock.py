"""Two processes in one run directory (SECURITY.md R5): the second stops, a dead holder's lock is taken over.

Before the lock, two ``fedcxr train`` into one ``--out`` both exited 0 and left a mixed run
(rounds 0, 0, 1, 1 in ``metrics.jsonl``). A holder process here stands in for the first run: it
takes the lock exactly as ``fedcxr train`` does, then waits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedcxr.cli import main
from fedcxr.errors import UserError
from fedcxr.runlock import LOCK_NAME, holder, run_lock

from ..conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time\nfrom fedcxr.runlock import run_lock\n"
        "with run_lock(sys.argv[1], sys.argv[2]):\n    print('locked', flush=True)\n    time.sleep(120)\n")


@pytest.fixture
def hold(tmp_path):
    """``hold(run_dir, command)``: a process holding ``run_dir``'s lock until the test ends (or is killed)."""
    started = []

    def start(run_dir: Path, command: str = "fedcxr train") -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), command], stdout=subprocess.PIPE,
                                text=True, env=env)
        started.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _config(tiny_manifests, tmp_path) -> Path:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)))
    return config


def test_a_second_train_into_a_run_directory_in_use_exits_2_naming_the_holder(tiny_manifests, tmp_path, hold,
                                                                              capsys):
    run = tmp_path / "run"
    proc = hold(run)
    code = main(["train", str(_config(tiny_manifests, tmp_path)), "--out", str(run), "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{run} is in use by another fedcxr process (pid {proc.pid} on host" in err and "`fedcxr train`" in err
    assert "Traceback" not in err
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists(), "nothing was written"
    assert holder(run)["pid"] == proc.pid, "the holder's lock file is left alone"


def test_evaluate_refuses_a_run_directory_being_written(tmp_path, hold, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    proc = hold(run)
    code = main(["evaluate", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and f"pid {proc.pid}" in err and "in use" in err


def test_the_flare_runner_refuses_a_run_directory_in_use(tiny_manifests, tmp_path, hold):
    from fedcxr.flare.simulator import simulate
    from fedcxr.pipeline.config import load_config

    run = tmp_path / "run"
    proc = hold(run, "fedcxr flare poc")
    cfg = load_config(_config(tiny_manifests, tmp_path))
    with pytest.raises(UserError, match=f"in use by another fedcxr process \\(pid {proc.pid} .*fedcxr flare poc"):
        simulate(cfg, run, progress=False)
    assert not (run / "flare").exists(), "no job was written"


def test_a_stale_lock_of_a_killed_process_is_named_and_taken_over(tmp_path, hold, caplog):
    run = tmp_path / "run"
    proc = hold(run)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / LOCK_NAME).is_file(), "kill -9 leaves the file behind"
    with caplog.at_level(logging.WARNING, logger="fedcxr.runlock"):
        with run_lock(run, "fedcxr evaluate"):
            assert holder(run)["pid"] == os.getpid() and holder(run)["command"] == "fedcxr evaluate"
    assert f"stale lock of pid {proc.pid} on host" in caplog.text and "no longer running" in caplog.text
    assert not (run / LOCK_NAME).exists(), "released: the file is removed"


def test_the_lock_is_released_when_the_command_fails_and_re_entrant_in_one_process(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with run_lock(run, "fedcxr train"):
            raise RuntimeError("the run broke")
    assert not (run / LOCK_NAME).exists()
    with run_lock(run, "fedcxr sweep"):
        with run_lock(run, "fedcxr evaluate"):  # sweep evaluating the run it trained
            pass
        assert json.loads((run / LOCK_NAME).read_text())["command"] == "fedcxr sweep", "still held by the outer"
    assert not (run / LOCK_NAME).exists()


def test_a_garbled_stale_lock_file_is_named_briefly_and_taken_over(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_bytes(b"\xff\xfe not json " * 1000)
    with caplog.at_level(logging.WARNING, logger="fedcxr.runlock"):
        with run_lock(run, "fedcxr train"):
            assert holder(run)["pid"] == os.getpid()
    assert "unreadable lock file" in caplog.text and len(caplog.text) < 1000
