"""A simulated consortium in one process (``simulate:``): the in-process sites on a virtual clock.

:class:`SimulatedConsortium` wraps the run's in-process transport. Every task that belongs to a
round (its config carries the round number: the training tasks) goes through the clock of
:mod:`fedcxr.pipeline.virtual_clock`:

* a site that drops out of the round (``simulate.dropout``, one draw per site and round) is not
  asked: it never trains that round, its local state does not change;
* every other asked site trains for real (its local state — FedBN statistics, SCAFFOLD's c_i, a
  kept optimiser — advances as it would in a real consortium), and its reply arrives at its
  simulated time; a reply after ``participation.deadline_s`` is late and discarded, as a real
  server discards a reply that comes after the round closed. (Skipping the training of a late
  site would save CPU but would leave its local state where a real site's is not.)
* the task stays open until every asked site has answered or the deadline; the round's
  simulated duration is the sum of its tasks' (:meth:`round_record`).

Metadata, validation and other tasks without a round pass through untimed: the simulated round
time is the training's. Nothing waits; the result depends only on the seed.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional

from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.transport import Transport
from fedcxr.pipeline.virtual_clock import close_task, drops_out, reply_seconds, site_timings, state_bytes


def round_of(config, per_site: Optional[Mapping]) -> Optional[int]:
    """The round a task belongs to (its config's ``round``; per-site configs: the first's), or None."""
    value = getattr(config, "round", None)
    if value is None and per_site:
        value = getattr(next(iter(per_site.values()))[1], "round", None)
    return None if value is None else int(value)


class SimulatedConsortium(Transport):
    """The in-process sites on a virtual clock (module docstring); wraps ``inner``."""

    def __init__(self, inner: Transport, spec, *, seed: int, deadline_s: Optional[float], sources: list[str]):
        self.inner = inner
        self.site_names = list(inner.site_names)
        self.spec = spec
        self.seed = int(spec.seed if spec.seed is not None else seed)
        self.deadline_s = deadline_s
        self.timings = site_timings(spec, sources, [s for s in self.site_names if s not in sources], self.seed)
        self.rounds: dict[int, dict] = {}
        self.absent = MappingProxyType({})

    @property
    def sealed(self):
        return getattr(self.inner, "sealed", None)

    def run(self, task, targets, params, config, *, per_site=None) -> dict[str, Reply]:
        r = round_of(config, per_site)
        if r is None:
            replies = self.inner.run(task, targets, params, config, per_site=per_site)
            self.absent = MappingProxyType(dict(getattr(self.inner, "absent", None) or {}))
            return replies
        record = self.rounds.setdefault(r, {"round_s": 0.0, "tasks": 0, "late": [], "dropped": []})
        dropped = [s for s in targets if drops_out(self.timings[s], self.seed, r, s)]
        asked = [s for s in targets if s not in dropped]
        replies = self.inner.run(task, asked, params, config, per_site=per_site) if asked else {}
        arrivals: dict[str, Optional[float]] = {s: None for s in dropped}
        for site in asked:
            reply = replies.get(site)
            sent = (per_site or {}).get(site, (params, config))[0]
            arrivals[site] = None if reply is None else self.arrival(site, reply, sent)
        seconds, late = close_task(arrivals, self.deadline_s)
        record["round_s"] += seconds
        record["tasks"] += 1
        absent = {s: {"why": "dropped", "reason": f"dropped out of round {round_number(r)} (simulate.dropout "
                      f"{self.timings[s].dropout:g})"} for s in dropped}
        for site in late:
            absent[site] = {"why": "late", "reason": f"reply at {arrivals[site]:.1f} s, after the "
                            f"{self.deadline_s:g} s deadline (simulated clock)"}
            replies.pop(site, None)
        for site in asked:
            if site not in replies and site not in absent:
                absent[site] = dict((getattr(self.inner, "absent", None) or {}).get(site) or
                                    {"why": "no reply", "reason": "no reply"})
        record["late"] += [s for s in late if s not in record["late"]]
        record["dropped"] += [s for s in dropped if s not in record["dropped"]]
        self.absent = MappingProxyType(absent)
        return {s: replies[s] for s in targets if s in replies}

    def arrival(self, site: str, reply: Reply, sent) -> float:
        """Seconds after the task was sent at which ``reply`` reaches the server (:func:`reply_seconds`)."""
        reply_size = state_bytes(reply.params) + state_bytes(reply.extra)
        return reply_seconds(self.timings[site], steps=int(reply.n_batches), step_s=self.spec.step_s,
                             sent_bytes=state_bytes(sent), reply_bytes=reply_size,
                             bandwidth_mbit_s=self.spec.bandwidth_mbit_s)

    def round_record(self, r: int) -> dict:
        """Round ``r`` on the clock: ``{"round_s", "late", "dropped"}`` (seconds the round's training tasks
        stayed open; the sites late for any of them; the sites that dropped out)."""
        record = self.rounds.get(r, {"round_s": 0.0, "late": [], "dropped": []})
        return {"round_s": round(float(record["round_s"]), 3), "late": sorted(record["late"]),
                "dropped": sorted(record["dropped"])}

    def local_states(self) -> dict[str, dict]:
        return self.inner.local_states()

    def load_local_states(self, states) -> None:
        self.inner.load_local_states(states)

    def close(self) -> None:
        self.inner.close()


def simulated(cfg, transport: Transport) -> Transport:
    """``transport`` on the virtual clock of ``cfg.simulate`` (unchanged without one)."""
    if cfg.simulate is None:
        return transport
    sources = [cfg.site_name(s) for s in cfg.source_sites()]
    return SimulatedConsortium(transport, cfg.simulate, seed=cfg.seed, deadline_s=cfg.participation.deadline_s,
                               sources=sources)


def clock_record(transport: Transport, r: int, history: list[dict]) -> dict:
    """``{"simulated": {"round_s", "clock_s", "late", "dropped"}}`` for round ``r``'s metrics (``clock_s``:
    the simulated time since the run started, continued from ``history`` on resume); {} off the clock."""
    if not isinstance(transport, SimulatedConsortium):
        return {}
    record = transport.round_record(r)
    before = next((row["simulated"]["clock_s"] for row in reversed(history)
                   if isinstance(row.get("simulated"), dict) and "clock_s" in row["simulated"]), 0.0)
    return {"simulated": {"round_s": record["round_s"], "clock_s": round(float(before) + record["round_s"], 3),
                          "late": record["late"], "dropped": record["dropped"]}}


__all__ = ["SimulatedConsortium", "clock_record", "round_of", "simulated"]
