"""Forward passes without training: a model's probabilities over a loader, and the rounds' quick AUROC.

:func:`predict` is the one loop that turns batches into sigmoid (findings) and softmax (aux
tasks) probabilities — the rounds' validation (:meth:`SiteRunner._evaluate`), ``fedcxr evaluate``'s
prediction tables and the surgical head warm-up's validation loss all use it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from fedcxr.pipeline.devices import memory_format, place, resolve_device


@torch.no_grad()
def predict(model: nn.Module, loader: Any, *, device: torch.device | str, amp: bool = True,
            channels_last: bool = False) -> dict[str, Any]:
    """Sigmoid probabilities of every item of ``loader`` (model in eval mode, restored after).

    ``amp`` (float16 autocast) only applies on CUDA; ``channels_last``: the model and every batch
    in NHWC memory layout (as :class:`~fedcxr.pipeline.local.LocalConfig`).
    Returns ``probs`` (N, C) float32 numpy in the head's class order, ``aux_probs``
    ``{task: (N, K)}`` (softmax), ``index`` (N,) int64 positions in the loader's dataset,
    and ``labels``/``label_mask`` (N, C) as the batches carried them.
    """
    return predict_each(model, [loader], device=device, amp=amp, channels_last=channels_last)[0]


@torch.no_grad()
def predict_each(model: nn.Module, loaders: Sequence[Any], *, device: torch.device | str, amp: bool = True,
                 channels_last: bool = False) -> list[dict[str, Any]]:
    """:func:`predict` of each of ``loaders`` in turn, the model placed and put in eval mode once.

    Why: a process's simulated sites validate the same model (:func:`~fedcxr.pipeline.site_runner.
    evaluate_sites`); each loader's batches go through it exactly as :func:`predict` alone would send
    them — the same batch shapes, so the same floats (a CPU convolution's or linear layer's result
    for a row can depend on how many rows share its batch, so rows of different sites are not mixed).
    """
    device = resolve_device(device)
    layout = memory_format(channels_last)
    place(model, device, layout)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        return [_predict_batches(model, loader, device, layout, amp) for loader in loaders]
    finally:
        for module, mode in modes.items():
            module.training = mode


def _predict_batches(model: nn.Module, loader: Any, device: torch.device, layout, amp: bool) -> dict[str, Any]:
    use_cuda = device.type == "cuda"
    probs, index, labels, masks = [], [], [], []
    aux_probs: dict[str, list[np.ndarray]] = {t: [] for t in getattr(model, "aux_tasks", {}) or {}}
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
    labels, mask, probs = np.asarray(labels), np.asarray(mask), np.asarray(probs)
    out: dict[str, float] = {}
    for i, cls in enumerate(classes):
        rows = mask[:, i] > 0
        y = labels[rows, i]
        if y.size == 0 or np.unique(y).size < 2:
            out[cls] = float("nan")
        else:
            out[cls] = binary_auroc(y, probs[rows, i])
    return out


def binary_auroc(y: np.ndarray, scores: np.ndarray) -> float:
    """The AUROC of ``scores`` for the 0/1 labels ``y`` (both present): scikit-learn's
    ``roc_auc_score`` to the last bit, without its input checks.

    Why its own: every site validates every round, and ``roc_auc_score`` spends ~3 ms checking its
    inputs — 0.3 s a round at 100 sites, as long as their forward passes. The arithmetic is
    scikit-learn's (1.9): scores sorted descending, the true/false positive counts at each distinct
    score (float64 cumulative sums), collinear points dropped, rates by the last counts, the area
    by the trapezoidal rule — so the rounds' AUROCs in ``metrics.jsonl`` are unchanged
    (``tests/pipeline/test_forward.py`` compares the two on random and tied scores).
    """
    from scipy.integrate import trapezoid

    scores = np.asarray(scores)
    order = np.argsort(scores, kind="stable")[::-1]
    scores = scores[order]
    positive = (np.asarray(y)[order] == 1).astype(np.float64)
    last = np.r_[np.flatnonzero(np.diff(scores)), positive.size - 1]
    tps = np.cumsum(positive, dtype=np.float64)[last]
    fps = 1 + last.astype(np.float64) - tps
    if fps.shape[0] > 2:
        keep = np.flatnonzero(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])
        fps, tps = fps[keep], tps[keep]
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    return float(trapezoid(tps / tps[-1], fps / fps[-1]))
