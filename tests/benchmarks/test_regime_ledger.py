"""``benchmarks/regime_ledger.py``: the committed record of the regime map's finished runs, which a new
checkout (with no runs folder) resumes from."""

from __future__ import annotations

import pandas as pd
import pytest

from .conftest import load_bench

COLUMNS = ["shift", "labels", "rounds", "method", "seed", "auroc", "chosen"]


def runs(*rows: tuple) -> pd.DataFrame:
    return pd.DataFrame([("none", 10, 20, m, s, a, None) for m, s, a in rows], columns=COLUMNS)


def test_the_ledger_keeps_its_published_row_and_names_a_run_that_now_scores_otherwise(capsys):
    ledger = load_bench("regime_ledger")
    known, found = runs(("A", 0, 0.80), ("A", 1, 0.70)), runs(("A", 1, 0.75), ("B", 0, 0.60))
    merged = ledger.merge(known, found, "epoch1")
    assert sorted(zip(merged["method"], merged["seed"], merged["auroc"])) == [("A", 0, 0.8), ("A", 1, 0.7),
                                                                               ("B", 0, 0.6)]
    said = capsys.readouterr().out
    assert "1 row(s)" in said and "method=A seed=1" in said
    ledger.merge(known, runs(("A", 1, 0.70)), "epoch1")  # the same score: nothing to say
    assert capsys.readouterr().out == ""


def test_adding_a_variants_runs_leaves_the_other_variants_and_the_file_round_trips(tmp_path):
    ledger = load_bench("regime_ledger")
    table = ledger.load(tmp_path / "absent.csv", COLUMNS)
    assert table.empty and list(table.columns) == ["variant", *COLUMNS]
    table = ledger.add(table, runs(("A", 0, 0.8)), "epoch1")
    table = ledger.add(table, runs(("A", 0, 0.5), ("A", 1, 0.6)), "steps8")
    table = ledger.add(table, runs(("A", 0, 0.8), ("B", 0, 0.9)), "epoch1")  # the variant's rows, all of them
    ledger.save(table, tmp_path / "ledger.csv")
    back = ledger.load(tmp_path / "ledger.csv", COLUMNS)
    assert len(back) == 4 and len(ledger.rows_of(back, "steps8")) == 2
    assert ledger.keys(ledger.rows_of(back, "epoch1")) == {("none", 10, 20, "A", 0), ("none", 10, 20, "B", 0)}


def test_a_ledger_without_a_column_the_runs_need_is_refused_by_name(tmp_path):
    ledger = load_bench("regime_ledger")
    runs(("A", 0, 0.8)).drop(columns="auroc").assign(variant="epoch1").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(SystemExit, match=r"bad.csv.*\['auroc'\]"):
        ledger.load(tmp_path / "bad.csv", COLUMNS)
