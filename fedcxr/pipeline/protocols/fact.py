"""FACT: federated adversarial cross-training for an unlabeled target (DESIGN §5).

Each round two sources start from the global model (feature extractor G, head F) and train on
their own data. The server averages their feature extractors into G'. Under ``FACT`` each
source then fine-tunes its own head on the frozen G' (``FACT_NF`` skips this step, saving the
extra transfer of G'). The target updates G' only, minimising the inter-domain distance (IDD:
mean |p_a − p_b| of the two heads' sigmoid probabilities on its unlabeled images). Then
G ← the target's G and F ← the mean of the two heads. No target label is ever used: the model
kept at the end is the one with the lowest IDD measured at the target.

With more than two sources the pair rotates over all pairs, round by round. Learning rates
follow the paper's schedule η = η0 · (1 + 10·p)^(−0.75), p = round / rounds.
"""

from __future__ import annotations

import itertools

from fedcxr.errors import UserError
from fedcxr.pipeline import aggregate as agg
from fedcxr.pipeline.messages import FACT_HEAD_A, FACT_HEAD_B, StateDict
from fedcxr.pipeline.protocols.base import Context, RoundProtocol, ask, ask_one, task_config


def lr_schedule(lr0: float, r: int, rounds: int) -> float:
    """Ganin & Lempitsky's annealing, as the FACT paper uses it."""
    p = r / max(rounds, 1)
    return lr0 * (1.0 + 10.0 * p) ** -0.75


def _split_head(state: StateDict) -> tuple[StateDict, StateDict]:
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    body = {k: v for k, v in state.items() if not k.startswith("head.")}
    return body, head


class FACTProtocol(RoundProtocol):
    """``FACT`` (with the head fine-tuning step) and ``FACT_NF`` (without)."""

    needs_target = True

    def __init__(self, name: str, *, finetune: bool):
        super().__init__(name)
        self.finetune = finetune

    def validate(self, cfg, meta, classes):
        super().validate(cfg, meta, classes)
        if len(cfg.source_sites()) < 2:
            raise UserError(f"strategy {self.name} needs at least two source sites (it trains them in pairs)")

    def init_state(self, ctx, theta):
        return {"global": theta, "best": theta, "best_idd": float("inf"), "best_round": -1}

    def pair(self, ctx: Context, r: int) -> list[str]:
        pairs = list(itertools.combinations(ctx.sources, 2))
        return list(pairs[r % len(pairs)])

    def run_round(self, ctx: Context, r: int, state: dict) -> tuple[dict, dict]:
        theta0, rounds = state["global"], ctx.cfg.rounds
        lr_s = lr_schedule(ctx.cfg.source.lr, r, rounds)
        lr_t = lr_schedule(ctx.cfg.target_train.lr, r, rounds)
        pair = self.pair(ctx, r)
        replies = ask(ctx, "train", pair, theta0, task_config(ctx, r, "source", lr=lr_s), r=r, minimum=2)
        bodies = [_split_head(replies[s].params)[0] for s in pair]
        g_prime = agg.fedavg(bodies, [1.0, 1.0])
        heads = {s: _split_head(replies[s].params)[1] for s in pair}
        if self.finetune:
            cfg = task_config(ctx, r, "source", lr=lr_s, trainable="head")
            per_site = {s: ({**g_prime, **heads[s]}, cfg) for s in pair}
            tuned = ask(ctx, "train", pair, None, cfg, r=r, per_site=per_site, minimum=2)
            heads = {s: _split_head(tuned[s].params)[1] for s in pair}
        payload = dict(g_prime)
        payload.update({FACT_HEAD_A + k[len("head."):]: v for k, v in heads[pair[0]].items()})
        payload.update({FACT_HEAD_B + k[len("head."):]: v for k, v in heads[pair[1]].items()})
        tcfg = task_config(ctx, r, "target", lr=lr_t, labeled=None)
        target = ask_one(ctx, "fact_target", ctx.target, payload, tcfg, r=r, reference=g_prime)
        head = agg.fedavg([heads[pair[0]], heads[pair[1]]], [1.0, 1.0])
        theta = {**target.params, **head}
        idd_value = float(target.metrics["idd_after"])
        new = {**state, "global": theta}
        if idd_value < state["best_idd"]:
            new.update(best=theta, best_idd=idd_value, best_round=r)
        return new, {"pair": pair, "target": target.metrics, "best_round": new["best_round"],
                     "train": {s: replies[s].metrics for s in pair}}

    def final_models(self, ctx, state):
        return {"global": state["best"], "per_site": {}}
