"""One site's local training: the loop every method's sites run (DESIGN §5, §9).

A plain PyTorch loop over a loader's batches minimising the local loss of
:mod:`fedcxr.pipeline.losses` (``L = L_main + α · Σ_k L_aux_k``): a fresh optimizer per call
unless the caller hands in the optimizer state of the site's previous call
(:func:`train_local` ``optimizer_state``, :mod:`fedcxr.pipeline.optimizers`: the surgical
aggregation code keeps each client's Adam across rounds, FACT its SGD), optional AMP on CUDA,
DP-SGD (:mod:`fedcxr.pipeline.dp`), and — for FedDA/FedGP auto-weighting — the model-state change
of every optimizer step (:func:`train_local` ``record_batch_updates``).

Two reviewers' baselines change this loop and nothing else: FedProx adds the proximal term
(:func:`~fedcxr.pipeline.losses.proximal_term`, ``LocalConfig.prox_mu``) to the loss, and SCAFFOLD
corrects every step by its control variates (:func:`train_local` ``drift_correction``).

Beside it: devices (:mod:`fedcxr.pipeline.devices`) and forward passes without training
(:mod:`fedcxr.pipeline.forward`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedcxr.pipeline.devices import memory_format, place, resolve_device
from fedcxr.pipeline.losses import aux_ce, masked_bce, proximal_term
from fedcxr.pipeline.optimizers import fresh_optimizer, load_optimizer_state, make_optimizer, optimizer_state_dict
from fedcxr.pipeline.state import flatten_state, update_keys

log = logging.getLogger(__name__)

TRAINABLE = ("all", "head", "backbone")


# --------------------------------------------------------------------------- config and result


@dataclass
class LocalConfig:
    """Hyper-parameters of one local training call.

    ``steps`` (when set) overrides ``epochs``: that many optimizer steps, cycling the loader.
    ``amp`` only takes effect on CUDA. ``channels_last``: the model and every batch in NHWC
    memory layout (tensor cores on CUDA; :mod:`fedcxr.pipeline.engine` turns it on there).
    ``optimizer``: adam | adamw | sgd (with ``momentum``; 0.9 as FACT's code).
    ``prox_mu``: FedProx's μ (:func:`~fedcxr.pipeline.losses.proximal_term` added to the loss); 0 = off.
    """

    lr: float = 1e-3
    batch_size: int = 32
    epochs: int = 1
    steps: Optional[int] = None
    alpha: float = 1.0
    aux_reduction: str = "sum"  # "sum" | "mean" over the aux tasks (losses.aux_ce)
    use_aux: bool = True
    weight_decay: float = 0.0
    amp: bool = True
    optimizer: str = "adam"
    channels_last: bool = False
    dp: Optional[dict] = None  # privacy.dp: DP-SGD with Opacus (fedcxr.pipeline.dp); AMP off then
    momentum: float = 0.9  # SGD only
    prox_mu: float = 0.0  # FedProx


@dataclass
class LocalResult:
    """What one local training call did.

    ``n_samples``: rows of the training set (``len(loader.dataset)``, the FedAvg weight);
    ``n_batches``: optimizer steps taken; losses: means over those steps;
    ``batch_updates``: (n_batches, M) float32 on CPU when recorded (see :func:`train_local`);
    ``corrected_steps``: steps that took SCAFFOLD's correction (``drift_correction``): the K of
    its control-variate update (an AMP step skipped for inf gradients is not one).
    """

    n_samples: int
    n_batches: int
    loss: float
    main_loss: float
    aux_loss: float
    batch_updates: Optional[torch.Tensor]
    optimizer_state: Optional[dict[str, torch.Tensor]] = None
    samples_seen: int = 0
    skipped_batches: int = 0
    seconds: float = 0.0
    corrected_steps: int = 0


# --------------------------------------------------------------------------- training


def _set_trainable(model: nn.Module, trainable: str) -> dict[str, bool]:
    """Set ``requires_grad`` for the mode; returns the previous flags (to restore)."""
    if trainable not in TRAINABLE:
        raise ValueError(f"trainable must be one of {TRAINABLE}, got {trainable!r}")
    previous = {name: p.requires_grad for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        in_head = name.startswith("head.")
        p.requires_grad_(trainable == "all" or (trainable == "head") == in_head)
    return previous


def _freeze_bn(model: nn.Module) -> None:
    """No BatchNorm affine parameter learns (``_train_mode`` then keeps those layers in eval mode)."""
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            for p in module.parameters():
                p.requires_grad_(False)


def _train_mode(model: nn.Module) -> None:
    """Train mode, except BatchNorm layers whose parameters are all frozen (their stats stay)."""
    model.train()
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            params = list(module.parameters())
            if params and not any(p.requires_grad for p in params):
                module.eval()


def _has_training_bn(model: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) and m.training for m in model.modules())


def batches(loader: Any, cfg: LocalConfig) -> Iterator[dict]:
    """``epochs`` passes over the loader, or exactly ``steps`` batches cycling it."""
    if cfg.steps is None:
        for _ in range(max(0, int(cfg.epochs))):
            yield from loader
        return
    remaining = int(cfg.steps)
    while remaining > 0:
        produced = 0
        for batch in loader:
            yield batch
            produced += 1
            remaining -= 1
            if remaining <= 0:
                return
        if produced == 0:
            return  # empty loader: nothing to cycle


def _planned_steps(loader: Any, cfg: LocalConfig) -> Optional[int]:
    if cfg.steps is not None:
        return int(cfg.steps)
    try:
        return int(cfg.epochs) * len(loader)
    except TypeError:
        return None


def train_local(
    model: nn.Module,
    loader: Any,
    cfg: LocalConfig,
    *,
    device: torch.device | str,
    seed: int,
    trainable: str = "all",
    loss_classes_mask: Optional[torch.Tensor] = None,
    record_batch_updates: bool = False,
    freeze_bn: bool = False,
    optimizer_state: Optional[Mapping[str, torch.Tensor]] = None,
    frozen_bn_trains: bool = False,
    drift_correction: Optional[Mapping[str, torch.Tensor]] = None,
    prox_anchor: Optional[Mapping[str, torch.Tensor]] = None,
    loss_term: Optional[Callable[[Sequence[tuple[str, nn.Parameter]]], torch.Tensor]] = None,
) -> LocalResult:
    """Train ``model`` in place on ``loader``'s batches; return counts, losses and updates.

    * ``trainable``: ``all``; ``head`` (only ``head.*`` learns; BatchNorm layers of the frozen
      backbone stay in eval mode, so their statistics do not move either — surgical head
      warm-up, FACT head fine-tuning); ``backbone`` (everything but ``head.*``).
    * ``freeze_bn``: every BatchNorm layer stays in eval mode (running statistics used, never
      updated) and its affine weight/bias do not learn — FedBN+ of the surgical aggregation
      paper (Keras ``BatchNormalization.trainable = False``), so the initial (pretrained) BN
      is carried along unchanged.
    * ``frozen_bn_trains``: BatchNorm layers whose parameters are frozen still run in train
      mode (batch statistics; FACT fine-tunes its heads with G in train mode).
    * ``optimizer_state``: per-parameter optimizer state of an earlier call
      (:func:`~fedcxr.pipeline.optimizers.optimizer_state_dict`, keyed ``<parameter name>.<field>``;
      ``{}`` for none yet):
      loaded into the fresh optimizer for the parameters that train, and the state after this
      call is returned in ``LocalResult.optimizer_state``. Keyed by name, so a call that trains
      only the head continues the head's moments of a call that trained everything.
    * ``loss_classes_mask``: optional (C,) 0/1 multiplied into every batch's ``label_mask``.
    * ``record_batch_updates``: return ``(n_batches, M)`` float32: row ``j`` = state after step
      ``j`` − state before it, over every non-0-dim ``state_dict`` entry in order (parameters
      and buffers such as BN running stats; ``num_batches_tracked`` excluded) — the ``g_j``
      of FedDA/FedGP auto-weighting (:func:`fedcxr.pipeline.state.flatten_state` order).
    * Randomness inside the step (dropout) is seeded from ``seed`` in a forked RNG, so global
      RNG state is neither used nor changed; the batches' order and augmentation are the
      loader's (:func:`fedcxr.pipeline.data.make_loader`, seeded separately).
    * A batch of one sample is skipped while BatchNorm layers train (BN cannot normalise a
      single value per channel); it is counted in ``skipped_batches``.
    * ``drift_correction``: SCAFFOLD's ``c − c_i`` per trainable parameter name (Karimireddy et
      al. 2020, Algorithm 1, line 10: ``y ← y − η_l·(g + c − c_i)``). Applied after each optimizer
      step as ``y ← y − η_l·(c − c_i)``, which for plain SGD (the only optimizer allowed with it)
      is that step exactly, and which DP-SGD cannot drop (Opacus replaces ``p.grad`` by its
      clipped, noised per-sample sum). ``LocalResult.corrected_steps`` counts the steps.
    * ``cfg.prox_mu`` > 0 (FedProx): :func:`~fedcxr.pipeline.losses.proximal_term` against the parameters as they are
      when the call starts (the round's received weights) is added to the loss — or against
      ``prox_anchor`` (per trainable parameter name: a personal model is pulled toward the
      round's global model, not toward where it starts). Refused with DP-SGD, which would drop its
      gradient (not a per-sample term).
    * ``loss_term(named)``: a method's own term added to every step's loss, given the trainable
      ``(name, parameter)`` pairs (FedDyn's linear term ``−⟨∇L_k(θ_k^{t−1}), θ⟩``, in
      ``examples/methods/feddyn.py``); refused with DP-SGD for the same reason.

    The model's ``requires_grad`` flags and train/eval modes are restored afterwards.
    """
    device = resolve_device(device)
    use_cuda = device.type == "cuda"
    place(model, device, memory_format(cfg.channels_last))
    modes = {m: m.training for m in model.modules()}
    flags = _set_trainable(model, trainable)
    if freeze_bn:
        _freeze_bn(model)
    started = time.perf_counter()
    try:
        gpus = [device.index if device.index is not None else torch.cuda.current_device()] if use_cuda else []
        with torch.random.fork_rng(devices=gpus, device_type="cuda"):
            seed_step_rng(int(seed), use_cuda)
            return _loop(model, loader, cfg, device, loss_classes_mask, record_batch_updates, started,
                         optimizer_state, frozen_bn_trains, drift_correction, prox_anchor, loss_term)
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])
        for module, mode in modes.items():
            module.training = mode


def seed_step_rng(seed: int, use_cuda: bool) -> None:
    """Seed the generator the training step draws from (dropout): ``torch.manual_seed`` on a GPU.

    Why not ``torch.manual_seed`` on the CPU: besides the CPU generator it queues the seed for
    CUDA, XPU and MTIA, each queueing formatting a stack trace — ~0.6 ms a call, paid by every
    simulated site every round, for generators a CPU run never draws from. The CPU generator ends
    in the same state either way (``tests/pipeline/test_local.py``)."""
    if use_cuda:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _loop(model: nn.Module, loader: Any, cfg: LocalConfig, device: torch.device,
          loss_classes_mask: Optional[torch.Tensor], record: bool, started: float,
          optimizer_state: Optional[Mapping[str, torch.Tensor]] = None, frozen_bn_trains: bool = False,
          drift_correction: Optional[Mapping[str, torch.Tensor]] = None,
          prox_anchor: Optional[Mapping[str, torch.Tensor]] = None,
          loss_term: Optional[Callable] = None) -> LocalResult:
    use_cuda = device.type == "cuda"
    amp = bool(cfg.amp) and use_cuda
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    _check_client_terms(cfg, named, drift_correction, loss_term)
    params = [p for _, p in named]
    build = make_optimizer if cfg.dp else partial(fresh_optimizer, model)  # DP-SGD wraps its own (Opacus)
    optimizer = build(params, optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                      momentum=cfg.momentum)
    if optimizer_state:
        load_optimizer_state(optimizer, named, optimizer_state)
    kept = None if cfg.dp else optimizer
    forward, close = model, None
    if cfg.dp:
        from fedcxr.pipeline.dp import private

        forward, optimizer, close = private(model, optimizer, cfg.dp, cfg.batch_size)
        amp = False
    try:
        return _steps(model, forward, optimizer, loader, cfg, device, amp, loss_classes_mask, record, started,
                      named=named, optimizer_state=optimizer_state, frozen_bn_trains=frozen_bn_trains,
                      drift_correction=drift_correction, prox_anchor=prox_anchor, loss_term=loss_term)
    finally:
        if close is not None:
            close()
        # the kept optimiser (fresh_optimizer) holds no moments between calls: a site's own network
        # (FedBN, PFL heads) would otherwise keep twice its parameters until its next round
        if kept is not None:
            kept.state.clear()


def _steps(model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer, loader: Any, cfg: LocalConfig,
           device: torch.device, amp: bool, loss_classes_mask: Optional[torch.Tensor], record: bool,
           started: float, *, named: Sequence[tuple[str, nn.Parameter]],
           optimizer_state: Optional[Mapping[str, torch.Tensor]], frozen_bn_trains: bool,
           drift_correction: Optional[Mapping[str, torch.Tensor]] = None,
           prox_anchor: Optional[Mapping[str, torch.Tensor]] = None,
          loss_term: Optional[Callable] = None) -> LocalResult:
    use_cuda = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    tasks = list(getattr(model, "aux_tasks", {}) or {})
    use_aux = bool(cfg.use_aux) and bool(tasks)
    class_mask = None if loss_classes_mask is None else loss_classes_mask.to(device, torch.float32)
    if frozen_bn_trains:
        model.train()
    else:
        _train_mode(model)
    bn_training = _has_training_bn(model)

    keys = update_keys(model.state_dict()) if record else []
    planned = _planned_steps(loader, cfg) if record else None
    updates: Optional[torch.Tensor] = None
    rows: list[torch.Tensor] = []
    before = _flat(model, keys) if record else None
    if record and planned is not None:
        updates = torch.empty((planned, before.numel()), dtype=torch.float32)

    params = [p for _, p in named]
    anchors = _anchors(named, prox_anchor) if cfg.prox_mu > 0 else None  # FedProx's w^t, or a given anchor
    corrections = _corrections(named, drift_correction)
    corrected = 0
    sums = torch.zeros(3, device=device)  # total, main, aux
    steps = seen = skipped = 0
    layout = memory_format(cfg.channels_last)
    for batch in batches(loader, cfg):
        x = batch["image"].to(device, non_blocking=use_cuda, memory_format=layout)
        if bn_training and x.shape[0] < 2:
            skipped += 1
            continue
        y = batch["label"].to(device, non_blocking=use_cuda)
        mask = batch["label_mask"].to(device, non_blocking=use_cuda)
        if class_mask is not None:
            mask = mask * class_mask
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
            out = forward(x)
        main = masked_bce(out["main"], y, mask)
        if use_aux:
            aux = aux_ce(out["aux"], batch["aux"].to(device), batch["aux_mask"].to(device), tasks, cfg.aux_reduction)
            loss = main + float(cfg.alpha) * aux
        else:
            aux = torch.zeros((), device=device)
            loss = main
        if anchors is not None:
            loss = loss + proximal_term(params, anchors, cfg.prox_mu)
        if loss_term is not None:
            loss = loss + loss_term(named)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scale = scaler.get_scale() if corrections is not None and amp else None
        scaler.step(optimizer)
        scaler.update()
        if corrections is not None and (scale is None or scaler.get_scale() >= scale):  # not an AMP-skipped step
            _correct(params, corrections, cfg.lr)
            corrected += 1
        if cfg.dp:  # expanded weights refuse a forward while last step's per-sample gradients remain
            optimizer.zero_grad(set_to_none=True)
        sums += torch.stack([loss.detach(), main.detach(), aux.detach()])
        if record:
            after = _flat(model, keys)
            delta = (after - before).cpu()
            if updates is not None and steps < updates.shape[0]:
                updates[steps] = delta
            else:
                rows.append(delta)
            before = after
        steps += 1
        seen += int(x.shape[0])
    if skipped:
        _note_skipped(skipped)
    batch_updates = None
    if record:
        parts = [] if updates is None else [updates[: min(steps, updates.shape[0])]]
        parts += [torch.stack(rows)] if rows else []
        if not parts:
            batch_updates = torch.zeros((0, before.numel()))
        elif len(parts) == 1:
            only = parts[0]
            batch_updates = only if updates is None or only.shape[0] == updates.shape[0] else only.clone()
        else:
            batch_updates = torch.cat(parts)
    means = (sums / steps).tolist() if steps else [float("nan")] * 3
    return LocalResult(
        n_samples=_dataset_len(loader),
        n_batches=steps,
        loss=means[0],
        main_loss=means[1],
        aux_loss=means[2],
        batch_updates=batch_updates,
        optimizer_state=None if optimizer_state is None else {
            **dict(optimizer_state), **optimizer_state_dict(optimizer, named)},
        samples_seen=seen,
        skipped_batches=skipped,
        seconds=time.perf_counter() - started,
        corrected_steps=corrected,
    )


def _check_client_terms(cfg: LocalConfig, named: Sequence[tuple[str, nn.Parameter]],
                        drift_correction: Optional[Mapping[str, torch.Tensor]],
                        loss_term: Optional[Callable] = None) -> None:
    """Refuse FedProx/SCAFFOLD settings whose update would not be the published one (protocols say so first)."""
    if cfg.prox_mu < 0:
        raise ValueError(f"prox_mu must be >= 0, got {cfg.prox_mu}")
    if (cfg.prox_mu > 0 or loss_term is not None) and cfg.dp:
        raise ValueError("FedProx's proximal term (or a method's own loss term) cannot be trained with DP-SGD: "
                         "Opacus replaces each gradient by its clipped, noised per-sample sum, which drops the "
                         "term's gradient")
    if drift_correction is None:
        return
    if cfg.optimizer.lower() != "sgd" or cfg.momentum != 0:
        raise ValueError(f"SCAFFOLD's drift correction needs plain SGD (momentum 0), got {cfg.optimizer} with "
                         f"momentum {cfg.momentum}")
    missing = [n for n, _ in named if n not in drift_correction]
    if missing:
        raise ValueError(f"drift_correction lacks trainable parameters {missing[:5]}")


def _anchors(named: Sequence[tuple[str, nn.Parameter]],
             prox_anchor: Optional[Mapping[str, torch.Tensor]]) -> list[torch.Tensor]:
    """The proximal term's anchor per trainable parameter: ``prox_anchor``'s, else the parameter as it starts."""
    if prox_anchor is None:
        return [p.detach().clone() for _, p in named]
    missing = [n for n, _ in named if n not in prox_anchor]
    if missing:
        raise ValueError(f"prox_anchor lacks trainable parameters {missing[:5]}")
    return [prox_anchor[n].detach().to(device=p.device, dtype=p.dtype) for n, p in named]


def _corrections(named: Sequence[tuple[str, nn.Parameter]],
                 drift_correction: Optional[Mapping[str, torch.Tensor]]) -> Optional[list[torch.Tensor]]:
    """``c − c_i`` per trainable parameter, on its device and in its dtype (None: not SCAFFOLD)."""
    if drift_correction is None:
        return None
    out = []
    for name, p in named:
        value = drift_correction[name]
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"drift_correction[{name!r}] has shape {tuple(value.shape)}, the parameter {tuple(p.shape)}")
        out.append(value.detach().to(device=p.device, dtype=p.dtype))
    return out


@torch.no_grad()
def _correct(params: Sequence[torch.Tensor], corrections: Sequence[torch.Tensor], lr: float) -> None:
    """SCAFFOLD's part of the step: ``y ← y − η_l·(c − c_i)`` (Algorithm 1, line 10, after the SGD step on g)."""
    if params:
        torch._foreach_add_(list(params), list(corrections), alpha=-float(lr))


def _flat(model: nn.Module, keys: list[str]) -> torch.Tensor:
    """The model's state as one float32 vector over ``keys`` (the recorded g_j's units)."""
    return flatten_state(model.state_dict(), keys)[0].float()


_SKIP_NOTED = []  # the one-sample-batch notice is said once per process, then at debug level


def _note_skipped(skipped: int) -> None:
    """A last batch of one sample is common (n mod batch size = 1): say it once, not every round."""
    level = logging.DEBUG if _SKIP_NOTED else logging.INFO
    _SKIP_NOTED.append(skipped)
    log.log(level, "skipped %d batch(es) of one sample (BatchNorm cannot train on them; said once per run)",
            skipped)


def _dataset_len(loader: Any) -> int:
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return 0
