"""The server's record of each site's DP spending over a run (``privacy.dp``; DESIGN §8).

:class:`PrivacyLedger` wraps the run's transport: every reply that reports DP-SGD spending
(``metrics["dp"]``: noise multiplier, sampling rate, steps — :func:`fedcxr.pipeline.dp.spent`)
is added to that site's history, a list of plain ``[σ, q, steps]`` lists that
:mod:`fedcxr.pipeline.run_driver` stores in every checkpoint and restores on resume;
:meth:`PrivacyLedger.report` gives each site's ε for ``run.json["dp"]``.
"""

from __future__ import annotations

from typing import Optional

from fedcxr.pipeline.dp import epsilon, require_opacus
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.transport import Transport


class PrivacyLedger(Transport):
    """A transport wrapper on the server: records each site's DP spending from its replies."""

    def __init__(self, inner: Transport, delta: float):
        self.inner = inner
        self.site_names = inner.site_names
        self.delta = float(delta)
        self.history: dict[str, list[list[float]]] = {}

    def run(self, task, targets, params, config, *, per_site=None) -> dict[str, Reply]:
        replies = self.inner.run(task, targets, params, config, per_site=per_site)
        for site, reply in replies.items():
            used = reply.metrics.get("dp") if isinstance(reply.metrics, dict) else None
            if isinstance(used, dict) and used.get("steps"):
                self.history.setdefault(site, []).append(
                    [float(used["noise_multiplier"]), float(used["sample_rate"]), int(used["steps"])])
        return replies

    def absence_reason(self, site: str) -> Optional[str]:
        return self.inner.absence_reason(site)

    @property
    def absent(self):
        """Why the inner transport's absent sites did not answer (:attr:`Transport.absent`)."""
        return self.inner.absent

    def local_states(self) -> dict[str, dict]:
        return self.inner.local_states()

    def load_local_states(self, states) -> None:
        self.inner.load_local_states(states)

    def report(self) -> dict[str, dict]:
        """``{site: {"epsilon", "delta", "steps", "calls"}}`` so far."""
        return {site: {"epsilon": epsilon(calls, self.delta), "delta": self.delta,
                       "steps": sum(int(c[2]) for c in calls), "calls": len(calls)}
                for site, calls in sorted(self.history.items())}


def ledger_for(cfg, transport: Transport) -> tuple[Transport, Optional[PrivacyLedger]]:
    """``transport`` wrapped in a :class:`PrivacyLedger` when the config asks for DP."""
    if cfg.privacy.dp is None:
        return transport, None
    require_opacus()
    ledger = PrivacyLedger(transport, cfg.privacy.dp.delta)
    return ledger, ledger
