"""Linked groups audited together: a cell hidden in one group is not given away by another.

The attacker here solves an *integer* program (``scipy.optimize.milp``) over the cluster's
atoms — every released cell and total, the row count, and which hidden cells are below K —
for the smallest and largest value of each hidden cell. The models are first checked against
the counting code itself, so the attacker reads the same rows the site counted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from fedcxr.stats import groups as G
from fedcxr.stats.linked import EVERY_ROW_GROUPS, acquisition_cluster, demographics_cluster, split_cluster
from fedcxr.stats.release import release, release_group
from fedcxr.stats.site import SiteCounts, _category_counts, manifest_groups

K = 5


def apply(cluster, atoms: dict[str, int]) -> dict[str, list[int]]:
    vector = np.array([atoms.get(name, 0) for name in cluster.atoms])
    return {g: [int(vector[cell].sum()) for cell in cells] for g, cells in cluster.cells.items()}


def test_the_demographic_and_split_models_add_up_as_the_site_counts():
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame({
        "split": rng.choice(["train", "val", "test"], n),
        "label__pneumonia": rng.choice([1.0, 0.0, np.nan], n),
        "aux__sex": pd.array(rng.choice([0, 1, -1], n), dtype="Int64"),
        "aux__age_bin": pd.array(rng.choice([0, 1, 2, 3, 4, -1], n), dtype="Int64"),
    })
    frame.loc[frame["aux__sex"] == -1, "aux__sex"] = pd.NA
    frame.loc[frame["aux__age_bin"] == -1, "aux__age_bin"] = pd.NA
    counted = manifest_groups(frame, ["pneumonia"])
    sexes, ages = ["F", "M", G.UNKNOWN], G.age_bins() + [G.UNKNOWN]
    table = {}
    for s, a in zip(frame["aux__sex"], frame["aux__age_bin"]):
        key = f"{sexes[-1] if pd.isna(s) else sexes[int(s)]}/{ages[-1] if pd.isna(a) else ages[int(a)]}"
        table[key] = table.get(key, 0) + 1
    for group, cells in apply(demographics_cluster(), table).items():
        assert cells == counted[group].tolist(), group
    train = frame["split"] == "train"
    labeled = frame["label__pneumonia"].notna()
    atoms = {"train/labeled": int((train & labeled).sum()), "train/not_labeled": int((train & ~labeled).sum()),
             "val": int((frame["split"] == "val").sum()), "test": int((frame["split"] == "test").sum())}
    for group, cells in apply(split_cluster(), atoms).items():
        assert cells == counted[group].tolist(), group


def test_the_acquisition_model_adds_up_as_the_site_counts():
    rng = np.random.default_rng(1)
    headers = []
    for _ in range(300):
        kind = rng.choice(["dicom", "png", "jpeg", "none"])
        if kind == "none":
            headers.append(None)
            continue
        header = {"kind": str(kind), "rows": int(rng.choice([0, 100, 300, 2000, 5000])),
                  "cols": int(rng.choice([0, 200, 3000]))}
        if kind == "dicom":
            header.update(Modality=rng.choice(["CR", "DX", "MR", "", None]),
                          PhotometricInterpretation=rng.choice(["MONOCHROME1", "MONOCHROME2", "RGB", "ODD", None]),
                          Manufacturer=rng.choice(["GE Healthcare", "Agfa", "Acme", None]))
        headers.append(header)
    values = {name: [] for name in G.ACQUISITION}
    atoms: dict[str, int] = {}
    for header in headers:
        cats = G.header_categories(header)
        for name, value in cats.items():
            values[name].append(value)
        kind = "unreadable" if header is None else header["kind"]
        names = [kind]
        if header is not None:
            for g in ("modality", "photometric", "manufacturer"):
                if kind == "dicom":
                    names.append(f"{g}/{cats[g]}" if cats[g] != G.UNKNOWN else f"{g}/dicom without it")
            for g in ("image_rows", "image_cols"):
                names.append(f"{g}/{cats[g]}" if cats[g] != G.UNKNOWN else f"{g}/readable without it")
        for name in names:
            atoms[name] = atoms.get(name, 0) + 1
    for group, cells in apply(acquisition_cluster(), atoms).items():
        assert cells == _category_counts(pd.Series(values[group], dtype=object), G.categories(group)).tolist(), group


def attacker_range(cluster, payload: dict, true: dict[str, list[int]], group: str, i: int) -> tuple[int, int]:
    """Smallest and largest integer value of hidden cell ``(group, i)`` consistent with the payload."""
    n = len(cluster.atoms)
    rows, lower, upper = [], [], []

    def row(atoms) -> np.ndarray:
        out = np.zeros(n)
        out[list(atoms)] = 1.0
        return out

    for plus, minus in cluster.ties:
        r = row(plus)
        r[minus] = -1.0
        rows.append(r), lower.append(0), upper.append(0)
    present = [g for g in cluster.cells if g in payload["groups"]]
    for g in present:
        sent = payload["groups"][g]
        for j, cell in enumerate(cluster.cells[g]):
            value = sent["counts"][j]
            if value is not None:
                rows.append(row(cell)), lower.append(value), upper.append(value)
            elif true[g][j] < K:  # the attacker is told which hidden cells are the small ones
                rows.append(row(cell)), lower.append(0), upper.append(K - 1)
            else:
                rows.append(row(cell)), lower.append(K), upper.append(np.inf)
        if sent["count"] is not None:
            rows.append(row({a for c in cluster.cells[g] for a in c})), lower.append(sent["count"])
            upper.append(sent["count"])
    for g in set(present) & set(EVERY_ROW_GROUPS):  # the row count: known from any row group's total
        rows.append(row({a for c in cluster.cells[g] for a in c})), lower.append(sum(true["split"]))
        upper.append(sum(true["split"]))
    constraint = LinearConstraint(np.array(rows), lower, upper)
    target = row(cluster.cells[group][i])
    ends = []
    for sign in (1, -1):
        result = milp(sign * target, constraints=constraint, integrality=np.ones(n), bounds=Bounds(0, np.inf))
        assert result.status == 0, result.message
        ends.append(round(sign * result.fun))
    return ends[0], ends[1]


def exact_cells(cluster, payload: dict, true: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    """Hidden small cells (1 … K − 1) of the cluster the attacker pins down: (group, cell, value)."""
    out = []
    for g in cluster.cells:
        if g not in payload["groups"]:
            continue
        for i, value in enumerate(payload["groups"][g]["counts"]):
            if value is None and 0 < true[g][i] < K:
                low, high = attacker_range(cluster, payload, true, g, i)
                if low == high:
                    out.append((g, i, low))
    return out


def per_group_only(true: dict[str, list[int]]) -> dict:
    """What a release that protects each group alone (no audit) would send."""
    return {"groups": {g: release_group(np.array(v), K) for g, v in true.items()}}


CASES = {
    # sex and age margins with no unknowns: the pyramid's F/0-19 = 50 − the row's other cells
    "pyramid": (demographics_cluster, {
        "split": [100, 0, 0], "sex": [50, 50, 0], "age_bin": [10, 40, 20, 20, 10, 0],
        G.PYRAMID: [3, 20, 10, 10, 7, 7, 20, 10, 10, 3, 0]}),
    # train_labels' total is split's train cell, hidden beside val = 3
    "split": (split_cluster, {"split": [20, 3, 40], "train_labels": [12, 8]}),
    # not DICOM (shown in modality) = PNG + JPEG: JPEG is 0, so the unreadable 3 is exact
    "acquisition": (acquisition_cluster, {
        "split": [110, 0, 0], "file_format": [100, 7, 0, 3], "modality": [90, 10, 0, 7, 3],
        "photometric": [0, 100, 0, 7, 3], "manufacturer": [100] + [0] * 9 + [0, 7, 3],
        "image_rows": [0, 0, 0, 0, 0, 107, 0, 0, 0, 0, 0, 3], "image_cols": [0, 0, 0, 0, 0, 107, 0, 0, 0, 0, 0, 3]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_group_suppression_alone_gives_a_cell_away_through_a_linked_group(case):
    make, true = CASES[case]
    assert exact_cells(make(), per_group_only(true), true)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_release_leaves_no_hidden_cell_exact_across_linked_groups(case):
    make, true = CASES[case]
    site = SiteCounts(site="a", groups={g: np.array(v, dtype=np.int64) for g, v in true.items()}, image_size=4)
    payload = release(site, min_count=K)
    assert payload["status"] == "ok"
    assert exact_cells(make(), payload, true) == []


def random_site(rng: np.random.Generator, n: int) -> dict[str, list[int]]:
    """The linked groups of ``n`` random rows, counted from the rows, so every link holds exactly."""
    sex, age = rng.choice(3, n, p=[.45, .45, .1]), rng.choice(6, n, p=[.05, .2, .3, .3, .1, .05])
    split, labeled = rng.choice(3, n, p=[.7, .15, .15]), rng.random(n) < .8
    kind = rng.choice(4, n, p=[.6, .3, .08, .02])  # dicom, png, jpeg, unreadable
    dicom, readable = kind == 0, kind != 3
    g = {"split": np.bincount(split, minlength=3),
         "train_labels": np.array([((split == 0) & labeled).sum(), ((split == 0) & ~labeled).sum()]),
         "sex": np.bincount(sex, minlength=3), "age_bin": np.bincount(age, minlength=6),
         G.PYRAMID: np.bincount(np.where((sex < 2) & (age < 5), sex * 5 + age, 10), minlength=11),
         "file_format": np.bincount(kind, minlength=4)}
    for name in ("modality", "photometric", "manufacturer"):
        own = len(G.categories(name)) - 2  # + not DICOM, unknown
        cat = rng.choice(own + 1, n, p=np.r_[rng.dirichlet(np.ones(own)) * .95, .05])  # own + 'dicom without it'
        g[name] = np.r_[[((cat == c) & dicom).sum() for c in range(own)], (kind == 1).sum() + (kind == 2).sum(),
                        ((cat == own) & dicom).sum() + (kind == 3).sum()]
    for name in ("image_rows", "image_cols"):
        size = rng.choice(12, n, p=np.r_[rng.dirichlet(np.ones(11)) * .97, .03])
        g[name] = np.r_[[((size == c) & readable).sum() for c in range(11)],
                        ((size == 11) & readable).sum() + (kind == 3).sum()]
    return {k: [int(x) for x in v] for k, v in g.items()}


@pytest.mark.parametrize("seed", range(4))
def test_random_small_sites_leave_no_hidden_cell_exact(seed):
    rng = np.random.default_rng(seed)
    true = random_site(rng, int(rng.choice([20, 40, 80])))
    site = SiteCounts(site="a", groups={g: np.array(v, dtype=np.int64) for g, v in true.items()}, image_size=4)
    payload = release(site, min_count=K)
    if payload["status"] == "suppressed":  # nothing sent: nothing to recover
        return
    for make in (split_cluster, demographics_cluster, acquisition_cluster):
        assert exact_cells(make(), payload, true) == [], make.__name__
