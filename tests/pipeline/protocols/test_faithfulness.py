"""The methods as the papers' code runs them: defaults and protocol details (science issue)."""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.federation import run_experiment

from ...conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _final(run_dir):
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fedbn_plus_carries_the_initial_batchnorm_through_local_training(tiny_manifests, tmp_path):
    """FedBN+ ≠ FedBN: every site's BN (affine and statistics) stays the initial one."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL", target=None, class_source="union",
                       rounds=1, backbone_aggregation="fedbn_plus")
    run_experiment(load_config(data={**data, "rounds": 0}), tmp_path / "init", progress=False)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    initial, final = _final(tmp_path / "init")["global"], _final(tmp_path / "run")
    bn = [k for k in final["eval_local_keys"] if k.endswith(("running_mean", "running_var", ".weight"))]
    assert bn
    for site, state in final["local_states"].items():
        for key in bn:
            assert torch.equal(state[key], initial[key]), (site, key)
    moved = [k for k in initial if k not in bn and initial[k].is_floating_point()
             and not torch.equal(initial[k], final["global"][k])]
    assert moved  # everything else trained
