"""A simulated consortium's clock (``simulate:``): pure arithmetic, no waiting (README "Running a consortium").

The FeTS 2022 challenge simulated its federation this way: each collaborator's compute and
network times were drawn from real sites, a round lasts as long as its slowest selected site, and
nothing really waits. Here (every draw from :func:`~fedcxr.pipeline.keys.derive_seed`, so a run and
its resume agree):

* :func:`site_timings` — each site's speed, one-way latency and drop-out probability, drawn once
  per site from the seed and the site's name (adding a site changes no other site's draw);
* :func:`reply_seconds` — when a site's reply arrives after a task is sent: latency, the sent
  model's bytes over the link, its steps × ``step_s`` / speed of training, latency and the reply's
  bytes back;
* :func:`drops_out` — whether a site drops out of round r (one draw per site and round);
* :func:`close_task` — when a task closes (every asked site answered, or the deadline) and who was late.

Units: seconds; bandwidth in Mbit/s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from fedcxr.pipeline.keys import derive_seed


@dataclass(frozen=True)
class Timing:
    """One site's simulated compute and network: ``speed`` (1: ``step_s`` per step), ``latency_s``
    one way, ``dropout`` probability per round."""

    speed: float
    latency_s: float
    dropout: float


def draw(value: Any, seed: int, what: str, site: str) -> float:
    """``value`` when it is a number, else a log-normal draw ``median · exp(spread · z)`` for ``site``.

    ``value`` is a number or an object/mapping with ``median`` and ``spread``
    (:class:`~fedcxr.pipeline.config_consortium.LogNormal`)."""
    if isinstance(value, (int, float)):
        return float(value)
    median, spread = _get(value, "median"), _get(value, "spread")
    z = random.Random(derive_seed(seed, "simulate", what, site)).gauss(0.0, 1.0)
    return float(median) * math.exp(float(spread) * z)


def _get(value: Any, key: str) -> Any:
    return value[key] if isinstance(value, Mapping) else getattr(value, key)


def site_timings(spec: Any, sources: Iterable[str], others: Iterable[str], seed: int) -> dict[str, Timing]:
    """Each site's :class:`Timing` under ``spec`` (a :class:`~fedcxr.pipeline.config_consortium.SimulateConfig`).

    ``sources`` drop out with ``spec.dropout``; ``others`` (the target, which the run cannot do
    without) never do unless ``spec.sites`` gives them a drop-out probability. ``spec.sites``'s
    fixed values replace the drawn ones."""
    out = {}
    sources = list(sources)
    for site in [*sources, *[s for s in others if s not in sources]]:
        fixed = spec.sites.get(site)
        speed = _fixed(fixed, "speed")
        latency = _fixed(fixed, "latency_s")
        dropout = _fixed(fixed, "dropout")
        out[site] = Timing(
            speed=speed if speed is not None else draw(spec.speed, seed, "speed", site),
            latency_s=latency if latency is not None else draw(spec.latency_s, seed, "latency", site),
            dropout=dropout if dropout is not None else (float(spec.dropout) if site in sources else 0.0))
    return out


def _fixed(entry: Any, key: str) -> Optional[float]:
    value = None if entry is None else getattr(entry, key, None)
    return None if value is None else float(value)


def transfer_seconds(n_bytes: int, bandwidth_mbit_s: Optional[float]) -> float:
    """Seconds ``n_bytes`` take over a link of ``bandwidth_mbit_s`` (0 when bandwidth is not modelled)."""
    if not bandwidth_mbit_s:
        return 0.0
    return 8.0 * float(n_bytes) / (float(bandwidth_mbit_s) * 1e6)


def reply_seconds(timing: Timing, *, steps: int, step_s: float, sent_bytes: int = 0, reply_bytes: int = 0,
                  bandwidth_mbit_s: Optional[float] = None) -> float:
    """When a site's reply arrives, in seconds after the task was sent::

        latency + sent_bytes/bandwidth + steps·step_s/speed + latency + reply_bytes/bandwidth
    """
    compute = max(int(steps), 0) * float(step_s) / float(timing.speed)
    network = 2.0 * timing.latency_s + transfer_seconds(sent_bytes, bandwidth_mbit_s) + \
        transfer_seconds(reply_bytes, bandwidth_mbit_s)
    return network + compute


def drops_out(timing: Timing, seed: int, r: int, site: str) -> bool:
    """Whether ``site`` drops out of round ``r`` (one draw per site and round: it misses every task of the round)."""
    if timing.dropout <= 0:
        return False
    return random.Random(derive_seed(seed, "dropout", r, site)).random() < timing.dropout


def close_task(arrivals: Mapping[str, Optional[float]], deadline_s: Optional[float]) -> tuple[float, list[str]]:
    """``(seconds the task stays open, sites late)`` for the asked sites' reply times (None: dropped out).

    The task closes when every asked site has answered, or at ``deadline_s``: a reply after it is
    late. A site that dropped out keeps the task open until the deadline (the server cannot tell
    it from a slow one); without a deadline the server is taken to learn of a drop-out at once (FLARE
    would, after its heartbeat timeout) and the task closes at the last reply."""
    late = sorted(s for s, t in arrivals.items() if t is not None and deadline_s is not None and t > deadline_s)
    dropped = any(t is None for t in arrivals.values())
    if deadline_s is not None and (late or dropped):
        return float(deadline_s), late
    times = [t for t in arrivals.values() if t is not None]
    return (max(times) if times else 0.0), late


def state_bytes(state: Optional[Mapping[str, Any]]) -> int:
    """Bytes of a model's tensors on the wire (numel × element size; 0 for none)."""
    if not state:
        return 0
    return int(sum(v.numel() * v.element_size() for v in state.values() if hasattr(v, "element_size")))


__all__ = ["Timing", "close_task", "draw", "drops_out", "reply_seconds", "site_timings", "state_bytes",
           "transfer_seconds"]
