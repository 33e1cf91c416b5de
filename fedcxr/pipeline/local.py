"""One site's local training and prediction (DESIGN §5 'Local loss (AuxInfo)').

``L = L_main + α · Σ_k L_aux_k``:

* ``L_main`` (:func:`masked_bce`): BCE-with-logits over the observed entries of the batch only
  (``label_mask``), averaged over those entries — a site that does not label a class, or a row
  whose label is missing, adds nothing;
* ``L_aux_k`` (:func:`aux_ce`): cross-entropy of aux task ``k`` over the rows whose value is known.

A plain PyTorch loop (DESIGN §9): a fresh optimizer per call unless the caller hands in the
optimizer state of the site's previous call (:func:`train_local` ``optimizer_state``: the
surgical aggregation code keeps each client's Adam across rounds, FACT its SGD), optional AMP
on CUDA, and — for FedDA/FedGP auto-weighting — the model-state change of
every optimizer step (:func:`train_local` ``record_batch_updates``).

Two reviewers' baselines change this loop and nothing else: FedProx adds the proximal term
(:func:`proximal_term`, ``LocalConfig.prox_mu``) to the loss, and SCAFFOLD corrects every step
by its control variates (:func:`train_local` ``drift_correction``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedcxr.errors import UserError
from fedcxr.pipeline.state import flatten_state, update_keys

log = logging.getLogger(__name__)

TRAINABLE = ("all", "head", "backbone")
OPTIMIZERS = ("adam", "adamw", "sgd")


# --------------------------------------------------------------------------- losses


def masked_bce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over entries where ``mask`` > 0; ``(B, C)`` inputs, scalar out.

    A batch with no observed entry gives 0 that still has a ``grad_fn`` (backward gives zero
    gradients, never NaN).
    """
    per_entry = F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none")
    observed = mask > 0
    total = torch.where(observed, per_entry, torch.zeros_like(per_entry)).sum()
    return total / observed.sum().clamp_min(1)


def aux_ce(
    aux_logits: Mapping[str, torch.Tensor],
    aux: torch.Tensor,
    aux_mask: torch.Tensor,
    tasks: Sequence[str],
) -> torch.Tensor:
    """``Σ_k`` mean cross-entropy of task ``k`` over the rows whose code is known.

    ``aux_logits[task]``: (B, K_task) logits; ``aux``: (B, T) int64 codes (-1 unknown) in
    ``tasks`` order; ``aux_mask``: (B, T), 1 where known. A task with no known row adds 0.
    """
    total: Optional[torch.Tensor] = None
    for t, task in enumerate(tasks):
        logits = aux_logits[task].float()
        target = aux[:, t].long()
        known = (aux_mask[:, t] > 0) & (target >= 0)
        per_row = F.cross_entropy(logits, target.clamp_min(0), reduction="none")
        term = torch.where(known, per_row, torch.zeros_like(per_row)).sum() / known.sum().clamp_min(1)
        total = term if total is None else total + term
    if total is None:
        return torch.zeros((), device=aux.device)
    return total


def proximal_term(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's proximal term ``(μ/2)·‖w − w^t‖²`` (Li et al. 2020, MLSys, Eq. 2), a 0-dim tensor.

    ``params``: the trainable parameters w (BatchNorm running statistics are buffers, not
    parameters, so they are not in it, as in Flower's and NVFLARE's FedProx); ``anchors``: the
    same parameters as the site received them this round (w^t, no gradient). Summed in float32.
    Flower's ``FedProx`` docstring adds ``(w − w^t).norm(2)`` unsquared; the paper, NVFLARE's
    ``PTFedProxLoss`` and Flower's FedProx baseline square it, as here.
    """
    if len(params) != len(anchors):
        raise ValueError(f"proximal_term: {len(params)} parameters but {len(anchors)} anchors")
    if not params:
        return torch.zeros(())
    total = torch.stack([(p.float() - a.float()).square().sum() for p, a in zip(params, anchors)]).sum()
    return total * (float(mu) / 2.0)


# --------------------------------------------------------------------------- config and result


@dataclass
class LocalConfig:
    """Hyper-parameters of one local training call.

    ``steps`` (when set) overrides ``epochs``: that many optimizer steps, cycling the loader.
    ``amp`` only takes effect on CUDA. ``channels_last``: the model and every batch in NHWC
    memory layout (tensor cores on CUDA; :mod:`fedcxr.pipeline.engine` turns it on there).
    ``optimizer``: adam | adamw | sgd (with ``momentum``; 0.9 as FACT's code).
    ``prox_mu``: FedProx's μ (:func:`proximal_term` added to the loss); 0 = off.
    """

    lr: float = 1e-3
    batch_size: int = 32
    epochs: int = 1
    steps: Optional[int] = None
    alpha: float = 1.0
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


# --------------------------------------------------------------------------- devices


def resolve_device(name: str | torch.device | None) -> torch.device:
    """``auto``/``None`` → CUDA when available, else CPU; ``cuda`` or ``cuda:N`` (GPU number N) when
    that GPU exists — a missing GPU is a user error naming the GPUs there are."""
    if isinstance(name, torch.device):
        return name
    text = (name or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UserError(f"--device: unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device: unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine (use cpu or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise UserError(f"--device {name}: this machine has {count} CUDA device(s): "
                        f"{', '.join(f'cuda:{i}' for i in range(count))}")
    return device


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


def make_optimizer(params: list[torch.nn.Parameter], cfg: LocalConfig) -> torch.optim.Optimizer:
    name = cfg.optimizer.lower()
    if name == "adam":
        # foreach: one fused update over all tensors (torch picks the slow per-tensor loop on CPU)
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise UserError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {cfg.optimizer!r}")


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
      (:func:`optimizer_state_dict`, keyed ``<parameter name>.<field>``; ``{}`` for none yet):
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
    * ``cfg.prox_mu`` > 0 (FedProx): :func:`proximal_term` against the parameters as they are
      when the call starts (the round's received weights) is added to the loss. Refused with
      DP-SGD, which would drop its gradient (not a per-sample term).

    The model's ``requires_grad`` flags and train/eval modes are restored afterwards.
    """
    device = resolve_device(device)
    use_cuda = device.type == "cuda"
    model.to(device, memory_format=_memory_format(cfg.channels_last))
    modes = {m: m.training for m in model.modules()}
    flags = _set_trainable(model, trainable)
    if freeze_bn:
        _freeze_bn(model)
    started = time.perf_counter()
    try:
        gpus = [device.index if device.index is not None else torch.cuda.current_device()] if use_cuda else []
        with torch.random.fork_rng(devices=gpus, device_type="cuda"):
            torch.manual_seed(int(seed))
            return _loop(model, loader, cfg, device, loss_classes_mask, record_batch_updates, started,
                         optimizer_state, frozen_bn_trains, drift_correction)
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])
        for module, mode in modes.items():
            module.training = mode


def _loop(model: nn.Module, loader: Any, cfg: LocalConfig, device: torch.device,
          loss_classes_mask: Optional[torch.Tensor], record: bool, started: float,
          optimizer_state: Optional[Mapping[str, torch.Tensor]] = None, frozen_bn_trains: bool = False,
          drift_correction: Optional[Mapping[str, torch.Tensor]] = None) -> LocalResult:
    use_cuda = device.type == "cuda"
    amp = bool(cfg.amp) and use_cuda
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    _check_client_terms(cfg, named, drift_correction)
    params = [p for _, p in named]
    optimizer = make_optimizer(params, cfg)
    if optimizer_state:
        load_optimizer_state(optimizer, named, optimizer_state)
    forward, close = model, None
    if cfg.dp:
        from fedcxr.pipeline.dp import private

        forward, optimizer, close = private(model, optimizer, cfg.dp, cfg.batch_size)
        amp = False
    try:
        return _steps(model, forward, optimizer, loader, cfg, device, amp, loss_classes_mask, record, started,
                      named=named, optimizer_state=optimizer_state, frozen_bn_trains=frozen_bn_trains,
                      drift_correction=drift_correction)
    finally:
        if close is not None:
            close()


def _steps(model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer, loader: Any, cfg: LocalConfig,
           device: torch.device, amp: bool, loss_classes_mask: Optional[torch.Tensor], record: bool,
           started: float, *, named: Sequence[tuple[str, nn.Parameter]],
           optimizer_state: Optional[Mapping[str, torch.Tensor]], frozen_bn_trains: bool,
           drift_correction: Optional[Mapping[str, torch.Tensor]] = None) -> LocalResult:
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
    anchors = [p.detach().clone() for p in params] if cfg.prox_mu > 0 else None  # FedProx's w^t
    corrections = _corrections(named, drift_correction)
    corrected = 0
    sums = torch.zeros(3, device=device)  # total, main, aux
    steps = seen = skipped = 0
    layout = _memory_format(cfg.channels_last)
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
            aux = aux_ce(out["aux"], batch["aux"].to(device), batch["aux_mask"].to(device), tasks)
            loss = main + float(cfg.alpha) * aux
        else:
            aux = torch.zeros((), device=device)
            loss = main
        if anchors is not None:
            loss = loss + proximal_term(params, anchors, cfg.prox_mu)
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
                        drift_correction: Optional[Mapping[str, torch.Tensor]]) -> None:
    """Refuse FedProx/SCAFFOLD settings whose update would not be the published one (protocols say so first)."""
    if cfg.prox_mu < 0:
        raise ValueError(f"prox_mu must be >= 0, got {cfg.prox_mu}")
    if cfg.prox_mu > 0 and cfg.dp:
        raise ValueError("FedProx's proximal term cannot be trained with DP-SGD: Opacus replaces each gradient by its "
                         "clipped, noised per-sample sum, which drops the term's gradient")
    if drift_correction is None:
        return
    if cfg.optimizer.lower() != "sgd" or cfg.momentum != 0:
        raise ValueError(f"SCAFFOLD's drift correction needs plain SGD (momentum 0), got {cfg.optimizer} with "
                         f"momentum {cfg.momentum}")
    missing = [n for n, _ in named if n not in drift_correction]
    if missing:
        raise ValueError(f"drift_correction lacks trainable parameters {missing[:5]}")


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


def optimizer_state_dict(optimizer: torch.optim.Optimizer,
                         named: Sequence[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as ``{"<name>.<field>": tensor}`` on CPU.

    Tensors only (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``; SGD's ``momentum_buffer``), so
    it travels in a site's local state and loads with ``torch.load(weights_only=True)``;
    learning rates are not part of it (each call sets its own, e.g. FACT's schedule).
    """
    out = {}
    for name, p in named:
        for field, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"{name}.{field}"] = value.detach().to("cpu", copy=True)
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer, named: Sequence[tuple[str, nn.Parameter]],
                         state: Mapping[str, torch.Tensor]) -> None:
    """Inverse of :func:`optimizer_state_dict` for the parameters this optimizer trains."""
    for name, p in named:
        prefix = name + "."
        fields = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
        if not fields:
            continue
        optimizer.state[p] = {f: (v.clone() if f == "step" else v.to(p.device, copy=True)) for f, v in fields.items()}


def _memory_format(channels_last: bool) -> torch.memory_format:
    """NHWC (channels-last) or the model's own layout (``preserve_format`` leaves it as it is)."""
    return torch.channels_last if channels_last else torch.preserve_format


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


# --------------------------------------------------------------------------- prediction


@torch.no_grad()
def predict(model: nn.Module, loader: Any, *, device: torch.device | str, amp: bool = True,
            channels_last: bool = False) -> dict[str, Any]:
    """Sigmoid probabilities of every item of ``loader`` (model in eval mode, restored after).

    ``amp`` (float16 autocast) only applies on CUDA; ``channels_last`` as in :class:`LocalConfig`.
    Returns ``probs`` (N, C) float32 numpy in the head's class order, ``aux_probs``
    ``{task: (N, K)}`` (softmax), ``index`` (N,) int64 positions in the loader's dataset,
    and ``labels``/``label_mask`` (N, C) as the batches carried them.
    """
    device = resolve_device(device)
    use_cuda = device.type == "cuda"
    layout = _memory_format(channels_last)
    model.to(device, memory_format=layout)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    probs, index, labels, masks = [], [], [], []
    aux_probs: dict[str, list[np.ndarray]] = {t: [] for t in getattr(model, "aux_tasks", {}) or {}}
    try:
        for batch in loader:
            x = batch["image"].to(device, non_blocking=use_cuda, memory_format=layout)
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_cuda and amp):
                out = model(x)
            probs.append(torch.sigmoid(out["main"].float()).cpu().numpy())
            for task, logits in out["aux"].items():
                aux_probs[task].append(torch.softmax(logits.float(), dim=1).cpu().numpy())
            index.append(np.asarray(batch["index"], dtype=np.int64))
            labels.append(np.asarray(batch["label"], dtype=np.float32))
            masks.append(np.asarray(batch["label_mask"], dtype=np.float32))
    finally:
        for module, mode in modes.items():
            module.training = mode
    n_classes = len(getattr(model, "classes", [])) if not probs else probs[0].shape[1]
    cat = lambda parts, width: np.concatenate(parts) if parts else np.zeros((0, width), np.float32)  # noqa: E731
    return {
        "probs": cat(probs, n_classes),
        "aux_probs": {t: cat(v, getattr(model, "aux_tasks", {}).get(t, 0)) for t, v in aux_probs.items()},
        "index": np.concatenate(index) if index else np.zeros(0, np.int64),
        "labels": cat(labels, n_classes),
        "label_mask": cat(masks, n_classes),
    }


def quick_auroc(labels: np.ndarray, mask: np.ndarray, probs: np.ndarray,
                classes: Sequence[str]) -> dict[str, float]:
    """Per-class AUROC over labeled rows (``mask`` > 0); NaN when those rows hold one value.

    For per-round validation metrics; the evaluation package reports CIs and reasons.
    """
    from sklearn.metrics import roc_auc_score

    labels, mask, probs = np.asarray(labels), np.asarray(mask), np.asarray(probs)
    out: dict[str, float] = {}
    for i, cls in enumerate(classes):
        rows = mask[:, i] > 0
        y = labels[rows, i]
        if y.size == 0 or np.unique(y).size < 2:
            out[cls] = float("nan")
        else:
            out[cls] = float(roc_auc_score(y, probs[rows, i]))
    return out
