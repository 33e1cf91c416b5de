"""The run driver end to end (in-process): runs, run directory, resume after a kill, config errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedcxr.cli import main
from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config


def _weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fedavg_finetune_writes_a_complete_run_directory(tiny_manifests, tmp_path):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache"))
    run = run_experiment(cfg, tmp_path / "run", progress=False)
    assert run["status"] == "finished" and run["method"] == "FedAvg_Finetune"
    assert run["classes"] == [c for c in run["class_sets"]["dicom_style"]]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert set(rows[0]["train"]) == {"nih_style", "chexpert_style"}
    assert "dicom_style" in rows[-1]["val"]
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert len(list((tmp_path / "run" / "checkpoints").glob("round_*.pt"))) == 2


def test_same_seed_same_weights_and_different_seed_differs(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)
    run_experiment(load_config(data=data), tmp_path / "a", progress=False)
    run_experiment(load_config(data=data), tmp_path / "b", progress=False)
    run_experiment(load_config(data={**data, "seed": 1}), tmp_path / "c", progress=False)
    assert _same(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    assert not _same(_weights(tmp_path / "a"), _weights(tmp_path / "c"))


@pytest.mark.slow  # a real `fedcxr train` process, killed and resumed (~8 s on 2 cores)
def test_killed_run_resumes_to_the_same_weights(tiny_manifests, tmp_path):
    """Kill a real `fedcxr train` process after its first checkpoint, resume, compare."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=4)
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["train", str(config), "--out", str(tmp_path / "straight"), "--quiet"]) == 0

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main())",
           "train", str(config), "--out", str(killed), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not list((killed / "checkpoints").glob("round_0001.pt")):
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "final_model.pt").exists(), "the run finished before it could be killed"
    assert list((killed / "checkpoints").glob("round_*.pt"))

    assert main(["train", str(config), "--out", str(killed), "--quiet"]) == 2  # refuses without --resume
    assert main(["train", str(config), "--out", str(killed), "--resume", "--quiet"]) == 0
    assert _same(_weights(tmp_path / "straight"), _weights(killed))
    rounds = [json.loads(l)["round"] for l in (killed / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]


def test_resume_with_a_different_config_is_refused(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    (tmp_path / "run" / "final_model.pt").unlink()
    with pytest.raises(UserError, match="config differs"):
        run_experiment(load_config(data={**data, "source": {"lr": 0.5, "batch_size": 16, "steps": 2}}),
                       tmp_path / "run", resume=True, progress=False)


@pytest.mark.parametrize("overrides, message", [
    ({"strategy": "FedMagic"}, "strategy: unknown method 'FedMagic' (did you mean `FedAvg`?); known: FedAvg"),
    ({"sites": ["nih_style", "nowhere"]}, "site 'nowhere'"),
    ({"model": {"backbone": "resnet_tiny", "classes": ["cardio"]}}, "unknown class"),
])
def test_bad_configs_exit_2_naming_the_problem(tiny_manifests, tmp_path, capsys, overrides, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", **overrides)))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err


def test_gp_with_an_unlabeled_target_exits_2(tiny_manifests, tmp_path, capsys):
    """midrc_style labels covid19 only: as a target for cardiomegaly it has no labeled rows."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg_Finetune_GP", target="midrc_style",
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly"]})
    config = tmp_path / "gp.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2
    assert "no labeled training rows" in capsys.readouterr().err


# --------------------------------------------------------------------------- unlabeled sites, warm start


@pytest.fixture
def unlabeled_site(tiny_manifests, tmp_path):
    """A synthetic hospital's images ingested with no labels at all (the ``images`` source)."""
    from fedcxr.site_adapters.ingest import run_ingest
    from fedcxr.site_adapters.manifest import read_site_json

    import shutil

    export = Path(read_site_json(tiny_manifests / "dicom_style")["export_root"])
    shutil.copytree(export, tmp_path / "scans", ignore=shutil.ignore_patterns("labels.csv"))
    report = run_ingest("images", tmp_path / "scans", tmp_path / "unlabeled", site_name="ward", progress=False)
    assert report["sites"]["ward"]["unlabeled"]
    return tmp_path / "unlabeled" / "ward"


def test_unlabeled_site_is_refused_as_a_source(tiny_manifests, unlabeled_site, tmp_path):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", sites=["nih_style", str(unlabeled_site)]))
    with pytest.raises(UserError, match=r"no finding labels.*a source must be labeled.*FACT"):
        run_experiment(cfg, tmp_path / "run", progress=False)


def test_fact_trains_with_an_unlabeled_target(tiny_manifests, unlabeled_site, tmp_path):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FACT", rounds=1,
                                       target=str(unlabeled_site), class_source="sources"))
    run = run_experiment(cfg, tmp_path / "run", progress=False)
    assert run["status"] == "finished" and run["class_sets"]["ward"] == []
    bad = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FACT", rounds=1,
                                       target=str(unlabeled_site)))
    with pytest.raises(UserError, match="unlabeled.*class_source: sources"):
        run_experiment(bad, tmp_path / "run2", progress=False)


def test_warm_start_from_a_finished_run(tiny_manifests, tmp_path):
    """model.weights = a run's final_model.pt: round 0 starts from its global weights."""
    from fedcxr.pipeline.run_driver import build_context, initial_model
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.protocols import get_protocol

    first = tmp_path / "first"
    run_experiment(load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1)), first, progress=False)
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1,
                                       model={"backbone": "resnet_tiny", "hidden": 16,
                                              "weights": str(first / "final_model.pt")}))
    transport = InProcessTransport(build_runners(cfg, torch.device("cpu"), False))
    ctx = build_context(cfg, get_protocol(cfg.strategy), transport)
    assert _same(initial_model(cfg, ctx), _weights(first))


# --------------------------------------------------------------------------- select_round: best_val


def _val_means(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = [[v["mean_auroc"] for v in row["val"].values() if v["mean_auroc"] is not None] for row in rows]
    assert all(s for s in scores), "the test needs a validation AUROC in every round"
    return [sum(s) / len(s) for s in scores]


def test_best_val_keeps_the_round_with_the_highest_validation_auroc(tiny_manifests, tmp_path):
    """final_model.pt holds the best-validation round: the same weights as a run stopped after that round."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=4, strategy="FedAvg",
                       source={"lr": 5e-2, "batch_size": 16, "steps": 3})
    run = run_experiment(load_config(data={**data, "select_round": "best_val"}), tmp_path / "best", progress=False)
    means = _val_means(tmp_path / "best")
    best = max(range(len(means)), key=lambda r: (means[r], -r))  # ties: the earlier round
    assert run["selected_round"]["round"] == best
    assert run["selected_round"]["val_auroc"] == pytest.approx(means[best])
    run_experiment(load_config(data={**data, "rounds": best + 1}), tmp_path / "stopped", progress=False)
    assert _same(_weights(tmp_path / "best"), _weights(tmp_path / "stopped"))
    if best != len(means) - 1:  # the tiny run's validation AUROC moves: the last round is usually not the best
        run_experiment(load_config(data=data), tmp_path / "last", progress=False)
        assert not _same(_weights(tmp_path / "best"), _weights(tmp_path / "last"))


def test_best_val_survives_a_resume(tiny_manifests, tmp_path):
    """The kept round is in the checkpoint: resuming after round 2 selects as the uninterrupted run."""
    import shutil

    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=4, strategy="FedAvg",
                       select_round="best_val", source={"lr": 5e-2, "batch_size": 16, "steps": 3})
    straight = run_experiment(load_config(data=data), tmp_path / "straight", progress=False)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    for name in ("final_model.pt", "final_model.pt.sha256", "checkpoints/round_0003.pt",
                 "checkpoints/round_0003.pt.sha256"):
        (tmp_path / "resumed" / name).unlink()
    resumed = run_experiment(load_config(data=data), tmp_path / "resumed", resume=True, progress=False)
    assert resumed["selected_round"] == straight["selected_round"]
    assert _same(_weights(tmp_path / "straight"), _weights(tmp_path / "resumed"))


def test_best_val_without_validation_is_a_config_error(tiny_manifests, tmp_path):
    with pytest.raises(UserError, match="eval_every"):
        load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", select_round="best_val", eval_every=0))


def test_a_finished_run_reloads_with_its_own_architecture(tiny_manifests, tmp_path):
    """predict/evaluate/bundle rebuild the run's network from final_model.pt's model block: stem and norm included."""
    from fedcxr.pipeline.inference import load_run_model

    model = {"backbone": "resnet_tiny", "hidden": 16, "stem": "small", "norm": "group"}
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=1, model=model)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    loaded = load_run_model(tmp_path / "run").model
    assert loaded.backbone.conv1.kernel_size == (3, 3)
    assert any(isinstance(m, torch.nn.GroupNorm) for m in loaded.modules())
    assert _same(loaded.state_dict(), _weights(tmp_path / "run"))


def test_a_round_record_counts_the_sites_that_did_not_answer_apart_from_the_refused():
    """metrics.jsonl's ``missed`` maps this round's absent sites to why; the round line counts a refused
    reply, which ``missed`` also holds, under ``refused`` only."""
    from types import SimpleNamespace

    from fedcxr.pipeline.run_driver import _round_record
    from fedcxr.pipeline.run_log import round_line

    refused = {"round": 1, "task": "train", "site": "b", "check": "norm", "reason": "too long"}
    ctx = SimpleNamespace(refused=[refused], sources=["a", "b", "c"], notes={}, once=lambda key: True, missed=[
        {"round": 0, "task": "train", "site": "c"}, {"round": 1, "task": "train", "site": "c"},
        {"round": 1, "task": "train", "site": "b", "reason": "rejected: too long"}])
    record = _round_record(ctx, 1)
    assert record["missed"] == {"c": {"why": "no reply", "task": "train", "reason": "no reply"},
                                "b": {"why": "refused", "task": "train", "reason": "rejected: too long"}}
    assert record["refused"] == [refused]
    assert round_line({"round": 1, "train": {"a": {"loss": 0.5}}, **record}, 2) == \
        "round 2/2: loss a 0.500; missed c; refused b"
