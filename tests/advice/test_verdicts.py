"""Corrected verdicts (fedcxr.advice.verdicts): paired tests, Holm, the winner's intersection-union test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedcxr.advice.verdicts import best_test, holm, pair_tests, paired_p, ranked, selected_regret


def test_paired_p_is_scipys_paired_t_test():
    a = {0: 0.91, 1: 0.88, 2: 0.93, 3: 0.90, 9: 0.5}  # seed 9 has no partner: left out
    b = {0: 0.89, 1: 0.87, 2: 0.90, 3: 0.91}
    x, y = [a[s] for s in range(4)], [b[s] for s in range(4)]
    assert paired_p(a, b) == (pytest.approx(stats.ttest_rel(x, y, alternative="greater").pvalue), 4)
    assert paired_p(a, b, "two-sided")[0] == pytest.approx(stats.ttest_rel(x, y).pvalue)
    assert paired_p({0: 0.9}, {0: 0.8}) == (1.0, 1)  # one pair: no test
    assert paired_p({0: 0.9, 1: 0.9}, {0: 0.8, 1: 0.8})[0] == 0.0  # constant difference in the alternative's way


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04, 0.30 → × 4, 3, 2, 1 = 0.04, 0.06, 0.08, 0.30, kept monotone
    assert holm([0.04, 0.01, 0.30, 0.02]) == pytest.approx([0.08, 0.04, 0.30, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    out = holm([math.nan, 0.01])
    assert math.isnan(out[0]) and out[1] == pytest.approx(0.01)


def test_the_winner_must_beat_every_other_method_and_pays_for_being_picked():
    cell = {"A": {s: 0.90 + 0.01 * s for s in range(5)}, "B": {s: 0.85 + 0.011 * s for s in range(5)},
            "C": {s: 0.895 + 0.01 * s + (0.004 if s % 2 else -0.004) for s in range(5)}}
    test = best_test(cell)
    assert test["winner"] == "A" and test["weakest"] == "C" and test["k"] == 3  # C is the close one
    p_c = paired_p(cell["A"], cell["C"])[0]
    assert test["p_iut"] == p_c > paired_p(cell["A"], cell["B"])[0]
    assert test["p_best"] == pytest.approx(min(1.0, 3 * p_c))
    assert ranked(cell) == ["A", "C", "B"]


def test_the_cell_verdict_holds_its_error_rate_where_two_methods_tie_at_the_top_and_finds_a_clear_winner():
    """12 methods, 10 seeds, 300 cells each: (a) two methods tied at the top, the rest far behind — the winner
    is picked among the two by the data, and "it beats every other" is false: p_best < 0.05 at most 5 % of
    the time; (b) one method about 2 standard deviations of the paired differences ahead of the next: resolved nearly always."""
    rng = np.random.default_rng(0)

    def cell(top: dict) -> dict:
        seed_effect = rng.normal(0, 0.01, 10)  # a seed's label draw moves every method alike
        return {f"M{m}": dict(enumerate(0.9 + top.get(m, -0.05) + seed_effect + rng.normal(0, 0.01, 10)))
                for m in range(12)}

    false_claims = sum(best_test(cell({0: 0.0, 1: 0.0}))["p_best"] < 0.05 for _ in range(300))
    found = sum(best_test(cell({0: 0.0, 1: -0.03}))["p_best"] < 0.05 for _ in range(300))
    assert false_claims / 300 <= 0.05 and found / 300 > 0.8, (false_claims, found)


def test_every_pair_of_every_cell_is_one_holm_family():
    cells = {("none", 10, 20): {"A": {0: 0.9, 1: 0.91, 2: 0.92}, "B": {0: 0.8, 1: 0.82, 2: 0.83}},
             ("none", 50, 20): {"A": {0: 0.9, 1: 0.9, 2: 0.91}, "B": {0: 0.9, 1: 0.91, 2: 0.9}}}
    rows = pair_tests(cells)
    assert len(rows) == 2 and rows[0]["a"] == "A" and rows[0]["diff"] == pytest.approx(0.28 / 3)
    assert [r["p_adj"] for r in rows] == pytest.approx(holm([r["p"] for r in rows]))


def test_the_choosers_regret_is_paired_by_seed():
    cell = {"A": {0: 0.90, 1: 0.92, 2: 0.94}, "B": {0: 0.85, 1: 0.86, 2: 0.80}}
    regret = selected_regret(cell, {0: 0.90, 1: 0.86, 2: 0.94})  # chose A, B, A
    assert regret["winner"] == "A" and regret["n"] == 3 and regret["regret"] == pytest.approx(0.02)
