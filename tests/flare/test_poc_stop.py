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
