"""The FLARE simulator jobs that ``test_controller.py``'s experiments share (its ``flare_runs`` fixture).

A FLARE simulator job costs ~15-20 s here whatever it runs (the simulator and one process per
site start, import torch and fedcxr, and stop after NVFLARE's fixed grace periods), so the
experiments that ``test_controller.py`` checks share the two jobs of one fixture:

* job 1 runs, one after the other, E2 (FL_Surgical), E3 (FedAvg_Finetune_GP), SCAFFOLD, FedAdam,
  ``sampled`` (FedAvg asking two of the four sources per round: ``participation:``),
  ``hostile`` (FedAvg with ``aggregation: median`` over four sources, so that three are left for
  the median each round: one sends a 1e30 update at
  round 0, another claims 10¹² samples at round 1), E1 (FedAvg over four sites: at round 1 one
  sends NaN, one Inf, one a wrong-shape head; at round 2 that last site's training process stops;
  the Inf site fails its cross-site evaluation) and E4 (FedAvg + FedBN), and is SIGKILLed —
  server and clients — right after E4's first checkpoint;
* job 2 resubmits the same experiments: all but E4 are finished (nothing to redo, their cross-site
  reports kept), E4 continues.

Every experiment ends with the cross-site evaluation (10 bootstrap resamples). A job's
``privacy.filters`` apply to all its experiments, so the filters' job (``test_job.py``) and the
statistics job (``test_stats.py``) stay separate.

A test client script wraps fedcxr's own: it injects the faults above (keyed by each run's
fingerprint, so no other experiment sees them; the hostile faults are the very function the
in-process hostile tests use, ``benchmarks/hostile_sites.py``'s ``corrupt``) and records every
payload a site sends, for the privacy checks.

Why one test file: pytest-xdist builds a fixture once per worker that uses it, and the jobs take
~2 min on 2 cores. ``pytest -n 2`` hands out whole test files (``--dist loadfile`` in
pyproject.toml), so every test of these jobs lives in ``test_controller.py``, which also defines
the fixtures: a test in another file cannot start a second copy of the jobs by accident (pytest
answers "fixture 'flare_runs' not found").
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from ..conftest import tiny_config
from .conftest import processes_mentioning

REPO = Path(__file__).resolve().parents[2]

ALL = ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]
#: job 1's order: E1 stops its dicom site for good, so only E4 (which does not need it) follows it
ORDER = ("E2", "E3", "SCAFFOLD", "FedAdam", "sampled", "hostile", "E1", "E4")
#: the sampled experiment: half of the four sources per round (participation:), a deadline on FLARE's clock
SAMPLED = {"fraction": 0.5, "deadline_s": 300}
#: the hostile experiment's sources and faults (``benchmarks/hostile_sites.py`` names)
HOSTILE_SOURCES = ["nih_style", "chexpert_style", "midrc_style", "dicom_style"]  # 3 left after a refusal
HOSTILE_FAULTS = {"chexpert_style": {"0": "huge"}, "midrc_style": {"1": "inflate"}}
#: plain SGD for SCAFFOLD (its control variates correct SGD steps)
SGD = {"lr": 5e-2, "batch_size": 16, "steps": 2}

TEST_CLIENT = f'''
"""fedcxr's FLARE client plus test-only faults and a recorder of every payload leaving the site."""
import importlib.util, json, os
from pathlib import Path

import numpy as np
import nvflare.client as flare

from fedcxr.flare import client as flare_client

spec = importlib.util.spec_from_file_location("hostile_sites", {str(REPO / "benchmarks" / "hostile_sites.py")!r})
hostile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hostile)
FAULTS = json.loads(os.environ.get("FEDCXR_TEST_FAULTS", "{{}}"))  # {{run fingerprint: {{site: {{round: fault}}}}}}
RECORD = os.environ.get("FEDCXR_TEST_RECORD")
_send, _handle = flare.send, flare_client.FlareSite.handle


def recording_send(model, *args, **kwargs):
    if RECORD:
        params = model.params or {{}}
        kinds = sorted({{np.asarray(v).dtype.kind for v in params.values()}})
        entry = {{"param_keys": sorted(params), "dtype_kinds": kinds, "meta": model.meta}}
        with open(Path(RECORD) / (flare.get_site_name() + ".jsonl"), "a") as handle:
            handle.write(json.dumps(entry) + "\\n")
    return _send(model, *args, **kwargs)


def faulty_handle(self, task, params, config, settings, run):
    key = str(config.get("round")) if task == "train" else task
    fault = FAULTS.get(run, {{}}).get(self.name, {{}}).get(key) if task in ("train", "validate") else None
    if fault == "error":
        raise RuntimeError("test fault")
    if fault == "exit":
        raise SystemExit(0)  # the site's training process stops
    reply = _handle(self, task, params, config, settings, run)
    if fault in ("nan", "inf"):
        key = next(k for k, v in reply.params.items() if v.is_floating_point())
        reply.params[key].view(-1)[0] = float(fault)
    elif fault == "shape":
        reply.params["head.weight"] = reply.params["head.weight"][:-1]
    elif fault:
        reply = hostile.corrupt(reply, fault, params)
    return reply


flare.send = recording_send
flare_client.FlareSite.handle = faulty_handle
flare_client.main()
'''


def experiments(manifests: Path, cache: Path) -> dict:
    """The configs of the shared job, by name (see the module docstring)."""
    from fedcxr.pipeline.config import load_config

    def cfg(**overrides):
        return load_config(data=tiny_config(manifests, cache, **overrides))

    sources_only = dict(rounds=2, eval_every=0, target=None)
    return {
        "E1": cfg(strategy="FedAvg", sites=ALL, target=None, rounds=3, eval_every=0, min_sites=1),
        "E2": cfg(strategy="FL_Surgical"),
        "E3": cfg(strategy="FedAvg_Finetune_GP", eval_every=0),
        "E4": cfg(strategy="FedAvg", sites=ALL[:3], target=None, rounds=2, backbone_aggregation="fedbn", eval_every=0),
        "SCAFFOLD": cfg(strategy="SCAFFOLD", source=SGD, **sources_only),
        "FedAdam": cfg(strategy="FedAdam", **sources_only),
        "sampled": cfg(strategy="FedAvg", sites=ALL, participation=SAMPLED, **sources_only),
        "hostile": cfg(strategy="FedAvg", sites=HOSTILE_SOURCES, aggregation="median",
                       source={"lr": 2e-3, "batch_size": 16, "steps": 2},
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly", "covid19"]},
                       **sources_only),
    }


def run_jobs(manifests: Path, root: Path) -> SimpleNamespace:
    """The two simulator jobs of the module docstring, run in ``root``; their run directories, payloads
    and records."""
    from fedcxr.flare.simulator import simulate_many
    from fedcxr.pipeline.config import config_fingerprint

    exps = experiments(manifests, root / "cache")
    dirs = {name: root / name for name in exps}
    script = root / "test_client.py"
    script.write_text(TEST_CLIENT)
    record = root / "payloads"
    record.mkdir()
    faults = {
        config_fingerprint(exps["E1"]): {"chexpert_style": {"1": "nan"},
                                         "midrc_style": {"1": "inf", "validate": "error"},
                                         "dicom_style": {"1": "shape", "2": "exit"}},
        config_fingerprint(exps["hostile"]): HOSTILE_FAULTS,
    }
    env = {"FEDCXR_TEST_FAULTS": json.dumps(faults), "FEDCXR_TEST_RECORD": str(record)}
    common = dict(client_script=script, progress=False, env=env, timeout=600, evaluation={"n_boot": 10})
    runs = [(exps[n], dirs[n]) for n in ORDER]
    box: dict = {}

    def job1():
        try:
            simulate_many(runs, on_start=lambda proc: box.update(proc=proc), **common)
        except RuntimeError as exc:  # E4 was killed: it has no "finished" status
            box["error"] = str(exc)

    start = time.time()
    thread = threading.Thread(target=job1)
    thread.start()
    checkpoint = dirs["E4"] / "checkpoints" / "round_0000.pt"
    while thread.is_alive() and not checkpoint.exists():
        time.sleep(0.05)
    os.killpg(box["proc"].pid, signal.SIGKILL)  # the simulator: FLARE server and every client
    thread.join()
    flare_dir = dirs[ORDER[0]] / "flare"  # one FLARE job: its first run's flare/ folder
    killed = SimpleNamespace(final_existed=(dirs["E4"] / "final_model.pt").exists(), error=box.get("error", ""),
                             seconds=time.time() - start, pgid=box["proc"].pid,
                             leftovers=processes_mentioning(str(flare_dir)))
    written = {n: (dirs[n] / "report.json").stat().st_mtime_ns for n in dirs if (dirs[n] / "report.json").is_file()}
    start = time.time()
    payloads = simulate_many(runs, resume=True, **common)
    resumed_seconds = time.time() - start
    reports = {n: json.loads((dirs[n] / "report.json").read_text()) for n in dirs}  # before `fedcxr evaluate`
    return SimpleNamespace(exps=exps, dirs=dirs, record=record, killed=killed, root=root, reports=reports,
                           payloads=dict(zip(ORDER, payloads)), flare_dir=flare_dir, reports_written_by_job1=written,
                           resumed_seconds=resumed_seconds, manifests=manifests)


def in_process_runs(flare_runs: SimpleNamespace) -> Callable[[str], Path]:
    """The in-process runs of the shared jobs' configs (as ``fedcxr train`` runs them), by name, each
    run on first use."""
    from fedcxr.pipeline.run_driver import run_experiment

    done: dict = {}

    def ref(name: str) -> Path:
        if name not in done:
            done[name] = flare_runs.root / f"{name}-in-process"
            run_experiment(flare_runs.exps[name], done[name], progress=False)
        return done[name]

    return ref
