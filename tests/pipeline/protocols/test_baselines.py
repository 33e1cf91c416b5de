"""The baselines without a shared federated model (fedcxr.pipeline.protocols.baselines): Target_Only,
Oracle, Central and Individual, one or two rounds on scripted sites."""

from __future__ import annotations

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.protocols import CENTRAL_SITE, get_protocol

from .scripted import context, reply, tensors


def plus_one(task, site, params, config):
    """Every site trains by adding 1 to what it got (``b`` adds 2, to tell the sites apart)."""
    step = 2.0 if site == "b" else 1.0
    return reply(site, {k: v + step for k, v in params.items()}, loss=step)


@pytest.mark.parametrize("method, labeled, batch", [("Target_Only", 0.25, 16), ("Oracle", None, 32)])
def test_target_only_and_oracle_train_the_target_alone(method, labeled, batch):
    ctx = context(method, plus_one, sites=["a", "b"], target="t", target_train={"labeled": 0.25})
    protocol = get_protocol(method)
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, tensors(w=[0.0])))
    (task, site, _, config), = ctx.transport.calls
    assert (task, site, config["role"]) == ("train", "t", "target")
    assert config["labeled"] == labeled, "Oracle: every labeled target row"
    assert config["batch_size"] == batch  # AutoFedGP's Target_Only batches of 16; Oracle the AuxInfo+GP 32
    assert state["global"]["w"].tolist() == [1.0] and metrics == {"target": {"loss": 1.0}}
    assert not protocol.needs_sources
    with pytest.raises(UserError, match=f"method {method} needs a `target:` site"):
        protocol.validate(context(method, plus_one, sites=["a"]).cfg, {}, ["edema"])


def test_central_trains_one_pooled_site_that_labels_every_missing_class_negative():
    ctx = context("Central", plus_one, sites=["a", "b"])
    protocol = get_protocol("Central")
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, tensors(w=[0.0])))
    (task, site, _, config), = ctx.transport.calls
    assert (task, site) == ("train", CENTRAL_SITE) and config["missing_as_negative"]
    assert state["global"]["w"].tolist() == [1.0] and metrics == {"train": {CENTRAL_SITE: {"loss": 1.0}}}
    assert protocol.pooled_site == CENTRAL_SITE
    with pytest.raises(UserError, match="trains one pooled model"):
        protocol.validate(context("Central", plus_one, sites=["a", "b", "c"], aggregation="median").cfg, {}, [])


def test_individual_sites_train_their_own_models_from_round_to_round():
    answers = {"b": True}

    def b_leaves(task, site, params, config):
        return plus_one(task, site, params, config) if answers.get(site, True) else None

    ctx = context("Individual", b_leaves, sites=["a", "b"])
    protocol = get_protocol("Individual")
    state = protocol.init_state(ctx, tensors(w=[0.0]))
    state, _ = protocol.run_round(ctx, 0, state)
    answers["b"] = False  # b does not answer round 1: it keeps its model, the round goes on with a
    state, _ = protocol.run_round(ctx, 1, state)
    assert [(site, params["w"].tolist()) for _, site, params, _ in ctx.transport.calls] == [
        ("a", [0.0]), ("b", [0.0]), ("a", [1.0]), ("b", [2.0])]
    final = protocol.final_models(ctx, state)
    assert {s: m["w"].tolist() for s, m in final["per_site"].items()} == {"a": [2.0], "b": [2.0]}
    assert final["global"]["w"].tolist() == [0.0], "no shared model is trained"
    assert protocol.default_eval_sites(ctx) == ["a", "b"]
    assert ctx.missed == [{"round": 1, "task": "train", "site": "b", "why": "no reply", "reason": "no reply"}]
