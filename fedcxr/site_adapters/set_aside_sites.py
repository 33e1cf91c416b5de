"""Which site a set-aside row belongs to, so that each site's folder lists its own rows only.

One export with several hospitals (``--site-by hospital``) is ingested in one place, and each
``OUT/<site>/`` folder may then go to its hospital: hospital A's set-aside rows (file names, row
numbers, image paths, reasons) must not travel in hospital B's folder. A row set aside is
listed in ``OUT/<site>/set_aside.csv`` and ``OUT/<site>/ingest_report.json`` when its site is
known, first rule that applies:

1. no ``--site-by`` (the export is one site): every row of the export is that site's;
2. the row reached the partition (set aside afterwards: two official splits, a site with no
   labeled class): the site it was given;
3. ``--site-by COLUMN``: the site named by the row's own value in that column;
4. the drawn partitions (``iid``, ``skew``, ``conditions``): the site its patient's kept rows
   went to (all of one patient's rows go to one site).

Otherwise the site is not known — no readable value in the site column, a row the adapter
could not read, a patient with no kept row, a site that was itself set aside — and the row is
listed only at the root (``OUT/ingest_report.json`` and ``OUT/set_aside.csv``, which list every
row set aside by the ingest, each with its site or none: the export's summary).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Optional

import pandas as pd

from fedcxr.site_adapters.base import SetAside
from fedcxr.site_adapters.partition import site_column
from fedcxr.site_adapters.site_names import canonical
from fedcxr.site_adapters.sitekey import SiteKey

_AMBIGUOUS = object()


def set_aside_sites(
    set_aside: list[SetAside],
    source: pd.DataFrame,
    partitioned: pd.DataFrame,
    spec: Optional[str],
    written: Iterable[str],
    key: SiteKey,
) -> list[Optional[str]]:
    """The site of each set-aside row (module doc), or None where it is not known.

    ``source``: the adapter's rows (raw ids, ``source_file``/``source_row``, ``group__`` columns);
    ``partitioned``: the rows the partition placed (keyed ids, a ``site`` column); ``written``:
    the sites that got a folder (a row of any other site is listed at the root only).
    """
    written = set(written)
    if not set_aside:
        return []
    single = _single_site(spec, partitioned) if whole_export(spec) else None
    if single is not None:
        return [single if single in written else None] * len(set_aside)
    placed = _unique_map(zip(_row_keys(partitioned), partitioned["site"].astype(str)))
    column = site_column(spec)
    wanted = {_row_key(s) for s in set_aside}
    rows = source.loc[[k in wanted for k in _row_keys(source)]]
    if column is not None and f"group__{column}" in rows:
        by_value = _unique_map(zip(partitioned[f"group__{column}"].map(canonical), partitioned["site"].astype(str)))
        values = rows[f"group__{column}"]
        found = [by_value.get(canonical(v)) if pd.notna(v) else None for v in values]
    else:
        by_patient = _unique_map(zip(partitioned["patient_id"].astype(str), partitioned["site"].astype(str)))
        found = [by_patient.get(p) for p in key.pseudonyms("patient", rows["patient_id"].astype(str))]
    derived = _unique_map(zip(_row_keys(rows), found))
    out = []
    for row in set_aside:
        site = placed.get(_row_key(row), derived.get(_row_key(row)))
        out.append(site if isinstance(site, str) and site in written else None)
    return out


def whole_export(spec: Optional[str]) -> bool:
    """Whether ``--site-by spec`` makes the whole export one site (no ``--site-by``)."""
    return spec is None or spec.strip() in {"", "whole", "none"}


def _single_site(spec: Optional[str], partitioned: pd.DataFrame) -> Optional[str]:
    """The one site of an export ingested without ``--site-by`` (None when it has no row)."""
    names = partitioned["site"].unique() if len(partitioned) else []
    return str(names[0]) if len(names) == 1 else None


def _row_key(row: SetAside) -> tuple[str, Optional[int]]:
    return str(row.file), (int(row.row) if row.row is not None else None)


def _row_keys(frame: pd.DataFrame) -> list[tuple[str, int]]:
    return list(zip(frame["source_file"].astype(str), frame["source_row"].astype(int)))


def _unique_map(pairs: Iterable[tuple[Hashable, Optional[str]]]) -> dict:
    """key → site; a key seen with two different sites maps to neither (never guess a site)."""
    out: dict = {}
    for k, site in pairs:
        if site is None:
            continue
        if out.get(k, site) != site:
            out[k] = _AMBIGUOUS
        else:
            out.setdefault(k, site)
    return {k: v for k, v in out.items() if v is not _AMBIGUOUS}


__all__ = ["set_aside_sites", "whole_export"]
