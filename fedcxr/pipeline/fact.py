"""FACT: federated adversarial cross-training for an unlabeled target (DESIGN §5).

Each round two sources start from the global model (feature extractor G, head F) and train on
their own data. The server averages their feature extractors into G'. Under ``FACT`` each
source then fine-tunes its own head on the frozen G' (``FACT_NF`` skips this step, saving the
extra transfer of G'). The target updates G' only, minimising the inter-domain distance (IDD:
mean |p_a − p_b| of the two heads' sigmoid probabilities on its unlabeled images). Then
G ← the target's G and F ← the mean of the two heads. No target label is ever used: the model
kept at the end is the one with the lowest IDD measured at the target.

With more than two sources the pair rotates over all pairs, round by round. Learning rates
follow the paper's schedule η = η0 · (1 + 10·p)^(−0.75), p = round / rounds.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Optional

import torch
from torch.utils.data import Subset

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.strategies import Context, Protocol, ask, ask_one, task_config
from fedcxr.pipeline.transport import Reply, StateDict

if TYPE_CHECKING:  # pragma: no cover
    from fedcxr.pipeline.site_runner import SiteRunner

log = logging.getLogger(__name__)
HEAD_A, HEAD_B = "fact_head_a.", "fact_head_b."


def lr_schedule(lr0: float, r: int, rounds: int) -> float:
    """Ganin & Lempitsky's annealing, as the FACT paper uses it."""
    p = r / max(rounds, 1)
    return lr0 * (1.0 + 10.0 * p) ** -0.75


def _split_head(state: StateDict) -> tuple[StateDict, StateDict]:
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    body = {k: v for k, v in state.items() if not k.startswith("head.")}
    return body, head


class FACTProtocol(Protocol):
    """``FACT`` (with the head fine-tuning step) and ``FACT_NF`` (without)."""

    needs_target = True

    def __init__(self, name: str, *, finetune: bool):
        super().__init__(name)
        self.finetune = finetune

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if len(cfg.source_sites()) < 2:
            raise UserError(f"strategy {self.name} needs at least two source sites (it trains them in pairs)")

    def init_state(self, ctx, theta):
        return {"global": theta, "best": theta, "best_idd": float("inf"), "best_round": -1}

    def pair(self, ctx: Context, r: int) -> list[str]:
        pairs = list(itertools.combinations(ctx.sources, 2))
        return list(pairs[r % len(pairs)])

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        theta0, rounds = state["global"], ctx.cfg.rounds
        lr_s = lr_schedule(ctx.cfg.source.lr, r, rounds)
        lr_t = lr_schedule(ctx.cfg.target_train.lr, r, rounds)
        pair = self.pair(ctx, r)
        replies = ask(ctx, "train", pair, theta0, task_config(ctx, r, "source", lr=lr_s), r=r, minimum=2)
        bodies = [_split_head(replies[s].params)[0] for s in pair]
        g_prime = agg.fedavg(bodies, [1.0, 1.0])
        heads = {s: _split_head(replies[s].params)[1] for s in pair}
        if self.finetune:
            cfg = task_config(ctx, r, "source", lr=lr_s, trainable="head")
            per_site = {s: ({**g_prime, **heads[s]}, cfg) for s in pair}
            tuned = ask(ctx, "train", pair, None, cfg, r=r, per_site=per_site, minimum=2)
            heads = {s: _split_head(tuned[s].params)[1] for s in pair}
        payload = dict(g_prime)
        payload.update({HEAD_A + k[len("head."):]: v for k, v in heads[pair[0]].items()})
        payload.update({HEAD_B + k[len("head."):]: v for k, v in heads[pair[1]].items()})
        tcfg = task_config(ctx, r, "target", lr=lr_t, labeled=None)
        target = ask_one(ctx, "fact_target", ctx.target, payload, tcfg, r=r, reference=g_prime)
        head = agg.fedavg([heads[pair[0]], heads[pair[1]]], [1.0, 1.0])
        theta = {**target.params, **head}
        idd_value = float(target.metrics["idd_after"])
        new = {**state, "global": theta}
        if idd_value < state["best_idd"]:
            new.update(best=theta, best_idd=idd_value, best_round=r)
        return new, {"pair": pair, "target": target.metrics, "best_round": new["best_round"],
                     "train": {s: replies[s].metrics for s in pair}}

    def final_models(self, ctx, state):
        return {"global": state["best"], "per_site": {}}


# --------------------------------------------------------------------------- target side


def site_handlers(runner: "SiteRunner") -> dict:
    """Tasks FACT adds to a site (looked up by :meth:`SiteRunner.handle`)."""
    return {"fact_target": lambda params, config: fact_target(runner, params, config)}


def fact_target(runner: "SiteRunner", params: Optional[StateDict], config: dict) -> Reply:
    """Update the feature extractor to minimise the IDD of two heads on unlabeled images."""
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.local import LocalConfig, batches, make_optimizer
    from fedcxr.pipeline.site_runner import _cpu_state, derive_seed

    classes = list(config["head_classes"])
    model = runner.model(classes, [])
    body = {k: v for k, v in params.items() if not k.startswith(("fact_head_", "head."))}
    model.load_state_dict(body, strict=False)  # the head stays as it is: only G' is trained here
    head_a, head_b = _head(params, HEAD_A, model), _head(params, HEAD_B, model)
    data = runner.dataset("train", classes, [], augment=runner.augment)
    if config.get("max_rows"):
        data = Subset(data, list(range(min(len(data), int(config["max_rows"])))))
    seed = derive_seed(int(config.get("seed", 0)), "fact_target", runner.name, config.get("round", 0))
    loader = make_loader(data, batch_size=int(config["batch_size"]), shuffle=True, seed=seed,
                         augment=runner.augment)
    cfg = LocalConfig(lr=float(config["lr"]), batch_size=int(config["batch_size"]),
                      epochs=int(config.get("epochs") or 1), steps=config.get("steps"),
                      weight_decay=float(config.get("weight_decay", 0.0)))
    device = runner.device
    model.to(device).train()
    for p in model.head.parameters():
        p.requires_grad_(False)
    optimizer = make_optimizer([p for n, p in model.named_parameters() if not n.startswith("head.")], cfg)
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
    for p in model.head.parameters():
        p.requires_grad_(True)
    plain = runner.dataset("train", classes, [], augment=False)
    after = _measure_idd(model, head_a, head_b, plain, device)
    state = {k: v for k, v in _cpu_state(model).items() if not k.startswith("head.")}
    return Reply(site=runner.name, params=state, n_samples=len(data), n_batches=steps, class_set=classes,
                 metrics={"idd_train": sum(losses) / max(len(losses), 1), "idd_after": after})


def _head(params: StateDict, prefix: str, model) -> torch.nn.Linear:
    weight, bias = params[prefix + "weight"], params[prefix + "bias"]
    head = torch.nn.Linear(weight.shape[1], weight.shape[0]).to(next(model.parameters()).device)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    head.requires_grad_(False)
    return head


@torch.no_grad()
def _measure_idd(model, head_a, head_b, data, device) -> float:
    """IDD of the updated extractor on the target's images (eval mode, no augmentation)."""
    from fedcxr.pipeline.data import make_loader

    model.eval()
    loader = make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False)
    total, count = 0.0, 0
    for batch in loader:
        feats = model.features(batch["image"].to(device))
        d = (torch.sigmoid(head_a(feats)) - torch.sigmoid(head_b(feats))).abs().mean(dim=1)
        total += float(d.sum())
        count += d.numel()
    model.train()
    return total / max(count, 1)
