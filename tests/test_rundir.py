"""The run directory's one module (fedcxr.rundir): its names, and the readers and writers of its plain files."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from fedcxr.errors import UserError
from fedcxr.rundir import (
    FINAL_MODEL,
    METRICS,
    RUN_INFO,
    RunDir,
    finished_run,
    metrics_line,
    read_metrics,
    read_run_info,
    write_metrics,
    write_run_info,
)


def test_paths_of_a_run_directory(tmp_path):
    run = RunDir(str(tmp_path))
    assert run.run_info == tmp_path / "run.json" and run.final_model == tmp_path / "final_model.pt"
    assert run.checkpoint(3) == tmp_path / "checkpoints" / "round_0003.pt"
    assert run.predictions("val") == tmp_path / "predictions" / "val.parquet"
    assert run.lock.name == ".fedcxr.lock" and run.train_log.name == "train.log"
    for r in (11, 2):
        run.checkpoints.mkdir(exist_ok=True)
        run.checkpoint(r).write_bytes(b"")
    (run.checkpoints / "round_0002.pt.sha256").write_text("x")  # a checksum is not a checkpoint
    assert [p.name for p in run.checkpoint_files()] == ["round_0002.pt", "round_0011.pt"]


def test_metrics_lines_are_strict_json_with_tensors_as_lists(tmp_path):
    row = {"round": 0, "train": {"a": {"loss": float("nan")}}, "betas": torch.tensor([0.25, 0.5]),
           "n": torch.tensor(3), "best": float("inf")}
    assert json.loads(metrics_line(row)) == {"round": 0, "train": {"a": {"loss": None}}, "betas": [0.25, 0.5],
                                             "n": 3, "best": None}
    write_metrics(tmp_path, [row, {"round": 1}])
    assert [r["round"] for r in read_metrics(tmp_path)] == [0, 1] and RunDir(tmp_path).rounds_done() == 2


def test_a_malformed_metrics_line_is_named_or_dropped_on_resume(tmp_path):
    assert read_metrics(tmp_path) == [] and RunDir(tmp_path).rounds_done() == 0
    (tmp_path / METRICS).write_text('{"round": 0}\n[1, 2]\n{"round": 1, "val": {"a\n')
    with pytest.raises(UserError, match=r"metrics.jsonl: line 2 is not a JSON object"):
        read_metrics(tmp_path)
    assert read_metrics(tmp_path, skip_bad=True) == [{"round": 0}]


def test_run_info_is_read_naming_the_file_and_a_run_is_finished_only_with_its_model(tmp_path):
    with pytest.raises(UserError, match="no run.json"):
        read_run_info(tmp_path)
    (tmp_path / RUN_INFO).write_text("[]")
    with pytest.raises(UserError, match="expected a JSON object"):
        read_run_info(tmp_path)
    write_run_info(tmp_path, {"status": "finished", "score": math.nan})
    assert read_run_info(tmp_path) == {"status": "finished", "score": None}
    assert finished_run(tmp_path) is None  # no final_model.pt yet
    (tmp_path / FINAL_MODEL).write_bytes(b"")
    assert finished_run(tmp_path)["status"] == "finished"
    write_run_info(tmp_path, {"status": "running"})
    assert finished_run(tmp_path) is None


class _Cfg:
    name, method, method_name, seed = "study", "methods/mine.py:FedAvg_Finetune", "FedAvg_Finetune", 3


def test_the_default_name_of_a_run_is_decided_in_one_place_and_names_the_method():
    # the method's name, not the path of a method of the user's own (a moved file still resumes)
    assert RunDir.default_for(_Cfg()).root == Path("runs/study-FedAvg_Finetune-seed3")
    assert RunDir.default_for(_Cfg(), flare=True).root == Path("runs/study-FedAvg_Finetune-seed3-flare")


def test_a_run_dir_is_a_path_like_and_passes_through_of(tmp_path):
    run = RunDir(tmp_path)
    assert RunDir.of(run) is run and RunDir.of(str(tmp_path)) == run and Path(run) == tmp_path
    assert str(run) == str(tmp_path) and RunDir(run).root == tmp_path


def test_a_new_run_refuses_a_finished_or_interrupted_folder_and_resume_returns_a_finished_run(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.check_start(resume=False) is None and run.status() is None  # a new folder
    run.checkpoints.mkdir(parents=True)
    run.checkpoint(0).write_bytes(b"")
    with pytest.raises(UserError, match="holds checkpoints of an earlier run; pass --resume"):
        run.check_start(resume=False)
    assert run.check_start(resume=True) is None  # resume: from the last checkpoint
    write_run_info(run.root, {"status": "finished", "rounds": 2})
    run.final_model.write_bytes(b"")
    with pytest.raises(UserError, match="already holds a finished run; choose another --out"):
        run.check_start(resume=False)
    assert run.check_start(resume=True)["rounds"] == 2 and run.status() == "finished"


def test_reading_a_run_dir_that_is_not_a_folder_names_it(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        RunDir.existing(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        RunDir.existing(tmp_path / "file")
    assert RunDir.existing(tmp_path).root == tmp_path


def test_run_directory_policy_is_defined_once():
    """No module but fedcxr.rundir defines a check_run_dir / default_run_dir / rounds_done of its own."""
    package = Path(__file__).resolve().parents[1] / "fedcxr"
    found = [f"{path.relative_to(package)}:{node.name}" for path in package.rglob("*.py")
             for node in ast.parse(path.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name in ("check_run_dir", "default_run_dir", "rounds_done")]
    assert found == []


def test_no_module_joins_a_run_directory_file_name_of_its_own():
    """Only fedcxr.rundir spells the run directory's file names into paths (``run_dir / "run.json"``)."""
    package = Path(__file__).resolve().parents[1] / "fedcxr"
    names = {"config.yaml", "run.json", "metrics.jsonl", "train.log", "final_model.pt", "operating_points.json",
             "report.json", "report.md", "per_class.csv", ".fedcxr.lock", "flare_status.json", "cross_site_val"}
    exempt = {"rundir.py"}
    found = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and \
                    isinstance(node.right, ast.Constant) and node.right.value in names:
                found.append(f"{rel}:{node.lineno} {node.right.value}")
    assert found == []
