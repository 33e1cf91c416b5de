"""The contract every source adapter fulfils (TorchXRayVision's "one contract for all").

An adapter reads one vendor export and returns a :class:`SourceTable`: a row-aligned frame in
canonical vocabulary plus the rows it had to set aside. Everything vendor-specific stays in
the adapter; image checks, partitions, splits and manifest writing are shared
(:mod:`fedcxr.site_adapters.ingest`).

Columns of ``SourceTable.frame`` (one row per image):

===================  ======================================================================
``image_path``       str, relative to ``SourceTable.root`` (POSIX separators)
``patient_id``       str, the export's patient id (ingest keys it; see below)
``study_id``         str, the export's study id (ingest keys it)
``raw__<class>``     float: 1 positive, 0 negative, -1 uncertain, NaN not labeled — one column
                     per class in ``SourceTable.classes``
``aux__<task>``      nullable Int64 code (see :mod:`fedcxr.vocab`) for sex, age_bin, race, view
``age``              float years or NaN
``official_split``   str ``train``/``val``/``test``/``train_val`` or missing (no official split)
``group__<name>``    optional str columns the ``--site-by`` partitions use (race, state, ...)
``source_file``      str, the metadata file the row came from (relative to the input dir)
``source_row``       int, 1-based data row number within ``source_file`` (header excluded)
``instance_uid``     optional str, the DICOM SOPInstanceUID: ingest keeps the first *decodable*
                     row of an instance and sets the others aside (never written to a manifest)
``not_chest``        optional str: why the DICOM's tags say it is not a chest radiograph
                     (:mod:`fedcxr.site_adapters.body_part`), else None. Ingest sets such rows
                     aside unless ``keep_non_chest``; then the manifest keeps the column
===================  ======================================================================

``patient_id``/``study_id`` are the export's own ids here; :func:`fedcxr.site_adapters.ingest.run_ingest`
replaces them by keyed pseudonyms (:mod:`fedcxr.site_adapters.sitekey`) before anything is written,
and keeps every ``image_path`` inside ``root`` (:mod:`fedcxr.site_adapters.paths`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd

from fedcxr.errors import UserError
from fedcxr.vocab import AUX_TASKS, aux_column, raw_column


class IngestError(UserError):
    """A problem with the user's input that stops the ingest (CLI exit code 2).

    The message must name the file, column or option at fault.
    """


@dataclass
class SetAside:
    """One row that did not make it into a manifest, and why."""

    file: str
    row: Optional[int]
    reason: str
    image_path: Optional[str] = None

    def as_dict(self) -> dict:
        return {"file": self.file, "row": self.row, "image_path": self.image_path, "reason": self.reason}


@dataclass
class AdapterOptions:
    """Options every adapter may receive (from the ``fedcxr ingest`` command line)."""

    uncertain: str = "ignore"  # zeros | ones | ignore (applied centrally, adapters keep -1)
    mapping: Optional[Path] = None  # csv adapter's YAML mapping; dicom adapter's label csv spec
    labels_csv: Optional[Path] = None  # dicom adapter: label csv keyed by UID / file name / a DICOM tag
    #: dicom adapter: the DICOM keyword the label csv is keyed by (``PatientID``, ``AccessionNumber``...);
    #: ``None``: detected from the csv's column names (SOPInstanceUID, a file column, StudyInstanceUID)
    labels_key: Optional[str] = None
    workers: int = 1
    #: CheXpert/MIMIC: a blank pathology on a ``No Finding = 1`` row is a negative (the CheXpert
    #: labeler's rule; ``--no-implied-negatives`` turns it off)
    implied_negatives: bool = True
    #: read the metadata only, never open an image (``fedcxr ingest --plan``)
    plan: bool = False
    #: keep DICOMs whose tags say they are not a chest radiograph (flagged in ``not_chest``)
    keep_non_chest: bool = False
    extra: dict = field(default_factory=dict)


@dataclass
class SourceTable:
    """What an adapter returns: canonical rows, set-aside rows and provenance."""

    source: str
    adapter_version: str
    root: Path
    frame: pd.DataFrame
    classes: list[str]
    set_aside: list[SetAside]
    rows_read: int
    #: True when the adapter already opened every image header (DICOM adapters read tags),
    #: so the shared image check only needs to decode pixels with ``--verify-pixels``.
    headers_checked: bool = False
    notes: list[str] = field(default_factory=list)
    #: Classes whose blank cell is a negative on a row with ``raw__no_finding == 1`` (the
    #: CheXpert labeler's rule; :func:`fedcxr.site_adapters.manifest.apply_implied_negatives`).
    #: Empty: blanks stay "not labeled".
    implied_negative_classes: tuple[str, ...] = ()


#: Signature of an adapter's entry point.
Adapter = Callable[[Path, AdapterOptions], SourceTable]


def empty_aux(n: int) -> dict[str, pd.Series]:
    """All-null aux columns of length ``n`` (for sources that lack a task)."""
    return {aux_column(t): pd.Series(pd.array([pd.NA] * n, dtype="Int64")) for t in AUX_TASKS}


def ensure_columns(frame: pd.DataFrame, classes: list[str]) -> pd.DataFrame:
    """Add any canonical column an adapter left out, with its 'unknown' value."""
    out = frame.copy()
    n = len(out)
    for task in AUX_TASKS:
        col = aux_column(task)
        if col not in out:
            out[col] = pd.array([pd.NA] * n, dtype="Int64")
        else:
            out[col] = out[col].astype("Int64")
    if "age" not in out:
        out["age"] = np.nan
    out["age"] = out["age"].astype(float)
    if "official_split" not in out:
        out["official_split"] = pd.Series([None] * n, dtype=object, index=out.index)
    for cls in classes:
        col = raw_column(cls)
        if col not in out:
            out[col] = np.nan
        out[col] = out[col].astype(float)
    for col in ("image_path", "patient_id", "study_id", "source_file"):
        if col not in out:
            raise IngestError(f"adapter bug: column {col!r} missing from the canonical frame")
        out[col] = out[col].astype(str)
    if "source_row" not in out:
        raise IngestError("adapter bug: column 'source_row' missing from the canonical frame")
    return out


def require_columns(df: pd.DataFrame, required: list[str], file: str | Path) -> None:
    """Stop with a clear message when a metadata file lacks columns the adapter needs."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise IngestError(
            f"{file}: missing required column(s) {', '.join(repr(c) for c in missing)}; "
            f"found {', '.join(repr(c) for c in df.columns)}"
        )
