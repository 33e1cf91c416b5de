"""A finished run's model as a MONAI bundle (``fedcxr export-bundle RUN_DIR --out BUNDLE``).

Layout (MONAI's bundle specification)::

    BUNDLE/models/model.ts           TorchScript: (B, 1, S, S) normalised images → (B, C) logits
    BUNDLE/configs/metadata.json     version, classes (output channels), input size, the
                                     operating points stored by ``fedcxr evaluate`` (if any)
    BUNDLE/configs/inference.json    MONAI evaluator: list the images → fedcxr preprocessing →
                                     model.ts → sigmoid → OUT/predictions.csv
    BUNDLE/configs/logging.conf      Python logging config MONAI's runner applies by default
                                     (the model zoo's: INFO to stdout; stdlib classes only)
    BUNDLE/scripts/fedcxr_runtime.py :mod:`fedcxr.bundle.runtime` (checksum check, image listing,
                                     the transform, the CSV writers)
    BUNDLE/docs/README.md            how to run it
    BUNDLE/checksums.sha256          SHA-256 of every file above (``sha256sum -c`` format), checked
                                     by the runtime before the model is loaded
    BUNDLE/checksums.sha256.sig      with ``--sign-key KEY.pem``: an Ed25519 signature over the
                                     checksums (:mod:`fedcxr.bundle.signing`); checked with the
                                     public key the user names (``fedcxr verify-bundle``,
                                     ``--verify_key`` on MONAI's runner, ``$FEDCXR_BUNDLE_KEY``)

Run it with MONAI's runner::

    python -m monai.bundle run --bundle_root BUNDLE --config_file BUNDLE/configs/inference.json \\
        --dataset_dir DIR --output_dir OUT

The images are preprocessed by the installed fedcxr (:func:`fedcxr.pipeline.inference.preprocess`),
so the probabilities equal ``fedcxr predict``'s (the tests check 1e-4). The bundle holds model
weights, class names and thresholds only: no image, id or path from the run's data, and no path of
the exporting machine (TorchScript's debug records, which name the source files the model was
traced from, are left out of ``model.ts``: :func:`torchscript_bytes`).
"""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path
from typing import Optional

import torch
from torch import nn

import fedcxr
from fedcxr.atomic import atomic_write_bytes, atomic_write_json
from fedcxr.errors import UserError
from fedcxr.pipeline.inference import MainLogits

RUNTIME = "fedcxr_runtime"


def _trace(model: nn.Module, size: int) -> bytes:
    """``model.ts``'s bytes: the traced main-head logits, without debug records, checked against the network."""
    wrapped = MainLogits(model).eval()
    example = torch.zeros(2, 1, size, size)
    with torch.no_grad():
        traced = torch.jit.trace(wrapped, example, check_trace=False)
        data = torchscript_bytes(traced)
        probe = torch.randn(3, 1, size, size)
        if not torch.allclose(torch.jit.load(io.BytesIO(data))(probe), wrapped(probe), atol=1e-5):
            raise RuntimeError("TorchScript trace disagrees with the network; cannot export")
    return data


def torchscript_bytes(module: torch.jit.ScriptModule) -> bytes:
    """A TorchScript archive without its ``*.debug_pkl`` records.

    Those records map the graph to the Python source it was traced from: absolute paths of the
    exporting machine (``/home/<user>/.venv/.../torch/nn/modules/conv.py``). TorchScript loads and
    runs without them (error messages just lack the source lines). Written to memory first, so the
    archive's folder is ``archive/``, not the name of a temporary file."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if info.filename.endswith(".debug_pkl"):
                continue
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)), src.read(info))
    return out.getvalue()


def write_checksums(bundle: Path) -> Path:
    """``checksums.sha256``: ``<sha256>  <relative path>`` of every shipped file (``sha256sum -c`` reads it)."""
    from fedcxr.bundle.runtime import CHECKSUMS, bundle_files, sha256_file

    lines = [f"{sha256_file(bundle / name)}  {name}\n" for name in bundle_files(bundle)]
    atomic_write_bytes(bundle / CHECKSUMS, "".join(lines).encode("utf-8"))
    return bundle / CHECKSUMS


def _metadata(loaded, thresholds: dict, threshold_site: Optional[str]) -> dict:
    size = loaded.image_size
    return {
        "schema": "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/meta_schema_20220324.json",
        "version": "1.0.0",
        "changelog": {"1.0.0": f"exported by fedcxr {fedcxr.__version__}"},
        "monai_version": __import__("monai").__version__,
        "pytorch_version": torch.__version__.split("+")[0],
        "numpy_version": __import__("numpy").__version__,
        "required_packages_version": {"fedcxr": fedcxr.__version__, "pandas": __import__("pandas").__version__,
                                      "pytorch-ignite": __import__("ignite").__version__},
        "task": "Chest X-ray multi-label classification",
        "description": (f"{loaded.run.get('method')} model trained with fedcxr "
                        f"({'site ' + loaded.site if loaded.site else 'global model'}); sigmoid probability per class"),
        "authors": "fedcxr",
        "copyright": "see the training data's licences",
        "network_data_format": {
            "inputs": {"image": {
                "type": "image", "format": "magnitude", "num_channels": 1, "spatial_shape": [size, size],
                "dtype": "float32", "value_range": [-2.0, 2.0], "is_patch_data": False,
                "channel_def": {"0": "grey, min/max scaled to [0, 1] then (x - 0.5) / 0.25"},
            }},
            "outputs": {"pred": {
                "type": "probabilities", "format": "classes", "num_channels": len(loaded.classes),
                "spatial_shape": [len(loaded.classes)], "dtype": "float32", "value_range": [0, 1],
                "is_onehot": False, "channel_def": {str(i): c for i, c in enumerate(loaded.classes)},
            }},
        },
        "fedcxr": {
            "classes": loaded.classes, "image_size": size, "method": loaded.run.get("method"),
            "model": loaded.site or "global", "operating_points": thresholds,
            "operating_points_site": threshold_site,
        },
    }


def _inference_config(classes: list[str], size: int) -> dict:
    return {
        "imports": ["$import torch"],
        "bundle_root": ".",
        "dataset_dir": "images",
        "output_dir": "$@bundle_root + '/eval'",
        "classes": classes,
        "image_size": size,
        "device": "$torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
        "datalist": {"_target_": f"scripts.{RUNTIME}.list_images", "dataset_dir": "@dataset_dir"},
        "verify_key": "",
        "network": {"_target_": f"scripts.{RUNTIME}.load_network", "bundle_root": "@bundle_root",
                    "device": "@device", "verify_key": "@verify_key"},
        "preprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": f"scripts.{RUNTIME}.LoadFedcxrImaged", "keys": "image", "size": "@image_size"},
        ]},
        "dataset": {"_target_": "Dataset", "data": "@datalist", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 16, "shuffle": False,
                       "num_workers": 0},
        "inferer": {"_target_": "SimpleInferer"},
        "postprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": "Activationsd", "keys": "pred", "sigmoid": True},
        ]},
        "handlers": [{"_target_": f"scripts.{RUNTIME}.ProbabilityWriter", "output_dir": "@output_dir",
                      "classes": "@classes"}],
        "evaluator": {"_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@dataloader",
                      "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
                      "val_handlers": "@handlers", "amp": False},
        "initialize": ["$monai.utils.set_determinism(seed=0)"],
        "run": ["$@evaluator.run()"],
    }


#: ``configs/logging.conf`` as the MONAI model zoo's bundles ship it: ``monai.bundle run`` applies
#: ``<config folder>/logging.conf`` when present (and warns when it is not). Standard library
#: handler and formatter only, arguments literal: MONAI refuses anything that would run code.
LOGGING_CONF = """[loggers]
keys=root

[handlers]
keys=consoleHandler

[formatters]
keys=fullFormatter

[logger_root]
level=INFO
handlers=consoleHandler

[handler_consoleHandler]
class=StreamHandler
level=INFO
formatter=fullFormatter
args=(sys.stdout,)

[formatter_fullFormatter]
format=%(asctime)s - %(name)s - %(levelname)s - %(message)s
"""


README = """# fedcxr chest X-ray classifier ({method}, {model} model)

Classes (sigmoid probability each): {classes}. Input: one grey image, resized to {size}x{size}.

    python -m monai.bundle run --bundle_root BUNDLE --config_file BUNDLE/configs/inference.json \\
        --dataset_dir DIR --output_dir OUT

DIR: a folder of DICOM/PNG/JPEG files (searched recursively). OUT/predictions.csv: one row per
image (its path relative to DIR: keep the file local) and `prob__<class>`; OUT/unread.csv: every
file not scored (a link out of DIR, not a regular file, not decodable) and why. The runner first
checks every file of the bundle against checksums.sha256 (`sha256sum -c checksums.sha256` does the
same): that catches damage, not a deliberate change. {signed}Needs MONAI,
pytorch-ignite, pandas and fedcxr (its decoder preprocesses the images exactly as in training).
Operating points chosen on validation data, if the run was evaluated: configs/metadata.json,
key `fedcxr.operating_points` (call a class positive when prob >= threshold).
"""


SIGNED = """This bundle is signed (checksums.sha256.sig, Ed25519, key id {key_id}). Check it with the
signer's public key before running it, with the installed fedcxr: `fedcxr verify-bundle BUNDLE --key
PUB.pem`; the runner checks it too when given `--verify_key PUB.pem` (or $FEDCXR_BUNDLE_KEY). """


def export_bundle(run_dir: Path | str, out: Path | str, *, site: Optional[str] = None,
                  sign_key: Optional[Path | str] = None, new_key: bool = False) -> Path:
    """Write the bundle for ``run_dir``'s global model (or ``site``'s own) into ``out``.

    ``sign_key``: sign the checksum manifest with this Ed25519 private key (PEM); ``new_key``:
    create that key first (with its public half ``KEY.pub.pem``). The key is checked before
    anything is written."""
    from fedcxr.bundle.signing import key_id, load_private_key, new_key_pair, sign_bundle
    from fedcxr.evaluation.runs import thresholds_for
    from fedcxr.pipeline.inference import load_run_model

    run_dir, out = Path(run_dir), Path(out)
    if new_key and sign_key is None:
        raise UserError("--new-key needs --sign-key KEY.pem: the file to create the private key in")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: exists and is not empty; choose a new bundle folder")
    if out.resolve().is_relative_to(run_dir.resolve()):
        raise UserError(f"--out {out}: lies inside the run directory {run_dir}; choose a folder outside it")
    if sign_key is not None and not new_key:
        load_private_key(sign_key)
    loaded = load_run_model(run_dir, site)
    if new_key:
        new_key_pair(sign_key)
    signer = key_id(load_private_key(sign_key).public_key()) if sign_key is not None else None
    threshold_site, thresholds = thresholds_for(run_dir, loaded.run, site)
    atomic_write_bytes(out / "models" / "model.ts", _trace(loaded.model.cpu(), loaded.image_size))
    atomic_write_json(out / "configs" / "metadata.json", _metadata(loaded, thresholds, threshold_site))
    atomic_write_json(out / "configs" / "inference.json", _inference_config(loaded.classes, loaded.image_size))
    (out / "configs" / "logging.conf").write_text(LOGGING_CONF)
    (out / "scripts").mkdir(parents=True, exist_ok=True)
    (out / "scripts" / "__init__.py").write_text("")
    shutil.copyfile(Path(__file__).with_name("runtime.py"), out / "scripts" / f"{RUNTIME}.py")
    (out / "docs").mkdir(exist_ok=True)
    (out / "docs" / "README.md").write_text(README.format(
        method=loaded.run.get("method"), model=site or "global", classes=", ".join(loaded.classes),
        size=loaded.image_size, signed=SIGNED.format(key_id=signer) if signer else ""))
    write_checksums(out)
    if sign_key is not None:
        sign_bundle(out, sign_key)
    return out
