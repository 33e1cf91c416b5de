"""Sites that answer from a script: a protocol's round checked by hand, without data or training.

:class:`ScriptedSites` is a :class:`~fedcxr.pipeline.transport.Transport` whose sites answer each
task with a function of what they were sent, and which records every task it carried, so a test
can check both what a protocol asked of each site and what it made of the replies.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.protocols import Context, get_protocol
from fedcxr.pipeline.transport import Transport

#: ``answer(task, site, params, config)`` → the site's reply, or ``None`` for a site that does not answer
Answer = Callable[[str, str, Optional[dict], object], Optional[Reply]]


class ScriptedSites(Transport):
    """Every site answers through ``answer``; ``calls`` lists ``(task, site, params, config)`` in order."""

    def __init__(self, answer: Answer, site_names: list[str]):
        self.answer = answer
        self.site_names = list(site_names)
        self.calls: list[tuple[str, str, Optional[dict], object]] = []

    def run(self, task, targets, params, config, *, per_site=None):
        replies = {}
        for site in targets:
            sent_params, sent_config = (per_site or {}).get(site, (params, config))
            self.calls.append((task, site, sent_params, sent_config))
            reply = self.answer(task, site, sent_params, sent_config)
            if reply is not None:
                replies[site] = reply
        return replies

    def sent(self, task: str) -> list[tuple[str, Optional[dict], object]]:
        """``(site, params, config)`` of every ``task`` carried so far."""
        return [(site, params, config) for t, site, params, config in self.calls if t == task]


def tensors(**values) -> dict[str, torch.Tensor]:
    """``{"w": [1, 2]}`` → float64 tensors (exact sums in the hand-computed checks); dots for ``__``."""
    return {k.replace("__", "."): torch.tensor(v, dtype=torch.float64) for k, v in values.items()}


def reply(site: str, params: dict, *, n_samples: int = 10, n_batches: int = 1, class_set=("edema",),
          **metrics) -> Reply:
    return Reply(site=site, params=params, n_samples=n_samples, n_batches=n_batches, class_set=list(class_set),
                 metrics=metrics)


def context(method: str, answer: Answer, *, sites: list[str], target: Optional[str] = None,
            classes=("edema",), meta: Optional[dict] = None, bn_keys=(), head_keys=(), **config) -> Context:
    """The :class:`~fedcxr.pipeline.protocols.Context` of ``method`` over scripted sites; ``config``:
    fields of :class:`~fedcxr.pipeline.config.ExperimentConfig`."""
    cfg = ExperimentConfig(sites=list(sites), target=target, method=method, **config)
    names = [*sites, *([target] if target else [])]
    return Context(cfg=cfg, transport=ScriptedSites(answer, names), meta=dict(meta or {}), classes=list(classes),
                   aux_tasks=[], sources=list(sites), target=target, bn_keys=list(bn_keys),
                   head_keys=list(head_keys), task_defaults=get_protocol(method).task_defaults())
