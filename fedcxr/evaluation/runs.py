"""Reading what training leaves in a run directory: ``run.json`` and prediction tables.

Contract (written by the training side)::

    RUN_DIR/run.json                      method, seed, target, classes, sites, eval_sites, config
    RUN_DIR/predictions/<split>.parquet   one row per image per evaluated site:
        site, row_key, patient_key, label__<c> (1/0/NaN), prob__<c> (sigmoid), aux__<task>

and by ``fedcxr evaluate`` for ``fedcxr predict`` and the bundle export::

    RUN_DIR/operating_points.json         {site: {class: {rule: threshold | null, reason}}}

Prediction tables hold no identifiers (no image path, no patient id). ``row_key`` is a
pseudonymous per-row key: it must be the same for the same image in every run on the same data,
because the comparison of two runs pairs their rows by ``(site, row_key)``. ``patient_key`` is a
pseudonymous per-patient key, used only to resample or cluster rows by patient (patient-level
bootstrap, patient-clustered DeLong); no report writes either key.

Everything here turns a malformed run directory into a :class:`~fedcxr.errors.UserError` that
names the file and the key or column at fault, so ``fedcxr evaluate``/``report`` exit with 2.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from fedcxr.errors import UserError
from fedcxr.rundir import OPERATING_POINTS, RunDir, read_run_info

log = logging.getLogger(__name__)

REQUIRED_RUN_KEYS = ("method", "seed", "classes")
ID_COLUMNS = ("site", "row_key", "patient_key")
#: Columns of the previous contract; named in the error when a table still has them.
LEGACY_ID_COLUMNS = ("image_path", "patient_id")


def load_run_info(run_dir: Path | str) -> dict[str, Any]:
    """Read and check ``RUN_DIR/run.json``; fills ``target`` (None), ``sites``/``eval_sites`` ([])."""
    run = RunDir.existing(run_dir)  # the run directory's policy: fedcxr.rundir
    path = run.run_info
    info = read_run_info(run.root)
    for key in REQUIRED_RUN_KEYS:
        if key not in info:
            raise UserError(f"{path}: missing key {key!r}")
    if not isinstance(info["method"], str) or not info["method"]:
        raise UserError(f"{path}: 'method' must be a non-empty string")
    if isinstance(info["seed"], bool) or not isinstance(info["seed"], int):
        raise UserError(f"{path}: 'seed' must be an integer, got {info['seed']!r}")
    classes = info["classes"]
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise UserError(f"{path}: 'classes' must be a non-empty list of class names")
    if len(set(classes)) != len(classes):
        raise UserError(f"{path}: 'classes' lists a class twice")
    info = dict(info)
    info.setdefault("target", None)
    for key in ("sites", "eval_sites"):
        value = info.get(key) or []
        if not isinstance(value, list):
            raise UserError(f"{path}: {key!r} must be a list of site names")
        info[key] = [str(v) for v in value]
    return info


def predictions_path(run_dir: Path | str, split: str) -> Path:
    """``RUN_DIR/predictions/<split>.parquet`` (:class:`fedcxr.rundir.RunDir`)."""
    return RunDir(run_dir).predictions(split)


def load_predictions(
    run_dir: Path | str,
    split: str,
    classes: list[str],
) -> pd.DataFrame:
    """Read and check ``predictions/<split>.parquet`` (written by ``fedcxr evaluate``'s command layer)."""
    run_dir = RunDir.existing(run_dir).root
    path = predictions_path(run_dir, split)
    if not path.is_file():
        raise UserError(f"{run_dir}: predictions for split {split!r} are missing ({path.relative_to(run_dir)}); "
                        f"run `fedcxr evaluate {run_dir} --split {split}` to write them")
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path}: cannot read predictions ({exc})") from None
    return check_predictions(frame, classes, path)


def check_predictions(frame: pd.DataFrame, classes: list[str], source: Path | str) -> pd.DataFrame:
    """Check columns and values of a prediction table; ``source`` names it in messages."""
    required = list(ID_COLUMNS) + [f"label__{c}" for c in classes] + [f"prob__{c}" for c in classes]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        legacy = [c for c in LEGACY_ID_COLUMNS if c in frame.columns]
        hint = (f" (it has {'/'.join(legacy)} columns of the old contract: predictions now carry "
                "pseudonymous row_key/patient_key instead; write them again)"
                if legacy and any(c in ID_COLUMNS for c in missing) else "")
        raise UserError(f"{source}: missing column(s) {', '.join(missing)}{hint}")
    if frame.empty:
        raise UserError(f"{source}: no prediction rows")
    converted = {}
    for cls in classes:
        labels = _numeric(frame, f"label__{cls}", source)
        bad = ~(np.isnan(labels) | (labels == 0) | (labels == 1))
        if bad.any():
            raise UserError(f"{source}: column label__{cls} row {int(np.flatnonzero(bad)[0])}: "
                            f"label must be 1, 0 or empty, got {float(labels[bad][0])!r}")
        probs = _numeric(frame, f"prob__{cls}", source)
        bad = np.isnan(probs) | (probs < 0) | (probs > 1)
        if bad.any():
            raise UserError(f"{source}: column prob__{cls} row {int(np.flatnonzero(bad)[0])}: "
                            f"probability must be in [0, 1], got {float(probs[bad][0])!r} "
                            f"({int(bad.sum())} such row(s))")
        converted[f"label__{cls}"], converted[f"prob__{cls}"] = labels, probs
    if frame["site"].isna().any():
        raise UserError(f"{source}: column site is empty on {int(frame['site'].isna().sum())} row(s)")
    if frame["row_key"].isna().any():
        raise UserError(f"{source}: column row_key is empty on {int(frame['row_key'].isna().sum())} "
                        "row(s); comparisons pair rows of two runs by it")
    if frame["patient_key"].isna().any():
        raise UserError(f"{source}: column patient_key is empty on {int(frame['patient_key'].isna().sum())} "
                        "row(s); the patient-level bootstrap and the patient-clustered DeLong test need it")
    frame = frame.reset_index(drop=True)
    # plain float64 label/prob columns (NaN = unlabeled) whatever dtype the writer used
    return frame.assign(site=frame["site"].astype(str), **converted)


def _numeric(frame: pd.DataFrame, column: str, source) -> np.ndarray:
    try:
        return pd.to_numeric(frame[column], errors="raise").to_numpy(dtype=float, na_value=np.nan)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{source}: column {column} is not numeric ({exc})") from None


def thresholds_for(run_dir: Path, run: dict, site: Optional[str]) -> tuple[Optional[str], dict]:
    """``(site whose thresholds apply, {class: {rule: t}})`` from ``operating_points.json``, or ``(None, {})``
    (the reason is logged as a warning; :func:`decision_thresholds` also returns it)."""
    chosen, thresholds, reason = decision_thresholds(run_dir, run, site)
    if reason:
        log.warning("%s: probabilities only, no decisions", reason)
    return chosen, thresholds


def decision_thresholds(run_dir: Path, run: dict, site: Optional[str]) -> tuple[Optional[str], dict, Optional[str]]:
    """``(site whose thresholds apply, {class: {rule: t}}, None)``, or ``(None, {}, why there are none)``.

    Without ``site`` the thresholds are the run's target's, or those of the only site evaluated;
    a run without a ``target:`` evaluated at several sites has no single choice, and the reason
    says to pass ``--site``."""
    files = RunDir.of(run_dir)
    path = files.operating_points
    if not path.is_file():
        if files.report_json.is_file():  # evaluated, but no thresholds stored (an older fedcxr's evaluate)
            return None, {}, (f"{run_dir} has a report but no {OPERATING_POINTS} (no operating points were chosen: "
                              f"no validation rows?); run `fedcxr evaluate {run_dir}` again: it says why")
        return None, {}, (f"{run_dir} has no {OPERATING_POINTS}: the run was never evaluated (run "
                          f"`fedcxr evaluate {run_dir}` first: it chooses the thresholds on the validation split)")
    try:
        stored = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(stored, dict):
        raise UserError(f"{path}: expected a mapping of site → class → thresholds")
    if site is None:
        candidates = [run.get("target")] if run.get("target") in stored else list(stored)
        if len(candidates) != 1:
            why = ("the run has no `target:`" if not run.get("target")
                   else f"its target {run.get('target')!r} has none")
            return None, {}, (f"{path.name} holds thresholds of sites {', '.join(sorted(stored)) or '(none)'} and "
                              f"{why}: pass --site NAME to apply one site's thresholds (and model)")
        site = candidates[0]
    if site not in stored:
        return None, {}, (f"{path.name} has no thresholds for site {site!r} "
                          f"(it has {', '.join(sorted(stored)) or 'none'})")
    undefined = _all_undefined(stored[site])
    if undefined is not None:  # e.g. a site without validation rows: evaluate stored it with the reason
        return None, {}, f"{path.name} has no threshold for site {site!r}: {undefined}"
    return site, stored[site], None


def _all_undefined(per_class) -> Optional[str]:
    """The stored reason(s) when no class of a site has any defined threshold, else None."""
    if not isinstance(per_class, dict) or not per_class:
        return None
    entries = [e for e in per_class.values() if isinstance(e, dict)]
    if len(entries) != len(per_class) or any(v is not None for e in entries for k, v in e.items() if k != "reason"):
        return None
    reasons = list(dict.fromkeys(str(e.get("reason")) for e in entries if e.get("reason")))
    return "; ".join(reasons) or "every threshold is undefined"
