"""FedDyn (Acar et al. 2021, "Federated Learning Based on Dynamic Regularization", ICLR, Algorithm 1):
a method of your own, in one file, outside fedcxr (README "Your own method").

Run it with ``method: examples/methods/feddyn.py:FedDyn`` in a config (the path is relative to the
config's folder) and its options under ``feddyn: {alpha: 0.01}``. It uses fedcxr's public pieces
only; nothing in fedcxr names it.

The rule, per trainable parameter (BatchNorm running statistics are averaged as in FedAvg):

* site k, round t, from the global θ^{t−1}: minimise
  ``L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)·‖θ − θ^{t−1}‖²`` (its local steps), then keep
  ``∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α·(θ_k^t − θ^{t−1})`` — at the site, never sent;
* server: ``h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})`` (m: every source, P_t: those whose
  update was kept this round), ``θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − h^t/α``.

The five parts every method module has (docs/methods.md): its options (:class:`FedDynOptions`),
its share of the task envelope (:class:`DynTask`), its site task (:func:`train_feddyn`), its
protocol (:class:`FedDynProtocol`) and its names (``METHODS``). The server's h is in the protocol
state (checkpointed every round); each site's ∇L_k is in its local state under
``method.feddyn.`` (checkpointed in-process, saved per round by a FLARE client, never sent), so a
killed run resumes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field

from fedcxr.errors import UserError
from fedcxr.pipeline.keys import METHOD_PREFIX
from fedcxr.pipeline.messages import Reply, TrainTask
from fedcxr.pipeline.protocols.fedavg import FedAvgProtocol
from fedcxr.pipeline.protocols.fedopt import parameter_keys
from fedcxr.pipeline.protocols.spec import MethodOptions, SiteTask, method

#: where a site keeps ∇L_k(θ_k^{t−1}) (a private prefix: it never leaves the site)
GRADIENT = METHOD_PREFIX + "feddyn."


class FedDynOptions(MethodOptions):
    """``feddyn:`` — the config block of this method."""

    alpha: float = Field(0.01, gt=0, description="α of the dynamic regulariser (Acar et al. 2021 search "
                         "{0.1, 0.01, 0.001}; 0.01 their most frequent choice)")


@dataclass(frozen=True)
class DynTask(TrainTask):
    """What a site needs beyond an ordinary ``train`` task: α (a field name of its own: ``TrainTask``'s
    ``alpha`` is the auxiliary losses' weight, and fedcxr refuses a field that redefines one of its)."""

    kind: ClassVar[str] = "train_feddyn task"

    dyn_alpha: float = 0.01


def train_feddyn(runner, params, config: DynTask) -> Reply:
    """The site's part: the one local-training path of fedcxr with the two FedDyn terms, then ∇L_k kept."""
    kept = runner.kept_state(GRADIENT)  # {} before this site's first round: ∇L_k(θ_k^0) = 0
    seen: dict[str, torch.Tensor] = {}

    def linear_term(named) -> torch.Tensor:  # −⟨∇L_k(θ_k^{t−1}), θ⟩
        total = torch.zeros((), device=named[0][1].device) if named else torch.zeros(())
        for name, p in named:
            if name not in seen:
                seen[name] = kept.get(name, torch.zeros_like(p)).to(device=p.device, dtype=p.dtype)
            total = total - (seen[name] * p).sum()
        return total

    # the quadratic term is the local loop's proximal term, anchored at the received θ^{t−1}
    reply = runner.train(params, config, prox_mu=config.dyn_alpha, loss_term=linear_term)
    if reply.n_samples == 0 or not seen:
        return reply  # no training rows: nothing learnt, ∇L_k unchanged
    runner.keep_state(GRADIENT, {
        name: kept.get(name, torch.zeros_like(params[name])) - config.dyn_alpha * (reply.params[name] - params[name])
        for name in seen})
    return reply


class FedDynProtocol(FedAvgProtocol):
    """The server's part: sources train with ``train_feddyn``; the server corrects their mean by h."""

    options_key = "feddyn"
    Options = FedDynOptions
    source_task = "train_feddyn"
    site_tasks = {"train_feddyn": SiteTask(train_feddyn, changes_state=True, config=DynTask, streams="train",
                                           filtered=True)}
    default_backbone_weighting = "uniform"  # Algorithm 1 averages the active devices' models 1/|P_t|
    #: FedAvgProtocol's server only sums (None); this one also reads the mean, so privacy.secure_aggregation
    #: (which hides every model from the server) cannot run it
    reads_each_update = "corrects the sites' mean by its state h, computed from that mean in the clear"

    def __init__(self, name: str):
        super().__init__(name, finetune=False, aux_info=False)

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if cfg.privacy.dp is not None:
            raise UserError(f"method {self.name} with privacy.dp: DP-SGD drops the gradient of FedDyn's terms")
        if cfg.backbone_aggregation != "fedavg":
            raise UserError(f"method {self.name}: its server step covers every shared parameter; use "
                            "backbone_aggregation: fedavg")

    def source_config(self, ctx, r):
        return DynTask.extend(super().source_config(ctx, r), dyn_alpha=self.options(ctx.cfg).alpha)

    def init_state(self, ctx, theta):
        state = super().init_state(ctx, theta)
        state["feddyn_h"] = {k: torch.zeros_like(theta[k]) for k in parameter_keys(ctx)}
        return state

    def run_round(self, ctx, r, state):
        theta0, h = state["global"], state["feddyn_h"]
        average, metrics = self.fedavg_round(ctx, r, theta0)
        alpha, share = self.options(ctx.cfg).alpha, len(metrics["n_samples"]) / len(ctx.sources)
        h = {k: v - alpha * share * (average[k] - theta0[k]) for k, v in h.items()}
        theta = {**average, **{k: average[k] - v / alpha for k, v in h.items()}}
        return {**state, "global": theta, "feddyn_h": h}, metrics


METHODS = {"FedDyn": method(FedDynProtocol)}
