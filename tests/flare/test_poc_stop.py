"""Stopping a POC system on a busy machine: ``nvflare poc stop`` can time out waiting for the
shutdown (exit 2) while the system is still going down; fedcxr asks once more, then ends what is left."""

from __future__ import annotations

import io
import subprocess

from fedcxr.flare import poc


def _answers(monkeypatch, answers):
    calls = []

    def fake(args, env, out, timeout):
        calls.append(args)
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        return subprocess.CompletedProcess(["nvflare", *args], answer)

    monkeypatch.setattr(poc, "run_nvflare", fake)
    return calls


def test_a_stop_that_timed_out_is_requested_once_more(monkeypatch):
    calls, out = _answers(monkeypatch, [2, 0]), io.StringIO()
    assert poc._request_stop({}, out) is True
    assert calls == [["poc", "stop"], ["poc", "stop"]]
    assert "attempt 1: exit code 2" in out.getvalue()


def test_a_stop_that_keeps_failing_is_logged_and_cleanup_goes_on(monkeypatch):
    out = io.StringIO()
    calls = _answers(monkeypatch, [subprocess.TimeoutExpired("nvflare", 120), 5])
    assert poc._request_stop({}, out) is False
    assert len(calls) == 2
    assert "attempt 1 failed" in out.getvalue() and "attempt 2: exit code 5" in out.getvalue()


def test_a_clean_stop_is_asked_once(monkeypatch):
    calls = _answers(monkeypatch, [0])
    assert poc._request_stop({}, io.StringIO()) is True and len(calls) == 1


def test_a_system_that_does_not_start_in_time_stops_the_command_with_a_message_not_a_traceback(monkeypatch, tmp_path):
    """Seen under load (issue 31): ``nvflare poc start`` outlived its wait and the command died with
    ``subprocess.TimeoutExpired``; now a RunFailed that says what did not start, and the system is cleaned up."""
    import sys

    import pytest

    from fedcxr.errors import RunFailed

    _answers(monkeypatch, [0])  # nvflare poc prepare
    stopped = []
    monkeypatch.setattr(poc, "allow_controller", lambda *a, **k: None)
    monkeypatch.setattr(poc, "set_heartbeat_timeout", lambda *a, **k: None)
    monkeypatch.setattr(poc, "nvflare_command", lambda *args: [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(poc, "stop_poc", lambda env, out, tree, workspace, logs: stopped.append(tree))
    monkeypatch.setattr(poc, "POC_START_TIMEOUT_S", 0.5)
    with pytest.raises(RunFailed, match=r"did not start within 0.5 s .*is the machine busy\? Nothing was trained"):
        with open(tmp_path / "poc.log", "w") as out, \
                poc.poc_system(tmp_path / "project.yml", tmp_path / "ws", {}, out, tmp_path / "poc.log", {}):
            pass
    assert len(stopped) == 1 and stopped[0] is not None, "the started processes are ended"
    import os
    import signal

    os.killpg(stopped[0].pgid, signal.SIGKILL)  # the stand-in for FLARE's start, still sleeping


def test_the_clients_of_a_server_that_died_are_ended_without_waiting_for_them_to_end_by_themselves(tmp_path):
    """They never would (they keep trying to reach their server): the command that lost its server
    waited 5 s for nothing before it ended them."""
    import os
    import sys
    import time

    from fedcxr.flare.processes import ProcessTree

    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        tree = ProcessTree(client.pid)
        tree.snapshot()
        start = time.time()
        tree.stop(grace=5, wait_first=False)
        client.wait(timeout=5)  # ended (psutil reaped it: no exit status left for Popen)
        assert time.time() - start < 3
    finally:
        if client.poll() is None:
            os.kill(client.pid, 9)


def test_a_poc_system_whose_server_died_is_stopped_without_the_first_wait(monkeypatch, tmp_path):
    stops = []

    class Tree:
        def adopt(self, text):
            pass

        def stop(self, grace=10.0, *, wait_first=True):
            stops.append((grace, wait_first))

    monkeypatch.setattr(poc, "server_alive", lambda workspace: False)
    monkeypatch.setattr(poc, "run_nvflare", lambda *a, **k: subprocess.CompletedProcess([], 0))
    for name in ("copy_logs", "copy_tensorboard", "copy_global_model"):
        monkeypatch.setattr(poc, name, lambda *a, **k: None)
    poc.stop_poc({}, io.StringIO(), Tree(), tmp_path / "ws", tmp_path / "logs")
    assert stops == [(5, False)]


def test_a_stopped_systems_start_script_shells_are_ended_not_waited_for(tmp_path):
    """After ``nvflare poc stop`` FLARE's processes are gone but each participant's ``sub_start.sh`` loop
    only notices at its next 5 s tick: the command waited for those shells. A FLARE process (here a
    Python one that needs 1.5 s) is still given its time to end by itself."""
    import os
    import sys
    import time

    import psutil

    from fedcxr.flare.processes import ProcessTree

    shell = subprocess.Popen(["bash", "-c", "while true; do sleep 5; done"], start_new_session=True)
    python = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"], start_new_session=True)
    try:
        tree = ProcessTree(shell.pid)
        tree.snapshot()
        tree.seen[python.pid] = psutil.Process(python.pid).create_time()
        start = time.time()
        tree.stop(grace=30)
        took = time.time() - start
        assert shell.poll() is not None and python.poll() is not None
        assert 1.0 < took < 10, took  # waited for the Python process, not for the shell's loop
    finally:
        for proc in (shell, python):
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
