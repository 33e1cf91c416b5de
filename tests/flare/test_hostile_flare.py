"""A hostile site over NVIDIA FLARE: the same defences and the same robust rule as in-process.

The ``hostile`` experiment of the simulator job this folder's tests share (``flare_runs`` in
``conftest.py``): FedAvg over four sources with ``aggregation: median``; the job's test client
script, with the very function the in-process tests use (``benchmarks/hostile_sites.py``'s
``corrupt``), makes one site send a 1e30 update in round 0 and another claim 10¹² samples in
round 1. The in-process run through ``HostileTransport`` with the same faults is the reference.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("nvflare")

from ..benchmarks.conftest import load_bench  # noqa: E402
from .conftest import HOSTILE_FAULTS, final_model, max_diff  # noqa: E402


def test_flare_refuses_the_hostile_replies_and_ends_with_the_in_process_median_model(flare_runs):
    cfg, run_dir = flare_runs.exps["hostile"], flare_runs.dirs["hostile"]
    reference = load_bench("hostile_sites").hostile_run(cfg, flare_runs.root / "hostile-in-process", HOSTILE_FAULTS)
    flare = flare_runs.payloads["hostile"]

    expected = [(0, "chexpert_style", "train", "norm"), (1, "midrc_style", "train", "counts")]
    for run in (reference, flare):
        assert run["status"] == "finished"
        assert [(e["round"], e["site"], e["task"], e["check"]) for e in run["refused"]] == expected
    assert [e["reason"] for e in flare["refused"]] == [e["reason"] for e in reference["refused"]]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [[e["site"] for e in row["refused"]] for row in rows] == [["chexpert_style"], ["midrc_style"]]
    assert [row["aggregation"][0]["rule"] for row in rows] == ["median", "median"]
    got, want = final_model(run_dir)["global"], final_model(flare_runs.root / "hostile-in-process")["global"]
    assert max_diff(got, want) <= 1e-5
