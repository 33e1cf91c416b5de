"""Choosing a method within the label budget (fedcxr.workflows.choose): cross-fitting on the labeled rows only."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.workflows.choose import (HeldOut, choice_margin, choose_method, heldout_predictions, margin_text, pick,
                                     pooled_auroc)

from ..conftest import tiny_config


def _part(labels, probs) -> HeldOut:
    labels = np.asarray(labels, float)[:, None]
    return HeldOut(["pneumonia"], labels, np.ones_like(labels), np.asarray(probs, float)[:, None])


def test_held_out_predictions_are_pooled_over_the_folds_before_the_auroc():
    """Two folds of one class each have no AUROC of their own; pooled they do (and sklearn agrees)."""
    from sklearn.metrics import roc_auc_score

    a, b = _part([1, 1], [0.9, 0.4]), _part([0, 0], [0.5, 0.1])
    assert math.isnan(pooled_auroc([a])) and math.isnan(pooled_auroc([b]))
    assert pooled_auroc([a, b]) == pytest.approx(roc_auc_score([1, 1, 0, 0], [0.9, 0.4, 0.5, 0.1])) == 0.75


def test_the_highest_score_is_chosen_ties_and_undefined_scores_go_to_the_earlier_candidate():
    assert pick({"A": 0.7, "B": 0.8, "C": 0.8}, ["A", "B", "C"]) == "B"
    assert pick({"A": math.nan, "B": 0.6}, ["A", "B"]) == "B"
    with pytest.raises(UserError, match="one class only"):
        pick({"A": math.nan, "B": math.nan}, ["A", "B"])


def _scored(parts):
    return {m: pooled_auroc(p) for m, p in parts.items()}


def test_a_choice_on_many_rows_is_told_apart_and_one_on_ten_is_not():
    """The margin is what a user needs to read a choice: on 200 rows a perfect ranker is told apart from a
    coin; on 10 rows a one-pair difference is not, and the text says so and names the map's leader."""
    rng = np.random.default_rng(0)
    y = np.tile([0, 1], 100)
    parts = {"A": [_part(y, y * 0.8 + 0.1)], "B": [_part(y, rng.random(200))]}
    scores = _scored(parts)
    margin = choice_margin(parts, scores, "A")
    assert margin.runner_up == "B" and margin.diff == pytest.approx(scores["A"] - scores["B"])
    assert margin.told_apart and margin.low > 0.3 and margin.ahead == 1.0 and margin.resamples == 2000
    assert "told apart on these 200 rows" in margin_text(margin, "A", 200)

    y10 = [0, 1] * 5
    few = {"A": [_part(y10, [0.1, 0.9] * 5)], "B": [_part(y10, [0.1, 0.9] * 4 + [0.9, 0.1])]}
    margin = choice_margin(few, _scored(few), "A")
    assert margin.diff == pytest.approx(1.0 - 0.8) and not margin.told_apart and margin.low <= 0 < margin.high
    text = margin_text(margin, "A", 10)
    assert "these 10 rows cannot tell the two apart" in text
    # what choosing cost, from the shipped map's chooser cells near 10 labels (the pixel shift lost there)
    assert "chooser cells with 10 labels" in text and "training the map's leader" in text
    assert "map's leader" not in margin_text(margin, "A", 50) and "chooser cells with 50 labels" in margin_text(
        margin, "A", 50)
    assert margin_text(margin, "A", 10, cells=[]).endswith("these 10 rows cannot tell the two apart.")


def test_a_tie_is_named_as_a_tie():
    """Ten rows often rank two candidates identically: the choice is then the candidates' order, and says so."""
    y10 = [0, 1] * 5
    same = {"A": [_part(y10, [0.2, 0.7] * 5)], "B": [_part(y10, [0.3, 0.6] * 5)]}
    margin = choice_margin(same, _scored(same), "A")
    assert (margin.diff, margin.low, margin.high, margin.ahead) == (0.0, 0.0, 0.0, 0.5)
    assert "a tie goes to the earlier candidate" in margin_text(margin, "A", 10)
    assert choice_margin({"A": same["A"]}, {"A": 1.0}, "A") is None


@pytest.mark.slow  # 4 fold runs of the tiny federation: ~10 s on 2 cores
def test_the_chooser_trains_each_candidate_without_each_fold_and_scores_only_that_fold(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)
    data["target_train"] = {**data["target_train"], "labeled": 12, "label_draw": 1}
    choice = choose_method(data, ["Target_Only", "FedAvg_Finetune"], out=tmp_path / "out", folds=2, seed=0,
                           device="cpu", progress=False)
    assert choice.chosen in ("Target_Only", "FedAvg_Finetune")
    assert choice.scores[choice.chosen] == max(v for v in choice.scores.values() if math.isfinite(v))
    assert len(choice.runs) == 4 and choice.n_labeled == 12  # every labeled row scored once, by a model without it
    saved = json.loads((tmp_path / "out" / "select" / "choice.json").read_text())
    assert saved["chosen"] == choice.chosen and saved["n_labeled"] == 12
    assert "no validation or test label" in saved["procedure"]
    assert saved["margin"]["runner_up"] == ({"Target_Only", "FedAvg_Finetune"} - {choice.chosen}).pop()
    assert "out-of-fold AUROC" in (tmp_path / "out" / "select" / "choice.md").read_text()
    # the two folds of a method hold out disjoint rows that together are the 12 the budget allows
    cfg = load_config(data=data)
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.inprocess import build_runners

    runner = build_runners(cfg, resolve_device("cpu"), progress=False)[cfg.site_name(cfg.target)]
    trained = [c for c in runner.class_set]
    folds = [runner.labeled_rows("train", trained, 12, 1, (2, k), held_out=True) for k in range(2)]
    assert sorted(folds[0] + folds[1]) == runner.labeled_rows("train", trained, 12, 1)
    assert [len(heldout_predictions(r).labels) for r in choice.runs[:2]] == [len(f) for f in folds]
    # a re-run trains nothing: the fold runs are kept
    again = choose_method(data, ["Target_Only", "FedAvg_Finetune"], out=tmp_path / "out", folds=2, seed=0,
                          device="cpu", progress=False, announce=lambda text: pytest.fail(text))
    assert again.scores == choice.scores


def test_bad_choices_are_refused_before_any_training(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache")
    with pytest.raises(UserError, match="at least 2 methods"):
        choose_method(data, ["FedAvg_Finetune"], out=tmp_path / "o")
    with pytest.raises(UserError, match="2 to 20 folds"):
        choose_method(data, ["FedAvg_Finetune", "Target_Only"], out=tmp_path / "o", folds=1)
    with pytest.raises(UserError, match="Unknown method|unknown method"):
        choose_method(data, ["FedAvg_Finetune", "NoSuchMethod"], out=tmp_path / "o")
    held = {**data, "target_train": {**data["target_train"], "holdout": {"folds": 2, "fold": 0}}}
    with pytest.raises(UserError, match="sets target_train.holdout itself"):
        choose_method(held, ["FedAvg_Finetune", "Target_Only"], out=tmp_path / "o")
    assert not (tmp_path / "o").exists()
