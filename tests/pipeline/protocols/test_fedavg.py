"""FedAvg and its fine-tuning variants (fedcxr.pipeline.protocols.fedavg), one round on scripted sites:
what each site is sent and what the server keeps, worked out by hand."""

from __future__ import annotations

import pytest

from fedcxr.pipeline.protocols import get_protocol

from .scripted import context, reply, tensors

SOURCES = {"a": ([4.0, 4.0], 1), "b": ([0.0, 0.0], 3)}  # each source's trained w and its sample count


def sites_and_target(task, site, params, config):
    """Sources answer their fixed model; the target answers what it got + 1 (a fine-tuning step)."""
    if site in SOURCES:
        w, n = SOURCES[site]
        return reply(site, {**params, "w": tensors(w=w)["w"]}, n_samples=n)
    return reply(site, {k: v + 1 for k, v in params.items()}, loss=0.5)


def _round(method, r=0, **config):
    ctx = context(method, sites_and_target, sites=list(SOURCES), target="t", **config)
    protocol = get_protocol(method)
    state, metrics = protocol.run_round(ctx, r, protocol.init_state(ctx, tensors(w=[8.0, 8.0])))
    return ctx, state, metrics


def test_fedavg_is_the_sample_weighted_mean_and_asks_no_target():
    ctx, state, metrics = _round("FedAvg")
    assert state["global"]["w"].tolist() == [1.0, 1.0]  # (1·4 + 3·0) / 4
    assert [site for site, _, _ in ctx.transport.sent("train")] == ["a", "b"]
    assert metrics["n_samples"] == {"a": 1, "b": 3} and "target" not in metrics


def test_fedavg_finetune_sends_the_average_to_the_target_and_keeps_the_targets_model():
    ctx, state, metrics = _round("FedAvg_Finetune")
    target = [(params, config) for site, params, config in ctx.transport.sent("train") if site == "t"]
    assert len(target) == 1
    params, config = target[0]
    assert params["w"].tolist() == [1.0, 1.0] and config["role"] == "target"
    assert state["global"]["w"].tolist() == [2.0, 2.0]  # the target's fine-tuned model, not the average
    assert metrics["target"] == {"loss": 0.5}


def test_fedbn_keeps_bn_at_the_sites_and_fedbn_plus_restores_the_rounds_bn():
    ctx = context("FedAvg", sites_and_target, sites=list(SOURCES), bn_keys=["bn.running_mean"],
                  backbone_aggregation="fedbn_plus")
    protocol = get_protocol("FedAvg")
    theta0 = tensors(w=[8.0, 8.0], bn__running_mean=[5.0])
    state, _ = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0))
    assert all(config["local_keys"] == ("bn.running_mean",) for _, _, config in ctx.transport.sent("train"))
    assert protocol.eval_local_keys(ctx) == ["bn.running_mean"]
    assert state["global"]["bn.running_mean"].tolist() == [5.0] and state["global"]["w"].tolist() == [1.0, 1.0]
    plain = context("FedAvg", sites_and_target, sites=list(SOURCES), bn_keys=["bn.running_mean"])
    assert protocol.eval_local_keys(plain) == [] and protocol.source_config(plain, 0)["local_keys"] == ()


def test_source_only_needs_no_target_labels_and_finetune_offline_needs_a_target():
    assert not get_protocol("Source_Only").needs_target_labels and not get_protocol("Source_Only").finetune
    assert get_protocol("Finetune_Offline").needs_target and get_protocol("Finetune_Offline").needs_target_labels
    assert get_protocol("Finetune_Offline").task_defaults()["target_batch_size"] == 16
    assert get_protocol("FedAvg_Finetune").task_defaults()["target_batch_size"] == 32


@pytest.mark.parametrize("r, passes", [(0, 0), (1, 3)])
def test_finetune_offline_fine_tunes_after_the_last_round_each_pass_from_the_previous(r, passes):
    ctx, state, metrics = _round("Finetune_Offline", r=r, rounds=2, finetune_offline={"epochs": 3})
    target = [(params, config) for site, params, config in ctx.transport.sent("finetune_pass") if site == "t"]
    assert not [site for site, _, _ in ctx.transport.sent("train") if site == "t"]  # its passes are its own task
    assert [config["repeat"] for _, config in target] == list(range(passes))
    assert [params["w"].tolist() for params, _ in target] == [[1.0 + k, 1.0 + k] for k in range(passes)]
    assert state["global"]["w"].tolist() == [1.0 + passes] * 2
    assert ("target" in metrics) == bool(passes)
    if passes:
        assert metrics["target"] == {"passes": 3, "loss": 0.5, "first_loss": 0.5}
