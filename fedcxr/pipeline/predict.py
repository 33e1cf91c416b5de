"""Predictions of a finished run on each evaluated site's split (input of ``fedcxr evaluate``).

Writes ``RUN_DIR/predictions/<split>.parquet``: one row per image of every evaluated site with
its labels (``label__<class>``), the model's probabilities (``prob__<class>``) and the aux codes
used for subgroup analysis. Each site is scored with the model it would deploy: its own model
where the method keeps one (Individual, PFL heads, FedBN statistics), the global one otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch

from fedcxr.atomic import atomic_path
from fedcxr.errors import UserError
from fedcxr.vocab import AUX_TASKS, aux_column, label_column


def load_final(run_dir: Path) -> tuple[dict, dict]:
    run_dir = Path(run_dir)
    run_path, model_path = run_dir / "run.json", run_dir / "final_model.pt"
    if not run_path.is_file() or not model_path.is_file():
        raise UserError(f"{run_dir}: not a finished run (run.json and final_model.pt are needed; "
                        "run `fedcxr train` to completion first)")
    return json.loads(run_path.read_text()), torch.load(model_path, map_location="cpu", weights_only=False)


def site_params(final: dict, site: str) -> dict:
    """The parameters site ``site`` is scored with (its own where the method keeps them)."""
    params = dict(final["per_site"].get(site, final["global"]))
    local = final.get("local_states", {}).get(site, {})
    for key in final.get("eval_local_keys", []):
        if key in local:
            params[key] = local[key]
    return params


def write_predictions(run_dir: Path | str, split: str = "test", device: Optional[str] = None) -> Path:
    """Score every evaluated site's ``split`` and write ``predictions/<split>.parquet``."""
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.federation import default_cache_dir
    from fedcxr.pipeline.local import predict, resolve_device
    from fedcxr.pipeline.site_runner import SiteRunner

    run_dir = Path(run_dir)
    run, final = load_final(run_dir)
    dev = resolve_device(device or run["config"].get("device"))
    classes, aux_tasks = final["classes"], final["aux_tasks"]
    cache = Path(run["config"]["cache_dir"]) if run["config"].get("cache_dir") else default_cache_dir()
    frames = []
    for site in run["eval_sites"]:
        runner = SiteRunner(site, Path(run["site_dirs"][site]), model_cfg=final["model"],
                            image_size=final["image_size"], cache_dir=cache, device=dev, augment=False)
        model = runner.model(classes, aux_tasks)
        model.load_state_dict(site_params(final, site))
        data = runner.dataset(split, classes, aux_tasks, augment=False)
        rows = runner.sites[0].manifest.loc[runner.sites[0].manifest["split"] == split].reset_index(drop=True)
        if len(rows) == 0:
            continue
        out = predict(model, make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False), device=dev)
        order = np.asarray(out["index"], dtype=int)
        frame = rows.iloc[order][["image_path", "patient_id"]].reset_index(drop=True)
        frame.insert(0, "site", site)
        for j, cls in enumerate(classes):
            frame[label_column(cls)] = rows[label_column(cls)].to_numpy()[order]
            frame[f"prob__{cls}"] = out["probs"][:, j]
        for task in AUX_TASKS:
            frame[aux_column(task)] = rows[aux_column(task)].to_numpy()[order]
        frames.append(frame)
    if not frames:
        raise UserError(f"{run_dir}: no rows in split {split!r} at the evaluated sites {run['eval_sites']}")
    path = run_dir / "predictions" / f"{split}.parquet"
    with atomic_path(path) as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)
    return path
