"""GP / FedDA / FedGP at the target site: fine-tune, then project the source updates there.

As in the AuxInfo+GP paper's Algorithm 3 and DESIGN §8, the server does not combine: it sends
the round-start model θ0 **and the source deltas Δ_i** to the target in one task
(``train_combine``). The target fine-tunes from θ0 on its few labels, then applies the pure
rule of :mod:`fedcxr.pipeline.aggregate` (``gp``, ``fedda`` or ``fedgp``, with auto-weighted
β_i computed from its own per-batch updates) and returns only the combined model and the
β_i. Its fine-tuned model and its per-batch updates never leave the site.

Payload layout: θ0 entries under their own keys, source i's delta under ``source<i>.<key>``;
the task config's ``combine`` block carries the rule and the sources' counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.transport import Reply, StateDict

if TYPE_CHECKING:  # pragma: no cover
    from fedcxr.pipeline.site_runner import SiteRunner

SOURCE_PREFIX = "source"


def pack(theta0: StateDict, deltas: list[StateDict]) -> StateDict:
    """θ0 plus each source delta under ``source<i>.`` (the target task's payload)."""
    payload = dict(theta0)
    for i, delta in enumerate(deltas):
        payload.update({f"{SOURCE_PREFIX}{i}.{k}": v for k, v in delta.items()})
    return payload


def unpack(payload: StateDict, n_sources: int) -> tuple[StateDict, list[StateDict]]:
    """Inverse of :func:`pack`."""
    prefixes = [f"{SOURCE_PREFIX}{i}." for i in range(n_sources)]
    theta0 = {k: v for k, v in payload.items() if not k.startswith(tuple(prefixes))}
    deltas = [{k[len(p):]: v for k, v in payload.items() if k.startswith(p)} for p in prefixes]
    return theta0, deltas


def combine(theta0: StateDict, target: StateDict, deltas: list[StateDict], spec: dict, *,
            n_target: int, batch_updates: Optional[torch.Tensor]) -> tuple[StateDict, list[float]]:
    """Apply the round's rule (``spec["rule"]``: gp | fedda | fedgp) to the target's update.

    ``spec`` holds the sources' sample and batch counts, the learning rates, batch sizes and
    epochs, and either a fixed ``beta`` or ``auto: true`` (β_i from ``batch_updates``).
    Returns the combined model and the β used per source.
    """
    sources = [agg.apply_delta(theta0, d) for d in deltas]
    n_sources = [max(int(n), 1) for n in spec["n_sources"]]
    if spec.get("auto"):
        betas = auto_betas(theta0, deltas, spec, batch_updates)
    else:
        betas = [float(spec["beta"])] * len(sources)
    scale = dict(
        n_sources=n_sources, n_target=max(int(n_target), 1), bs_source=spec["bs_source"],
        bs_target=spec["bs_target"], lr_source=spec["lr_source"], lr_target=spec["lr_target"],
        epochs_source=spec["epochs_source"], epochs_target=spec["epochs_target"],
    )
    rule = spec["rule"]
    if rule == "gp":
        return agg.gp(theta0, target, sources, beta=betas[0], **scale), betas
    if rule == "fedda":
        return agg.fedda(theta0, target, sources, betas=betas, n_sources=n_sources), betas
    if rule == "fedgp":
        return agg.fedgp(theta0, target, sources, betas=betas, **scale), betas
    raise ValueError(f"unknown combination rule {rule!r}")


def auto_betas(theta0: StateDict, deltas: list[StateDict], spec: dict,
               batch_updates: Optional[torch.Tensor]) -> list[float]:
    """Auto-weighting (DESIGN §5): the target's per-batch updates vs each source's per-batch update."""
    if batch_updates is None or batch_updates.shape[0] < 2:
        raise UserError("auto-weighting (FedDA_Auto/FedGP_Auto) needs at least two target batches per "
                        "round: raise target_train.steps/epochs or labeled, or lower target_train.batch_size")
    g = batch_updates.float() * (float(spec["lr_target"]) / float(spec["lr_source"]))
    keys = agg.update_keys(theta0)
    flat = [agg.source_step_update(agg.flatten_state(d, keys)[0], max(int(b), 1))
            for d, b in zip(deltas, spec["n_batches"])]
    result = agg.auto_betas(g, torch.stack(flat), rule=spec["rule"])
    return [float(b) for b in result["betas"]]


# --------------------------------------------------------------------------- the target's task


def site_handlers(runner: "SiteRunner") -> dict:
    return {"train_combine": lambda params, config: train_combine(runner, params, config)}


def train_combine(runner: "SiteRunner", params: StateDict, config: dict) -> Reply:
    """Fine-tune from θ0 on the target's labeled rows, then combine with the source deltas."""
    spec = config["combine"]
    theta0, deltas = unpack(params, len(spec["n_sources"]))
    reply = runner.handle("train", theta0, {**config, "record_batch_updates": bool(spec.get("auto"))})
    theta, betas = combine(theta0, reply.params, deltas, spec, n_target=reply.n_samples,
                           batch_updates=reply.extra.get("batch_updates"))
    return Reply(site=runner.name, params=theta, n_samples=reply.n_samples, n_batches=reply.n_batches,
                 class_set=reply.class_set, metrics={**reply.metrics, "betas": betas})
