"""Baselines without federation of a shared model: Target_Only, Oracle, Central, Individual.

* ``Target_Only`` — the target trains alone on its labeled rows; ``Oracle`` on all of them.
* ``Central`` — every site's training rows pooled in one place (the ``__central__`` site).
* ``Individual`` — each site trains alone on its own classes, evaluated on its own test set.
"""

from __future__ import annotations

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols.base import CENTRAL_SITE, RoundProtocol, ask, ask_one, round_sources, task_config
from fedcxr.pipeline.protocols.spec import method


class TargetOnlyProtocol(RoundProtocol):
    """Target_Only (its labeled rows) / Oracle (every labeled target row): no federation."""

    needs_target = True
    needs_target_labels = True
    needs_sources = False
    averages_sites = "trains the target alone (no server-side average of site models)"
    reads_each_update = "trains the target alone: its model is the only one the server holds, nothing is summed"
    samples_sources = "trains the target alone (no source to sample)"

    def __init__(self, name: str, *, oracle: bool):
        super().__init__(name)
        self.oracle = oracle
        self.full_target_labels = oracle  # Oracle: every labeled target row, a budget of its own

    def validate(self, cfg, meta, classes):
        if not cfg.target:
            raise UserError(f"method {self.name} needs a `target:` site")
        super().validate(cfg, meta, classes)

    def task_defaults(self) -> dict:
        """Target_Only: batches of 16 (AutoFedGP main_domain_bed.py with --proj_w 0); Oracle: the default."""
        return {**super().task_defaults(), **({} if self.oracle else {"target_batch_size": 16})}

    def run_round(self, ctx, r, state):
        cfg = task_config(ctx, r, "target", labeled=None if self.oracle else ctx.cfg.target_train.labeled)
        reply = ask_one(ctx, "train", ctx.target, state["global"], cfg, r=r)
        return {**state, "global": reply.params}, {"target": reply.metrics}


class CentralProtocol(RoundProtocol):
    """Central: every site's training rows pooled in one place (the ``__central__`` site)."""

    averages_sites = "trains one pooled model (no server-side average of site models)"
    reads_each_update = "pools every site's images in one place"
    pooled_site = CENTRAL_SITE
    samples_sources = "trains one pooled site (no source to sample)"

    def __init__(self, name: str):
        super().__init__(name)

    def validate(self, cfg, meta, classes):
        self.validate_aggregation(cfg)
        self.validate_secure_aggregation(cfg)
        self.validate_participation(cfg)

    def run_round(self, ctx, r, state):
        cfg = task_config(ctx, r, "source", use_aux=bool(ctx.aux_tasks), missing_as_negative=True)
        reply = ask_one(ctx, "train", CENTRAL_SITE, state["global"], cfg, r=r)
        return {**state, "global": reply.params}, {"train": {CENTRAL_SITE: reply.metrics}}



class IndividualProtocol(RoundProtocol):
    """Individual: each site trains alone on its own classes; evaluated on its own test set."""

    averages_sites = "trains each site alone (no server-side average of site models)"
    reads_each_update = "keeps each site's own model at the server, nothing is summed"

    def __init__(self, name: str):
        super().__init__(name)

    def validate(self, cfg, meta, classes):
        self.validate_aggregation(cfg)
        self.validate_secure_aggregation(cfg)

    def init_state(self, ctx, theta):
        return {"global": theta, "per_site": {s: dict(theta) for s in ctx.sources}}

    def run_round(self, ctx, r, state):
        asked = round_sources(ctx, r)  # participation: the sites not asked keep their model
        per_site = {s: (state["per_site"][s], task_config(ctx, r, "source")) for s in asked}
        replies = ask(ctx, "train", asked, None, None, r=r, per_site=per_site, minimum=1)
        new = dict(state["per_site"])
        for s, rep in replies.items():
            new[s] = rep.params
        return {**state, "per_site": new}, {"train": {s: rep.metrics for s, rep in replies.items()}}

    def final_models(self, ctx, state):
        return {"global": state["global"], "per_site": state["per_site"]}

    def default_eval_sites(self, ctx):
        return list(ctx.sources)  # each site's own model on its own test set


#: The papers' baselines without a federated shared model
METHODS = {
    "Oracle": method(TargetOnlyProtocol, oracle=True),
    "Target_Only": method(TargetOnlyProtocol, oracle=False),
    "Individual": method(IndividualProtocol),
    "Central": method(CentralProtocol),
}
