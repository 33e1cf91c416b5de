"""Helpers of the FLARE tests: a run's final model, the largest difference between two states, the
processes still naming a folder. The simulator jobs that ``test_controller.py`` shares are in
``shared_job.py``."""

from __future__ import annotations

from pathlib import Path


def final_model(run_dir: Path) -> dict:
    import torch

    return torch.load(Path(run_dir) / "final_model.pt", map_location="cpu", weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)


def processes_mentioning(text: str) -> list:
    import psutil  # a FLARE dependency

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if text in " ".join(proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found
