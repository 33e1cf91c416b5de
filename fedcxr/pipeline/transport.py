"""The transport interface round protocols are written against (DESIGN §8).

A protocol says "send this model to these sites for this task and give me their replies";
a transport carries that out. Two implementations exist: :class:`~fedcxr.pipeline.inprocess.
InProcessTransport` (every site is a :class:`~fedcxr.pipeline.site_runner.SiteRunner` in this
process) and the NVIDIA FLARE transport (:mod:`fedcxr.flare.controller`). Only what
:class:`~fedcxr.pipeline.messages.Reply` carries comes back: parameters, counts, class names
and metrics — never images, labels or identifiers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import MappingProxyType
from typing import Mapping, Optional

from fedcxr.pipeline.messages import Reply, StateDict, TaskConfig


class Transport(ABC):
    """Carries tasks to sites and replies back; implementations differ in where sites live."""

    site_names: list[str]
    #: The secure aggregation of a transport whose replies are ciphertexts (``privacy.secure_aggregation``:
    #: :class:`fedcxr.flare.secure_aggregation.SealedAggregation` on FLARE): the protocols check and
    #: average replies through it (:func:`fedcxr.pipeline.protocols.base.sealed_aggregation`). None:
    #: replies are plain tensors.
    sealed = None
    #: Why each target of the latest :meth:`run` that is absent from its replies did not answer:
    #: ``{site: {"why": "late" | "dropped" | "error" | "refused" | "no reply", "reason": text}}``
    #: (a transport replaces it on every call; the protocols record it in ``run.json`` ``missed``).
    absent: Mapping[str, dict] = MappingProxyType({})

    @abstractmethod
    def run(
        self,
        task: str,
        targets: list[str],
        params: Optional[StateDict],
        config: Optional[TaskConfig],
        *,
        per_site: Optional[Mapping[str, tuple[Optional[StateDict], TaskConfig]]] = None,
    ) -> dict[str, Reply]:
        """Send ``task`` to ``targets`` and return the replies of the sites that answered.

        ``config`` is the task's typed config (:mod:`fedcxr.pipeline.messages`; ``None`` for a
        task that takes none). ``per_site`` overrides ``(params, config)`` for the named sites
        (e.g. FedBN's per-site models). A site that died or timed out is simply absent from the result
        (why: :attr:`absent`); the protocol decides whether the round can go on (``participation.min_sites``).
        """

    def absence_reason(self, site: str) -> Optional[str]:
        """Why ``site`` sent no usable reply to the last task it was asked (``run.json`` ``missed``
        keeps it), or None where the transport cannot tell (FLARE can: :mod:`fedcxr.flare.liveness`)."""
        return None

    def local_states(self) -> dict[str, dict]:
        """The sites' local state to checkpoint with the server's (in-process runs only).

        FLARE clients keep their own local state in their workspaces: nothing to return.
        """
        return {}

    def load_local_states(self, states: Mapping[str, dict]) -> None:
        """Restore what :meth:`local_states` returned (resume); a no-op where sites keep their own."""

    def close(self) -> None:
        """Release what the transport started (the parallel simulator's worker processes); idempotent,
        and a no-op where it started nothing. The run driver calls it however the run ends."""
