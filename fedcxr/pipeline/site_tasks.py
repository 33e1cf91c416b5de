"""Site-side tasks beyond training and evaluation, listed in the site runner's task registry.

* ``train_combine`` (GP / FedDA / FedGP, DESIGN §8): fine-tune from θ0 on the target's labels
  (or take the fine-tuning held from this round's ``train`` with ``hold_for_combine``),
  then combine with the source deltas (:mod:`fedcxr.pipeline.combine`); only the combined
  model, the β_i and the scalars behind them (s_i, kept share, σ², d², τ²d²) leave the site — its fine-tuned model and per-batch updates do not.
* ``warmup_head`` (surgical aggregation paper): head-only epochs before round 0, the head with
  the best validation loss kept on the site for round 0.
* ``fact_target`` (FACT, DESIGN §5): update the feature extractor G' to minimise the
  inter-domain distance of two source heads on the target's unlabeled images.
* ``train_scaffold`` (SCAFFOLD): local training corrected by the control variates, then the
  site's own c_i updated (option II) and kept here; only the model and Δc_i leave the site.

Each is a function of the site's runner (:class:`~fedcxr.pipeline.site_runner.SiteRunner`), the
received params and the task's typed config; the runner's module lists them in its task registry
(:data:`fedcxr.pipeline.site_runner.TASKS`), so this module never imports the runner: a task's
seeds come from :meth:`SiteRunner.task_seed`, its kept state from the runner's methods.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils.data import Subset

from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.combine import combine_with_estimates
from fedcxr.pipeline.data import make_loader
from fedcxr.pipeline.forward import predict
from fedcxr.pipeline.local import batches, train_local
from fedcxr.pipeline.optimizers import load_optimizer_state, make_optimizer, optimizer_state_dict
from fedcxr.pipeline.messages import (
    FACT_HEAD_A,
    FACT_HEAD_B,
    Reply,
    StateDict,
    TrainTask,
    pack_control_delta,
    unpack_combine,
    unpack_control,
)
from fedcxr.pipeline.state import cpu_state

#: The :class:`~fedcxr.pipeline.site_runner.SiteRunner` answering the task (that module imports this one).
Runner = Any


def train_combine(runner: Runner, params: StateDict, config: TrainTask) -> Reply:
    """Fine-tune from θ0 on the target's labeled rows, then combine with the source deltas."""
    spec = config.combine
    if spec is None:
        raise ValueError(f"site {runner.name}: a train_combine task without its combine spec")
    theta0, deltas = unpack_combine(params, len(spec.n_sources))
    reply = _held(runner, theta0, config.round)
    if reply is None:  # not fine-tuned beside the sources (or the site restarted since): do it now
        reply = runner.handle("train", theta0, config.replace(record_batch_updates=spec.auto))
    theta, betas, estimates = combine_with_estimates(theta0, reply.params, deltas, spec, n_target=reply.n_samples,
                                                     batch_updates=reply.extra.get("batch_updates"),
                                                     target_steps=reply.n_batches)
    return Reply(site=runner.name, params=theta, n_samples=reply.n_samples, n_batches=reply.n_batches,
                 class_set=reply.class_set, metrics={**reply.metrics, "betas": betas, "combine": estimates})


def warmup_head(runner: Runner, params: StateDict, config: TrainTask) -> Reply:
    """Surgical head warm-up: the head alone learns for ``epochs`` epochs on the frozen backbone
    (one Adam), the head with the lowest validation loss is kept on this site for round 0.

    As the surgical aggregation code (``__train_local(only_warmup_model=True)``: frozen base
    model, Adam(1e-3), ``ModelCheckpoint(monitor="val_loss", save_best_only=True)``). Nothing
    but the losses leaves the site.
    """
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
        runner.keep_warm_head(best[1])
    return Reply(site=runner.name, n_samples=len(data), class_set=head_classes,
                 metrics={"val_loss": losses, "best_epoch": best[0] if best else None})


def _val_loss(model, data, runner) -> float:
    """Mean BCE over the observed validation entries (Keras ``val_loss`` of the warm-up)."""
    loader = make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False, **runner.loader_options(train=False))
    out = predict(model, loader, device=runner.device, amp=runner.engine.amp, channels_last=runner.engine.channels_last)
    p = torch.as_tensor(out["probs"], dtype=torch.float64).clamp(1e-7, 1 - 1e-7)
    y = torch.as_tensor(out["labels"], dtype=torch.float64)
    mask = torch.as_tensor(out["label_mask"], dtype=torch.float64) > 0
    bce = -(y * p.log() + (1 - y) * (1 - p).log())
    return float(bce[mask].mean()) if bool(mask.any()) else float("nan")


def _held(runner: Runner, theta0: StateDict, r) -> Optional[Reply]:
    """The fine-tuning this site did from ``theta0`` in round ``r`` (``hold_for_combine``), used once."""
    held, runner.held = runner.held, None
    if held is None or held[0] != r or held[1].keys() != theta0.keys():
        return None
    if not all(torch.equal(held[1][k], theta0[k]) for k in theta0):
        return None
    return held[2]


def fact_target(runner: Runner, params: Optional[StateDict], config: TrainTask) -> Reply:
    """Update the feature extractor to minimise the IDD of two heads on unlabeled images."""
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


def train_scaffold(runner: Runner, params: StateDict, config: TrainTask) -> Reply:
    """SCAFFOLD's client round (Karimireddy et al. 2020, Algorithm 1, lines 7-13).

    ``params`` = the model x plus the server's control variate c (:func:`~fedcxr.pipeline.messages.pack_control`).
    The site trains from x with every plain-SGD step corrected by ``c − c_i`` (:func:`train_local`
    ``drift_correction``), then sets ``c_i⁺ = c_i − c + (x − y_i)/(K·η_l)`` (option II,
    :func:`fedcxr.pipeline.aggregate.scaffold_client_control`), keeps c_i⁺ in its local state (c_i = 0
    before its first round) and answers with y_i and Δc_i = c_i⁺ − c_i. A site without training rows
    answers as ``train`` does and keeps its c_i.
    """
    theta, control = unpack_control(params)
    if not control:
        raise ValueError(f"site {runner.name}: a train_scaffold task without the server's control variate")
    local = runner.control_variate(control)
    correction = {k: control[k].to(local[k].dtype) - local[k] for k in control}
    reply = runner._train(theta, config, drift_correction=correction)  # the one training path of the site
    if reply.params is None or reply.n_samples == 0:
        return reply
    new_local, delta = agg.scaffold_client_control(local, control, theta, reply.params,
                                                   steps=int(reply.metrics.get("scaffold_steps", 0)),
                                                   lr=config.lr)
    runner.keep_control_variate(new_local)
    reply.extra = {**reply.extra, **pack_control_delta(delta)}
    return reply
