"""The report says which sites were refused in which rounds and why (issue 27 item 4)."""

from __future__ import annotations

import pytest

from fedcxr.evaluation.report_markdown import render_markdown
from fedcxr.evaluation.report_refusals import MAX_ENTRIES, rounds_text, training_record, training_section


def _refused(site, r, check, reason="why"):
    return {"round": r, "task": "train", "site": site, "check": check, "reason": reason}


def test_refusals_and_absences_are_summarised_per_site():
    info = {"status": "finished",
            "refused": [_refused("evil", r, "norm", f"update norm {r}") for r in (0, 1, 2, 4)]
            + [_refused("evil", 5, "counts"), _refused("odd", 3, "values", "NaN")],
            "missed": [{"round": 0, "task": "train", "site": "evil", "reason": "rejected: update norm 0"},
                       {"round": 2, "task": "train", "site": "slow"}, {"round": 3, "task": "train", "site": "slow"}],
            "refusal_pattern": None}
    record = training_record(info)
    assert record["refused"] == [
        {"site": "evil", "n": 5, "rounds": [0, 1, 2, 4, 5], "checks": {"norm": 4, "counts": 1},
         "reason": "update norm 0"},
        {"site": "odd", "n": 1, "rounds": [3], "checks": {"values": 1}, "reason": "NaN"}]
    assert record["missed"] == [{"site": "slow", "n": 2, "rounds": [2, 3], "why": {"no reply": 2}, "first": {}}]
    # a refusal is not an absence; report.json keeps run.json's 0-based round indices, report.md counts from 1
    text = "\n".join(training_section({"training": record}))
    assert "refused 6 replies of 2 sites" in text
    assert "| evil | 5 | 1–3, 5–6 | counts × 1, norm × 4 | update norm 0 |" in text
    assert "| slow | 2 | 3–4 | no reply × 2 |" in text


def test_missed_rounds_say_late_dropped_out_error_or_refused_and_the_simulated_clock():
    """Issue 31: a missed round says why — late (deadline), dropped out, an error, refused by the transport."""
    info = {"status": "finished", "refused": [], "sources": [f"s{i}" for i in range(10)],
            "config": {"participation": {"fraction": 0.3, "min_sites": 2, "deadline_s": 600.0}},
            "simulated": {"clock_s": 7200.0, "round_s": [2400.0, 2400.0, 2400.0], "deadline_s": 600.0},
            "missed": [{"round": 0, "task": "train", "site": "s1", "why": "late", "reason": "reply at 700 s"},
                       {"round": 2, "task": "train", "site": "s1", "why": "dropped", "reason": "dropped out"},
                       {"round": 1, "task": "train", "site": "s2", "why": "error", "reason": "error: code 5"},
                       {"round": 1, "task": "train", "site": "s3", "why": "refused", "reason": "wire: NaN"},
                       {"round": 1, "task": "train", "site": "s4", "why": "<script>", "reason": "?"}]}
    record = training_record(info)
    assert {row["site"]: row["why"] for row in record["missed"]} == {
        "s1": {"late (deadline)": 1, "dropped out": 1}, "s2": {"error": 1}, "s3": {"refused": 1},
        "s4": {"no reply": 1}}
    assert record["consortium"] == {"fraction": 0.3, "min_sites": 2.0, "deadline_s": 600.0, "sources": 10,
                                    "clock_s": 7200.0, "rounds": 3}
    text = "\n".join(training_section({"training": record}))
    assert "| s1 | 2 | 1, 3 | dropped out × 1, late (deadline) × 1 (first: reply at 700 s) |" \
        in text  # report.md counts rounds from 1
    assert "| s4 | 1 | 2 | no reply × 1 (first: ?) |" in text  # an unknown kind is read as no reply
    assert "Each round asked a share of 0.3 of the 10 sources (at least 2" in text
    assert "a site that was not asked did not miss the round" in text
    assert "closed at 600 s; on the simulated clock (`simulate:`) the 3 rounds took 7200.0 s (2.00 h)." in text
    plain = training_record({"refused": [], "missed": [], "config": {"participation": {"fraction": 1.0}}})
    assert plain["consortium"] is None
    hostile = training_record({"refused": [], "missed": [], "simulated": {"clock_s": "1e999", "round_s": "x"},
                               "config": {"participation": {"fraction": float("nan")}}})
    assert hostile["consortium"] is None


def test_a_run_without_refusals_says_so_and_an_old_run_json_adds_nothing():
    assert training_section({"training": training_record({"refused": [], "missed": []})}) == [
        "## Training: refused and missed replies", "",
        "Every site answered every training task and no reply was refused.", ""]
    assert training_record({"method": "FedAvg"}) is None and training_section({"training": None}) == []


def test_run_json_is_read_as_hostile_input():
    """Malformed entries are skipped and counted; text is bounded and escaped; the list is read up to a bound."""
    info = {"refused": [_refused("| =HYPERLINK(\"x\") |\n# head", 0, "norm", "r" * 10_000), "junk",
                        {"round": True, "site": "a"}, {"round": -1, "site": "a"}, {"round": 1, "site": ["a"]}],
            "missed": None, "refusal_pattern": {"rounds": "2", "always_refused": [], "never_refused": []}}
    record = training_record(info)
    assert record["skipped"] == 4 and record["pattern"] is None
    [row] = record["refused"]
    assert len(row["reason"]) == 300
    text = "\n".join(training_section({"training": record}))
    assert "\n# head" not in text  # a line break would start a heading
    assert "\n| \\| =HYPERLINK(\"x\") \\| # head | 1 | 1 | norm × 1 | rrr" in text  # the cell's pipes escaped
    assert "4 entries of `run.json`" in text
    many = training_record({"refused": [_refused("a", 0, "norm")] * (MAX_ENTRIES + 5)})
    assert many["refused"][0]["n"] == MAX_ENTRIES and many["skipped"] == 5


def test_a_site_that_missed_rounds_is_named_with_the_rounds_and_why():
    """Issue 31: report.md listed a FLARE site among the training sites without a word about the rounds it missed
    after its client was killed."""
    info = {"status": "finished", "sites": ["hospital_a", "hospital_b"], "refused": [],
            "missed": [{"round": 1, "task": "train", "site": "hospital_a", "reason": "no answer within 20 s"},
                       {"round": 2, "task": "train", "site": "hospital_a", "reason": "disconnected"},
                       {"round": 3, "task": "train", "site": "hospital_a", "reason": "disconnected"}]}
    text = "\n".join(training_section({"training": training_record(info)}))
    # a run.json written before kinds were kept: the kind read from FLARE's reason, the first reason quoted
    assert "| hospital_a | 3 | 2–4 | dropped out × 2 (first: disconnected), late (deadline) × 1 (first: no answer " \
           "within 20 s) |" in text
    assert "(on FLARE, \"disconnected\": the server had lost the site's client and did not ask it)" in text
    info["missed"] = [{"round": 1, "task": "train", "site": "h", "why": "late",
                       "reason": "no reply within 4 s (--timeout)"},
                      {"round": 2, "task": "train", "site": "h", "why": "dropped", "reason": "disconnected"}]
    assert "| h | 2 | 2–3 | dropped out × 1 (first: disconnected), late (deadline) × 1 (first: no reply within 4 s " \
           "(--timeout)) |" in "\n".join(training_section({"training": training_record(info)}))
    many = [{"round": r, "task": "train", "site": "a", "why": "late", "reason": f"reason {r}"} for r in range(50)]
    row = training_record({"missed": many})["missed"][0]
    assert row["why"] == {"late (deadline)": 50} and row["first"] == {"late (deadline)": "reason 0"}  # bounded


def test_round_lists_are_compressed_and_bounded():
    assert rounds_text([0, 1, 2, 4, 7, 8]) == "1–3, 5, 8–9"  # run.json's indices, counted from 1
    assert rounds_text(list(range(0, 100, 2))).endswith(", … (50 rounds)")


@pytest.mark.slow  # a hostile training run and an evaluation: ~6 s
def test_the_report_of_a_run_with_refusals_names_them(tiny_manifests, tmp_path):
    """Issue 27: report.md of a run where a site was refused 12 times never mentioned a refusal."""
    from fedcxr.cli import main
    from fedcxr.pipeline.config import load_config

    from ..benchmarks.conftest import load_bench
    from ..conftest import tiny_config

    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg", target=None, eval_every=0,
                       sites=["nih_style", "chexpert_style", "midrc_style"],
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly", "pneumonia"]})
    load_bench("hostile_sites").hostile_run(load_config(data=data), tmp_path / "run", {"midrc_style": {"*": "inflate"}})
    assert main(["evaluate", str(tmp_path / "run"), "--bootstrap", "0", "-q", "--device", "cpu"]) == 0
    text = (tmp_path / "run" / "report.md").read_text()
    assert "## Training: refused and missed replies" in text
    assert "| midrc_style | 2 | 1–2 | counts × 2 | n_samples claims 1000000000000, more than the" in text
    assert "midrc_style had a reply refused in every round while nih_style, chexpert_style never did" in text
    assert "refused" not in render_markdown({**_minimal_report(), "training": None})


def _minimal_report() -> dict:
    return {"method": "FedAvg", "seed": 0, "target": None, "split": "test", "sites": {}, "train_sites": [],
            "classes": ["a"], "ci": {"level": 0.95, "n_boot": 0, "seed": 0}}
