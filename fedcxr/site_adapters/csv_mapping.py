"""SOURCE ``csv``: any export that is one CSV plus image files, described by a YAML mapping.

``fedcxr ingest csv --input DIR --mapping FILE.yaml --out OUT`` reads ``DIR/<csv>`` and turns
each row into one canonical record (:mod:`fedcxr.site_adapters.base`). The mapping says which
column holds what; it is validated with pydantic before any row is read, and every error names
the key at fault (a missing key, an unknown key, a bad value → :class:`IngestError`, exit 2;
the pydantic model: :mod:`fedcxr.site_adapters.csv_mapping_schema`).
Examples: ``examples/covid_chestxray_by_site_group.yaml``, ``examples/hannover.yaml``.

Schema (``version: 1``; keys not listed here are errors)::

    version: 1                    # optional
    description: free text        # optional, ignored
    csv: metadata.csv             # the CSV, relative to --input
    delimiter: ","                # optional (one character); encoding: utf-8 (optional)
    image:                        # or just the column name: `image: image_path`
      column: image_id
      prefix: images/             # optional folder put in front of the value
      extension: .png             # optional suffix appended to the value
    patient: patient_id           # column; `study: COLUMN` is optional (without it, or where
                                  # it is blank, every image is its own study)
    classes: [covid19]            # canonical classes this export labels (the class mask)
    labels:                       # EITHER one column per class ...
      covid19:                    # canonical class (synonyms such as "Effusion" accepted)
        column: covid19           # or just `covid19: covid19` with the default value map
        values: {"1": 1, "0": 0, "": null}   # default: 1/1.0 → 1, 0/0.0 → 0, -1/-1.0 → -1,
                                  # blank → null (not labeled)
        default: set_aside        # an unmapped value: set_aside (default), null, 1, 0 or -1
    finding:                      # ... OR one column holding a finding string
      column: finding
      values:                     # whole cell (stripped) → labels of the listed classes
        "COVID-19": {covid19: 1}
        "COVID-19, ARDS": {covid19: 1}
        "No Finding": {covid19: 0}
      unlabeled: [todo]           # values meaning "not labeled": every class null
      unmentioned: null           # classes a value does not name: null (default) or 0
      default: set_aside          # unmapped value: set_aside (default), null, or {class: value}
    constant: {covid19: 1}        # classes with one value for every row (a COVID-only hospital)
    demographics:                 # each optional; `sex: COLUMN` shorthand accepted
      sex:  {column: sex, values: {w: F}}     # values → F / M / null; unmapped values go to
                                              # fedcxr.vocab.sex_code (m/f/M/F/male/female...)
      age:  {column: age}                     # years (54, 54.0) or DICOM AS (054Y, 013M)
      view: {column: projection}              # → PA / AP / LATERAL (ap, PA, AP Supine ...)
      race: {column: race, ethnicity_column: ethnicity}   # → white/black/asian/hispanic/other
      # any field may come from a DICOM tag of the image the row names instead of a column:
      #   sex: {dicom_tag: PatientSex}
      # and `from_dicom: true` reads sex, age and view from PatientSex, PatientAge and
      # ViewPosition (fields given explicitly win). The header of each DICOM is read once
      # (never its pixels); a row whose image is not a DICOM gets unknown values. These rows
      # also get the chest check: a DICOM whose Modality/BodyPartExamined say it is not a
      # chest radiograph is set aside (or flagged, --keep-non-chest). Under --plan no image
      # is opened and these values are unknown.
      # a value neither the map nor the parser knows is unknown (null) with a note in the
      # ingest report (on_unknown: null, the default) or sets the row aside (set_aside);
      # blank and the usual spellings of "unknown" are always null
    groups: {site_group: site_group}   # name → column, exposed as group__<name> for
                                       # --site-by NAME; a list [a, b] keeps the column names
    split:                        # optional official split column
      column: split
      values: {train: train, validate: val, test: test}   # → train/val/test/train_val/null
    keep_rows:                    # optional filters; rows they exclude are set aside with a
      - {column: modality, in: [X-ray]}         # reason, never dropped silently
      - {column: view, not_in: [L]}

Label values are 1 (positive), 0 (negative), -1 (uncertain, resolved later by ``--uncertain``)
or null (not labeled). Map keys are compared with the cell's text after stripping spaces, case
sensitive; quote them in YAML (``"1"``, ``"yes"``) so YAML does not turn them into numbers or
booleans. Every class in ``classes`` needs exactly one source (``labels``, ``finding`` or
``constant``), and every class a source names must be in ``classes``.

Rows set aside (each with file, 1-based data row and reason): excluded by ``keep_rows``; no
image path or one outside the export; no patient id; an unmapped label, split or demographic
value (with ``set_aside``). Duplicates (two rows, one image) and missing images are set aside
later by the shared ingest steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import AdapterOptions, IngestError, SetAside, SourceTable, require_columns
from fedcxr.site_adapters.body_part import not_chest_reason
from fedcxr.site_adapters.csv_mapping_schema import (
    DEFAULT_LABEL_VALUES,
    DEFAULT_SPLIT_VALUES,
    CsvMapping,
    load_mapping,
)
from fedcxr.site_adapters.image_checks import read_headers
from fedcxr.site_adapters.image_headers import KIND_DICOM, MAX_PIXELS
from fedcxr.site_adapters.paths import OUTSIDE, Container, lexical
from fedcxr.site_adapters.inputs import open_input
from fedcxr.site_adapters.tables import READ_ERRORS, check_csv_header, deeper_hint, failed_note, map_distinct, to_codes
from fedcxr.vocab import (
    AGE_BIN_EDGES,
    AUX_VOCAB,
    CLASSES,
    aux_column,
    is_unknown,
    parse_age,
    race_code,
    raw_column,
    sex_code,
    view_code,
)

ADAPTER_VERSION = "1"
#: The classes this source labels: ``None`` — read from the export (the mapping YAML decides).
SOURCE_CLASSES: None = None
SOURCE = "csv"


# --------------------------------------------------------------------------- reading


class _Rows:
    """Row-aligned reasons for setting rows aside (several per row are joined)."""

    def __init__(self, n: int) -> None:
        self.reasons: list[list[str]] = [[] for _ in range(n)]

    def add(self, mask: np.ndarray, reasons: list[str] | str) -> None:
        idx = np.flatnonzero(mask)
        texts = [reasons] * len(idx) if isinstance(reasons, str) else reasons
        for i, text in zip(idx, texts):
            self.reasons[i].append(text)

    def bad(self) -> np.ndarray:
        return np.array([bool(r) for r in self.reasons], dtype=bool)


def read_csv_mapping(input_dir: Path, options: AdapterOptions) -> SourceTable:
    """Read ``input_dir/<mapping.csv>`` into canonical rows as the YAML mapping says."""
    if options.mapping is None:
        raise IngestError("SOURCE csv needs --mapping FILE.yaml (see examples/)")
    mapping = load_mapping(options.mapping)
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise IngestError(f"--input {input_dir}: not a directory (csv source reads DIR/{mapping.csv})")
    csv_path = input_dir / mapping.csv
    table = _read_table(csv_path, mapping, input_dir)
    require_columns(table, _columns_needed(mapping), csv_path)
    rows = _Rows(len(table))
    kept = _apply_filters(table, mapping, rows)
    frame = pd.DataFrame(index=table.index)
    frame["source_file"] = mapping.csv
    frame["source_row"] = np.arange(1, len(table) + 1)
    _ids(table, mapping, frame, rows, kept)
    classes = [c for c in CLASSES if c in mapping.classes]
    _labels(table, mapping, frame, rows, kept)
    tags, notes = _dicom_tags(input_dir, mapping, frame, rows, kept, options)
    notes += _demographics(table, mapping, frame, rows, kept, tags)
    _split(table, mapping, frame, rows, kept)
    for name, column in mapping.groups.items():
        values = table[column]
        frame[f"group__{name}"] = pd.Series([v or None for v in values], dtype=object, index=frame.index)
    bad = rows.bad()
    paths = frame["image_path"].to_numpy()
    set_aside = [
        SetAside(file=mapping.csv, row=int(i + 1), reason="; ".join(rows.reasons[i]), image_path=paths[i] or None)
        for i in np.flatnonzero(bad)
    ]
    return SourceTable(
        source=SOURCE,
        adapter_version=ADAPTER_VERSION,
        root=input_dir,
        frame=frame.loc[~bad].reset_index(drop=True),
        classes=classes,
        set_aside=set_aside,
        rows_read=len(table),
        notes=notes,
    )


def _read_table(path: Path, mapping: CsvMapping, root: Path) -> pd.DataFrame:
    if not path.is_file():
        raise IngestError(f"{path}: no such file (mapping key 'csv')" + deeper_hint(path))
    check_csv_header(path, str(path), sep=mapping.delimiter, encoding=mapping.encoding, root=root)
    try:
        with open_input(path, root=root, name=str(path)) as handle:  # regular, inside the export, bounded
            table = pd.read_csv(handle, sep=mapping.delimiter, dtype=str, keep_default_na=False,
                                encoding=mapping.encoding)
    except (LookupError, *READ_ERRORS) as exc:
        raise IngestError(f"{path}: cannot read as CSV ({exc})") from None
    if table.empty:
        raise IngestError(f"{path}: header row only, no data rows")
    table = table.reset_index(drop=True)
    for column in table.columns:
        table[column] = table[column].astype(str).str.strip()
    return table


def _columns_needed(mapping: CsvMapping) -> list[str]:
    cols = [mapping.image.column, mapping.patient]
    cols += [mapping.study] if mapping.study else []
    cols += [spec.column for spec in mapping.labels.values()]
    cols += [mapping.finding.column] if mapping.finding else []
    for spec in (mapping.demographics.sex, mapping.demographics.age, mapping.demographics.view,
                 mapping.demographics.race):
        cols += [spec.column] if spec and spec.column else []
    race = mapping.demographics.race
    cols += [race.ethnicity_column] if race and race.ethnicity_column else []
    cols += list(mapping.groups.values())
    cols += [mapping.split.column] if mapping.split else []
    cols += [f.column for f in mapping.keep_rows]
    return list(dict.fromkeys(cols))


def _apply_filters(table: pd.DataFrame, mapping: CsvMapping, rows: _Rows) -> np.ndarray:
    """Rows ``keep_rows`` keeps; the others get one reason naming the rule and value."""
    kept = np.ones(len(table), dtype=bool)
    for rule in mapping.keep_rows:
        values = table[rule.column]
        if rule.in_ is not None:
            fail = ~values.isin(rule.in_).to_numpy() & kept
            text = f"not in {rule.in_}"
        else:
            fail = values.isin(rule.not_in).to_numpy() & kept
            text = "excluded value"
        rows.add(fail, [f"excluded by keep_rows: column {rule.column!r} value {v!r} {text}"
                        for v in values[fail]])
        kept &= ~fail
    return kept


def _ids(table: pd.DataFrame, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray) -> None:
    spec = mapping.image
    image = table[spec.column].str.replace("\\", "/", regex=False)
    blank = (image == "").to_numpy()
    prefix = spec.prefix.replace("\\", "/").rstrip("/")
    paths = [(f"{prefix}/{v}" if prefix else v) + spec.extension if v else "" for v in image]
    frame["image_path"] = paths
    outside = _escapes(pd.Series(paths, dtype=object))
    rows.add(blank & kept, f"no image path in column {spec.column!r}")
    rows.add(outside & kept, "image path outside the export folder")
    patient = table[mapping.patient]
    rows.add((patient == "").to_numpy() & kept, f"no patient id in column {mapping.patient!r}")
    frame["patient_id"] = patient.to_numpy()
    own_study = patient + "/" + frame["source_row"].astype(str)
    if mapping.study:
        study = table[mapping.study]
        frame["study_id"] = study.where(study != "", own_study).to_numpy()
    else:
        frame["study_id"] = own_study.to_numpy()


def _escapes(paths: pd.Series) -> np.ndarray:
    """Absolute paths, drive letters and ``..`` escapes would point outside the export root.

    ``..`` is resolved first (``images/../images/x.png`` stays inside); symbolic links are
    checked by the ingest for every source (:func:`fedcxr.site_adapters.ingest.contain_paths`).
    """
    reasons = [lexical(p)[1] if p else None for p in paths.astype(str)]
    return np.array([r is not None and r.startswith(OUTSIDE) for r in reasons], dtype=bool)


def _map_labels(
    values: pd.Series, table_map: dict[str, Optional[float]], default: Any, column: str,
    rows: _Rows, kept: np.ndarray,
) -> np.ndarray:
    """Cell text → float label via ``table_map``; unmapped cells follow ``default``."""
    known = values.isin(list(table_map)).to_numpy()
    as_float = {k: (np.nan if v is None else float(v)) for k, v in table_map.items()}
    out = values.map(as_float).to_numpy(dtype=float, na_value=np.nan)
    unmapped = ~known
    if default == "set_aside":
        rows.add(unmapped & kept, [f"unmapped label value: column {column!r} value {v!r}"
                                   for v in values[unmapped & kept]])
    elif default is not None:
        out = np.where(unmapped, float(default), out)
    return out


def _labels(table: pd.DataFrame, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray) -> None:
    for cls, spec in mapping.labels.items():
        values = spec.values if spec.values is not None else DEFAULT_LABEL_VALUES
        frame[raw_column(cls)] = _map_labels(table[spec.column], values, spec.default, spec.column, rows, kept)
    for cls, value in mapping.constant.items():
        frame[raw_column(cls)] = float(value)
    if mapping.finding is not None:
        _finding(table, mapping, frame, rows, kept)


def _finding(table: pd.DataFrame, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray) -> None:
    """A single finding string per row → labels of every non-constant class."""
    spec = mapping.finding
    assert spec is not None
    classes = mapping.finding_classes()
    fill = np.nan if spec.unmentioned is None else 0.0
    lookup: dict[str, dict[str, float]] = {}
    for value, labels in spec.values.items():
        lookup[value] = {c: (np.nan if labels.get(c, fill) is None else labels.get(c, fill)) for c in classes}
    for value in spec.unlabeled:
        lookup[value] = {c: np.nan for c in classes}
    if isinstance(spec.default, dict):
        default_row = {c: (np.nan if spec.default.get(c, fill) is None else spec.default.get(c, fill))
                       for c in classes}
    else:
        default_row = {c: np.nan for c in classes}
    cells = table[spec.column]
    known = cells.isin(list(lookup)).to_numpy()
    for cls in classes:
        mapped = cells.map({v: labels[cls] for v, labels in lookup.items()}).to_numpy(dtype=float, na_value=np.nan)
        frame[raw_column(cls)] = np.where(known, mapped, default_row[cls])
    if spec.default == "set_aside":
        bad = ~known & kept
        rows.add(bad, [f"unmapped finding value: column {spec.column!r} value {v!r}" for v in cells[bad]])


def _dicom_tags(
    input_dir: Path, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray,
    options: AdapterOptions,
) -> tuple[Optional[pd.DataFrame], list[str]]:
    """The DICOM tags the mapping's demographics name, per row, from the image each row names.

    Read once per distinct image (header only, in ``--workers`` processes), never for a path that
    leaves the export; the same read gives each DICOM's chest check (``not_chest``,
    :mod:`fedcxr.site_adapters.body_part`). A row whose image is missing, unreadable or not a
    DICOM gets no values (unknown; the shared image check sets a missing image aside). Under
    ``--plan`` nothing is read: those fields are unknown in the plan.
    """
    wanted = mapping.demographics.dicom_tags()
    if not wanted:
        return None, []
    if options.plan:
        return None, [f"plan: demographics from DICOM tags ({', '.join(wanted)}) not read: unknown in the plan"]
    paths = frame["image_path"].astype(str)
    live = kept & ~rows.bad() & (paths != "").to_numpy()
    box = Container(input_dir, follow_links=bool(options.extra.get("follow_links", False)))
    distinct = [p for p in dict.fromkeys(paths[live]) if box.contain(p)[1] is not None]
    results = read_headers([str(input_dir / p) for p in distinct], workers=options.workers,
                           progress=bool(options.extra.get("progress", True)),
                           max_pixels=int(options.extra.get("max_pixels", MAX_PIXELS)), tags=tuple(wanted))
    by_path = {p: h for p, (h, _) in zip(distinct, results) if h is not None and h.get("kind") == KIND_DICOM}
    columns = list(dict.fromkeys(wanted))
    tags = pd.DataFrame({c: [by_path[p].get(c) if p in by_path else None for p in paths] for c in columns},
                        index=frame.index, dtype=object)
    frame["not_chest"] = pd.Series([not_chest_reason(by_path[p]) if p in by_path else None for p in paths],
                                   index=frame.index, dtype=object)
    read = int(np.isin(paths.to_numpy(), list(by_path)).sum()) if by_path else 0
    notes = [f"demographics from DICOM tags {', '.join(wanted)}: read for {read} of {int(live.sum())} row(s)"]
    if read < int(live.sum()):
        notes.append(f"{int(live.sum()) - read} row(s) whose image is missing, unreadable or not a DICOM: "
                     "those demographics unknown")
    return tags, notes


def _demographics(
    table: pd.DataFrame, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray,
    tags: Optional[pd.DataFrame] = None,
) -> list[str]:
    """Fill aux__sex/aux__view/aux__race/aux__age_bin and age; return notes on nulled values.

    ``tags``: per-row DICOM tag values for fields read from a ``dicom_tag`` (None: unknown).
    """
    demo, notes = mapping.demographics, []
    n = len(table)

    def cells_of(spec) -> pd.Series:
        if spec.column is not None:
            return table[spec.column]
        values = tags[spec.dicom_tag] if tags is not None else pd.Series([None] * n, index=table.index)
        return values.where(values.notna(), "").astype(str).str.strip()

    parsers = {"sex": sex_code, "view": _view_or_raise, "race": race_code}
    for task, parse in parsers.items():
        spec = getattr(demo, task)
        codes = np.full(n, np.nan)
        if spec is not None:
            cells = cells_of(spec)
            if task == "race" and demo.race is not None and demo.race.ethnicity_column:
                cells = cells + _SEP + table[demo.race.ethnicity_column]
            codes = _codes(cells, spec, task, parse, rows, kept, notes)
        frame[aux_column(task)] = to_codes(codes, frame.index)
    ages = np.full(n, np.nan)
    if demo.age is not None:
        ages = _codes(cells_of(demo.age), demo.age, "age", parse_age, rows, kept, notes)
    frame["age"] = ages
    # Vectorised fedcxr.vocab.age_bin_code: the bin is the number of edges at or below the age.
    bins = np.where(np.isnan(ages), np.nan, np.searchsorted(AGE_BIN_EDGES, ages, side="right"))
    frame[aux_column("age_bin")] = to_codes(bins, frame.index)
    return notes


_SEP = "\x1f"  # joins race and ethnicity cells so both reach race_code together


def _view_or_raise(value: object) -> Optional[int]:
    """Like :func:`fedcxr.vocab.view_code`, but a value it does not know raises (obliques too)."""
    code = view_code(value)
    if code is None and not is_unknown(value):
        raise ValueError(f"unknown view value {value!r}")
    return code


def _codes(
    cells: pd.Series, spec: Any, task: str, parse: Any, rows: _Rows, kept: np.ndarray, notes: list[str]
) -> np.ndarray:
    """Per distinct cell: the mapping's ``values`` first, else the vocab parser.

    Returns float codes (age: years) with NaN for unknown. A value neither knows is unknown
    with a note (``on_unknown: null``, the default, as the other adapters do) or sets the row
    aside (``on_unknown: set_aside``).
    """
    table_map: dict[str, Optional[str]] = getattr(spec, "values", {}) or {}

    def convert(cell: object) -> Optional[float]:
        text = "" if cell is None else str(cell)
        value, _, ethnicity = text.partition(_SEP)
        if value in table_map:
            target = table_map[value]
            return None if target is None else AUX_VOCAB[task].index(target)
        return parse(value, ethnicity) if _SEP in text else parse(value)

    mapped, failed = map_distinct(cells, convert)
    failed &= kept
    shown = cells.str.partition(_SEP)[0]
    if spec.on_unknown == "set_aside":
        rows.add(failed, [f"unrecognised {task} value: {spec.source} value {v!r}" for v in shown[failed]])
    else:
        note = failed_note(f"{task} in {spec.source}", shown, failed, f"{task} unknown, rows kept")
        notes += [note] if note else []
    return mapped


def _split(table: pd.DataFrame, mapping: CsvMapping, frame: pd.DataFrame, rows: _Rows, kept: np.ndarray) -> None:
    if mapping.split is None:
        frame["official_split"] = pd.Series([None] * len(table), dtype=object, index=frame.index)
        return
    spec = mapping.split
    table_map = spec.values if spec.values is not None else DEFAULT_SPLIT_VALUES
    cells = table[spec.column]
    known = cells.isin(list(table_map)).to_numpy()
    frame["official_split"] = pd.Series([table_map.get(v) for v in cells], dtype=object, index=frame.index)
    bad = ~known & kept
    rows.add(bad, [f"unmapped split value: column {spec.column!r} value {v!r}" for v in cells[bad]])


__all__ = ["read_csv_mapping"]
