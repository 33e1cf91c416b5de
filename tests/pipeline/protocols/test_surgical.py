"""The surgical aggregation paper's methods (fedcxr.pipeline.protocols.surgical): FL, FL_PartialLoss,
FL_Surgical and PFL, one round on scripted sites whose class sets differ."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.protocols import get_protocol
from fedcxr.pipeline.run_driver import run_experiment

from ...conftest import tiny_config
from .scripted import context, reply

CLASSES = ["atelectasis", "edema", "hernia"]
#: each site's classes, and the rows (weight, bias) it trains for each of them
OWN = {"a": {"atelectasis": (1.0, 10.0), "edema": (2.0, 20.0)}, "b": {"edema": (4.0, 40.0), "hernia": (6.0, 60.0)}}
META = {s: Reply(site=s, n_samples=10, class_set=list(rows)) for s, rows in OWN.items()}
HEAD = ["head.weight", "head.bias"]


def theta0():
    return {"body": torch.tensor([8.0, 8.0], dtype=torch.float64),
            "head.weight": torch.tensor([[0.5], [0.5], [0.5]], dtype=torch.float64),
            "head.bias": torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)}


def train_own_rows(task, site, params, config):
    """A site answers a body of its own and a head of the rows ``head_classes`` names."""
    rows = [OWN[site].get(c, (0.0, 0.0)) for c in config["head_classes"]]
    body = [3.0, 3.0] if site == "a" else [1.0, 1.0]
    params = {"body": torch.tensor(body, dtype=torch.float64),
              "head.weight": torch.tensor([[w] for w, _ in rows], dtype=torch.float64),
              "head.bias": torch.tensor([b for _, b in rows], dtype=torch.float64)}
    return reply(site, params, n_samples=1 if site == "a" else 9, class_set=list(OWN[site]), loss=0.1)


def _round(method, **config):
    ctx = context(method, train_own_rows, sites=list(OWN), classes=CLASSES, meta=META, head_keys=HEAD,
                  surgical={"head_warmup": {"epochs": 0}}, **config)
    protocol = get_protocol(method)
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0()))
    return ctx, protocol, state, metrics


def test_fl_surgical_sends_each_site_its_own_classes_and_averages_each_row_by_class_name():
    ctx, protocol, state, _ = _round("FL_Surgical")
    sent = {site: config for site, _, config in ctx.transport.sent("train")}
    assert sent["a"]["head_classes"] == ("atelectasis", "edema") and sent["b"]["head_classes"] == ("edema", "hernia")
    assert all(config["param_classes"] == tuple(CLASSES) for config in sent.values())
    head = state["global"]
    assert head["head.weight"].flatten().tolist() == [1.0, 3.0, 6.0]  # edema: (2 + 4)/2, the others one site's
    assert head["head.bias"].tolist() == [10.0, 30.0, 60.0]
    assert head["body"].tolist() == [2.0, 2.0], "the backbone 1/K by default (paper Eq. 1), not 1:9"
    assert protocol.per_site_heads and protocol.default_eval_sites(ctx) == ["a", "b"]


def test_a_class_no_site_has_keeps_its_row():
    ctx = context("FL_Surgical", train_own_rows, sites=list(OWN), classes=[*CLASSES, "covid19"], meta=META,
                  head_keys=HEAD, surgical={"head_warmup": {"epochs": 0}})
    start = {**theta0(), "head.weight": torch.full((4, 1), 0.5, dtype=torch.float64),
             "head.bias": torch.full((4,), 0.5, dtype=torch.float64)}
    state, _ = get_protocol("FL_Surgical").run_round(ctx, 0, {"global": start, "initial_bn": {}})
    assert state["global"]["head.weight"][3].tolist() == [0.5] and state["global"]["head.bias"][3].item() == 0.5


@pytest.mark.parametrize("method, negatives", [("FL", True), ("FL_PartialLoss", False)])
def test_fl_trains_one_global_head_and_only_fl_counts_an_unlabeled_class_negative(method, negatives):
    ctx, protocol, state, _ = _round(method)
    for _, _, config in ctx.transport.sent("train"):
        assert config["head_classes"] == tuple(CLASSES) and config["missing_as_negative"] is negatives
    # every site trains the whole head: rows are averaged by position, 1/K (a's 0 for hernia counts)
    assert state["global"]["head.weight"].flatten().tolist() == [0.5, 3.0, 3.0]
    assert not protocol.per_site_heads


def test_pfl_keeps_each_head_at_its_site_and_averages_the_rest():
    ctx, protocol, state, _ = _round("PFL")
    assert all(set(HEAD) <= set(config["local_keys"]) for _, _, config in ctx.transport.sent("train"))
    assert state["global"]["body"].tolist() == [2.0, 2.0]
    assert torch.equal(state["global"]["head.weight"], theta0()["head.weight"]), "the server never averages heads"
    assert protocol.eval_local_keys(ctx) == HEAD and protocol.default_eval_sites(ctx) == ["a", "b"]


def test_the_head_warm_up_comes_before_round_0_and_the_sites_start_from_it():
    ctx = context("FL_Surgical", train_own_rows, sites=list(OWN), classes=CLASSES, meta=META, head_keys=HEAD,
                  surgical={"head_warmup": {"epochs": 2, "lr": 0.01}})
    protocol = get_protocol("FL_Surgical")
    state, metrics = protocol.run_round(ctx, 0, protocol.init_state(ctx, theta0()))
    # round 0 starts from each site's warmed head: the surgical family's own task, train_from_warm
    assert [task for task, *_ in ctx.transport.calls] == ["warmup_head", "warmup_head", "train_from_warm",
                                                           "train_from_warm"]
    warm = [config for _, _, config in ctx.transport.sent("warmup_head")]
    assert all((c["trainable"], c["epochs"], c["lr"], c["keep_optimizer"]) == ("head", 2, 0.01, False) for c in warm)
    assert set(metrics["head_warmup"]) == {"a", "b"}
    protocol.run_round(ctx, 1, state)  # later rounds: no warm-up, plain train
    assert [task for task, *_ in ctx.transport.calls[4:]] == ["train", "train"]


# --------------------------------------------------------------------------- on the tiny federation


def _final(run_dir):
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def test_surgical_sites_train_their_own_classes_only(tiny_manifests, tmp_path):
    """FL_Surgical: the global head covers the union; rows of a class only one site has move
    only through that site."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL_Surgical", rounds=1,
                       class_source="union", sites=["nih_style", "chexpert_style"], target=None)
    run = run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    classes = run["classes"]
    assert "hernia" in classes and "fracture" in classes  # NIH-only and CheXpert-only classes
    assert run["eval_sites"] == ["nih_style", "chexpert_style"]


def test_surgical_keeps_the_row_of_a_class_no_site_has(tiny_manifests, tmp_path):
    """covid19 is labeled by no source: its head row and bias stay at their initial values,
    while the rows of the sources' classes move."""
    classes = ["cardiomegaly", "hernia", "fracture", "covid19"]
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL_Surgical", target=None,
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": classes})
    run_experiment(load_config(data={**data, "rounds": 0}), tmp_path / "init", progress=False)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    before, after = _final(tmp_path / "init")["global"], _final(tmp_path / "run")["global"]
    row = classes.index("covid19")
    assert torch.equal(before["head.weight"][row], after["head.weight"][row])
    assert torch.equal(before["head.bias"][row], after["head.bias"][row])
    for cls in ("cardiomegaly", "hernia", "fracture"):
        assert not torch.equal(before["head.weight"][classes.index(cls)], after["head.weight"][classes.index(cls)])
