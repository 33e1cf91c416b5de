"""Round protocols, selectable by the papers' method names (DESIGN §5, §8).

A protocol only decides who trains, on what, and which pure rule of
:mod:`fedcxr.pipeline.aggregate` combines the replies; it talks to sites through a
:class:`~fedcxr.pipeline.transport.Transport`, so the in-process simulation and NVIDIA FLARE
run the very same code. Protocol state is a plain dict of tensors and numbers so the
federation can checkpoint it after every round.

Methods:

* AuxInfo+GP paper: ``FedAvg``, ``FedAvg_Finetune``, ``FedAvg_Finetune_AuxInfo``,
  ``FedAvg_Finetune_GP``, ``FedAvg_Finetune_AuxInfo_GP``, ``Oracle``.
* FedGP paper: ``Source_Only``, ``Finetune_Offline``, ``FedDA``, ``FedGP``, ``FedDA_Auto``,
  ``FedGP_Auto``, ``Target_Only``.
* Surgical aggregation paper: ``Individual``, ``PFL``, ``Central``, ``FL``, ``FL_PartialLoss``,
  ``FL_Surgical`` (backbone aggregation from ``backbone_aggregation``).
* FACT: ``FACT``, ``FACT_NF`` (:mod:`fedcxr.pipeline.fact`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional


from fedcxr.errors import RunFailed, UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.config import ExperimentConfig
from fedcxr.pipeline.transport import Reply, StateDict, Transport

log = logging.getLogger(__name__)


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

    def class_set(self, site: str) -> list[str]:
        return [c for c in self.classes if c in self.meta[site].class_set]


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
        "lr": local.lr, "batch_size": local.batch_size, "epochs": local.epochs, "steps": local.steps,
        "weight_decay": local.weight_decay, "max_rows": local.max_rows,
        "trainable": "all", "local_keys": [], "record_batch_updates": False,
        "missing_as_negative": False,
        "labeled": cfg.target_train.labeled if role == "target" else None,
    }
    out.update(overrides)
    return out


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
        reason = agg.check_update(reply.params, reference)
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
            log.info("round %d: %s had no training rows for the model's classes; not aggregated", r, site)
            continue
        expected = reference(reply) if callable(reference) else reference
        reason = agg.check_update(reply.params, expected) if reply.params is not None else "no parameters"
        if reason:
            log.warning("round %d: rejected update from %s: %s", r, site, reason)
            ctx.missed.append({"round": r, "task": "train", "site": site, "reason": f"rejected: {reason}"})
            continue
        kept[site] = reply
    if not kept or len(kept) < min(len(replies), ctx.cfg.min_sites):
        raise RoundFailed(f"round {r}: only {len(kept)} valid updates (need {ctx.cfg.min_sites})")
    return kept


# --------------------------------------------------------------------------- base protocol


class Protocol:
    """Base: ``init_state`` → ``run_round`` × rounds → ``final_models``."""

    name = "base"
    needs_target = False
    needs_target_labels = False
    needs_sources = True
    aux_info = False

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

    def init_state(self, ctx: Context, theta: StateDict) -> dict:
        return {"global": theta, "initial_bn": {k: theta[k].clone() for k in ctx.bn_keys}}

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        raise NotImplementedError

    def final_models(self, ctx: Context, state: dict) -> dict:
        """``{"global": θ, "per_site": {site: θ_site}}``; per_site may be empty."""
        return {"global": state["global"], "per_site": {}}

    def eval_local_keys(self, ctx: Context) -> list[str]:
        """Keys each site substitutes from its own state at evaluation (FedBN: BN, PFL: head)."""
        return []

    def default_eval_sites(self, ctx: Context) -> list[str]:
        """The target when there is one (an external site for methods that have no target)."""
        return [ctx.target] if ctx.target else list(ctx.sources)


def _aggregate_backbone(ctx: Context, replies: dict[str, Reply], theta0: StateDict, *,
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


class FedAvgProtocol(Protocol):
    """Sources train from θ0, the server averages; optionally the target fine-tunes (Alg. 1)."""

    def __init__(self, name: str, *, finetune: bool, aux_info: bool):
        super().__init__(name)
        self.finetune = finetune
        self.aux_info = aux_info
        self.needs_target_labels = finetune

    def _local_keys(self, ctx: Context) -> list[str]:
        return ctx.bn_keys if ctx.cfg.backbone_aggregation != "fedavg" else []

    def eval_local_keys(self, ctx: Context) -> list[str]:
        return self._local_keys(ctx)

    def fedavg_round(self, ctx: Context, r: int, theta0: StateDict) -> tuple[StateDict, dict]:
        cfg = task_config(ctx, r, "source", local_keys=self._local_keys(ctx))
        replies = ask(ctx, "train", ctx.sources, theta0, cfg, r=r)
        replies = valid_replies(ctx, replies, theta0, r)
        theta = _aggregate_backbone(ctx, replies, theta0)
        if ctx.cfg.backbone_aggregation == "fedbn_plus":
            theta = agg.keep_keys(theta, theta0, ctx.bn_keys)
        return theta, {"train": {s: rep.metrics for s, rep in replies.items()},
                       "n_samples": {s: rep.n_samples for s, rep in replies.items()}}

    def finetune_target(self, ctx: Context, r: int, theta: StateDict) -> tuple[StateDict, dict]:
        cfg = task_config(ctx, r, "target")
        reply = ask_one(ctx, "train", ctx.target, theta, cfg, r=r)
        return reply.params, {"target": reply.metrics}

    def run_round(self, ctx, r, state):
        theta, metrics = self.fedavg_round(ctx, r, state["global"])
        if self.finetune:
            theta, more = self.finetune_target(ctx, r, theta)
            metrics.update(more)
        return {**state, "global": theta}, metrics


class TargetCombineProtocol(FedAvgProtocol):
    """Sources train from θ0; the target fine-tunes from θ0 and combines (Alg. 3, DESIGN §8).

    The server sends θ0 and the source deltas Δ_i to the target in one ``train_combine`` task;
    the target applies the pure rule (:mod:`fedcxr.pipeline.target_combine`) and returns only
    the combined model. The first ``warmup_rounds`` are plain FedAvg rounds.
    """

    rule = "gp"
    auto = False

    def __init__(self, name: str, *, aux_info: bool = False):
        super().__init__(name, finetune=True, aux_info=aux_info)
        self.needs_target = True

    def run_round(self, ctx, r, state):
        from fedcxr.pipeline import target_combine

        theta0 = state["global"]
        if r < ctx.cfg.warmup_rounds:
            theta, metrics = self.fedavg_round(ctx, r, theta0)
            return {**state, "global": theta}, {**metrics, "warmup": True}
        replies = valid_replies(ctx, ask(ctx, "train", ctx.sources, theta0, task_config(ctx, r, "source"), r=r),
                                theta0, r)
        sites = list(replies)
        payload = target_combine.pack(theta0, [agg.delta(replies[s].params, theta0) for s in sites])
        tcfg = task_config(ctx, r, "target", combine=self.combine_spec(ctx, replies))
        target = ask_one(ctx, "train_combine", ctx.target, payload, tcfg, r=r, reference=theta0)
        betas = target.metrics.get("betas") or []
        return {**state, "global": target.params}, {
            "train": {s: rep.metrics for s, rep in replies.items()},
            "target": {k: v for k, v in target.metrics.items() if k != "betas"},
            "betas": dict(zip(sites, [float(b) for b in betas])),
        }

    def combine_spec(self, ctx: Context, replies: dict[str, Reply]) -> dict:
        """What the target needs to know about the sources: counts only, never data."""
        cfg = ctx.cfg
        return {
            "rule": self.rule, "auto": self.auto, "beta": cfg.beta,
            "n_sources": [int(rep.n_samples) for rep in replies.values()],
            "n_batches": [int(rep.n_batches) for rep in replies.values()],
            "bs_source": cfg.source.batch_size, "bs_target": cfg.target_train.batch_size,
            "lr_source": cfg.source.lr, "lr_target": cfg.target_train.lr,
            "epochs_source": cfg.source.epochs or 1, "epochs_target": cfg.target_train.epochs or 1,
        }


class GPProtocol(TargetCombineProtocol):
    """FedAvg_Finetune(_AuxInfo)_GP: the target projects the source updates (Eq. 7, β on sources)."""

    rule = "gp"


class FedDAGPProtocol(TargetCombineProtocol):
    """FedGP paper: FedDA / FedGP with a fixed β or auto-weighted per-source β_i."""

    def __init__(self, name: str, *, rule: str, auto: bool):
        super().__init__(name)
        self.rule, self.auto = rule, auto


class SourceOnlyProtocol(FedAvgProtocol):
    """Source_Only: FedAvg of the sources, evaluated on the target (no target labels)."""

    def __init__(self, name: str):
        super().__init__(name, finetune=False, aux_info=False)


class FinetuneOfflineProtocol(FedAvgProtocol):
    """Finetune_Offline: FedAvg of the sources for all rounds, then the target fine-tunes once."""

    def __init__(self, name: str):
        super().__init__(name, finetune=True, aux_info=False)
        self.needs_target = True

    def run_round(self, ctx, r, state):
        theta, metrics = self.fedavg_round(ctx, r, state["global"])
        if r == ctx.cfg.rounds - 1:
            theta, more = self.finetune_target(ctx, r, theta)
            metrics.update(more)
        return {**state, "global": theta}, metrics


class TargetOnlyProtocol(Protocol):
    """Target_Only (its labeled rows) / Oracle (every labeled target row): no federation."""

    needs_target = True
    needs_target_labels = True
    needs_sources = False

    def __init__(self, name: str, *, oracle: bool):
        super().__init__(name)
        self.oracle = oracle

    def validate(self, cfg, meta, classes):
        if not cfg.target:
            raise UserError(f"strategy {self.name} needs a `target:` site")
        super().validate(cfg, meta, classes)

    def run_round(self, ctx, r, state):
        cfg = task_config(ctx, r, "target", labeled=None if self.oracle else ctx.cfg.target_train.labeled)
        reply = ask_one(ctx, "train", ctx.target, state["global"], cfg, r=r)
        return {**state, "global": reply.params}, {"target": reply.metrics}


class CentralProtocol(Protocol):
    """Central: every site's training rows pooled in one place (the ``__central__`` site)."""

    def __init__(self, name: str):
        super().__init__(name)

    def validate(self, cfg, meta, classes):
        pass

    def run_round(self, ctx, r, state):
        cfg = task_config(ctx, r, "source", use_aux=bool(ctx.aux_tasks), missing_as_negative=True)
        reply = ask_one(ctx, "train", CENTRAL_SITE, state["global"], cfg, r=r)
        return {**state, "global": reply.params}, {"train": {CENTRAL_SITE: reply.metrics}}


CENTRAL_SITE = "__central__"


class IndividualProtocol(Protocol):
    """Individual: each site trains alone on its own classes; evaluated on its own test set."""

    def __init__(self, name: str):
        super().__init__(name)

    def validate(self, cfg, meta, classes):
        pass

    def init_state(self, ctx, theta):
        return {"global": theta, "per_site": {s: dict(theta) for s in ctx.sources}}

    def run_round(self, ctx, r, state):
        per_site = {s: (state["per_site"][s], task_config(ctx, r, "source")) for s in ctx.sources}
        replies = ask(ctx, "train", ctx.sources, None, {}, r=r, per_site=per_site, minimum=1)
        new = dict(state["per_site"])
        for s, rep in replies.items():
            new[s] = rep.params
        return {**state, "per_site": new}, {"train": {s: rep.metrics for s, rep in replies.items()}}

    def final_models(self, ctx, state):
        return {"global": state["global"], "per_site": state["per_site"]}

    def default_eval_sites(self, ctx):
        return list(ctx.sources)  # each site's own model on its own test set


class SurgicalFamilyProtocol(Protocol):
    """FL / FL_PartialLoss / FL_Surgical / PFL of the surgical aggregation paper.

    * ``FL``: one global head over every class; classes a site does not label are negatives.
    * ``FL_PartialLoss``: global head; each site's loss only over its own classes.
    * ``FL_Surgical``: each site trains a head of its own classes; head rows are averaged per
      class over the sites having it, by name (:func:`aggregate.surgical_heads`); backbone
      averaged unweighted by default (``surgical_weighting``).
    * ``PFL``: shared backbone, heads stay local.
    """

    def __init__(self, name: str, *, mode: str):
        super().__init__(name)
        self.mode = mode

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

    def _site_config(self, ctx: Context, r: int, site: str) -> dict:
        trainable = "head" if r < ctx.cfg.head_warmup_rounds else "all"
        cfg = task_config(ctx, r, "source", trainable=trainable, local_keys=self._local_keys(ctx))
        if self.mode == "fl":
            cfg["missing_as_negative"] = True
        if self.mode == "surgical":
            cfg["head_classes"] = ctx.class_set(site)
        return cfg

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        per_site = {s: (theta0, self._site_config(ctx, r, s)) for s in ctx.sources}
        replies = ask(ctx, "train", ctx.sources, theta0, {}, r=r, per_site=per_site)
        if self.mode == "surgical":
            replies = valid_replies(ctx, replies, self._site_reference(ctx, theta0), r)
            theta = self._surgical(ctx, replies, theta0)
        else:
            replies = valid_replies(ctx, replies, theta0, r)
            exclude = tuple(ctx.head_keys) if self.mode == "pfl" else ()
            theta = _aggregate_backbone(ctx, replies, theta0, exclude=exclude)
        if ctx.cfg.backbone_aggregation == "fedbn_plus":
            theta = agg.keep_keys(theta, state["initial_bn"], ctx.bn_keys)
        return {**state, "global": theta}, {"train": {s: rep.metrics for s, rep in replies.items()}}

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
        uniform = ctx.cfg.surgical_weighting == "uniform"
        theta = _aggregate_backbone(ctx, replies, theta0, uniform=uniform, exclude=tuple(ctx.head_keys))
        heads = [{"weight": replies[s].params["head.weight"], "bias": replies[s].params["head.bias"]}
                 for s in sites]
        previous = {"weight": theta0["head.weight"], "bias": theta0["head.bias"]}
        global_head, _ = agg.surgical_heads(heads, [replies[s].class_set for s in sites], ctx.classes,
                                            previous=previous)
        theta["head.weight"], theta["head.bias"] = global_head["weight"], global_head["bias"]
        return theta


# --------------------------------------------------------------------------- registry


def _fact(name: str) -> Protocol:
    from fedcxr.pipeline.fact import FACTProtocol

    return FACTProtocol(name, finetune=(name == "FACT"))


REGISTRY: dict[str, Callable[[str], Protocol]] = {
    "FedAvg": lambda n: FedAvgProtocol(n, finetune=False, aux_info=False),
    "FedAvg_Finetune": lambda n: FedAvgProtocol(n, finetune=True, aux_info=False),
    "FedAvg_Finetune_AuxInfo": lambda n: FedAvgProtocol(n, finetune=True, aux_info=True),
    "FedAvg_Finetune_GP": lambda n: GPProtocol(n, aux_info=False),
    "FedAvg_Finetune_AuxInfo_GP": lambda n: GPProtocol(n, aux_info=True),
    "Oracle": lambda n: TargetOnlyProtocol(n, oracle=True),
    "Source_Only": SourceOnlyProtocol,
    "Finetune_Offline": FinetuneOfflineProtocol,
    "FedDA": lambda n: FedDAGPProtocol(n, rule="fedda", auto=False),
    "FedGP": lambda n: FedDAGPProtocol(n, rule="fedgp", auto=False),
    "FedDA_Auto": lambda n: FedDAGPProtocol(n, rule="fedda", auto=True),
    "FedGP_Auto": lambda n: FedDAGPProtocol(n, rule="fedgp", auto=True),
    "Target_Only": lambda n: TargetOnlyProtocol(n, oracle=False),
    "Individual": IndividualProtocol,
    "PFL": lambda n: SurgicalFamilyProtocol(n, mode="pfl"),
    "Central": CentralProtocol,
    "FL": lambda n: SurgicalFamilyProtocol(n, mode="fl"),
    "FL_PartialLoss": lambda n: SurgicalFamilyProtocol(n, mode="partial"),
    "FL_Surgical": lambda n: SurgicalFamilyProtocol(n, mode="surgical"),
    "FACT": _fact,
    "FACT_NF": _fact,
}


def get_protocol(name: str) -> Protocol:
    """The protocol for a method name; exit-2 error listing the known names otherwise."""
    if name not in REGISTRY:
        raise UserError(f"unknown strategy {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name](name)
