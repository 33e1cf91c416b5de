"""The same protocols on NVIDIA FLARE (the simulator) as in-process (DESIGN §8); POC mode is
checked on the README's own POC run (``test_readme_flare.py``: one POC system per suite).

The experiments run in the simulator jobs of ``shared_job.py`` (the ``flare_runs`` fixture below;
every test of those jobs is in this file, so ``pytest -n 2 --dist loadfile`` runs them once): E2
FL_Surgical, E3 FedAvg_Finetune_GP, E1 FedAvg with faulty sites, E4 FedAvg + FedBN killed after
its first checkpoint and resumed by a second job, SCAFFOLD, FedAdam and a hostile site; the
in-process runs of the same configs are the references.

SCAFFOLD's round 1 uses the control variates of round 0: the server's c travels in the task,
each site's c_i stays in the site's own state folder (never in the server's run directory), and
Δc_i comes back in the reply. FedAdam's moments live in the server's checkpoints. The hostile
experiment is FedAvg over four sources with ``aggregation: median``; the job's test client
script, with the very function the in-process tests use (``benchmarks/hostile_sites.py``'s
``corrupt``), makes one site send a 1e30 update in round 0 and another claim 10¹² samples in
round 1; the in-process run through ``HostileTransport`` with the same faults is the reference.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("nvflare")

import fedcxr  # noqa: E402
from fedcxr.cli import main  # noqa: E402
from fedcxr.flare.wire import EXTRA_PREFIX, REPLY_KEYS, check_summary  # noqa: E402
from fedcxr.pipeline.checkpoints import load_checkpoint, load_tensors  # noqa: E402
from fedcxr.pipeline.config import config_fingerprint  # noqa: E402
from fedcxr.pipeline.keys import CONTROL_PREFIX  # noqa: E402
from fedcxr.pipeline.messages import WEIGHT_TYPES  # noqa: E402
from fedcxr.pipeline.protocols.fedopt import CONTROL_DELTA_PREFIX  # noqa: E402
from fedcxr.vocab import CLASSES  # noqa: E402

from ..benchmarks.conftest import load_bench  # noqa: E402
from ..conftest import tiny_config  # noqa: E402
from .conftest import final_model as _final  # noqa: E402
from .conftest import max_diff as _max_diff  # noqa: E402
from .shared_job import ALL, HOSTILE_FAULTS, ORDER, in_process_runs, run_jobs  # noqa: E402


def _logs(run_dir: Path) -> str:
    """Every FLARE log of every attempt (server, sites, simulator output)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "flare" / "logs").rglob("*"))
                     if p.is_file())


@pytest.fixture(scope="module")
def flare_runs(tiny_manifests, tmp_path_factory):
    """The shared simulator jobs (``shared_job.py``); defined here, not in a conftest, so that no
    other test file can make a second xdist worker run them again."""
    return run_jobs(tiny_manifests, tmp_path_factory.mktemp("flare"))


@pytest.fixture(scope="module")
def in_process_refs(flare_runs):
    """The in-process runs of the shared jobs' configs (as ``fedcxr train`` runs them), by name."""
    return in_process_runs(flare_runs)


# --------------------------------------------------------------------------- same results as in-process


@pytest.mark.parametrize("name", ["E2", "E3"], ids=["FL_Surgical", "FedAvg_Finetune_GP"])
def test_simulator_ends_with_the_in_process_weights(flare_runs, in_process_refs, name):
    flare_final, ref = _final(flare_runs.dirs[name]), _final(in_process_refs(name))
    assert flare_runs.payloads[name]["missed"] == []  # a site that timed out changes the weights: say so first
    assert _max_diff(flare_final["global"], ref["global"]) <= 1e-5
    assert flare_final["classes"] == ref["classes"]
    rows = [json.loads(line) for line in (flare_runs.dirs[name] / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1] and flare_runs.payloads[name]["missed"] == []


def test_killed_server_resumes_to_the_uninterrupted_weights(flare_runs, in_process_refs):
    """FedAvg+FedBN: the server (and every site) SIGKILLed after round 0; resubmitted; same end."""
    killed = flare_runs.killed
    assert not killed.final_existed and "E4" in killed.error
    with pytest.raises(ProcessLookupError):
        os.killpg(killed.pgid, 0)
    assert killed.leftovers == [], "the clients of the killed job (own sessions) were ended too"
    run_dir = flare_runs.dirs["E4"]
    flare_final, ref = _final(run_dir), _final(in_process_refs("E4"))
    assert _max_diff(flare_final["global"], ref["global"]) <= 1e-5
    assert set(flare_final["local_states"]) == set(ref["local_states"]) == {"nih_style", "chexpert_style",
                                                                            "midrc_style"}
    for site, state in ref["local_states"].items():  # each site's BN statistics, restored from its own disk
        assert state and _max_diff(flare_final["local_states"][site], state) <= 1e-5
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1]
    logs = flare_runs.flare_dir / "logs"
    assert (logs / "attempt-1").is_dir() and (logs / "attempt-2").is_dir(), "the killed attempt's logs are kept"


def test_resubmitting_finished_runs_keeps_their_cross_site_reports(flare_runs):
    """Job 2 asks no site to evaluate the runs job 1 finished and every site evaluated (same model, same
    settings: same report); E1, whose stopped site could not evaluate in job 1, and the run job 2
    continues (E4) are evaluated."""
    from fedcxr.flare.controller import read_status

    written = flare_runs.reports_written_by_job1
    assert set(written) == set(ORDER) - {"E4"}
    kept = set(written) - {"E1"}
    assert (flare_runs.dirs["E1"] / "report.json").stat().st_mtime_ns > written["E1"]
    for name in kept:
        assert (flare_runs.dirs[name] / "report.json").stat().st_mtime_ns == written[name], name
        status = read_status(flare_runs.dirs[name])
        assert status["status"] == "finished" and re.fullmatch(r"\d+ sites reported, \d+ not", status["cross_site"])
    log = (flare_runs.flare_dir / "logs" / "attempt-2" / "simulator.log").read_text()
    assert log.count("cross-site evaluation of this finished run kept") == len(kept)
    assert flare_runs.reports["E4"]["source"] == "site summaries"


def test_every_site_reports_the_final_model_on_its_own_test_split(flare_runs):
    for name in ("E2", "E3", "E4"):
        report = flare_runs.reports[name]
        run = json.loads((flare_runs.dirs[name] / "run.json").read_text())
        assert report["source"] == "site summaries" and report["ci"]["n_boot"] == 10
        assert list(report["sites"]) == run["eval_sites"] and not report["sites_without_predictions"]
        for site, entry in report["sites"].items():
            assert entry["n_rows"] > 0 and [r["class"] for r in entry["per_class"]] == report["classes"]
            assert set(entry["subgroups"]) == {"sex", "age_bin", "race"}
        assert (flare_runs.dirs[name] / "cross_site_val" / "cross_val_results.json").is_file()
    models = flare_runs.reports["E4"]["cross_site"]["models"]  # FedBN: own statistics and the global model
    assert set(models) == {"SRV_server", *ALL[:3]} and set(models["SRV_server"]) == set(ALL[:3])


def test_a_site_failing_its_evaluation_is_named_and_the_others_are_reported(flare_runs):
    report = flare_runs.reports["E1"]
    assert list(report["sites"]) == ["nih_style", "chexpert_style", "dicom_style"]
    failed = {item["site"]: item["reason"] for item in report["sites_without_predictions"]}
    assert list(failed) == ["midrc_style"] and failed["midrc_style"].startswith("evaluation failed")
    assert "RuntimeError" in failed["midrc_style"] and "test fault" not in failed["midrc_style"]
    assert "Site midrc_style: not evaluated" in (flare_runs.dirs["E1"] / "report.md").read_text()
    assert json.loads((flare_runs.dirs["E1"] / "flare_status.json").read_text())["cross_site"].startswith(
        "3 sites reported, 1 not")


def test_fedcxr_report_builds_the_papers_table_from_flare_runs(flare_runs, tmp_path):
    names = ("E2", "E3")  # cross-site reports only: no predictions left the sites
    dirs = [str(flare_runs.dirs[n]) for n in names]
    assert main(["report", *dirs, "--out", str(tmp_path / "cmp")]) == 0
    result = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    labels = {(c["target"], c["site"]): c["label"] for c in result["columns"]}
    rows = {row["method"]: row["cells"] for row in result["table"]}
    assert len(rows) == 2
    for name in names:
        report = flare_runs.reports[name]
        for site, entry in report["sites"].items():
            cell = rows[report["method"]][labels[report["target"], site]]
            assert cell["auroc_mean"] == pytest.approx(entry["mean_auroc"])


def test_the_sites_stream_their_scalars_to_the_server_through_flare_experiment_tracking(flare_runs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def tags(folder: Path) -> set:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        return set(acc.Tags()["scalars"])

    streamed = flare_runs.flare_dir / "tensorboard"
    assert {p.name for p in streamed.iterdir()} == set(ALL)
    for site in ALL:
        assert "train/loss" in tags(streamed / site), site
    server = tags(flare_runs.dirs["E1"] / "tensorboard")  # the server's own per-round scalars, as in-process
    assert {f"train/{s}/loss" for s in ("nih_style",)} <= server and "round/seconds" in server
    assert all(re.fullmatch(r"[A-Za-z0-9_/ ()+.-]+", t) for t in server | tags(streamed / "nih_style"))


def test_flares_persistor_holds_the_last_experiments_global_model(flare_runs):
    assert ORDER[-1] == "E4"
    saved = torch.load(flare_runs.flare_dir / "FL_global_model.pt", weights_only=True)["model"]
    assert _max_diff(saved, _final(flare_runs.dirs["E4"])["global"]) == 0.0


def test_fedcxr_evaluate_works_on_a_flare_run_directory_and_keeps_its_cross_site_report(flare_runs, tmp_path,
                                                                                        capsys):
    import shutil

    run = tmp_path / "E2"  # a copy: the session's run directories stay as the job wrote them
    shutil.copytree(flare_runs.dirs["E2"], run, ignore=shutil.ignore_patterns("flare"))
    assert main(["evaluate", str(run), "--bootstrap", "0", "--split", "val"]) == 2  # never over it silently
    assert "--replace-cross-site" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--bootstrap", "0", "--split", "val", "--replace-cross-site"]) == 0
    assert json.loads((run / "cross_site_report" / "report.json").read_text())["source"] == "site summaries"
    assert json.loads((run / "report.json").read_text())["split"] == "val"


# --------------------------------------------------------------------------- the reviewers' baselines: SCAFFOLD, FedAdam


@pytest.mark.parametrize("name", ["SCAFFOLD", "FedAdam"])
def test_flare_simulator_ends_with_the_in_process_weights(flare_runs, in_process_refs, name):
    assert flare_runs.payloads[name]["missed"] == [], "a site that timed out changes the weights: say so first"
    assert _max_diff(_final(flare_runs.dirs[name])["global"], _final(in_process_refs(name))["global"]) <= 1e-5


def test_server_state_is_checkpointed_and_each_sites_c_i_stays_at_the_site(flare_runs, in_process_refs):
    run_dir, flare_dir = flare_runs.dirs["SCAFFOLD"], flare_runs.flare_dir
    server = load_checkpoint(run_dir / "checkpoints" / "round_0001.pt")
    reference = load_checkpoint(in_process_refs("SCAFFOLD") / "checkpoints" / "round_0001.pt")
    assert _max_diff(server["state"]["control"], reference["state"]["control"]) <= 1e-5
    assert server["local_states"] == {}, "FLARE sites keep their own state: none of it reaches the server"
    run = config_fingerprint(flare_runs.exps["SCAFFOLD"])
    for site in ("nih_style", "chexpert_style"):
        saved = load_tensors(flare_dir / "state" / site / run / "round_0001.pt")
        c_i = {k: v for k, v in saved.items() if k.startswith(CONTROL_PREFIX)}
        expected = {k: v for k, v in reference["local_states"][site].items() if k.startswith(CONTROL_PREFIX)}
        assert c_i and _max_diff(c_i, expected) <= 1e-5, site
    adam = load_checkpoint(flare_runs.dirs["FedAdam"] / "checkpoints" / "round_0001.pt")["state"]["server_opt"]
    assert set(adam) == {"m", "v"} and adam["m"]


# --------------------------------------------------------------------------- a hostile site: the same defences and robust rule


def test_flare_refuses_the_hostile_replies_and_ends_with_the_in_process_median_model(flare_runs):
    cfg, run_dir = flare_runs.exps["hostile"], flare_runs.dirs["hostile"]
    reference = load_bench("hostile_sites").hostile_run(cfg, flare_runs.root / "hostile-in-process", HOSTILE_FAULTS)
    flare = flare_runs.payloads["hostile"]

    expected = [(0, "chexpert_style", "train", "norm"), (1, "midrc_style", "train", "counts")]
    for run in (reference, flare):
        assert run["status"] == "finished"
        assert [(e["round"], e["site"], e["task"], e["check"]) for e in run["refused"]] == expected
    assert [e["reason"] for e in flare["refused"]] == [e["reason"] for e in reference["refused"]]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [[e["site"] for e in row["refused"]] for row in rows] == [["chexpert_style"], ["midrc_style"]]
    assert [row["aggregation"][0]["rule"] for row in rows] == ["median", "median"]
    got, want = _final(run_dir)["global"], _final(flare_runs.root / "hostile-in-process")["global"]
    assert _max_diff(got, want) <= 1e-5


# --------------------------------------------------------------------------- failures


def test_nan_inf_and_wrong_shape_updates_are_rejected_with_a_logged_reason(flare_runs):
    run = flare_runs.payloads["E1"]
    missed = [m for m in run["missed"] if m["round"] == 1]
    assert {m["site"] for m in missed} == {"chexpert_style", "midrc_style", "dicom_style"}
    shape = next(m for m in missed if m["site"] == "dicom_style")
    assert shape["reason"].startswith("rejected:") and "shape" in shape["reason"]
    status = json.loads((flare_runs.dirs["E1"] / "flare_status.json").read_text())
    reasons = {(r["round"], r["site"]): r["reason"] for r in status["rejected"]}
    assert "NaN" in reasons[1, "chexpert_style"] and "infinite" in reasons[1, "midrc_style"]
    logs = _logs(flare_runs.dirs[ORDER[0]])
    assert re.search(r"rejected reply from chexpert_style: parameters: entry '[^']+' has 1 NaN", logs)
    assert re.search(r"rejected reply from midrc_style: parameters: entry '[^']+' has 1 infinite", logs)
    assert re.search(r"rejected update from dicom_style: .*shape", logs)
    rows = _metrics(flare_runs.dirs["E1"])
    assert set(rows[1]["train"]) == {"nih_style"}  # round 1 averaged only the healthy site
    assert all(torch.isfinite(v).all() for v in _final(flare_runs.dirs["E1"])["global"].values()
               if v.is_floating_point())


def test_a_site_that_stops_mid_run_is_recorded_and_the_rounds_go_on(flare_runs):
    run = flare_runs.payloads["E1"]
    assert run["status"] == "finished"
    assert {m["site"] for m in run["missed"] if m["round"] == 2} == {"dicom_style"}
    rows = _metrics(flare_runs.dirs["E1"])
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert sorted(rows[2]["train"]) == ["chexpert_style", "midrc_style", "nih_style"]
    assert "did not answer task train" in _logs(flare_runs.dirs[ORDER[0]])


def test_a_sampled_round_asks_only_the_drawn_clients_and_the_others_are_not_missed(flare_runs, in_process_refs):
    """participation.fraction 0.5 of four clients: FLARE asks the in-process draw; a site not asked is not missed."""
    from fedcxr.pipeline.participation import sample_sites

    cfg = flare_runs.exps["sampled"]
    draws = [sample_sites(ALL, 0.5, 1, cfg.seed, r) for r in range(cfg.rounds)]
    rows = _metrics(flare_runs.dirs["sampled"])
    assert [row["asked"] for row in rows] == draws and len({tuple(d) for d in draws}) == 2
    assert [list(row["train"]) for row in rows] == draws
    assert flare_runs.payloads["sampled"]["missed"] == [] and not any("missed" in row for row in rows)
    ref = _final(in_process_refs("sampled"))
    assert _max_diff(_final(flare_runs.dirs["sampled"])["global"], ref["global"]) <= 1e-5


def test_participation_deadline_bounds_a_rounds_training_tasks_and_timeout_the_rest():
    """participation.deadline_s is FLARE's wait for a round's tasks; --timeout (task_timeout) for every other."""
    from types import SimpleNamespace

    from fedcxr.flare.controller import FlareTransport
    from fedcxr.pipeline.messages import EvaluateTask, TrainTask

    waits = []
    controller = SimpleNamespace(task_timeout=20, dispatch=lambda task, groups, round_, timeout: waits.append(
        (task, round_, timeout)) or {})
    train = TrainTask.build(round=3, seed=0, role="source", head_classes=["edema"], param_classes=["edema"], lr=1e-3,
                            batch_size=4)
    evaluate = EvaluateTask.build(head_classes=["edema"], param_classes=["edema"])
    for deadline in (None, 12.5):
        transport = FlareTransport(controller, ["a", "b"], runner={}, run="x", deadline_s=deadline)
        assert transport.run("train", ["a", "b"], {}, train) == {}
        assert transport.absent["a"] == {"why": "late", "reason": f"no reply within {13 if deadline else 20} s ("
                                         f"{'participation.deadline_s' if deadline else '--timeout'})"}
        transport.run("evaluate", ["a"], {}, evaluate)
    assert waits == [("train", 3, 20), ("evaluate", None, 20), ("train", 3, 13), ("evaluate", None, 20)]
    controller.task_timeout = 0
    FlareTransport(controller, ["a"], runner={}, run="x").run("train", ["a"], {}, train)
    assert waits[-1] == ("train", 3, 0)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- privacy


def test_only_parameters_counts_class_names_and_metrics_leave_a_site(flare_runs):
    state_keys = set()
    for name in ORDER:
        state_keys |= set(_final(flare_runs.dirs[name])["global"])
    allowed_keys = {"p/" + k for k in state_keys}  # per-batch target updates stay at the target
    allowed_keys |= {EXTRA_PREFIX + CONTROL_DELTA_PREFIX + k for k in state_keys}  # SCAFFOLD's Δc_i
    entries = [json.loads(line) for path in flare_runs.record.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert {p.stem for p in flare_runs.record.glob("*.jsonl")} == set(ALL)
    assert len(entries) > 50
    words = set(CLASSES) | set(REPLY_KEYS) | {"reply", "loss", "main_loss", "aux_loss", "n_train", "n_val", "n_test",
                                              "n_labeled_train", "labeled_per_class", "split", "val", "n", "auroc",
                                              "mean_auroc", "idd_train", "idd_train_sum", "idd_after", "fedcxr", "error", "betas",
                                                  "manifest_hash", "model_owner", "SRV_server", "test",
                                              "RuntimeError", "best_epoch", "val_loss",
                                              "scaffold_steps",  # SCAFFOLD's K, a count of local steps
                                              "cases",  # a validation split's positive/negative patients per class
                                              "summary", *WEIGHT_TYPES, *ALL}
    summaries = 0
    for entry in entries:
        metrics = entry["meta"]["fedcxr"].get("metrics") or {}
        if "model_owner" in metrics:  # a cross-site evaluation reply: a summary, scanned, and no tensors
            assert entry["param_keys"] == []
            check_summary(metrics.pop("summary", {}))
            summaries += 1
        assert set(entry["param_keys"]) <= allowed_keys, set(entry["param_keys"]) - allowed_keys
        assert set(entry["dtype_kinds"]) <= {"f", "i", "u", "b"}
        assert set(entry["meta"]) == {"fedcxr"}
        assert set(_strings(entry["meta"])) <= words, set(_strings(entry["meta"])) - words
    assert summaries >= 9, "every evaluated site of every experiment sent a summary"


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            if k == "manifest_hash":  # a SHA-256 of the manifest: 64 hex digits, nothing else
                assert isinstance(v, str) and len(v) == 64 and set(v) <= set("0123456789abcdef"), v
                continue
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_no_patient_identifier_in_any_flare_or_fedcxr_log(flare_runs):
    import pandas as pd

    needles = set()
    for site in ALL:
        manifest = pd.read_parquet(flare_runs.manifests / site / "manifest.parquet")
        for column in ("patient_id", "study_id", "image_path"):
            needles |= {str(v) for v in manifest[column].dropna() if len(str(v)) >= 8}
        needles |= {Path(str(v)).name for v in manifest["image_path"].dropna() if len(Path(str(v)).name) >= 8}
    texts = {}
    for name in ORDER:
        run_dir = flare_runs.dirs[name]
        for path in run_dir.rglob("*"):
            if path.is_file() and path.suffix not in (".pt", ".u8", ".npy", ".png", ".parquet"):
                texts[str(path)] = path.read_text(errors="replace")
    for path in flare_runs.record.glob("*.jsonl"):
        texts[str(path)] = path.read_text()
    assert any("flare/logs" in p for p in texts) and len(texts) > 20
    leaks = [(p, n) for p, text in texts.items() for n in needles if n in text]
    assert not leaks, leaks[:5]


# --------------------------------------------------------------------------- export and refusals


def test_export_writes_a_portable_job(tiny_manifests, tmp_path):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache")))
    assert main(["flare", "export", str(config), "--out", str(tmp_path / "job"), "--timeout", "600",
                 "--run-dir", "fedcxr-runs/tiny"]) == 0
    job = tmp_path / "job"
    meta = json.loads((job / "meta.json").read_text())
    assert set(meta["deploy_map"]) == {"app_server", "app_nih_style", "app_chexpert_style", "app_dicom_style"}
    server = json.loads((job / "app_server" / "config" / "config_fed_server.json").read_text())
    controller = server["workflows"][0]
    assert controller["path"] == "fedcxr.flare.controller.FedcxrController"
    spec = controller["args"]["experiments"][0]
    assert spec["run_dir"] == "fedcxr-runs/tiny" and spec["config"]["method"] == "FedAvg_Finetune"
    assert spec["config"]["manifests"] is None and spec["config"]["cache_dir"] is None
    assert controller["args"]["task_timeout"] == 600
    assert controller["args"]["fedcxr_version"] == fedcxr.__version__
    assert sorted(p.name for p in (job / "app_nih_style" / "custom").iterdir()) == ["fedcxr_client.py"]
    assert str(tmp_path) not in "".join(p.read_text() for p in job.rglob("*.json"))


def test_a_job_written_by_another_fedcxr_version_is_refused_by_name():
    from fedcxr.flare.controller import version_problem

    assert version_problem(fedcxr.__version__) is None and version_problem("") is None
    major, minor = fedcxr.__version__.split(".")[:2]
    problem = version_problem(f"{major}.{int(minor) + 1}.0")
    assert f"fedcxr {major}.{int(minor) + 1}.0" in problem and "re-export" in problem


def test_a_finished_runs_evaluation_is_kept_only_for_the_same_settings_and_a_report_on_disk(tmp_path):
    from fedcxr.flare.controller import write_status, kept_evaluation, mark_submitted, read_status
    from fedcxr.flare.cross_site import evaluation_settings

    settings = evaluation_settings({"n_boot": 10})
    write_status(tmp_path, "finished", rejected=[{"site": "a"}], cross_site="2 sites reported, 0 not",
                  evaluation=settings)
    mark_submitted(tmp_path, keep=True)  # resubmitted: "finished" is gone, the evaluation's record kept
    status = read_status(tmp_path)
    assert status["status"] == "submitted" and status["rejected"] == [{"site": "a"}]
    assert kept_evaluation(status, settings, tmp_path) is None, "no report.json on disk: evaluate again"
    (tmp_path / "report.json").write_text("{}")
    assert kept_evaluation(status, settings, tmp_path) == "2 sites reported, 0 not"
    assert kept_evaluation(status, evaluation_settings({"n_boot": 200}), tmp_path) is None
    assert kept_evaluation({}, settings, tmp_path) is None
    for result in ("failed: RuntimeError: x", "2 sites reported, 1 not"):  # a site that was down may answer now
        assert kept_evaluation({"evaluated_before": {"settings": settings, "cross_site": result}}, settings,
                               tmp_path) is None
    mark_submitted(tmp_path, keep=False)  # a new run: nothing kept
    assert "evaluated_before" not in read_status(tmp_path)
    write_status(tmp_path, "running", rejected=[])
    mark_submitted(tmp_path, keep=True)  # killed before it finished: nothing to keep
    assert "evaluated_before" not in read_status(tmp_path)


def test_flare_run_refuses_to_overwrite_a_run_like_train(tiny_manifests, tmp_path):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache")))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "round_0000.pt").write_bytes(b"")
    for command in ("simulate", "poc"):
        assert main(["flare", command, str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert not (tmp_path / "run" / "flare").exists(), "nothing was started"


def test_central_cannot_run_federated(tiny_manifests, tmp_path):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", strategy="Central")))
    assert main(["flare", "export", str(config), "--out", str(tmp_path / "job")]) == 2
