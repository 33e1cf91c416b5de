"""Predictions of a finished run on each evaluated site's split (input of ``fedcxr evaluate``).

Writes ``RUN_DIR/predictions/<split>.parquet``: one row per image of every evaluated site with
its labels (``label__<class>``), the model's probabilities (``prob__<class>``) and the aux codes
used for subgroup analysis. Each site is scored with the model it would deploy: its own model
where the method keeps one (Individual, PFL heads, FedBN statistics), the global one otherwise.

No identifier and no image path is written (SECURITY.md): a row is named by ``row_key``, a
hash of the manifest's content hash and the row's position (the site that holds the manifest
can find the row again with :func:`row_keys`; nobody else can), and the patient-level
bootstrap groups rows by ``patient_key``, a hash of the manifest's pseudonymous patient id
salted with the manifest hash (so keys of two runs on different data cannot be linked).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.atomic import atomic_path
from fedcxr.errors import UserError
from fedcxr.rundir import FINAL_MODEL, RUN_INFO, RunDir, read_run_info
from fedcxr.pipeline.checkpoints import load_final_model
from fedcxr.pipeline.data import default_cache_dir, make_loader
from fedcxr.pipeline.engine import backend_settings, resolve_engine
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.forward import predict
from fedcxr.pipeline.keys import SEALED_PREFIX
from fedcxr.pipeline.site_runner import SiteRunner
from fedcxr.site_adapters.manifest import content_hash, label_values
from fedcxr.vocab import AUX_TASKS, aux_column, label_column


def load_final(run_dir: Path, *, sealed_ok: bool = False) -> tuple[dict, dict]:
    """``(run.json, final_model.pt)`` of a finished run (the model loaded safely).

    A model still sealed by ``privacy.secure_aggregation`` (the FLARE server's copy) is refused with
    the command that opens it, unless ``sealed_ok`` (the server's cross-site evaluation sends it on)."""
    paths = RunDir(run_dir)
    if not paths.run_info.is_file() or not paths.final_model.is_file():
        raise UserError(f"{run_dir}: not a finished run ({RUN_INFO} and {FINAL_MODEL} are needed; "
                        "run `fedcxr train` to completion first)")
    final = load_final_model(run_dir)
    if not sealed_ok and any(str(k).startswith(SEALED_PREFIX) for k in final["global"]):
        raise UserError(f"{paths.final_model} is encrypted (privacy.secure_aggregation: the FLARE server never holds "
                        "the model in the clear); a holder of a site's key opens it: fedcxr flare decrypt "
                        f"{run_dir} --context client_context.tenseal")
    return read_run_info(run_dir), final


def site_params(final: dict, site: str) -> dict:
    """The parameters site ``site`` is scored with (its own where the method keeps them)."""
    params = dict(final["per_site"].get(site, final["global"]))
    local = final.get("local_states", {}).get(site, {})
    for key in final.get("eval_local_keys", []):
        if key in local:
            params[key] = local[key]
    # a sealed local state (privacy.secure_aggregation) travels as its block; the site opens it over the global's
    params.update({k: v for k, v in local.items() if str(k).startswith(SEALED_PREFIX)})
    return params


def _key(salt: str, value: str) -> str:
    return hashlib.sha256(f"{salt}:{value}".encode()).hexdigest()[:16]


def row_keys(manifest: pd.DataFrame) -> pd.Series:
    """The pseudonymous key of every manifest row (position-based, salted with the content hash)."""
    salt = content_hash(manifest)
    return pd.Series([_key(salt, f"row{i}") for i in range(len(manifest))], index=manifest.index)


def patient_keys(manifest: pd.DataFrame, patient_ids: pd.Series) -> pd.Series:
    """Per-patient keys for the bootstrap: the manifest's pseudonymous ids hashed once more."""
    salt = "patient:" + content_hash(manifest)
    uniq = {pid: _key(salt, pid) for pid in patient_ids.astype(str).unique()}
    return patient_ids.astype(str).map(uniq)


def site_prediction_frame(runner: SiteRunner, params: dict, classes: list[str], aux_tasks: list[str],
                          split: str) -> pd.DataFrame:
    """One site's predictions on ``split``: keys, labels, probabilities and aux values per row.

    The one place a site is scored for evaluation: ``fedcxr evaluate`` writes these rows, the
    FLARE ``validate`` task summarises them at the site (where they stay). Empty when the site
    has no row in ``split``.
    """
    model = runner.model(classes, aux_tasks)
    model.load_state_dict(params)
    parts = []
    for site in runner.sites:
        manifest = site.manifest
        in_split = (manifest["split"] == split).to_numpy()
        rows = manifest.loc[in_split].reset_index(drop=True)
        parts.append((rows, row_keys(manifest).to_numpy()[in_split],
                      patient_keys(manifest, rows["patient_id"]).to_numpy()))
    rows = pd.concat([r for r, _, _ in parts], ignore_index=True)
    if len(rows) == 0:
        return pd.DataFrame()
    keys = np.concatenate([k for _, k, _ in parts])
    patients = np.concatenate([p for _, _, p in parts])
    data = runner.dataset(split, classes, aux_tasks, augment=False)
    out = predict(model, make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False,
                                     **runner.loader_options(train=False)), device=runner.device)
    order = np.asarray(out["index"], dtype=int)
    frame = pd.DataFrame({"site": runner.name, "row_key": keys[order], "patient_key": patients[order]})
    for j, cls in enumerate(classes):
        frame[label_column(cls)] = label_values(rows, cls)[order]  # NaN: a manifest without the class
        frame[f"prob__{cls}"] = out["probs"][:, j]
    for task in AUX_TASKS:
        if aux_column(task) in rows:
            frame[aux_column(task)] = rows[aux_column(task)].to_numpy()[order]
    return frame


def write_predictions(run_dir: Path | str, split: str = "test", device: Optional[str] = None) -> Path:
    """Score every evaluated site's ``split`` and write ``predictions/<split>.parquet``."""
    run_dir = Path(run_dir)
    run, final = load_final(run_dir)
    dev = resolve_device(device or run["config"].get("device"))
    classes, aux_tasks = final["classes"], final["aux_tasks"]
    cache = Path(run["config"]["cache_dir"]) if run["config"].get("cache_dir") else default_cache_dir()
    engine = resolve_engine(dev, run["config"].get("engine"), run["config"].get("num_workers"))
    frames = []
    with backend_settings(engine):  # the run's thread policy (README "Thread policy and speed")
        for site in run["eval_sites"]:
            runner = SiteRunner(site, Path(run["site_dirs"][site]), model_cfg=final["model"],
                                image_size=final["image_size"], cache_dir=cache, device=dev, augment=False,
                                engine=engine)
            frame = site_prediction_frame(runner, site_params(final, site), classes, aux_tasks, split)
            if len(frame) == 0:
                continue
            frames.append(frame)
    if not frames:
        raise UserError(f"{run_dir}: no rows in split {split!r} at the evaluated sites {run['eval_sites']}")
    path = RunDir(run_dir).predictions(split)
    with atomic_path(path) as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)
    return path
