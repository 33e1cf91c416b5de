"""What the personalised methods share: each site keeps a model of its own, judged on its own test split.

Personalised federated learning is judged the way ``Individual`` and ``PFL`` are here: every site's
own model on its own test split. A personalised method keeps its personal part in the site's local
state under the model's own entry names, and lists those entries in
:meth:`~fedcxr.pipeline.protocols.base.RoundProtocol.eval_local_keys`: validation, ``final_model.pt``
(``local_states``), ``fedcxr evaluate`` and FLARE's cross-site evaluation then score each site with
its own entries (the mechanism FedBN's BatchNorm statistics and PFL's heads use). The method
modules (one per method, each the only module naming its method) build on:

* :class:`PersonalProtocol` — the sources federate, each is evaluated on its own split;
* :class:`PersonalLayersProtocol` — the shared body is averaged, the personal layers (the head,
  optionally the projection) never leave the site's model: the reply's personal layers are the
  site's own and are left out of the average;
* :func:`model_keys` — every entry of the run's network (a method whose whole model is personal).
"""

from __future__ import annotations

import functools
import json
from typing import Literal

import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols.base import (Context, RoundProtocol, aggregate_backbone, ask, round_sources, task_config,
                                            valid_replies)

#: The personal layers a method may keep at the site: the main head, or the projection and the head
#: (``model.hidden``'s layer; the backbone's last block is shared either way).
PersonalLayers = Literal["head", "projection_and_head"]


def model_keys(ctx: Context) -> list[str]:
    """Every state-dict entry of the run's network, in order (built as the initial model is, under a
    forked RNG so the run's random stream is not touched; once per network layout)."""
    return list(_model_keys(tuple(ctx.classes), tuple(ctx.aux_tasks), json.dumps(ctx.cfg.model.model_dump(mode="json"),
                                                                                  sort_keys=True)))


@functools.lru_cache(maxsize=16)
def _model_keys(classes: tuple, aux_tasks: tuple, model_json: str) -> tuple[str, ...]:
    from fedcxr.models.network import network_from_config
    from fedcxr.vocab import AUX_VOCAB

    with torch.random.fork_rng(devices=[]):
        model = network_from_config(list(classes), json.loads(model_json), {t: len(AUX_VOCAB[t]) for t in aux_tasks},
                                    load_weights_file=False)
    return tuple(model.state_dict())


def projection_keys(ctx: Context) -> list[str]:
    """The projection layer's entries (``proj.*``; none when ``model.hidden`` is null)."""
    return [k for k in model_keys(ctx) if k.startswith("proj.")]


class PersonalProtocol(RoundProtocol):
    """Base of the personalised methods: the sources federate; each is evaluated on its own test split
    with its own model (:meth:`eval_local_keys`)."""

    def default_eval_sites(self, ctx: Context) -> list[str]:
        return list(ctx.sources)  # each site's own model on its own test set

    def refuse_fedbn(self, cfg, why: str) -> None:
        if cfg.backbone_aggregation != "fedavg":
            raise UserError(f"method {self.name}: backbone_aggregation {cfg.backbone_aggregation} keeps BatchNorm "
                            f"entries at the sites, but {why}; use backbone_aggregation: fedavg")


class PersonalLayersProtocol(PersonalProtocol):
    """The shared body is averaged (FedAvg/FedBN of the non-personal entries), the personal layers stay
    at each site: they are the task's ``local_keys`` (the site loads its own over the received ones and
    keeps what it trained) and are left out of the server's average. The server's copy of those layers
    stays θ0's (never used: every site evaluates with its own)."""

    #: a reply's personal layers are the site's own, not an update of the ones the server sent
    per_site_heads = True
    reads_each_update = "leaves each site's personal layers out of the average entry by entry"
    #: which of the site's task trains (a method's own, or ``train``)
    site_task = "train"

    def personal_layers(self, ctx: Context) -> PersonalLayers:
        return "head"

    def personal_keys(self, ctx: Context) -> list[str]:
        keys = list(ctx.head_keys)
        if self.personal_layers(ctx) == "projection_and_head":
            keys = projection_keys(ctx) + keys
        return keys

    def local_keys(self, ctx: Context) -> list[str]:
        """The personal layers, and BatchNorm under FedBN/FedBN+."""
        bn = list(ctx.bn_keys) if ctx.cfg.backbone_aggregation != "fedavg" else []
        return bn + self.personal_keys(ctx)

    def eval_local_keys(self, ctx: Context) -> list[str]:
        return self.local_keys(ctx)

    def site_config(self, ctx: Context, r: int):
        return task_config(ctx, r, "source", local_keys=self.local_keys(ctx))

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        # participation: a share of the sources; a site not asked keeps its personal layers as they are
        replies = ask(ctx, self.site_task, round_sources(ctx, r), theta0, self.site_config(ctx, r), r=r)
        replies = valid_replies(ctx, replies, theta0, r, task=self.site_task)
        theta = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx),
                                   exclude=tuple(self.personal_keys(ctx)))
        if ctx.cfg.backbone_aggregation == "fedbn_plus":
            theta = {**theta, **{k: state["initial_bn"][k] for k in ctx.bn_keys}}
        return {**state, "global": theta}, {"train": {s: rep.metrics for s, rep in replies.items()},
                                            "n_samples": {s: rep.n_samples for s, rep in replies.items()}}
