"""The baselines reviewers ask for: FedProx, SCAFFOLD and FedOpt (FedAdagrad, FedAdam, FedYogi).

* ``FedProx`` — FedAvg whose sources add the proximal term μ/2·‖w − w^t‖² to their loss (Li et
  al. 2020, MLSys, Eq. 2; ``fedprox: {mu}``); the server averages as FedAvg.
* ``SCAFFOLD`` — control variates (Karimireddy et al. 2020, ICML, Algorithm 1, option II): the
  server sends the model x and its control variate c; each source takes plain-SGD steps corrected
  by c − c_i, updates its own c_i (kept at the site, across rounds and through a resume) and
  returns its model and Δc_i; the server moves x by η_g (``scaffold: {server_lr}``) toward the clients' mean
  and c by the mean Δc_i (:func:`fedcxr.pipeline.aggregate.scaffold`).
* ``FedAdagrad``, ``FedAdam``, ``FedYogi`` — FedOpt (Reddi et al. 2021, ICLR, Algorithm 2): the
  clients' mean update is a pseudo-gradient for a server optimiser whose moments m, v live in
  the protocol state (:func:`fedcxr.pipeline.aggregate.fedopt`; ``fedopt: {server_lr, betas,
  tau}``).

Each has a ``_Finetune`` variant: after the round's server step the target fine-tunes the global
model on its labeled rows exactly as ``FedAvg_Finetune`` does (AuxInfo+GP paper, Alg. 1), so every
``*_Finetune`` method spends the same target budget (``target_train``: rows, steps or epochs,
optimiser, lr) in every round and only the sources' rule differs — what a comparison against a
target with few labels needs. The fine-tuned model is the next round's global model.

The server state (SCAFFOLD's c, FedOpt's m and v) is in the protocol state and so in every
checkpoint; a site's c_i is in its local state (checkpointed in-process, saved per round by a FLARE
client), so a killed run resumes bit-identical. Both cover the model's trainable parameters; BN
running statistics and ``num_batches_tracked`` are averaged as in FedAvg. FedProx's term, too,
covers the trainable parameters only.

A sampled round (``participation:``; README "Running a consortium"): SCAFFOLD's c moves by
(|S|/N) × the mean Δc_i of the |S| valid replies, N all sources (Algorithm 1, line 17), and the
sites not asked keep their c_i; FedOpt's optimiser steps on the mean of the replies that came
(Algorithm 2 samples S too), its m and v carrying over.

Refused, with the reason (exit 2): FedProx with DP-SGD (Opacus drops the term's gradient);
SCAFFOLD with an adaptive or momentum optimiser at the sources (option II's c_i assumes plain
SGD steps) or with FLARE result filters (Δc_i would carry the unfiltered update past them); FedBN
variants with SCAFFOLD or FedOpt (their server step covers every shared entry).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from pydantic import Field, field_validator

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.keys import CONTROL_PREFIX
from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import (
    Context,
    RoundFailed,
    aggregate_backbone,
    ask,
    round_sources,
    valid_replies,
)
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.spec import METHOD_DEFAULT, MethodOptions, SiteTask, method
from fedcxr.pipeline.run_log import round_number
from fedcxr.pipeline.state import check_update

log = logging.getLogger(__name__)

#: FedProx's μ unless ``fedprox.mu`` says: NVFLARE's PTFedProxLoss default, in Li et al.'s grid {0.001, 0.01, 0.1, 1}.
DEFAULT_FEDPROX_MU = 0.01
#: SCAFFOLD's global step size η_g unless ``scaffold.server_lr`` says (Karimireddy et al. 2020 run η_g = 1).
DEFAULT_SCAFFOLD_SERVER_LR = 1.0
#: FedOpt defaults per rule, (η, (β1, β2), τ): Reddi et al. 2021's CIFAR-10 values as Flower's baseline
#: reproducing the paper sets them (adaptive_federated_optimization/conf/cifar10/strategy/*.yaml);
#: FedAdagrad has β1 = 0 there (Flower's FedAdagrad) and no β2 in its v.
FEDOPT_DEFAULTS = {
    "adam": (1e-2, (0.9, 0.99), 1e-3),
    "yogi": (1e-2, (0.9, 0.99), 1e-3),
    "adagrad": (1e-1, (0.0, 0.99), 1e-2),
}


class FedProxOptions(MethodOptions):
    """``fedprox:`` — FedProx(_Finetune)."""

    mu: Optional[float] = Field(None, ge=0, description="μ of the proximal term μ/2·‖w − w^t‖² in every source's "
                                "loss (Li et al. 2020, Eq. 2; μ = 0 is FedAvg); " + METHOD_DEFAULT)


class ScaffoldOptions(MethodOptions):
    """``scaffold:`` — SCAFFOLD(_Finetune)."""

    server_lr: Optional[float] = Field(None, gt=0, description="the global step size η_g; " + METHOD_DEFAULT)


class FedOptOptions(MethodOptions):
    """``fedopt:`` — FedAdagrad, FedAdam, FedYogi (_Finetune): the server optimiser."""

    server_lr: Optional[float] = Field(None, gt=0, description="η of the server optimiser; " + METHOD_DEFAULT)
    betas: Optional[tuple[float, float]] = Field(None, description="decay rates (β1, β2), each in [0, 1); "
                                                 + METHOD_DEFAULT)
    tau: Optional[float] = Field(None, gt=0, description="adaptivity τ (√v_t + τ in the step; v starts at τ²); "
                                 + METHOD_DEFAULT)

    @field_validator("betas")
    @classmethod
    def _decay_rates(cls, value: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
        if value is not None and not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each of β1, β2 must lie in [0, 1), got {list(value)}")
        return value


# --------------------------------------------------------------------------- the sites' side


@dataclass(frozen=True)
class ProxTask(TrainTask):
    """FedProx's share of the task envelope: the ``train`` settings plus μ."""

    kind: ClassVar[str] = "train_prox task"

    prox_mu: float = 0.0  # μ of the proximal term μ/2·‖w − w^t‖² (w^t: the received weights)


def train_prox(runner, params: StateDict, config: ProxTask) -> Reply:
    """FedProx's local training: the site's one training path with the proximal term (Li et al. 2020, Eq. 2)."""
    return runner.train(params, config, prox_mu=config.prox_mu)


#: ``train_scaffold`` payload: the server's control variate c under ``scaffold_c.<key>`` beside the model.
SERVER_CONTROL_PREFIX = "scaffold_c."
#: ``train_scaffold`` reply: the site's control-variate update Δc_i under ``scaffold_dc.<key>`` (extra tensors).
CONTROL_DELTA_PREFIX = "scaffold_dc."


def pack_control(theta: StateDict, control: StateDict) -> StateDict:
    """The model plus SCAFFOLD's c under ``scaffold_c.`` (the ``train_scaffold`` payload)."""
    payload = dict(theta)
    payload.update({SERVER_CONTROL_PREFIX + k: v for k, v in control.items()})
    return payload


def unpack_control(payload: StateDict) -> tuple[StateDict, StateDict]:
    """Inverse of :func:`pack_control`: ``(model, c)``."""
    n = len(SERVER_CONTROL_PREFIX)
    theta = {k: v for k, v in payload.items() if not k.startswith(SERVER_CONTROL_PREFIX)}
    control = {k[n:]: v for k, v in payload.items() if k.startswith(SERVER_CONTROL_PREFIX)}
    return theta, control


def pack_control_delta(delta: StateDict) -> dict[str, torch.Tensor]:
    """Δc_i as reply extra tensors under ``scaffold_dc.``."""
    return {CONTROL_DELTA_PREFIX + k: v for k, v in delta.items()}


def unpack_control_delta(extra: dict[str, torch.Tensor]) -> StateDict:
    """Inverse of :func:`pack_control_delta` (other extra tensors are left out)."""
    n = len(CONTROL_DELTA_PREFIX)
    return {k[n:]: v for k, v in extra.items() if k.startswith(CONTROL_DELTA_PREFIX)}


def train_scaffold(runner, params: StateDict, config: TrainTask) -> Reply:
    """SCAFFOLD's client round (Karimireddy et al. 2020, Algorithm 1, lines 7-13).

    ``params`` = the model x plus the server's control variate c (:func:`pack_control`). The site
    trains from x with every plain-SGD step corrected by ``c − c_i`` (the runner's ``train``
    ``drift_correction``), then sets ``c_i⁺ = c_i − c + (x − y_i)/(K·η_l)`` (option II,
    :func:`fedcxr.pipeline.aggregate.scaffold_client_control`), keeps c_i⁺ in its local state (c_i = 0
    before its first round; :data:`~fedcxr.pipeline.keys.CONTROL_PREFIX`, never sent) and answers with
    y_i and Δc_i = c_i⁺ − c_i. A site without training rows answers as ``train`` does and keeps its c_i.
    """
    theta, control = unpack_control(params)
    if not control:
        raise ValueError(f"site {runner.name}: a train_scaffold task without the server's control variate")
    kept = runner.kept_state(CONTROL_PREFIX)
    local = {k: kept.get(k, torch.zeros_like(v)) for k, v in control.items()}
    correction = {k: control[k].to(local[k].dtype) - local[k] for k in control}
    reply = runner.train(theta, config, drift_correction=correction)  # the one training path of the site
    if reply.params is None or reply.n_samples == 0:
        return reply
    new_local, delta = agg.scaffold_client_control(local, control, theta, reply.params,
                                                   steps=int(reply.metrics.get("scaffold_steps", 0)),
                                                   lr=config.lr)
    runner.keep_state(CONTROL_PREFIX, new_local)
    reply.extra = {**reply.extra, **pack_control_delta(delta)}
    return reply


# --------------------------------------------------------------------------- the server's side


def parameter_keys(ctx: Context) -> list[str]:
    """The model's trainable parameters (no buffers): what SCAFFOLD's c and FedOpt's m, v cover.

    Built from the run's network description (the same call as the initial model), under a
    forked RNG so the run's random stream is not touched.
    """
    from fedcxr.models.network import network_from_config
    from fedcxr.vocab import AUX_VOCAB

    with torch.random.fork_rng(devices=[]):
        model = network_from_config(ctx.classes, ctx.cfg.model.model_dump(),
                                    {t: len(AUX_VOCAB[t]) for t in ctx.aux_tasks}, load_weights_file=False)
    return [name for name, _ in model.named_parameters()]


def _refuse_fedbn(name: str, cfg) -> None:
    if cfg.backbone_aggregation != "fedavg":
        raise UserError(f"method {name}: backbone_aggregation {cfg.backbone_aggregation} keeps BatchNorm entries "
                        f"at the sites, but {name}'s server step covers every shared parameter; use "
                        "backbone_aggregation: fedavg")


class FedProxProtocol(FedAvgProtocol):
    """FedProx(_Finetune): FedAvg with the proximal term μ/2·‖w − w^t‖² in every source's loss."""

    options_key = "fedprox"
    Options = FedProxOptions
    source_task = "train_prox"
    site_tasks = {"train_prox": SiteTask(train_prox, changes_state=True, config=ProxTask, streams="train",
                                         filtered=True)}

    def __init__(self, name: str, *, finetune: bool):
        super().__init__(name, finetune=finetune, aux_info=False)
        self.needs_target = finetune

    def mu(self, ctx: Context) -> float:
        value = self.options(ctx.cfg).mu
        return DEFAULT_FEDPROX_MU if value is None else float(value)

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if cfg.privacy.dp is not None:
            raise UserError(f"method {self.name} with privacy.dp: DP-SGD (Opacus) replaces each gradient by its "
                            "clipped, noised per-sample sum, which drops the proximal term's gradient (not a "
                            "per-sample term), so the sites would train plain FedAvg; use FedAvg with privacy.dp")

    def source_config(self, ctx, r):
        return ProxTask.extend(super().source_config(ctx, r), prox_mu=self.mu(ctx))


class SCAFFOLDProtocol(FedAvgProtocol):
    """SCAFFOLD(_Finetune): control variates c (server) and c_i (each source), Algorithm 1, option II."""

    reads_each_update = "also sums each site's control-variate update Δc_i, which travels beside its model, not sealed"

    options_key = "scaffold"
    Options = ScaffoldOptions
    #: not ``filtered``: SCAFFOLD refuses privacy.filters (Δc_i would carry the unfiltered update past them)
    site_tasks = {"train_scaffold": SiteTask(train_scaffold, changes_state=True, config=TrainTask, streams="train")}

    def __init__(self, name: str, *, finetune: bool):
        super().__init__(name, finetune=finetune, aux_info=False)
        self.needs_target = finetune

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        _refuse_fedbn(self.name, cfg)
        if cfg.source.optimizer not in (None, "sgd") or (cfg.source.momentum or 0) != 0:
            raise UserError(
                f"method {self.name}: the sources train with plain SGD (Karimireddy et al. 2020, Algorithm 1): "
                "the control variate c_i⁺ = c_i − c + (x − y_i)/(K·η_l) is the mean gradient only for plain SGD "
                f"steps, not for source.optimizer {cfg.source.optimizer or 'sgd'} with momentum "
                f"{cfg.source.momentum or 0}; remove source.optimizer/source.momentum (or set sgd and 0)")
        if cfg.source.lr < 1e-2:  # a warning, not a refusal: the run is valid, only slow to learn
            log.warning("%s: the sources take plain SGD steps at source.lr = %g, an Adam-sized step; plain SGD "
                        "usually needs 0.01-0.1 (Reddi et al. 2021's best client lr on CIFAR-10: 10^-1.5)",
                        self.name, cfg.source.lr)
        if cfg.privacy.filters:
            raise UserError(f"method {self.name} with privacy.filters: each site's Δc_i carries (x − y_i)/(K·η_l), "
                            "its unfiltered model update, past FLARE's result filters; use another method with "
                            "filters")

    def server_lr(self, ctx: Context) -> float:
        value = self.options(ctx.cfg).server_lr
        return DEFAULT_SCAFFOLD_SERVER_LR if value is None else float(value)

    def init_state(self, ctx, theta):
        state = super().init_state(ctx, theta)
        state["control"] = {k: torch.zeros_like(theta[k]) for k in parameter_keys(ctx)}
        return state

    def source_config(self, ctx, r):
        return super().source_config(ctx, r).replace(optimizer="sgd", momentum=0.0)

    def run_round(self, ctx, r, state):
        theta0, control = state["global"], state["control"]
        replies = ask(ctx, "train_scaffold", round_sources(ctx, r), pack_control(theta0, control),
                      self.source_config(ctx, r), r=r)
        replies = _with_control_updates(ctx, valid_replies(ctx, replies, theta0, r, task="train_scaffold"), control, r)
        uniform = self.uniform_backbone(ctx)
        average = aggregate_backbone(ctx, replies, theta0, uniform=uniform)
        weights = [1.0 if uniform else float(max(rep.n_samples, 1)) for rep in replies.values()]
        theta, control = agg.scaffold(theta0, control, average,
                                      [unpack_control_delta(rep.extra) for rep in replies.values()], weights,
                                      server_lr=self.server_lr(ctx), participation=len(replies) / len(ctx.sources))
        metrics = {"train": {s: rep.metrics for s, rep in replies.items()},
                   "n_samples": {s: rep.n_samples for s, rep in replies.items()}}
        if self.finetune:
            theta, more = self.finetune_target(ctx, r, theta)
            metrics.update(more)
        return {**state, "global": theta, "control": control}, metrics


def _with_control_updates(ctx: Context, replies: dict[str, Reply], control: StateDict, r: int) -> dict[str, Reply]:
    """Drop replies whose Δc_i is missing, mis-shaped or not finite (reason recorded), as for model updates."""
    kept = {}
    for site, reply in replies.items():
        reason = check_update(unpack_control_delta(reply.extra), control)
        if reason:
            log.warning("round %d: rejected the control-variate update of %s: %s", round_number(r), site, reason)
            ctx.missed.append({"round": r, "task": "train_scaffold", "site": site, "why": "refused",
                               "reason": f"rejected control update: {reason}"})
            continue
        kept[site] = reply
    if not kept or len(kept) < min(len(replies), ctx.cfg.min_sites):
        raise RoundFailed(f"round {round_number(r)}: only {len(kept)} valid control-variate updates (need {ctx.cfg.min_sites})")
    return kept


class FedOptProtocol(FedAvgProtocol):
    """FedAdagrad / FedAdam / FedYogi (_Finetune): a server optimiser on the sources' mean update."""

    reads_each_update = "feeds the averaged update to a server optimiser that squares it coordinate by coordinate"

    options_key = "fedopt"
    Options = FedOptOptions

    def __init__(self, name: str, *, rule: str, finetune: bool):
        super().__init__(name, finetune=finetune, aux_info=False)
        self.rule = rule
        self.needs_target = finetune

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        _refuse_fedbn(self.name, cfg)

    def hyper(self, ctx: Context) -> dict:
        """η, (β1, β2), τ: the config's values, else the rule's defaults (:data:`FEDOPT_DEFAULTS`)."""
        lr, betas, tau = FEDOPT_DEFAULTS[self.rule]
        options = self.options(ctx.cfg)
        return {"server_lr": lr if options.server_lr is None else float(options.server_lr),
                "betas": betas if options.betas is None else tuple(float(b) for b in options.betas),
                "tau": tau if options.tau is None else float(options.tau)}

    def init_state(self, ctx, theta):
        state = super().init_state(ctx, theta)
        tau = self.hyper(ctx)["tau"]
        keys = parameter_keys(ctx)  # m_{−1} = 0, v_{−1} = τ² (Algorithm 2)
        state["server_opt"] = {"m": {k: torch.zeros_like(theta[k]) for k in keys},
                               "v": {k: torch.full_like(theta[k], tau * tau) for k in keys}}
        return state

    def run_round(self, ctx, r, state):
        theta0, moments = state["global"], state["server_opt"]
        average, metrics = self.fedavg_round(ctx, r, theta0)
        theta, moments = agg.fedopt(theta0, average, moments, rule=self.rule, keys=list(moments["m"]),
                                    **self.hyper(ctx))
        if self.finetune:
            theta, more = self.finetune_target(ctx, r, theta)
            metrics.update(more)
        return {**state, "global": theta, "server_opt": moments}, metrics


#: The reviewers' baselines; ``_Finetune``: the target fine-tunes as FedAvg_Finetune
METHODS = {
    "FedProx": method(FedProxProtocol, finetune=False),
    "FedProx_Finetune": method(FedProxProtocol, finetune=True),
    "SCAFFOLD": method(SCAFFOLDProtocol, finetune=False),
    "SCAFFOLD_Finetune": method(SCAFFOLDProtocol, finetune=True),
    "FedAdagrad": method(FedOptProtocol, rule="adagrad", finetune=False),
    "FedAdagrad_Finetune": method(FedOptProtocol, rule="adagrad", finetune=True),
    "FedAdam": method(FedOptProtocol, rule="adam", finetune=False),
    "FedAdam_Finetune": method(FedOptProtocol, rule="adam", finetune=True),
    "FedYogi": method(FedOptProtocol, rule="yogi", finetune=False),
    "FedYogi_Finetune": method(FedOptProtocol, rule="yogi", finetune=True),
}
