"""``benchmarks/regime_map.py``: the planned parts (each ~30 min, every planned seed once), and a smoke run on
real PneumoniaMNIST — a label-free method trained once for two label counts, the tables, the heatmap and the
map rows ``build_regime_map.py`` writes from them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedcxr.advice import regime

from .conftest import load_bench


def test_every_grid_is_cut_into_parts_that_fit_the_budget_and_run_each_planned_seed_once():
    maps = load_bench("regime_map")
    for grid, spec in maps.grids().items():
        parts = maps.parts(grid)
        seeds: dict[tuple, list[int]] = {}
        for name, part in parts.items():
            assert name.startswith(f"{grid}:") and (part["est_s"] <= maps.PART_SECONDS * 1.05 or len(part["seeds"]) == 1)
            seeds.setdefault(part["cell"], []).extend(part["seeds"])
        assert set(seeds) == set(spec["cells"]), grid
        assert all(sorted(s) == list(range(maps.SEEDS)) for s in seeds.values()), grid  # the same seeds everywhere
    assert set(maps.CORE) <= set(maps.grids()["map"]["cells"])
    plan = maps.plan_table().set_index("grid")
    assert plan.loc["map", "cells"] == 40 and plan.loc["core", "cells"] == len(maps.CORE)
    assert plan.loc["map", "est_hours"] > plan.loc["core", "est_hours"] > 0


def test_the_plan_counts_the_parts_left_and_corrects_their_estimate_by_the_measured_pace(tmp_path, capsys):
    maps = load_bench("regime_map")
    first, second, third = list(maps.parts("core"))[:3]
    est = {n: maps.parts("core")[n]["est_s"] for n in (first, second, third)}
    full = len(maps.METHODS) * len(maps.parts("core")[first]["seeds"])
    log = tmp_path / f"{maps.STEM}_parts.csv"
    pd.DataFrame([  # two full parts at half and at a quarter of their estimate; a re-run over finished runs
        {"part": first, "wall_s": est[first] / 2, "est_s": est[first], "new_runs": full},
        {"part": second, "wall_s": est[second] / 4, "est_s": est[second], "new_runs": full},
        {"part": third, "wall_s": 1, "est_s": est[third], "new_runs": 2}]).to_csv(log, index=False)
    assert maps.parts("core")[first]["cell"] == maps.parts("core")[second]["cell"] != maps.parts("core")[third]["cell"]
    plan = maps.plan_table(log).set_index("grid")
    # the first cell's two parts are logged: done; the third's cell is open and no ledger holds its runs
    left = [p for n, p in maps.parts("core").items() if n not in (first, second)]
    assert plan.loc["core", "parts_left"] == len(maps.parts("core")) - 2
    assert plan.loc["core", "pace"] == 0.38  # the median of the full parts: the quick re-run says nothing
    assert plan.loc["core", "left_hours"] == round(0.375 * sum(p["est_s"] for p in left) / 3600, 1)
    assert pd.isna(plan.loc["kermany", "pace"]) and pd.isna(plan.loc["kermany", "left_hours"])  # not timed yet
    # the map trains the core's runs in the core's cells, and runs like them elsewhere: done there, and its pace
    assert plan.loc["map", "parts_left"] == len(maps.parts("map")) - 2
    assert plan.loc["map", "pace"] == 0.38 and plan.loc["map", "pace_of"] == "core"
    maps.main(["--list", "--left", "--grid", "core", "--out", str(tmp_path)])
    listed = capsys.readouterr().out.split()
    assert listed == [n for n in maps.parts("core") if n not in (first, second)]


def test_a_part_logged_in_another_checkout_is_trained_again_unless_the_ledger_holds_its_runs(tmp_path, capsys):
    """The runs folder is a cache a new checkout lacks: a part of an open cell that the log calls done
    but whose runs no ledger holds must be listed again, and one whose runs the ledger holds must not."""
    maps = load_bench("regime_map")
    part_names = [n for n, p in maps.parts("core").items() if p["cell"] == ("mix4", 50, 50)]
    first, rest = part_names[0], part_names[1:]
    log = tmp_path / f"{maps.STEM}_parts.csv"
    pd.DataFrame([{"part": first, "wall_s": 60, "est_s": 100, "new_runs": 24}]).to_csv(log, index=False)
    maps.main(["--list", "--left", "--grid", "core", "--out", str(tmp_path)])
    assert set(part_names) <= set(capsys.readouterr().out.split())  # logged, cell open, no ledger: again
    runs = [{"shift": "mix4", "labels": 50, "rounds": 50, "method": m, "seed": s, "label_draw": s, "auroc": 0.9,
             "val_auroc": 0.9, "target_passes": 50, "wall_s": 1.0, "chosen": None}
            for m in maps.METHODS for s in maps.parts("core")[first]["seeds"]]
    ledger = maps.regime_ledger.add(maps.regime_ledger.load(tmp_path / "none.csv", maps.bench_regime.RUN_COLUMNS),
                                    pd.DataFrame(runs[:-1]), maps.VARIANT)  # one run short
    maps.regime_ledger.save(ledger, tmp_path / maps.LEDGER)
    maps.main(["--list", "--left", "--grid", "core", "--out", str(tmp_path)])
    assert first in capsys.readouterr().out.split()
    maps.regime_ledger.save(maps.regime_ledger.add(ledger, pd.DataFrame(runs), maps.VARIANT), tmp_path / maps.LEDGER)
    maps.main(["--list", "--left", "--grid", "core", "--out", str(tmp_path)])
    listed = capsys.readouterr().out.split()
    assert first not in listed and set(rest) <= set(listed)
    # the chooser's part is done by its Selected rows, not by the candidates' runs
    select = next(n for n, p in maps.parts("select").items() if p["cell"] == ("mix4", 50, 50))
    maps.main(["--list", "--left", "--grid", "select", "--out", str(tmp_path)])
    assert select in capsys.readouterr().out.split()
    chosen = [{**runs[0], "method": "Selected", "seed": s, "chosen": "Target_Only"}
              for s in maps.parts("select")[select]["seeds"]]
    ledger = maps.regime_ledger.load(tmp_path / maps.LEDGER, maps.bench_regime.RUN_COLUMNS)
    maps.regime_ledger.save(maps.regime_ledger.add(ledger, pd.concat([maps.regime_ledger.rows_of(ledger, maps.VARIANT),
                                                                      pd.DataFrame(chosen)]), maps.VARIANT),
                            tmp_path / maps.LEDGER)
    maps.main(["--list", "--left", "--grid", "select", "--out", str(tmp_path)])
    assert select not in capsys.readouterr().out.split()


def test_the_tables_keep_the_ledgers_cells_when_the_runs_folder_is_new(tmp_path, monkeypatch):
    """A new checkout has an empty runs folder: the tables it writes after one part must still hold every
    cell the ledger holds, and the ledger must gain that part's runs."""
    maps = load_bench("regime_map")

    def rows(shift, seeds, auroc):
        return [{"shift": shift, "labels": 10, "rounds": 20, "method": m, "seed": s, "label_draw": s,
                 "auroc": auroc, "val_auroc": 0.8, "target_passes": 20, "wall_s": 1.0, "chosen": None}
                for m in maps.METHODS for s in seeds]

    out = tmp_path / "out"
    cols = maps.bench_regime.RUN_COLUMNS
    ledger = maps.regime_ledger.add(maps.regime_ledger.load(out / maps.LEDGER, cols),
                                    pd.DataFrame(rows("none", range(2), 0.9)), maps.VARIANT)
    maps.regime_ledger.save(ledger, out / maps.LEDGER)
    folder = {maps.VARIANT: pd.DataFrame(rows("mix4", range(1), 0.7), columns=cols)}  # this checkout's one part
    real = maps.bench_regime.collect
    monkeypatch.setattr(maps.bench_regime, "collect", lambda work, variant="default", **kw: real(
        work, variant, **kw) if variant not in folder else maps.regime_ledger.merge(kw["known"], folder[variant]))
    runs = maps.write_tables(tmp_path / "work", out, {}, planned=(2, maps.METHODS))
    assert set(runs["shift"]) == {"none"} and len(runs) == 2 * len(maps.METHODS)  # mix4 is half a cell: out
    after = pd.read_csv(out / maps.LEDGER)
    assert len(after) == 3 * len(maps.METHODS) and set(after["shift"]) == {"none", "mix4"}
    assert set(pd.read_csv(out / "regime_map_runs.csv")["shift"]) == {"none"}


def test_a_part_names_its_cell_seeds_variant_and_settings(tmp_path):
    maps = load_bench("regime_map")
    core = next(p for p in maps.parts("core").values() if p["cell"] == ("mix4", 25, 50))
    argv = maps.part_argv(core, work=tmp_path / "w", out=tmp_path / "o", workers=2)
    assert argv[argv.index("--variant") + 1] == maps.VARIANT and "--select" not in argv
    assert argv[argv.index("--from-seed") + 1] == str(core["seeds"].start)
    assert argv[argv.index("--seeds") + 1] == str(core["seeds"].stop)
    select = next(iter(maps.parts("select").values()))
    assert "--select" in maps.part_argv(select, work=tmp_path / "w", out=tmp_path / "o", workers=2)
    steps8 = next(iter(maps.parts("steps8").values()))
    argv = maps.part_argv(steps8, work=tmp_path / "w", out=tmp_path / "o", workers=2)
    assert "source.steps=8" in argv and argv[argv.index("--variant") + 1] == "steps8"
    kermany = next(iter(maps.parts("kermany").values()))
    argv = maps.part_argv(kermany, work=tmp_path / "w", out=tmp_path / "o", workers=2, npz=tmp_path / "x.npz")
    assert argv[argv.index("--dataset") + 1] == "kermany" and "--npz" not in argv and "model.backbone=resnet18" in argv
    assert argv[argv.index("--work") + 1] == str(tmp_path / "w_kermany")  # its own sites


@pytest.mark.slow  # four runs, the tables and the heatmap: ~30 s on 2 cores at load 4
def test_one_cell_two_methods_one_seed_to_the_advice_map(small_npz, tmp_path, one_torch_thread):
    bench, maps, build = load_bench("bench_regime"), load_bench("regime_map"), load_bench("build_regime_map")
    work, out = tmp_path / "work", tmp_path / "results"
    bench.main(["--npz", str(small_npz), "--work", str(work), "--out", str(tmp_path / "parts"), "--variant",
                maps.VARIANT, "--target-from", "val", "test", "--shifts", "labelnoise40", "--labels", "10", "25",
                "--rounds", "2", "--methods", "Target_Only", "FedAvg", "--seeds", "1", "--set", "source.steps=1"])
    # FedAvg never reads a target label: one run serves both label counts (a link in each cell)
    cells = work / "sweep" / maps.VARIANT
    linked = [cells / f"labelnoise40-n{n}-r2" / "runs" / "FedAvg-seed0" for n in (10, 25)]
    assert all(p.is_symlink() for p in linked) and linked[0].resolve() == linked[1].resolve()
    assert not (cells / "labelnoise40-n10-r2" / "runs" / "Target_Only-seed0").is_symlink()

    runs = maps.write_tables(work, out, {"smoke": True})
    assert set(runs["labels"]) == {10, 25} and len(runs) == 4 and runs["auroc"].between(0, 1).all()
    for name in ("runs", "cells", "pairs", "verdicts", "papers"):
        assert (out / f"regime_map_{name}.csv").is_file(), name
    assert (out / "regime_map.png").stat().st_size > 10_000
    assert "p_adj" in (out / "regime_map_summary.md").read_text()

    path = tmp_path / "map.csv"
    with pytest.raises(SystemExit, match="lacks planned seed"):
        build.main(["--runs", str(out / "regime_map_runs.csv"), "--out", str(path), "--seeds", "2"])
    build.main(["--runs", str(out / "regime_map_runs.csv"), "--out", str(path), "--seeds", "1"])
    rows = regime.load_regime_map(path)
    assert [(c.shift, c.target_labels, c.rounds) for c in rows] == [("label_noise", 10, 2), ("label_noise", 25, 2)]
    assert all(c.n_seeds == 1 and not c.resolved and c.p_adj == 1 and set(c.auroc) == {"Target_Only", "FedAvg"}
               for c in rows)
    assert all("regime_map_runs.csv" in c.source for c in rows)


def test_the_map_counts_only_the_planned_seeds(tmp_path):
    """Seeds past the plan (the first map's top-ups where a margin looked close) are left out of the verdicts."""
    build = load_bench("build_regime_map")
    rows = [{"shift": "none", "labels": 10, "rounds": 20, "method": m, "seed": s, "auroc": 0.9 + 0.01 * s}
            for m in ("A", "B") for s in range(3)]
    rows += [{"shift": "none", "labels": 10, "rounds": 20, "method": "A", "seed": s, "auroc": 0.99} for s in (3, 4)]
    kept = build.planned(pd.DataFrame(rows), 3, "runs.csv")
    assert sorted(set(kept["seed"])) == [0, 1, 2] and len(kept) == 6
    (row,) = build.map_table(kept, "runs.csv")
    assert row["n_seeds"] == 3 and row["p_adj"] == "1"


def test_the_tables_leave_out_a_cell_until_every_planned_seed_of_every_method_has_run():
    """A part writes the tables when it ends; a cell's first part ends with half its seeds."""
    maps = load_bench("regime_map")
    rows = [{"shift": "none", "labels": 10, "rounds": 20, "method": m, "seed": s, "auroc": 0.9}
            for m in ("A", "B") for s in range(3)]
    rows += [{"shift": "mix4", "labels": 25, "rounds": 20, "method": m, "seed": s, "auroc": 0.8}
             for m in ("A", "B") for s in range(2)]  # seed 2 of the plan not run yet
    rows += [{"shift": "none", "labels": 10, "rounds": 20, "method": "A", "seed": 3, "auroc": 0.99}]  # past the plan
    kept, left = maps.complete_cells(pd.DataFrame(rows), 3, ["A", "B"])
    assert set(kept["shift"]) == {"none"} and len(kept) == 6 and kept["seed"].max() == 2
    assert left == ["mix4-n25-r20 (4 of 6 runs)"]
    kept, left = maps.complete_cells(pd.DataFrame(rows), 3, ["A", "B", "C"])  # a method never run
    assert kept.empty and len(left) == 2
    # the chooser's rows are a plan of their own: half of them would be a regret from half the seeds
    chosen = [{"shift": "none", "labels": 10, "rounds": 20, "method": "Selected", "seed": s, "auroc": 0.9}
              for s in range(2)]
    kept, left = maps.complete_cells(pd.DataFrame(rows + chosen), 3, ["A", "B"])
    assert "Selected" not in set(kept["method"]) and len(kept) == 6
    assert "none-n10-r20's Selected rows (2 of 3)" in left
    chosen.append({**chosen[0], "seed": 2})
    kept, _ = maps.complete_cells(pd.DataFrame(rows + chosen), 3, ["A", "B"])
    assert (kept["method"] == "Selected").sum() == 3


def test_no_grid_writes_a_table_of_half_a_cell(tmp_path, monkeypatch, capsys):
    """Kermany's, the papers' and the 8-step tables obey the plan as the map's do: a part ends with
    one seed of a Kermany cell, and a table of one seed reads as a result."""
    maps = load_bench("regime_map")
    rng = np.random.default_rng(0)

    def rows(shift, labels, methods, seeds):
        return [{"shift": shift, "labels": labels, "rounds": 20, "method": m, "seed": s, "label_draw": s,
                 "auroc": rng.uniform(0.6, 0.9), "val_auroc": 0.8, "target_passes": 20, "wall_s": 1.0,
                 "chosen": None} for m in methods for s in seeds]

    by_variant = {maps.VARIANT: rows("none", 10, maps.METHODS, range(3)) + rows("hetero", 25, maps.METHODS, range(2)),
                  maps.STEPS8[0]: rows("none", 50, maps.METHODS, range(1)),
                  maps.KERMANY[0]: rows("none", 25, maps.KERMANY_METHODS, range(1))}
    monkeypatch.setattr(maps.bench_regime, "collect",
                        lambda work, variant="default", **_: pd.DataFrame(by_variant.get(variant, []),
                                                                          columns=maps.bench_regime.RUN_COLUMNS))
    out = tmp_path / "out"
    maps.write_tables(tmp_path / "work", out, {}, planned=(3, maps.METHODS))
    assert (out / "regime_map_runs.csv").is_file() and len(pd.read_csv(out / "regime_map_runs.csv")) == 36
    for stem in ("regime_map_kermany_runs.csv", "regime_map_papers_cells_runs.csv", "regime_map_versus_steps8.csv"):
        assert not (out / stem).exists(), stem
    said = capsys.readouterr().out
    assert "Kermany: left out" in said and "none-n25-r20 (5 of 15 runs)" in said
    by_variant[maps.KERMANY[0]] = rows("none", 25, maps.KERMANY_METHODS, range(3))  # its plan has run
    maps.write_tables(tmp_path / "work", out, {}, planned=(3, maps.METHODS))
    assert len(pd.read_csv(out / "regime_map_kermany_runs.csv")) == 15


def test_a_cell_with_the_choosers_rows_gets_its_regret_and_the_candidates_it_picked_among(tmp_path):
    """The chooser's regret holds for the candidates it picked among, which the advice names beside it."""
    build = load_bench("build_regime_map")
    scores = {"A": (0.90, 0.86, 0.93), "B": (0.85, 0.88, 0.90)}  # A leads, unresolved
    rows = [{"shift": "mix4", "labels": 25, "rounds": 20, "method": m, "seed": s, "auroc": a}
            for m, per_seed in scores.items() for s, a in enumerate(per_seed)]
    rows += [{"shift": "mix4", "labels": 25, "rounds": 20, "method": "Selected", "seed": s, "auroc": scores[m][s]}
             for s, m in enumerate("BAB")]  # the chooser picked B, A, B
    (row,) = build.map_table(pd.DataFrame(rows), "runs.csv", candidates=["A", "B"])
    assert row["winner"] == "A" and row["resolved"] == "false"
    assert float(row["selected_regret"]) == pytest.approx(0.08 / 3, abs=1e-4)
    path = tmp_path / "map.csv"
    build.write_map([row], path)
    (cell,) = regime.load_regime_map(path)
    assert cell.selected_among == ("A", "B") and "picking among A and B" in regime.verdict(cell)["why"]


def test_a_choosers_new_rows_are_counted_when_the_chosen_run_is_in_the_ledger_only(tmp_path):
    """A new checkout's select part finds the candidates' own runs in the ledger, not in its runs folder:
    its Selected rows must still count as the part's new runs, or its time is left out of the pace."""
    maps = load_bench("regime_map")
    select = tmp_path / "work" / "sweep" / maps.VARIANT / "none-n10-r20" / "select"
    (select / "Target_Only-seed0-fold0").mkdir(parents=True)
    (select / "choice-seed0.json").write_text(json.dumps(
        {"chosen": "Target_Only", "scores": {"Target_Only": 0.9}, "candidates": maps.bench_regime.SELECT_CANDIDATES,
         "folds": maps.bench_regime.SELECT_FOLDS, "margin": None}))
    run = {"shift": "none", "labels": 10, "rounds": 20, "method": "Target_Only", "seed": 0, "label_draw": 0,
           "auroc": 0.8, "val_auroc": 0.8, "target_passes": 20, "wall_s": 1.0, "chosen": None}
    ledger = tmp_path / "ledger.csv"
    maps.regime_ledger.save(pd.DataFrame([{"variant": maps.VARIANT, **run}]), ledger)
    assert maps.finished_runs(tmp_path / "work", maps.VARIANT, tmp_path / "absent.csv") == 0
    assert maps.finished_runs(tmp_path / "work", maps.VARIANT, ledger) == 2  # the run and its Selected row


def test_the_papers_cells_say_whether_each_papers_method_beats_plain_fine_tuning(tmp_path, monkeypatch):
    """The papers' claim (a projected method beats FedAvg_Finetune) is read per papers' cell from its
    own file, with Holm over the papers' cells only: a consistent lead is ``better``, noise is ``same``."""
    maps = load_bench("regime_map")
    rng = np.random.default_rng(1)
    base = {m: 0.80 for m in maps.METHODS} | {"FedGP": 0.90}
    rows = [{"shift": "hetero", "labels": 133, "rounds": 20, "method": m, "seed": s, "label_draw": s,
             "auroc": base[m] + 0.01 * s + rng.normal(0, 0.002), "val_auroc": 0.8, "target_passes": 20,
             "wall_s": 1.0, "chosen": None} for m in maps.METHODS for s in range(5)]
    monkeypatch.setattr(maps.bench_regime, "collect", lambda work, variant="default", **_: pd.DataFrame(
        rows if variant == maps.VARIANT else [], columns=maps.bench_regime.RUN_COLUMNS))
    out = tmp_path / "out"
    maps.write_tables(tmp_path / "work", out, {}, planned=(5, maps.METHODS))
    papers = pd.read_csv(out / "regime_map_papers_cells_papers.csv").set_index("method")
    assert papers.loc["FedGP", "vs_winner"] == "winner" and papers.loc["FedGP", "vs_baseline"] == "better"
    assert papers.loc["FedGP", "baseline_diff"] == pytest.approx(0.10, abs=0.005)
    assert papers.loc["FedDA", "vs_baseline"] == "same" and papers.loc["FedDA", "baseline_p_adj"] > 0.05
