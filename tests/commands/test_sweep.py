"""``fedcxr sweep``: methods × seeds trained, evaluated and compared; a re-run skips finished runs."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from fedcxr.cli import main

from ..conftest import tiny_config


def test_sweep_trains_evaluates_compares_and_skips_finished_runs(tiny_manifests, tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)))
    argv = ["sweep", str(config), "--methods", "Target_Only", "FedAvg_Finetune", "--seeds", "2",
            "--out", str(tmp_path / "sweep"), "--baseline", "Target_Only", "--device", "cpu", "-q"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert first.count(": training") == 4
    comparison = json.loads((tmp_path / "sweep" / "comparison.json").read_text())
    assert {row["method"] for row in comparison["table"]} == {"Target_Only", "FedAvg_Finetune"}
    cell = next(iter(comparison["table"][1]["cells"].values()))
    assert cell["n_runs"] == 2 and cell["seeds"] == [0, 1]  # mean ± SD over the two seeds
    assert len(comparison["tests"]) == 1 and comparison["tests"][0]["method"] == "FedAvg_Finetune"
    assert main(argv) == 0
    assert ": training" not in capsys.readouterr().out  # finished runs are kept, not trained again


def test_sweep_refuses_an_unknown_method_before_training(tiny_manifests, tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache")))
    assert main(["sweep", str(config), "--methods", "FedAvg", "FedMagic", "--out", str(tmp_path / "s")]) == 2
    assert re.search(r"unknown method 'FedMagic'( \(did you mean .*\))?; known: FedAvg", capsys.readouterr().err)
    assert not (tmp_path / "s" / "runs").exists()


@pytest.mark.slow  # 4 fold runs and the chosen method's run of the tiny federation: ~15 s on 2 cores
def test_sweep_select_chooses_on_the_labeled_rows_and_trains_only_the_choice(tiny_manifests, tmp_path, capsys):
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)
    data["target_train"] = {**data["target_train"], "labeled": 12}
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "select"
    assert main(["sweep", str(config), "--select", "--methods", "Target_Only", "FedAvg_Finetune", "--folds", "2",
                 "--seeds", "1", "--out", str(out), "--device", "cpu", "-q"]) == 0
    printed = capsys.readouterr().out
    choice = json.loads((out / "select" / "choice.json").read_text())
    assert printed.count("held out: training") == 4 and f"chose {choice['chosen']}" in printed
    # how sure the choice is, on the 12 rows it was made on: a user reads this before trusting it
    assert f"ahead of the runner-up, {choice['margin']['runner_up']}" in printed and "12 rows" in printed
    assert [p.name for p in (out / "runs").iterdir()] == [f"{choice['chosen']}-seed0"]  # only the choice, on all 12
    assert (out / "comparison.json").is_file()
