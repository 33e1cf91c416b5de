"""Partitions: canonical rows → federated sites (``--site-by SPEC``).

Specs (the papers' sites):

* *(none)* — the whole source is one site, named after the source (or ``--site-name``).
* ``COLUMN`` or ``column:COLUMN`` — one site per value of an adapter group column
  (``race`` for MIMIC, ``state``/``site_id`` for MIDRC, ``site_group`` for covid-chestxray).
  Rows with no value are set aside. Values become site names by the rule of
  :mod:`fedcxr.site_adapters.site_names` (two values never merge into one site).
* ``conditions:c1,c2,...`` — one site per condition (AuxInfo+GP paper's CheXpert domains,
  preset ``chexpert-conditions`` = lung_lesion, pneumonia, atelectasis, consolidation, edema).
  Each patient goes to exactly one of the listed conditions it has labels for (a stable
  hash picks among them), the site labels only that condition, and the patient's rows with
  no label for it are set aside.
* ``iid:K`` — patients hashed into K equal sites ``site-1..site-K``; ``iid:K:shared=S`` also
  gives each site a class subset (S classes shared by all, the rest spread so that every
  class appears at least once: the surgical-aggregation paper's ablation);
  ``iid:K:classes=a,b;c,d;...`` names each site's subset explicitly. ``:seed=N`` changes the
  draw. Classes outside a site's subset are masked (NaN), their raw values kept.
* ``skew:K[:alpha=A][:seed=N]`` — label skew (Hsu et al. 2019): each patient's label is the
  tuple, over the source's classes, of its highest label across its images (positive if any
  image is; for a binary task such as PneumoniaMNIST simply 0 or 1, for one image per patient
  that image's label); for every label value the patients holding it are dealt to
  ``site-1..site-K`` in proportions drawn from Dirichlet(A·1_K). Small A (0.1) gives sites
  dominated by one label, large A (100) nearly IID. Default A = 0.5, seed 0; patients are
  ordered by a stable hash first, so the draw does not depend on row order. The draw is
  repeated (up to 100 times) until no site is empty. Meant for binary/multi-class tasks:
  with many multi-label combinations every combination is dealt separately.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from fedcxr.site_adapters.base import IngestError, SetAside
from fedcxr.site_adapters.manifest import patient_bucket
from fedcxr.site_adapters.site_names import canonical, site_name, site_names
from fedcxr.suggest import did_you_mean
from fedcxr.vocab import CLASS_SET, canonical_class, label_column

CHEXPERT_CONDITIONS = ["lung_lesion", "pneumonia", "atelectasis", "consolidation", "edema"]


@dataclass
class Partitioned:
    """Rows with a ``site`` column, per-site class subsets, and what was set aside."""

    frame: pd.DataFrame
    class_sets: dict[str, list[str]]  # site → classes it may label (before counting)
    set_aside: list[SetAside]
    notes: list[str] = field(default_factory=list)  # values whose site name got a suffix (site_names)


def slug(value: str) -> str:
    """A folder-safe site name: letters, digits, ``-`` and ``_`` only."""
    text = re.sub(r"[^A-Za-z0-9_-]+", "-", str(value).strip()).strip("-")
    return text or "unnamed"


def partition(
    frame: pd.DataFrame, spec: Optional[str], classes: list[str], *, default_site: str
) -> Partitioned:
    """Assign each row to a site according to ``spec`` (see module doc)."""
    if spec is None or spec.strip() in {"", "whole", "none"}:
        out = frame.copy()
        name = site_name(default_site)
        out["site"] = name
        return Partitioned(out, {name: list(classes)}, [])
    spec = spec.strip()
    if spec == "chexpert-conditions":
        spec = "conditions:" + ",".join(CHEXPERT_CONDITIONS)
    kind, _, rest = spec.partition(":")
    if kind == "conditions":
        return _by_conditions(frame, rest, classes)
    if kind == "iid":
        return _iid(frame, rest, classes)
    if kind == "skew":
        return _skew(frame, rest, classes)
    return _by_column(frame, site_column(spec), classes)


def site_column(spec: Optional[str]) -> Optional[str]:
    """The export column ``spec`` takes sites from (``COLUMN``/``column:COLUMN``), else None."""
    if spec is None or spec.strip() in {"", "whole", "none", "chexpert-conditions"}:
        return None
    kind, _, rest = spec.strip().partition(":")
    if kind in {"conditions", "iid", "skew"}:
        return None
    return rest if kind == "column" else spec.strip()


def _set_aside_rows(rows: pd.DataFrame, reason: str) -> list[SetAside]:
    return [
        SetAside(file=f, row=int(r), image_path=p, reason=reason)
        for f, r, p in zip(rows["source_file"], rows["source_row"], rows["image_path"])
    ]


def _by_column(frame: pd.DataFrame, column: str, classes: list[str]) -> Partitioned:
    col = f"group__{column}"
    if col not in frame:
        available = sorted(c[len("group__"):] for c in frame.columns if c.startswith("group__"))
        raise IngestError(
            f"--site-by {column!r}: this source has no such column; "
            f"available: {', '.join(available) or 'none (use iid:K or no --site-by)'}"
        )
    values = frame[col]
    missing = values.isna() | (values.astype(str).str.strip() == "")
    set_aside = _set_aside_rows(frame.loc[missing], f"no value for site column {column!r}")
    out = frame.loc[~missing].copy()
    values = out[col].astype(str)
    names, notes = site_names(values.unique())
    out["site"] = values.map(lambda v: names[canonical(v)])
    return Partitioned(out, {s: list(classes) for s in sorted(out["site"].unique())}, set_aside, notes)


def _parse_class_list(text: str, classes: list[str]) -> list[str]:
    names = []
    for token in text.split(","):
        token = token.strip()
        if not token:
            continue
        cls = canonical_class(token)
        if cls is None or cls not in CLASS_SET:
            raise IngestError(f"--site-by: unknown class {token!r}{did_you_mean(token, sorted(CLASS_SET))}")
        if cls not in classes:
            raise IngestError(f"--site-by: class {cls!r} is not labeled by this source")
        names.append(cls)
    return names


def _by_conditions(frame: pd.DataFrame, rest: str, classes: list[str]) -> Partitioned:
    conditions = _parse_class_list(rest, classes)
    if len(conditions) < 2:
        raise IngestError("--site-by conditions:... needs at least two conditions")
    labeled = np.stack([frame[label_column(c)].notna().to_numpy() for c in conditions], axis=1)
    per_patient = pd.DataFrame(labeled, columns=conditions).groupby(frame["patient_id"].to_numpy()).any()
    bucket = pd.Series(patient_bucket(pd.Series(per_patient.index), salt="fedcxr-conditions"),
                       index=per_patient.index)
    choice: dict[str, Optional[str]] = {}
    mat = per_patient.to_numpy()
    for i, pid in enumerate(per_patient.index):
        options = [conditions[j] for j in np.flatnonzero(mat[i])]
        choice[pid] = options[int(bucket[pid] * len(options))] if options else None
    site = frame["patient_id"].map(choice)
    keep = np.zeros(len(frame), dtype=bool)
    for cond in conditions:
        keep |= (site == cond).to_numpy() & frame[label_column(cond)].notna().to_numpy()
    dropped = frame.loc[~keep]
    set_aside = _set_aside_rows(dropped, "no label for any condition site this patient was assigned to")
    out = frame.loc[keep].copy()
    out["site"] = site[keep].map(slug)
    for cond in conditions:
        for other in classes:
            if other != cond:
                mask = out["site"] == slug(cond)
                out.loc[mask, label_column(other)] = np.nan
    return Partitioned(out, {slug(c): [c] for c in conditions}, set_aside)


def _iid(frame: pd.DataFrame, rest: str, classes: list[str]) -> Partitioned:
    parts = rest.split(":") if rest else []
    try:
        k = int(parts[0])
    except (IndexError, ValueError):
        raise IngestError(f"--site-by iid:K needs an integer K, got {rest!r}") from None
    if k < 1:
        raise IngestError("--site-by iid:K needs K >= 1")
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    unknown = set(options) - {"shared", "classes", "seed"}
    if unknown:
        raise IngestError(f"--site-by iid: unknown option(s) {sorted(unknown)}")
    seed = int(options.get("seed", 0))
    bucket = patient_bucket(frame["patient_id"], salt=f"fedcxr-iid-{seed}")
    index = np.minimum((bucket * k).astype(int), k - 1)
    names = [f"site-{i + 1}" for i in range(k)]
    out = frame.copy()
    out["site"] = np.array(names)[index]
    labeled = [c for c in classes if out[label_column(c)].notna().any()]
    if "classes" in options:
        groups = options["classes"].split(";")
        if len(groups) != k:
            raise IngestError(f"--site-by iid:{k}:classes=... needs {k} ';'-separated groups, got {len(groups)}")
        subsets = [_parse_class_list(g, classes) for g in groups]
    elif "shared" in options:
        subsets = _shared_subsets(labeled, k, int(options["shared"]), seed)
    else:
        subsets = [list(labeled) for _ in range(k)]
    class_sets = dict(zip(names, subsets))
    for name, subset in class_sets.items():
        mask = out["site"] == name
        for cls in classes:
            if cls not in subset:
                out.loc[mask, label_column(cls)] = np.nan
    return Partitioned(out, class_sets, [])


def _shared_subsets(labeled: list[str], k: int, shared: int, seed: int) -> list[list[str]]:
    """S classes every site has; the others dealt round-robin so each appears at least once."""
    if not 0 <= shared <= len(labeled):
        raise IngestError(f"--site-by iid:K:shared=S needs 0 <= S <= {len(labeled)}")
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(labeled))
    common, rest = order[:shared], order[shared:]
    subsets = [list(common) for _ in range(k)]
    for i, cls in enumerate(rest):
        subsets[i % k].append(cls)
    return [sorted(s, key=labeled.index) for s in subsets]


def _skew(frame: pd.DataFrame, rest: str, classes: list[str]) -> Partitioned:
    """Dirichlet label-skew over patients into ``site-1..site-K`` (see module doc)."""
    parts = rest.split(":") if rest else []
    try:
        k = int(parts[0])
    except (IndexError, ValueError):
        raise IngestError(f"--site-by skew:K needs an integer K, got {rest!r}") from None
    if k < 2:
        raise IngestError("--site-by skew:K needs K >= 2")
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    unknown = set(options) - {"alpha", "seed"} | {p for p in parts[1:] if "=" not in p}
    if unknown:
        raise IngestError(f"--site-by skew: unknown option(s) {sorted(unknown)}; use alpha=A, seed=N")
    try:
        alpha, seed = float(options.get("alpha", 0.5)), int(options.get("seed", 0))
    except ValueError:
        raise IngestError(f"--site-by skew:{rest}: alpha must be a number and seed an integer") from None
    if not alpha > 0:
        raise IngestError("--site-by skew: alpha must be > 0")
    per_patient = frame.groupby("patient_id", sort=True)[[label_column(c) for c in classes]].max()
    if len(per_patient) < k:
        raise IngestError(f"--site-by skew:{k}: only {len(per_patient)} patient(s), cannot fill {k} sites")
    keys = per_patient.astype(float).fillna(-9.0).astype(str).agg("|".join, axis=1).to_numpy()
    ids = pd.Series(per_patient.index.astype(str))
    order = np.argsort(patient_bucket(ids, salt=f"fedcxr-skew-{seed}"), kind="stable")
    patients, keys = ids.to_numpy()[order], keys[order]
    rng = np.random.default_rng(seed)
    for _ in range(100):
        site_of = _dirichlet_deal(keys, k, alpha, rng)
        if len(np.unique(site_of)) == k:
            break
    else:
        raise IngestError(f"--site-by skew:{k}:alpha={alpha}: 100 draws left a site empty; raise alpha or lower K")
    names = np.array([f"site-{i + 1}" for i in range(k)])
    out = frame.copy()
    out["site"] = out["patient_id"].astype(str).map(dict(zip(patients, names[site_of]))).astype(str)
    labeled = [c for c in classes if out[label_column(c)].notna().any()]
    return Partitioned(out, {n: list(labeled) for n in names}, [])


def _dirichlet_deal(keys: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Site index per patient: each label value's patients cut by Dirichlet(alpha) shares."""
    site_of = np.zeros(len(keys), dtype=int)
    for key in sorted(set(keys)):
        idx = np.flatnonzero(keys == key)
        shares = rng.dirichlet(np.full(k, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(idx)).round().astype(int)
        for site, chunk in enumerate(np.split(idx, cuts)):
            site_of[chunk] = site
    return site_of
