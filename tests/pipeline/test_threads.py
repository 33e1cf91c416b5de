"""The thread policy: one torch thread per training process by default, set for the run and
restored after, recorded in run.json and checkpoints, and a resume with another count warned of."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import fedcxr.pipeline.local as local
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.engine import AUTO_THREADS, backend_settings, resolve_engine
from fedcxr.pipeline.run_driver import run_experiment

from ..conftest import tiny_config


def test_auto_is_one_thread_on_any_device_and_an_explicit_count_wins():
    assert AUTO_THREADS == 1
    assert resolve_engine("cpu").threads == 1 and resolve_engine("cuda").threads == 1
    assert resolve_engine("cpu", {"threads": 3}).threads == 3
    with pytest.raises(Exception, match="threads"):
        load_config(data={"sites": ["a"], "engine": {"threads": 0}})


def test_backend_settings_set_the_threads_for_the_run_and_restore_them():
    torch.set_num_threads(2)
    with backend_settings(resolve_engine("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    with backend_settings(resolve_engine("cpu", {"threads": 2})):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_training_uses_the_policy_and_the_run_records_it(tiny_manifests, tmp_path, monkeypatch):
    seen = []
    real = local.train_local
    monkeypatch.setattr(local, "train_local", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    torch.set_num_threads(2)  # torch's default on this machine, whatever the caller had
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1))
    run = run_experiment(cfg, tmp_path / "run", progress=False)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2  # restored for the caller
    assert run["threads"] == 1 and json.loads((tmp_path / "run" / "run.json").read_text())["threads"] == 1
    ckpt = torch.load(next((tmp_path / "run" / "checkpoints").glob("round_*.pt")), weights_only=True)
    assert ckpt["threads"] == 1


@pytest.mark.slow  # two short runs
def test_resume_with_another_thread_count_warns_and_continues(tiny_manifests, tmp_path, caplog):
    data = tiny_config(tiny_manifests, tmp_path / "cache", rounds=2)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    for path in (tmp_path / "run" / "checkpoints").glob("round_0001.pt*"):
        path.unlink()
    (tmp_path / "run" / "final_model.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="fedcxr.pipeline.run_driver"):
        run = run_experiment(load_config(data={**data, "engine": {"threads": 2}}), tmp_path / "run",
                             resume=True, progress=False)
    assert run["status"] == "finished"
    assert "trained with 1 torch thread(s) per process and resumes with 2" in caplog.text
    assert "engine.threads: 1" in caplog.text
