"""APFL (Deng, Kamani & Mahdavi 2020, "Adaptive Personalized Federated Learning", arXiv:2003.13461,
Algorithm 1 with the adaptive α of its §3.2).

Every site i keeps a local model v_i and a mixing weight α_i; its personalised model is the mixture
``v̄_i = α_i·v_i + (1 − α_i)·w_i`` of the local model and its copy w_i of the global model. Each local
step, on one batch, from the previous iterates:

* ``w_i ← w_i − η·∇f_i(w_i)`` — the global model's local step (sent back and averaged, FedAvg
  weighted by training rows);
* ``v_i ← v_i − η·∇_v f_i(v̄_i) = v_i − η·α_i·∇f_i(v̄_i)`` — the local model learns through the mixture;
* ``α_i ← clip(α_i − η_α·∇_α f_i(v̄_i), 0, 1)`` with ``∇_α f_i(v̄_i) = ⟨v_i − w_i, ∇f_i(v̄_i)⟩``
  (``adaptive: true``; a fixed α otherwise).

v_i and α_i stay in the site's local state (``method.apfl.``: never sent); after its round the site
keeps its mixture v̄_i under the model's own entry names, and is evaluated with it on its own test
split (:mod:`~fedcxr.pipeline.protocols.personal`). BatchNorm running statistics of v̄_i are v_i's own
(updated in the mixture's forward passes; a mixture of running statistics means nothing).

Options (``apfl:``): ``alpha`` α_i's start (0.5; the paper reports 0.25, 0.5, 0.75), ``adaptive``
(true), ``alpha_lr`` η_α (null: the sources' lr, as the paper's one η).

Against PFLlib's ``clientapfl.py``: it trains v_i on its **own** loss f_i(v_i), not on the mixture's
(the paper's ∇_v f_i(v̄_i)); its α gradient uses v's and w's own gradients ``⟨v − w, α∇f(v) +
(1−α)∇f(w)⟩`` plus a 0.02·α term; and at the end of a round it overwrites v_i with the mixture. Here
each follows the paper: the mixture's gradient, no extra term, v_i kept as v_i. The optimiser is the
house's (Adam by default; PFLlib: SGD), a fresh one per round for w_i and v_i; no AMP in this loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from pydantic import Field

from fedcxr.errors import UserError
from fedcxr.pipeline.keys import METHOD_PREFIX
from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import task_config
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.personal import PersonalProtocol, model_keys
from fedcxr.pipeline.protocols.spec import MethodOptions, SiteTask, method

#: where a site keeps its local model v_i (``method.apfl.v.<entry>``) and α_i (``method.apfl.alpha``)
STATE = METHOD_PREFIX + "apfl."


class APFLOptions(MethodOptions):
    """``apfl:`` — the mixing weight."""

    alpha: float = Field(0.5, ge=0, le=1, description="α_i at the start: the local model's share of the "
                         "personalised mixture (the paper reports 0.25, 0.5, 0.75)")
    adaptive: bool = Field(True, description="learn α_i by gradient descent on the mixture's loss (§3.2)")
    alpha_lr: Optional[float] = Field(None, gt=0, description="η_α of α_i's steps; null: source.lr")


@dataclass(frozen=True)
class APFLTask(TrainTask):
    """APFL's share of the task envelope: α's start and how it learns."""

    kind: ClassVar[str] = "train_apfl task"

    mixing: float = 0.5  # α_i at the start (``alpha`` is the aux losses' weight of every training task)
    adaptive: bool = True
    mixing_lr: float = 1e-3


def mixture(alpha: float, local: StateDict, global_: StateDict) -> StateDict:
    """``v̄ = α·v + (1 − α)·w`` on floating entries; every other entry (``num_batches_tracked``) and the
    BatchNorm running statistics are ``local``'s."""
    return {k: (alpha * v + (1 - alpha) * global_[k]).to(v.dtype)
            if v.is_floating_point() and not k.endswith(("running_mean", "running_var")) else v.clone()
            for k, v in local.items()}


def train_apfl(runner, params: StateDict, config: APFLTask) -> Reply:
    """One round of Algorithm 1 at site i: its w_i from the received model, its kept v_i and α_i."""
    from fedcxr.pipeline.state import cpu_state

    model, head_classes, aux_tasks, _ = runner.prepared_model(params, config)  # w_i ← the received w^t
    kept = runner.kept_state(STATE)
    local = {k[2:]: v for k, v in kept.items() if k.startswith("v.")} or {k: v.clone() for k, v in params.items()}
    alpha = float(kept["alpha"]) if "alpha" in kept else float(config.mixing)
    data = runner.training_data(config, head_classes, aux_tasks)
    if len(data) == 0:
        return Reply(site=runner.name, params=cpu_state(model), n_samples=0, n_batches=0, class_set=head_classes,
                     metrics={"loss": float("nan")})
    seed = runner.task_seed(config, "train", config.round, config.role)
    cfg = runner.local_config(lr=config.lr, batch_size=config.batch_size, epochs=config.epochs, steps=config.steps,
                              alpha=config.alpha, aux_reduction=config.aux_reduction,
                              use_aux=config.use_aux and bool(aux_tasks), weight_decay=config.weight_decay,
                              optimizer=config.optimizer, momentum=config.momentum)
    loader = runner.train_loader(data, batch_size=cfg.batch_size, seed=seed)
    local, alpha, steps, losses = apfl_steps(model, local, alpha, loader, cfg, device=runner.device, seed=seed,
                                             adaptive=config.adaptive, alpha_lr=config.mixing_lr)
    w = cpu_state(model)
    runner.keep_state(STATE + "v.", local)
    runner.keep_state(STATE, {"alpha": torch.tensor(alpha, dtype=torch.float64)})
    runner.keep_state("", mixture(alpha, local, w))  # the personalised model, under the model's names
    return Reply(site=runner.name, params=w, n_samples=len(data), n_batches=steps, class_set=head_classes,
                 metrics={"loss": losses[0], "personal_loss": losses[1], "alpha": alpha})


def apfl_steps(model: torch.nn.Module, local: StateDict, alpha: float, loader, cfg, *, device, seed: int,
               adaptive: bool, alpha_lr: float) -> tuple[StateDict, float, int, tuple[float, float]]:
    """The local steps of Algorithm 1 (module docstring) on ``model`` (w_i, trained in place) and
    ``local`` (v_i); returns v_i, α_i, the steps taken and the mean losses of w_i and of the mixture."""
    from torch.func import functional_call

    from fedcxr.pipeline.devices import memory_format
    from fedcxr.pipeline.local import batches
    from fedcxr.pipeline.losses import aux_ce, masked_bce
    from fedcxr.pipeline.optimizers import make_optimizer
    from fedcxr.pipeline.state import cpu_state

    model.to(device, memory_format=memory_format(cfg.channels_last)).train()
    named = list(model.named_parameters())
    v = {n: local[n].to(device, dtype=p.dtype).clone().requires_grad_(True) for n, p in named}
    buffers = {n: local[n].to(device).clone() for n, _ in model.named_buffers()}
    a = torch.tensor(float(alpha), device=device, requires_grad=adaptive)
    opt_w = make_optimizer([p for _, p in named], optimizer=cfg.optimizer, lr=cfg.lr,
                           weight_decay=cfg.weight_decay, momentum=cfg.momentum)
    opt_v = make_optimizer(list(v.values()), optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                           momentum=cfg.momentum)
    tasks = list(getattr(model, "aux_tasks", {}) or {}) if cfg.use_aux else []

    def loss_of(out, batch):
        loss = masked_bce(out["main"], batch["label"].to(device), batch["label_mask"].to(device))
        if tasks:
            loss = loss + float(cfg.alpha) * aux_ce(out["aux"], batch["aux"].to(device), batch["aux_mask"].to(device),
                                                    tasks, cfg.aux_reduction)
        return loss

    steps, sums = 0, [0.0, 0.0]
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(int(seed))
        for batch in batches(loader, cfg):
            x = batch["image"].to(device, memory_format=memory_format(cfg.channels_last))
            if x.shape[0] < 2:
                continue  # BatchNorm cannot train on one sample (as the house's loop)
            mixed = {n: a * v[n] + (1 - a) * p.detach() for n, p in named}
            personal = loss_of(functional_call(model, {**mixed, **buffers}, (x,)), batch)  # f_i(v̄_i), previous iterates
            opt_v.zero_grad(set_to_none=True)
            a.grad = None
            personal.backward()
            global_ = loss_of(model(x), batch)  # f_i(w_i)
            opt_w.zero_grad(set_to_none=True)
            global_.backward()
            opt_w.step()
            opt_v.step()
            if adaptive:
                with torch.no_grad():
                    a.sub_(float(alpha_lr) * a.grad).clamp_(0.0, 1.0)
            sums[0] += float(global_.detach())
            sums[1] += float(personal.detach())
            steps += 1
    out = {k: t.detach().to("cpu", copy=True) for k, t in {**v, **buffers}.items()}
    own = cpu_state(model)
    out = {k: out.get(k, own[k]) for k in own}
    means = (sums[0] / steps, sums[1] / steps) if steps else (float("nan"), float("nan"))
    return out, float(a.detach()), steps, means


class APFLProtocol(PersonalProtocol, FedAvgProtocol):
    """FedAvg of the sites' w_i; every site keeps v_i, α_i and is judged by its mixture v̄_i."""

    #: the server averages the sites' w_i (a weighted sum); v_i and α_i never leave the site
    reads_each_update = None
    options_key = "apfl"
    Options = APFLOptions
    source_task = "train_apfl"
    site_tasks = {"train_apfl": SiteTask(train_apfl, changes_state=True, config=APFLTask, streams="train",
                                         filtered=True)}

    def __init__(self, name: str):
        FedAvgProtocol.__init__(self, name, finetune=False, aux_info=False)

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        self.refuse_fedbn(cfg, "APFL's personalised mixture keeps every entry at the site already")
        if cfg.privacy.dp is not None:
            raise UserError(f"method {self.name} with privacy.dp: its mixture step is not a DP-SGD step; use a "
                            "method without its own loop (FedAvg) with privacy.dp")
        if cfg.optimizer_state == "kept":
            raise UserError(f"method {self.name}: its two optimisers (w_i, v_i) are fresh every round; remove "
                            "optimizer_state: kept")

    def source_config(self, ctx, r):
        options = self.options(ctx.cfg)
        lr = ctx.cfg.source.lr if options.alpha_lr is None else options.alpha_lr
        return APFLTask.extend(task_config(ctx, r, "source"), mixing=options.alpha, adaptive=options.adaptive,
                               mixing_lr=lr)

    def eval_local_keys(self, ctx):
        return model_keys(ctx)  # the personalised mixture is the site's whole model

    # run_round: FedAvgProtocol's (finetune off): the sampled sources' FedAvg round


METHODS = {"APFL": method(APFLProtocol)}
