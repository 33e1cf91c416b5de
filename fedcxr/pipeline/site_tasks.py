"""Site-side tasks beyond training and evaluation, registered with :class:`SiteRunner`.

* ``train_combine`` (GP / FedDA / FedGP, DESIGN §8): fine-tune from θ0 on the target's labels,
  then combine with the source deltas (:mod:`fedcxr.pipeline.combine`); only the combined
  model and the β_i leave the site — its fine-tuned model and per-batch updates do not.
* ``fact_target`` (FACT, DESIGN §5): update the feature extractor G' to minimise the
  inter-domain distance of two source heads on the target's unlabeled images.

Importing this module registers the tasks; the transports that build site runners
(:mod:`fedcxr.pipeline.inprocess`, the FLARE client) import it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.data import Subset

from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.combine import combine
from fedcxr.pipeline.data import make_loader
from fedcxr.pipeline.local import LocalConfig, batches, make_optimizer
from fedcxr.pipeline.messages import FACT_HEAD_A, FACT_HEAD_B, Reply, StateDict, unpack_combine
from fedcxr.pipeline.site_runner import SiteRunner, derive_seed, register_task
from fedcxr.pipeline.state import cpu_state


@register_task("train_combine")
def train_combine(runner: SiteRunner, params: StateDict, config: dict) -> Reply:
    """Fine-tune from θ0 on the target's labeled rows, then combine with the source deltas."""
    spec = config["combine"]
    theta0, deltas = unpack_combine(params, len(spec["n_sources"]))
    reply = runner.handle("train", theta0, {**config, "record_batch_updates": bool(spec.get("auto"))})
    theta, betas = combine(theta0, reply.params, deltas, spec, n_target=reply.n_samples,
                           batch_updates=reply.extra.get("batch_updates"), target_steps=reply.n_batches)
    return Reply(site=runner.name, params=theta, n_samples=reply.n_samples, n_batches=reply.n_batches,
                 class_set=reply.class_set, metrics={**reply.metrics, "betas": betas})


@register_task("fact_target")
def fact_target(runner: SiteRunner, params: Optional[StateDict], config: dict) -> Reply:
    """Update the feature extractor to minimise the IDD of two heads on unlabeled images."""
    classes = list(config["head_classes"])
    model = runner.model(classes, [])
    body = {k: v for k, v in params.items() if not k.startswith(("fact_head_", "head."))}
    model.load_state_dict(body, strict=False)  # the head stays as it is: only G' is trained here
    head_a, head_b = _head(params, FACT_HEAD_A, model), _head(params, FACT_HEAD_B, model)
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
    state = {k: v for k, v in cpu_state(model).items() if not k.startswith("head.")}
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
