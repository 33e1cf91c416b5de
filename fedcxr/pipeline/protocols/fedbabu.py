"""FedBABU (Oh, Kim & Yun 2022, "FedBABU: Towards Enhanced Representation for Federated Image
Classification", ICLR, Algorithm 1).

During federated training the head is never updated: every site trains the body alone with the head
frozen at its random initialisation (the same head everywhere), and the server averages the bodies
(FedAvg, weighted by training rows). After the last round each site fine-tunes the whole model —
body and head — on its own data for τ_f epochs and keeps the result: its personal model, evaluated
on its own test split (:mod:`~fedcxr.pipeline.protocols.personal`). Validation before that scores
the global model (no site holds a personal one yet).

Options (``fedbabu:``): ``finetune_epochs`` τ_f (5 by default, the paper's fine-tuning epochs in
its main tables; PFLlib's ``fine_tuning_epochs`` default is 10) or ``finetune_steps``.

Against PFLlib's ``clientbabu.py`` / ``serverbabu.py``: the same rule (``model.head`` frozen in
``train``, the base uploaded; ``fine_tune(['base', 'head'])`` after training). Departures: the
house's optimiser (Adam by default; PFLlib: SGD), and the fine-tuning runs once after the last
round (PFLlib fine-tunes the new clients it evaluates after training as well).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from pydantic import Field

from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import ask, task_config
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.personal import PersonalProtocol, model_keys
from fedcxr.pipeline.protocols.spec import MAX_EPOCHS, MAX_STEPS, MethodOptions, SiteTask, method


class FedBABUOptions(MethodOptions):
    """``fedbabu:`` — the fine-tuning after the last round."""

    finetune_epochs: int = Field(5, ge=0, le=MAX_EPOCHS, description="τ_f: whole-model fine-tuning epochs at "
                                 "each site after the last round (the paper: 5)")
    finetune_steps: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="its optimiser steps instead; "
                                          "overrides finetune_epochs")


@dataclass(frozen=True)
class BabuFinetuneTask(TrainTask):
    """The personal fine-tuning after the last round (its budget is the task's own epochs/steps)."""

    kind: ClassVar[str] = "finetune_babu task"


def finetune_babu(runner, params: StateDict, config: BabuFinetuneTask) -> Reply:
    """The whole model fine-tuned from the final global one, kept at the site as its personal model;
    only counts and the loss go back."""
    reply = runner.train(params, config, seed_parts=("finetune",))
    if reply.n_samples:
        runner.keep_state("", reply.params)  # under the model's own names: what evaluation loads
    return Reply(site=runner.name, n_samples=reply.n_samples, n_batches=reply.n_batches, class_set=reply.class_set,
                 metrics={"loss": reply.metrics.get("loss")})


class FedBABUProtocol(PersonalProtocol, FedAvgProtocol):
    """Bodies averaged, heads frozen; a personal fine-tuning at every site after the last round."""

    #: the server averages the sites' bodies (a weighted sum; the frozen heads are θ0's at every site); the
    #: fine-tuned models stay at the sites
    reads_each_update = None
    options_key = "fedbabu"
    Options = FedBABUOptions
    site_tasks = {"finetune_babu": SiteTask(finetune_babu, changes_state=True, config=BabuFinetuneTask,
                                            streams="train")}

    def __init__(self, name: str):
        FedAvgProtocol.__init__(self, name, finetune=False, aux_info=False)

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        self.refuse_fedbn(cfg, "the personal fine-tuning keeps every entry at the site already")

    def source_config(self, ctx, r):
        return super().source_config(ctx, r).replace(trainable="backbone")  # the head stays as initialised

    def eval_local_keys(self, ctx):
        return model_keys(ctx)  # after the fine-tuning, the site's whole model is its own

    def run_round(self, ctx, r, state):
        theta, metrics = self.fedavg_round(ctx, r, state["global"])
        if r == ctx.cfg.rounds - 1:
            options = self.options(ctx.cfg)
            config = BabuFinetuneTask.extend(task_config(ctx, r, "source", trainable="all",
                                                         epochs=options.finetune_epochs,
                                                         steps=options.finetune_steps))
            tuned = ask(ctx, "finetune_babu", ctx.sources, theta, config, r=r, minimum=1)
            metrics["finetune"] = {s: rep.metrics for s, rep in tuned.items()}
        return {**state, "global": theta}, metrics


METHODS = {"FedBABU": method(FedBABUProtocol)}
