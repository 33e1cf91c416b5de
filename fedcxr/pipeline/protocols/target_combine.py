"""GP, FedDA and FedGP (fixed or auto-weighted β): sources train, the target combines (DESIGN §5, §8).

* ``FedAvg_Finetune_GP`` / ``FedAvg_Finetune_AuxInfo_GP`` — AuxInfo+GP paper, Alg. 3: the target
  projects the source updates onto its own fine-tuning direction (β on the sources).
* ``FedDA`` / ``FedGP`` / ``FedDA_Auto`` / ``FedGP_Auto`` — FedGP paper: per-source β_i, fixed
  or estimated from the target's per-batch updates.

The first ``warmup_rounds`` are plain FedAvg rounds.
"""

from __future__ import annotations

from fedcxr.pipeline.messages import Reply, pack_combine
from fedcxr.pipeline.protocols.base import Context, ask, ask_one, task_config, valid_replies
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.state import delta


class TargetCombineProtocol(FedAvgProtocol):
    """Sources train from θ0; the target fine-tunes from θ0 and combines (Alg. 3, DESIGN §8).

    The server sends θ0 and the source deltas Δ_i to the target in one ``train_combine`` task;
    the target applies the pure rule (:mod:`fedcxr.pipeline.target_combine`) and returns only
    the combined model. The first ``warmup_rounds`` are plain FedAvg rounds.
    """

    rule = "gp"
    auto = False

    def __init__(self, name: str, *, aux_info: bool = False):
        super().__init__(name, finetune=True, aux_info=aux_info)
        self.needs_target = True

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        if r < ctx.cfg.warmup_rounds:
            theta, metrics = self.fedavg_round(ctx, r, theta0)
            return {**state, "global": theta}, {**metrics, "warmup": True}
        replies = valid_replies(ctx, ask(ctx, "train", ctx.sources, theta0, task_config(ctx, r, "source"), r=r),
                                theta0, r)
        sites = list(replies)
        payload = pack_combine(theta0, [delta(replies[s].params, theta0) for s in sites])
        tcfg = task_config(ctx, r, "target", combine=self.combine_spec(ctx, replies))
        target = ask_one(ctx, "train_combine", ctx.target, payload, tcfg, r=r, reference=theta0)
        betas = target.metrics.get("betas") or []
        return {**state, "global": target.params}, {
            "train": {s: rep.metrics for s, rep in replies.items()},
            "target": {k: v for k, v in target.metrics.items() if k != "betas"},
            "betas": dict(zip(sites, [float(b) for b in betas])),
        }

    def combine_spec(self, ctx: Context, replies: dict[str, Reply]) -> dict:
        """What the target needs to know about the sources: counts only, never data."""
        cfg = ctx.cfg
        return {
            "rule": self.rule, "auto": self.auto, "beta": cfg.beta,
            "n_sources": [int(rep.n_samples) for rep in replies.values()],
            "n_batches": [int(rep.n_batches) for rep in replies.values()],
            "bs_source": cfg.source.batch_size, "bs_target": cfg.target_train.batch_size,
            "lr_source": cfg.source.lr, "lr_target": cfg.target_train.lr,
            "epochs_source": cfg.source.epochs or 1, "epochs_target": cfg.target_train.epochs or 1,
        }


class GPProtocol(TargetCombineProtocol):
    """FedAvg_Finetune(_AuxInfo)_GP: the target projects the source updates (Eq. 7, β on sources)."""

    rule = "gp"


class FedDAGPProtocol(TargetCombineProtocol):
    """FedGP paper: FedDA / FedGP with a fixed β or auto-weighted per-source β_i."""

    def __init__(self, name: str, *, rule: str, auto: bool):
        super().__init__(name)
        self.rule, self.auto = rule, auto
