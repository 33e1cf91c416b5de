"""The protocol framework: what a round protocol knows and how it asks sites (DESIGN §8).

* :class:`Context` — the federation as a protocol sees it (config, transport, metadata,
  classes, sources, target); never any patient data.
* :func:`task_config` — the JSON-able config of a ``train`` task.
* :func:`ask`, :func:`ask_one`, :func:`valid_replies` — run a task through the transport,
  record absent sites, reject NaN/Inf/wrong-shape updates, fail a round below ``min_sites``.
* :class:`RoundProtocol` — the base class every method's protocol extends.
* :func:`aggregate_backbone` — FedAvg/FedBN of the shared entries, used by several protocols.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from fedcxr.errors import RunFailed, UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.pipeline.messages import Reply, StateDict
from fedcxr.pipeline.state import check_update
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)

#: The pooled site of the Central baseline (every site's rows in one place).
CENTRAL_SITE = "__central__"


class RoundFailed(RunFailed):
    """A round cannot count: too few sites answered (``min_sites``) or a needed update was bad."""


@dataclass
class Context:
    """What a protocol knows about the federation (never any patient data)."""

    cfg: ExperimentConfig
    transport: Transport
    meta: dict[str, Reply]  # metadata replies per site
    classes: list[str]  # global head classes, canonical order
    aux_tasks: list[str]  # [] when AuxInfo is off
    sources: list[str]
    target: Optional[str]
    bn_keys: list[str] = field(default_factory=list)
    head_keys: list[str] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)  # {"round", "task", "site"} for absent replies
    said: set = field(default_factory=set)  # notices already logged this run (see :meth:`once`)
    task_defaults: dict = field(default_factory=dict)  # the method's optimiser defaults (RoundProtocol.task_defaults)

    def class_set(self, site: str) -> list[str]:
        return [c for c in self.classes if c in self.meta[site].class_set]

    def once(self, key: tuple) -> bool:
        """True the first time ``key`` is seen in this run: a per-site notice is logged once, not every round."""
        if key in self.said:
            return False
        self.said.add(key)
        return True


# --------------------------------------------------------------------------- task configs


def task_config(ctx: Context, r: int, role: str, **overrides) -> dict:
    """The JSON-able config of a ``train`` task for a source or the target."""
    cfg = ctx.cfg
    local = cfg.target_train if role == "target" else cfg.source
    out = {
        "round": r, "seed": cfg.seed, "role": role,
        "param_classes": list(ctx.classes), "head_classes": list(ctx.classes),
        "aux_tasks": list(ctx.aux_tasks), "alpha": cfg.alpha,
        "use_aux": bool(ctx.aux_tasks) and role == "source",
        "lr": local.lr, "batch_size": target_batch_size(ctx) if role == "target" else local.batch_size,
        "epochs": local.epochs, "steps": local.steps,
        "weight_decay": local.weight_decay if local.weight_decay is not None else
        ctx.task_defaults.get("weight_decay", 0.0),
        "optimizer": local.optimizer or ctx.task_defaults.get("optimizer", "adam"),
        "keep_optimizer": (cfg.optimizer_state or ctx.task_defaults.get("optimizer_state", "fresh")) == "kept",
        "max_rows": local.max_rows,
        "trainable": "all", "local_keys": [], "record_batch_updates": False,
        "missing_as_negative": False,
        # FedBN+ (surgical aggregation paper): BN frozen in eval mode during local training
        "freeze_bn": cfg.backbone_aggregation == "fedbn_plus",
        "labeled": cfg.target_train.labeled if role == "target" else None,
        "dp": cfg.privacy.dp.model_dump() if cfg.privacy.dp is not None else None,
    }
    out.update(overrides)
    return out


#: The target's batch size when neither the config nor the method says (AuxInfo+GP code: 32).
TARGET_BATCH_SIZE = 32


def target_batch_size(ctx: Context) -> int:
    """``target_train.batch_size``, else the method's default (:meth:`RoundProtocol.task_defaults`)."""
    value = ctx.cfg.target_train.batch_size
    return int(value) if value is not None else int(ctx.task_defaults.get("target_batch_size", TARGET_BATCH_SIZE))


def ask(ctx: Context, task: str, sites: list[str], params: Optional[StateDict], config: dict, *,
        r: int, per_site=None, minimum: Optional[int] = None) -> dict[str, Reply]:
    """Run a task; record absent sites; fail the round when fewer than ``minimum`` answered."""
    replies = ctx.transport.run(task, sites, params, config, per_site=per_site)
    for site in sites:
        if site not in replies:
            ctx.missed.append({"round": r, "task": task, "site": site})
            log.warning("round %d: site %s did not answer task %s", r, site, task)
    need = min(len(sites), ctx.cfg.min_sites if minimum is None else minimum)
    if len(replies) < need:
        raise RoundFailed(f"round {r}: only {len(replies)} of {len(sites)} sites answered {task!r} (need {need})")
    return replies


def ask_one(ctx: Context, task: str, site: str, params: Optional[StateDict], config: dict, *, r: int,
            reference: Optional[StateDict] = None) -> Reply:
    """Ask one site the round cannot do without (target, pooled site); its update is checked.

    ``reference`` (default: the params sent) gives the expected keys and shapes; an update with
    NaN/Inf or a wrong shape fails the round rather than entering the model.
    """
    reply = ask(ctx, task, [site], params, config, r=r, minimum=1)[site]
    reference = params if reference is None else reference
    if reference is not None and reply.params is not None:
        reason = check_update(reply.params, reference)
        if reason:
            ctx.missed.append({"round": r, "task": task, "site": site, "reason": f"rejected: {reason}"})
            raise RoundFailed(f"round {r}: rejected the update of {site} ({task}): {reason}")
    return reply


def valid_replies(ctx: Context, replies: dict[str, Reply], reference: StateDict | Callable[[Reply], StateDict],
                  r: int) -> dict[str, Reply]:
    """Drop replies whose parameters contain NaN/Inf or have wrong shapes (reason logged).

    ``reference`` gives the expected keys and shapes: one state for every site, or a function
    of the reply (surgical aggregation: each site's head has its own classes' rows).
    """
    kept = {}
    for site, reply in replies.items():
        if reply.n_samples == 0:
            # A site with no training rows for the model's classes returned θ0 unchanged;
            # averaging it in would only shrink the others' updates.
            if ctx.once(("no rows", site)):
                log.warning("site %s has no training rows for the model's classes %s: its replies are not "
                            "aggregated (said once per run)", site, ctx.classes)
            continue
        expected = reference(reply) if callable(reference) else reference
        reason = check_update(reply.params, expected) if reply.params is not None else "no parameters"
        if reason:
            log.warning("round %d: rejected update from %s: %s", r, site, reason)
            ctx.missed.append({"round": r, "task": "train", "site": site, "reason": f"rejected: {reason}"})
            continue
        kept[site] = reply
    if not kept or len(kept) < min(len(replies), ctx.cfg.min_sites):
        raise RoundFailed(f"round {r}: only {len(kept)} valid updates (need {ctx.cfg.min_sites})")
    return kept


# --------------------------------------------------------------------------- base protocol


class RoundProtocol:
    """Base: ``init_state`` → ``run_round`` × rounds → ``final_models``.

    A protocol only decides who trains, on what, and which pure rule combines the replies;
    its state is a plain dict of tensors and numbers (checkpointed after every round).
    """

    name = "base"
    needs_target = False
    needs_target_labels = False
    needs_sources = True
    aux_info = False
    #: how the backbone average weights sites unless ``backbone_weighting`` says otherwise
    default_backbone_weighting = "samples"

    def __init__(self, name: str):
        self.name = name

    def validate(self, cfg: ExperimentConfig, meta: dict[str, Reply], classes: list[str]) -> None:
        """Refuse option combinations the method cannot use (exit 2, saying why)."""
        if self.needs_target and not cfg.target:
            raise UserError(f"strategy {self.name} needs a `target:` site")
        if self.needs_target_labels and cfg.target:
            per_class = meta[cfg.site_name(cfg.target)].metrics.get("labeled_per_class", {})
            if sum(per_class.get(c, 0) for c in classes) == 0:
                raise UserError(
                    f"strategy {self.name} fine-tunes on target labels, but target {cfg.target!r} has no "
                    f"labeled training rows for the model's classes {classes}; use FACT/FACT_NF or "
                    "Source_Only for an unlabeled target"
                )
        if self.needs_sources and not cfg.source_sites():
            raise UserError(f"strategy {self.name} needs at least one source site in `sites:`")

    def task_defaults(self) -> dict:
        """The method's defaults for ``optimizer``, ``weight_decay``, ``optimizer_state`` and
        ``target_batch_size`` (as its authors' code)."""
        return {}

    def init_state(self, ctx: Context, theta: StateDict) -> dict:
        return {"global": theta, "initial_bn": {k: theta[k].clone() for k in ctx.bn_keys}}

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        raise NotImplementedError

    def final_models(self, ctx: Context, state: dict) -> dict:
        """``{"global": θ, "per_site": {site: θ_site}}``; per_site may be empty."""
        return {"global": state["global"], "per_site": {}}

    def uniform_backbone(self, ctx: Context) -> bool:
        """True when sites are averaged 1/K (config ``backbone_weighting``, else the method's default)."""
        return (ctx.cfg.backbone_weighting or self.default_backbone_weighting) == "uniform"

    def eval_local_keys(self, ctx: Context) -> list[str]:
        """Keys each site substitutes from its own state at evaluation (FedBN: BN, PFL: head)."""
        return []

    def default_eval_sites(self, ctx: Context) -> list[str]:
        """The target when there is one (an external site for methods that have no target)."""
        return [ctx.target] if ctx.target else list(ctx.sources)


def aggregate_backbone(ctx: Context, replies: dict[str, Reply], theta0: StateDict, *,
                       uniform: bool = False, exclude: tuple[str, ...] = ()) -> StateDict:
    """FedAvg / FedBN / FedBN+ of everything except ``exclude`` (e.g. heads under surgical)."""
    sites = list(replies)
    states = [{k: v for k, v in replies[s].params.items() if k not in exclude} for s in sites]
    weights = [1.0 if uniform else float(max(replies[s].n_samples, 1)) for s in sites]
    mode = ctx.cfg.backbone_aggregation
    if mode == "fedavg":
        merged = agg.fedavg(states, weights)
    else:
        merged = agg.fedbn(states, weights, ctx.bn_keys)
    out = dict(theta0)
    out.update(merged)
    return out
