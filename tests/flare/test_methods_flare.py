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


def _personal(manifests: Path, cache: Path, method: str, **extra):
    return load_config(data=tiny_config(manifests, cache, strategy=method, sites=SOURCES, target=None, rounds=2,
                                        eval_every=1, class_source="union", **extra))


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


@pytest.mark.slow  # one FLARE simulator job of three experiments (~1.5 min)
def test_flare_simulator_ends_with_the_in_process_weights(tiny_manifests, tmp_path):
    """FedDyn (a method of one's own, from its file), Ditto (a whole personal model at each site) and
    FedRep (a personal head): the global model and every site's personal entries — collected once at
    the end for evaluation, as FedBN's and PFL's — equal the in-process run's."""
    from fedcxr.flare.simulator import simulate_many
    from fedcxr.pipeline.run_driver import run_experiment

    cache = tmp_path / "cache"
    runs = {"FedDyn": _feddyn(tiny_manifests, cache), "Ditto": _personal(tiny_manifests, cache, "Ditto"),
            "FedRep": _personal(tiny_manifests, cache, "FedRep", fedrep={"head_steps": 2})}
    payloads = simulate_many([(cfg, tmp_path / name) for name, cfg in runs.items()], progress=False, timeout=600,
                             evaluation={"enabled": False})
    for (name, cfg), payload in zip(runs.items(), payloads):
        assert payload["status"] == "finished" and payload["missed"] == [], name
        run_experiment(cfg, tmp_path / f"{name}-in-process", progress=False)
        flare, local = final_model(tmp_path / name), final_model(tmp_path / f"{name}-in-process")
        assert max_diff(flare["global"], local["global"]) <= 1e-5, name
        assert flare["eval_local_keys"] == local["eval_local_keys"], name
        if name == "FedDyn":  # nothing personal; its ∇L_k stayed at the sites (a private prefix)
            assert not flare["eval_local_keys"] and not any(flare["local_states"].values())
            continue
        keys = flare["eval_local_keys"]
        for site in SOURCES:
            assert keys and max_diff({k: flare["local_states"][site][k] for k in keys},
                                     {k: local["local_states"][site][k] for k in keys}) <= 1e-5, (name, site)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert set(rows[-1]["val"]) == set(SOURCES), name  # each site validated with its own model
