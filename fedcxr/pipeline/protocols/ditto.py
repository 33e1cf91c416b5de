"""Ditto (Li et al. 2021, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML,
Algorithm 1).

Every round each site k receives the global model w^t and

1. updates its **personal** model v_k (kept at the site, every entry) for its local budget on
   ``F_k(v) + (λ/2)·‖v − w^t‖²`` — the proximal term pulls v toward the round's global model
   (gradient λ(v − w^t), the paper's line "v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t))"); v_k starts
   as the initial global model;
2. updates its copy of the **global** model from w^t by plain local training (the global
   objective's local solver: FedAvg's), and sends it back;

the server averages the global models (FedAvg, weighted by training rows). The personal models
never leave the site during training; each site is evaluated with its own v_k on its own test
split (:mod:`~fedcxr.pipeline.protocols.personal`: every entry is an ``eval_local_keys`` entry).

Options (``ditto:``): ``lam`` λ (0.1 by default, inside the paper's grid {0.05, 0.1, 0.2, 0.5,
1, 2}; tune it), ``personal_epochs``/``personal_steps`` (the personal model's budget per round;
null: the same as the global model's, as PFLlib's ``plocal_epochs = local_epochs = 1``).

Against PFLlib's ``clientditto.py`` / ``serverditto.py``: the same order (``ptrain`` before
``train``) and the same anchor (the received global model: PFLlib's perturbed SGD step adds
μ(v − w) with ``self.model`` not yet trained this round). Departures: the proximal term is added
to the loss and the house's optimiser takes the step (Adam by default, ``source.optimizer: sgd``
for PFLlib's plain SGD, where the two are the same step); BatchNorm running statistics are the
personal model's own (buffers have no proximal term, in PFLlib too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from pydantic import Field

from fedcxr.errors import UserError
from fedcxr.pipeline.messages import Reply, StateDict, TrainTask
from fedcxr.pipeline.protocols.base import task_config
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.personal import PersonalProtocol, model_keys
from fedcxr.pipeline.protocols.spec import MAX_EPOCHS, MAX_STEPS, MethodOptions, SiteTask, method


class DittoOptions(MethodOptions):
    """``ditto:`` — λ and the personal model's budget."""

    lam: float = Field(0.1, ge=0, description="λ of the proximal term (λ/2)·‖v − w^t‖² pulling the personal model "
                       "toward the global one (Li et al. 2021 tune it over {0.05, 0.1, 0.2, 0.5, 1, 2}; 0: each "
                       "site alone)")
    personal_epochs: Optional[int] = Field(None, ge=0, le=MAX_EPOCHS, description="the personal model's local "
                                           "epochs per round; null: source.epochs")
    personal_steps: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="its optimiser steps per round "
                                          "(overrides the epochs); null: source.steps")


@dataclass(frozen=True)
class DittoTask(TrainTask):
    """Ditto's share of the task envelope: λ and the personal model's budget."""

    kind: ClassVar[str] = "train_ditto task"

    lam: float = 0.1
    personal_epochs: int = 1
    personal_steps: Optional[int] = None


def train_ditto(runner, params: StateDict, config: DittoTask) -> Reply:
    """The personal model v_k (the site's kept entries, or w^t the first time) trained toward w^t, kept;
    then the global model trained from w^t and sent back (Algorithm 1, lines 5-8)."""
    own = {k: runner.local_state[k] for k in params if k in runner.local_state}
    personal = runner.train({**params, **own},
                            config.replace(epochs=config.personal_epochs, steps=config.personal_steps),
                            prox_mu=config.lam, prox_anchor=params, seed_parts=("personal",))
    if personal.n_samples:
        runner.keep_state("", personal.params)  # under the model's own names: what evaluation loads
    reply = runner.train(params, config)
    reply.metrics = {**reply.metrics, "personal_loss": personal.metrics.get("loss")}
    return reply


class DittoProtocol(PersonalProtocol, FedAvgProtocol):
    """FedAvg of the sites' global models; every site keeps and is judged by its personal model."""

    #: the server averages the sites' global models (a weighted sum); each personal model never leaves its site
    reads_each_update = None
    options_key = "ditto"
    Options = DittoOptions
    source_task = "train_ditto"
    site_tasks = {"train_ditto": SiteTask(train_ditto, changes_state=True, config=DittoTask, streams="train",
                                          filtered=True)}

    def __init__(self, name: str):
        FedAvgProtocol.__init__(self, name, finetune=False, aux_info=False)

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        self.refuse_fedbn(cfg, "Ditto's personal model keeps every entry at the site already")
        if cfg.privacy.dp is not None:
            raise UserError(f"method {self.name} with privacy.dp: DP-SGD drops the gradient of the personal model's "
                            "proximal term (not a per-sample term)")

    def source_config(self, ctx, r):
        options, source = self.options(ctx.cfg), ctx.cfg.source
        if options.personal_epochs is None and options.personal_steps is None:  # the global model's budget
            epochs, steps = source.epochs, source.steps
        else:
            epochs = 1 if options.personal_epochs is None else options.personal_epochs
            steps = options.personal_steps
        return DittoTask.extend(task_config(ctx, r, "source"), lam=options.lam, personal_epochs=epochs,
                                personal_steps=steps)

    def eval_local_keys(self, ctx):
        return model_keys(ctx)  # the whole model is personal

    # run_round: FedAvgProtocol's (finetune off): the sampled sources' FedAvg round


METHODS = {"Ditto": method(DittoProtocol)}
