"""Which of a task's sites the FLARE server still reaches, how long it waits for them, and why one is absent.

What FLARE 2.9 knows of a client that stopped (read in NVFLARE 2.9's ``FederatedServer`` and
``WFCommServer``; measured on a POC system, issue 31):

* the server's parent process logs the dropped connection at once, but only the client's
  heartbeats decide: a client silent for the server's ``heart_beat_timeout`` (``local/resources.json``
  of the server's startup kit: 600 s in provisioned kits; ``fedcxr flare poc`` writes
  :data:`fedcxr.flare.poc.POC_HEARTBEAT_TIMEOUT_S`) is logged out, and a client whose heartbeat no
  longer lists the job (its job process ended) is reported at once;
* the job's workflow then puts the client on a watch list and deems it *disconnected*
  ``dead_client_grace_period`` seconds later (FLARE's default 60; every fedcxr job sets
  :data:`DEAD_CLIENT_SETTINGS`), unless it is heard from again. From then on
  ``Controller.get_client_disconnect_time(name)`` answers, and a task still waiting only for
  disconnected clients ends (after ``dead_client_check_lead_time``);
* FLARE itself ends the job when fewer clients than the job's ``min_clients`` are left.

:class:`SiteLiveness` is the controller's use of that verdict: a disconnected site is not asked
again (so later rounds do not wait ``--timeout`` for it) and is recorded as missed, with the
reason; every absence gets its reason (:meth:`SiteLiveness.reason`), which ``run.json``'s
``missed`` and ``flare_status.json``'s ``absent`` keep.

A site's first tasks in a job also start its work: FLARE starts its job process (imports torch
and fedcxr), the first task opens its image cache and builds its network, the first training
task its data loader (10–60 s on a busy 2-core machine, measured). So every task up to and
including the site's first round of the job may take :data:`STARTUP_ALLOWANCE_S` beyond
``--timeout``: a tight ``--timeout`` does not cost a site the first round while it is still
starting. From its second round on, a task waits ``--timeout``. (Waiting for the sites to
register before round 1 would not do: a registered site is still far from ready to train.)
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Optional

log = logging.getLogger(__name__)

#: seconds a site's tasks up to its first round of a job may take beyond ``--timeout`` (it is starting)
STARTUP_ALLOWANCE_S = 120
#: FLARE's dead-client settings in every fedcxr job's server config (``config_fed_server.json``,
#: read by NVFLARE's ``WFCommServer`` in the job): a client reported dead is deemed disconnected 5 s
#: later (FLARE: 60 s), and a task waiting only for disconnected clients ends 10 s after it started at
#: the earliest (FLARE: 30 s)
DEAD_CLIENT_SETTINGS = {"dead_client_grace_period": 5.0, "dead_client_check_lead_time": 10.0}
#: the reason recorded for a site FLARE deemed disconnected
DISCONNECTED = "disconnected"


class SiteLiveness:
    """A job's record of its sites: asked yet, deemed disconnected by FLARE, why absent from a task.

    ``disconnect_time(site)``: FLARE's verdict (``Controller.get_client_disconnect_time``), the time
    the site's client was deemed disconnected or None. ``task_timeout``: ``--timeout`` (0: no limit).
    """

    def __init__(self, disconnect_time: Callable[[str], Optional[float]], task_timeout: int,
                 startup_allowance: float = STARTUP_ALLOWANCE_S):
        self.disconnect_time = disconnect_time
        self.task_timeout = int(task_timeout)
        self.startup_allowance = int(startup_allowance)
        self.started: set[str] = set()  # sites asked a round's task in this job: past their start-up
        self.reasons: dict[str, str] = {}
        self._logged: set[str] = set()

    def split(self, targets: Iterable[str], *, what: str = "") -> tuple[list[str], list[str]]:
        """``(sites to ask, sites FLARE deemed disconnected)``; each disconnected site is logged once
        (and again when it comes back). ``what``: the task, for the log (``round 3, task train``)."""
        live, gone = [], []
        for site in targets:
            since = self._gone_since(site)
            if since is None:
                if site in self._logged:
                    log.info("site %s: its FLARE client is connected again", site)
                    self._logged.discard(site)
                live.append(site)
                continue
            gone.append(site)
            self.reasons[site] = DISCONNECTED
            if site not in self._logged:
                self._logged.add(site)
                log.warning("site %s: FLARE deemed its client disconnected %s ago; from %s on it is not asked while "
                            "it stays so (each such task recorded as missed: %s)", site, _ago(since),
                            what or "now", DISCONNECTED)
        return live, gone

    def timeout(self, targets: Iterable[str], round_: Optional[int] = None, base: Optional[int] = None) -> int:
        """Seconds to wait for ``targets`` (0: no limit): ``base`` (default ``--timeout``; a round's
        ``participation.deadline_s``), plus :data:`STARTUP_ALLOWANCE_S` while one of them has not been
        asked a round's task in this job before (round-less tasks, e.g. the metadata query, and its
        first round). ``round_``: the task's round (None: none)."""
        targets = list(targets)
        starting = any(site not in self.started for site in targets)
        if isinstance(round_, int):
            self.started.update(targets)
        wait = self.task_timeout if base is None else int(base)
        if not wait:
            return 0
        return wait + (self.startup_allowance if starting else 0)

    def note_unanswered(self, sites: Iterable[str], waited: int) -> None:
        """The reason of the ``sites`` asked that sent nothing back: FLARE deemed them disconnected
        meanwhile, or the wait ended (``waited`` seconds; 0: FLARE ended it)."""
        for site in sites:
            if self._gone_since(site) is not None:
                self.reasons[site] = DISCONNECTED
            else:
                self.reasons[site] = f"no answer within {waited} s" if waited else "no answer"

    def note(self, site: str, reason: str) -> None:
        self.reasons[site] = reason

    def reason(self, site: str) -> Optional[str]:
        """Why ``site`` is absent from the last task it was part of (None: not recorded)."""
        return self.reasons.get(site)

    def _gone_since(self, site: str) -> Optional[float]:
        try:
            return self.disconnect_time(site)
        except Exception:  # FLARE's bookkeeping never stops a round: treat the site as reachable
            return None


def _ago(since: float) -> str:
    return f"{max(0.0, time.time() - float(since)):.0f} s"


__all__ = ["DEAD_CLIENT_SETTINGS", "DISCONNECTED", "STARTUP_ALLOWANCE_S", "SiteLiveness"]
