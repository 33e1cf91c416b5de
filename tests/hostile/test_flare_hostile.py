"""A hostile site over NVIDIA FLARE: the same defences and the same robust rule as in-process.

One FLARE simulator job (≈15 s of start-up, so one experiment): FedAvg over three sources with
``aggregation: median``; a test client script wraps fedcxr's own and, with the very function
the in-process tests use (``benchmarks/hostile_sites.py``'s ``corrupt``), makes one site send a
1e30 update in round 0 and another claim 10¹² samples in round 1. The in-process run through
``HostileTransport`` with the same faults is the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("nvflare")

from fedcxr.flare.simulator import simulate_many  # noqa: E402
from fedcxr.pipeline.config import load_config  # noqa: E402

from ..benchmarks.conftest import REPO, load_bench  # noqa: E402
from ..conftest import tiny_config  # noqa: E402

pytestmark = pytest.mark.slow

SOURCES = ["nih_style", "chexpert_style", "midrc_style"]
FAULTS = {"chexpert_style": {"0": "huge"}, "midrc_style": {"1": "inflate"}}

HOSTILE_CLIENT = f'''
"""fedcxr's FLARE client with one site's train replies rewritten by benchmarks/hostile_sites.py."""
import importlib.util, json, os

from fedcxr.flare import client as flare_client

spec = importlib.util.spec_from_file_location("hostile_sites", {str(REPO / "benchmarks" / "hostile_sites.py")!r})
hostile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hostile)
FAULTS = json.loads(os.environ["FEDCXR_TEST_FAULTS"])
_handle = flare_client.FlareSite.handle


def hostile_handle(self, task, params, config, settings, run):
    reply = _handle(self, task, params, config, settings, run)
    fault = FAULTS.get(self.name, {{}}).get(str(config.get("round"))) if task == "train" else None
    return hostile.corrupt(reply, fault, params) if fault else reply


flare_client.FlareSite.handle = hostile_handle
flare_client.main()
'''


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]


def test_flare_refuses_the_hostile_replies_and_ends_with_the_in_process_median_model(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg", sites=SOURCES, target=None, rounds=2,
                       eval_every=0, aggregation="median", source={"lr": 2e-3, "batch_size": 16, "steps": 2},
                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly", "covid19"]})
    cfg = load_config(data=data)
    reference = load_bench("hostile_sites").hostile_run(cfg, tmp_path / "in-process", FAULTS)

    script = tmp_path / "hostile_client.py"
    script.write_text(HOSTILE_CLIENT)
    [flare] = simulate_many([(cfg, tmp_path / "flare")], client_script=script, progress=False, timeout=600,
                            env={"FEDCXR_TEST_FAULTS": json.dumps(FAULTS)}, evaluation={"enabled": False})

    expected = [(0, "chexpert_style", "train", "norm"), (1, "midrc_style", "train", "counts")]
    for run in (reference, flare):
        assert run["status"] == "finished"
        assert [(e["round"], e["site"], e["task"], e["check"]) for e in run["refused"]] == expected
    assert [e["reason"] for e in flare["refused"]] == [e["reason"] for e in reference["refused"]]
    rows = [json.loads(line) for line in (tmp_path / "flare" / "metrics.jsonl").read_text().splitlines()]
    assert [[e["site"] for e in row["refused"]] for row in rows] == [["chexpert_style"], ["midrc_style"]]
    assert [row["aggregation"][0]["rule"] for row in rows] == ["median", "median"]
    got, want = _final(tmp_path / "flare"), _final(tmp_path / "in-process")
    assert got.keys() == want.keys()
    assert max(float((got[k].double() - want[k].double()).abs().max()) for k in got if got[k].numel()) <= 1e-5
