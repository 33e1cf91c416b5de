"""Faults on FLARE's POC system, end to end (issue 31 item 3): real processes, mTLS on loopback.

One run of FedAvg over two hospitals, ``--timeout 4``, in two POC sessions (a POC system costs
~40 s to provision, start and stop, so the faults share them):

session 1 (``fedcxr flare poc``): after round 1 hospital B's FLARE client — parent and job
process — is killed and started again at once; the rounds go on with A, B's are recorded as
missed; the command sees B's client back without a process for the job and submits the job again
with ``resume`` (FLARE 2.9 deploys a job to its clients only when it starts), so B trains again;
then the FLARE server is killed: the command ends with fedcxr's message (exit 1, the ``--resume``
command to run), never NVFLARE's traceback, and ``flare_status.json``/``run.json`` say ``stopped``.

session 2 (the printed ``--resume`` command): continues from the last complete round; B is killed
again, for good: once FLARE deems its client disconnected (the server's ``heart_beat_timeout``,
15 s here, + the job's 5 s grace) B is no longer asked, so those rounds do not wait the 4 s; the run
finishes, the command returns, every round is once in ``metrics.jsonl``, and the report names
B's missed rounds with why.

``--timeout 4`` is also shorter than a site's first task on a busy machine (its job process
starts, imports torch and fedcxr): without the start-up allowance the metadata query before
round 1 would fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from ..conftest import tiny_config
from .conftest import processes_mentioning

pytest.importorskip("nvflare")

A, B = "nih_style", "chexpert_style"
ROUNDS, TIMEOUT = 20, 4


def _kit(run: Path, participant: str) -> str:
    return str(run / "flare" / "poc" / "fedcxr" / "prod_00" / participant)


def _processes_of(run: Path, participant: str) -> list:
    """The POC processes of one participant (its start script, its parent process, its job process)."""
    import psutil

    kit, found = _kit(run, participant), []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if any(a == kit or a.startswith(kit + "/") for a in args):
            found.append(proc)
    return found


def _kill(run: Path, participant: str) -> None:
    """SIGKILL every process of ``participant`` (a machine that crashed) and wait until they are gone."""
    import psutil

    procs = _processes_of(run, participant)
    assert procs, f"no process of {participant}"
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    # what FLARE's start script asks of an admin after a crash: the pid files of the dead instance go
    for name in ("daemon_pid.fl", "pid.fl"):
        Path(_kit(run, participant), name).unlink(missing_ok=True)


def _restart(run: Path, site: str) -> None:
    """What a hospital's admin does: start its client again from its kit."""
    from fedcxr.flare.processes import nvflare_command, nvflare_env

    env = {**nvflare_env(), "NVFLARE_POC_WORKSPACE": str(run / "flare" / "poc")}
    done = subprocess.run(nvflare_command("poc", "start", "-p", site), env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _wait_for(what: str, check, thread: threading.Thread, seconds: float = 240):
    end = time.time() + seconds
    while time.time() < end:
        found = check()
        if found:
            return found
        assert thread.is_alive(), f"the command ended before {what}"
        time.sleep(0.1)
    raise AssertionError(f"waited {seconds} s for {what}")


def _command(argv: list[str]) -> tuple[threading.Thread, dict]:
    from fedcxr.cli import main

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(rc=main(argv), returned=time.time()))
    thread.start()
    return thread, box


@pytest.mark.slow
def test_a_poc_run_goes_on_without_a_killed_site_takes_it_back_and_resumes_after_its_server_died(
        tiny_manifests, tmp_path, monkeypatch, capsys):
    from fedcxr.flare import poc, poc_watch

    monkeypatch.setattr(poc, "POC_HEARTBEAT_TIMEOUT_S", 15)  # FLARE drops a silent client after 15 s here
    monkeypatch.setattr(poc_watch, "SITE_POLL_S", 2.0)  # the restarted B is seen sooner (the command: 5 s)
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg", target=None,
                                                 sites=[A, B], rounds=ROUNDS, eval_every=0, min_sites=1)))
    run = tmp_path / "run"
    argv = ["flare", "poc", str(config), "--out", str(run), "--timeout", str(TIMEOUT), "--bootstrap", "0"]

    # ---- session 1: B killed and restarted, then the server killed
    thread, box = _command(argv)
    _wait_for("round 1", lambda: len(_rows(run)) >= 1, thread)
    _kill(run, B)
    _restart(run, B)
    killed_at = len(_rows(run))
    back = _wait_for("B training again after the job was submitted again",
                     lambda: [r for r in _rows(run)[killed_at:] if B in r.get("train", {})], thread)
    _kill(run, "server")
    thread.join(timeout=120)
    assert not thread.is_alive(), "the command that lost its server did not return"
    out = capsys.readouterr()
    assert box["rc"] == 1 and "Traceback" not in out.err, out.err[-3000:]
    assert "run stopped: the FLARE server stopped while job" in out.err, out.err[-3000:]
    hint = re.search(r"continue with: (fedcxr flare poc .*--resume)", out.err)
    assert hint, out.err[-3000:]
    status = json.loads((run / "flare_status.json").read_text())
    assert status["status"] == "stopped" and "the FLARE server stopped" in status["error"]
    assert json.loads((run / "run.json").read_text())["status"] == "stopped"
    rejoined = back[0]["round"]
    assert any(r["round"] < rejoined and B not in r["train"] for r in _rows(run)), "B missed rounds before rejoining"

    # ---- session 2: the printed command resumes; B killed for good
    done_before = len(_rows(run))
    thread, box = _command(shlex.split(hint.group(1))[1:])
    _wait_for("a resumed round", lambda: len(_rows(run)) > done_before, thread)
    _kill(run, B)
    thread.join(timeout=400)
    assert not thread.is_alive(), "the resumed command did not return"
    out = capsys.readouterr()
    assert box["rc"] == 0, out.err[-3000:]

    rows = _rows(run)
    assert [r["round"] for r in rows] == list(range(ROUNDS)), "every round once in metrics.jsonl"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished"
    late = f"no reply within {TIMEOUT} s (--timeout)"
    reasons = {(m["round"], m["why"], m["reason"]) for m in info["missed"] if m["site"] == B}
    assert (1, "late", late) in reasons, reasons  # round 2: B killed while asked
    # session 1 may already have seen FLARE deem B disconnected before it came back: only session 2's verdict counts here
    gone = sorted(r for r, why, reason in reasons if (why, reason) == ("dropped", "disconnected") and r > rejoined)
    assert gone and gone[-1] == ROUNDS - 1, reasons  # FLARE's verdict, then never asked again
    for row in rows[gone[0] + 1:]:  # deemed disconnected (during round gone[0]): not asked, not waited for
        assert set(row["train"]) == {A} and row["seconds"] < TIMEOUT, row
    assert B in rows[rejoined]["train"]
    report = (run / "report.md").read_text()
    why = rf"dropped out × \d+ \(first: disconnected\), late \(deadline\) × \d+ \(first: {re.escape(late)}\)"
    assert re.search(rf"\| {B} \| \d+ \| [0-9–, ]+ \| {why}", report), report
    assert json.loads((run / "report.json").read_text())["sites"].keys() == {A}, "B cannot evaluate: it is gone"
    train_log = (run / "train.log").read_text()
    assert f"round 2: site {B} did not answer task train ({late})" in train_log
    assert re.search(rf"site {B}: FLARE deemed its client disconnected", train_log)
    ended = json.loads((run / "flare_status.json").read_text())["time"]  # the server's last word on the run
    assert box["returned"] - ended < 60, f"the command returned {box['returned'] - ended:.0f} s after the run ended"
    assert not processes_mentioning(str(run / "flare")), "a FLARE process of this run is still alive"
    assert os.path.isdir(run / "flare" / "logs" / "attempt-2") and not (run / "flare" / "poc").exists()
