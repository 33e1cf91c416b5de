"""GP, FedDA and FedGP (fixed or auto-weighted β): sources train, the target combines (DESIGN §5, §8).

* ``FedAvg_Finetune_GP`` / ``FedAvg_Finetune_AuxInfo_GP`` — AuxInfo+GP paper, Alg. 3: the target
  projects the source updates onto its own fine-tuning direction (β on the sources).
* ``FedDA`` / ``FedGP`` / ``FedDA_Auto`` / ``FedGP_Auto`` — FedGP paper: per-source β_i, fixed
  or estimated from the target's per-batch updates.

Warm-up as the authors' code (``gp.warmup_rounds``, counted in ``rounds``): FedDA/FedGP(_Auto)
start with 2 plain FedAvg rounds (AutoFedGP); GP with 5 rounds whose projection starts from the
FedAvg of the sources (AuxInfo+GP). The auto versions then run at 0.1× the learning rates
(``gp.post_warmup_lr_scale``).

Where the rule runs is a privacy choice (``privacy.combine_at`` for fixed β,
``privacy.auto_weights_at`` for the auto-weighted methods; README "Privacy modes"):

* ``server`` (default) — the sources and the target train from θ0 in **one** ``train_gp`` request (FLARE
  runs them at once: a round costs max(sources, target) + combine); the target returns its
  fine-tuned model (auto: plus its per-batch updates) and the server applies the rule.
  No source update ever reaches a peer hospital.
* ``target`` — the target fine-tunes beside the sources and keeps its model
  (``hold_for_combine``); the server then sends θ0 and every source delta to the target
  (``train_combine``), which combines and returns only the result (a round costs
  max(sources, target) + one more round trip).

GP's warm-up rounds start the target from the sources' average, so there the target trains
after the sources in both modes.

Both call the same :func:`fedcxr.pipeline.combine.combine` on the same numbers. The family's site
tasks (``train_gp``, ``train_combine``), their share of the task envelope (:class:`GPTask`,
:class:`CombineTask`, :class:`CombineSpec`) and the ``train_combine`` payload layout are here too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
from pydantic import Field

from fedcxr.errors import UserError
from fedcxr.pipeline.combine import combine_with_estimates
from fedcxr.pipeline.messages import Reply, StateDict, TaskConfig, TrainTask
from fedcxr.pipeline.protocols.base import (
    Context,
    RoundFailed,
    aggregate_backbone,
    ask,
    ask_one,
    check_one,
    missed_text,
    round_sources,
    target_batch_size,
    task_config,
    valid_replies,
)
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.spec import MAX_ROUNDS, METHOD_DEFAULT, MethodOptions, SiteTask, method
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.state import delta

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the task envelope and payload


@dataclass(frozen=True)
class CombineSpec(TaskConfig):
    """What the target of a GP/FedDA/FedGP round needs to know about the sources — counts and
    hyper-parameters, never data (:func:`fedcxr.pipeline.combine.combine` reads it)."""

    kind: ClassVar[str] = "combine"

    rule: Literal["gp", "fedda", "fedgp"]
    auto: bool
    beta: float
    n_sources: tuple[int, ...]  # each source's training rows, in the order of the payload's deltas
    n_batches: tuple[int, ...]  # each source's optimiser steps
    bs_source: int
    bs_target: int
    lr_source: float
    lr_target: float
    epochs_source: int
    epochs_target: int
    alignment: Literal["lr_s_over_lr_t", "lr_t_over_lr_s"] = "lr_s_over_lr_t"


@dataclass(frozen=True)
class GPTask(TrainTask):
    """The GP family's training task (``train_gp``): sources and target of a round in one request."""

    kind: ClassVar[str] = "train_gp task"

    record_batch_updates: bool = False  # auto-β: the state change of every optimiser step
    hold_for_combine: bool = False  # at the target: keep the model for the round's train_combine


@dataclass(frozen=True)
class CombineTask(GPTask):
    """``train_combine``: the target fine-tunes (or takes its held model) and applies the rule."""

    kind: ClassVar[str] = "train_combine task"

    combine: Optional[CombineSpec] = None  # the rule's inputs


#: ``train_combine`` payload: source ``i``'s delta lives under ``source<i>.<key>``.
SOURCE_PREFIX = "source"
#: :attr:`SiteRunner.memory <fedcxr.pipeline.site_runner.SiteRunner.memory>` key of a held fine-tuning
HELD = "gp_held"


def pack_combine(theta0: StateDict, deltas: list[StateDict]) -> StateDict:
    """θ0 plus each source delta under ``source<i>.`` (the ``train_combine`` payload)."""
    payload = dict(theta0)
    for i, d in enumerate(deltas):
        payload.update({f"{SOURCE_PREFIX}{i}.{k}": v for k, v in d.items()})
    return payload


def unpack_combine(payload: StateDict, n_sources: int) -> tuple[StateDict, list[StateDict]]:
    """Inverse of :func:`pack_combine`."""
    prefixes = [f"{SOURCE_PREFIX}{i}." for i in range(n_sources)]
    theta0 = {k: v for k, v in payload.items() if not k.startswith(tuple(prefixes))}
    deltas = [{k[len(p):]: v for k, v in payload.items() if k.startswith(p)} for p in prefixes]
    return theta0, deltas


# --------------------------------------------------------------------------- the sites' side


def train_gp(runner, params: StateDict, config: GPTask) -> Reply:
    """Local training of a GP-family round; the target records its per-batch updates (auto-β), and
    under target-side combination holds its fine-tuned model for the round's ``train_combine`` (the
    reply then carries counts and metrics only)."""
    reply = runner.train(params, config, record_batch_updates=config.record_batch_updates)
    if not config.hold_for_combine:
        return reply
    runner.memory[HELD] = (config.round, {k: v.clone() for k, v in params.items()}, reply)
    return Reply(site=runner.name, n_samples=reply.n_samples, n_batches=reply.n_batches,
                 class_set=reply.class_set, metrics=reply.metrics)


def train_combine(runner, params: StateDict, config: CombineTask) -> Reply:
    """Fine-tune from θ0 on the target's labeled rows (or take the fine-tuning held from this round's
    ``train_gp``), then combine with the source deltas (:mod:`fedcxr.pipeline.combine`); only the
    combined model, the β_i and the scalars behind them (s_i, kept share, σ², d², τ²d²) leave the
    site — its fine-tuned model and per-batch updates do not."""
    spec = config.combine
    if spec is None:
        raise ValueError(f"site {runner.name}: a train_combine task without its combine spec")
    theta0, deltas = unpack_combine(params, len(spec.n_sources))
    reply = _held(runner, theta0, config.round)
    if reply is None:  # not fine-tuned beside the sources (or the site restarted since): do it now
        reply = runner.train(theta0, config, record_batch_updates=spec.auto)
    theta, betas, estimates = combine_with_estimates(theta0, reply.params, deltas, spec, n_target=reply.n_samples,
                                                     batch_updates=reply.extra.get("batch_updates"),
                                                     target_steps=reply.n_batches)
    return Reply(site=runner.name, params=theta, n_samples=reply.n_samples, n_batches=reply.n_batches,
                 class_set=reply.class_set, metrics={**reply.metrics, "betas": betas, "combine": estimates})


def _held(runner, theta0: StateDict, r) -> Optional[Reply]:
    """The fine-tuning this site did from ``theta0`` in round ``r`` (``hold_for_combine``), used once."""
    held = runner.memory.pop(HELD, None)
    if held is None or held[0] != r or held[1].keys() != theta0.keys():
        return None
    if not all(torch.equal(held[1][k], theta0[k]) for k in theta0):
        return None
    return held[2]


# --------------------------------------------------------------------------- the server's side


class GPOptions(MethodOptions):
    """``gp:`` — the GP family's options (GP, FedDA, FedGP and their auto-weighted versions)."""

    beta: float = Field(0.5, ge=0, le=1, description="GP, FedDA, FedGP: β, the weight of the sources' "
                        "(projected) updates (auto versions: estimated per source instead)")
    warmup_rounds: Optional[int] = Field(
        None, ge=0, le=MAX_ROUNDS, description="the first rounds (counted in `rounds`) are warm-up rounds (plain "
        "FedAvg; GP: FedAvg, then the projection starts from it); " + METHOD_DEFAULT)
    post_warmup_lr_scale: Optional[float] = Field(
        None, gt=0, description="multiplies source and target learning rates after the warm-up rounds; "
        + METHOD_DEFAULT)
    auto_alignment: Literal["lr_s_over_lr_t", "lr_t_over_lr_s"] = Field(
        "lr_s_over_lr_t", description="FedDA_Auto/FedGP_Auto: the factor the target's per-batch updates are "
        "multiplied by before the β estimators compare them with the sources' mean step. lr_s_over_lr_t "
        "(default): a step moves the weights by about its lr, so this brings a target step to the sources' step "
        "size; lr_t_over_lr_s: the AutoFedGP DomainBed script's `grads_all_epochs * args.lr_ratio`, kept to "
        "replay it (README: a deliberate departure; FedGP_Auto's β does not depend on it, FedDA_Auto's does)")


class TargetCombineProtocol(FedAvgProtocol):
    """Sources train from θ0; the target fine-tunes from θ0; the rule combines (Alg. 3, DESIGN §8).

    At the server (default, :meth:`server_round`) or at the target: the server sends θ0 and the
    source deltas Δ_i in one ``train_combine`` task and the target returns only the combined
    model (see the module docstring). Warm-up rounds first (module docstring).
    """

    reads_each_update = ("weighs each source's own update against the target's (per-entry cosines; FedDA/FedGP's "
                         "per-source β)")

    options_key = "gp"
    Options = GPOptions
    site_tasks = {
        "train_gp": SiteTask(train_gp, changes_state=True, config=GPTask, streams="train", filtered=True),
        "train_combine": SiteTask(train_combine, changes_state=True, config=CombineTask, streams="train",
                                  filtered=True),
    }
    rule = "gp"
    auto = False
    #: warm-up rounds unless ``gp.warmup_rounds`` says: 2 plain FedAvg rounds, as AutoFedGP
    #: ``main_domain_bed*.py`` ('do fedavg for 2 epochs'); GP: 5 (:class:`GPProtocol`)
    default_warmup_rounds = 2
    #: warm-up style: ``fedavg`` (plain FedAvg rounds, AutoFedGP) or ``fedavg_base`` (FedAvg, then the
    #: projection with θ0 = that average, AuxInfo+GP code)
    warmup_style = "fedavg"

    def __init__(self, name: str, *, aux_info: bool = False):
        super().__init__(name, finetune=True, aux_info=aux_info)
        self.needs_target = True

    def validate_aggregation(self, cfg) -> None:
        """A robust ``aggregation.rule`` acts on the FedAvg warm-up rounds only: the source
        combination itself is the paper's rule (projection / convex combination), screened
        by ``defences:`` like every reply. No warm-up round: nothing for the rule to do."""
        super().validate_aggregation(cfg)
        value = self.options(cfg).warmup_rounds
        warmup = self.default_warmup_rounds if value is None else value
        if cfg.aggregation.rule != "mean" and min(warmup, cfg.rounds) == 0:
            raise UserError(f"aggregation.rule {cfg.aggregation.rule}: method {self.name} averages the sources "
                            "only in its FedAvg warm-up rounds, and gp.warmup_rounds is 0; its source combination is "
                            "the paper's rule (screened by `defences:`); use aggregation.rule: mean")

    def warmup_rounds(self, ctx: Context) -> int:
        value = self.options(ctx.cfg).warmup_rounds
        return self.default_warmup_rounds if value is None else value

    def lr_scale(self, ctx: Context, r: int) -> float:
        """1 during warm-up; then ``gp.post_warmup_lr_scale``, by default 0.1 for the auto versions
        (AutoFedGP ``main_domain_bed_auto_beta.py``: ``hparams['lr'] *= 0.1`` after the warm-up, for its
        50 rounds; the paper's App. C.4 names 0.25 for ColoredMNIST-90%, VLCS and TerraIncognita, which
        runs much shorter than 50 rounds need: BENCHMARKS.md) and 1 otherwise."""
        if r < self.warmup_rounds(ctx):
            return 1.0
        value = self.options(ctx.cfg).post_warmup_lr_scale
        return (0.1 if self.auto else 1.0) if value is None else value

    def run_round(self, ctx, r, state):
        theta0 = state["global"]
        warmup = r < self.warmup_rounds(ctx)
        if warmup and self.warmup_style == "fedavg":
            theta, metrics = self.fedavg_round(ctx, r, theta0)
            return {**state, "global": theta}, {**metrics, "warmup": True}
        scale = self.lr_scale(ctx, r)
        if self.combine_where(ctx) == "server":
            return self.server_round(ctx, r, state, warmup=warmup, scale=scale)
        if warmup:  # fedavg_base: the projection starts from the sources' average; the target after them
            replies = self.train_sources(ctx, r, theta0, scale)
            theta0 = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx))
        else:  # the target fine-tunes beside the sources and holds its model for the train_combine below
            hold = self.target_config(ctx, r, scale, hold_for_combine=True)
            replies, _ = self.train_together(ctx, r, theta0, hold, scale)
        sites = list(replies)
        payload = pack_combine(theta0, [delta(replies[s].params, theta0) for s in sites])
        tcfg = CombineTask.extend(task_config(ctx, r, "target", lr=ctx.cfg.target_train.lr * scale),
                                  combine=self.combine_spec(ctx, replies, scale))
        target = ask_one(ctx, "train_combine", ctx.target, payload, tcfg, r=r, reference=theta0)
        betas = target.metrics.get("betas") or []
        return {**state, "global": target.params}, {
            **({"warmup": True} if warmup else {}),
            "train": {s: rep.metrics for s, rep in replies.items()},
            "target": {k: v for k, v in target.metrics.items() if k not in ("betas", "combine")},
            "betas": dict(zip(sites, [float(b) for b in betas])),
            "combine": by_site(target.metrics.get("combine") or {}, sites),
        }

    def combine_where(self, ctx: Context) -> str:
        """``server`` or ``target``: ``privacy.auto_weights_at`` (auto β) or ``privacy.combine_at``."""
        privacy = ctx.cfg.privacy
        return privacy.auto_weights_at if self.auto else privacy.combine_at

    def target_config(self, ctx: Context, r: int, scale: float, **extra) -> GPTask:
        """The target's fine-tuning task (its lr scaled after the warm-up; auto: record batch updates)."""
        return GPTask.extend(task_config(ctx, r, "target", lr=ctx.cfg.target_train.lr * scale),
                             record_batch_updates=self.auto, **extra)

    def server_round(self, ctx: Context, r: int, state: dict, *, warmup: bool = False,
                     scale: float = 1.0) -> tuple[dict, dict]:
        """Sources and target train from θ0 at once; the server combines (no peer sees a source update).

        In a ``fedavg_base`` warm-up round (GP) the base is the sources' average, so the target
        trains after the sources, from that average.
        """
        theta0 = state["global"]
        if warmup:
            replies = self.train_sources(ctx, r, theta0, scale)
            theta0 = aggregate_backbone(ctx, replies, theta0, uniform=self.uniform_backbone(ctx))
            target = ask_one(ctx, "train_gp", ctx.target, theta0, self.target_config(ctx, r, scale), r=r)
        else:
            replies, target = self.train_together(ctx, r, theta0, self.target_config(ctx, r, scale), scale)
            if target is None:
                raise RoundFailed(f"round {round_number(r)}: the target {ctx.target} did not answer its fine-tuning task; "
                                  f"{missed_text(ctx, r)}")
            check_target(ctx, target, theta0, r)
        order = list(replies)
        spec = self.combine_spec(ctx, replies, scale)
        theta, betas, estimates = combine_with_estimates(
            theta0, target.params, [delta(replies[s].params, theta0) for s in order], spec,
            n_target=target.n_samples, batch_updates=target.extra.get("batch_updates"), target_steps=target.n_batches)
        return {**state, "global": theta}, {
            **({"warmup": True} if warmup else {}),
            "train": {s: rep.metrics for s, rep in replies.items()},
            "target": dict(target.metrics),
            "betas": dict(zip(order, [float(b) for b in betas])),
            "combine": by_site(estimates, order),
        }

    def train_sources(self, ctx: Context, r: int, theta0, scale: float) -> dict[str, Reply]:
        """The sources alone train from θ0 (GP's warm-up: the target waits for their average)."""
        scfg = task_config(ctx, r, "source", lr=ctx.cfg.source.lr * scale)
        return valid_replies(ctx, ask(ctx, "train", round_sources(ctx, r), theta0, scfg, r=r), theta0, r)

    def train_together(self, ctx: Context, r: int, theta0, target_config: GPTask, scale: float = 1.0
                       ) -> tuple[dict[str, Reply], Optional[Reply]]:
        """One ``train_gp`` request to the sources and the target at once (FLARE runs them in parallel).

        Returns the sources' valid replies (``min_sites`` enforced) and the target's reply, or
        ``None`` when the target did not answer.
        """
        asked = round_sources(ctx, r)  # participation: a share of the sources; the target always
        scfg = GPTask.extend(task_config(ctx, r, "source", lr=ctx.cfg.source.lr * scale))
        answered = ask(ctx, "train_gp", [*asked, ctx.target], theta0, scfg, r=r,
                       per_site={ctx.target: (theta0, target_config)}, minimum=1)
        target = answered.pop(ctx.target, None)
        need = min(len(asked), ctx.cfg.min_sites)
        if len(answered) < need:
            raise RoundFailed(f"round {round_number(r)}: only {len(answered)} of {len(asked)} sources answered "
                              f"'train_gp' (need {need}, participation.min_sites); {missed_text(ctx, r)}")
        return valid_replies(ctx, answered, theta0, r, task="train_gp"), target

    def combine_spec(self, ctx: Context, replies: dict[str, Reply], lr_scale: float = 1.0) -> CombineSpec:
        """What the target needs to know about the sources: counts only, never data."""
        cfg, options = ctx.cfg, self.options(ctx.cfg)
        return CombineSpec.build(
            rule=self.rule, auto=self.auto, beta=options.beta,
            n_sources=[int(rep.n_samples) for rep in replies.values()],
            n_batches=[int(rep.n_batches) for rep in replies.values()],
            bs_source=cfg.source.batch_size, bs_target=target_batch_size(ctx),
            lr_source=cfg.source.lr * lr_scale, lr_target=cfg.target_train.lr * lr_scale,
            epochs_source=cfg.source.epochs or 1, epochs_target=cfg.target_train.epochs or 1,
            alignment=options.auto_alignment,
        )


def by_site(estimates: dict, sites: list[str]) -> dict:
    """A combination's estimates with per-source lists keyed by site name (the round's metrics)."""
    return {key: dict(zip(sites, [float(v) for v in value])) if isinstance(value, list) else value
            for key, value in estimates.items()}


def check_target(ctx: Context, target: Reply, theta0, r: int) -> None:
    """The target's fine-tuned model must be usable: a bad count, NaN/Inf, a wrong shape or a norm
    above ``defences.norm_limit`` fails the round (:func:`~fedcxr.pipeline.protocols.base.check_one`)."""
    check_one(ctx, target, theta0, r, task="train")


class GPProtocol(TargetCombineProtocol):
    """FedAvg_Finetune(_AuxInfo)_GP: the target projects the source updates (Eq. 7, β on sources)."""

    rule = "gp"
    #: 5 rounds whose projection starts from the FedAvg of the sources (AuxInfo+GP ``federated_*_multi.py``:
    #: ``if i < 5: average_weights``)
    default_warmup_rounds = 5
    warmup_style = "fedavg_base"


class FedDAGPProtocol(TargetCombineProtocol):
    """FedGP paper: FedDA / FedGP with a fixed β or auto-weighted per-source β_i."""

    def __init__(self, name: str, *, rule: str, auto: bool):
        super().__init__(name)
        self.rule, self.auto = rule, auto

    def task_defaults(self) -> dict:
        """Target batches as AutoFedGP: 4 for the auto versions (paper App. C.4: 2, 4, 8; noniid scripts
        --target_batch_size 4), 16 for fixed β (main_domain_bed.py DataLoader(batch_size=16))."""
        return {**super().task_defaults(), "target_batch_size": 4 if self.auto else 16}

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if self.auto:
            check_auto_batches(cfg, meta[cfg.site_name(cfg.target)], self.task_defaults()["target_batch_size"])


#: The fewest target batch updates per round the authors' auto-weighted runs had (AutoFedGP paper
#: App. C.2/C.4: ColoredMNIST, 0.1 % of the target's 80 % split ≈ 18 rows in batches of 2). Fewer still
#: work (the estimators need 2) but β then rests on very few per-batch updates (BENCHMARKS.md).
AUTO_MIN_BATCHES = 9


def auto_batches(cfg, target_meta: Reply, default_batch_size: int) -> tuple[int, int, int]:
    """(labeled rows, batch size, B = target batch updates per round) this config gives the target."""
    metrics = target_meta.metrics
    available = int(metrics.get("n_labeled_train", 0))
    labeled = cfg.target_train.labeled
    if isinstance(labeled, float) and labeled <= 1:
        rows = min(available, max(1, int(round(labeled * int(metrics.get("n_train", available))))))
    elif labeled is not None:
        rows = min(available, int(labeled))
    else:
        rows = available
    if cfg.target_train.max_rows:
        rows = min(rows, int(cfg.target_train.max_rows))
    bs = int(cfg.target_train.batch_size or default_batch_size)
    if cfg.target_train.steps:
        return rows, bs, int(cfg.target_train.steps)
    full, last = divmod(rows, bs)
    per_epoch = full + (1 if last > 1 else 0)  # a last batch of one sample is skipped while BatchNorm trains
    return rows, bs, per_epoch * int(cfg.target_train.epochs)


def check_auto_batches(cfg, target_meta: Reply, default_batch_size: int) -> None:
    """At run start: an error below 2 target batch updates per round, a warning below :data:`AUTO_MIN_BATCHES`."""
    rows, bs, batches = auto_batches(cfg, target_meta, default_batch_size)
    budget = f"steps {cfg.target_train.steps}" if cfg.target_train.steps else f"{cfg.target_train.epochs} epoch(s)"
    what = (f"{cfg.method}: the target gives B = {batches} batch update(s) per round ({rows} labeled rows, batch "
            f"size {bs}, {budget})")
    if batches < 2:
        raise UserError(f"{what}; the auto-β estimators need at least 2 (a variance): lower target_train.batch_size "
                        f"to at most {max(1, rows // 2)} or raise target_train.epochs/steps")
    if batches < AUTO_MIN_BATCHES:
        fit = rows // AUTO_MIN_BATCHES
        per_epoch = max(1, batches // max(1, int(cfg.target_train.epochs or 1)))
        advice = (f"lower target_train.batch_size to at most {fit}" if fit >= 2 else
                  f"raise target_train.epochs to {math.ceil(AUTO_MIN_BATCHES / per_epoch)}")
        log.warning("%s; the authors' auto-weighted runs had at least %d (AutoFedGP: ColoredMNIST's 18 rows in "
                    "batches of 2). With few, β_i rests on few per-batch updates: %s (BENCHMARKS.md, 'FedGP_Auto "
                    "on the shortcut shift')", what, AUTO_MIN_BATCHES, advice)


#: GP (AuxInfo+GP paper) and FedDA/FedGP with fixed or auto-weighted β (FedGP paper)
METHODS = {
    "FedAvg_Finetune_GP": method(GPProtocol, aux_info=False),
    "FedAvg_Finetune_AuxInfo_GP": method(GPProtocol, aux_info=True),
    "FedDA": method(FedDAGPProtocol, rule="fedda", auto=False),
    "FedGP": method(FedDAGPProtocol, rule="fedgp", auto=False),
    "FedDA_Auto": method(FedDAGPProtocol, rule="fedda", auto=True),
    "FedGP_Auto": method(FedDAGPProtocol, rule="fedgp", auto=True),
}


#: The method ``fedcxr stats`` runs one round of to estimate the FedGP paper's σ², d², τ²d² and β_i
#: (:mod:`fedcxr.stats.pilot`): its estimators are the ones auto-weighting uses.
PILOT_METHOD = "FedGP_Auto"


def pilot_settings(data: dict) -> dict:
    """A raw config mapping set up for the pilot round: :data:`PILOT_METHOD`, no warm-up round, the
    configured learning rates (no post-warm-up scale)."""
    gp = {**(data.get(TargetCombineProtocol.options_key) or {}), "warmup_rounds": 0, "post_warmup_lr_scale": 1.0}
    return {**data, "method": PILOT_METHOD, TargetCombineProtocol.options_key: gp}

