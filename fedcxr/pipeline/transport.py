"""The transport interface round protocols are written against (DESIGN §8).

A protocol says "send this model to these sites for this task and give me their replies";
a transport carries that out. Two implementations exist: :class:`InProcessTransport` (every
site is a :class:`~fedcxr.pipeline.site_runner.SiteRunner` in this process) and the NVIDIA
FLARE transport in :mod:`fedcxr.pipeline.flare_app`. Only parameters, counts, class names
and metrics travel in a :class:`Reply` — never images, labels or identifiers.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional

import torch

if TYPE_CHECKING:  # pragma: no cover
    from fedcxr.pipeline.site_runner import SiteRunner

StateDict = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


@dataclass
class Reply:
    """What one site sends back for one task."""

    site: str
    params: Optional[StateDict] = None
    n_samples: int = 0
    n_batches: int = 0
    class_set: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


class Transport(ABC):
    """Carries tasks to sites and replies back; implementations differ in where sites live."""

    site_names: list[str]

    @abstractmethod
    def run(
        self,
        task: str,
        targets: list[str],
        params: Optional[StateDict],
        config: dict,
        *,
        per_site: Optional[Mapping[str, tuple[Optional[StateDict], dict]]] = None,
    ) -> dict[str, Reply]:
        """Send ``task`` to ``targets`` and return the replies of the sites that answered.

        ``per_site`` overrides ``(params, config)`` for the named sites (e.g. FedBN's
        per-site models). A site that died or timed out is simply absent from the result;
        the protocol decides whether the round can go on (``min_sites``).
        """


class InProcessTransport(Transport):
    """Every site is a Python object in this process (the default, and the tests' transport)."""

    def __init__(self, runners: Mapping[str, "SiteRunner"]):
        self.runners = dict(runners)
        self.site_names = list(self.runners)

    def run(self, task, targets, params, config, *, per_site=None):
        replies = {}
        for site in targets:
            site_params, site_config = (per_site or {}).get(site, (params, config))
            replies[site] = self.runners[site].handle(task, site_params, dict(site_config))
        return replies

    # In-process runs checkpoint the sites' local state with the server's (FLARE clients keep
    # their own in their workspaces).
    def local_states(self) -> dict[str, dict]:
        return {name: runner.get_local_state() for name, runner in self.runners.items()}

    def load_local_states(self, states: Mapping[str, dict]) -> None:
        for name, state in states.items():
            if name in self.runners:
                self.runners[name].set_local_state(state)
