"""The regime map: reading and checking it, placing a federation, the verdict, building a row."""

from __future__ import annotations

import dataclasses

import pytest

from fedcxr.advice import regime
from fedcxr.advice.cells import cell_row, map_rows
from fedcxr.errors import UserError

HEADER = ("shift,target_labels,rounds,winner,runner_up,margin,ci_low,ci_high,p_best,p_adj,resolved,n_seeds,"
          "auroc__A,auroc__B,source\n")


def write(tmp_path, *rows: str, header: str = HEADER):
    path = tmp_path / "map.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


def test_the_shipped_map_loads_and_every_resolved_cell_names_a_winner_with_an_interval_above_zero():
    cells = regime.load_regime_map()
    assert cells and {c.shift for c in cells} <= set(regime.SHIFT_TYPES)
    assert all(c.source for c in cells), "every cell names where its numbers come from"
    for cell in cells:
        if cell.resolved:
            assert cell.winner and cell.ci_low > 0


def test_the_code_does_not_care_how_many_cells_or_methods_there_are(tmp_path):
    path = write(tmp_path, "pixel,50,20,A,B,0.05,0.01,0.09,0.001,0.01,true,5,0.9,0.85,bench")
    (cell,) = regime.load_regime_map(path)
    assert cell.auroc == {"A": 0.9, "B": 0.85} and cell.resolved
    assert regime.load_regime_map(write(tmp_path)) == []


@pytest.mark.parametrize("row, column", [
    ("blur,50,20,A,B,0.05,0.01,0.09,0.001,0.01,true,5,0.9,0.85,x", "shift"),
    ("pixel,0,20,A,B,0.05,0.01,0.09,0.001,0.01,true,5,0.9,0.85,x", "target_labels"),
    ("pixel,50,20,A,B,0.05,-0.01,0.09,0.001,0.01,true,5,0.9,0.85,x", "resolved"),  # interval spans 0
    ("pixel,50,20,A,B,0.05,0.01,0.09,0.01,0.2,true,5,0.9,0.85,x", "resolved"),  # p_adj above 0.05
    ("pixel,50,20,A,B,0.05,0.01,0.09,0.001,0.01,false,5,0.9,0.85,x", "resolved"),  # p_adj below, not resolved
    ("pixel,50,20,A,B,0.05,0.01,0.09,0.001,1.5,false,5,0.9,0.85,x", "p_adj"),  # not a p-value
    ("pixel,50,20,A,B,0.05,0.01,0.09,0.001,0.01,maybe,5,0.9,0.85,x", "resolved"),
    ("pixel,50,20,A,B,0.05,0.01,0.09,0.2,0.6,false,5,high,0.85,x", "auroc__A"),
    ("pixel,50,20,<b>A</b>,B,0.05,0.01,0.09,0.2,0.6,false,5,0.9,0.85,x", "winner"),  # quoted into reports
    ("pixel,50,20,A,B C,0.05,0.01,0.09,0.2,0.6,false,5,0.9,0.85,x", "runner_up"),
])
def test_a_bad_row_is_named_by_file_row_and_column(tmp_path, row, column):
    path = write(tmp_path, row)
    with pytest.raises(UserError, match=rf"map.csv: row 2, column '{column}'"):
        regime.load_regime_map(path)


def cells(tmp_path):
    return regime.load_regime_map(write(
        tmp_path,
        "pixel,50,20,A,B,0.05,0.01,0.09,0.001,0.01,true,5,0.9,0.85,x",
        "pixel,100,20,B,A,0.01,-0.02,0.04,0.8,1,false,3,0.8,0.81,x",
        "none,50,5,A,B,0.01,,,,,false,3,0.9,0.89,x",
    ))


def test_a_federation_goes_to_the_nearest_cell_of_its_shift_within_a_factor_two(tmp_path):
    placed = regime.place(cells(tmp_path), "pixel", 60, 25)
    assert placed["cell"].target_labels == 50
    assert regime.verdict(placed["cell"])["recommendation"] == "A"
    assert regime.place(cells(tmp_path), "pixel", 90, 20)["cell"].target_labels == 100


def test_no_cell_close_enough_is_an_answer(tmp_path):
    far = regime.place(cells(tmp_path), "pixel", 10, 20)
    assert far["cell"] is None and "more than a factor 2" in far["why"]
    assert regime.verdict(None) == {"recommendation": None, "verdict": regime.NO_CELL}
    assert "no cell with shift 'shortcut'" in regime.place(cells(tmp_path), "shortcut", 50, 20)["why"]
    assert regime.place(cells(tmp_path), "unknown", 50, 20)["cell"] is None


def test_an_unresolved_cell_gives_no_recommendation_but_the_candidates(tmp_path):
    cell = regime.place(cells(tmp_path), "pixel", 100, 20)["cell"]
    verdict = regime.verdict(cell)
    assert verdict["recommendation"] is None and verdict["verdict"] == regime.UNRESOLVED
    assert verdict["candidates"][:2] == ["B", "A"]
    no_interval = regime.verdict(regime.place(cells(tmp_path), "none", 50, 5)["cell"])
    assert "no paired interval" in no_interval["why"]


def test_cell_row_by_hand():
    runs = [{"method": "A", "seed": s, "auroc": a} for s, a in enumerate([0.90, 0.92, 0.94])]
    runs += [{"method": "B", "seed": s, "auroc": a} for s, a in enumerate([0.80, 0.83, 0.86])]
    runs += [{"method": "Oracle", "seed": 0, "auroc": 0.99}, {"method": "Selected", "seed": 0, "auroc": 0.99}]
    row = cell_row(runs, shift="pixel", target_labels=50, rounds=5, source="test")
    assert (row["winner"], row["runner_up"], row["margin"], row["n_seeds"]) == ("A", "B", "0.0900", 3)
    # paired differences 0.10, 0.09, 0.08: mean 0.09, sd 0.01, t(0.975, 2) = 4.3027 → ± 0.0248
    assert row["ci_low"] == "0.0652" and row["ci_high"] == "0.1148" and row["resolved"] == "true"
    # one-sided t = 0.09 / (0.01 / √3) = 15.59 on 2 df: p = 0.002045; × 2 methods for the winner's selection
    assert row["p_best"] == "0.00409" and row["n_methods"] == 2
    assert "auroc__Oracle" not in row and "auroc__Selected" not in row


def test_the_map_adjusts_over_every_cell_so_a_cell_resolved_alone_may_not_be_in_the_map(tmp_path):
    """Holm over the cells: the same cell that is resolved alone (p_best 0.049) is not beside a second cell."""
    near = [{"method": "A", "seed": s, "auroc": a} for s, a in enumerate([0.9009, 0.9015, 0.9021])]
    near += [{"method": "B", "seed": s, "auroc": 0.9} for s in range(3)]
    alone = cell_row(near, shift="none", target_labels=500, rounds=20, source="test")
    assert alone["p_best"] == "0.04941" and alone["resolved"] == "true"
    flat = [{"method": m, "seed": s, "auroc": 0.8 + 0.01 * s} for m in "AB" for s in range(3)]
    rows = map_rows([alone, cell_row(flat, shift="none", target_labels=50, rounds=20, source="test")])
    assert [r["p_adj"] for r in rows] == ["0.09882", "1"] and [r["resolved"] for r in rows] == ["false", "false"]
    path = tmp_path / "map.csv"
    columns = list(rows[0])
    path.write_text("\n".join([",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]) + "\n")
    loaded = regime.load_regime_map(path)
    assert [c.resolved for c in loaded] == [False, False] and loaded[0].p_adj == pytest.approx(0.09882)
    verdict = regime.verdict(loaded[0])
    assert verdict["recommendation"] is None and "adjusted p = 0.099" in verdict["why"]
    assert "fedcxr sweep --select" in verdict["why"]


def test_a_bound_beside_zero_keeps_its_sign_so_a_resolved_cell_still_loads(tmp_path):
    runs = [{"method": "A", "seed": s, "auroc": a} for s, a in enumerate([0.9009, 0.9015, 0.9021])]
    runs += [{"method": "B", "seed": s, "auroc": 0.9} for s in range(3)]
    row = cell_row(runs, shift="none", target_labels=500, rounds=20, source="test")
    # paired differences 0.0009, 0.0015, 0.0021: mean 0.0015, sd 0.0006, t(0.975, 2) = 4.3027 → ± 0.00149048
    assert (row["ci_low"], row["ci_high"], row["resolved"]) == ("9.5e-06", "0.0030", "true")
    line = ",".join([row["shift"], "500", "20", "A", "B", row["margin"], row["ci_low"], row["ci_high"], row["p_best"],
                     row["p_adj"], "true", "3", "0.9015", "0.9", "x"])
    (cell,) = regime.load_regime_map(write(tmp_path, line))
    assert cell.resolved and cell.ci_low > 0
    assert "beat every other of the cell's 2 methods" in regime.verdict(cell)["why"]


def test_a_map_without_the_corrected_verdicts_is_refused_with_how_to_rebuild_it(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("shift,target_labels,rounds,winner,runner_up,margin,ci_low,ci_high,resolved,n_seeds,auroc__A,source\n"
                    "pixel,50,20,A,B,0.05,0.01,0.09,true,5,0.9,x\n")
    with pytest.raises(UserError, match="lacks column.*p_best.*build_regime_map.py"):
        regime.load_regime_map(path)


CHOOSER_HEADER = HEADER.replace(",source\n", ",selected_regret,selected_lo,selected_hi,selected_among,source\n")


def test_the_choosers_regret_is_quoted_with_the_candidates_it_picked_among(tmp_path):
    """The map's chooser picks among a fixed set; the advice names other leaders. The regret it quotes says
    which set it holds for, or a hospital would read it as the cost of the sweep it is told to run."""
    path = tmp_path / "map.csv"
    path.write_text(CHOOSER_HEADER + "pixel,25,20,A,B,0.01,-0.01,0.03,1,1,false,10,0.9,0.89,"
                    "0.018,-0.004,0.041,Target_Only A FedAvg_Finetune,x\n")
    (cell,) = regime.load_regime_map(path)
    assert cell.selected_among == ("Target_Only", "A", "FedAvg_Finetune")
    why = regime.verdict(cell)["why"]
    assert "the chooser, picking among Target_Only, A and FedAvg_Finetune, lost +0.018 [95 % -0.004, +0.041]" in why


def test_where_the_chooser_lost_beyond_doubt_the_leader_is_named_instead_of_a_sweep(tmp_path):
    """With 10 labels the measured chooser lost +0.050 [+0.020, +0.079] to the winner on the pixel shift:
    sending that hospital to ``sweep --select`` would advise what the map measured to fail. Where the
    regret's interval touches 0 (25 labels there), the sweep stays the advice."""
    few, enough = regime.load_regime_map(write(
        tmp_path, "pixel,10,20,A,B,0.001,-0.01,0.01,1,1,false,10,0.918,0.897,0.050,0.020,0.079,A B,x",
        "pixel,25,20,A,B,0.001,-0.01,0.01,1,1,false,10,0.920,0.897,0.018,-0.004,0.041,A B,x", header=CHOOSER_HEADER))
    lost = regime.verdict(few)
    assert (lost["verdict"], lost["leader"], lost["recommendation"]) == (regime.TAKE_LEADER, "A", None)
    assert "lost +0.050 [95 % +0.020, +0.079] AUROC against the winner, resolved" in lost["why"]
    assert "A and B within 0.021 AUROC), so train the leader, A" in lost["why"]
    kept = regime.verdict(enough)
    assert kept["verdict"] == regime.UNRESOLVED and "leader" not in kept and regime.SELECT_HINT in kept["why"]


@pytest.mark.parametrize("among", ["A <b>B</b>", "A;rm", "A B\u202eC"])
def test_a_chooser_candidate_that_is_not_a_method_name_is_refused(tmp_path, among):
    """``--regime-map`` takes a user's file, and the advice quotes these names into stats reports."""
    path = tmp_path / "map.csv"
    path.write_text(CHOOSER_HEADER + f'pixel,25,20,A,B,0.01,-0.01,0.03,1,1,false,10,0.9,0.89,0.018,-0.004,0.041,"{among}",x\n')
    with pytest.raises(UserError, match=r"map.csv: row 2, column 'selected_among'"):
        regime.load_regime_map(path)


def test_a_method_column_whose_name_is_not_a_method_name_is_refused(tmp_path):
    path = tmp_path / "map.csv"
    path.write_text(HEADER.replace("auroc__B", "auroc__B$(x)") + "pixel,50,20,A,B,0.05,0.01,0.09,0.2,0.6,false,5,0.9,0.85,x\n")
    with pytest.raises(UserError, match=r"map.csv: column 'auroc__B\$\(x\)'"):
        regime.load_regime_map(path)


def test_where_the_leader_was_not_a_candidate_the_loss_is_not_blamed_on_the_labels(tmp_path):
    """40 % noisy source labels at 500 labels: the chooser lost +0.009 [+0.004, +0.013] to SCAFFOLD_Finetune
    (here A), which it could not pick; its choices were sharp. "With this few labels" would tell a hospital with 500
    labels that its budget failed, which the map did not measure."""
    outside, inside = regime.load_regime_map(write(
        tmp_path, "label_noise,500,20,A,B,0.004,-0.001,0.009,1,1,false,10,0.964,0.957,0.009,0.004,0.013,T B,x",
        "label_noise,10,20,A,B,0.003,-0.005,0.011,1,1,false,10,0.878,0.875,0.095,0.022,0.168,T A,x",
        header=CHOOSER_HEADER))
    lost = regime.verdict(outside)
    assert (lost["verdict"], lost["leader"]) == (regime.TAKE_LEADER, "A")
    assert "the leader, A, was not among the candidates the map's chooser picked from" in lost["why"]
    assert "few labels" not in lost["why"] and "so train the leader, A, rather than sweep" in lost["why"]
    few = regime.verdict(inside)
    assert few["verdict"] == regime.TAKE_LEADER and "with this few labels choosing on them cost more" in few["why"]
    assert "was not among the candidates" not in few["why"]


def _chooser_cell(shift, labels, regret, lo, hi):
    return regime.Cell(row=2, shift=shift, target_labels=labels, rounds=20, winner="A", runner_up="B", margin=0.0,
                       ci_low=-0.01, ci_high=0.01, resolved=False, n_seeds=10, auroc={"A": 0.9, "B": 0.9},
                       selected={"selected_regret": regret, "selected_lo": lo, "selected_hi": hi},
                       selected_among=("A", "B"))


def test_the_cost_of_choosing_is_read_from_the_map_at_the_nearest_measured_budget():
    """A hospital's choice.md quotes what choosing cost in the map near its own label count, from the map's
    cells (so it moves as cells land), and names the leader as the better bet only where the loss was beyond
    doubt there; far from every measured budget it says nothing rather than borrow another regime's numbers."""
    cells = [_chooser_cell("pixel", 10, 0.050, 0.020, 0.079), _chooser_cell("shortcut", 10, -0.004, -0.071, 0.064),
             _chooser_cell("pixel", 50, 0.017, -0.009, 0.043), _chooser_cell("none", 50, 0.000, -0.003, 0.003),
             dataclasses.replace(_chooser_cell("pixel", 50, 0.012, 0.002, 0.022), rounds=50)]
    few = regime.chooser_cost(12, cells)
    assert "2 chooser cells with 10 labels (pixel, shortcut at 20 rounds)" in few and "-0.004 to +0.050" in few
    assert "beyond doubt in 1 (pixel at 20 rounds), where training the map's leader" in few
    many = regime.chooser_cost(80, cells)
    assert "3 chooser cells with 50 labels (none, pixel at 20 rounds; pixel at 50 rounds)" in many
    assert "+0.000 to +0.017" in many and "beyond doubt in 1 (pixel at 50 rounds)" in many
    assert "cells with 50 labels" in regime.chooser_cost(100, cells)  # a factor 2 exactly is near, as in place()
    assert regime.chooser_cost(101, cells) is None and regime.chooser_cost(0, cells) is None
    assert regime.chooser_cost(10, [_chooser_cell("pixel", 10, None, None, None)]) is None
