"""``fedcxr.suggest``: the one "did you mean …?" rule."""

from __future__ import annotations

from fedcxr.suggest import close_matches, did_you_mean


def test_close_names_are_suggested_case_insensitively_and_far_ones_are_not():
    assert did_you_mean("roudns", ["rounds", "seed", "sites"]) == " (did you mean `rounds`?)"
    assert close_matches("FedAvg_FineTune", ["FedAvg", "FedAvg_Finetune", "FedProx_Finetune"]) == ["FedAvg_Finetune"]
    assert close_matches("FedAvg_Finetun", ["FedAvg", "FedAvg_Finetune", "FedProx_Finetune"]) == \
        ["FedAvg_Finetune", "FedProx_Finetune"]
    assert close_matches("fedavg", ["FedAvg", "FedAdam"]) == ["FedAvg"]       # only the case differs: no other guess
    assert did_you_mean("FedAVG", ["FedAvg", "FedGP", "FedDA"]) == " (did you mean `FedAvg`?)"
    assert did_you_mean("hospital_c", ["hospital_a", "hospital_b", "other"]) == \
        " (did you mean `hospital_a` or `hospital_b`?)"                         # as close: both, no ranking by chance
    assert did_you_mean("pneumonai", ["pneumonia", "pneumothorax"]) == " (did you mean `pneumonia`?)"
    assert did_you_mean("xyz", ["rounds", "seed"]) == "" and did_you_mean("rounds", ["rounds"]) == ""
    assert did_you_mean(None, ["rounds"]) == "" and did_you_mean("a" * 10_000, ["a"]) == ""
