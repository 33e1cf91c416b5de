"""Smoke test of ``benchmarks/bench_consortium.py`` on real PneumoniaMNIST: four iid sites instead of 100,
one round, half of them asked, a deadline at the median reply time and none — table, CSVs and figure."""

from __future__ import annotations

import pandas as pd
import pytest

from .conftest import load_bench


@pytest.mark.slow  # two ingests, two runs and their evaluations (~10 s on 2 cores)
def test_the_planner_table_and_figure_on_four_sites(small_npz, tmp_path, one_torch_thread):
    bench = load_bench("bench_consortium")
    out = tmp_path / "results"
    frame = bench.main(["--npz", str(small_npz), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--sites", "4", "--fractions", "0.5", "--deadlines", "p50", "p90", "none", "--seeds", "1",
                        "--rounds", "1", "--step-s", "0.05"])
    assert list(frame["deadline"]) == ["p50", "p90", "none"]
    by = frame.set_index("deadline")
    # p50: both asked sites of this seed's draw reply after the median: the round fails, the run stops
    # in round 1 and is counted as stopped, not lost
    assert by.loc["p50", "status"] == "stopped" and by.loc["p50", "rounds_done"] == 0
    done = by.loc[["p90", "none"]]
    assert set(done["status"]) == {"finished"} and done["auroc"].between(0, 1).all()
    assert (done["replies_per_round"] <= 2).all()
    assert by.loc["p90", "deadline_s"] == bench.deadline_for("p90", 0.05)
    assert by.loc["p90", "sim_minutes"] <= by.loc["p90", "deadline_s"] / 60 + 1e-9, "closed at its deadline at the latest"
    table = pd.read_csv(out / "consortium.csv")
    assert list(table["deadline"]) == ["p50", "p90", "none"] and table["n"].tolist() == [1, 1, 1]
    text = (out / "consortium.md").read_text()
    assert "| 0.5 | p90 (" in text and "| 0.5 | none |" in text and '"step_s_measured": false' in text
    assert (out / "consortium.png").stat().st_size > 1000
