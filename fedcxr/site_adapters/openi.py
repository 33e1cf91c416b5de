"""Open-i (NLM Indiana University chest X-ray collection) adapter: report MeSH terms → labels.

Layout (the NLM download, unpacked; or the report archive left packed)::

    INPUT/
      ecgen-radiology/<n>.xml          one radiology report each (or NLMCXR_reports.tgz holding them)
      NLMCXR_png/CXR<n>_<...>.png      the images as PNG (``parentImage`` id + ``.png``) and/or
      NLMCXR_dcm/<n>_<...>.dcm         the DICOMs (the id without its ``CXR`` prefix + ``.dcm``)
      nlmcxr_dicom_metadata.csv(.gz)   optional: the DICOM headers as a table (TorchXRayVision ships it)

Rows: one per image a report names (``<parentImage id=...>``); ``source_file`` is the report,
``source_row`` the image's position in it. A report that cannot be parsed is one row, set
aside with the parser's reason. Images are found by name anywhere under INPUT; the DICOM is
used when both exist (it carries tags). Each report is its own patient and study (the
collection releases no patient id; TorchXRayVision does the same).

Labels (Demner-Fushman et al., *JAMIA* 2016): each report carries MeSH terms coded by hand
(``<major>``, with ``normal`` for a normal study) and terms MTI extracted automatically
(``<automatic>``, positive mentions only: "no pneumothorax" yields no term). Findings come from
the automatic terms, as TorchXRayVision reads them, through the explicit table
:data:`CLASS_TERMS` (README "Open-i" table): a class is positive when one of its terms is
among the report's automatic terms, negative otherwise. Two departures from TorchXRayVision,
which matches class names as substrings of the joined terms:

* exact terms, not substrings, so ``pericardial effusion`` is not a pleural effusion,
  ``subcutaneous emphysema`` not emphysema, ``cystic fibrosis`` not fibrosis, hip fractures not
  a chest-film fracture; synonyms the substrings miss are listed (``pleural fluid``,
  ``enlarged heart``);
* a report with *no* automatic term is all-negative only when its hand coding says ``normal``;
  otherwise (a coder saw findings MTI did not extract, or "No Indexing") its images are kept
  with every class not labeled — TorchXRayVision makes them negatives for every class.

Terms that name no canonical class (``degenerative change``, ``scarring``...) are counted in
the notes. Demographics: from the DICOM tags (view; age from ``PatientBirthDate`` and
``StudyDate`` — the collection keeps both, its sex tag is blank), else from the metadata
table. PNG images carry none.
"""

from __future__ import annotations

import lzma
import os
import tarfile
import zlib
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.export_images import AMBIGUOUS, attach_dicom_tags, index_files
from fedcxr.site_adapters.inputs import InputTooLarge, input_problem, open_input, read_input_bytes
from fedcxr.site_adapters.tables import find_file, map_distinct, read_table, relative_name, to_codes
from fedcxr.vocab import CLASSES, age_bin_code, aux_column, parse_age, raw_column, view_code

ADAPTER_VERSION = "1"

#: Canonical class → the automatic MeSH terms (lower case) that name it.
CLASS_TERMS: dict[str, tuple[str, ...]] = {
    "atelectasis": ("atelectasis", "atelectases", "pulmonary atelectasis", "focal atelectasis",
                    "discoid atelectasis", "plate-like atelectasis", "patchy atelectasis", "chronic atelectasis",
                    "obstructive atelectasis"),
    "cardiomegaly": ("cardiomegaly", "enlarged heart"),
    "edema": ("edema", "edemas", "pulmonary edema", "interstitial pulmonary edema", "alveolar edema",
              "chronic edema"),
    "pleural_effusion": ("pleural effusion", "pleural effusions", "effusion", "bilateral pleural effusion",
                         "left-sided pleural effusion", "right-sided pleural effusion", "loculated effusion",
                         "pleural fluid", "pulmonary effusion"),
    "pneumonia": ("pneumonia", "acute pneumonia", "atypical pneumonias", "left lower lobe pneumonia",
                  "left upper lobe pneumonia", "lower lobe pneumonia", "multilobar pneumonia", "mycoplasma pneumonia",
                  "peribronchial pneumonia", "pneumonia right lower lobe", "pneumonia, mycoplasma", "pneumonia, viral",
                  "postobstructive pneumonia", "recurrent pneumonia", "right lower lobe pneumonia",
                  "right upper lobe pneumonia", "viral pneumonias"),
    "pneumothorax": ("pneumothorax", "hydropneumothorax", "hemopneumothorax"),
    "infiltration": ("infiltrates", "infiltrate", "infiltration"),
    "mass": ("mass", "mass lesion", "anterior mediastinal masses", "mediastinal mass", "paratracheal mass",
             "thyroid mass"),
    "nodule": ("nodule", "multiple pulmonary nodules", "solitary pulmonary nodule"),
    "emphysema": ("emphysema", "emphysemas", "pulmonary emphysema", "centrilobular emphysema", "bullous emphysema"),
    "fibrosis": ("fibrosis", "fibroses", "pulmonary fibrosis", "pulmonary fibroses", "interstitial fibrosis",
                 "diffuse fibrosis", "chronic fibrosis"),
    "pleural_thickening": ("pleural thickening",),
    "hernia": ("hiatal hernia", "large hiatal hernia", "hernia, hiatal", "hernia, hiatus", "hiatus hernia",
               "hernia, diaphragmatic", "bochdalek hernia", "morgagni hernia", "hernias", "hernia sac"),
    "lung_opacity": ("opacity",),
    "lung_lesion": ("mass lesion",),
    "fracture": ("fracture", "fractures, bone", "rib fracture", "rib fractures", "fourth rib fracture",
                 "clavicular fracture", "spinal fractures", "vertebral fracture", "humeral fracture",
                 "humeral fractures", "displaced fractures", "non-displaced fracture", "comminuted fracture",
                 "fracture, comminuted", "pathologic fractures", "fracture, pathologic", "fractures, pathologic",
                 "multiple fractures", "rotated fracture", "stable fracture", "fracture-dislocation",
                 "fracture healing"),
    "copd": ("copd", "pulmonary disease, chronic obstructive", "chronic obstructive pulmonary disease",
             "chronic obstructive lung disease", "pulmonary disease, chronic obstructive, severe early-onset"),
    "tuberculosis": ("tuberculosis", "tuberculoses", "tuberculosis, pulmonary"),
    "granuloma": ("granuloma", "granulomas", "calcified granuloma", "apical granuloma", "lung granuloma",
                  "pulmonary granuloma", "granulomatous disease", "granulomatous disease, chronic",
                  "chronic granulomatous disease", "granulomatous infection"),
    "calcified_granuloma": ("calcified granuloma",),
    "scoliosis": ("scoliosis", "scolioses", "thoracolumbar scoliosis"),
    "bronchiectasis": ("bronchiectasis", "bronchiectases", "traction bronchiectasis"),
}
#: The classes this source labels, canonical order.
SOURCE_CLASSES: tuple[str, ...] = tuple(c for c in CLASSES if c in CLASS_TERMS)
TERM_CLASSES: dict[str, tuple[str, ...]] = {}
for _cls in SOURCE_CLASSES:
    for _term in CLASS_TERMS[_cls]:
        TERM_CLASSES[_term] = TERM_CLASSES.get(_term, ()) + (_cls,)

REPORT_DIR, REPORT_ARCHIVES = "ecgen-radiology", ["NLMCXR_reports.tgz", "NLMCXR_reports.tar.gz"]
METADATA_FILES = ["nlmcxr_dicom_metadata.csv.gz", "nlmcxr_dicom_metadata.csv"]
PNG_DIR = "NLMCXR_png"
MAX_REPORT_BYTES = 1 << 20  # a report is a few kB; a larger "report" is not parsed
MAX_ARCHIVE_MEMBERS = 1_000_000  # the collection has 3,955 reports


@dataclass
class Report:
    """One parsed report: its id, image ids and MeSH terms (or the reason it failed)."""

    file: str
    uid: str = ""
    images: list[str] = field(default_factory=list)
    automatic: list[str] = field(default_factory=list)
    major: list[str] = field(default_factory=list)
    problem: Optional[str] = None


def labels_of(report: Report) -> dict[str, float]:
    """Raw value per source class for one report (see module doc)."""
    terms = set(report.automatic)
    if not terms:
        normal = any(t.split("/")[0].strip() == "normal" for t in report.major)
        return {c: 0.0 if normal else np.nan for c in SOURCE_CLASSES}
    found = {c for t in terms for c in TERM_CLASSES.get(t, ())}
    return {c: 1.0 if c in found else 0.0 for c in SOURCE_CLASSES}


def _too_large(file: str, size: int) -> Report:
    return Report(file, problem=f"unreadable report: {size} bytes (a report is a few kB)")


def parse_report(data: bytes, file: str) -> Report:
    """A report's uid, images and MeSH terms (lower case, each once); a reason if unusable."""
    if len(data) > MAX_REPORT_BYTES:
        return _too_large(file, len(data))
    report = Report(file)
    try:
        root = ET.fromstring(data)  # expat ≥ 2.4 bounds entity expansion; no external entities
    except ET.ParseError as exc:
        report.problem = f"unreadable report: XML error {exc}"
        return report
    uid = root.find("uId")
    report.uid = (uid.attrib.get("id", "") if uid is not None else "").strip()
    if not report.uid:
        report.problem = "unreadable report: no <uId id=...>"
        return report
    report.images = [(n.attrib.get("id") or "").strip() for n in root.findall(".//parentImage")]
    for tag, out in (("automatic", report.automatic), ("major", report.major)):
        seen = {(n.text or "").strip().lower() for n in root.findall(f".//MeSH/{tag}")} - {""}
        out.extend(sorted(seen))
    return report


def iter_reports(input_dir: Path) -> Iterator[Report]:
    """Every report under INPUT: ``*.xml`` files (sorted by name), else the packed archive.

    A report file is read only when it is a regular file inside the export (a link out needs
    ``--follow-links``: :func:`fedcxr.site_adapters.inputs.following_links`) and at most
    :data:`MAX_REPORT_BYTES` long, checked on the open descriptor (:mod:`fedcxr.site_adapters.inputs`);
    otherwise it is set aside with the reason — a named pipe never blocks the ingest, a link to
    ``/dev/zero`` is never read."""
    files = sorted(_xml_files(input_dir), key=lambda p: _natural(p.name))
    if files:
        for path in files:
            yield _read_report_file(path, input_dir)
        return
    archive = find_file(input_dir, REPORT_ARCHIVES, max_depth=2)
    if archive is None:
        raise IngestError(f"{input_dir}: no Open-i reports (looked for {REPORT_DIR}/*.xml and "
                          f"{', '.join(REPORT_ARCHIVES)})")
    yield from _archive_reports(archive, input_dir)


def _read_report_file(path: Path, input_dir: Path) -> Report:
    name = relative_name(path, input_dir)
    problem = input_problem(path, input_dir)
    if problem is not None:
        return Report(name, problem=f"unreadable report: {problem}")
    try:
        data = read_input_bytes(path, root=input_dir, name=name, limit=MAX_REPORT_BYTES + 1, decompress=False)
    except InputTooLarge:
        return _too_large(name, path.stat().st_size)
    except IngestError as exc:  # replaced by a pipe or a link since the check: the reason, set aside
        return Report(name, problem=f"unreadable report: {str(exc).split(': ', 1)[-1]}")
    return parse_report(data, name)


def _archive_reports(archive: Path, input_dir: Path) -> list[Report]:
    """The reports of a packed archive, read as one bounded stream (never extracted, never seeked):
    decompressed at most :func:`~fedcxr.site_adapters.inputs.max_decompressed` bytes, at most
    :data:`MAX_ARCHIVE_MEMBERS` members; sorted by name afterwards."""
    name = relative_name(archive, input_dir)
    reports = []
    try:
        with open_input(archive, root=input_dir, name=name, lines=False) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise IngestError(f"{name}: more than {MAX_ARCHIVE_MEMBERS} members; not an Open-i report archive")
                if not (member.isfile() and member.name.endswith(".xml")):
                    continue
                label = f"{name}:{member.name}"
                if member.size > MAX_REPORT_BYTES:
                    reports.append(_too_large(label, member.size))
                    continue
                handle = tar.extractfile(member)  # read in memory: nothing is written to disk
                reports.append(parse_report(handle.read() if handle else b"", label))
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise IngestError(f"{name}: cannot read the report archive ({type(exc).__name__}: {exc})") from None
    return sorted(reports, key=lambda r: _natural(r.file.rsplit(":", 1)[-1]))


def _xml_files(input_dir: Path) -> list[Path]:
    for folder, dirs, files in os.walk(input_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if Path(folder).name == REPORT_DIR:
            return [Path(folder) / f for f in files if f.endswith(".xml") and not f.startswith(".")]
    return []


def _natural(name: str) -> tuple:
    stem = Path(name).stem
    return (0, int(stem), name) if stem.isdigit() else (1, 0, name)


def read_openi_labels(input_dir: Path) -> tuple[pd.DataFrame, list[SetAside], list[str], int]:
    """Metadata only: ``(frame, set_aside, notes, rows_read)``, one row per report image."""
    records, set_aside = [], []
    unmapped, n_reports, no_images, unlabeled_reports = Counter(), 0, 0, 0
    for report in iter_reports(input_dir):
        n_reports += 1
        if report.problem:
            set_aside.append(SetAside(report.file, 1, report.problem, None))
            continue
        if not report.images:
            no_images += 1
            continue
        labels = labels_of(report)
        unlabeled_reports += all(np.isnan(v) for v in labels.values())
        unmapped.update(t for t in report.automatic if t not in TERM_CLASSES)
        for position, image in enumerate(report.images, start=1):
            records.append({
                "image_path": f"{PNG_DIR}/{image}.png", "patient_id": report.uid, "study_id": report.uid,
                "_image": image, **{raw_column(c): v for c, v in labels.items()},
                "source_file": report.file, "source_row": position,
            })
    frame = pd.DataFrame.from_records(records, columns=["image_path", "patient_id", "study_id", "_image"]
                                      + [raw_column(c) for c in SOURCE_CLASSES] + ["source_file", "source_row"])
    dup = frame["_image"].duplicated(keep=False) | (frame["_image"] == "")
    for f, r, image in zip(frame.loc[dup, "source_file"], frame.loc[dup, "source_row"], frame.loc[dup, "_image"]):
        reason = "image named by several reports" if image else "missing value: empty parentImage id"
        set_aside.append(SetAside(f, int(r), reason, None))
    frame = frame.loc[~dup].reset_index(drop=True)
    notes = [f"{n_reports} report(s), {len(records)} image(s); {no_images} report(s) name no image (no row)",
             f"{unlabeled_reports} report(s) with no automatic MeSH term and a hand coding other than 'normal': "
             "their images are kept with no class labeled"]
    if unmapped:
        top = ", ".join(f"{t!r} {n}" for t, n in unmapped.most_common(8))
        notes.append(f"{len(unmapped)} automatic term(s) name no canonical class ({sum(unmapped.values())} "
                     f"report mentions), e.g. {top}")
    return frame, set_aside, notes, len(frame) + len(set_aside)


def read_openi(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read an Open-i export (see module doc) into a :class:`SourceTable`."""
    input_dir = Path(input_dir)
    frame, set_aside, notes, rows_read = read_openi_labels(input_dir)
    pngs, dicoms = index_files(input_dir, (".png",)), index_files(input_dir, (".dcm",))
    paths, reasons = [], []
    for image, default in zip(frame["_image"], frame["image_path"]):
        key = image[3:] if image.startswith("CXR") else image
        hit = dicoms.get(key) if key in dicoms else pngs.get(image)
        twice = (key in dicoms and dicoms[key] is None) or (key not in dicoms and image in pngs and pngs[image] is None)
        paths.append(hit or default)
        reasons.append(AMBIGUOUS if twice else None)
    frame["image_path"] = paths
    bad = np.array([r is not None for r in reasons], dtype=bool)
    set_aside += [SetAside(f, int(r), reasons[i], p) for i, f, r, p in
                  zip(np.flatnonzero(bad), frame.loc[bad, "source_file"], frame.loc[bad, "source_row"],
                      frame.loc[bad, "image_path"])]
    frame = frame.loc[~bad].reset_index(drop=True)
    frame = _metadata_demographics(frame, input_dir, notes)
    options.extra.setdefault("raster", True)  # PNG images beside DICOMs
    frame, aside, checked = attach_dicom_tags(frame, input_dir, options, notes)
    if checked:
        frame = _dicom_ages(frame, input_dir, notes)
    return SourceTable(
        source="openi", adapter_version=ADAPTER_VERSION, root=input_dir, frame=frame.drop(columns="_image"),
        classes=list(SOURCE_CLASSES), set_aside=set_aside + aside, rows_read=rows_read, headers_checked=checked,
        notes=notes,
    )


def _metadata_demographics(frame: pd.DataFrame, input_dir: Path, notes: list[str]) -> pd.DataFrame:
    """View, age and sex from ``nlmcxr_dicom_metadata.csv(.gz)`` when present (keyed by image id)."""
    from fedcxr.vocab import sex_code

    frame = frame.copy()
    frame[aux_column("view")] = pd.array([pd.NA] * len(frame), dtype="Int64")
    frame["age"] = np.nan
    path = find_file(input_dir, METADATA_FILES, max_depth=2)
    if path is None:
        return frame
    table = read_table(path, base=input_dir, dtype=str)
    require_columns(table, ["imageid"], relative_name(path, input_dir))
    table = table.drop_duplicates("imageid").set_index("imageid")
    rows = table.reindex(frame["_image"])
    view, _ = map_distinct(rows.get("View Position", pd.Series(index=rows.index, dtype=object)), view_code)
    sex, _ = map_distinct(rows.get("Patient's Sex", pd.Series(index=rows.index, dtype=object)), sex_code)
    ages = [age_from_dates(b, s) for b, s in zip(rows.get("Patient's Birth Date", [None] * len(rows)),
                                                rows.get("Study Date", [None] * len(rows)))]
    frame[aux_column("view")] = to_codes(view).to_numpy()
    frame[aux_column("sex")] = to_codes(sex).to_numpy()
    frame["age"] = np.array([np.nan if a is None else a for a in ages], dtype=float)
    frame[aux_column("age_bin")] = pd.array([age_bin_code(a) for a in ages], dtype="Int64")
    notes.append(f"{relative_name(path, input_dir)}: view, sex and age (study date − birth date) for "
                 f"{int(rows.index.isin(table.index).sum())} of {len(frame)} image(s)")
    return frame


def age_from_dates(birth: object, study: object) -> Optional[float]:
    """Years between two DICOM dates (``YYYYMMDD``, ``19550820.0`` tolerated); None if unusable."""
    try:
        b, s = (str(v).strip().split(".")[0] for v in (birth, study))
        born = date(int(b[:4]), int(b[4:6]), int(b[6:8]))
        seen = date(int(s[:4]), int(s[4:6]), int(s[6:8]))
        return parse_age((seen - born).days / 365.25)
    except (ValueError, TypeError, IndexError):
        return None


def _dicom_ages(frame: pd.DataFrame, root: Path, notes: list[str]) -> pd.DataFrame:
    """Age from each DICOM's birth and study dates where both are set (else the age already known)."""
    import pydicom

    from fedcxr.site_adapters.image_headers import quiet_pydicom

    ages = frame["age"].to_numpy(dtype=float).copy()
    from_dicom = 0
    with quiet_pydicom():
        for i, path in enumerate(frame["image_path"]):
            if not str(path).lower().endswith(".dcm"):
                continue
            try:
                ds = pydicom.dcmread(root / path, stop_before_pixels=True,
                                     specific_tags=["PatientBirthDate", "StudyDate"], force=True)
            except Exception:  # the header check already passed; a date is optional
                continue
            age = age_from_dates(ds.get("PatientBirthDate"), ds.get("StudyDate"))
            if age is not None:
                ages[i], from_dicom = age, from_dicom + 1
    frame["age"] = ages
    frame[aux_column("age_bin")] = pd.array([age_bin_code(a) if not np.isnan(a) else None for a in ages],
                                            dtype="Int64")
    if from_dicom:
        notes.append(f"age from DICOM PatientBirthDate/StudyDate for {from_dicom} image(s)")
    return frame


__all__ = ["ADAPTER_VERSION", "CLASS_TERMS", "SOURCE_CLASSES", "TERM_CLASSES", "age_from_dates", "iter_reports",
           "labels_of", "parse_report", "read_openi", "read_openi_labels"]
