"""Canonical per-site manifests: label policy, patient-disjoint splits, atomic writing.

Output of one ingest (DESIGN §2)::

    OUT/<site>/manifest.parquet   one row per image, canonical columns
    OUT/<site>/site.json          class mask, counts, aux availability, provenance, hash
    OUT/<site>/ingest_report.json the ingest that wrote the site, as the site sees it: its rows
    OUT/<site>/set_aside.csv      kept / set aside, and its own set-aside rows with their reasons
    OUT/ingest_report.json        the latest ingest into OUT: every row set aside, each with its
    OUT/set_aside.csv             site (none where not known: listed only here; set_aside_sites)
    OUT/.fedcxr_site_key          the site's secret pseudonym key (unless given elsewhere)

Files are written to a temporary name and renamed, so a crash never leaves a half manifest,
and re-running an ingest into the same OUT replaces the sites it writes.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from fedcxr.atomic import atomic_write_bytes, atomic_write_json  # noqa: F401  (re-exported)
from fedcxr.site_adapters.base import IngestError, SetAside
from fedcxr.vocab import (
    AUX_TASKS,
    AUX_VOCAB,
    CLASSES,
    MANIFEST_VERSION,
    aux_column,
    label_column,
    raw_column,
)

SPLITS = ("train", "val", "test")
UNCERTAIN_POLICIES = ("zeros", "ones", "ignore")


# --------------------------------------------------------------------------- labels


def apply_uncertain_policy(frame: pd.DataFrame, classes: Iterable[str], policy: str) -> pd.DataFrame:
    """Fill ``label__<c>`` from ``raw__<c>``: -1 → 0 (zeros), 1 (ones) or NaN (ignore).

    Every canonical class gets a ``label__`` column; classes the source never labels are NaN.
    """
    if policy not in UNCERTAIN_POLICIES:
        raise IngestError(f"--uncertain must be one of {', '.join(UNCERTAIN_POLICIES)}, got {policy!r}")
    out = frame.copy()
    replacement = {"zeros": 0.0, "ones": 1.0, "ignore": np.nan}[policy]
    new_cols = {}
    for cls in CLASSES:
        if cls in classes:
            raw = out[raw_column(cls)].to_numpy(dtype=float)
            new_cols[label_column(cls)] = np.where(raw == -1.0, replacement, raw)
        else:
            new_cols[label_column(cls)] = np.full(len(out), np.nan)
    return pd.concat([out, pd.DataFrame(new_cols, index=out.index)], axis=1)


def apply_implied_negatives(frame: pd.DataFrame, classes: Iterable[str]) -> pd.DataFrame:
    """``label__<c> = 0`` where ``raw__no_finding == 1`` and ``raw__<c>`` is blank, for each ``c``.

    The CheXpert labeler's rule (CheXpert, MIMIC-CXR; the adapters' docs name the sources):
    No Finding is set only when no listed observation is positive or uncertain, so on such a
    row a blank (not mentioned) observation is known to be absent. ``raw__<c>`` keeps the
    blank, so the count of implied negatives stays visible (:func:`site_summary`). Classes
    without a ``label__`` column, and frames without ``raw__no_finding``, are left alone.
    """
    classes = [c for c in classes if label_column(c) in frame and raw_column(c) in frame]
    if not classes or raw_column("no_finding") not in frame:
        return frame
    out = frame.copy()
    healthy = out[raw_column("no_finding")].to_numpy(dtype=float) == 1.0
    for cls in classes:
        blank = np.isnan(out[raw_column(cls)].to_numpy(dtype=float))
        label = out[label_column(cls)].to_numpy(dtype=float).copy()
        label[healthy & blank & np.isnan(label)] = 0.0
        out[label_column(cls)] = label
    return out


def implied_negative_counts(frame: pd.DataFrame, classes: Iterable[str]) -> dict[str, int]:
    """Per class, the rows whose label is 0 while the raw cell is blank (implied negatives)."""
    counts = {}
    for cls in classes:
        raw, label = raw_column(cls), label_column(cls)
        if raw in frame and label in frame:
            n = int((frame[raw].isna() & (frame[label] == 0)).sum())
            if n:
                counts[cls] = n
    return counts


# --------------------------------------------------------------------------- splits


def patient_bucket(patient_ids: pd.Series, salt: str = "fedcxr-split") -> np.ndarray:
    """Deterministic uniform value in [0, 1) per patient (stable across runs and machines)."""
    # One hash per distinct patient, broadcast by factorize codes (no per-row Python).
    codes, uniq = pd.factorize(patient_ids.astype(str), use_na_sentinel=False)
    values = np.array([
        int.from_bytes(hashlib.sha256(f"{salt}:{pid}".encode()).digest()[:8], "big") / 2**64
        for pid in uniq.tolist()
    ], dtype=float)
    return values[codes]


def assign_splits(
    frame: pd.DataFrame,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
) -> tuple[pd.DataFrame, list[SetAside]]:
    """Give every row a patient-disjoint ``split``; set aside patients in two official splits.

    * official ``train``/``val``/``test`` are kept;
    * official ``train_val`` (NIH) is cut into train/val by patient hash;
    * rows without an official split get train/val/test by patient hash.

    A patient whose rows carry two different official splits is set aside whole (every row,
    with a reason naming both splits) because keeping any part of it would leak across splits.
    """
    out = frame.copy()
    official = out["official_split"].where(out["official_split"].notna(), None)
    has_official = official.notna()
    set_aside: list[SetAside] = []
    if has_official.any():
        # One official split per patient, comparing train_val as its own value.
        per_patient = out.loc[has_official].groupby("patient_id")["official_split"].nunique()
        conflicted = set(per_patient.index[per_patient > 1])
        # A patient with official rows and unofficial rows is also a conflict (cannot place both).
        # (vectorised: iterating 10^5 Arrow strings into Python sets cost ~0.15 s on NIH)
        some = has_official.groupby(out["patient_id"]).agg(["any", "all"])
        mixed = set(some.index[some["any"] & ~some["all"]])
        conflicted |= mixed
        if conflicted:
            bad = out["patient_id"].isin(conflicted)
            splits_of = out.loc[bad].groupby("patient_id")["official_split"].agg(
                lambda s: ", ".join(sorted({str(v) if v is not None else "none" for v in s}))
            )
            for _, row in out.loc[bad].iterrows():
                set_aside.append(
                    SetAside(
                        file=row["source_file"],
                        row=int(row["source_row"]),
                        image_path=row["image_path"],
                        reason=f"patient in two official splits ({splits_of[row['patient_id']]})",
                    )
                )
            out = out.loc[~bad].copy()
            official = official.loc[out.index]
            has_official = official.notna()
    bucket = patient_bucket(out["patient_id"])
    hashed = np.where(
        bucket < test_fraction, "test", np.where(bucket < test_fraction + val_fraction, "val", "train")
    )
    # train_val is split into train/val with the val share renormalised to the non-test part.
    tv_val = bucket < val_fraction / max(1e-9, 1.0 - test_fraction)
    split = np.where(has_official, official.astype(object), hashed)
    split = np.where(split == "train_val", np.where(tv_val, "val", "train"), split)
    split = np.where(split == "validate", "val", split)
    out["split"] = split.astype(str)
    bad_split = ~out["split"].isin(SPLITS)
    if bad_split.any():
        values = sorted(set(out.loc[bad_split, "split"]))
        raise IngestError(f"adapter produced unknown split value(s) {values}")
    verify_patient_disjoint(out)
    return out, set_aside


def verify_patient_disjoint(frame: pd.DataFrame) -> None:
    """Raise if any patient appears in more than one split (a leak the user must never get)."""
    counts = frame.groupby("patient_id")["split"].nunique()
    leaked = int((counts > 1).sum())
    if leaked:
        raise IngestError(f"split is not patient-disjoint: {leaked} patient(s) in more than one split")


# --------------------------------------------------------------------------- writing


MANIFEST_COLUMNS_HEAD = ["image_path", "patient_id", "study_id", "site", "split", "age"]
#: Oldest ``manifest_version`` this fedcxr reads: version 1 manifests kept the export's own
#: patient/study ids (csv, NIH, CheXpert, MIMIC) and a publicly salted hash (DICOM, MIDRC).
OLDEST_READABLE_VERSION = 2
#: the most bytes a site.json may hold (it is a few kB)
SITE_JSON_BYTES = 64 << 20


def manifest_columns(frame: pd.DataFrame) -> list[str]:
    """Canonical column order: ids, labels, raw labels, aux codes, provenance."""
    head = MANIFEST_COLUMNS_HEAD[:1] + (["image_key"] if "image_key" in frame else []) + MANIFEST_COLUMNS_HEAD[1:]
    labels = [label_column(c) for c in CLASSES]
    raws = [raw_column(c) for c in CLASSES if raw_column(c) in frame]
    aux = [aux_column(t) for t in AUX_TASKS]
    tail = [c for c in ("not_chest", "source_file", "source_row") if c in frame]
    groups = sorted(c for c in frame.columns if c.startswith("group__"))
    return head + labels + raws + aux + groups + tail


def content_hash(frame: pd.DataFrame) -> str:
    """Order-sensitive hash of the manifest's content (independent of Parquet encoder bytes)."""
    hashed = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    header = "\x1f".join(frame.columns).encode()
    return hashlib.sha256(header + hashed.tobytes()).hexdigest()


def site_summary(frame: pd.DataFrame, classes: Iterable[str]) -> dict:
    """Class mask, per-class counts, aux availability and split sizes of one site's rows."""
    counts = {}
    class_set = []
    for cls in CLASSES:
        col = frame[label_column(cls)]
        pos, neg = int((col == 1).sum()), int((col == 0).sum())
        entry = {"positive": pos, "negative": neg, "missing": int(col.isna().sum())}
        raw = raw_column(cls)
        if raw in frame:
            entry["uncertain"] = int((frame[raw] == -1).sum())
            # negatives with a blank raw cell: implied by No Finding = 1 (apply_implied_negatives)
            entry["implied_negative"] = int((frame[raw].isna() & (col == 0)).sum())
        if cls in classes and pos + neg > 0:
            class_set.append(cls)
        if cls in classes:
            counts[cls] = entry
    aux = {}
    for task in AUX_TASKS:
        col = frame[aux_column(task)]
        known = col.notna()
        values = col[known].astype(int).value_counts().sort_index()
        aux[task] = {
            "available": int(known.sum()),
            "missing": int((~known).sum()),
            "counts": {AUX_VOCAB[task][int(k)]: int(v) for k, v in values.items()},
        }
    splits = {s: int((frame["split"] == s).sum()) for s in SPLITS}
    patients = {s: int(frame.loc[frame["split"] == s, "patient_id"].nunique()) for s in SPLITS}
    return {
        "class_set": class_set,
        "class_counts": counts,
        "aux": aux,
        "rows": int(len(frame)),
        "rows_per_split": splits,
        "patients_per_split": patients,
    }


def write_site(
    out_dir: Path,
    site: str,
    frame: pd.DataFrame,
    *,
    classes: Iterable[str],
    source: str,
    adapter_version: str,
    export_root: Path,
    set_aside: list[SetAside],
    options: dict,
    unlabeled: bool = False,
    key_id: Optional[str] = None,
) -> dict:
    """Write ``OUT/<site>/manifest.parquet`` and ``site.json``; return the site.json payload.

    ``unlabeled``: the source labels no finding (``site.json`` ``"unlabeled": true``, empty
    class set); such a site can be scored or be FACT's target, never a labeled source.
    ``key_id`` is the fingerprint of the site key the pseudonyms were made with (never the key).
    """
    frame = with_label_columns(frame)  # a version-2 manifest re-written (fedcxr shift) gains the new classes
    ordered = frame[manifest_columns(frame)].reset_index(drop=True)
    ordered["site"] = site
    site_dir = out_dir / site
    site_dir.mkdir(parents=True, exist_ok=True)
    buffer = _parquet_bytes(ordered)
    atomic_write_bytes(site_dir / "manifest.parquet", buffer)
    summary = site_summary(ordered, list(classes))
    payload = {
        "manifest_version": MANIFEST_VERSION,
        "site": site,
        "source": source,
        "adapter": source,
        "adapter_version": adapter_version,
        "export_root": str(Path(export_root).resolve()),
        "aux_vocab": AUX_VOCAB,
        "classes_all": CLASSES,
        **summary,
        # this site's own set-aside rows (counts here; each row in the folder's set_aside.csv)
        "set_aside": {
            "count": len(set_aside),
            "by_reason": dict(Counter(s.reason.split(":", 1)[0].strip() for s in set_aside).most_common()),
            **({"list": "set_aside.csv"} if set_aside else {}),
        },
        "options": options,
        "unlabeled": bool(unlabeled),
        "pseudonyms": {"method": "hmac-sha256", "key_id": key_id},
        "content_hash": content_hash(ordered),
    }
    atomic_write_json(site_dir / "site.json", payload)
    return payload


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


# --------------------------------------------------------------------------- reading


def label_values(frame: pd.DataFrame, cls: str) -> np.ndarray:
    """``label__<cls>`` as floats; all NaN (not labeled) when the manifest has no such column.

    A manifest written before ``cls`` was a canonical class (manifest version 2, see
    :data:`fedcxr.vocab.ADDED_CLASSES`) lacks its column: that site never labeled it. The frame
    itself is left as written, so its content hash (run resume checks, prediction row keys)
    stays what it was when the run started.
    """
    column = label_column(cls)
    if column not in frame:
        return np.full(len(frame), np.nan)
    return frame[column].to_numpy(dtype=float, na_value=np.nan)


def with_label_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with an all-NaN ``label__`` column for every canonical class it lacks."""
    missing = {label_column(c): np.full(len(frame), np.nan) for c in CLASSES if label_column(c) not in frame}
    if not missing:
        return frame
    return pd.concat([frame, pd.DataFrame(missing, index=frame.index)], axis=1)



def read_manifest(site_dir: Path | str, split: Optional[str] = None) -> pd.DataFrame:
    """Load a site's manifest (optionally one split) as written by :func:`write_site`."""
    site_dir = Path(site_dir)
    path = site_dir / "manifest.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest (run `fedcxr ingest` first)")
    frame = pd.read_parquet(path)
    if split is not None:
        frame = frame.loc[frame["split"] == split].reset_index(drop=True)
    return frame


def read_site_json(site_dir: Path | str) -> dict:
    """Load a site's ``site.json``; refuse one written before keyed pseudonyms (version < 2)."""
    path = Path(site_dir) / "site.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no site.json (run `fedcxr ingest` first)")
    from fedcxr.site_adapters.inputs import read_input_bytes

    try:  # a regular file of bounded size: a pipe or a device in its place never hangs a run
        meta = json.loads(read_input_bytes(path, name=str(path), limit=SITE_JSON_BYTES, decompress=False).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise IngestError(f"{path}: not valid JSON ({exc}); run `fedcxr ingest` again") from None
    version = meta.get("manifest_version") if isinstance(meta, dict) else None
    if not isinstance(version, int) or version < OLDEST_READABLE_VERSION:
        raise IngestError(
            f"{path}: manifest_version {version!r} was written by an older fedcxr whose manifests may hold "
            f"the export's own patient ids; run `fedcxr ingest` again (version {MANIFEST_VERSION} keys "
            "every id with the site's secret key)"
        )
    if version > MANIFEST_VERSION:
        raise IngestError(f"{path}: manifest_version {version} is newer than this fedcxr reads "
                          f"({MANIFEST_VERSION}); upgrade fedcxr")
    return meta
