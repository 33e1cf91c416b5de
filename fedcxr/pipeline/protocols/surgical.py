"""The surgical aggregation paper's methods: FL, FL_PartialLoss, FL_Surgical and PFL (DESIGN §5).

Their site tasks are here too: ``warmup_head`` (head-only epochs before round 0, the head with the
best validation loss kept on the site) and ``train_from_warm`` (round 0's training, starting from
that head).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from pydantic import Field

from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.keys import WARM_PREFIX
from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import (
    Context,
    RoundProtocol,
    aggregate_backbone,
    ask,
    round_sources,
    task_config,
    valid_replies,
)
from fedcxr.pipeline.protocols.spec import MAX_BATCH, MAX_EPOCHS, MethodOptions, SiteTask, method
from fedcxr.pipeline.state import keep_keys

log = logging.getLogger(__name__)


class HeadWarmupConfig(MethodOptions):
    """Head-only local epochs before round 0 (surgical aggregation code)."""

    epochs: int = Field(15, ge=0, le=MAX_EPOCHS, description="head-only epochs on the frozen backbone, the head "
                        "with the lowest validation loss kept; each client starts round 0 from its own warmed "
                        "model (surgical aggregation code: warmup_epochs=15, ModelCheckpoint on val_loss); 0: no "
                        "warm-up")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the warm-up (its __train_local default 1e-3)")
    batch_size: Optional[int] = Field(None, ge=1, le=MAX_BATCH, description="default: source.batch_size")


class SurgicalOptions(MethodOptions):
    """``surgical:`` — FL, FL_PartialLoss, FL_Surgical, PFL."""

    head_warmup: HeadWarmupConfig = Field(HeadWarmupConfig(), description=HeadWarmupConfig.__doc__)


# --------------------------------------------------------------------------- the sites' side

#: where a site keeps its warmed-up head until round 0 starts from it (``warm.head.weight``, ...)
WARM_HEAD = WARM_PREFIX + "head."


def warmup_head(runner, params: StateDict, config: TrainTask) -> Reply:
    """Surgical head warm-up: the head alone learns for ``epochs`` epochs on the frozen backbone
    (one Adam), the head with the lowest validation loss is kept on this site for round 0.

    As the surgical aggregation code (``__train_local(only_warmup_model=True)``: frozen base
    model, Adam(1e-3), ``ModelCheckpoint(monitor="val_loss", save_best_only=True)``). Nothing
    but the losses leaves the site.
    """
    from fedcxr.pipeline.local import train_local

    model, head_classes, aux_tasks, _ = runner.prepared_model(params, config)
    data = runner.training_data(config, head_classes, aux_tasks)
    negatives = config.missing_as_negative
    val = runner.dataset("val", head_classes, aux_tasks, augment=False, missing_as_negative=negatives,
                         loss_classes=head_classes if negatives else [c for c in head_classes if c in runner.class_set])
    cfg = runner.local_config(lr=config.lr, batch_size=config.batch_size, epochs=1, optimizer=config.optimizer,
                              use_aux=False)
    losses, best, state = [], None, {}
    for epoch in range(config.epochs if len(data) else 0):
        seed = runner.task_seed(config, "warmup_head", epoch)
        loader = runner.train_loader(data, batch_size=cfg.batch_size, seed=seed)
        state = train_local(model, loader, cfg, device=runner.device, seed=seed, trainable="head",
                            optimizer_state=state, freeze_bn=config.freeze_bn).optimizer_state
        losses.append(_val_loss(model, val, runner) if len(val) else float("nan"))
        if best is None or not len(val) or losses[-1] < losses[best[0]]:
            best = (epoch, {k: v.detach().to("cpu", copy=True) for k, v in model.head.state_dict().items()})
    if best is not None:
        runner.keep_state(WARM_HEAD, best[1])
    return Reply(site=runner.name, n_samples=len(data), class_set=head_classes,
                 metrics={"val_loss": losses, "best_epoch": best[0] if best else None})


def _val_loss(model, data, runner) -> float:
    """Mean BCE over the observed validation entries (Keras ``val_loss`` of the warm-up)."""
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.forward import predict

    loader = make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False, **runner.loader_options(train=False))
    out = predict(model, loader, device=runner.device, amp=runner.engine.amp, channels_last=runner.engine.channels_last)
    p = torch.as_tensor(out["probs"], dtype=torch.float64).clamp(1e-7, 1 - 1e-7)
    y = torch.as_tensor(out["labels"], dtype=torch.float64)
    mask = torch.as_tensor(out["label_mask"], dtype=torch.float64) > 0
    bce = -(y * p.log() + (1 - y) * (1 - p).log())
    return float(bce[mask].mean()) if bool(mask.any()) else float("nan")


def train_from_warm(runner, params: StateDict, config: TrainTask) -> Reply:
    """Round 0 after the warm-up: train from the received model with this site's warmed-up head (kept
    once: dropped after). A site that kept none (it missed the warm-up, or restarted since) trains
    from the received head, and says so."""
    head = runner.drop_state(WARM_HEAD)

    def start_from_warm_head(model) -> None:
        if not head:
            log.warning("site %s: no warmed-up head kept (warmup_head did not run here, or the site restarted); "
                        "round 0 starts from the received head", runner.name)
            return
        with torch.no_grad():
            model.head.weight.copy_(head["weight"])
            model.head.bias.copy_(head["bias"])

    return runner.train(params, config, prepare=start_from_warm_head)


# --------------------------------------------------------------------------- the server's side


class SurgicalFamilyProtocol(RoundProtocol):
    """FL / FL_PartialLoss / FL_Surgical / PFL of the surgical aggregation paper.

    * ``FL``: one global head over every class; classes a site does not label are negatives.
    * ``FL_PartialLoss``: global head; each site's loss only over its own classes.
    * ``FL_Surgical``: each site trains a head of its own classes; head rows are averaged per
      class over the sites having it, by name (:func:`aggregate.surgical_heads`); backbone
      averaged unweighted by default (``backbone_weighting``).
    * ``PFL``: shared backbone, heads stay local.

    Before round 0 every client warms its head up alone (``surgical.head_warmup``, 15 epochs at 1e-3 by
    default) and starts round 0 from its own warmed model, as the paper's code.

    Every mode averages the shared entries 1/K by default, as the paper's Eq. 1 and its code
    (``np.mean`` over clients); ``backbone_weighting: samples`` weights them by sample counts.
    """

    default_backbone_weighting = "uniform"
    #: FL and FL_PartialLoss average every entry (a weighted sum); the heads of FL_Surgical and PFL are not
    READS_HEADS = {"surgical": "averages each class's head rows over the sites that label it, matched by name",
                   "pfl": "leaves each site's head out of the average entry by entry"}
    options_key = "surgical"
    Options = SurgicalOptions
    site_tasks = {
        "warmup_head": SiteTask(warmup_head, changes_state=True, config=TrainTask),
        "train_from_warm": SiteTask(train_from_warm, changes_state=True, config=TrainTask, streams="train",
                                    filtered=True),
    }

    def task_defaults(self) -> dict:
        # one compiled Keras model (and Adam) per client for the whole run in the authors' code
        return {**super().task_defaults(), "optimizer_state": "kept"}

    def __init__(self, name: str, *, mode: str):
        super().__init__(name)
        self.mode = mode
        self.per_site_heads = mode in ("surgical", "pfl")  # own classes' rows / a head kept at the site
        self.reads_each_update = self.READS_HEADS.get(mode)  # None: privacy.secure_aggregation can hide updates

    def _local_keys(self, ctx: Context) -> list[str]:
        keys = list(ctx.bn_keys) if ctx.cfg.backbone_aggregation != "fedavg" else []
        if self.mode == "pfl":
            keys += ctx.head_keys
        return keys

    def eval_local_keys(self, ctx):
        return self._local_keys(ctx)

    def default_eval_sites(self, ctx):
        if self.mode == "pfl":
            return list(ctx.sources)  # only the clients hold a (local) head
        return super().default_eval_sites(ctx)

    def _site_config(self, ctx: Context, r: int, site: str) -> TrainTask:
        return task_config(ctx, r, "source", local_keys=self._local_keys(ctx),
                           missing_as_negative=self.mode == "fl",  # FL: a class a site does not label is negative
                           head_classes=ctx.class_set(site) if self.mode == "surgical" else list(ctx.classes))

    def warm_up_heads(self, ctx: Context, theta0: StateDict, sites: list[str]) -> dict[str, Reply]:
        """Before round 0: each client of round 0 trains its head alone and keeps the best-validation one."""
        hw = self.options(ctx.cfg).head_warmup
        per_site = {s: (theta0, self._site_config(ctx, 0, s).replace(
            trainable="head", lr=hw.lr, epochs=hw.epochs, steps=None,
            batch_size=hw.batch_size or ctx.cfg.source.batch_size, keep_optimizer=False, optimizer="adam"))
            for s in sites}
        return ask(ctx, "warmup_head", sites, theta0, None, r=0, per_site=per_site)

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        asked = round_sources(ctx, r)  # participation: a class whose every site is absent keeps its head rows
        warmed = self.warm_up_heads(ctx, theta0, asked) if r == 0 and self.options(ctx.cfg).head_warmup.epochs > 0 else {}
        per_site = {s: (theta0, self._site_config(ctx, r, s)) for s in asked}
        task = "train_from_warm" if warmed else "train"  # round 0 starts from each site's warmed head
        replies = ask(ctx, task, asked, theta0, None, r=r, per_site=per_site)
        if self.mode == "surgical":
            replies = valid_replies(ctx, replies, self._site_reference(ctx, theta0), r, task=task)
            theta = self._surgical(ctx, replies, theta0)
        else:
            replies = valid_replies(ctx, replies, theta0, r, task=task)
            exclude = tuple(ctx.head_keys) if self.mode == "pfl" else ()
            theta = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx), exclude=exclude)
        if ctx.cfg.backbone_aggregation == "fedbn_plus":
            theta = keep_keys(theta, state["initial_bn"], ctx.bn_keys)
        metrics = {"train": {s: rep.metrics for s, rep in replies.items()}}
        if warmed:
            metrics["head_warmup"] = {s: rep.metrics for s, rep in warmed.items()}
        return {**state, "global": theta}, metrics

    @staticmethod
    def _site_reference(ctx: Context, theta0: StateDict) -> Callable[[Reply], StateDict]:
        """θ0 with the head cut to the rows of the replying site's own classes."""
        def reference(reply: Reply) -> StateDict:
            rows = [ctx.classes.index(c) for c in reply.class_set if c in ctx.classes]
            if len(rows) != len(reply.class_set):
                return {}  # a class outside the model: check_update reports the mismatch
            return {**theta0, "head.weight": theta0["head.weight"][rows], "head.bias": theta0["head.bias"][rows]}
        return reference

    def _surgical(self, ctx: Context, replies: dict[str, Reply], theta0: StateDict) -> StateDict:
        sites = list(replies)
        theta = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx),
                                   exclude=tuple(ctx.head_keys))
        heads = [{"weight": replies[s].params["head.weight"], "bias": replies[s].params["head.bias"]}
                 for s in sites]
        previous = {"weight": theta0["head.weight"], "bias": theta0["head.bias"]}
        global_head, _ = agg.surgical_heads(heads, [replies[s].class_set for s in sites], ctx.classes,
                                            previous=previous)
        theta["head.weight"], theta["head.bias"] = global_head["weight"], global_head["bias"]
        return theta


#: The surgical aggregation paper's federated methods (its Individual and Central: protocols/baselines.py)
METHODS = {
    "PFL": method(SurgicalFamilyProtocol, mode="pfl"),
    "FL": method(SurgicalFamilyProtocol, mode="fl"),
    "FL_PartialLoss": method(SurgicalFamilyProtocol, mode="partial"),
    "FL_Surgical": method(SurgicalFamilyProtocol, mode="surgical"),
}
