"""``fedcxr ingest SOURCE`` as a library function: one hospital export → per-site manifests.

The work is :func:`fedcxr.site_adapters.ingest.run_ingest` (the adapters, the checks, the
pseudonyms, the partition); :func:`ingest` returns what a script needs next — the manifest
folders written, or the plan — as an :class:`IngestResult`, and prints nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class IngestResult:
    """An ingest's outcome: ``report`` is ``ingest_report.json`` (or, for a plan, ``ingest_plan.json``);
    ``sites`` each site's manifest folder (``OUT/<site>``: ``manifest.parquet`` + ``site.json``; empty
    for a plan); ``plan`` the plan file (None for an ingest)."""

    out: Path
    report: dict[str, Any] = field(repr=False)
    sites: dict[str, Path] = field(default_factory=dict)
    plan: Optional[Path] = None

    @property
    def manifests(self) -> dict[str, Path]:
        """Each site's ``manifest.parquet``."""
        return {site: folder / "manifest.parquet" for site, folder in self.sites.items()}

    @property
    def rows_kept(self) -> int:
        return int(self.report["rows_kept"])

    @property
    def rows_set_aside(self) -> int:
        return int(self.report["rows_set_aside"])


def ingest(source: str, input_dir: "str | os.PathLike", out: "str | os.PathLike", *, plan: bool = False,
           progress: bool = True, **options: Any) -> IngestResult:
    """Ingest the export in ``input_dir`` (SOURCE ``source``: nih, chexpert, mimic, csv, dicom, ...; see
    ``fedcxr ingest SOURCE --help``) into ``out``: one folder per site.

    ``options`` are :func:`fedcxr.site_adapters.ingest.run_ingest`'s, named as there: ``site_by``,
    ``site_name``, ``uncertain``, ``mapping``, ``labels_csv``, ``labels_key``, ``verify_pixels``,
    ``workers``, ``val_fraction``, ``test_fraction``, ``site_key``, ``follow_links``, ``max_pixels``,
    ``readers``, ``implied_negatives``, ``keep_non_chest``. ``plan``: read the metadata only and
    write ``OUT/ingest_plan.json`` instead of manifests. Bad input raises
    :class:`~fedcxr.errors.UserError` naming the file, row or key."""
    from fedcxr.site_adapters.ingest import PLAN_NAME, run_ingest

    out = Path(out)
    report = run_ingest(source, input_dir, out, plan=plan, progress=progress, **options)
    if plan:
        return IngestResult(out, report, plan=out / PLAN_NAME)
    return IngestResult(out, report, sites={site: out / site for site in report["sites"]})


__all__ = ["IngestResult", "ingest"]
