"""Signed bundles: a change made after signing is refused when the user names the signer's key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedcxr.bundle.runtime import CHECKSUMS, KEY_ENV, load_network, sha256_file, verify_bundle
from fedcxr.bundle.signing import SIGNATURE, SignatureError, new_key_pair, sign_bundle, verify_signature
from fedcxr.cli import main
from fedcxr.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_run(tmp_path_factory) -> Path:
    """A run directory with an untrained resnet_tiny at 16 px: enough to export."""
    from fedcxr.models.network import network_from_config
    from fedcxr.pipeline.checkpoints import save_final

    run = tmp_path_factory.mktemp("signing_run") / "run"
    classes = ["edema", "pneumonia"]
    model_cfg = {"backbone": "resnet_tiny", "hidden": 8}
    torch.manual_seed(0)
    model = network_from_config(classes, model_cfg, {})
    save_final(run, {"global": model.state_dict(), "per_site": {}, "local_states": {}, "eval_local_keys": [],
                     "classes": classes, "aux_tasks": [], "model": model_cfg, "image_size": 16})
    (run / "run.json").write_text(json.dumps({"method": "FedAvg", "seed": 0, "target": None, "classes": classes,
                                              "sites": ["a"], "eval_sites": ["a"]}))
    return run


@pytest.fixture(scope="module")
def signed(model_run, tmp_path_factory) -> tuple[Path, Path]:
    """A bundle exported with ``--sign-key KEY.pem --new-key``; returns (bundle, public key)."""
    root = tmp_path_factory.mktemp("signed")
    assert main(["export-bundle", str(model_run), "--out", str(root / "b"), "--sign-key", str(root / "key.pem"),
                 "--new-key", "-q"]) == 0
    assert oct((root / "key.pem").stat().st_mode & 0o777) == "0o600"
    return root / "b", root / "key.pub.pem"


def tampered(bundle: Path, tmp_path: Path) -> Path:
    """A copy whose model.ts is another model and whose checksum line says so (the issue's attack)."""
    copy = tmp_path / "tampered"
    shutil.copytree(bundle, copy)
    model = copy / "models" / "model.ts"
    module = torch.jit.load(str(model))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    torch.jit.save(module, str(model))
    lines = [f"{sha256_file(model)}  models/model.ts" if line.endswith("  models/model.ts") else line
             for line in (copy / CHECKSUMS).read_text().splitlines()]
    (copy / CHECKSUMS).write_text("\n".join(lines) + "\n")
    return copy


def test_a_model_changed_with_its_checksum_line_passes_the_checksums_and_fails_the_signature(signed, tmp_path,
                                                                                            capsys):
    bundle, public = signed
    copy = tampered(bundle, tmp_path)
    verify_bundle(copy)  # what checksums alone promise: nothing against a deliberate change
    with pytest.raises(SignatureError, match="changed after it was signed"):
        load_network(str(copy), verify_key=str(public))
    assert main(["verify-bundle", str(copy), "--key", str(public)]) == 2
    assert "changed after it was signed; refused" in capsys.readouterr().err


def test_the_signed_bundle_verifies_and_loads_with_its_key_named_either_way(signed, monkeypatch, capsys):
    bundle, public = signed
    assert main(["verify-bundle", str(bundle), "--key", str(public)]) == 0
    assert "signature verified" in capsys.readouterr().out
    assert load_network(str(bundle), verify_key=str(public))(torch.zeros(1, 1, 16, 16)).shape == (1, 2)
    monkeypatch.setenv(KEY_ENV, str(public))
    assert load_network(str(bundle))(torch.zeros(1, 1, 16, 16)).shape == (1, 2)
    assert "key id" in (bundle / "docs" / "README.md").read_text()


def test_another_signer_no_signature_or_a_forged_one_is_refused(signed, model_run, tmp_path, monkeypatch):
    bundle, public = signed
    _, other = new_key_pair(tmp_path / "other.pem")
    with pytest.raises(SignatureError, match="signed by another key"):
        verify_signature(bundle, other)
    unsigned = tmp_path / "unsigned"
    assert main(["export-bundle", str(model_run), "--out", str(unsigned), "-q"]) == 0
    monkeypatch.setenv(KEY_ENV, str(public))
    with pytest.raises(SignatureError, match="is not signed"):
        load_network(str(unsigned))
    forged = tmp_path / "forged"
    shutil.copytree(bundle, forged)
    (forged / SIGNATURE).write_text('{"algorithm": "Ed25519", "signature": "not base64!"}')
    with pytest.raises(SignatureError, match="not a fedcxr signature"):
        verify_signature(forged, public)
    (forged / SIGNATURE).write_text(json.dumps({"algorithm": "none", "signature": ""}))
    with pytest.raises(SignatureError, match="expected Ed25519"):
        verify_signature(forged, public)


def test_keys_are_checked_before_anything_is_written(model_run, tmp_path, capsys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key, _ = new_key_pair(tmp_path / "k.pem")
    os.chmod(key, 0o644)
    assert main(["export-bundle", str(model_run), "--out", str(tmp_path / "b1"), "--sign-key", str(key)]) == 2
    assert "readable by others" in capsys.readouterr().err and not (tmp_path / "b1").exists()
    os.chmod(key, 0o600)
    assert main(["export-bundle", str(model_run), "--out", str(tmp_path / "b2"), "--sign-key", str(key),
                 "--new-key"]) == 2
    assert "exists; --new-key never overwrites" in capsys.readouterr().err
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    os.chmod(rsa_key, 0o600)
    assert main(["export-bundle", str(model_run), "--out", str(tmp_path / "b3"), "--sign-key", str(rsa_key)]) == 2
    assert "Ed25519" in capsys.readouterr().err
    with pytest.raises(UserError, match="not a PEM public key"):
        verify_signature(tmp_path, key)  # the private half named where the public one belongs


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_a_key_made_with_openssl_as_the_readme_says_signs_and_verifies(model_run, tmp_path):
    key, public = tmp_path / "ossl.pem", tmp_path / "ossl.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    os.chmod(key, 0o600)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(public)], check=True)
    assert main(["export-bundle", str(model_run), "--out", str(tmp_path / "b"), "--sign-key", str(key), "-q"]) == 0
    assert verify_signature(tmp_path / "b", public)
    sign_bundle(tmp_path / "b", key)  # signing again is idempotent in what it proves
    assert main(["verify-bundle", str(tmp_path / "b"), "--key", str(public)]) == 0


@pytest.mark.slow  # MONAI's bundle runner in a subprocess (~5 s of imports)
def test_monais_runner_refuses_a_bundle_signed_by_another_key(signed, tmp_path):
    pytest.importorskip("fire", reason="MONAI's bundle runner needs `fire` (pip install fedcxr[bundle])")
    pytest.importorskip("ignite", reason="MONAI's evaluator needs pytorch-ignite (pip install fedcxr[bundle])")
    bundle, _ = signed
    _, other = new_key_pair(tmp_path / "other.pem")
    images = tmp_path / "images"
    images.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop(KEY_ENV, None)
    result = subprocess.run(
        [sys.executable, "-m", "monai.bundle", "run", "--bundle_root", str(bundle),
         "--config_file", str(bundle / "configs" / "inference.json"), "--dataset_dir", str(images),
         "--output_dir", str(tmp_path / "out"), "--verify_key", str(other)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "signed by another key" in result.stderr
    assert not (tmp_path / "out" / "predictions.csv").exists()
