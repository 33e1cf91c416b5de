"""``midrc`` source: MIDRC data-commons TSVs + DICOM files → canonical rows (label ``covid19``).

Expected export layout (what ``fedcxr synth`` writes, and what a MIDRC download unpacks to)::

    INPUT/
      case.tsv              node ``case``: one row per patient (required)
      imaging_study.tsv     node ``imaging_study``: one row per study (optional)
      cr_series_file.tsv    node ``cr_series_file``: one row per CR DICOM file (optional)
      dx_series_file.tsv    node ``dx_series_file``: one row per DX DICOM file (optional)
      measurement.tsv       node ``measurement`` (optional, not used)
      <any folders>/...     the DICOM files (any depth, ``.dcm`` or no extension)

TSVs are tab-separated with a header row, as MIDRC's Gen3 submission templates
``submission_<node>_template.tsv`` (copies in ``../shared/data/schemas/midrc/``). Every ``*.tsv`` at the
top of INPUT or up to two folders down is looked at; its node is the value of its ``type``
column (``*type`` in templates), else the node name in its file name (``case_batch2.tsv``),
so several TSVs of one node are read one after the other. A required-column ``*`` prefix is
ignored (``*submitter_id`` = ``submitter_id``); links are the dotted columns the templates
use. Columns read:

* ``case``: ``submitter_id``, ``covid19_positive`` (``Yes`` → 1, ``No`` → 0, ``Not Reported``
  or blank → not labeled; any other value sets that case's images aside, naming value and
  row), ``sex``, ``race`` + ``ethnicity`` (:func:`fedcxr.vocab.race_code`: Hispanic wins),
  ``age_at_index`` (0–89) / ``age_at_index_gt89`` (``Yes`` → 90), ``zip`` (3-digit prefix →
  ``group__state`` via :mod:`fedcxr.site_adapters.zip3`; ``000`` → unknown), ``site_id``
  (``group__site_id``).
* ``imaging_study``: ``submitter_id``, ``cases.submitter_id`` (link to the case),
  ``study_uid`` (DICOM StudyInstanceUID), ``age_at_imaging`` / ``age_at_imaging_gt89``.
* ``cr_series_file`` / ``dx_series_file``: ``file_name`` (path of one DICOM file relative to
  INPUT, or a bare file name unique under INPUT), ``imaging_studies.submitter_id`` (link to
  the study), optional ``case_ids`` / ``cases.submitter_id`` (direct link to the case),
  ``view_position`` (``PA`` or an array such as ``["PA"]``; falls back to the DICOM tag).

Rows. Each series-file row is one image (``source_file`` = the TSV, ``source_row`` = its data
row). Each DICOM file under INPUT that no series-file row names is one image too
(``source_file`` = its path, ``source_row`` = its position among those files), linked through
its own tags. An image's case is found by the first link that exists:

1. the series row's ``imaging_studies.submitter_id`` → ``imaging_study`` row → its case;
2. the DICOM's ``StudyInstanceUID`` = an ``imaging_study.study_uid`` → that study's case;
3. the series row's ``case_ids`` / ``cases.submitter_id``;
4. the DICOM's ``PatientID`` = a case ``submitter_id`` (MIDRC writes the case id there).

An image with no link, or whose link names a case absent from the case TSVs, is set aside
("no case row: ..."). So is an image whose DICOM fails the header check (missing, truncated,
unsupported transfer syntax...) or whose tags say it is not a chest radiograph
(:mod:`fedcxr.site_adapters.body_part`; ``--keep-non-chest`` keeps it flagged), and every
image of a case with an unknown ``covid19_positive`` or of a ``submitter_id`` listed twice
with different values.

Age is the study's ``age_at_imaging`` when given (the age at the X-ray), else the case's
``age_at_index``; ``*_gt89 = Yes`` → 90. Unmappable sex/race/age values become unknown (null,
rows kept, counted in the notes). ``patient_id`` and ``study_id`` are salted hashes of the case
submitter id and the study UID (:func:`fedcxr.site_adapters.dicom_folder.pseudonym`), which
ingest keys with the site's secret before writing anything.
``--site-by`` columns: ``state``, ``site_id``, ``race``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable
from fedcxr.site_adapters.body_part import not_chest_reason
from fedcxr.site_adapters.dicom_folder import list_candidates, pseudonym, skipped_note
from fedcxr.site_adapters.image_checks import read_headers
from fedcxr.site_adapters.image_headers import KIND_DICOM, MAX_PIXELS
from fedcxr.site_adapters.paths import Container
from fedcxr.site_adapters.inputs import open_input
from fedcxr.site_adapters.tables import READ_ERRORS, check_csv_header, failed_note, map_distinct, relative_name
from fedcxr.site_adapters.zip3 import zip3_state
from fedcxr.vocab import AUX_VOCAB, age_bin_code, aux_column, parse_age, race_code, raw_column, sex_code, view_code

ADAPTER_VERSION = "1"
#: The classes this source labels (every adapter declares them; ``None``: read from the export).
SOURCE_CLASSES: tuple[str, ...] = ("covid19",)
NODES = ("cr_series_file", "dx_series_file", "imaging_study", "measurement", "case")
SERIES_NODES = ("cr_series_file", "dx_series_file")

_COVID = {"yes": 1.0, "no": 0.0, "not reported": np.nan, "": np.nan}
_CASE_LINK = ("cases.submitter_id", "case.submitter_id", "case_submitter_id")
_STUDY_LINK = ("imaging_studies.submitter_id", "imaging_study.submitter_id", "imaging_study_submitter_id")
_SERIES_CASE_LINK = ("case_ids", "cases.submitter_id", "case.submitter_id", "case_submitter_id")
_MAX_DEPTH = 2


# --------------------------------------------------------------------------- TSVs


@dataclass
class NodeTable:
    """All rows of one node, from one or more TSVs, with their provenance."""

    frame: pd.DataFrame  # columns without '*'; plus _file (relative TSV path) and _row (1-based)
    files: list[str]

    def column(self, *names: str) -> Optional[str]:
        """The first of ``names`` present (case-insensitive), or None."""
        lower = {c.lower(): c for c in self.frame.columns}
        return next((lower[n] for n in names if n in lower), None)


def find_tsvs(input_dir: Path) -> dict[str, NodeTable]:
    """Node name → its rows, from every ``*.tsv`` within two folder levels of ``input_dir``."""
    found: dict[str, list[tuple[str, pd.DataFrame]]] = {}
    for path in _tsv_files(input_dir):
        name = relative_name(path, input_dir)
        frame = _read_tsv(path, name, input_dir)
        node = _node_of(frame, path)
        if node is None:
            continue
        frame["_file"], frame["_row"] = name, np.arange(1, len(frame) + 1)
        found.setdefault(node, []).append((name, frame))
    return {node: NodeTable(pd.concat([f for _, f in parts], ignore_index=True), [n for n, _ in parts])
            for node, parts in found.items()}


def _tsv_files(input_dir: Path) -> list[Path]:
    out = []
    for folder, dirs, files in os.walk(input_dir):
        depth = len(Path(folder).relative_to(input_dir).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < _MAX_DEPTH else []
        out += [Path(folder) / f for f in sorted(files) if f.lower().endswith(".tsv") and not f.startswith(".")]
    return out


def _read_tsv(path: Path, name: str, root: Path) -> pd.DataFrame:
    check_csv_header(path, name, sep="\t", root=root)
    try:
        with open_input(path, root=root, name=name) as handle:  # regular, inside the export, bounded
            frame = pd.read_csv(handle, sep="\t", dtype=str, keep_default_na=False, index_col=False, encoding="utf-8")
    except READ_ERRORS as exc:
        raise IngestError(f"{name}: cannot read as a TSV ({type(exc).__name__}: {exc})") from None
    frame.columns = [str(c).strip().lstrip("*").strip() for c in frame.columns]
    # Gen3 templates carry a lone node-name line with no other values: drop all-blank rows
    # except 'type'.
    data_cols = [c for c in frame.columns if c.lower() != "type"]
    if data_cols:
        frame = frame.loc[(frame[data_cols] != "").any(axis=1)].reset_index(drop=True)
    return frame


def _node_of(frame: pd.DataFrame, path: Path) -> Optional[str]:
    type_col = next((c for c in frame.columns if c.lower() == "type"), None)
    if type_col is not None:
        values = [v.strip() for v in frame[type_col] if v.strip()]
        if values and values[0] in NODES:
            return values[0]
    stem = path.stem.lower()
    return next((n for n in NODES if n in stem), None)


def _require(table: NodeTable, node: str, *names: str) -> str:
    col = table.column(*names)
    if col is None:
        raise IngestError(
            f"{', '.join(table.files)}: {node} TSV lacks column {names[0]!r}"
            + (f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else "")
            + f"; found {', '.join(repr(c) for c in table.frame.columns if not c.startswith('_'))}"
        )
    return col


def _optional(table: NodeTable, name: str) -> pd.Series:
    col = table.column(name)
    return table.frame[col] if col else pd.Series([""] * len(table.frame), index=table.frame.index, dtype=object)


# --------------------------------------------------------------------------- cases and studies


@dataclass
class Cases:
    """Per case submitter id: canonical values, or a reason its images are set aside."""

    covid: dict[str, float]
    age: dict[str, float]
    sex: dict[str, Optional[int]]
    race: dict[str, Optional[int]]
    state: dict[str, Optional[str]]
    site_id: dict[str, Optional[str]]
    problems: dict[str, str]


def read_cases(table: NodeTable, notes: list[str]) -> Cases:
    """Map the case rows onto the canonical vocabularies (see module doc)."""
    frame = table.frame
    sid = frame[_require(table, "case", "submitter_id")].str.strip()
    covid_text = _optional(table, "covid19_positive").str.strip()
    sex, bad_sex = map_distinct(_optional(table, "sex"), sex_code)
    pairs = pd.Series(list(zip(_optional(table, "race"), _optional(table, "ethnicity"))), index=frame.index)
    race, bad_race = map_distinct(pairs.map(lambda p: "\x1f".join(p)),
                                  lambda v: race_code(*(v or "\x1f").split("\x1f")))
    age, bad_age = _ages(_optional(table, "age_at_index"), _optional(table, "age_at_index_gt89"))
    for what, values, bad in (("sex", _optional(table, "sex"), bad_sex),
                              ("race", _optional(table, "race"), bad_race),
                              ("age_at_index", _optional(table, "age_at_index"), bad_age)):
        note = failed_note(f"case {what}", values, bad, f"{what} unknown, rows kept")
        if note:
            notes.append(note)
    zips = _optional(table, "zip").to_numpy(dtype=object)
    site_ids = _optional(table, "site_id").str.strip().to_numpy(dtype=object)
    records = list(frame.drop(columns=["_file", "_row"]).itertuples(index=False, name=None))
    wheres = [f"{f} row {r}" for f, r in zip(frame["_file"], frame["_row"])]
    out = Cases({}, {}, {}, {}, {}, {}, {})
    first_row: dict[str, int] = {}
    for i, (key, text) in enumerate(zip(sid.to_numpy(dtype=object), covid_text.to_numpy(dtype=object))):
        if not key:
            continue
        where = wheres[i]
        if key in first_row:
            if records[first_row[key]] != records[i]:
                out.problems.setdefault(key, f"conflicting case rows: {wheres[first_row[key]]} and {where} "
                                             "describe the same case differently")
            continue
        first_row[key] = i
        if text.lower() not in _COVID:
            out.problems[key] = (f"unknown covid19_positive value: {text!r} (expected Yes, No or "
                                 f"Not Reported; {where})")
        out.covid[key] = _COVID.get(text.lower(), np.nan)
        out.age[key] = age[i]
        out.sex[key] = None if np.isnan(sex[i]) else int(sex[i])
        out.race[key] = None if np.isnan(race[i]) else int(race[i])
        out.state[key] = zip3_state(zips[i])
        out.site_id[key] = site_ids[i] or None
    return out


def _ages(values: pd.Series, over_89: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Years from a 0–89 number plus the ``*_gt89`` flag (``Yes`` → 90); bad → NaN, flagged."""
    age, bad = map_distinct(values, parse_age)
    flag = over_89.astype(str).str.strip().str.lower().to_numpy() == "yes"
    age = np.where(flag, 90.0, age)
    return age, bad & ~flag


@dataclass
class Studies:
    case_of: dict[str, str]  # study submitter id → case submitter id
    by_uid: dict[str, str]  # study_uid → study submitter id
    uid_of: dict[str, str]  # study submitter id → study_uid
    age: dict[str, float]


def read_studies(table: Optional[NodeTable], notes: list[str]) -> Studies:
    out = Studies({}, {}, {}, {})
    if table is None:
        return out
    sid = table.frame[_require(table, "imaging_study", "submitter_id")].str.strip().to_numpy(dtype=object)
    case = table.frame[_require(table, "imaging_study", *_CASE_LINK)].str.strip().to_numpy(dtype=object)
    uid = _optional(table, "study_uid").str.strip().to_numpy(dtype=object)
    age, bad = _ages(_optional(table, "age_at_imaging"), _optional(table, "age_at_imaging_gt89"))
    note = failed_note("imaging_study age_at_imaging", _optional(table, "age_at_imaging"), bad,
                       "case age_at_index used instead")
    if note:
        notes.append(note)
    for i, key in enumerate(sid):
        if not key or key in out.case_of:
            continue
        out.case_of[key] = case[i]
        if uid[i]:
            out.by_uid.setdefault(uid[i], key)
            out.uid_of[key] = uid[i]
        out.age[key] = age[i]
    return out


# --------------------------------------------------------------------------- images


@dataclass
class ImageRow:
    """One image row before linking: where it came from and what the export says about it."""

    path: Optional[str]  # relative to the export root
    source_file: str
    source_row: int
    study_link: str = ""
    case_link: str = ""
    view: str = ""
    problem: Optional[str] = None


def series_images(tables: dict[str, NodeTable], candidates: list[str]) -> list[ImageRow]:
    """One :class:`ImageRow` per cr/dx series-file row, with ``file_name`` resolved to a path."""
    present = set(candidates)
    by_name: dict[str, list[str]] = {}
    for f in candidates:
        by_name.setdefault(f.rsplit("/", 1)[-1], []).append(f)
    images: list[ImageRow] = []
    for node in SERIES_NODES:
        table = tables.get(node)
        if table is None:
            continue
        frame = table.frame
        names = frame[_require(table, node, "file_name")].str.strip().str.replace("\\", "/", regex=False)
        blank = pd.Series([""] * len(frame), index=frame.index, dtype=object)
        study_col, case_col = table.column(*_STUDY_LINK), table.column(*_SERIES_CASE_LINK)
        columns = zip(frame["_file"], frame["_row"], names, frame[study_col] if study_col else blank,
                      frame[case_col] if case_col else blank, _optional(table, "view_position"))
        for file, row, name, study, case, view in columns:
            image = ImageRow(None, file, int(row), study_link=study.strip(), case_link=_first_item(case),
                             view=_first_item(view))
            while name.startswith("./"):
                name = name[2:]
            hits = [name] if name in present else by_name.get(name.rsplit("/", 1)[-1], [])
            if not name:
                image.problem = "series file row has no file_name"
            elif len(hits) > 1:
                image.problem = f"file_name matches {len(hits)} files under the export; give the relative path"
            image.path = hits[0] if len(hits) == 1 else (name or None)
            images.append(image)
    return images


def _first_item(value: object) -> str:
    """First element of a Gen3 array cell (``PA``, ``["PA"]``, ``PA,LL``) as text."""
    text = str(value or "").strip().strip("[]")
    for part in re.split(r"[,|]", text):
        part = part.strip().strip("'\"").strip()
        if part:
            return part
    return ""


def link_case(image: ImageRow, header: dict, studies: Studies, cases: Cases) -> tuple[Optional[str], Optional[str], str]:
    """``(case id, study submitter id, how)`` by the first link that exists (module doc)."""
    study = image.study_link if image.study_link in studies.case_of else None
    how = "imaging_studies.submitter_id"
    if study is None and header.get("StudyInstanceUID") in studies.by_uid:
        study, how = studies.by_uid[header["StudyInstanceUID"]], "DICOM StudyInstanceUID"
    if study is not None:
        return studies.case_of[study], study, f"the imaging study found by {how}"
    if image.case_link:
        return image.case_link, None, "the series file's case link"
    pid = header.get("PatientID")
    if pid and pid in cases.covid:
        return pid, None, "DICOM PatientID"
    return None, None, ""


# --------------------------------------------------------------------------- adapter


def read_midrc(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read a MIDRC-style export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    notes: list[str] = []
    tables = find_tsvs(input_dir)
    if "case" not in tables:
        raise IngestError(f"--input {input_dir}: no case TSV found (expected case.tsv, or a .tsv whose "
                          "'type' column says 'case'); see fedcxr.site_adapters.midrc for the layout")
    notes.append("TSVs: " + "; ".join(f"{node}: {', '.join(t.files)}" for node, t in sorted(tables.items())))
    if "measurement" in tables:
        notes.append("measurement TSV not used (covid19 label from case.covid19_positive)")
    cases = read_cases(tables["case"], notes)
    studies = read_studies(tables.get("imaging_study"), notes)

    candidates, skipped = list_candidates(input_dir)
    skipped.pop(".tsv", None)  # the export's own metadata, read above
    note = skipped_note(skipped)
    if note:
        notes.append(note)
    images = series_images(tables, candidates)
    named = {im.path for im in images if im.path}
    loose = [f for f in candidates if f not in named]
    images += [ImageRow(f, f, i + 1) for i, f in enumerate(loose)]
    if loose and any(t in tables for t in SERIES_NODES):
        notes.append(f"{len(loose)} file(s) not named by any series-file TSV: linked through their DICOM tags")
    if not images:
        raise IngestError(f"--input {input_dir}: no images (no series-file rows and no DICOM files)")

    box = Container(input_dir, follow_links=bool(options.extra.get("follow_links", False)))
    for image in images:  # a file_name leaving the export is never opened
        if image.problem is None and image.path:
            image.problem = box.contain(image.path)[2]
    to_read = [i for i, im in enumerate(images) if im.problem is None]
    results = read_headers([str(input_dir / images[i].path) for i in to_read], workers=options.workers,
                           progress=bool(options.extra.get("progress", True)),
                           max_pixels=int(options.extra.get("max_pixels", MAX_PIXELS)))
    headers: list[dict] = [{} for _ in images]
    for i, (header, reason) in zip(to_read, results):
        if reason is None and header["kind"] != KIND_DICOM:
            reason = f"not a DICOM file (a {header['kind'].upper()} image in a MIDRC export)"
        if reason is not None:
            images[i].problem = reason
        else:
            headers[i] = header
    return _build(input_dir, images, headers, cases, studies, notes, len(images))


def _build(input_dir: Path, images: list[ImageRow], headers: list[dict], cases: Cases, studies: Studies,
           notes: list[str], rows_read: int) -> SourceTable:
    records, set_aside = [], []
    view_values = []
    for image, header in zip(images, headers):
        reason = image.problem
        case = study = None
        if reason is None:
            case, study, how = link_case(image, header, studies, cases)
            if case is None:
                reason = "no case row: the image links to no imaging study or case"
            elif case not in cases.covid:
                reason = f"no case row: the case named by {how} is not in the case TSV"
            elif case in cases.problems:
                reason = cases.problems[case]
        if reason is not None:
            set_aside.append(SetAside(image.source_file, image.source_row, reason, image.path))
            continue
        study_age = studies.age.get(study, np.nan) if study else np.nan
        age = study_age if not np.isnan(study_age) else cases.age[case]
        study_uid = studies.uid_of.get(study) if study else None
        study_uid = study_uid or header.get("StudyInstanceUID") or (f"submitter:{study}" if study else image.path)
        view_values.append(image.view or header.get("ViewPosition") or "")
        records.append({
            "image_path": image.path,
            "patient_id": pseudonym(f"case:{case}"),
            "study_id": pseudonym(f"study:{study_uid}"),
            raw_column("covid19"): cases.covid[case],
            aux_column("sex"): cases.sex[case],
            aux_column("race"): cases.race[case],
            aux_column("age_bin"): age_bin_code(age),
            "age": age,
            "group__state": cases.state[case],
            "group__site_id": cases.site_id[case],
            "group__race": AUX_VOCAB["race"][cases.race[case]] if cases.race[case] is not None else None,
            "source_file": image.source_file,
            "source_row": image.source_row,
            "instance_uid": header.get("SOPInstanceUID"),
            "not_chest": not_chest_reason(header),
        })
    frame = pd.DataFrame.from_records(records, columns=_COLUMNS)
    frame[aux_column("view")] = pd.array([view_code(v) for v in view_values], dtype="Int64")
    for task in ("sex", "race", "age_bin"):
        frame[aux_column(task)] = pd.array([None if pd.isna(v) else int(v) for v in frame[aux_column(task)]],
                                           dtype="Int64")
    frame["age"] = frame["age"].astype(float)
    frame["source_row"] = frame["source_row"].astype("int64")
    unknown_state = int(frame["group__state"].isna().sum())
    if unknown_state:
        notes.append(f"{unknown_state} image(s) with no state (zip 000, blank or unassigned): "
                     "set aside under --site-by state")
    return SourceTable(
        source="midrc", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame, classes=list(SOURCE_CLASSES),
        set_aside=set_aside, rows_read=rows_read, headers_checked=True, notes=notes,
    )


_COLUMNS = ["image_path", "patient_id", "study_id", raw_column("covid19"), aux_column("sex"),
            aux_column("race"), aux_column("age_bin"), "age", "group__state", "group__site_id", "group__race",
            "source_file", "source_row", "instance_uid", "not_chest"]

__all__ = ["ADAPTER_VERSION", "SOURCE_CLASSES", "find_tsvs", "read_cases", "read_midrc", "read_studies"]
