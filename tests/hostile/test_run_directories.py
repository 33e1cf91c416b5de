"""Hostile run directories, checkpoints and configs (SECURITY.md: "Run directories and checkpoints").

Every case asserts what a user sees: the exit code, the message naming the file or key, and
that nothing worse happened (no code ran, no data was mixed, the run still ends as it should).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from fedcxr.cli import main
from fedcxr.pipeline.checkpoints import checkpoint_paths, load_tensors, UnsafeFile
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config

# torch warns that a hand-made pickle uses protocol 4 before refusing it: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")


class _RunsCode:
    """Unpickling this object runs ``touch MARKER`` (a tampered checkpoint)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _malicious(path: Path, marker: Path, wrap=lambda obj: obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(wrap(_RunsCode(marker)), handle)


def _cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def finished(tiny_manifests, tmp_path_factory) -> Path:
    """A finished 3-round FedAvg_Finetune run with its config (copied per test that alters it)."""
    root = tmp_path_factory.mktemp("hostile_runs")
    data = tiny_config(tiny_manifests, root / "cache", rounds=3)
    (root / "exp.yaml").write_text(yaml.safe_dump(data))
    run_experiment(load_config(root / "exp.yaml"), root / "run", progress=False)
    return root


def _copy(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(finished / "run", tmp_path / "run")
    shutil.copy(finished / "exp.yaml", tmp_path / "exp.yaml")
    return tmp_path / "run", tmp_path / "exp.yaml"


# --------------------------------------------------------------------------- code in a file


def test_a_tampered_final_model_is_refused_and_runs_no_code(finished, tmp_path, capsys):
    run, _ = _copy(finished, tmp_path)
    marker = tmp_path / "pwned"
    _malicious(run / "final_model.pt", marker)
    (run / "final_model.pt.sha256").unlink()  # the attacker also removed the checksum
    code, err = _cli(["evaluate", run, "--bootstrap", "0"], capsys)
    assert code == 2 and not marker.exists()
    assert "final_model.pt: refused to load this model file" in err and "never runs code" in err


def test_a_tampered_checkpoint_is_skipped_for_the_previous_intact_one(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    newest = checkpoint_paths(run)[-1]
    marker = tmp_path / "pwned"
    _malicious(newest, marker, wrap=lambda obj: {"round": 2, "fingerprint": "x", "state": obj})
    code, err = _cli(["train", config, "--out", run, "--resume", "-q"], capsys)
    assert code == 0 and not marker.exists()
    ref = torch.load(finished / "run" / "final_model.pt", weights_only=True)["global"]
    got = torch.load(run / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(ref[k], got[k]) for k in ref), "resuming from the older checkpoint ends the same"


def test_a_tampered_checkpoint_without_an_intact_one_exits_2_naming_it(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    marker = tmp_path / "pwned"
    for path in checkpoint_paths(run):
        _malicious(path, marker)
        Path(str(path) + ".sha256").unlink()
    code, err = _cli(["train", config, "--out", run, "--resume"], capsys)
    assert code == 2 and not marker.exists()
    assert "no intact checkpoint to resume from" in err and "round_0002.pt" in err and "round_0001.pt" in err


def test_load_tensors_names_the_file_for_every_kind_of_bad_content(tmp_path):
    cases = {"empty.pt": b"", "text.pt": b"not a torch file at all", "zip.pt": b"PK\x03\x04garbage"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UnsafeFile, match=name):
            load_tensors(tmp_path / name, "checkpoint")
    with pytest.raises(UnsafeFile, match="no such checkpoint"):
        load_tensors(tmp_path / "absent.pt", "checkpoint")


# --------------------------------------------------------------------------- damaged checkpoints


def test_a_truncated_newest_checkpoint_falls_back_and_ends_identical(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    newest = checkpoint_paths(run)[-1]
    newest.write_bytes(newest.read_bytes()[:200])
    code, err = _cli(["train", config, "--out", run, "--resume"], capsys)
    assert code == 0
    assert "round_0002.pt" in err and "checksum mismatch" in err  # the damaged file is named in a warning
    ref = torch.load(finished / "run" / "final_model.pt", weights_only=True)["global"]
    got = torch.load(run / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_a_silently_changed_checkpoint_fails_its_checksum(finished, tmp_path, capsys):
    """Still a valid torch file, but not the one written: the checksum catches it."""
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    newest = checkpoint_paths(run)[-1]
    ckpt = torch.load(newest, weights_only=True)
    key = next(iter(ckpt["state"]["global"]))
    ckpt["state"]["global"][key] = ckpt["state"]["global"][key] + 1.0
    torch.save(ckpt, newest)
    code, err = _cli(["train", config, "--out", run, "--resume"], capsys)
    assert code == 0 and "checksum mismatch" in err
    ref = torch.load(finished / "run" / "final_model.pt", weights_only=True)["global"]
    got = torch.load(run / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_a_final_model_that_is_not_a_fedcxr_model_is_refused(finished, tmp_path, capsys):
    run, _ = _copy(finished, tmp_path)
    torch.save(torch.zeros(3), run / "final_model.pt")
    (run / "final_model.pt.sha256").unlink()
    code, err = _cli(["evaluate", run], capsys)
    assert code == 2 and "not a fedcxr model file" in err


def test_a_final_model_failing_its_checksum_is_refused(finished, tmp_path, capsys):
    run, _ = _copy(finished, tmp_path)
    final = torch.load(run / "final_model.pt", weights_only=True)
    torch.save({**final, "classes": list(reversed(final["classes"]))}, run / "final_model.pt")
    code, err = _cli(["evaluate", run], capsys)
    assert code == 2 and "final_model.pt: checksum mismatch" in err


# --------------------------------------------------------------------------- mixing data


def test_resume_refuses_a_site_that_was_re_ingested(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    data = yaml.safe_load(config.read_text())
    manifests = tmp_path / "manifests"
    shutil.copytree(data["manifests"], manifests)
    data["manifests"] = str(manifests)
    config.write_text(yaml.safe_dump(data))
    # the manifests moved to another folder, same content: resume is allowed
    code, err = _cli(["train", config, "--out", run, "--resume", "-q"], capsys)
    assert code == 0, err
    (run / "final_model.pt").unlink()
    frame = pd.read_parquet(manifests / "nih_style" / "manifest.parquet")
    frame.loc[0, "split"] = "val" if frame.loc[0, "split"] == "train" else "train"
    frame.to_parquet(manifests / "nih_style" / "manifest.parquet", index=False)
    code, err = _cli(["train", config, "--out", run, "--resume"], capsys)
    assert code == 2 and "nih_style" in err and "re-ingested" in err


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("content, message", [
    ("rounds: [1\n", "not valid YAML"),
    ("- a\n- b\n", "must be a mapping"),
    ("sites: [nih_style]\nround: 3\n", "round: Extra inputs are not permitted"),
    ("sites: [nih_style]\nrounds: -1\n", "rounds: Input should be greater than or equal to 0"),
    ("sites: [nih_style]\nstrategy: FedMagic\n", "unknown method 'FedMagic'"),
    ("sites: [nih_style]\nmodel: {classes: [tumour]}\n", "unknown class(es) ['tumour']"),
    ("sites: [nosuchsite]\n", "site 'nosuchsite': no manifest"),
    ("sites: [nih_style, dicom_style]\ntarget: dicom_style\n", "also listed under `sites`"),
    ("sites: [nih_style]\nmodel: {weights: weights.pt}\n", "weights.pt"),
])
def test_hostile_configs_exit_2_naming_the_key(tiny_manifests, tmp_path, capsys, content, message):
    (tmp_path / "weights.pt").write_bytes(b"definitely not a state dict")
    config = tmp_path / "exp.yaml"
    config.write_text(f"manifests: {tiny_manifests}\nimage_size: 32\nrounds: 1\n" + content
                      if not content.startswith("-") else content)
    code, err = _cli(["train", config, "--out", tmp_path / "run", "--set", "model.backbone=resnet_tiny"], capsys)
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- what a run directory holds


def test_no_raw_identifier_or_image_path_anywhere_under_a_run(tiny_manifests, tmp_path, capsys):
    """Train, evaluate and compare; then scan every byte under the run for ids and image paths."""
    run = tmp_path / "run"
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)
    run_experiment(load_config(data=data), run, progress=False)
    assert main(["evaluate", str(run), "--bootstrap", "20", "-q"]) == 0
    needles = set()
    for site in ("nih_style", "chexpert_style", "dicom_style"):
        site_dir = tiny_manifests / site
        manifest = pd.read_parquet(site_dir / "manifest.parquet")
        needles |= {p for p in manifest["image_path"].astype(str)}
        needles |= {Path(p).name for p in manifest["image_path"].astype(str)}
        needles |= {p for p in manifest["patient_id"].astype(str) if len(p) >= 6}
        needles |= {p for p in manifest["study_id"].astype(str) if len(p) >= 6}
        export = json.loads((site_dir / "site.json").read_text())["export_root"]
        needles.add(export)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.name == "report.json" for p in files)
    for path in files:
        blob = path.read_bytes()
        found = [n for n in needles if n.encode() in blob]
        assert not found, f"{path.relative_to(run)} holds {found[:3]}"


# --------------------------------------------------------------------------- a full disk (SECURITY.md R6)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """``ulimit -f``: every write past ``limit`` bytes fails with EFBIG (Python ignores SIGXFSZ), as on a
    full disk; restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _strict_rows(path: Path) -> list[dict]:
    """``metrics.jsonl`` read by a strict JSON reader (a bare NaN or Infinity fails)."""
    def refuse(name):
        raise ValueError(f"{path.name} holds {name}: not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_a_full_disk_during_train_stops_with_resume_advice_and_keeps_the_checkpoints(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    (run / "final_model.pt").unlink()
    for path in checkpoint_paths(run)[-1:]:  # the run was killed before its last round's checkpoint
        path.unlink()
    kept = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    with file_size_limit(150_000):  # a checkpoint is ~360 KB: its write fails, as torch.save's on a full disk
        code, err = _cli(["train", config, "--out", run, "--resume", "-q"], capsys)
    assert code == 1, err
    assert "run stopped: no space left writing" in err and "File too large" in err and "--resume" in err
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == kept, "no half checkpoint"
    assert not (run / "final_model.pt").exists()
    assert [r["round"] for r in _strict_rows(run / "metrics.jsonl")] == [0, 1, 2]
    code, err = _cli(["train", config, "--out", run, "--resume", "-q"], capsys)
    assert code == 0, err
    ref = torch.load(finished / "run" / "final_model.pt", weights_only=True)["global"]
    got = torch.load(run / "final_model.pt", weights_only=True)["global"]
    assert all(torch.equal(ref[k], got[k]) for k in ref), "the resumed run ends as the uninterrupted one"
    assert [r["round"] for r in _strict_rows(run / "metrics.jsonl")] == [0, 1, 2]


def test_metrics_jsonl_is_strict_json_and_a_torn_line_is_dropped_on_resume(finished, tmp_path, capsys):
    run, config = _copy(finished, tmp_path)
    rows = _strict_rows(run / "metrics.jsonl")
    assert any(v is None for r in rows for site in r["val"].values() for v in site["auroc"].values()), \
        "the tiny run has undefined AUROCs: written as null, never NaN"
    (run / "final_model.pt").unlink()
    checkpoint_paths(run)[-1].unlink()
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"round": 3, "val": {"nih_sty')  # a write cut short by a crash
    code, err = _cli(["train", config, "--out", run, "--resume", "-q"], capsys)
    assert code == 0, err
    assert [r["round"] for r in _strict_rows(run / "metrics.jsonl")] == [0, 1, 2]


def test_a_full_disk_during_evaluate_stops_with_advice_and_keeps_the_previous_report(tmp_path, capsys):
    from ..evaluation.conftest import synthetic_predictions, write_run

    run = write_run(tmp_path / "run", synthetic_predictions(sites=("site-a",), patients_per_site=30))
    assert main(["evaluate", str(run), "--bootstrap", "0", "-q"]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert len(before["report.json"]) > 10_000
    with file_size_limit(10_000):
        code, err = _cli(["evaluate", run, "--bootstrap", "0", "-q"], capsys)
    assert code == 1, err
    assert f"run stopped: no space left writing {run / 'report.json'}" in err and "Traceback" not in err
    assert "run `fedcxr evaluate` again" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before, "old outputs intact"
