"""Adaptive hostile sites (issue 27 items 1-3; SECURITY.md S2, S3, S3c, S5, S7, S8).

Attacks on the defences themselves, each first reproduced against the code before issue 27:

* a site that sends honest counts and its honest update but shifts every BatchNorm running mean
  (outside the relative norm check, under the absolute one);
* a site that lies about its size — in its metadata reply and every train reply — to raise the
  step budget the relative check divides by and the weight FedAvg gives it;
* a robust rule that quietly became the mean when refusals left fewer replies.

The runs use ``benchmarks/hostile_sites.py``'s transport wrapper (faults ``bn_shift``, ``lie``,
``lie_flip``, ``lie_zero``); the pure cases call :func:`valid_replies` and
:func:`robust_average` on hand-made replies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.protocols import Context, RoundFailed, valid_replies
from fedcxr.pipeline.protocols.base import SuspectSite, robust_average
from fedcxr.pipeline.run_driver import check_metadata_counts, run_experiment

from ..benchmarks.conftest import load_bench
from ..conftest import tiny_config

SOURCES = ["nih_style", "chexpert_style", "midrc_style"]
FIVE = [*SOURCES, "dicom_style", "nih_copy"]
CLASSES = ["cardiomegaly", "pneumonia", "covid19"]
LIAR = {"metadata": "lie", 0: "lie_flip", "*": "lie_zero"}


@pytest.fixture(scope="module")
def hostile():
    return load_bench("hostile_sites")


def _data(manifests, cache, **overrides):
    base = dict(strategy="FedAvg", sites=SOURCES, target=None, rounds=2, eval_every=0,
                source={"lr": 2e-3, "batch_size": 16, "steps": 2},
                model={"backbone": "resnet_tiny", "hidden": 16, "classes": CLASSES})
    return tiny_config(manifests, cache, **{**base, **overrides})


def _five_sites(tiny_manifests, tmp_path) -> Path:
    """Five sources: the four tiny hospitals and a copy of one (as the issue's five sources)."""
    root = tmp_path / "sites"
    for name in (*SOURCES, "dicom_style"):
        shutil.copytree(tiny_manifests / name, root / name)
    shutil.copytree(tiny_manifests / "nih_style", root / "nih_copy")
    return root


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- item 1: BatchNorm statistics


def test_a_site_shifting_every_bn_running_mean_is_refused_leaving_the_run_without_it(hostile, tiny_manifests,
                                                                                     tmp_path):
    """Issue 27 item 1: honest counts, its honest update, every running mean shifted (0.5 × norm_limit × ‖θ0‖):
    nothing was refused and the target AUROC fell to 0.5. Now the BatchNorm check refuses it every round,
    leaving bit for bit the model of the run without it."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"midrc_style": {"*": "bn_shift"}})
    assert run["status"] == "finished"
    assert [(e["round"], e["site"], e["check"]) for e in run["refused"]] == [(0, "midrc_style", "norm"),
                                                                             (1, "midrc_style", "norm")]
    assert "BatchNorm running statistics" in run["refused"][0]["reason"]
    alone = load_config(data=_data(tiny_manifests, tmp_path / "cache", sites=SOURCES[:2]))
    run_experiment(alone, tmp_path / "alone", progress=False)
    assert _same(_final(tmp_path / "run"), _final(tmp_path / "alone"))


def _context(tiny_manifests, tmp_path, sites=SOURCES, rows=None, sent=None, **cfg_overrides) -> Context:
    """The federation as a protocol sees it: ``rows[site]`` training rows reported (default 48 each)."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", **cfg_overrides))
    rows = {s: 48 for s in sites} | (rows or {})
    meta = {s: Reply(site=s, n_samples=rows[s], metrics={"n_train": rows[s]}) for s in sites}
    ctx = Context(cfg=cfg, transport=None, meta=meta, classes=["cardiomegaly"], aux_tasks=[], sources=list(sites),
                  target=None)
    ctx.sent = {s: dict(sent or {"lr": 1e-3, "batch_size": 16, "steps": 2, "local_keys": []}) for s in sites}
    return ctx


def _bn_theta0() -> dict:
    return {"w": torch.ones(4), "bn.running_mean": torch.zeros(3), "bn.running_var": torch.ones(3)}


def _bn_replies(theta0, sites, shift: dict | None = None) -> dict[str, Reply]:
    """Honest replies (weights + 0.01·(i+1), running means + 0.1·(i+1)); ``shift[site]`` more on its running mean."""
    out = {}
    for i, site in enumerate(sites):
        params = {"w": theta0["w"] + 0.01 * (i + 1), "bn.running_mean": theta0["bn.running_mean"] + 0.1 * (i + 1),
                  "bn.running_var": theta0["bn.running_var"].clone()}
        params["bn.running_mean"] = params["bn.running_mean"] + (shift or {}).get(site, 0.0)
        out[site] = Reply(site=site, params=params, n_samples=48, n_batches=2)
    return out


def test_bn_statistics_are_compared_with_the_other_replies_above_half_a_standard_deviation(tiny_manifests, tmp_path):
    """Refused: a shift above bn_factor (3) × the median of the others' and above 0.5 σ; kept: a shift
    within 0.5 σ however much larger than the others' (an honest outlier hospital), and any shift with only
    two replies (nobody can tell which one is wrong; the absolute bound of S3 still applies)."""
    theta0 = _bn_theta0()
    ctx = _context(tiny_manifests, tmp_path)
    kept = valid_replies(ctx, _bn_replies(theta0, SOURCES, {"midrc_style": 5.0}), theta0, 0)
    assert sorted(kept) == ["chexpert_style", "nih_style"]
    [entry] = ctx.refused
    assert entry["check"] == "norm" and entry["site"] == "midrc_style"
    assert entry["reason"] == ("BatchNorm running statistics moved 5.3 standard deviations (RMS over channels), "
                               "above 3 × the median of the round's other replies (0.15) and above 0.5 "
                               "(defences.bn_factor)")  # (0.3 + 5) σ, variance unchanged
    for shifts, refused in (((0.3, 0.35, 1.2), True),    # 3.7 × the others: refused (k = 10 let it pass)
                            ((0.01, 0.02, 0.45), False),  # 30 × the others, but within half a σ
                            ((0.3, 0.35, 0.9), False)):   # 2.8 ×
        ctx = _context(tiny_manifests, tmp_path)
        replies = _bn_replies(theta0, SOURCES)
        for site, value in zip(SOURCES, shifts):
            replies[site].params["bn.running_mean"] = theta0["bn.running_mean"] + value
        assert len(valid_replies(ctx, replies, theta0, 0)) == (2 if refused else 3), shifts
    ctx = _context(tiny_manifests, tmp_path, sites=SOURCES[:2])
    assert len(valid_replies(ctx, _bn_replies(theta0, SOURCES[:2], {"chexpert_style": 50.0}), theta0, 0)) == 2


def test_fedbn_keeps_bn_statistics_local_so_they_are_not_compared(tiny_manifests, tmp_path):
    theta0 = _bn_theta0()
    ctx = _context(tiny_manifests, tmp_path)
    for site in SOURCES:
        ctx.sent[site]["local_keys"] = ["bn.running_mean", "bn.running_var"]
    assert len(valid_replies(ctx, _bn_replies(theta0, SOURCES, {"midrc_style": 50.0}), theta0, 0)) == 3


# --------------------------------------------------------------------------- item 2: a lie about the size


def test_the_size_liar_of_issue_27_is_refused_and_capped(hostile, tiny_manifests, tmp_path):
    """Issue 27 item 2: 1000× its rows claimed in metadata and train replies, a large flipped update in
    round 0, zero updates after. It used to pass every check and hold ~99.6 % of FedAvg's weight. Now its
    round-0 update is judged by the step budget of the size it is credited with (at most the other sources'
    rows together) and refused; its later zero updates are credited at most half the round's weight."""
    root = _five_sites(tiny_manifests, tmp_path)
    data = _data(root, tmp_path / "cache", sites=FIVE, rounds=2, source={"lr": 2e-3, "batch_size": 16, "epochs": 1})
    run = hostile.hostile_run(load_config(data=data), tmp_path / "run", {"midrc_style": LIAR})
    assert run["status"] == "finished"
    assert [(e["round"], e["site"], e["check"]) for e in run["refused"]] == [(0, "midrc_style", "norm")]
    rows = _metrics(tmp_path / "run")
    cap = rows[1]["weight_cap"]["midrc_style"]
    honest = {s: n for s, n in rows[1]["n_samples"].items() if s != "midrc_style"}
    assert cap["claimed"] > 500 * max(honest.values())
    assert cap["credited"] == rows[1]["n_samples"]["midrc_style"] <= sum(honest.values())  # share ≤ 0.5
    assert "weight_cap" not in rows[0]  # refused in round 0: nothing to cap


def test_a_declared_size_or_an_implausible_one_stops_the_run_before_round_0(hostile, tiny_manifests, tmp_path):
    check_metadata_counts({"ok": Reply(site="ok", n_samples=10**8)})
    with pytest.raises(UserError, match=r"site evil .* n_samples claims 1000000000000 training rows, more than any "
                                        r"one site plausibly holds \(100,000,000\)"):
        check_metadata_counts({"evil": Reply(site="evil", n_samples=10**12)})
    with pytest.raises(UserError, match=r"claims 49 training rows, more than the 48 the consortium declared"):
        check_metadata_counts({"evil": Reply(site="evil", n_samples=49)}, {"evil": 48})
    data = _data(tiny_manifests, tmp_path / "cache", defences={"declared_sizes": {"midrc_style": 40}})
    with pytest.raises(UserError, match=r"site midrc_style answered the metadata query with n_samples claims \d+000 "
                                        r"training rows, more than the 40 the consortium declared"):
        hostile.hostile_run(load_config(data=data), tmp_path / "run", {"midrc_style": LIAR})


def test_declared_sizes_must_name_the_runs_sites(tiny_manifests, tmp_path):
    with pytest.raises(UserError, match=r"defences.declared_sizes: \['mdirc_style'\] not among the run's sites"):
        load_config(data=_data(tiny_manifests, tmp_path / "cache", defences={"declared_sizes": {"mdirc_style": 4}}))
    with pytest.raises(UserError, match=r"declared_sizes"):
        load_config(data=_data(tiny_manifests, tmp_path / "cache", defences={"declared_sizes": {"nih_style": True}}))


EPOCHS = {"lr": 1e-3, "batch_size": 16, "steps": None, "epochs": 1, "local_keys": []}


def _update_replies(theta0, sites, scale: dict | None = None, counts: dict | None = None) -> dict[str, Reply]:
    """Replies moving θ0 by 0.01·(1 + i/10)·scale[site]; 48 rows and 3 steps each unless ``counts`` says."""
    out = {}
    for i, site in enumerate(sites):
        step = 0.01 * (1 + i / 10) * (scale or {}).get(site, 1.0)
        fields = {"n_samples": 48, "n_batches": 3, **(counts or {}).get(site, {})}
        out[site] = Reply(site=site, params={k: v + step for k, v in theta0.items()}, **fields)
    return out


def test_a_claimed_size_does_not_buy_a_larger_update(tiny_manifests, tmp_path):
    """The liar reports 1000× the rows (metadata and reply) and 1000× the steps that allows, with an update
    100× the honest ones: per claimed step it looked 10× smaller than theirs and passed. Credited at most the
    other sources' rows (192), its step budget is 12, not 3000: 25× the honest statistic, refused."""
    sites = [*SOURCES, "dicom_style", "nih_copy"]
    ctx = _context(tiny_manifests, tmp_path, sites=sites, rows={"midrc_style": 48_000}, sent=EPOCHS)
    theta0 = {"w": torch.ones(8)}
    replies = _update_replies(theta0, sites, {"midrc_style": 100.0},
                              {"midrc_style": {"n_samples": 48_000, "n_batches": 3000}})
    kept = valid_replies(ctx, replies, theta0, 0)
    assert "midrc_style" not in kept and [e["check"] for e in ctx.refused] == ["norm"]


def test_no_site_is_credited_more_than_max_share_of_a_sample_weighted_round(tiny_manifests, tmp_path):
    sites = [*SOURCES, "dicom_style"]
    ctx = _context(tiny_manifests, tmp_path, sites=sites, rows={"midrc_style": 48_000}, sent=EPOCHS)
    theta0 = {"w": torch.ones(8)}
    replies = _update_replies(theta0, sites, counts={"midrc_style": {"n_samples": 48_000, "n_batches": 3}})
    kept = valid_replies(ctx, replies, theta0, 0)
    assert {s: r.n_samples for s, r in kept.items()} == {"nih_style": 48, "chexpert_style": 48, "midrc_style": 144,
                                                         "dicom_style": 48}
    assert ctx.notes["weight_cap"] == {"midrc_style": {"claimed": 48_000, "credited": 144}}
    assert kept["nih_style"] is replies["nih_style"]  # uncapped replies are passed on untouched
    honest = _update_replies(theta0, sites)
    assert all(valid_replies(ctx, honest, theta0, 1)[s] is honest[s] for s in sites)  # balanced: nothing capped


def test_most_replies_refused_two_rounds_in_a_row_stop_the_run_naming_the_site_that_passes(tiny_manifests,
                                                                                          tmp_path):
    """The pattern issue 27 saw after the size liar's update got in: the four honest sites refused in every
    later round, the liar never. One round with most replies refused goes on (several faults at once, as
    FLARE's E1); the second in a row stops the run, naming the sites that still pass."""
    sites = [*SOURCES, "dicom_style", "nih_copy"]
    ctx = _context(tiny_manifests, tmp_path, sites=sites, rows={"midrc_style": 48_000}, sent=EPOCHS)
    theta0 = {"w": torch.ones(8)}
    bad_steps = {s: {"n_batches": 10**6} for s in ("nih_style", "chexpert_style", "dicom_style")}
    assert len(valid_replies(ctx, _update_replies(theta0, sites, counts=bad_steps), theta0, 2)) == 2
    with pytest.raises(SuspectSite) as caught:
        valid_replies(ctx, _update_replies(theta0, sites, counts=bad_steps), theta0, 3)
    message = str(caught.value)
    assert "round 4: most replies were refused in rounds 3 and 4 (3 of 5 this round: chexpert_style, dicom_style, " \
           "nih_style; checks counts)" in message
    assert "likely culprit: midrc_style (never refused, reports 48000 training rows, 1000× the median of the " \
           "other sources); nih_copy (never refused)" in message
    ctx = _context(tiny_manifests, tmp_path, sites=sites, sent=EPOCHS)  # a round between: no stop
    for r in (0, 2):
        valid_replies(ctx, _update_replies(theta0, sites, counts=bad_steps), theta0, r)
    off = _context(tiny_manifests, tmp_path, sites=sites, sent=EPOCHS, defences={"stop_on_suspect": False})
    for r in (0, 1):
        assert len(valid_replies(off, _update_replies(theta0, sites, counts=bad_steps), theta0, r)) == 2


def test_a_site_refused_every_round_while_others_never_are_is_reported(hostile, tiny_manifests, tmp_path):
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache"))
    run = hostile.hostile_run(cfg, tmp_path / "run", {"midrc_style": {"*": "inflate"}})
    pattern = {"rounds": 2, "always_refused": ["midrc_style"], "never_refused": ["nih_style", "chexpert_style"]}
    assert run["refusal_pattern"] == pattern
    rows = _metrics(tmp_path / "run")
    assert "refusal_pattern" not in rows[0] and rows[1]["refusal_pattern"] == pattern
    assert "midrc_style refused in every round so far while nih_style, chexpert_style never were" in \
        (tmp_path / "run" / "train.log").read_text()


# --------------------------------------------------------------------------- item 3: robust rules per round


def _rule_context(tiny_manifests, tmp_path, **aggregation) -> Context:
    ctx = _context(tiny_manifests, tmp_path)
    ctx.cfg = ctx.cfg.model_copy(update={"aggregation": ctx.cfg.aggregation.model_copy(update=aggregation)})
    return ctx


def test_trimmed_mean_over_fewer_replies_still_cuts_one_per_side_and_says_so(tiny_manifests, tmp_path):
    """trim 0.2 over 5 cuts 1 per side; over 4 (a reply lost) int(0.8) = 0 made it the plain mean: 53/4."""
    ctx = _rule_context(tiny_manifests, tmp_path, rule="trimmed_mean", trim=0.2)
    states = [{"w": torch.tensor([x])} for x in (0.0, 1.0, 2.0, 50.0)]
    merged = robust_average(ctx, ["a", "b", "c", "d"], states, [1.0] * 4, {"w": torch.zeros(1)})
    assert torch.equal(merged["w"], torch.tensor([1.5]))  # (1 + 2) / 2
    [note] = ctx.notes["aggregation"]
    assert note["trimmed_per_side"] == 1 and note["fallback"] == "int(0.2·4) = 0 would be the plain mean; cut 1 per side"
    ctx.notes = {}
    robust_average(ctx, list("abcde"), states + [{"w": torch.tensor([3.0])}], [1.0] * 5, {"w": torch.zeros(1)})
    assert ctx.notes["aggregation"] == [{"rule": "trimmed_mean", "trimmed_per_side": 1}]


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "multi_krum"])
def test_a_robust_rule_left_with_two_replies_fails_the_round_instead_of_averaging_them(tiny_manifests, tmp_path,
                                                                                        rule):
    ctx = _rule_context(tiny_manifests, tmp_path, rule=rule, byzantine=0, trim=0.4)
    states = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([50.0])}]
    with pytest.raises(RoundFailed, match=rf"aggregation.rule {rule} needs at least 3 valid replies and this round "
                                          r"has 2 \(a, b;"):
        robust_average(ctx, ["a", "b"], states, [1.0, 1.0], {"w": torch.zeros(1)})


def test_a_median_run_that_loses_a_reply_stops_instead_of_averaging_two(hostile, tiny_manifests, tmp_path):
    """Issue 27 item 3: median over 3 sources with one refused was the mean of the other two, said nowhere."""
    cfg = load_config(data=_data(tiny_manifests, tmp_path / "cache", aggregation="median", rounds=1))
    with pytest.raises(RoundFailed, match="aggregation.rule median needs at least 3 valid replies"):
        hostile.hostile_run(cfg, tmp_path / "run", {"chexpert_style": {0: "huge"}})
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "stopped" and [e["site"] for e in run["refused"]] == ["chexpert_style"]
