"""FACT and FACT_NF (fedcxr.pipeline.protocols.fact): the pair of sources, the averaged feature
extractor, the heads' fine-tuning, the target's step and the lowest-IDD model kept."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig, load_config
from fedcxr.pipeline.protocols.fact import FACT_HEAD_A, FACT_HEAD_B
from fedcxr.pipeline.protocols import Context, get_protocol
from fedcxr.pipeline.protocols.fact import lr_schedule
from fedcxr.pipeline.run_driver import run_experiment

from ...conftest import tiny_config
from .scripted import context, reply

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the feature extractor each source trains to, and the head it trains
BODY = {"a": 2.0, "b": 6.0, "c": 9.0}
HEAD = {"a": 1.0, "b": 3.0, "c": 5.0}


def _tensor(value, n=2):
    return torch.full((n,), float(value), dtype=torch.float64)


def scripted_fact(idd: list[float]):
    """Sources train to BODY/HEAD (head fine-tuning adds 10 to the head it got); the target moves G'
    by +1 and reports the round's summed IDD from ``idd``."""
    def answer(task, site, params, config):
        if task == "fact_target":
            body = {k: v + 1 for k, v in params.items() if not k.startswith((FACT_HEAD_A, FACT_HEAD_B))}
            return reply(site, body, idd_train_sum=idd[config["round"]])
        if config["trainable"] == "head":
            return reply(site, {**params, "head.w": params["head.w"] + 10})
        return reply(site, {"g.w": _tensor(BODY[site]), "head.w": _tensor(HEAD[site])}, n_samples=1 if site == "a" else 9)
    return answer


def _fact(method, idd, rounds=2):
    ctx = context(method, scripted_fact(idd), sites=list(BODY), target="t", rounds=rounds, seed=3)
    protocol = get_protocol(method)
    state = protocol.init_state(ctx, {"g.w": _tensor(0.0), "head.w": _tensor(0.0)})
    rows = []
    for r in range(rounds):
        state, metrics = protocol.run_round(ctx, r, state)
        rows.append(metrics)
    return ctx, protocol, state, rows


def test_a_fact_round_averages_the_pairs_g_and_heads_and_takes_the_targets_g():
    ctx, protocol, state, rows = _fact("FACT", idd=[5.0, 7.0], rounds=1)
    pair = rows[0]["pair"]
    assert pair == protocol.pair(ctx, 0) and [s for s, _, _ in ctx.transport.sent("train")][:2] == pair
    g_prime = (BODY[pair[0]] + BODY[pair[1]]) / 2  # unweighted: the pair's sample counts do not matter
    tuned = {s: HEAD[s] + 10 for s in pair}
    heads = [(params, config) for _, params, config in ctx.transport.sent("fact_head")]  # FACT's own task
    assert len(heads) == 2 and all(params["g.w"].tolist() == [g_prime] * 2 for params, _ in heads)
    assert all(config["trainable"] == "head" for _, config in heads)
    (_, payload, target_config), = ctx.transport.sent("fact_target")
    assert payload["g.w"].tolist() == [g_prime] * 2
    assert payload[FACT_HEAD_A + "w"].tolist() == [tuned[pair[0]]] * 2
    assert payload[FACT_HEAD_B + "w"].tolist() == [tuned[pair[1]]] * 2
    assert target_config["labeled"] is None and target_config["role"] == "target", "no target label is used"
    assert state["global"]["g.w"].tolist() == [g_prime + 1] * 2
    assert state["global"]["head.w"].tolist() == [(tuned[pair[0]] + tuned[pair[1]]) / 2] * 2


def test_fact_nf_skips_the_heads_fine_tuning():
    ctx, _, state, rows = _fact("FACT_NF", idd=[5.0], rounds=1)
    assert not ctx.transport.sent("fact_head")
    pair = rows[0]["pair"]
    assert state["global"]["head.w"].tolist() == [(HEAD[pair[0]] + HEAD[pair[1]]) / 2] * 2


def test_the_model_kept_is_the_lowest_idd_rounds():
    _, protocol, state, rows = _fact("FACT", idd=[5.0, 7.0, 4.0], rounds=3)
    assert [row["best_round"] for row in rows] == [0, 0, 2]
    _, protocol, state, rows = _fact("FACT", idd=[5.0, 7.0], rounds=2)
    kept = protocol.final_models(None, state)["global"]
    assert torch.equal(kept["g.w"], state["best"]["g.w"]) and not torch.equal(kept["g.w"], state["global"]["g.w"])


def test_the_learning_rate_anneals_as_ganin_and_lempitsky():
    assert lr_schedule(0.1, 0, 10) == 0.1
    assert lr_schedule(0.1, 10, 10) == pytest.approx(0.1 * 11 ** -0.75)
    assert lr_schedule(0.1, 5, 10) == pytest.approx(0.1 * 6 ** -0.75)
    ctx, _, _, _ = _fact("FACT", idd=[5.0, 7.0], rounds=2)
    lrs = [config["lr"] for _, _, config in ctx.transport.sent("train") if config["trainable"] == "all"]
    assert lrs[2] == pytest.approx(ctx.cfg.source.lr * math.pow(1 + 10 * 0.5, -0.75))


def test_fact_needs_two_sources():
    ctx = context("FACT", scripted_fact([0.0]), sites=["a"], target="t")
    with pytest.raises(UserError, match="at least two source sites"):
        get_protocol("FACT").validate(ctx.cfg, {}, ["edema"])


def test_fact_draws_random_pairs_from_the_runs_seed():
    """random.sample of two sources per round (FACT server.py), the same for the same seed and round."""

    def pairs(seed):
        cfg = ExperimentConfig(sites=["a", "b", "c", "d"], target="t", strategy="FACT", seed=seed)
        ctx = Context(cfg=cfg, transport=None, meta={}, classes=["edema"], aux_tasks=[],
                      sources=["a", "b", "c", "d"], target="t")
        return [tuple(get_protocol("FACT").pair(ctx, r)) for r in range(12)]

    assert pairs(0) == pairs(0)
    assert pairs(0) != pairs(1)
    assert len(set(pairs(0))) > 3  # not a fixed rotation: ordered pairs of 4 sources vary
    assert all(a != b for a, b in pairs(0))


def test_fact_uses_no_target_label_and_keeps_the_lowest_idd_round(tiny_manifests, tmp_path):
    """midrc_style labels covid19 only: as FACT's target for cardiomegaly it has no label at all."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FACT", target="midrc_style", rounds=3,
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly", "edema"]})
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    idd = [r["target"]["idd_train_sum"] for r in rows]  # the FACT code selects on the summed training IDD
    assert rows[-1]["best_round"] == int(min(range(len(idd)), key=idd.__getitem__))
    assert [sorted(r["pair"]) for r in rows] == [["chexpert_style", "nih_style"]] * 3


def test_the_heads_tune_on_batch_statistics_of_the_frozen_g():
    """FACT's client.py fine-tunes its head with G in train mode: the fact_head handler trains through the
    runner's one training path with the frozen BatchNorm layers still on batch statistics."""
    from fedcxr.pipeline.protocols.fact import FACTProtocol, fact_head

    seen = {}

    class Runner:
        def train(self, params, config, **hooks):
            seen.update(hooks)
            return "reply"

    assert fact_head(Runner(), {}, None) == "reply" and seen == {"frozen_bn_trains": True}
    assert FACTProtocol.site_tasks["fact_head"].handler is fact_head
