"""``stats.md``: names read as written; escaped only where the Markdown context needs it."""

from __future__ import annotations

from fedcxr.stats.report import _acquisition, _advice


def _advice_stats(target: str, next_step: str, source: str = "BENCHMARKS.md (issue 12)") -> dict:
    return {"advice": {
        "target": target, "recommendation": None, "verdict": "no cell close enough",
        "why": "nearest pixel cell has 50 labels (this federation: 500 labels): more than a factor 2 away",
        "inputs": {"shift_type": {"value": "none", "why": "W1 0.01 (0 = identical)", "caveat": "x"},
                   "target_labels": {"value": 15, "from": "15 labeled training rows released (train_labels)"},
                   "rounds": {"value": 2, "from": "the config's rounds"},
                   "pilot": {"status": "ok", "sigma2": 1e-7, "d2": {target: 1e-6}, "tau2d2": {target: 1e-6},
                             "beta_fedgp": {target: 0.1}, "reading": {target: "β = 0.10"},
                             "notes": ["the pilot round (one FedGP_Auto round ...): lower target_train.batch_size"]}},
        "placement": {"rule": "nearest by |log2 label ratio| + |log2 rounds ratio|"},
        "cell": {"row": 3, "n_seeds": 5, "source": source, "auroc": {"FedAvg_Finetune": 0.9}},
        "next": next_step, "map": {"path": "fedcxr/advice/regime_map.csv", "cells": 40}}}


def test_ordinary_names_and_prose_are_not_backslashed():
    page = "\n".join(_advice(_advice_stats("hospital_a", "fedcxr sweep CONFIG.yaml --methods FedAvg_Finetune B_c")))
    assert "hospital_a" in page and "hospital\\_a" not in page
    assert "(train_labels)" in page and "\\(" not in page and "\\_" not in page
    assert "nearest by |log2 label ratio| + |log2 rounds ratio|" in page       # prose: a pipe breaks nothing
    assert "Next step: `fedcxr sweep CONFIG.yaml --methods FedAvg_Finetune B_c`" in page
    assert "FedAvg_Finetune" in page and "FedAvg\\_Finetune" not in page
    assert "lower target_train.batch_size" in page                            # the pilot's notes are shown


def test_hostile_names_still_cannot_break_a_table_a_code_span_or_add_markup():
    page = "\n".join(_advice_stats_page("a|b<img src=x>", "sweep `x` | y"))
    assert "| a\\|b&lt;img src=x> |" in page                                 # a table cell: | escaped
    assert "Next step: ``sweep `x` | y``" in page                            # a longer fence, nothing else
    lines = _acquisition({"sites": {"# x": {"groups": {"split": {}}, "unavailable": {"acquisition": "gone"}}},
                          "global": {"groups": {}}}, 5)
    assert "- \\# x: not available (gone)" in lines                          # a list item cannot become a heading


def _advice_stats_page(target: str, next_step: str) -> list[str]:
    return _advice(_advice_stats(target, next_step))
