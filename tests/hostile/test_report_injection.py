"""Hostile text in reports (SECURITY.md E1-E4): names, methods and reasons from run directories, exports
and other sites' summaries never run as a spreadsheet formula, never become Markdown/HTML structure and
never break a plot; a site's summary with impossible numbers or unknown text is refused and named.
"""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedcxr.cli import main
from fedcxr.escape import FORMULA_START
from fedcxr.evaluation.report import evaluate_rows, subgroup_analysis
from fedcxr.evaluation.report_table import build_summary_report, write_summary_report
from fedcxr.evaluation.summary_check import summary_problem

from ..evaluation.conftest import CLASSES, synthetic_predictions, write_run

#: site and method names an export, a run directory or a FLARE client could carry
HOSTILE_SITES = ["$\\foo$ <img src=x onerror=alert(1)>", '=HYPERLINK("http://evil.example/x","click")|b\n## Injected']
HOSTILE_METHOD = "<script>alert(1)</script>\n# Owned"


def _csv_cells(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as handle:
        return [cell for row in csv.reader(handle) for cell in row]


def assert_no_formula(path: Path) -> None:
    bad = [c for c in _csv_cells(path) if c.lstrip(" ").startswith(FORMULA_START)]
    assert not bad, f"{path.name}: cells a spreadsheet would run: {bad[:3]}"


def assert_inert_markdown(text: str, *, tables: bool = True) -> None:
    """No raw HTML, no injected heading, no link/image, every table row with its header's number of cells."""
    assert "<img" not in text and "<script" not in text and "</" not in text
    assert not any(re.match(r"#+ (Injected|Owned)", line) for line in text.splitlines()), "an injected heading"
    assert "](http://evil" not in text
    if tables:
        width = None
        for line in text.splitlines():
            if not line.startswith("|"):
                width = None
                continue
            cells = len(re.split(r"(?<!\\)\|", line)) - 2
            width = cells if width is None else width
            assert cells == width, f"a table row with {cells} cells under a header of {width}: {line[:80]}"


def test_hostile_site_and_method_names_do_not_break_evaluate_nor_reach_its_reports_raw(tmp_path, capsys):
    run = write_run(tmp_path / "run", synthetic_predictions(sites=HOSTILE_SITES, patients_per_site=25),
                    method=HOSTILE_METHOD)
    code = main(["evaluate", str(run), "--bootstrap", "0", "-q"])
    assert code == 0, capsys.readouterr().err  # a `$\foo$` site crashed matplotlib's mathtext half-way
    report = json.loads((run / "report.json").read_text())
    assert set(report["sites"]) == set(HOSTILE_SITES), "report.json keeps the names as they are (JSON escapes itself)"
    assert_no_formula(run / "per_class.csv")
    assert "'=HYPERLINK" in (run / "per_class.csv").read_text()
    text = (run / "report.md").read_text()
    assert_inert_markdown(text)
    assert "## Site \\$\\\\foo\\$ &lt;img src=x onerror=alert(1)>" in text and "\\|b ## Injected" in text
    assert len(list(run.glob("roc_*.png"))) == len(HOSTILE_SITES) == len(list(run.glob("calibration_*.png")))


def test_the_comparison_table_escapes_method_and_site_names(tmp_path):
    from fedcxr.evaluation.compare import compare_runs, write_comparison

    frame = synthetic_predictions(sites=HOSTILE_SITES[:3], patients_per_site=25)
    runs = [write_run(tmp_path / name, frame, method=method)
            for name, method in (("a", HOSTILE_METHOD), ("b", '=HYPERLINK("http://evil.example")'))]
    paths = write_comparison(compare_runs(runs, baseline=HOSTILE_METHOD, n_boot=0), tmp_path / "cmp")
    for path in paths:
        if path.suffix == ".csv":
            assert_no_formula(path)
    assert_inert_markdown((tmp_path / "cmp" / "comparison.md").read_text())


def test_a_hostile_file_name_never_becomes_a_formula_in_set_aside_csv(tmp_path):
    from fedcxr.site_adapters.ingest import run_ingest

    folder = tmp_path / "scans"
    folder.mkdir()
    Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16), "L").save(folder / "ok.png")
    (folder / '=HYPERLINK("http;evil",1).png').write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 40)
    report = run_ingest("images", folder, tmp_path / "out", site_name="input", progress=False)
    assert report["rows_set_aside"] == 1
    assert_no_formula(tmp_path / "out" / "set_aside.csv")


# --------------------------------------------------------------------------- FLARE site summaries


@pytest.fixture(scope="module")
def honest_summary() -> dict:
    """A site's summary exactly as :func:`fedcxr.flare.site_evaluation.summarize` builds it, after the wire (JSON)."""
    from fedcxr.evaluation import calibration

    frame = synthetic_predictions(sites=["site-a"], patients_per_site=40)
    entry = evaluate_rows(frame, CLASSES, n_boot=20, seed=0, split="test", binary=False)
    entry["subgroups"] = subgroup_analysis(frame, CLASSES, n_boot=20, seed=0, split="test", binary=False)
    entry["calibration"] = calibration.calibration_summary(frame, CLASSES, split="test")
    from fedcxr.atomic import json_safe

    return json.loads(json.dumps(json_safe(entry)))


def _set(path: str, value):
    def change(summary: dict) -> dict:
        node = summary
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        return summary
    return change


HOSTILE_SUMMARIES = {
    "AUROC 42": _set("per_class.0.auroc", 42.0),
    "AUROC -7": _set("per_class.0.auroc", -7.0),
    "mean AUROC as text": _set("mean_auroc", "0.99"),
    "negative count": _set("per_class.1.n", -3),
    "fractional count": _set("n_rows", 12.5),
    "more positives than rows": _set("per_class.1.n_pos", 10**6),
    "formula reason": _set("per_class.4.reason", '=HYPERLINK("http://evil.example","x")'),
    "html reason": _set("mean_auroc_reason", "<img src=x onerror=alert(1)>"),
    "heading reason": _set("per_class.4.reason", "no labeled rows in test split\n## Injected"),
    "unknown field": _set("note", "hello"),
    "unknown subgroup value": _set("subgroups.sex.skipped", [{"value": "Martian", "n_rows": 3, "reason": None}]),
    "calibration ECE 3": _set("calibration.pooled.ece", 3.0),
    "boolean count": _set("n_patients", True),
}


def test_an_honest_summary_passes(honest_summary):
    assert summary_problem(honest_summary, CLASSES) is None
    reasons = [r["reason"] for r in honest_summary["per_class"]]
    assert "no positive rows in test split" in reasons, "the all-negative class exercises a known reason"


@pytest.mark.parametrize("name", sorted(HOSTILE_SUMMARIES))
def test_a_summary_with_impossible_numbers_or_unknown_text_is_refused(honest_summary, name):
    summary = HOSTILE_SUMMARIES[name](copy.deepcopy(honest_summary))
    problem = summary_problem(summary, CLASSES)
    assert problem is not None and len(problem) < 300


def test_a_refused_summary_is_named_in_the_report_and_none_of_its_text_is_written(honest_summary, tmp_path):
    hostile = HOSTILE_SUMMARIES["formula reason"](copy.deepcopy(honest_summary))
    hostile["per_class"][0]["auroc"] = 42.0
    info = {"method": "FedAvg", "seed": 0, "target": None, "classes": CLASSES, "sites": ["good", "evil"],
            "eval_sites": ["good", "evil"]}
    report = build_summary_report({"good": honest_summary, "evil": hostile}, info, split="test", n_boot=20, seed=0)
    assert list(report["sites"]) == ["good"]
    reason = {item["site"]: item["reason"] for item in report["sites_without_predictions"]}["evil"]
    assert reason.startswith("unusable summary from the site: ") and "outside [0, 1]" in reason
    write_summary_report(tmp_path, report)
    for name in ("per_class.csv", "report.md", "report.json"):
        assert "HYPERLINK" not in (tmp_path / name).read_text(), name
    assert "42" not in (tmp_path / "per_class.csv").read_text() and "evil" not in (tmp_path / "per_class.csv").read_text()
