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
