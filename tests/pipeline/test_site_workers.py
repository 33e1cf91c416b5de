"""Parallel site processes (engine.site_workers): the sequential run's weights, resume, loud failures."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from fedcxr.errors import RunFailed, UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.inprocess import site_transport
from fedcxr.pipeline.messages import NoConfig
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.site_workers import SiteWorkers, spread

from ..conftest import tiny_config


def _final(run_dir: Path) -> dict:
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def _same(a, b) -> bool:
    """Equal nested dicts/lists of tensors, bit for bit."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_spread_puts_the_largest_sites_first_onto_the_least_loaded_worker():
    assert spread({"a": 10, "b": 30, "c": 20, "d": 5}, 2) == [["b", "d"], ["a", "c"]]
    assert spread({"a": 1, "b": 1}, 4) == [["a"], ["b"]]  # empty workers dropped
    assert spread({"a": 3, "b": 2, "c": 1}, 1) == [["a", "b", "c"]]  # one worker keeps the config's order


def test_site_workers_beside_loader_workers_are_refused(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", num_workers=1, engine={"site_workers": 2})
    with pytest.raises(UserError, match="engine.site_workers: 2 with num_workers: 1"):
        run_experiment(load_config(data=data), tmp_path / "run", progress=False)


@pytest.mark.slow  # two runs each, and the first starts the fork server (~6-15 s on 2 shared cores)
@pytest.mark.parametrize("method", ["FedAvg", "FedAvg_Finetune_GP"])
def test_two_workers_end_with_the_sequential_weights_and_resume_to_them(tiny_manifests, tmp_path, method, caplog):
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy=method)
    run_experiment(load_config(data=data), tmp_path / "seq", progress=False)
    parallel = {**data, "engine": {"site_workers": 2}}
    with caplog.at_level(logging.INFO, logger="fedcxr.pipeline.site_workers"):
        run_experiment(load_config(data=parallel), tmp_path / "par", progress=False)
    assert "training the sites in 2 worker processes of 1 torch thread(s) each" in caplog.text
    assert _same(_final(tmp_path / "seq"), _final(tmp_path / "par"))  # global, per-site and local states

    # killed after round 0 (its checkpoint holds the sites' local states, from the workers): resumes to the same model
    for path in (tmp_path / "par" / "checkpoints").glob("round_0001.pt*"):
        path.unlink()
    (tmp_path / "par" / "final_model.pt").unlink()
    run_experiment(load_config(data=parallel), tmp_path / "par", resume=True, progress=False)
    assert _same(_final(tmp_path / "seq"), _final(tmp_path / "par"))


@pytest.mark.slow  # starts two workers (~3 s once the fork server runs)
def test_a_worker_error_names_the_site_and_a_dead_worker_fails_the_run(tiny_manifests, tmp_path):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedAvg",
                                       engine={"site_workers": 2}))
    workers = site_transport(cfg, torch.device("cpu"), False)
    assert isinstance(workers, SiteWorkers)
    try:
        assert workers.site_names == ["nih_style", "chexpert_style", "dicom_style"]
        with pytest.raises(ValueError, match="site chexpert_style: unknown task") as raised:
            workers.run("no_such_task", ["chexpert_style"], None, NoConfig())
        assert any("site chexpert_style" in note for note in raised.value.__notes__)
        meta = workers.run("metadata", workers.site_names, None, NoConfig())  # the workers still answer
        assert list(meta) == workers.site_names

        victim = workers.worker_of["dicom_style"]
        os.kill(workers.pids[victim], signal.SIGKILL)
        with pytest.raises(RunFailed, match=r"worker process training site\(s\) .*dicom_style.* stopped unexpectedly"):
            workers.run("metadata", workers.site_names, None, NoConfig())
    finally:
        workers.close()
    assert not any(_alive(pid) for pid in workers.pids)
