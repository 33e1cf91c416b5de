"""FedAvg and its fine-tuning variants (AuxInfo+GP paper Alg. 1; FedGP paper baselines).

* ``FedAvg`` — sources train from θ0, the server averages (FedAvg/FedBN/FedBN+ backbone).
* ``FedAvg_Finetune`` (``_AuxInfo``) — then the target fine-tunes the averaged model.
* ``Source_Only`` — FedAvg of the sources, evaluated on the target (no target labels).
* ``Finetune_Offline`` — FedAvg for every round, the target fine-tunes after the last one
  (``finetune_offline_epochs`` passes, 50 by default as the FedGP paper).
"""

from __future__ import annotations

from fedcxr.pipeline.messages import StateDict, TrainTask
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
from fedcxr.pipeline.state import keep_keys


class FedAvgProtocol(RoundProtocol):
    """Sources train from θ0, the server averages; optionally the target fine-tunes (Alg. 1)."""

    reads_each_update = None  # a weighted sum: privacy.secure_aggregation can hide every update

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
        replies = ask(ctx, "train", round_sources(ctx, r), theta0, cfg, r=r)  # participation: a share of them
        replies = valid_replies(ctx, replies, theta0, r)
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


class FinetuneOfflineProtocol(FedAvgProtocol):
    """Finetune_Offline: FedAvg of the sources for all rounds, then the target fine-tunes
    ``finetune_offline_epochs`` passes (default 50, FedGP paper), a fresh optimiser each."""

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
            for k in range(ctx.cfg.finetune_offline_epochs):
                reply = ask_one(ctx, "train", ctx.target, theta, task_config(ctx, r, "target", repeat=k), r=r)
                theta = reply.params
                losses.append(reply.metrics.get("loss"))
            metrics["target"] = {"passes": len(losses), "loss": losses[-1], "first_loss": losses[0]}
        return {**state, "global": theta}, metrics
