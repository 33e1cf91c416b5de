"""FACT: federated adversarial cross-training for an unlabeled target (DESIGN §5).

Each round two sources start from the global model (feature extractor G, head F) and train on
their own data. The server averages their feature extractors into G'. Under ``FACT`` each
source then fine-tunes its own head on the frozen G' (``FACT_NF`` skips this step, saving the
extra transfer of G'). The target updates G' only, minimising the inter-domain distance (IDD:
mean |p_a − p_b| of the two heads' sigmoid probabilities on its unlabeled images). Then
G ← the target's G and F ← the mean of the two heads. No target label is ever used: the model
kept at the end is the one of the round whose summed training-batch IDD at the target was
lowest (the FACT code records ``loss_dis_sum`` per epoch and evaluates at its minimum).

As the FACT code: each round's pair is a random draw of two sources (``random.sample``),
here from the run's seed and the round so a resumed run draws the same; heads are fine-tuned
with G in train mode (BatchNorm on batch statistics); every client keeps its SGD (momentum
0.9, weight decay 5e-4) across rounds. Learning rates follow the paper's schedule
η = η0 · (1 + 10·p)^(−0.75), p = round / rounds.

Its site tasks are here too: ``fact_head`` (a source fine-tunes its head on the frozen G', BatchNorm
on batch statistics) and ``fact_target`` (the target's IDD step), with ``fact_target``'s payload layout.
"""

from __future__ import annotations

import random
from typing import Optional

import torch
from torch.utils.data import Subset

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import Context, RoundProtocol, ask, ask_one, task_config, valid_replies
from fedcxr.pipeline.keys import derive_seed
from fedcxr.pipeline.protocols.spec import SiteTask, method


#: ``fact_target`` payload: the two source heads beside the averaged feature extractor G'.
FACT_HEAD_A, FACT_HEAD_B = "fact_head_a.", "fact_head_b."


# --------------------------------------------------------------------------- the sites' side


def fact_head(runner, params: StateDict, config: TrainTask) -> Reply:
    """A source fine-tunes its own head on the frozen G' (``config.trainable``: head), the frozen
    BatchNorm layers still on batch statistics, as the FACT code trains its heads with G in train mode."""
    return runner.train(params, config, frozen_bn_trains=True)


def fact_target(runner, params: Optional[StateDict], config: TrainTask) -> Reply:
    """Update the feature extractor to minimise the IDD of two heads on unlabeled images."""
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.local import batches
    from fedcxr.pipeline.optimizers import load_optimizer_state, make_optimizer, optimizer_state_dict
    from fedcxr.pipeline.state import cpu_state

    classes = list(config.head_classes)
    model = runner.model(classes, [])
    body = {k: v for k, v in params.items() if not k.startswith(("fact_head_", "head."))}
    model.load_state_dict(body, strict=False)  # the head stays as it is: only G' is trained here
    head_a, head_b = _head(params, FACT_HEAD_A, model), _head(params, FACT_HEAD_B, model)
    data = runner.dataset("train", classes, [], augment=runner.augment)
    if config.max_rows:
        data = Subset(data, list(range(min(len(data), int(config.max_rows)))))
    seed = runner.task_seed(config, "fact_target", config.round)
    loader = make_loader(data, batch_size=config.batch_size, shuffle=True, seed=seed,
                         augment=runner.augment, **runner.loader_options())
    cfg = runner.local_config(lr=config.lr, batch_size=config.batch_size, epochs=config.epochs or 1,
                              steps=config.steps, weight_decay=config.weight_decay, optimizer=config.optimizer,
                              momentum=config.momentum)
    device = runner.device
    model.to(device).train()
    for p in model.head.parameters():
        p.requires_grad_(False)
    named = [(n, p) for n, p in model.named_parameters() if not n.startswith("head.")]
    optimizer = make_optimizer([p for _, p in named], optimizer=cfg.optimizer, lr=cfg.lr,
                               weight_decay=cfg.weight_decay, momentum=cfg.momentum)
    if config.keep_optimizer:  # FACT: the target keeps its SGD on G across rounds
        load_optimizer_state(optimizer, named, runner.optimizer_state())
    torch.manual_seed(seed)
    losses = []
    for batch in batches(loader, cfg):  # the same epochs/steps budget as local training
        feats = model.features(batch["image"].to(device))
        loss = agg.idd(torch.sigmoid(head_a(feats)), torch.sigmoid(head_b(feats)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    steps = len(losses)
    if config.keep_optimizer:
        runner.keep_optimizer_state(optimizer_state_dict(optimizer, named))
    for p in model.head.parameters():
        p.requires_grad_(True)
    plain = runner.dataset("train", classes, [], augment=False)
    after = _measure_idd(model, head_a, head_b, plain, device, runner.loader_options(train=False))
    state = {k: v for k, v in cpu_state(model).items() if not k.startswith("head.")}
    return Reply(site=runner.name, params=state, n_samples=len(data), n_batches=steps, class_set=classes,
                 metrics={"idd_train": sum(losses) / max(len(losses), 1), "idd_train_sum": sum(losses),
                          "idd_after": after})


def _head(params: StateDict, prefix: str, model) -> torch.nn.Linear:
    weight, bias = params[prefix + "weight"], params[prefix + "bias"]
    head = torch.nn.Linear(weight.shape[1], weight.shape[0]).to(next(model.parameters()).device)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    head.requires_grad_(False)
    return head


@torch.no_grad()
def _measure_idd(model, head_a, head_b, data, device, options: dict) -> float:
    """IDD of the updated extractor on the target's images (eval mode, no augmentation)."""
    from fedcxr.pipeline.data import make_loader

    model.eval()
    loader = make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False, **options)
    total, count = 0.0, 0
    for batch in loader:
        feats = model.features(batch["image"].to(device))
        d = (torch.sigmoid(head_a(feats)) - torch.sigmoid(head_b(feats))).abs().mean(dim=1)
        total += float(d.sum())
        count += d.numel()
    model.train()
    return total / max(count, 1)


# --------------------------------------------------------------------------- the server's side


def lr_schedule(lr0: float, r: int, rounds: int) -> float:
    """Ganin & Lempitsky's annealing, as the FACT paper uses it."""
    p = r / max(rounds, 1)
    return lr0 * (1.0 + 10.0 * p) ** -0.75


def _split_head(state: StateDict) -> tuple[StateDict, StateDict]:
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    body = {k: v for k, v in state.items() if not k.startswith("head.")}
    return body, head


class FACTProtocol(RoundProtocol):
    """``FACT`` (with the head fine-tuning step) and ``FACT_NF`` (without)."""

    needs_target = True
    averages_sites = "averages exactly the two sources of each round (no rule can tell which of two is wrong)"
    reads_each_update = "sends each source's own head to the target and keeps the sources' feature extractors apart"
    samples_sources = "asks two sources drawn at random every round already (the FACT paper's pairs)"
    site_tasks = {
        "fact_head": SiteTask(fact_head, changes_state=True, config=TrainTask, streams="train", filtered=True),
        "fact_target": SiteTask(fact_target, changes_state=True, config=TrainTask, filtered=True),
    }

    def __init__(self, name: str, *, finetune: bool):
        super().__init__(name)
        self.finetune = finetune

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if len(cfg.source_sites()) < 2:
            raise UserError(f"method {self.name} needs at least two source sites (it trains them in pairs)")

    def init_state(self, ctx, theta):
        return {"global": theta, "best": theta, "best_idd": float("inf"), "best_round": -1}

    def task_defaults(self) -> dict:
        # FACT client.py: one SGD(momentum 0.9, weight_decay 5e-4) per client, kept for the whole run
        return {**super().task_defaults(), "optimizer": "sgd", "weight_decay": 5e-4, "optimizer_state": "kept"}

    def pair(self, ctx: Context, r: int) -> list[str]:
        """Two sources drawn at random (the FACT server's ``random.sample``), seeded by the run and round."""
        return random.Random(derive_seed(ctx.cfg.seed, "fact_pair", r)).sample(list(ctx.sources), 2)

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        theta0, rounds = state["global"], ctx.cfg.rounds
        lr_s = lr_schedule(ctx.cfg.source.lr, r, rounds)
        lr_t = lr_schedule(ctx.cfg.target_train.lr, r, rounds)
        pair = self.pair(ctx, r)
        replies = ask(ctx, "train", pair, theta0, task_config(ctx, r, "source", lr=lr_s), r=r, minimum=2)
        replies = valid_replies(ctx, replies, theta0, r, minimum=2)  # both needed: a refused one fails the round
        bodies = [_split_head(replies[s].params)[0] for s in pair]
        g_prime = agg.fedavg(bodies, [1.0, 1.0])
        heads = {s: _split_head(replies[s].params)[1] for s in pair}
        if self.finetune:
            cfg = task_config(ctx, r, "source", lr=lr_s, trainable="head")
            per_site = {s: ({**g_prime, **heads[s]}, cfg) for s in pair}
            tuned = ask(ctx, "fact_head", pair, None, cfg, r=r, per_site=per_site, minimum=2)
            tuned = valid_replies(ctx, tuned, lambda rep: per_site[rep.site][0], r, minimum=2)
            heads = {s: _split_head(tuned[s].params)[1] for s in pair}
        payload = dict(g_prime)
        payload.update({FACT_HEAD_A + k[len("head."):]: v for k, v in heads[pair[0]].items()})
        payload.update({FACT_HEAD_B + k[len("head."):]: v for k, v in heads[pair[1]].items()})
        tcfg = task_config(ctx, r, "target", lr=lr_t, labeled=None)
        target = ask_one(ctx, "fact_target", ctx.target, payload, tcfg, r=r, reference=g_prime)
        head = agg.fedavg([heads[pair[0]], heads[pair[1]]], [1.0, 1.0])
        theta = {**target.params, **head}
        idd_value = float(target.metrics["idd_train_sum"])
        new = {**state, "global": theta}
        if idd_value < state["best_idd"]:
            new.update(best=theta, best_idd=idd_value, best_round=r)
        return new, {"pair": pair, "target": target.metrics, "best_round": new["best_round"],
                     "train": {s: replies[s].metrics for s in pair}}

    def final_models(self, ctx, state):
        return {"global": state["best"], "per_site": {}}


#: FACT with and without the heads' fine-tuning step
METHODS = {"FACT": method(FACTProtocol, finetune=True), "FACT_NF": method(FACTProtocol, finetune=False)}
