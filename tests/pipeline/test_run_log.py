"""The round line of ``fedcxr.pipeline.run_log``: readable at any number of sites, and no validation
AUROC printed where a site's split cannot support one (issue 31 item 4)."""

from __future__ import annotations

from fedcxr.pipeline.run_log import round_line, val_supported


def _hundred_sites() -> dict:
    """A fake round of 100 sites: site-i's loss rises with i, so site-100, 99, 98 are the worst."""
    sites = [f"site-{i}" for i in range(1, 101)]
    return {
        "round": 9, "seconds": 12.34,
        "train": {s: {"loss": 0.3 + i / 1000, "main_loss": 0.3} for i, s in enumerate(sites, 1)},
        "val": {s: {"mean_auroc": 0.6 + i / 1000, "auroc": {"Pneumonia": 0.6 + i / 1000},
                    "cases": {"Pneumonia": [3 if i % 10 == 0 else 25, 40]}} for i, s in enumerate(sites, 1)},
        "missed": [{"round": 9, "task": "train", "site": "site-7"}, {"round": 9, "task": "train", "site": "site-8"}],
        "refused": [{"round": 9, "task": "train", "site": "site-9", "check": "norm", "reason": "too long"}],
    }


def test_a_hundred_site_round_is_one_short_line_naming_the_worst_sites():
    line = round_line(_hundred_sites(), 10)
    assert len(line) < 210, line
    assert line.startswith("round 10/10 (12.3 s): loss median 0.350 (0.301–0.400) of 100, "
                           "worst site-100 0.400, site-99 0.399, site-98 0.398; 2 missed, 1 refused; "), line
    # the ten sites with 3 positive patients are counted, not printed: site-1 is the lowest that can be
    assert line.endswith("val AUROC median 0.650 of 90, lowest site-1 0.601, 10 too few cases"), line
    assert "site-50" not in line and "site-10 " not in line


def test_a_few_sites_are_each_named_as_before():
    metrics = {"round": 2, "seconds": 4.21, "train": {"a": {"loss": 0.6123}, "b": {"loss": None}},
               "target": {"loss": 0.65}, "val": {"c": {"mean_auroc": 0.7129}, "d": {"mean_auroc": None}},
               "missed": [{"round": 2, "task": "train", "site": "b"}]}
    assert round_line(metrics, 10) == ("round 3/10 (4.2 s): loss a 0.612, b n/a, target 0.650; missed b; "
                                       "val AUROC c 0.713, d n/a")


def test_a_validation_auroc_the_split_cannot_support_is_not_printed():
    supported = {"mean_auroc": 0.71, "auroc": {"A": 0.7, "B": 0.72}, "cases": {"A": [10, 12], "B": [30, 40]}}
    one_short = {"mean_auroc": 0.99, "auroc": {"A": 0.98, "B": 1.0}, "cases": {"A": [10, 12], "B": [2, 40]}}
    few_negatives = {"mean_auroc": 0.5, "auroc": {"A": 0.5}, "cases": {"A": [50, 9]}}
    undefined_class = {"mean_auroc": 0.7, "auroc": {"A": 0.7, "B": float("nan")}, "cases": {"A": [10, 10], "B": [0, 5]}}
    assert [val_supported(e) for e in (supported, one_short, few_negatives, undefined_class)] == [
        True, False, False, True]
    line = round_line({"round": 0, "val": {"s1": supported, "s2": one_short, "s3": few_negatives}}, 1)
    assert line == "round 1/1: val AUROC s1 0.710, s2 too few cases, s3 too few cases"
    assert "0.990" not in line and "0.500" not in line


def test_a_row_written_before_sites_counted_cases_prints_its_auroc():
    assert round_line({"round": 0, "val": {"s": {"mean_auroc": 0.8, "auroc": {"A": 0.8}}}}, 1) == \
        "round 1/1: val AUROC s 0.800"


def test_a_summarised_line_says_when_no_site_can_report_a_validation_auroc():
    """100 sites of ~5 validation images: none supports an AUROC, some have one class only (n/a)."""
    metrics = _hundred_sites()
    for i, entry in enumerate(metrics["val"].values()):
        entry["cases"] = {"Pneumonia": [2, 3]}
        if i % 10 < 3:
            entry["mean_auroc"], entry["auroc"], entry["cases"] = float("nan"), {"Pneumonia": float("nan")}, \
                {"Pneumonia": [0, 5]}
    assert round_line(metrics, 10).endswith("; val AUROC none: 30 n/a, 70 too few cases")
