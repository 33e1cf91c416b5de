"""What ``fedcxr flare poc`` decides while its job runs (issue 31; :mod:`fedcxr.flare.poc_watch`), with a
scripted FLARE admin session and clock: every wait bounded, and what it waited for said.

On a real POC system: ``test_poc_faults.py``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedcxr.flare import poc_watch
from fedcxr.flare.controller import read_status, write_status
from fedcxr.flare.poc_watch import JobWatch, ServerLost, mark_server_lost, site_states

JOB = "job-1"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Session:
    """FLARE's admin API as the watch uses it: scripted answers, every call recorded."""

    def __init__(self, status="RUNNING", clients=None):
        self.status, self.clients, self.calls, self.down = status, clients or [], [], None

    def get_job_meta(self, job_id):
        self.calls.append("get_job_meta")
        if self.down:
            raise self.down
        return {"status": self.status}

    def get_client_job_status(self, names):
        self.calls.append("check_status client")
        if self.down:
            raise self.down
        return self.clients

    def abort_job(self, job_id):
        self.calls.append("abort_job")
        self.status = "FINISHED:ABORTED"


def _running(site):
    return {"client_name": site, "status": "started", "job_id": JOB, "app_name": f"app_{site}"}


def _runs(tmp_path, status="running"):
    run = tmp_path / "run"
    write_status(run, status, rejected=[{"site": "b", "reason": "NaN"}])
    return [(SimpleNamespace(rounds=5), run)]


def _watch(session, runs, *, alive=True, clock=None):
    return JobWatch(session, JOB, runs, ["a", "b"], lambda: alive, clock=clock or Clock())


def test_site_states_read_flares_check_status_answer():
    answer = [_running("a"), {"client_name": "b", "status": "no_jobs"}, {"client_name": "c", "status": "no_reply"},
              {"client_name": "d", "status": "started", "job_id": "another job"}, "junk", {"status": "started"}]
    assert site_states(answer, JOB) == {"a": "running", "b": "no_job", "c": "no_reply", "d": "no_job"}


def test_a_server_whose_process_is_gone_ends_the_wait_at_once_with_a_message(tmp_path):
    """Issue 31: the command died with a 66-line NVFLARE traceback (NoConnection) and no hint."""
    session = Session()
    session.down = ConnectionError("no connection to server")
    with pytest.raises(ServerLost, match=r"the FLARE server stopped while job job-1 ran \(its process is gone; "
                                         r"ConnectionError\); run: 0 of 5 rounds done"):
        _watch(session, _runs(tmp_path), alive=False).done()


def test_a_server_that_does_not_answer_is_given_a_bounded_time(tmp_path):
    session, clock = Session(), Clock()
    watch = _watch(session, _runs(tmp_path), clock=clock)
    session.down = TimeoutError("busy")
    assert watch.done() is False
    clock.now = poc_watch.SERVER_SILENCE_S - 1
    assert watch.done() is False
    session.down = None  # it answered again: the count starts over
    assert watch.done() is False
    session.down = TimeoutError("busy")
    clock.now += 1
    assert watch.done() is False
    clock.now += poc_watch.SERVER_SILENCE_S
    with pytest.raises(ServerLost, match=r"no answer for 30 s; TimeoutError"):
        watch.done()


def test_a_site_back_without_a_process_for_the_job_is_brought_back_by_a_resubmission(tmp_path, caplog):
    """Issue 31: a restarted client registered again and never trained again."""
    session, clock = Session(clients=[_running("a"), _running("b")]), Clock()
    watch = _watch(session, _runs(tmp_path), clock=clock)
    assert watch.done() is False and watch.ran == {"a", "b"}
    session.clients = [_running("a"), {"client_name": "b", "status": "no_reply"}]  # killed
    clock.now += poc_watch.SITE_POLL_S
    with caplog.at_level(logging.WARNING, logger="fedcxr.flare.poc_watch"):
        assert watch.done() is False and watch.rejoin == []
        session.clients = [_running("a"), {"client_name": "b", "status": "no_jobs"}]  # started again
        assert watch.done() is False, "the sites are asked every SITE_POLL_S, not at every tick"
        clock.now += poc_watch.SITE_POLL_S
        assert watch.done() is True and watch.rejoin == ["b"]
    assert "site b: its FLARE client does not answer" in caplog.text
    assert "the job is submitted again with --resume" in caplog.text


def test_a_site_not_yet_started_or_a_run_already_over_is_no_reason_to_resubmit(tmp_path):
    session, clock = Session(clients=[_running("a"), {"client_name": "b", "status": "no_jobs"}]), Clock()
    watch = _watch(session, _runs(tmp_path), clock=clock)
    assert watch.done() is False and watch.rejoin == []  # b never ran this job (still being deployed)
    over = _watch(Session(clients=[_running("a"), _running("b")]), _runs(tmp_path, "finished"), clock=clock)
    over.done()
    over.session.clients = [{"client_name": "a", "status": "no_jobs"}, {"client_name": "b", "status": "no_jobs"}]
    clock.now += poc_watch.SITE_POLL_S
    over.done()
    assert over.rejoin == [], "the sites leave a job that ended: nothing to rejoin"


def test_a_job_flare_keeps_open_after_its_runs_ended_is_aborted_within_a_bound(tmp_path, caplog):
    """Issue 31: `fedcxr flare poc` still ran a minute after the server said finished (FLARE waits up to
    900 s for the outcome of a client that stopped mid-job)."""
    session, clock = Session(clients=[_running("a"), {"client_name": "b", "status": "no_reply"}]), Clock()
    watch = _watch(session, _runs(tmp_path, "finished"), clock=clock)
    watch.ran = {"a", "b"}
    assert watch.done() is False
    clock.now = poc_watch.SETTLE_S - 1
    assert watch.done() is False and "abort_job" not in session.calls
    clock.now = poc_watch.SETTLE_S + 1
    with caplog.at_level(logging.WARNING, logger="fedcxr.flare.poc_watch"):
        assert watch.done() is True
    assert "abort_job" in session.calls
    assert "FLARE kept the job open, waiting for the outcome of b" in caplog.text


def test_a_job_without_fedcxr_runs_is_never_aborted_for_lingering(tmp_path):
    clock = Clock()
    watch = JobWatch(Session(), JOB, [], [], lambda: True, clock=clock, can_rejoin=False)
    clock.now = 10 * poc_watch.SETTLE_S
    assert watch.done() is False  # the statistics job: it ends when FLARE says so


def test_a_lost_server_leaves_each_unfinished_run_marked_stopped_with_what_happened(tmp_path):
    runs = _runs(tmp_path)
    run_json = runs[0][1] / "run.json"
    run_json.write_text(json.dumps({"status": "running", "method": "FedAvg"}))
    done = tmp_path / "done"
    write_status(done, "finished", missed=[])
    mark_server_lost([*runs, (SimpleNamespace(rounds=5), done)], "the FLARE server stopped while job x ran")
    status = read_status(runs[0][1])
    assert status["status"] == "stopped" and status["error"] == "the FLARE server stopped while job x ran"
    assert status["rejected"] == [{"site": "b", "reason": "NaN"}], "the refused replies stay on record"
    assert json.loads(run_json.read_text())["status"] == "stopped"
    assert read_status(done)["status"] == "finished", "a finished run is left as it is"


def test_poc_kits_drop_a_silent_client_after_the_poc_heartbeat_timeout(tmp_path):
    from fedcxr.flare.poc import POC_HEARTBEAT_TIMEOUT_S, set_heartbeat_timeout

    kit = tmp_path / "server"
    (kit / "local").mkdir(parents=True)
    (kit / "local" / "resources.json.default").write_text(json.dumps({"servers": [{"heart_beat_timeout": 600}]}))
    set_heartbeat_timeout(kit)
    written = json.loads(Path(kit / "local" / "resources.json").read_text())
    assert written["servers"][0]["heart_beat_timeout"] == POC_HEARTBEAT_TIMEOUT_S == 30
