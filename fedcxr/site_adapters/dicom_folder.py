"""``dicom`` source: any folder of DICOM files, plus an optional label csv → canonical rows.

Files. Every file under ``--input`` (recursively, sorted by relative path; hidden files and
folders skipped) is a candidate image, with or without a ``.dcm`` extension. Files that are
obviously metadata (``.csv .tsv .txt .json .md .xml .yaml .xlsx .pdf .html .log .zip ...``,
``DICOMDIR``) are skipped and counted in the notes; they are not rows. Every other file is
one row read: its header is read (in ``--workers`` processes) and checked the way the
shared image check does (:func:`fedcxr.site_adapters.image_checks.header_or_reason`: truncation,
unsupported transfer syntax, not a DICOM...). A failing file, or a PNG/JPEG in a DICOM
folder, is set aside with the reason. ``source_file`` is the file's relative path and
``source_row`` its 1-based position in the sorted list.

Labels, from a csv (``--labels FILE``, or ``labels.csv`` at the top of the input folder):

* the key column is detected by name (case, spaces and ``_`` ignored), first match wins:
  ``SOPInstanceUID`` (one image), then a file column (``file``, ``filename``, ``file_name``,
  ``path``, ``image_path``, ``image``, ``Image Index``: a relative path, or a bare file name
  when it is unique in the folder, with or without extension), then ``StudyInstanceUID``
  (every image of the study gets the row's labels). No key column → :class:`IngestError`.
* ``--labels-key TAG`` (or ``TAG=COLUMN``) keys the csv by **any DICOM tag** instead:
  ``PatientID`` (RSNA Pneumonia's ``patientId``), ``AccessionNumber``, ``SeriesInstanceUID``...
  TAG must be a DICOM keyword pydicom knows; the csv column is the one named like it (case,
  spaces and ``_`` ignored) or COLUMN; every image whose tag holds a row's value gets that
  row's labels (like a study key). A wrong keyword or a missing column stops the ingest
  naming the csv's columns.
* every other column must be a finding name that :func:`fedcxr.vocab.canonical_class`
  knows (``Pleural Effusion``, ``Effusion``, ``pneumonia``...), a known id column (the other
  key names, ``PatientID``, ``SeriesInstanceUID``, ``AccessionNumber``: ignored) or
  ``split`` (``train``/``val``/``validate``/``test``/blank → the official split). Any other
  column stops the ingest with an :class:`IngestError` naming it: a misspelt finding must
  not silently vanish.
* values: ``1`` positive, ``0`` negative, ``-1`` uncertain, blank not labeled. Any other
  value sets the image(s) keyed by that row aside; the reason names the value, column and
  csv row. Two csv rows with the same key and different labels set the image aside too.
* an image with no csv row is kept unlabeled (NaN); a site with no labeled class at all is
  set aside by the ingest. Csv rows that match no image are counted in the notes.

Without a label csv, labels come from ``StudyDescription`` (the NIH GCP DICOMs carry
``No Finding`` or ``Effusion|Mass`` there) **only if every readable file's description is
a ``|``-separated list of canonical finding names**; then each listed class is 1 and the
other classes seen in the folder are 0 (NIH's convention: a finding not listed is absent).
If any description is something else (``THORAX``, blank) no file gets labels from it, and a
note says why: a free-text description is an order, not a finding.

No labels at all (no csv, and StudyDescription names no findings): the folder is ingested
as an **unlabeled site** (every readable image kept, an empty class set; ``fedcxr predict``
and FACT's unlabeled target use it). The ``images`` source is this adapter with PNG and JPEG
files accepted beside DICOMs (:func:`read_image_folder`): they have no tags, so their
demographics are unknown and each file is its own patient.

Chest radiographs only: a file whose ``Modality`` or ``BodyPartExamined`` (or, without a
body part, its Study/Series Description) names something other than a chest radiograph
(:mod:`fedcxr.site_adapters.body_part`: a hip, teeth, a CT) carries the reason in the
``not_chest`` column; ingest sets it aside with that reason, or keeps it flagged with
``--keep-non-chest``.

Demographics from tags: ``PatientSex`` (M/F; O and blank → unknown), ``PatientAge`` (``062Y``
and the non-conformant ``62``), ``ViewPosition`` (:func:`fedcxr.vocab.view_code`). A value
that cannot be mapped (an age of ``0XYZ`` or ``150Y``, a sex of ``X``) becomes unknown
(null): the row is kept, the count is noted, and it shows as missing in ``site.json``'s aux
availability. DICOM has no race.

Identifiers: the adapter's ``patient_id`` is the first 16 hex digits of sha256(fixed salt +
``PatientID``) and ``study_id`` likewise from ``StudyInstanceUID``: a fixed-length source id,
**not** the pseudonym. ``fedcxr ingest`` replaces both by HMAC-SHA256 pseudonyms under the
site's secret key (:mod:`fedcxr.site_adapters.sitekey`) before anything is written, because
a public salt alone lets anyone recover a short MRN by hashing candidates. A file with no
PatientID falls back to its study (then its SOP UID or path) as its own patient, and the
count is noted. The manifests stay inside the hospital like the images. Site column for ``--site-by``:
``folder`` (the top-level subfolder of the file; files at the top level have none).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable
from fedcxr.site_adapters.body_part import not_chest_reason
from fedcxr.site_adapters.image_checks import read_headers
from fedcxr.site_adapters.image_headers import KIND_DICOM, MAX_PIXELS
from fedcxr.site_adapters.paths import Container
from fedcxr.site_adapters.tables import deeper_hint, failed_note, label_columns, map_distinct, read_table, to_codes
from fedcxr.vocab import (
    CLASSES,
    age_bin_code,
    aux_column,
    canonical_class,
    parse_age,
    raw_column,
    sex_code,
    view_code,
)

ADAPTER_VERSION = "1"
#: The classes this source labels: ``None`` — read from the export (the label csv or StudyDescription decides).
SOURCE_CLASSES: None = None
PSEUDONYM_SALT = "fedcxr-dicom-pseudonym-v1"

#: Extensions (lower case) of files that are never images in a DICOM export.
SKIP_SUFFIXES = frozenset({
    ".csv", ".tsv", ".txt", ".json", ".md", ".rst", ".xml", ".yaml", ".yml", ".xlsx", ".xls",
    ".pdf", ".html", ".htm", ".log", ".parquet", ".py", ".sh", ".ini", ".cfg", ".zip", ".gz",
    ".tar", ".tgz", ".7z", ".md5", ".sha256",
})
SKIP_NAMES = frozenset({"DICOMDIR", "Thumbs.db", "desktop.ini"})

_KEY_SOP = ("sopinstanceuid", "sopuid")
_KEY_FILE = ("file", "filename", "filepath", "path", "imagepath", "image", "imageindex",
             "imagefile", "dicomfile", "dicompath")
_KEY_STUDY = ("studyinstanceuid", "studyuid")
_IGNORED = frozenset(_KEY_SOP + _KEY_FILE + _KEY_STUDY + (
    "patientid", "seriesinstanceuid", "seriesuid", "accessionnumber"))
_SPLITS = {"train": "train", "val": "val", "validate": "val", "validation": "val", "test": "test"}


def pseudonym(value: str) -> str:
    """First 16 hex digits of sha256(public salt + value): the adapter's source id.

    Not a pseudonym on its own (anyone can hash candidate MRNs with the public salt); ingest
    keys it with the site's secret (:func:`fedcxr.site_adapters.ingest.pseudonymise`).
    """
    return hashlib.sha256(f"{PSEUDONYM_SALT}:{value}".encode()).hexdigest()[:16]


def _present(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


# --------------------------------------------------------------------------- files


def list_candidates(input_dir: Path) -> tuple[list[str], Counter]:
    """Relative POSIX paths of candidate image files (sorted) and a count of skipped ones.

    Skips hidden files/folders, :data:`SKIP_NAMES` and :data:`SKIP_SUFFIXES`.
    """
    found: list[str] = []
    skipped: Counter = Counter()
    for folder, dirs, files in os.walk(input_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(folder).relative_to(input_dir)
        for name in files:
            suffix = os.path.splitext(name)[1].lower()
            if name.startswith(".") or name in SKIP_NAMES or suffix in SKIP_SUFFIXES:
                skipped[suffix or name] += 1
                continue
            found.append((rel / name).as_posix())
    return sorted(found), skipped


def skipped_note(skipped: Counter) -> Optional[str]:
    if not skipped:
        return None
    parts = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items()))
    return f"skipped {sum(skipped.values())} non-image file(s) by name ({parts})"


def read_dicom_headers(
    input_dir: Path, files: list[str], options: AdapterOptions, tags: tuple[str, ...] = ()
) -> tuple[list[Optional[dict]], list[Optional[str]]]:
    """Header dict (or None) and reason (or None) per file; PNG/JPEG get a reason too
    (unless ``options.extra["raster"]``: the ``images`` source).

    A file whose path leaves the export (a symbolic link out, unless ``follow_links``) or whose
    name is not valid UTF-8 is never opened: it gets the reason from
    :mod:`fedcxr.site_adapters.paths` instead.
    """
    box = Container(input_dir, follow_links=bool(options.extra.get("follow_links", False)))
    reasons: list[Optional[str]] = [box.contain(f)[2] for f in files]
    to_read = [i for i, r in enumerate(reasons) if r is None]
    results = read_headers([str(input_dir / files[i]) for i in to_read], workers=options.workers,
                           progress=bool(options.extra.get("progress", True)),
                           max_pixels=int(options.extra.get("max_pixels", MAX_PIXELS)), tags=tags)
    headers: list[Optional[dict]] = [None] * len(files)
    raster = bool(options.extra.get("raster"))
    for i, (header, reason) in zip(to_read, results):
        if reason is None and header["kind"] != KIND_DICOM and not raster:
            reason = f"not a DICOM file (a {header['kind'].upper()} image in a DICOM export)"
        headers[i] = header if reason is None else None
        reasons[i] = reason
    return headers, reasons


# --------------------------------------------------------------------------- demographics


def demographics(tags: pd.DataFrame, notes: list[str]) -> dict[str, object]:
    """``aux__sex``, ``aux__age_bin``, ``aux__view`` and ``age`` from DICOM tag columns.

    Unmappable values → unknown (null), counted in ``notes``.
    """
    sex, bad_sex = map_distinct(tags["PatientSex"], sex_code)
    age, bad_age = map_distinct(tags["PatientAge"], parse_age)
    view, _ = map_distinct(tags["ViewPosition"], view_code)
    for what, column, bad in (("sex", "PatientSex", bad_sex), ("age", "PatientAge", bad_age)):
        note = failed_note(f"{what} tag ({column})", tags[column], bad, f"{what} unknown, rows kept")
        if note:
            notes.append(note)
    age_bins = [age_bin_code(a) if not np.isnan(a) else None for a in age]
    return {
        aux_column("sex"): to_codes(sex, tags.index),
        aux_column("age_bin"): pd.Series(pd.array(age_bins, dtype="Int64"), index=tags.index),
        aux_column("view"): to_codes(view, tags.index),
        "age": pd.Series(age, index=tags.index, dtype=float),
    }


def identifiers(tags: pd.DataFrame, paths: pd.Series, notes: list[str]) -> tuple[pd.Series, pd.Series]:
    """Pseudonymous ``patient_id`` / ``study_id`` with documented fallbacks.

    Patient: PatientID, else StudyInstanceUID, else SOPInstanceUID, else the path; study: the
    same chain without PatientID. The source kind is hashed in, so ids never collide across kinds.
    """
    columns = {kind: tags[col].to_numpy(dtype=object) for kind, col in
               (("patient", "PatientID"), ("study", "StudyInstanceUID"), ("sop", "SOPInstanceUID"))}
    columns["file"] = paths.to_numpy(dtype=object)

    def first(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
        out = []
        for i in range(len(paths)):
            kind = next(k for k in kinds if k == "file" or _present(columns[k][i]))
            out.append((kind, str(columns[kind][i]).strip()))
        return out

    patient_src = first(("patient", "study", "sop", "file"))
    study_src = first(("study", "sop", "file"))
    fallback = sum(kind != "patient" for kind, _ in patient_src)
    if fallback:
        notes.append(f"{fallback} file(s) without PatientID: each study (or file) counted as its own patient")
    patient = pd.Series([pseudonym(f"{k}:{v}") for k, v in patient_src], index=tags.index, dtype=object)
    study = pd.Series([pseudonym(f"{k}:{v}") for k, v in study_src], index=tags.index, dtype=object)
    if len(patient) >= 20 and patient.nunique() == 1:
        notes.append("every file has the same PatientID (an anonymiser placeholder?): all rows form one "
                     "patient, so they all land in one split")
    return patient, study


# --------------------------------------------------------------------------- labels


@dataclass
class LabelTable:
    """A parsed label csv: which key, which classes, and per key its labels or a problem."""

    name: str
    key_kind: str  # "sop" | "file" | "study" | "tag"
    key_column: str
    classes: list[str]
    labels: dict[str, dict[str, float]] = field(default_factory=dict)  # key → raw__ column → value
    split: dict[str, Optional[str]] = field(default_factory=dict)
    rows: dict[str, list[int]] = field(default_factory=dict)  # key → csv rows (1-based)
    problems: dict[str, str] = field(default_factory=dict)  # key → reason
    blank_keys: int = 0
    ambiguous: int = 0  # bare file names matching several files
    key_tag: Optional[str] = None  # the DICOM keyword of a "tag" key (--labels-key)


def parse_labels_key(spec: str) -> tuple[str, Optional[str]]:
    """``TAG`` or ``TAG=COLUMN`` → (DICOM keyword, csv column or None); IngestError if not a keyword.

    ``file`` is accepted as TAG too (the relative path / file name key).
    """
    tag, _, column = str(spec).partition("=")
    tag, column = tag.strip(), column.strip() or None
    if tag.lower() == "file":
        return "file", column
    from pydicom.datadict import tag_for_keyword

    if not tag or tag_for_keyword(tag) is None:
        raise IngestError(f"--labels-key {spec!r}: {tag!r} is not a DICOM keyword (e.g. PatientID, "
                          "AccessionNumber, SOPInstanceUID, StudyInstanceUID, SeriesInstanceUID; or 'file'); "
                          "give TAG or TAG=COLUMN")
    return tag, column


def _key_from_option(table: pd.DataFrame, name: str, spec: str) -> tuple[str, str, Optional[str]]:
    """(kind, csv column, DICOM keyword) of ``--labels-key``; IngestError naming the columns otherwise."""
    tag, column = parse_labels_key(spec)
    if column is None:
        column = next((c for c in table.columns if _norm(c) == _norm(tag)), None)
    if column is None or column not in table.columns:
        wanted = repr(column) if column else f"named like {tag!r} (case, spaces and _ ignored)"
        raise IngestError(f"--labels-key {spec}: {name} has no column {wanted}; its columns: "
                          f"{', '.join(repr(c) for c in table.columns)}; name the column with --labels-key "
                          f"{tag}=COLUMN")
    kind = {"sopinstanceuid": "sop", "studyinstanceuid": "study", "file": "file"}.get(_norm(tag), "tag")
    return kind, column, (tag if kind == "tag" else None)


def read_label_csv(path: Path, key: Optional[str] = None) -> LabelTable:
    """Parse and validate a label csv (see module doc); raises :class:`IngestError`.

    ``key``: ``--labels-key`` (``TAG`` or ``TAG=COLUMN``); unset, the key column is found by name.
    """
    if not path.is_file():
        raise IngestError(f"--labels {path}: no such file" + deeper_hint(path))
    table = read_table(path, base=path.parent, dtype=str, root=None)  # the user named it: no export to stay in
    name = path.name
    by_norm = {_norm(c): c for c in table.columns}
    key_kind, key_column, key_tag = None, None, None
    if key is not None:
        key_kind, key_column, key_tag = _key_from_option(table, name, key)
    for kind, aliases in (() if key is not None else (("sop", _KEY_SOP), ("file", _KEY_FILE), ("study", _KEY_STUDY))):
        hit = next((by_norm[a] for a in aliases if a in by_norm), None)
        if hit is not None:
            key_kind, key_column = kind, hit
            break
    if key_column is None:
        raise IngestError(
            f"{name}: no key column; need one of SOPInstanceUID, StudyInstanceUID or a file column "
            f"(file, filename, path, image_path, Image Index); found {', '.join(repr(c) for c in table.columns)}"
        )
    class_of: dict[str, str] = {}
    unknown, split_column = [], None
    for col in table.columns:
        if col == key_column or _norm(col) in _IGNORED:
            continue
        if _norm(col) == "split":
            split_column = col
            continue
        cls = canonical_class(col)
        if cls is None:
            unknown.append(col)
        elif cls in class_of.values():
            raise IngestError(f"{name}: two columns map to class {cls!r}: "
                              f"{[c for c, k in class_of.items() if k == cls] + [col]}")
        else:
            class_of[col] = cls
    if unknown:
        raise IngestError(
            f"{name}: column(s) {', '.join(repr(c) for c in unknown)} are neither finding names nor id "
            f"columns; rename them to canonical classes ({', '.join(CLASSES)}) or remove them"
        )
    if not class_of:
        raise IngestError(f"{name}: no label column besides the key {key_column!r}")
    raw, _bad, reasons = label_columns(table, class_of)
    out = LabelTable(name, key_kind, key_column, [c for c in CLASSES if c in class_of.values()], key_tag=key_tag)
    keys = table[key_column].to_numpy(dtype=object)
    splits = table[split_column].to_numpy(dtype=object) if split_column else [None] * len(table)
    for i, key in enumerate(keys):
        row = i + 1  # 1-based data row (header excluded), as everywhere in ingest reports
        key = _clean_key(key, key_kind)
        if not key:
            out.blank_keys += 1
            continue
        reason = reasons[i]
        split_value = splits[i]
        split = None
        if isinstance(split_value, str) and split_value.strip():
            split = _SPLITS.get(split_value.strip().lower())
            if split is None and reason is None:
                reason = f"unknown split value: {split_value!r} in column {split_column!r}"
        labels = {col: float(values[i]) for col, values in raw.items()}
        out.rows.setdefault(key, []).append(row)
        if reason is not None:
            out.problems.setdefault(key, f"{reason} ({name} row {row})")
        elif key in out.labels and (not _same(out.labels[key], labels) or out.split.get(key) != split):
            first = out.rows[key][0]
            out.problems.setdefault(
                key, f"conflicting label rows: {name} rows {first} and {row} differ for the same {key_column}")
        else:
            out.labels.setdefault(key, labels)
            out.split.setdefault(key, split)
    return out


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return all((np.isnan(a[k]) and np.isnan(b[k])) or a[k] == b[k] for k in a)


def _clean_key(value: object, kind: str) -> str:
    if not isinstance(value, str):
        return ""
    text = value.strip().strip("\x00").strip()
    if kind == "file":
        text = text.replace("\\", "/")
        while text.startswith("./"):
            text = text[2:]
    return text


def match_label_keys(table: LabelTable, files: list[str], tags: pd.DataFrame) -> list[Optional[str]]:
    """For each file (rows of ``tags``), the label-table key that applies to it, or None.

    File keys match a relative path first, then a unique bare file name, then a unique name
    without extension. A bare name shared by several files is ambiguous and matches none of
    them (the files stay unlabeled; a note says so).
    """
    if table.key_kind == "sop":
        return [v if v in table.rows else None for v in tags["SOPInstanceUID"]]
    if table.key_kind == "study":
        return [v if v in table.rows else None for v in tags["StudyInstanceUID"]]
    if table.key_kind == "tag":  # every image whose tag has the row's value gets its labels
        return [v if v in table.rows else None for v in tags[table.key_tag]]
    by_name: dict[str, list[int]] = {}
    by_stem: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        base = f.rsplit("/", 1)[-1]
        by_name.setdefault(base, []).append(i)
        by_stem.setdefault(os.path.splitext(base)[0], []).append(i)
    matched: list[Optional[str]] = [None] * len(files)
    index_of = {f: i for i, f in enumerate(files)}
    for key in table.rows:
        hits = [index_of[key]] if key in index_of else by_name.get(key) or by_stem.get(key) or []
        if len(hits) > 1:
            table.ambiguous += 1
            continue
        for i in hits:
            if matched[i] is None or key == files[i]:
                matched[i] = key
    return matched


def labels_from_csv(
    table: LabelTable, files: list[str], tags: pd.DataFrame, notes: list[str]
) -> tuple[dict[str, np.ndarray], list[Optional[str]], list[Optional[str]]]:
    """``raw__`` arrays, official split and per-file problem reason from a label csv."""
    keys = match_label_keys(table, files, tags)
    n = len(files)
    raw = {raw_column(c): np.full(n, np.nan) for c in table.classes}
    split: list[Optional[str]] = [None] * n
    problems: list[Optional[str]] = [None] * n
    for i, key in enumerate(keys):
        if key is None:
            continue
        if key in table.problems:
            problems[i] = table.problems[key]
            continue
        for col, value in table.labels[key].items():
            raw[col][i] = value
        split[i] = table.split.get(key)
    used = {k for k in keys if k is not None}
    unmatched = [rows[0] for k, rows in table.rows.items() if k not in used]
    labeled = sum(k is not None for k in keys)
    notes.append(f"{table.name}: keyed by {table.key_column!r}; {labeled} of {n} readable file(s) matched a "
                 f"label row; classes: {', '.join(table.classes)}")
    if unmatched:
        shown = ", ".join(str(r) for r in sorted(unmatched)[:5])
        notes.append(f"{table.name}: {len(unmatched)} label row(s) match no readable DICOM (e.g. rows {shown})")
    if table.ambiguous:
        notes.append(f"{table.name}: {table.ambiguous} file name(s) match several files; use relative paths")
    if table.blank_keys:
        notes.append(f"{table.name}: {table.blank_keys} row(s) with a blank {table.key_column!r} ignored")
    return raw, split, problems


def labels_from_description(tags: pd.DataFrame, notes: list[str]) -> tuple[list[str], dict[str, np.ndarray]]:
    """Classes and ``raw__`` arrays from StudyDescription when it cleanly names findings."""
    parsed: list[list[str]] = []
    unmapped: list[str] = []
    for text in tags["StudyDescription"]:
        names = [t.strip() for t in text.split("|")] if isinstance(text, str) else []
        classes = [canonical_class(t) for t in names if t]
        if not classes or any(c is None for c in classes):
            unmapped.append(text if isinstance(text, str) else "(blank)")
        parsed.append([c for c in classes if c])
    if unmapped or not parsed:
        if parsed:
            examples = ", ".join(repr(t[:40]) for t in pd.unique(pd.Series(unmapped))[:3])
            notes.append(
                f"no label csv, and StudyDescription of {len(unmapped)} of {len(parsed)} file(s) is not a list of "
                f"finding names (e.g. {examples}): images are unlabeled; pass --labels FILE.csv"
            )
        return [], {}
    classes = [c for c in CLASSES if any(c in p for p in parsed)]
    raw = {raw_column(c): np.array([1.0 if c in p else 0.0 for p in parsed]) for c in classes}
    notes.append(f"labels from StudyDescription (every file names findings there): {', '.join(classes)}; "
                 "a class not listed on a file is negative")
    return classes, raw


# --------------------------------------------------------------------------- adapter


def read_dicom_folder(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a folder of DICOM files (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    files, skipped = list_candidates(input_dir)
    notes = [n for n in [skipped_note(skipped)] if n]
    labels_csv = options.labels_csv
    if labels_csv is None and (input_dir / "labels.csv").is_file():
        labels_csv = input_dir / "labels.csv"
        notes.append("using labels.csv found in the input folder")
    if options.labels_key and labels_csv is None:
        raise IngestError(f"--labels-key {options.labels_key}: no label csv (give --labels FILE.csv, or put "
                          f"labels.csv in {input_dir})")
    table = read_label_csv(Path(labels_csv), options.labels_key) if labels_csv is not None else None
    if not files:
        raise IngestError(f"--input {input_dir}: no candidate DICOM files found")

    extra_tags = (table.key_tag,) if table is not None and table.key_tag else ()
    headers, reasons = read_dicom_headers(input_dir, files, options, extra_tags)
    set_aside = [SetAside(f, i + 1, r, f) for i, (f, r) in enumerate(zip(files, reasons)) if r is not None]
    keep = [i for i, r in enumerate(reasons) if r is None]
    kept_files = [files[i] for i in keep]
    tags = pd.DataFrame([headers[i] for i in keep], columns=list(dict.fromkeys((*_TAG_COLUMNS, *extra_tags))),
                        dtype=object)
    paths = pd.Series(kept_files, dtype=object)

    classes: list[str]
    split: list[Optional[str]] = [None] * len(keep)
    problems: list[Optional[str]] = [None] * len(keep)
    if table is not None:
        classes = table.classes
        raw, split, problems = labels_from_csv(table, kept_files, tags, notes)
    else:
        classes, raw = labels_from_description(tags, notes)

    patient, study = identifiers(tags, paths, notes)
    frame = pd.DataFrame({
        "image_path": paths,
        "patient_id": patient,
        "study_id": study,
        **{col: pd.Series(values) for col, values in raw.items()},
        **demographics(tags, notes),
        "official_split": pd.Series(split, dtype=object),
        "group__folder": pd.Series([f.split("/", 1)[0] if "/" in f else None for f in kept_files], dtype=object),
        "source_file": paths,
        "source_row": pd.Series([i + 1 for i in keep], dtype="int64"),
        "instance_uid": tags["SOPInstanceUID"],
        "not_chest": pd.Series([not_chest_reason(h) if h.get("kind") == KIND_DICOM else None
                                for h in (headers[i] for i in keep)], dtype=object),
    })
    bad = np.array([p is not None for p in problems], dtype=bool)
    set_aside += [SetAside(f, int(r), p, f) for f, r, p in
                  zip(frame.loc[bad, "image_path"], frame.loc[bad, "source_row"], np.array(problems, dtype=object)[bad])]
    frame = frame.loc[~bad].reset_index(drop=True)
    return SourceTable(
        source="dicom", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame, classes=classes,
        set_aside=set_aside, rows_read=len(files), headers_checked=True, notes=notes,
    )


def read_image_folder(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """``images`` source: a folder of DICOM, PNG and JPEG files (PNG/JPEG have no tags)."""
    options.extra["raster"] = True
    table = read_dicom_folder(input_dir, options)
    table.source = "images"
    return table


_TAG_COLUMNS = ("PatientID", "PatientSex", "PatientAge", "ViewPosition", "SOPInstanceUID",
                "StudyInstanceUID", "StudyDescription")

__all__ = [
    "ADAPTER_VERSION", "LabelTable", "PSEUDONYM_SALT", "demographics", "identifiers", "list_candidates",
    "pseudonym", "read_dicom_folder", "read_dicom_headers", "read_image_folder", "read_label_csv",
]
