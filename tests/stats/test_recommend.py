"""The advice of ``fedcxr stats``: every verdict ends in a step the user can take."""

from __future__ import annotations

from fedcxr.advice import regime
from fedcxr.pipeline.config import load_config
from fedcxr.stats.recommend import advise

HEADER = ("shift,target_labels,rounds,winner,runner_up,margin,ci_low,ci_high,p_best,p_adj,resolved,n_seeds,auroc__A,"
           "auroc__B,auroc__C,source\n")


def _cfg(**overrides):
    data = {"name": "t", "manifests": "m", "sites": ["a", "b"], "target": "t", "strategy": "FedAvg_Finetune",
            "rounds": 20, "target_train": {"labeled": 500}, **overrides}
    return load_config(data=data, check_sites=False)


def test_no_cell_close_enough_says_which_sweep_to_run_on_the_users_data(tmp_path):
    path = tmp_path / "map.csv"
    path.write_text(HEADER + "pixel,50,20,B,C,0.05,0.01,0.09,0.001,0.01,true,5,0.80,0.90,0.85,x\n"
                             "pixel,10,20,C,A,0.05,0.01,0.09,0.001,0.01,true,5,0.84,0.70,0.88,x\n")
    payloads = {"t": {"groups": {"train_labels": {"counts": [500]}, "split": {"counts": [900, 100, 100]}}}}
    advice = advise(_cfg(), payloads, {"type": {"value": "pixel"}}, map_path=path)
    assert advice["verdict"] == regime.NO_CELL and advice["recommendation"] is None
    # the config's own method first, then the leaders of the nearest cell of the same shift (50 labels)
    assert advice["next"] == "fedcxr sweep CONFIG.yaml --select --methods FedAvg_Finetune B C --out select"
    assert "nothing near this federation" in advice["why"] and "within your label budget" in advice["why"]


def test_without_a_shift_type_the_sweep_still_names_the_maps_leaders(tmp_path):
    path = tmp_path / "map.csv"
    path.write_text(HEADER + "none,50,20,A,B,0.05,0.01,0.09,0.001,0.01,true,5,0.90,0.85,0.80,x\n")
    advice = advise(_cfg(), {}, {"type": {"value": "unknown"}}, map_path=path)
    assert advice["verdict"] == regime.NO_CELL
    assert advice["next"].startswith("fedcxr sweep CONFIG.yaml --select --methods FedAvg_Finetune A B ")


def test_where_the_map_cannot_tell_the_advice_is_to_choose_on_your_own_labels(tmp_path):
    path = tmp_path / "map.csv"
    path.write_text(HEADER + "pixel,500,20,B,C,0.01,-0.01,0.03,0.9,1,false,10,0.80,0.90,0.89,x\n")
    payloads = {"t": {"groups": {"train_labels": {"counts": [500]}, "split": {"counts": [900, 100, 100]}}}}
    advice = advise(_cfg(), payloads, {"type": {"value": "pixel"}}, map_path=path)
    assert advice["verdict"] == regime.UNRESOLVED and advice["recommendation"] is None
    assert advice["next"] == "fedcxr sweep CONFIG.yaml --select --methods B C A --out select"
    assert "adjusted p = 1" in advice["why"] and "fedcxr sweep --select" in advice["why"]


def test_where_the_chooser_lost_beyond_doubt_the_next_step_trains_the_leader(tmp_path):
    """10 labels on the pixel shift: the measured chooser lost resolved ground, so the step is one run
    of the cell's leader, not a sweep that costs 3 runs per candidate and chose worse."""
    path = tmp_path / "map.csv"
    path.write_text(HEADER.replace(",source\n", ",selected_regret,selected_lo,selected_hi,selected_among,source\n")
                    + "pixel,10,20,B,C,0.01,-0.01,0.03,0.9,1,false,10,0.80,0.90,0.89,0.05,0.02,0.08,A B,x\n")
    payloads = {"t": {"groups": {"train_labels": {"counts": [12]}, "split": {"counts": [900, 100, 100]}}}}
    advice = advise(_cfg(), payloads, {"type": {"value": "pixel"}}, map_path=path)
    assert advice["verdict"] == regime.TAKE_LEADER and advice["recommendation"] is None
    assert advice["next"] == "fedcxr train CONFIG.yaml --set method=B"
    assert "train the leader, B, rather than sweep" in advice["why"] and "run a sweep" not in advice["why"]
