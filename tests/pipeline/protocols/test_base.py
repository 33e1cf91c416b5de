"""The protocol framework (fedcxr.pipeline.protocols.base): task configs, asking sites, the backbone
average and the checks every method's ``validate`` starts from, on scripted sites.

The reply checks themselves (counts, norms, NaN/Inf, the suspect stop) are proved against hostile
sites in ``tests/hostile/test_hostile_sites.py``."""

from __future__ import annotations

import logging

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.messages import Reply, TaskConfigError
from fedcxr.pipeline.protocols import RoundFailed, ask, get_protocol, task_config, valid_replies
from fedcxr.pipeline.protocols.base import aggregate_backbone

from .scripted import context, reply, tensors


def _silent(task, site, params, config):
    return None


# --------------------------------------------------------------------------- Context


def test_a_sites_class_set_follows_the_models_order_and_a_notice_is_said_once():
    meta = {"a": Reply(site="a", class_set=["edema", "hernia", "not_in_model"])}
    ctx = context("FedAvg", _silent, sites=["a"], classes=("hernia", "cardiomegaly", "edema"), meta=meta)
    assert ctx.class_set("a") == ["hernia", "edema"]
    assert ctx.once(("no rows", "a")) and not ctx.once(("no rows", "a")) and ctx.once(("no rows", "b"))


# --------------------------------------------------------------------------- task configs


def test_task_config_takes_the_roles_settings_and_the_methods_defaults():
    ctx = context("FedAvg_Finetune", _silent, sites=["a"], target="t", seed=7,
                  source={"lr": 0.01, "batch_size": 8, "steps": 3}, target_train={"lr": 0.002, "labeled": 20})
    source, target = task_config(ctx, 4, "source"), task_config(ctx, 4, "target")
    assert (source["round"], source["seed"], source["role"]) == (4, 7, "source")
    assert (source["lr"], source["batch_size"], source["steps"], source["labeled"]) == (0.01, 8, 3, None)
    assert (target["lr"], target["batch_size"], target["labeled"]) == (0.002, 32, 20)  # the method's batch of 32
    assert source["optimizer"] == "adam" and not source["keep_optimizer"]
    assert source["head_classes"] == source["param_classes"] == ("edema",)
    assert source["aux_reduction"] == "sum"  # the paper's Σ_k, unless the config says mean
    mean = context("FedAvg_Finetune_AuxInfo", _silent, sites=["a"], target="t", aux_reduction="mean", alpha=0.5)
    assert (task_config(mean, 0, "source")["aux_reduction"], task_config(mean, 0, "source")["alpha"]) == ("mean", 0.5)

    fact = context("FACT", _silent, sites=["a", "b"], target="t")  # the method's own defaults
    assert (task_config(fact, 0, "source")["optimizer"], task_config(fact, 0, "source")["weight_decay"]) == ("sgd", 5e-4)
    assert task_config(fact, 0, "source")["keep_optimizer"]
    configured = context("FACT", _silent, sites=["a", "b"], target="t", optimizer_state="fresh",
                         source={"optimizer": "adam", "weight_decay": 0.0})  # the config wins
    assert (task_config(configured, 0, "source")["optimizer"], task_config(configured, 0, "source")["weight_decay"],
            task_config(configured, 0, "source")["keep_optimizer"]) == ("adam", 0.0, False)


def test_a_misspelt_override_never_travels():
    ctx = context("FedAvg", _silent, sites=["a"])
    assert task_config(ctx, 0, "source", lr=0.5, trainable="head")["trainable"] == "head"
    with pytest.raises(TaskConfigError, match=r"unknown key\(s\) \['lr_scale'\]"):
        task_config(ctx, 0, "source", lr_scale=2.0)
    with pytest.raises(TaskConfigError, match="trainable"):
        task_config(ctx, 0, "source", trainable="everything")


# --------------------------------------------------------------------------- asking sites


def test_ask_records_absent_sites_and_fails_the_round_below_min_sites(caplog):
    def only_a(task, site, params, config):
        return reply(site, params) if site == "a" else None

    ctx = context("FedAvg", only_a, sites=["a", "b", "c"])
    config = task_config(ctx, 2, "source")
    with caplog.at_level(logging.WARNING):
        replies = ask(ctx, "train", ["a", "b", "c"], tensors(w=[1.0]), config, r=2)
    assert list(replies) == ["a"]
    assert ctx.missed == [{"round": 2, "task": "train", "site": s, "why": "no reply", "reason": "no reply"}
                          for s in ("b", "c")]
    assert "round 3: site b did not answer task train" in caplog.text  # index 2 is the third round
    assert ctx.sent["c"] is config, "what each site was sent is kept (the reply checks read its lr and steps)"
    strict = context("FedAvg", only_a, sites=["a", "b", "c"], min_sites=2)
    with pytest.raises(RoundFailed, match=r"round 1: only 1 of 3 sites answered 'train' \(need 2, participation"
                                          r".min_sites\); not taking part: b: no reply; c: no reply"):
        ask(strict, "train", ["a", "b", "c"], tensors(w=[1.0]), config, r=0)
    assert list(ask(strict, "train", ["a", "b"], tensors(w=[1.0]), config, r=0, minimum=1)) == ["a"]


def test_a_site_without_rows_is_left_out_quietly_once_and_a_wrong_shape_is_refused(caplog):
    ctx = context("FedAvg", _silent, sites=["a", "b", "c"])
    theta0 = tensors(w=[1.0, 1.0])
    replies = {"a": reply("a", tensors(w=[1.5, 1.0])), "b": reply("b", tensors(w=[1.0, 1.0]), n_samples=0),
               "c": reply("c", tensors(w=[1.0, 1.0, 1.0]))}
    with caplog.at_level(logging.WARNING):
        kept = valid_replies(ctx, replies, theta0, 0)
        valid_replies(ctx, {"b": replies["b"], "a": replies["a"]}, theta0, 1)
    assert list(kept) == ["a"]
    assert caplog.text.count("site b has no training rows") == 1, "said once per run"
    assert [(e["site"], e["check"]) for e in ctx.refused] == [("c", "structure")], "no rows: not a refusal"
    with pytest.raises(RoundFailed, match="only 0 valid updates"):
        valid_replies(ctx, {"b": replies["b"]}, theta0, 2)


# --------------------------------------------------------------------------- the backbone average


def _backbone(**config):
    ctx = context("FedAvg", _silent, sites=["a", "b"], bn_keys=["bn.running_mean"], **config)
    theta0 = tensors(w=[9.0, 9.0], bn__running_mean=[7.0], head__weight=[5.0])
    replies = {"a": reply("a", tensors(w=[4.0, 4.0], bn__running_mean=[2.0], head__weight=[1.0]), n_samples=1),
               "b": reply("b", tensors(w=[0.0, 0.0], bn__running_mean=[0.0], head__weight=[3.0]), n_samples=3)}
    return ctx, replies, theta0


def test_the_backbone_is_fedavg_fedbn_or_a_robust_rule_of_the_shared_entries():
    ctx, replies, theta0 = _backbone()
    out = aggregate_backbone(ctx, replies, theta0)  # FedAvg by sample counts 1 : 3
    assert out["w"].tolist() == [1.0, 1.0] and out["bn.running_mean"].tolist() == [0.5]
    assert out["head.weight"].tolist() == [2.5]
    assert aggregate_backbone(ctx, replies, theta0, uniform=True)["w"].tolist() == [2.0, 2.0]
    assert aggregate_backbone(ctx, replies, theta0, exclude=("head.weight",))["head.weight"].tolist() == [5.0]
    ctx, replies, theta0 = _backbone(backbone_aggregation="fedbn")  # BN stays out: θ0's until a site merges its own
    fedbn = aggregate_backbone(ctx, replies, theta0)
    assert fedbn["bn.running_mean"].tolist() == [7.0] and fedbn["w"].tolist() == [1.0, 1.0]

    ctx = context("FedAvg", _silent, sites=["a", "b", "c"], aggregation="median")
    theta0 = tensors(w=[0.0])
    replies = {s: reply(s, tensors(w=[v]), n_samples=n) for s, v, n in (("a", 1.0, 1), ("b", 2.0, 1), ("c", 90.0, 50))}
    assert aggregate_backbone(ctx, replies, theta0)["w"].tolist() == [2.0], "the median ignores claimed counts"
    assert ctx.notes["aggregation"] == [{"rule": "median"}]


# --------------------------------------------------------------------------- validate


def test_validate_refuses_a_method_its_sites_cannot_serve():
    labels = {"t": Reply(site="t", metrics={"labeled_per_class": {"edema": 0, "hernia": 4}})}
    finetune = context("FedAvg_Finetune", _silent, sites=["a"], target="t", meta=labels)
    with pytest.raises(UserError, match="fine-tunes on target labels, but target 't' has no labeled training rows"):
        get_protocol("FedAvg_Finetune").validate(finetune.cfg, labels, ["edema"])
    get_protocol("FedAvg_Finetune").validate(finetune.cfg, labels, ["edema", "hernia"])  # 4 hernia labels: fine
    get_protocol("Source_Only").validate(finetune.cfg, labels, ["edema"])  # no target label needed
    no_target = context("FACT", _silent, sites=["a", "b"])
    with pytest.raises(UserError, match="method FACT needs a `target:` site"):
        get_protocol("FACT").validate(no_target.cfg, {}, ["edema"])


@pytest.mark.parametrize("method, sites, aggregation, message", [
    ("FedAvg", ["a", "b"], "median", "needs at least 3 source sites"),
    ("FedAvg", ["a", "b", "c", "d"], {"rule": "krum", "byzantine": 1}, r"2f\+3 = 5 source sites"),
    ("FedAvg", ["a", "b", "c"], {"rule": "trimmed_mean", "trim": 0.2}, r"cuts int\(0.2·3\) = 0"),
    ("Individual", ["a", "b", "c"], "median", "trains each site alone"),
])
def test_a_robust_rule_needs_a_server_average_of_enough_sites(method, sites, aggregation, message):
    ctx = context(method, _silent, sites=sites, aggregation=aggregation)
    with pytest.raises(UserError, match=message):
        get_protocol(method).validate_aggregation(ctx.cfg)
    ctx = context(method, _silent, sites=[*sites, "e", "f"], aggregation="mean")
    get_protocol(method).validate_aggregation(ctx.cfg)  # the mean: any number of sites, any method


# --------------------------------------------------------------------------- the base protocol's defaults


def test_the_base_protocol_keeps_the_initial_bn_and_evaluates_the_target_else_the_sources():
    ctx = context("FedAvg", _silent, sites=["a", "b"], bn_keys=["bn.running_mean"])
    theta = tensors(w=[1.0], bn__running_mean=[3.0])
    state = get_protocol("FedAvg").init_state(ctx, theta)
    theta["bn.running_mean"].add_(1.0)
    assert state["initial_bn"]["bn.running_mean"].tolist() == [3.0], "a copy: FedBN+ restores it every round"
    assert get_protocol("FedAvg").default_eval_sites(ctx) == ["a", "b"]
    assert get_protocol("FedAvg").default_eval_sites(context("FedAvg", _silent, sites=["a"], target="t")) == ["t"]
    assert not get_protocol("FedAvg").uniform_backbone(ctx) and get_protocol("FL").uniform_backbone(ctx)
    uniform = context("FedAvg", _silent, sites=["a", "b"], backbone_weighting="uniform")
    assert get_protocol("FedAvg").uniform_backbone(uniform)
    assert torch.equal(get_protocol("FedAvg").final_models(ctx, state)["global"]["w"], theta["w"])
