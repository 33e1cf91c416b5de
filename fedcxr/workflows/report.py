"""``fedcxr report RUN_DIR... --out DIR`` as a library function: the method-comparison table of runs.

The work is :func:`fedcxr.evaluation.compare.compare_runs` (rows = methods, columns = evaluated
sites, paired tests against a baseline); :func:`report` writes ``comparison.md/csv/json`` and
returns a :class:`ComparisonResult`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class ComparisonResult:
    """``comparison`` is ``comparison.json``'s content; ``files`` comparison.md, .csv and .json."""

    out: Path
    comparison: dict[str, Any] = field(repr=False)
    files: list[Path] = field(default_factory=list)


def report(run_dirs: Sequence["str | os.PathLike"], out: "str | os.PathLike", *, baseline: Optional[str] = None,
           split: str = "test", bootstrap: int = 1000) -> ComparisonResult:
    """Compare evaluated runs (seeds of one method are pooled: mean ± SD); ``baseline``: the method the
    others are tested against (unset: no tests)."""
    from fedcxr.evaluation.compare import compare_runs, write_comparison

    result = compare_runs(list(run_dirs), baseline=baseline, split=split, n_boot=int(bootstrap))
    paths = write_comparison(result, Path(out))
    return ComparisonResult(Path(out), result, list(paths))


__all__ = ["ComparisonResult", "report"]
