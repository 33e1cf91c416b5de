"""GP, FedDA and FedGP (fixed or auto-weighted β): sources train, the target combines (DESIGN §5, §8).

* ``FedAvg_Finetune_GP`` / ``FedAvg_Finetune_AuxInfo_GP`` — AuxInfo+GP paper, Alg. 3: the target
  projects the source updates onto its own fine-tuning direction (β on the sources).
* ``FedDA`` / ``FedGP`` / ``FedDA_Auto`` / ``FedGP_Auto`` — FedGP paper: per-source β_i, fixed
  or estimated from the target's per-batch updates.

Warm-up as the authors' code (``warmup_rounds``, counted in ``rounds``): FedDA/FedGP(_Auto)
start with 2 plain FedAvg rounds (AutoFedGP); GP with 5 rounds whose projection starts from the
FedAvg of the sources (AuxInfo+GP). The auto versions then run at 0.1× the learning rates
(``post_warmup_lr_scale``).
"""

from __future__ import annotations

from fedcxr.pipeline.messages import Reply, pack_combine
from fedcxr.pipeline.protocols.base import Context, aggregate_backbone, ask, ask_one, task_config, valid_replies
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.state import delta


class TargetCombineProtocol(FedAvgProtocol):
    """Sources train from θ0; the target fine-tunes from θ0 and combines (Alg. 3, DESIGN §8).

    The server sends θ0 and the source deltas Δ_i to the target in one ``train_combine`` task;
    the target applies the pure rule (:mod:`fedcxr.pipeline.target_combine`) and returns only
    the combined model. Warm-up rounds first (module docstring).
    """

    rule = "gp"
    auto = False
    #: warm-up rounds unless the config says (see ``ExperimentConfig.warmup_rounds`` for the sources)
    default_warmup_rounds = 2
    #: warm-up style: ``fedavg`` (plain FedAvg rounds, AutoFedGP) or ``fedavg_base`` (FedAvg, then the
    #: projection with θ0 = that average, AuxInfo+GP code)
    warmup_style = "fedavg"

    def __init__(self, name: str, *, aux_info: bool = False):
        super().__init__(name, finetune=True, aux_info=aux_info)
        self.needs_target = True

    def warmup_rounds(self, ctx: Context) -> int:
        value = ctx.cfg.warmup_rounds
        return self.default_warmup_rounds if value is None else value

    def lr_scale(self, ctx: Context, r: int) -> float:
        """1 during warm-up; then ``post_warmup_lr_scale`` (default 0.1 for the auto versions, else 1)."""
        if r < self.warmup_rounds(ctx):
            return 1.0
        value = ctx.cfg.post_warmup_lr_scale
        return (0.1 if self.auto else 1.0) if value is None else value

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        warmup = r < self.warmup_rounds(ctx)
        if warmup and self.warmup_style == "fedavg":
            theta, metrics = self.fedavg_round(ctx, r, theta0)
            return {**state, "global": theta}, {**metrics, "warmup": True}
        scale = self.lr_scale(ctx, r)
        replies = valid_replies(ctx, ask(ctx, "train", ctx.sources, theta0,
                                         task_config(ctx, r, "source", lr=ctx.cfg.source.lr * scale), r=r),
                                theta0, r)
        sites = list(replies)
        if warmup:  # fedavg_base: the projection starts from the sources' average
            theta0 = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx))
        payload = pack_combine(theta0, [delta(replies[s].params, theta0) for s in sites])
        tcfg = task_config(ctx, r, "target", lr=ctx.cfg.target_train.lr * scale,
                           combine=self.combine_spec(ctx, replies, scale))
        target = ask_one(ctx, "train_combine", ctx.target, payload, tcfg, r=r, reference=theta0)
        betas = target.metrics.get("betas") or []
        return {**state, "global": target.params}, {
            **({"warmup": True} if warmup else {}),
            "train": {s: rep.metrics for s, rep in replies.items()},
            "target": {k: v for k, v in target.metrics.items() if k != "betas"},
            "betas": dict(zip(sites, [float(b) for b in betas])),
        }

    def combine_spec(self, ctx: Context, replies: dict[str, Reply], lr_scale: float = 1.0) -> dict:
        """What the target needs to know about the sources: counts only, never data."""
        cfg = ctx.cfg
        return {
            "rule": self.rule, "auto": self.auto, "beta": cfg.beta,
            "n_sources": [int(rep.n_samples) for rep in replies.values()],
            "n_batches": [int(rep.n_batches) for rep in replies.values()],
            "bs_source": cfg.source.batch_size, "bs_target": cfg.target_train.batch_size,
            "lr_source": cfg.source.lr * lr_scale, "lr_target": cfg.target_train.lr * lr_scale,
            "epochs_source": cfg.source.epochs or 1, "epochs_target": cfg.target_train.epochs or 1,
        }


class GPProtocol(TargetCombineProtocol):
    """FedAvg_Finetune(_AuxInfo)_GP: the target projects the source updates (Eq. 7, β on sources)."""

    rule = "gp"
    default_warmup_rounds = 5
    warmup_style = "fedavg_base"


class FedDAGPProtocol(TargetCombineProtocol):
    """FedGP paper: FedDA / FedGP with a fixed β or auto-weighted per-source β_i."""

    def __init__(self, name: str, *, rule: str, auto: bool):
        super().__init__(name)
        self.rule, self.auto = rule, auto
