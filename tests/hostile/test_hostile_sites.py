"""A faulty or hostile site (SECURITY.md "A faulty or hostile site"; issue 19 parts 1-2).

Each case runs the real in-process federation with one site's ``train`` replies rewritten by
``benchmarks/hostile_sites.py`` (a test/benchmark-only transport wrapper) and asserts what a
consortium relies on: the reply is refused with its reason in ``run.json`` and
``metrics.jsonl``, the honest sites go on training on an unpoisoned model, and a run whose
honest sites fail after a refused one stops naming the suspect. The same checks on NVIDIA FLARE
are in ``test_flare_hostile.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from fedcxr.cli import main
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.protocols import Context, RoundFailed, valid_replies
from fedcxr.pipeline.protocols.base import SuspectSite

from ..benchmarks.conftest import load_bench
from ..conftest import tiny_config

SOURCES = ["nih_style", "chexpert_style", "midrc_style"]
CLASSES = ["cardiomegaly", "pneumonia", "covid19"]
OFF = {"check_counts": False, "check_variance": False, "norm_factor": None, "norm_limit": None,
       "stop_on_suspect": False, "bn_factor": None, "max_share": None}


@pytest.fixture(scope="module")
def hostile():
    return load_bench("hostile_sites")


def _data(manifests, cache, **overrides):
    base = dict(strategy="FedAvg", sites=SOURCES, target=None, rounds=2, eval_every=0,
                source={"lr": 2e-3, "batch_size": 16, "steps": 2},
                model={"backbone": "resnet_tiny", "hidden": 16, "classes": CLASSES})  # whichever sites take part
    return tiny_config(manifests, cache, **{**base, **overrides})


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --------------------------------------------------------------------------- a huge finite update


def test_a_huge_finite_update_is_refused_and_the_honest_sites_train_on(hostile, tiny_manifests, tmp_path):
    """Issue 19: 1e30 was accepted, the honest sites then diverged and were blamed. Now it is refused
    and recorded, and round 1 averages all three healthy updates of an unpoisoned model."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"chexpert_style": {0: "huge"}})
    assert run["status"] == "finished"
    [entry] = run["refused"]
    assert (entry["round"], entry["site"], entry["task"], entry["check"]) == (0, "chexpert_style", "train", "norm")
    assert "defences.norm_factor" in entry["reason"] or "defences.norm_limit" in entry["reason"]
    rows = _metrics(tmp_path / "run")
    assert rows[0]["refused"] == [entry] and "refused" not in rows[1]
    assert sorted(rows[0]["train"]) == ["midrc_style", "nih_style"]
    assert sorted(rows[1]["train"]) == sorted(SOURCES)  # nobody diverged
    assert all(float(v.abs().max()) < 100 for v in _final(tmp_path / "run").values() if v.is_floating_point())


def test_a_hostile_site_attacks_a_methods_own_training_task_too(hostile, tiny_manifests, tmp_path):
    """FedProx's sources train with its own task (train_prox): the hostile site rewrites those replies as it
    does ``train``'s, and the server refuses them as it refuses ``train``'s."""
    assert hostile.trains("train") and hostile.trains("train_prox") and hostile.trains("train_gp")
    assert not any(hostile.trains(t) for t in ("warmup_head", "fact_target", "evaluate", "metadata"))
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", strategy="FedProx", rounds=1))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"chexpert_style": {0: "huge"}})
    [entry] = run["refused"]
    assert (entry["round"], entry["site"], entry["task"], entry["check"]) == (0, "chexpert_style", "train_prox", "norm")


@pytest.mark.parametrize("n_sources", [1, 2])
def test_a_huge_update_is_caught_by_the_absolute_bound_with_one_or_two_sources(hostile, tiny_manifests, tmp_path,
                                                                               n_sources):
    """With one or two replies there is no majority to compare with: ‖Δ‖ > norm_limit·‖θ0‖ still refuses it."""
    sites = SOURCES[:n_sources]
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", sites=sites, rounds=1))
    faults = {sites[-1]: {0: "huge"}}
    if n_sources == 1:
        with pytest.raises(RoundFailed, match="only 0 valid updates"):
            hostile.hostile_run(cfg, tmp_path / "run", faults)
        run = _run_json(tmp_path / "run")
        assert run["status"] == "stopped"  # the refusal of the failed round is on record
    else:
        run = hostile.hostile_run(cfg, tmp_path / "run", faults)
        assert run["status"] == "finished" and sorted(_metrics(tmp_path / "run")[0]["train"]) == sites[:1]
    [entry] = run["refused"]
    assert entry["site"] == sites[-1] and entry["check"] == "norm" and "defences.norm_limit" in entry["reason"]


# --------------------------------------------------------------------------- claimed counts


def test_an_inflated_count_is_refused_leaving_the_model_of_the_run_without_that_site(hostile, tiny_manifests,
                                                                                     tmp_path):
    """Issue 19: a site claiming 10¹² samples got 99.9 % of FedAvg's weight. Refused every round, it
    leaves exactly (bit for bit) the model the two honest sites make alone."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"midrc_style": {"*": "inflate"}})
    assert [(e["round"], e["site"], e["check"]) for e in run["refused"]] == [(0, "midrc_style", "counts"),
                                                                             (1, "midrc_style", "counts")]
    assert re.fullmatch(r"n_samples claims 1000000000000, more than the \d+ training rows the site reported at the "
                        r"start of the run", run["refused"][0]["reason"])
    alone = load_config(data=_data(tiny_manifests, tmp_path / "cache", sites=SOURCES[:2]))
    run_experiment(alone, tmp_path / "alone", progress=False)
    assert _same(_final(tmp_path / "run"), _final(tmp_path / "alone"))


def test_a_count_of_ten_to_the_400_is_refused_without_a_traceback(hostile, tiny_manifests, tmp_path):
    """Issue 19: 10⁴⁰⁰ ended in an OverflowError traceback (float() of it in the weighted mean)."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", rounds=1))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"nih_style": {0: "overflow"}})
    assert run["status"] == "finished"
    [entry] = run["refused"]
    assert entry["check"] == "counts" and "a 401-digit number" in entry["reason"] and len(entry["reason"]) < 200


def _context(tiny_manifests, tmp_path, **cfg_overrides) -> Context:
    """The federation as a protocol sees it, with three sites that reported 48 training rows."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", **cfg_overrides))
    meta = {s: Reply(site=s, n_samples=48, metrics={"n_train": 48}) for s in SOURCES}
    ctx = Context(cfg=cfg, transport=None, meta=meta, classes=["cardiomegaly"], aux_tasks=[], sources=SOURCES,
                  target=None)
    ctx.sent = {s: {"lr": 1e-3, "batch_size": 16, "steps": 2, "local_keys": []} for s in SOURCES}
    return ctx


def _replies(theta0: dict, **changes) -> dict[str, Reply]:
    """Three replies moving θ0 by 0.01·(i+1) (honest), with ``changes[site]`` laid over a reply's fields."""
    out = {}
    for i, site in enumerate(SOURCES):
        params = {k: v + 0.01 * (i + 1) for k, v in theta0.items()}
        fields = {"n_samples": 48, "n_batches": 2, **changes.get(site, {})}
        out[site] = Reply(site=site, params=params, **fields)
    return out


@pytest.mark.parametrize("field, value, fragment", [
    pytest.param("n_samples", 10**400, "a 401-digit number", id="10^400"),
    ("n_samples", 40.5, "40.5, not an integer"),
    ("n_samples", -5, "a negative count"),
    ("n_samples", True, "True, not an integer"),
    ("n_samples", 49, "claims 49, more than the 48 training rows"),
    ("n_batches", 10**6, "claims 1000000, more than the 2 optimiser steps"),
])
def test_every_kind_of_bad_count_is_refused_by_name(tiny_manifests, tmp_path, field, value, fragment):
    ctx = _context(tiny_manifests, tmp_path)
    theta0 = {"w": torch.ones(4), "b": torch.zeros(2)}
    kept = valid_replies(ctx, _replies(theta0, chexpert_style={field: value}), theta0, 0)
    assert sorted(kept) == ["midrc_style", "nih_style"]
    [entry] = ctx.refused
    assert entry["site"] == "chexpert_style" and entry["check"] == "counts" and fragment in entry["reason"]


@pytest.mark.parametrize("value, fragment", [("9" * 100_000, "is a str,"), (float("inf"), "is inf,"),
                                             (-3, "is -3,"), (True, "is True,")])
def test_the_flare_wire_describes_a_bad_count_briefly(value, fragment):
    """FLARE's wire refuses what is not a non-negative integer, naming it in a few characters (S1);
    a huge integer passes the wire and is refused by the protocol's count check (S2)."""
    from fedcxr.flare.wire import META_KEY, WireError, decode_reply, encode_reply

    params, meta = encode_reply(Reply(site="a", n_samples=5, class_set=["edema"]))
    meta[META_KEY]["n_samples"] = value
    with pytest.raises(WireError) as caught:
        decode_reply("a", params, meta)
    assert fragment in str(caught.value) and len(str(caught.value)) < 120
    meta[META_KEY]["n_samples"] = 10**400
    assert decode_reply("a", params, meta).n_samples == 10**400


def test_with_defences_off_a_bad_count_that_is_a_count_passes(tiny_manifests, tmp_path):
    ctx = _context(tiny_manifests, tmp_path, defences=OFF)
    theta0 = {"w": torch.ones(4)}
    assert len(valid_replies(ctx, _replies(theta0, nih_style={"n_samples": 10**12}), theta0, 0)) == 3
    with pytest.raises(RoundFailed):  # not a count at all: refused whatever the settings
        valid_replies(ctx, {"nih_style": _replies(theta0, nih_style={"n_samples": 10**400})["nih_style"]}, theta0, 0)


def test_a_site_sending_a_zero_update_cannot_get_the_honest_one_refused(tiny_manifests, tmp_path):
    """Two replies: the leave-one-out median needs two others, so neither is judged by the other."""
    ctx = _context(tiny_manifests, tmp_path)
    theta0 = {"w": torch.ones(4)}
    replies = _replies(theta0)
    two = {"nih_style": replies["nih_style"], "chexpert_style": Reply(site="chexpert_style", params=dict(theta0),
                                                                      n_samples=48, n_batches=2)}
    assert sorted(valid_replies(ctx, two, theta0, 0)) == ["chexpert_style", "nih_style"]
    assert ctx.refused == []


# --------------------------------------------------------------------------- the suspect


def test_honest_sites_failing_after_a_refused_site_stop_the_run_naming_the_suspect(hostile, tiny_manifests, tmp_path):
    """The poisoned-model pattern: a site is refused in round 0, honest sites' updates turn NaN in
    round 1. The run stops (exit 1 path) naming the suspect instead of finishing on its word."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    faults = {"chexpert_style": {0: "huge"}, "nih_style": {1: "nan"}, "midrc_style": {1: "nan"}}
    with pytest.raises(SuspectSite) as caught:
        hostile.hostile_run(cfg, tmp_path / "run", faults)
    message = str(caught.value)
    assert "suspect: chexpert_style" in message and "midrc_style, nih_style" in message
    run = _run_json(tmp_path / "run")
    assert run["status"] == "stopped"
    assert {(e["round"], e["site"], e["check"]) for e in run["refused"]} == {
        (0, "chexpert_style", "norm"), (1, "nih_style", "values"), (1, "midrc_style", "values")}


def test_a_site_that_keeps_sending_nan_is_refused_each_round_but_stops_nothing(hostile, tiny_manifests, tmp_path):
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"midrc_style": {"*": "nan"}})
    assert run["status"] == "finished"
    assert [(e["round"], e["check"]) for e in run["refused"]] == [(0, "values"), (1, "values")]


# --------------------------------------------------------------------------- honest runs are unchanged


@pytest.mark.parametrize("strategy", ["FedAvg_Finetune", "FedGP"])
def test_honest_runs_give_the_same_model_bit_for_bit_with_defences_on_and_off(tiny_manifests, tmp_path, strategy):
    """Defences only refuse: an honest run (the target screened too, FedGP) is the run without them."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy=strategy, sites=SOURCES, warmup_rounds=1,
                       eval_every=0)
    on = run_experiment(load_config(data=data), tmp_path / "on", progress=False)
    run_experiment(load_config(data={**data, "defences": OFF}), tmp_path / "off", progress=False)
    assert on["refused"] == [] and on["missed"] == []
    assert _same(_final(tmp_path / "on"), _final(tmp_path / "off"))


# --------------------------------------------------------------------------- robust rules


def test_krum_keeps_the_honest_sites_and_median_resists_a_sign_flipped_one(hostile, tiny_manifests, tmp_path):
    """Five sources, one sending θ0 − 10·Δ (plausible enough to pass a loose norm screen): multi-Krum
    (f = 1) leaves it out; the coordinate-wise median gives a finite model."""
    root = tmp_path / "sites"
    for name in (*SOURCES, "dicom_style"):
        shutil.copytree(tiny_manifests / name, root / name)
    shutil.copytree(tiny_manifests / "nih_style", root / "nih_copy")
    sites = [*SOURCES, "dicom_style", "nih_copy"]
    defences = {"norm_factor": 50}
    data = _data(root, tmp_path / "cache", sites=sites, rounds=1, defences=defences,
                 aggregation={"rule": "multi_krum", "byzantine": 1},
                 model={"backbone": "resnet_tiny", "hidden": 16, "classes": CLASSES, "norm": "group"})
    # GroupNorm: no running variance for the flip to make negative (that alone is refused: test_screening)
    run = hostile.hostile_run(load_config(data=data), tmp_path / "krum", {"midrc_style": {0: "flip"}})
    assert run["refused"] == []
    [note] = _metrics(tmp_path / "krum")[0]["aggregation"]
    assert note["rule"] == "multi_krum" and len(note["kept"]) == 4 and "midrc_style" not in note["kept"]
    data["aggregation"] = "median"
    hostile.hostile_run(load_config(data=data), tmp_path / "median", {"midrc_style": {0: "flip"}})
    assert all(torch.isfinite(v.float()).all() for v in _final(tmp_path / "median").values())


def _train_exit(tmp_path, capsys, data) -> tuple[int, str]:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(data))
    code = main(["train", str(config), "--out", str(tmp_path / "run")])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("overrides, fragment", [
    ({"strategy": "Central"}, "trains one pooled model"),
    ({"strategy": "FACT", "target": "dicom_style"}, "averages exactly the two sources"),
    ({"strategy": "FedGP", "target": "dicom_style", "warmup_rounds": 0}, "only in its FedAvg warm-up rounds"),
    ({"sites": SOURCES[:2]}, "needs at least 3 source sites"),
    ({"aggregation": {"rule": "krum", "byzantine": 1}}, "needs at least 2f+3 = 5 source sites"),
    ({"aggregation": {"rule": "trimmed_mean", "trim": 0.1}}, "cuts int(0.1·3) = 0 values"),
    ({"aggregation": "mode"}, "aggregation.rule"),
    ({"defences": {"norm_factor": 0.5}}, "defences.norm_factor"),
])
def test_a_rule_or_setting_a_run_cannot_use_exits_2_saying_why(tiny_manifests, tmp_path, capsys, overrides,
                                                                 fragment):
    data = _data(tiny_manifests, tmp_path / "cache", aggregation="median", rounds=1)
    code, err = _train_exit(tmp_path, capsys, {**data, **overrides})
    assert code == 2 and fragment in err, err


def test_metadata_counts_that_are_not_counts_stop_the_run_before_round_0():
    """The counts every later reply is judged by must themselves be counts (exit 2 naming the site)."""
    from fedcxr.errors import UserError
    from fedcxr.pipeline.run_driver import check_metadata_counts

    with pytest.raises(UserError, match=r"site evil answered the metadata query with n_samples is a 401-digit"):
        check_metadata_counts({"evil": Reply(site="evil", n_samples=10**400)})
    with pytest.raises(UserError, match=r"n_train is 2.5, not an integer"):
        check_metadata_counts({"evil": Reply(site="evil", n_samples=3, metrics={"n_train": 2.5})})
    check_metadata_counts({"ok": Reply(site="ok", n_samples=3, metrics={"n_train": 3, "n_val": 0})})


def test_krum_lowers_f_for_a_round_left_with_too_few_replies(tiny_manifests, tmp_path):
    """f = 1 needs 5 replies; after a refusal leaves 4, the round goes on with f = 0, said in the metrics."""
    from fedcxr.pipeline.protocols.base import robust_average

    ctx = _context(tiny_manifests, tmp_path)
    ctx.cfg = ctx.cfg.model_copy(update={"aggregation": ctx.cfg.aggregation.model_copy(
        update={"rule": "multi_krum", "byzantine": 1})})
    theta0 = {"w": torch.zeros(2)}
    states = [{"w": torch.tensor([x, 0.0])} for x in (0.0, 1.0, 2.0, 50.0)]
    merged = robust_average(ctx, ["a", "b", "c", "d"], states, [1.0] * 4, theta0)
    [note] = ctx.notes["aggregation"]
    assert note["byzantine"] == 0 and sorted(note["kept"]) == ["a", "b", "c", "d"]  # m = n − f = 4
    assert torch.allclose(merged["w"], torch.tensor([53 / 4, 0.0]))
