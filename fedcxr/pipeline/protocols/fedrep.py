"""FedRep (Collins et al. 2021, "Exploiting Shared Representations for Personalized Federated
Learning", ICML, Algorithm 1).

Each round every site first trains its own head alone on the frozen representation (the body
received from the server) for τ_h epochs, then the body alone with its new head frozen for the
round's usual local budget (``source.epochs``/``steps``); only the body is sent back and averaged
(FedAvg weighted by training rows); the head never leaves the site. Each site is evaluated with
its own head on the shared body, on its own test split (:mod:`~fedcxr.pipeline.protocols.personal`).

Options (``fedrep:``): ``head_epochs`` τ_h (10 by default: the paper's experiments run 10 local
epochs for the head per representation epoch — the FedRep code's ``--local_ep 10 --local_rep_ep 1``
trains the head for ``local_ep − local_rep_ep`` epochs, then the representation), or ``head_steps``
(optimiser steps; overrides the epochs, as ``source.steps``).

Against PFLlib's ``clientrep.py`` / ``serverrep.py``: the same order (head first with the base
frozen, then the base with the head frozen; ``model.base`` uploaded and averaged by training rows).
Departures: the optimiser is the house's (Adam by default; PFLlib: two SGD optimisers), and during
the head epochs the frozen body's BatchNorm layers stay in eval mode (fedcxr's head-only training;
PFLlib keeps ``model.train()``, so its BN statistics move while only the head learns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from pydantic import Field

from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.personal import PersonalLayersProtocol
from fedcxr.pipeline.protocols.spec import MAX_EPOCHS, MAX_STEPS, MethodOptions, SiteTask, method


class FedRepOptions(MethodOptions):
    """``fedrep:`` — the head's budget per round."""

    head_epochs: int = Field(10, ge=0, le=MAX_EPOCHS, description="τ_h: head-only epochs per round, before the "
                             "representation's (Collins et al. 2021: 10)")
    head_steps: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="head-only optimiser steps per round; "
                                      "overrides head_epochs")


@dataclass(frozen=True)
class RepTask(TrainTask):
    """FedRep's share of the task envelope: the head's budget (the body's is the task's own)."""

    kind: ClassVar[str] = "train_fedrep task"

    head_epochs: int = 10
    head_steps: Optional[int] = None


def train_fedrep(runner, params: StateDict, config: RepTask) -> Reply:
    """Head first (the received body frozen, the site's own head), then the body (the new head frozen);
    the reply's head is the site's own (a ``local_keys`` entry, left out of the average)."""
    head = runner.train(params, config.replace(trainable="head", epochs=config.head_epochs, steps=config.head_steps),
                        seed_parts=("head",))
    body = runner.train(head.params, config.replace(trainable="backbone"))
    body.metrics = {**body.metrics, "head_loss": head.metrics.get("loss"), "head_steps": head.n_batches}
    return body


class FedRepProtocol(PersonalLayersProtocol):
    """The representation averaged, each site's head trained first and kept (Algorithm 1)."""

    reads_each_update = "leaves each site's head out of the average entry by entry (the representation alone is summed)"
    options_key = "fedrep"
    Options = FedRepOptions
    site_task = "train_fedrep"
    site_tasks = {"train_fedrep": SiteTask(train_fedrep, changes_state=True, config=RepTask, streams="train",
                                           filtered=True)}

    def site_config(self, ctx, r):
        options = self.options(ctx.cfg)
        return RepTask.extend(super().site_config(ctx, r), head_epochs=options.head_epochs,
                              head_steps=options.head_steps)


METHODS = {"FedRep": method(FedRepProtocol)}
