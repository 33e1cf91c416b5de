"""What a sampled round means for each method (``participation:``; README "Running a consortium").

On scripted sites: a round asks only the sources :func:`~fedcxr.pipeline.participation.sample_sites`
draws (the target always), and aggregates exactly as a full round of the sources that replied —
except where a method's published rule says otherwise (SCAFFOLD's c moves by |S|/N of the mean Δc_i,
Karimireddy et al. 2020, Algorithm 1). Too few valid replies fail the round saying who and why.
"""

from __future__ import annotations

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config_consortium import SimulateConfig
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.protocols.fedopt import pack_control_delta, unpack_control
from fedcxr.pipeline.participation import sample_sites
from fedcxr.pipeline.protocols import RoundFailed, get_protocol
from fedcxr.pipeline.protocols import fedopt as fedopt_module
from fedcxr.pipeline.run_driver import missed_map
from fedcxr.pipeline.simulated_consortium import SimulatedConsortium

from .scripted import context, reply, tensors

SOURCES = ["s0", "s1", "s2", "s3", "s4", "s5"]
#: each source's update of w, and its training rows
DELTA = {s: float(i + 1) for i, s in enumerate(SOURCES)}
ROWS = {s: 30 + i for i, s in enumerate(SOURCES)}  # no site near defences.max_share of a round
HALF = {"fraction": 0.5}


def _train(task, site, params, config):
    """A source moves w by its own DELTA; the target (``t``) by −1."""
    w = params["w"] + (DELTA.get(site, -1.0))
    return reply(site, {"w": w}, n_samples=ROWS.get(site, 8), n_batches=1)


def _run(method, rounds, sites=SOURCES, target=None, participation=None, answer=_train, **config):
    ctx = context(method, answer, sites=list(sites), target=target, participation=participation or {},
                  warmup_rounds=0, **config)
    protocol = get_protocol(method)
    state = protocol.init_state(ctx, tensors(w=[0.0, 0.0]))
    rows = []
    for r in range(rounds):
        state, metrics = protocol.run_round(ctx, r, state)
        rows.append({**metrics, **ctx.notes})
        ctx.notes = {}
    return ctx, state, rows


def _asked(ctx, task="train"):
    """The sites sent ``task``, round by round (the config's round number)."""
    out: dict[int, list[str]] = {}
    for site, _, config in ctx.transport.sent(task):
        out.setdefault(config["round"], []).append(site)
    return out


def test_a_sampled_fedavg_round_asks_only_the_draw_and_averages_those_who_replied():
    ctx, state, rows = _run("FedAvg", 4, participation=HALF)
    draws = [sample_sites(SOURCES, 0.5, 1, 0, r) for r in range(4)]
    assert _asked(ctx) == dict(enumerate(draws)) and len({tuple(d) for d in draws}) > 1
    assert [row["asked"] for row in rows] == draws
    assert [list(row["train"]) for row in rows] == draws, "train holds exactly the sites that took part"
    w = 0.0
    for draw in draws:  # each round: the sample-weighted mean of the asked sources' updates
        w += sum(ROWS[s] * DELTA[s] for s in draw) / sum(ROWS[s] for s in draw)
    assert state["global"]["w"].tolist() == pytest.approx([w, w])
    _, full, full_rows = _run("FedAvg", 1)
    assert "asked" not in full_rows[0] and list(full_rows[0]["train"]) == SOURCES


@pytest.mark.parametrize("method", ["FedAvg_Finetune", "FedGP", "FedDA", "FedAvg_Finetune_GP"])
def test_the_target_is_asked_every_round_and_combines_the_sources_that_replied(method):
    ctx, state, rows = _run(method, 3, target="t", participation=HALF)
    draws = [sample_sites(SOURCES, 0.5, 1, 0, r) for r in range(3)]
    asked = _asked(ctx, "train" if method == "FedAvg_Finetune" else "train_gp")  # the GP family's own task
    assert all(asked[r] == [*draws[r], "t"] or asked[r] == draws[r] + ["t"] for r in range(3))
    for r, row in enumerate(rows):
        assert list(row["train"]) == draws[r]
        if "betas" in row:
            assert list(row["betas"]) == draws[r], "the rule combines the sources that replied, no other"
    # a sampled round is the full round of the sources that replied: same model
    reference = tensors(w=[0.0, 0.0])
    protocol = get_protocol(method)
    for r, draw in enumerate(draws):
        sub = context(method, _train, sites=draw, target="t", warmup_rounds=0)
        got, _ = protocol.run_round(sub, r, {**protocol.init_state(sub, reference)})
        reference = got["global"]
    assert state["global"]["w"].tolist() == pytest.approx(reference["w"].tolist())


def test_a_round_below_min_sites_fails_naming_who_missed_and_why():
    def silent_s1(task, site, params, config):
        return None if site == "s1" else _train(task, site, params, config)

    sites = ["s0", "s1"]
    ctx = context("FedAvg", silent_s1, sites=sites, participation={"min_sites": 2})
    protocol = get_protocol("FedAvg")
    with pytest.raises(RoundFailed, match=r"only 1 of 2 sites answered 'train' \(need 2, participation.min_sites\); "
                                          r"not taking part: s1: no reply"):
        protocol.run_round(ctx, 0, protocol.init_state(ctx, tensors(w=[0.0, 0.0])))

    def nan_s1(task, site, params, config):
        out = _train(task, site, params, config)
        if site == "s1":
            out.params["w"][0] = float("nan")
        return out

    ctx = context("FedAvg", nan_s1, sites=sites, participation={"min_sites": 2})
    with pytest.raises(RoundFailed, match=r"only 1 valid updates \(need 2\); not taking part: s1: rejected: "):
        protocol.run_round(ctx, 0, protocol.init_state(ctx, tensors(w=[0.0, 0.0])))
    assert missed_map(ctx.missed, 0) == {"s1": {"why": "refused", "task": "train", "reason": ctx.missed[0]["reason"]}}


def test_the_missed_map_says_late_or_dropped_out_on_the_simulated_clock():
    spec = SimulateConfig(step_s=1.0, sites={"s2": {"speed": 0.01}, "s3": {"dropout": 0.999}})
    ctx = context("FedAvg", _train, sites=SOURCES[:4])
    ctx.transport = SimulatedConsortium(ctx.transport, spec, seed=0, deadline_s=30.0, sources=SOURCES[:4])
    protocol = get_protocol("FedAvg")
    _, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, tensors(w=[0.0, 0.0])))
    assert list(metrics["train"]) == ["s0", "s1"]
    missed = missed_map(ctx.missed, 0)
    assert {s: e["why"] for s, e in missed.items()} == {"s2": "late", "s3": "dropped"}
    assert missed["s2"]["reason"] == "reply at 100.0 s, after the 30 s deadline (simulated clock)"


def test_surgical_keeps_the_head_rows_of_a_class_whose_only_site_was_not_asked():
    own = {"a": ["atelectasis", "edema"], "b": ["edema", "hernia"], "c": ["edema"], "d": ["atelectasis"]}
    meta = {s: Reply(site=s, n_samples=10, class_set=cs) for s, cs in own.items()}
    classes = ["atelectasis", "edema", "hernia"]

    def heads(task, site, params, config):
        rows = len(config["head_classes"])
        return reply(site, {"body": params["body"] + 1, "head.weight": torch.full((rows, 1), 2.0, dtype=torch.float64),
                            "head.bias": torch.full((rows,), 2.0, dtype=torch.float64)}, class_set=own[site])

    r = next(r for r in range(50) if "b" not in sample_sites(list(own), 0.5, 1, 0, r))
    ctx = context("FL_Surgical", heads, sites=list(own), classes=classes, meta=meta,
                  head_keys=["head.weight", "head.bias"], surgical={"head_warmup": {"epochs": 0}}, participation=HALF)
    start = {"body": tensors(w=[0.0])["w"], "head.weight": torch.full((3, 1), 0.5, dtype=torch.float64),
             "head.bias": torch.full((3,), 0.5, dtype=torch.float64)}
    state, metrics = get_protocol("FL_Surgical").run_round(ctx, r, {"global": start, "initial_bn": {}})
    assert "b" not in metrics["train"]
    assert state["global"]["head.weight"].flatten().tolist() == [2.0, 2.0, 0.5], "hernia: only b has it, kept"
    assert state["global"]["head.bias"].tolist() == [2.0, 2.0, 0.5]


def _scripted_parameters(monkeypatch):
    monkeypatch.setattr(fedopt_module, "parameter_keys", lambda ctx: ["w"])


def test_scaffold_moves_c_by_the_sampled_share_of_the_mean_control_update(monkeypatch):
    """Karimireddy et al. 2020, Algorithm 1 line 17: c ← c + (1/N)·Σ_{i∈S} Δc_i = c + (|S|/N)·mean_S Δc_i."""
    _scripted_parameters(monkeypatch)

    def scaffold(task, site, params, config):
        model, _ = unpack_control(params)
        out = reply(site, {"w": model["w"] + DELTA[site]}, n_samples=ROWS[site], n_batches=1)
        out.extra = pack_control_delta({"w": torch.full((2,), DELTA[site], dtype=torch.float64)})
        return out

    ctx, state, rows = _run("SCAFFOLD", 1, participation=HALF, answer=scaffold, source={"optimizer": "sgd",
                                                                                        "momentum": 0.0})
    draw = sample_sites(SOURCES, 0.5, 1, 0, 0)
    mean = sum(ROWS[s] * DELTA[s] for s in draw) / sum(ROWS[s] for s in draw)
    assert state["control"]["w"].tolist() == pytest.approx([len(draw) / len(SOURCES) * mean] * 2)
    assert state["global"]["w"].tolist() == pytest.approx([mean, mean])
    assert sorted(s for s, _, _ in ctx.transport.sent("train_scaffold")) == sorted(draw), "the others keep c_i"


def test_fedadam_steps_its_server_optimiser_on_the_mean_of_the_sampled_updates(monkeypatch):
    _scripted_parameters(monkeypatch)
    _, sampled, _ = _run("FedAdam", 2, participation=HALF)
    reference, moments = tensors(w=[0.0, 0.0]), None
    protocol = get_protocol("FedAdam")
    for r in range(2):  # the same server optimiser over full rounds of exactly the sources drawn
        draw = sample_sites(SOURCES, 0.5, 1, 0, r)
        sub = context("FedAdam", _train, sites=draw)
        start = protocol.init_state(sub, reference)
        got, _ = protocol.run_round(sub, r, {**start, "server_opt": moments or start["server_opt"]})
        reference, moments = got["global"], got["server_opt"]
    assert sampled["global"]["w"].tolist() == pytest.approx(reference["w"].tolist())
    assert sampled["server_opt"]["m"]["w"].tolist() == pytest.approx(moments["m"]["w"].tolist())


@pytest.mark.parametrize("method, target", [("FACT", "t"), ("Central", None), ("Target_Only", "t")])
def test_methods_that_cannot_sample_their_sources_say_why(method, target):
    from fedcxr.pipeline.config import ExperimentConfig

    cfg = ExperimentConfig(sites=SOURCES, target=target, method=method, participation=HALF)
    with pytest.raises(UserError, match=f"participation.fraction 0.5: method {method} "):
        get_protocol(method).validate_participation(cfg)
    get_protocol(method).validate_participation(ExperimentConfig(sites=SOURCES, target=target, method=method,
                                                                 participation={"deadline_s": 5}))


def test_a_robust_rule_needs_three_sources_in_every_sampled_round():
    from fedcxr.pipeline.config import ExperimentConfig

    cfg = ExperimentConfig(sites=SOURCES, method="FedAvg", aggregation="median", participation={"fraction": 0.3})
    with pytest.raises(UserError, match=r"needs at least 3 source sites per round \(2 asked"):
        get_protocol("FedAvg").validate_aggregation(cfg)
    get_protocol("FedAvg").validate_aggregation(cfg.model_copy(update={"participation": cfg.participation.model_copy(
        update={"min_sites": 3})}))
