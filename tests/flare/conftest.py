"""Helpers of the FLARE tests: a run's final model, the largest difference between two states, the
processes still naming a folder, one CKKS key pair for the secure-aggregation tests
(``he_contexts``). The simulator jobs that ``test_controller.py`` shares are in ``shared_job.py``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest


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


@pytest.fixture(scope="session")
def he_contexts(tmp_path_factory):
    """One CKKS key pair as FLARE's provisioning makes it (``HEBuilder`` defaults): ``(client, server, folder)``.

    The tests of secure aggregation need TenSEAL (``pip install 'fedcxr[he]'``, installed by
    ``install.sh``); they are skipped, saying so, only where it cannot be imported."""
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    pytest.importorskip("nvflare")
    from fedcxr.flare.he_keys import CLIENT_CONTEXT, SERVER_CONTEXT, read_context_file, rehearsal_keys

    folder = rehearsal_keys(tmp_path_factory.mktemp("he") / "keys")
    return SimpleNamespace(client=read_context_file(folder / CLIENT_CONTEXT, private=True),
                           server=read_context_file(folder / SERVER_CONTEXT, private=False), folder=folder)
