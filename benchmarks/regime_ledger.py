"""The regime map's ledger: every finished run of every grid, committed beside the tables.

Why it exists: the runs folder (``runs/regime_map``) is a cache that a new checkout does not have,
a cell's parts span working sessions, and the tables hold only complete cells. Without a record of
the finished runs of a cell still being filled, a new checkout trains them again (the parts log
says the part is done, no run says so), and ``write_tables`` rebuilds the published tables from an
empty folder. The ledger is that record (``benchmarks/results/regime_map_ledger.csv``): one row per
run, keyed by variant, cell, method and seed, with the columns of ``bench_regime.RUN_COLUMNS``
(the chooser's ``Selected`` rows too, so a chosen seed needs none of its fold runs again).

* a part ends → its finished runs are added (:func:`add`); the file is committed with the tables;
* a run in the ledger is never trained again (``bench_regime --ledger``);
* the tables are built from the ledger's rows plus the runs folder's (:func:`merge`).

Where the ledger and the runs folder disagree on a run (the same key, another AUROC: the code moved
under a cell), the ledger's row — the one already published — is kept and the runs are named on the
console; deleting those rows from the ledger is how a rerun replaces them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

#: a run's identity in the ledger; ``variant`` names the grid's configuration and data (Kermany's is its own)
KEY = ["variant", "shift", "labels", "rounds", "method", "seed"]
RUN_KEY = KEY[1:]


def load(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """The ledger at ``path`` (``variant`` + ``columns``, and any further columns it has), or an empty
    one where there is none yet."""
    if not Path(path).is_file():
        return pd.DataFrame(columns=["variant", *columns])
    ledger = pd.read_csv(path)
    missing = [c for c in ["variant", *columns] if c not in ledger.columns]
    if missing:
        raise SystemExit(f"{path}: the regime ledger lacks the column(s) {missing}")
    return ledger[["variant", *columns, *[c for c in ledger.columns if c not in ("variant", *columns)]]]


def rows_of(ledger: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The ledger's runs of one variant, in the runs folder's columns (no ``variant``)."""
    return ledger.loc[ledger["variant"] == variant].drop(columns="variant").reset_index(drop=True)


def known(path: Path, columns: Sequence[str], variant: str) -> pd.DataFrame:
    """The runs of ``variant`` in the ledger at ``path`` (none where there is no ledger yet)."""
    return rows_of(load(path, columns), variant)


def keys(runs: pd.DataFrame) -> set[tuple]:
    """The (shift, labels, rounds, method, seed) of every run: what a part need not train again."""
    return set(_row_keys(runs, RUN_KEY))


def merge(known: pd.DataFrame, found: pd.DataFrame, what: str = "runs", key: Sequence[str] = RUN_KEY,
          value: str = "auroc") -> pd.DataFrame:
    """``known`` (the ledger's rows of a variant) and ``found`` (the runs folder's): every ``key`` once,
    the ledger's row where both have it; rows whose ``value`` differs by more than rounding are named."""
    if known.empty:
        return found.reset_index(drop=True)
    if found.empty:
        return known.reset_index(drop=True)
    key = list(key)
    both = known.merge(found, on=key, suffixes=("", "_found"))
    moved = both.loc[~np.isclose(both[value].astype(float), both[f"{value}_found"].astype(float),
                                 rtol=0, atol=1e-9, equal_nan=True)]
    if len(moved):
        names = ", ".join(" ".join(f"{k}={v}" for k, v in zip(key, row)) for row in moved[key].itertuples(index=False))
        print(f"{what}: {len(moved)} row(s) in the runs folder differ in {value} from the ledger's, which is kept: "
              f"{names}", flush=True)
    have = set(_row_keys(known, key))
    new = found.loc[[k not in have for k in _row_keys(found, key)]]
    return pd.concat([known, new], ignore_index=True)


def add(ledger: pd.DataFrame, runs: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The ledger with ``runs`` (one variant's, every one of them known or new) in place of that variant's rows;
    a column ``runs`` have and the ledger lacks (a new candidate's ``oof_<method>``) joins it."""
    others = ledger.loc[ledger["variant"] != variant]
    mine = runs.assign(variant=variant)
    columns = [*ledger.columns, *[c for c in mine.columns if c not in ledger.columns]]
    mine = mine.reindex(columns=columns)
    return pd.concat([others, mine], ignore_index=True) if len(others) else mine.reset_index(drop=True)


def save(ledger: pd.DataFrame, path: Path, key: Sequence[str] = KEY) -> None:
    """Sorted by key, so a part's commit shows its new rows as added lines and nothing else."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ledger.sort_values(list(key)).to_csv(path, index=False)


def _row_keys(runs: pd.DataFrame, key: Sequence[str] = RUN_KEY) -> Iterable[tuple]:
    """Each row's key, typed alike whether it came from a CSV or from the runs folder (labels, rounds, seed: int)."""
    ints = {"labels", "rounds", "seed"}
    return (tuple(int(v) if k in ints else str(v) for k, v in zip(key, row))
            for row in runs[list(key)].itertuples(index=False, name=None))
