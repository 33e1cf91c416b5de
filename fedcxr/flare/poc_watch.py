"""What ``fedcxr flare poc`` watches while its job runs: the server, the sites' clients, the job's end.

The command holds a FLARE admin session (:func:`fedcxr.flare.poc.submit_and_wait`) and asks,
twice a second, for the job's status, and every :data:`SITE_POLL_S` seconds which job each site's
client runs (FLARE's ``check_status client``: ``started``, ``no_jobs``, ``no_reply``). From those
answers :class:`JobWatch` decides, each decision bounded in time and logged with what it waited for:

* **the server stopped**: its admin commands fail and its process is gone, or they keep failing
  for :data:`SERVER_SILENCE_S` → :class:`ServerLost` (the command ends with a fedcxr message and
  a ``--resume`` hint, never NVFLARE's traceback; :func:`mark_server_lost` writes what happened into
  each run's ``flare_status.json``);
* **a site restarted**: its client answers again but runs no process for this job (FLARE 2.9
  deploys a job to its clients only when the job starts; a client that registers again mid-job is
  not a participant of the running job and gets no task, whatever its name) → :attr:`JobWatch.rejoin`:
  the command aborts the job and submits it again with ``resume``, so the restarted site takes part
  from the last complete round on (at most :data:`MAX_REJOINS` times per command);
* **the job lingers**: every run's status is final but FLARE still holds the job open — it waits up
  to ``client_outcome_wait_timeout`` (900 s) for each client's outcome, which a client killed
  mid-job never sends until the server drops it — → after :data:`SETTLE_S` the job is aborted and
  the command returns (the runs are complete).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Optional

from fedcxr.errors import RunFailed
from fedcxr.flare.controller import read_status, write_status
from fedcxr.rundir import RunDir

log = logging.getLogger(__name__)

#: seconds between two questions about the sites' clients (``check_status client``)
SITE_POLL_S = 5.0
#: seconds of failing admin commands, with the server's process still there, before the server counts as lost
SERVER_SILENCE_S = 30.0
#: seconds FLARE may keep a job open after the server's runs have all ended, before it is aborted
SETTLE_S = 45.0
#: seconds an aborted job may take to end
ABORT_WAIT_S = 60.0
#: times one command resubmits its job for restarted sites
MAX_REJOINS = 2
#: a run status the server writes when it is done with the run (``flare_status.json``)
FINAL_STATUSES = ("finished", "failed", "stopped")


class ServerLost(RunFailed):
    """The FLARE server stopped while the job ran; the runs' checkpoints are kept (resume with ``--resume``)."""


class JobWatch:
    """One submitted job seen through an admin ``session``; :meth:`done` is the wait's question.

    ``runs``: ``[(cfg, run_dir)]`` of the job (none: a job without fedcxr runs, e.g. the statistics
    job, is only watched for its end and its server); ``sites``: its clients; ``server_alive()``:
    whether the server's process still runs (POC: :func:`fedcxr.flare.poc.server_alive`);
    ``can_rejoin``: the caller resubmits the job for restarted sites (else they are not looked for).
    """

    def __init__(self, session, job_id: str, runs: list, sites: list[str], server_alive: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic, can_rejoin: bool = True):
        self.session, self.job_id, self.runs, self.sites = session, job_id, list(runs), list(sites)
        self.server_alive = server_alive
        self.clock = clock
        self.can_rejoin = can_rejoin
        self.status = ""
        self.ran: set[str] = set()  # sites seen running this job
        self.silent: set[str] = set()  # sites whose client does not answer (logged once)
        self.rejoin: list[str] = []  # sites that restarted: resubmit the job
        self._failing_since: Optional[float] = None
        self._next_site_poll = 0.0
        self._settled_since: Optional[float] = None
        self.aborted = ""  # why this watch aborted the job

    # ------------------------------------------------------------------ the wait's question
    def done(self) -> bool:
        """True once the job is over (FLARE says finished), a site must rejoin, or the job was aborted
        here because it lingered; :class:`ServerLost` when the server stopped."""
        meta = self._ask(lambda: self.session.get_job_meta(self.job_id))
        if meta is None:
            return False
        self.status = str(meta.get("status", ""))
        if self.status.startswith("FINISHED"):
            return True
        if self.sites and self.clock() >= self._next_site_poll:
            self._next_site_poll = self.clock() + SITE_POLL_S
            self._look_at_sites()
            if self.rejoin:
                return True
        return self._lingering()

    # ------------------------------------------------------------------ the server
    def _ask(self, call):
        """``call()``'s answer; None while the server does not answer (bounded: :class:`ServerLost`)."""
        try:
            answer = call()
        except Exception as exc:
            now = self.clock()
            if self._failing_since is None:
                self._failing_since = now
            if not self.server_alive() or now - self._failing_since >= SERVER_SILENCE_S:
                raise ServerLost(self._lost_message(exc)) from None
            log.debug("the FLARE server did not answer (%s: %s); asking again", type(exc).__name__, exc)
            return None
        self._failing_since = None
        return answer

    def _lost_message(self, exc: BaseException) -> str:
        done = ", ".join(f"{RunDir(d).root.name}: {RunDir(d).rounds_done()} of {cfg.rounds} rounds done"
                         for cfg, d in self.runs)
        how = "its process is gone" if not self.server_alive() else f"no answer for {SERVER_SILENCE_S:.0f} s"
        return f"the FLARE server stopped while job {self.job_id} ran ({how}; {type(exc).__name__}); {done}"

    # ------------------------------------------------------------------ the sites
    def _look_at_sites(self) -> None:
        answer = self._ask(lambda: self.session.get_client_job_status(self.sites))
        if not answer:
            return
        states = site_states(answer, self.job_id)
        for site, state in states.items():
            if state == "running":
                self.ran.add(site)
                if site in self.silent:
                    log.info("site %s: its FLARE client answers again", site)
                    self.silent.discard(site)
            elif state == "no_reply" and site not in self.silent:
                self.silent.add(site)
                log.warning("site %s: its FLARE client does not answer (stopped, or unreachable); the rounds go on "
                            "without it once FLARE deems it disconnected", site)
        if self.can_rejoin and not self.runs_over():
            self.rejoin = [s for s, state in states.items() if state == "no_job" and s in self.ran]
            if self.rejoin:
                log.warning("site(s) %s: the FLARE client is back but runs no process for job %s (FLARE 2.9 "
                            "deploys a job to its clients only when it starts); the job is submitted again with "
                            "--resume so that they take part from the last complete round",
                            ", ".join(self.rejoin), self.job_id)

    def runs_over(self) -> bool:
        """Every run of the job has a final status (``flare_status.json``; False for a job without runs)."""
        return bool(self.runs) and all(read_status(Path(d)).get("status") in FINAL_STATUSES for _, d in self.runs)

    # ------------------------------------------------------------------ the end
    def _lingering(self) -> bool:
        if not self.runs_over():
            self._settled_since = None
            return False
        now = self.clock()
        if self._settled_since is None:
            self._settled_since = now
        if now - self._settled_since < SETTLE_S:
            return False
        waiting = sorted(self.silent) or sorted(set(self.sites) - self.ran)
        self.aborted = (f"every run of job {self.job_id} ended {SETTLE_S:.0f} s ago but FLARE kept the job open"
                        + (f", waiting for the outcome of {', '.join(waiting)} (a client that stopped mid-job "
                           "never sends it)" if waiting else "") + "; the job was aborted, the runs are complete")
        log.warning("%s", self.aborted)
        abort_and_wait(self.session, self.job_id, self.clock)
        return True


def site_states(answer: list, job_id: str) -> dict[str, str]:
    """``{site: "running" | "no_job" | "no_reply" | ...}`` from FLARE's ``check_status client`` answer
    (``[{"client_name", "status", "job_id"?}]``): ``running`` — a process of ``job_id`` (starting,
    started); ``no_job`` — connected, no process of this job; ``no_reply`` — the client did not answer."""
    states: dict[str, str] = {}
    for entry in answer or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("client_name"), str):
            continue
        site, status = entry["client_name"], str(entry.get("status", ""))
        if entry.get("job_id") == job_id and status in ("starting", "started"):
            states[site] = "running"
        elif status == "no_reply":
            states.setdefault(site, "no_reply")
        elif states.get(site) != "running":
            states[site] = "no_job" if status in ("no_jobs", "stopped", "") or entry.get("job_id") != job_id \
                else status
    return states


def abort_and_wait(session, job_id: str, clock: Callable[[], float] = time.monotonic, *, wait: bool = True) -> str:
    """Abort ``job_id`` and wait, at most :data:`ABORT_WAIT_S`, for FLARE to end it; its last status
    (``wait=False``: only ask, e.g. on Ctrl-C, when the whole system is stopped right after)."""
    try:
        session.abort_job(job_id)
    except Exception as exc:  # already done, or the server went: the status below says which
        log.info("abort of FLARE job %s: %s: %s", job_id, type(exc).__name__, exc)
    if not wait:
        return ""
    end, status = clock() + ABORT_WAIT_S, ""
    while clock() < end:
        try:
            status = str(session.get_job_meta(job_id).get("status", ""))
        except Exception as exc:
            status = f"unknown ({type(exc).__name__})"
        if status.startswith("FINISHED"):
            return status
        time.sleep(0.5)
    log.warning("FLARE job %s was aborted but had not ended %.0f s later (status %s)", job_id, ABORT_WAIT_S, status)
    return status


def mark_server_lost(runs: list, message: str) -> None:
    """Each run whose status the server left unfinished (``submitted``/``running``) is marked ``stopped``
    with ``message`` in its ``flare_status.json`` (the replies refused so far stay on record), and in
    ``run.json`` (:meth:`RunDir.mark_stopped`)."""
    for _, run_dir in runs:
        RunDir(run_dir).mark_stopped()
        previous = read_status(Path(run_dir))
        if previous.get("status") in FINAL_STATUSES:
            continue
        write_status(Path(run_dir), "stopped", error=message, rejected=previous.get("rejected", []),
                     **{k: previous[k] for k in ("started", "evaluated_before") if k in previous})


__all__ = ["ABORT_WAIT_S", "FINAL_STATUSES", "JobWatch", "MAX_REJOINS", "SERVER_SILENCE_S", "SETTLE_S",
           "SITE_POLL_S", "ServerLost", "abort_and_wait", "mark_server_lost", "site_states"]
