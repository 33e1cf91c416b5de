"""Methods that are one module, on NVIDIA FLARE: a method of one's own shipped in the job's custom code,
and the personalised methods, end with the in-process weights (DESIGN §8, docs/methods.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("nvflare")

from fedcxr.pipeline.config import load_config  # noqa: E402

from ..conftest import tiny_config  # noqa: E402
from .conftest import final_model, max_diff  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FEDDYN = f"{REPO / 'examples' / 'methods' / 'feddyn.py'}:FedDyn"
SOURCES = ["nih_style", "chexpert_style"]


def _feddyn(manifests: Path, cache: Path):
    data = tiny_config(manifests, cache, sites=SOURCES, target=None, rounds=2, eval_every=0)
    data.pop("strategy")
    return load_config(data={**data, "method": FEDDYN, "feddyn": {"alpha": 0.1}})


def test_the_exported_job_ships_the_method_file_and_names_it_as_its_module(tiny_manifests, tmp_path):
    """The file goes into every app's custom code (server and sites); the job's config names it
    ``feddyn:FedDyn``, never by a path of the machine that exported it."""
    from fedcxr.flare.job import export_job

    cfg = _feddyn(tiny_manifests, tmp_path / "cache")
    job = export_job([(cfg, "", False)], tmp_path / "job")
    for app in ("app_server", *(f"app_{s}" for s in SOURCES)):
        shipped = job / app / "custom" / "feddyn.py"
        assert shipped.read_text() == (REPO / "examples" / "methods" / "feddyn.py").read_text(), app
    server = json.loads((job / "app_server" / "config" / "config_fed_server.json").read_text())
    text = json.dumps(server)
    assert '"method": "feddyn:FedDyn"' in text and str(REPO) not in text


@pytest.mark.slow  # one FLARE simulator job (~40 s)
def test_flare_simulator_ends_with_the_in_process_weights(tiny_manifests, tmp_path):
    from fedcxr.flare.simulator import simulate_many
    from fedcxr.pipeline.run_driver import run_experiment

    runs = {"FedDyn": _feddyn(tiny_manifests, tmp_path / "cache")}
    payloads = simulate_many([(cfg, tmp_path / name) for name, cfg in runs.items()], progress=False, timeout=600,
                             evaluation={"enabled": False})
    for (name, cfg), payload in zip(runs.items(), payloads):
        assert payload["status"] == "finished" and payload["missed"] == [], name
        run_experiment(cfg, tmp_path / f"{name}-in-process", progress=False)
        flare, local = final_model(tmp_path / name), final_model(tmp_path / f"{name}-in-process")
        assert max_diff(flare["global"], local["global"]) <= 1e-5, name
