"""Secure aggregation on a POC system: FLARE's provisioning writes and signs the HE contexts, the server's kit
gets no secret key, and a run loads them through FLARE's security content service in secure mode.

The simulator (``test_secure_aggregation_flare.py``) copies one ``startup`` folder to every participant,
so there the server's folder holds the client key too; what separates the keys is checked here."""

from __future__ import annotations

import json

import pytest
import torch

from ..conftest import tiny_config
from .test_secure_aggregation import BLIND, SGD

pytest.importorskip("nvflare")


@pytest.fixture
def he_keys(tmp_path):
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    from fedcxr.flare.he_keys import rehearsal_keys

    return rehearsal_keys(tmp_path / "he")


@pytest.mark.slow
def test_provisioning_signs_the_kept_contexts_and_keeps_the_secret_key_out_of_the_servers_kit(he_keys, tmp_path):
    from fedcxr.flare.poc import PROJECT, keep_user_nvflare_config, write_project
    from fedcxr.flare.processes import nvflare_env, run_nvflare

    project = write_project(tmp_path / "project.yml", ["site_a", "site_b"], 18123, he_keys=he_keys)
    env = {**nvflare_env(), "NVFLARE_POC_WORKSPACE": str(tmp_path / "ws")}
    with open(tmp_path / "poc.log", "w") as out, keep_user_nvflare_config():
        assert run_nvflare(["poc", "prepare", "-i", str(project), "--force"], env, out, 120).returncode == 0
    kits = tmp_path / "ws" / PROJECT / "prod_00"
    assert sorted(p.name for p in (kits / "server" / "startup").glob("*.tenseal")) == ["server_context.tenseal"]
    for participant, name in (("server", "server_context.tenseal"), ("site_a", "client_context.tenseal"),
                              ("site_b", "client_context.tenseal")):
        startup = kits / participant / "startup"
        assert (startup / name).read_bytes() == (he_keys / name).read_bytes()  # the kept keys: a resume opens
        assert name in json.loads((startup / "signature.json").read_text())  # signed by FLARE's provisioning
    assert not list((kits / "admin@fedcxr.local").rglob("*.tenseal"))
    _site_loads_only_its_signed_context(kits / "site_a" / "startup")


def _site_loads_only_its_signed_context(startup):
    """What a site's process does (FLARE initialises its security content service with the kit): a signed
    kit must hold a signed, unaltered context."""
    from nvflare.fuel.sec.security_content_service import SecurityContentService

    from fedcxr.flare.he_keys import site_context
    from fedcxr.flare.sealing import SealError

    try:
        SecurityContentService.initialize(content_folder=str(startup))
        assert site_context().is_private()
        data = bytearray((startup / "client_context.tenseal").read_bytes())
        data[len(data) // 2] ^= 1
        (startup / "client_context.tenseal").write_bytes(bytes(data))
        with pytest.raises(SealError, match="cannot load client_context.tenseal .*INVALID_SIGNATURE"):
            site_context()
    finally:
        SecurityContentService.security_content_manager = None


@pytest.mark.slow
def test_a_poc_run_sums_sealed_models_under_signed_contexts(tiny_manifests, tmp_path):
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    from fedcxr.flare.poc import poc
    from fedcxr.pipeline.config import load_config

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", defences=BLIND, strategy="FedAvg",
                                       target=None, rounds=1, eval_every=0, privacy={"secure_aggregation": "he"},
                                       **SGD))
    payload = poc(cfg, tmp_path / "run", progress=False, timeout=600, evaluation={"enabled": False})
    assert payload["status"] == "finished" and not payload["missed"]
    final = torch.load(tmp_path / "run" / "final_model.pt", weights_only=True)
    assert not any(k.startswith("sealed.") for k in final["global"])  # opened with the kept key after the run
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "round_0000.pt", weights_only=True)
    assert sorted(ckpt["state"]["global"]) == ["sealed.model.data", "sealed.model.layout"]
