"""FedAvg and its fine-tuning variants (AuxInfo+GP paper Alg. 1; FedGP paper baselines).

* ``FedAvg`` — sources train from θ0, the server averages (FedAvg/FedBN/FedBN+ backbone).
* ``FedAvg_Finetune`` (``_AuxInfo``) — then the target fine-tunes the averaged model.
* ``Source_Only`` — FedAvg of the sources, evaluated on the target (no target labels).
* ``Finetune_Offline`` — FedAvg for every round, the target fine-tunes after the last one
  (``finetune_offline: {epochs: 50}`` passes by default, as the FedGP paper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import (
    Context,
    RoundProtocol,
    aggregate_backbone,
    ask,
    ask_one,
    round_sources,
    task_config,
    valid_replies,
)
from pydantic import Field

from fedcxr.pipeline.protocols.spec import MAX_EPOCHS, MethodOptions, SiteTask, method
from fedcxr.pipeline.state import keep_keys


class FedAvgProtocol(RoundProtocol):
    """Sources train from θ0, the server averages; optionally the target fine-tunes (Alg. 1)."""

    reads_each_update = None  # a weighted sum: privacy.secure_aggregation can hide every update

    #: the site task the sources train with (FedProx: its own, carrying μ)
    source_task = "train"

    def __init__(self, name: str, *, finetune: bool, aux_info: bool):
        super().__init__(name)
        self.finetune = finetune
        self.aux_info = aux_info
        self.needs_target_labels = finetune

    def _local_keys(self, ctx: Context) -> list[str]:
        return ctx.bn_keys if ctx.cfg.backbone_aggregation != "fedavg" else []

    def eval_local_keys(self, ctx: Context) -> list[str]:
        return self._local_keys(ctx)

    def secure_aggregation_problem(self, cfg) -> str | None:
        if self.finetune and cfg.backbone_aggregation != "fedavg" and self.reads_each_update is None:
            return ("takes the target's fine-tuned BatchNorm entries into the global model while the sources' "
                    f"stay local ({cfg.backbone_aggregation}): the server would have to splice one encrypted model "
                    "into another entry by entry; use backbone_aggregation: fedavg")
        return super().secure_aggregation_problem(cfg)

    def source_config(self, ctx: Context, r: int) -> TrainTask:
        """The sources' ``train`` task config of round ``r`` (FedProx adds its μ here)."""
        return task_config(ctx, r, "source", local_keys=self._local_keys(ctx))

    def fedavg_round(self, ctx: Context, r: int, theta0: StateDict) -> tuple[StateDict, dict]:
        cfg = self.source_config(ctx, r)
        replies = ask(ctx, self.source_task, round_sources(ctx, r), theta0, cfg, r=r)  # participation: a share
        replies = valid_replies(ctx, replies, theta0, r, task=self.source_task)  # a refusal names the task
        theta = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx))
        if ctx.cfg.backbone_aggregation == "fedbn_plus":
            theta = keep_keys(theta, theta0, ctx.bn_keys)
        return theta, {"train": {s: rep.metrics for s, rep in replies.items()},
                       "n_samples": {s: rep.n_samples for s, rep in replies.items()}}

    def finetune_target(self, ctx: Context, r: int, theta: StateDict) -> tuple[StateDict, dict]:
        cfg = task_config(ctx, r, "target")
        reply = ask_one(ctx, "train", ctx.target, theta, cfg, r=r)
        return reply.params, {"target": reply.metrics}

    def run_round(self, ctx, r, state):
        theta, metrics = self.fedavg_round(ctx, r, state["global"])
        if self.finetune:
            theta, more = self.finetune_target(ctx, r, theta)
            metrics.update(more)
        return {**state, "global": theta}, metrics


class SourceOnlyProtocol(FedAvgProtocol):
    """Source_Only: FedAvg of the sources, evaluated on the target (no target labels)."""

    def __init__(self, name: str):
        super().__init__(name, finetune=False, aux_info=False)


@dataclass(frozen=True)
class PassTask(TrainTask):
    """Finetune_Offline's share of the task envelope: which of the target's passes this is."""

    kind: ClassVar[str] = "finetune_pass task"

    repeat: int = 0  # the pass number after the last round (a seed part from 1 on)


def finetune_pass(runner, params: StateDict, config: PassTask) -> Reply:
    """One of Finetune_Offline's target passes: the site's training, seeded by the pass number too."""
    return runner.train(params, config, seed_parts=(config.repeat,) if config.repeat else ())


class FinetuneOfflineOptions(MethodOptions):
    """``finetune_offline:`` — Finetune_Offline's target fine-tuning after the last round."""

    epochs: int = Field(
        50, ge=1, le=MAX_EPOCHS, description="target fine-tuning passes after the last FedAvg round, each one "
        "`target_train` budget with a fresh optimiser (FedGP paper App. C: 'the same number of 50 epochs of "
        "fine-tuning after FedAvg'; AutoFedGP main_domain_bed_offline.py calls train() once per epoch)")


class FinetuneOfflineProtocol(FedAvgProtocol):
    """Finetune_Offline: FedAvg of the sources for all rounds, then the target fine-tunes
    ``finetune_offline.epochs`` passes (default 50, FedGP paper), a fresh optimiser each."""

    options_key = "finetune_offline"
    Options = FinetuneOfflineOptions
    site_tasks = {"finetune_pass": SiteTask(finetune_pass, changes_state=True, config=PassTask, streams="train",
                                            filtered=True)}

    def __init__(self, name: str):
        super().__init__(name, finetune=True, aux_info=False)
        self.needs_target = True

    def task_defaults(self) -> dict:
        """Target batches of 16 (AutoFedGP main_domain_bed_offline.py DataLoader(batch_size=16))."""
        return {**super().task_defaults(), "target_batch_size": 16}

    def run_round(self, ctx, r, state):
        theta, metrics = self.fedavg_round(ctx, r, state["global"])
        if r == ctx.cfg.rounds - 1:
            losses = []
            for k in range(self.options(ctx.cfg).epochs):
                config = PassTask.extend(task_config(ctx, r, "target"), repeat=k)
                reply = ask_one(ctx, "finetune_pass", ctx.target, theta, config, r=r)
                theta = reply.params
                losses.append(reply.metrics.get("loss"))
            metrics["target"] = {"passes": len(losses), "loss": losses[-1], "first_loss": losses[0]}
        return {**state, "global": theta}, metrics


#: The AuxInfo+GP paper's FedAvg baselines and the FedGP paper's (docs/methods.md: the names live here)
METHODS = {
    "FedAvg": method(FedAvgProtocol, finetune=False, aux_info=False),
    "FedAvg_Finetune": method(FedAvgProtocol, finetune=True, aux_info=False),
    "FedAvg_Finetune_AuxInfo": method(FedAvgProtocol, finetune=True, aux_info=True),
    "Source_Only": method(SourceOnlyProtocol),
    "Finetune_Offline": method(FinetuneOfflineProtocol),
}
