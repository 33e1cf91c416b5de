"""Smoke test of ``benchmarks/bench_adaptive.py`` on a slice of real PneumoniaMNIST: five sources, one round,
the honest run and the BatchNorm shift — the runs, the scoring, the results file and the table."""

from __future__ import annotations

import json

import pytest

from .conftest import load_bench

pytestmark = pytest.mark.slow  # two small training runs: ~10 s of CPU


def test_the_bn_shift_is_refused_and_the_table_reports_both_runs(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_adaptive")
    work = tmp_path / "work"
    bench.main(["--npz", str(small_npz), "--work", str(work), "--label", "after", "--rounds", "1",
                "--attacks", "none", "bn_shift"])
    results = {r["attack"]: r for r in json.loads((work / "results-after.json").read_text())}
    assert results["none"]["status"] == "finished" and results["none"]["refused"] == 0
    assert results["bn_shift"]["status"] == "finished" and results["bn_shift"]["refused"] == 1
    assert 0 <= results["bn_shift"]["auroc"] <= 1
    table = bench.table(work)
    assert "| `bn_shift` | – | " in table and "1 refused/run" in table
