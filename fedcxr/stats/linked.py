"""Groups that count the same rows two ways, audited together so that one cannot undo the other.

:mod:`fedcxr.stats.suppression` protects each group alone. Some groups are linked by the rows
they share, and what is hidden in one can be shown in another:

* ``split`` and ``train_labels`` — ``train_labels``' cells add up to ``split``'s ``train`` cell;
* ``sex``, ``age_bin`` and ``sex_by_age`` — the pyramid is the sex × age table, the other two
  are its margins: a pyramid cell hidden alone in its row is sex − the row's other cells;
* ``file_format``, ``modality``, ``photometric``, ``manufacturer``, ``image_rows``,
  ``image_cols`` — all six split the same files, ``not DICOM`` is PNG + JPEG in three of them,
  ``unknown`` holds the unreadable files in five.

Each *cluster* of linked groups is written here once as a small linear model: non-negative
integer *atoms* (the finest counts the released cells are sums of, e.g. the 3 × 6 sex × age
table with its unknowns) and, for every cell, the atoms it adds up. The audit
(:func:`audit`) plays the attacker of statistical disclosure control (τ-ARGUS's audit, by
linear programming): knowing every shown cell, every sent total, the site's row count, the
model, and — more than a real attacker knows — which hidden cells are below K (in
``[0, K − 1]``) and which were hidden beside them (``≥ K``), it computes the smallest and
largest value of every hidden small cell (1 … K − 1; a hidden zero or a cell hidden beside a
small one may be known: neither is a small count). A cell whose range holds a single integer is
exact: the audit hides one more shown cell of the cluster (the one that frees it, smallest
first) and looks again; hiding only relaxes the attacker's system, so it ends. A cell that
stays exact with the whole cluster hidden makes the site send nothing (:class:`Unprotectable`).

Limits, stated in SECURITY.md: the audit is the linear-programming relaxation (integer
solutions are not enumerated; for these network-like tables its bounds are the integer ones),
it promises more than one value per hidden cell, not a wide interval, and it does not model an
attacker who also knows how the greedy choice was made. Noisy releases (``--epsilon``) are not
audited: each group has its own noise, the links no longer hold exactly, and the Laplace
mechanism is what protects them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from fedcxr.stats import groups as G
from fedcxr.vocab import AUX_VOCAB

#: Slack for the LP solver's optimum before rounding to the nearest feasible integers.
_EPS = 1e-6


class Unprotectable(Exception):
    """A hidden cell stays exact even with every cell of its cluster hidden."""


@dataclass
class Cluster:
    """Atoms (non-negative counts) and, per group cell, the atoms it is the sum of."""

    name: str
    atoms: list[str] = field(default_factory=list)
    cells: dict[str, list[list[int]]] = field(default_factory=dict)
    #: equalities between atoms that hold by construction: (atoms summed, atoms subtracted)
    ties: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def atom(self, name: str) -> int:
        self.atoms.append(name)
        return len(self.atoms) - 1

    def group_atoms(self, name: str) -> list[int]:
        return sorted({a for cell in self.cells[name] for a in cell})


def split_cluster() -> Cluster:
    """``split`` = [train labeled + train not labeled, val, test]; ``train_labels`` = the two train parts."""
    c = Cluster("split")
    tl, tu, val, test = (c.atom(n) for n in ("train/labeled", "train/not_labeled", "val", "test"))
    c.cells["split"] = [[tl, tu], [val], [test]]
    c.cells["train_labels"] = [[tl], [tu]]
    return c


def demographics_cluster() -> Cluster:
    """The sex × age table with an unknown row and column; ``sex``, ``age_bin``, ``sex_by_age`` read it."""
    c = Cluster("demographics")
    sexes, ages = list(AUX_VOCAB["sex"]) + [G.UNKNOWN], G.age_bins() + [G.UNKNOWN]
    table = {(s, a): c.atom(f"{s}/{a}") for s in sexes for a in ages}
    c.cells["sex"] = [[table[s, a] for a in ages] for s in sexes]
    c.cells["age_bin"] = [[table[s, a] for s in sexes] for a in ages]
    known = [(s, a) for s in sexes[:-1] for a in ages[:-1]]
    c.cells[G.PYRAMID] = [[table[key]] for key in known] + [[i for key, i in table.items() if key not in known]]
    return c


def acquisition_cluster() -> Cluster:
    """Files by kind (DICOM, PNG, JPEG, unreadable); each header group splits the DICOMs (or the
    readable files) its own way, with ``not DICOM`` = PNG + JPEG and ``unknown`` ⊇ unreadable."""
    c = Cluster("acquisition")
    dicom, png, jpeg, bad = (c.atom(n) for n in ("dicom", "png", "jpeg", "unreadable"))
    c.cells["file_format"] = [[dicom], [png], [jpeg], [bad]]
    for name in ("modality", "photometric", "manufacturer"):
        cats = G.categories(name)
        own = {cat: c.atom(f"{name}/{cat}") for cat in cats if cat not in (G.NOT_DICOM, G.UNKNOWN)}
        unknown_dicom = c.atom(f"{name}/dicom without it")
        c.cells[name] = [[own[cat]] if cat in own else [png, jpeg] if cat == G.NOT_DICOM else [unknown_dicom, bad]
                         for cat in cats]
        c.ties.append(([*own.values(), unknown_dicom], [dicom]))
    for name in ("image_rows", "image_cols"):
        cats = G.categories(name)
        own = {cat: c.atom(f"{name}/{cat}") for cat in cats if cat != G.UNKNOWN}
        no_size = c.atom(f"{name}/readable without it")
        c.cells[name] = [[own[cat]] if cat in own else [no_size, bad] for cat in cats]
        c.ties.append(([*own.values(), no_size], [dicom, png, jpeg]))
    return c


def clusters() -> list[Cluster]:
    return [split_cluster(), demographics_cluster(), acquisition_cluster()]


#: groups whose cells cover every row of the site (their totals are all the row count)
EVERY_ROW_GROUPS = ("split", "sex", "age_bin", G.PYRAMID, *G.ACQUISITION)
#: candidates tried in pairs when no single shown cell frees an exact one (a 2 × 2 rectangle of a table)
PAIR_CANDIDATES = 12


@dataclass
class _State:
    """One cluster's values and what is hidden, restricted to the groups the site has."""

    cluster: Cluster
    values: dict[str, list[int]]
    hidden: dict[str, list[bool]]
    totals: dict[str, bool]
    rows: int
    min_count: int

    def forms(self) -> list[tuple[str, int]]:
        return [(g, i) for g in self.values for i in range(len(self.values[g]))]

    def form(self, group: str, i: int) -> np.ndarray:
        row = np.zeros(len(self.cluster.atoms))
        row[self.cluster.cells[group][i]] = 1.0
        return row

    def system(self) -> tuple[list, list, list, list]:
        """``(A_eq, b_eq, A_ub, b_ub)`` of what the attacker knows."""
        n = len(self.cluster.atoms)
        a_eq, b_eq, a_ub, b_ub = [], [], [], []
        for plus, minus in self.cluster.ties:
            if self._used(plus + minus):
                row = np.zeros(n)
                row[plus], row[minus] = 1.0, -1.0
                a_eq.append(row)
                b_eq.append(0.0)
        for group, i in self.forms():
            row, value = self.form(group, i), self.values[group][i]
            if not self.hidden[group][i]:
                a_eq.append(row)
                b_eq.append(float(value))
            elif value < self.min_count:
                a_ub.append(row)
                b_ub.append(float(self.min_count - 1))
            else:
                a_ub.append(-row)
                b_ub.append(-float(self.min_count))
        for group, shown in self.totals.items():
            known = shown is True or group in EVERY_ROW_GROUPS  # a row group's total is the row count
            if known:
                row = np.zeros(n)
                row[self.cluster.group_atoms(group)] = 1.0
                a_eq.append(row)
                b_eq.append(float(sum(self.values[group]) if shown is True else self.rows))
        return a_eq, b_eq, a_ub, b_ub

    def _used(self, atoms: list[int]) -> bool:
        present = {a for g in self.values for cell in self.cluster.cells[g] for a in cell}
        return all(a in present for a in atoms)

    def exact(self, group: str, i: int) -> bool:
        """True when the attacker's range for hidden cell ``(group, i)`` holds one integer."""
        from scipy.optimize import linprog

        a_eq, b_eq, a_ub, b_ub = self.system()
        target = self.form(group, i)
        ends = []
        for sign in (1.0, -1.0):
            result = linprog(sign * target, A_ub=np.array(a_ub) if a_ub else None, b_ub=b_ub or None,
                             A_eq=np.array(a_eq) if a_eq else None, b_eq=b_eq or None, bounds=(0, None),
                             method="highs")
            if result.status == 3:  # unbounded: any value
                return False
            if result.status != 0:  # infeasible cannot happen on true counts; treat as exact (hide more)
                return True
            ends.append(sign * result.fun)
        low, high = math.ceil(ends[0] - _EPS), math.floor(ends[1] + _EPS)
        return low >= high

    def exposed(self) -> list[tuple[str, int]]:
        """Hidden small cells (1 … K − 1) the attacker can pin down. A hidden zero may be known (an
        empty category is not a small count), and so may a cell hidden beside a small one: it is
        at least K, it could have been sent."""
        return [(g, i) for g, i in self.forms()
                if self.hidden[g][i] and 0 < self.values[g][i] < self.min_count and self.exact(g, i)]

    def candidates(self, first: str) -> list[tuple[str, int]]:
        """Shown cells, the pinned cell's group first, then smallest first."""
        shown = [(g, i) for g, i in self.forms() if not self.hidden[g][i]]
        return sorted(shown, key=lambda gi: (gi[0] != first, self.values[gi[0]][gi[1]]))


def audit(values: dict[str, list[int]], hidden: dict[str, list[bool]], totals: dict[str, bool | str],
          min_count: int, rows: int) -> dict[str, list[bool]]:
    """``hidden`` with the cells that linked groups need hidden as well (a new dict).

    ``values``: each group's cells before suppression; ``hidden``: what per-group suppression
    hides; ``totals``: whether each group's total is sent; ``rows``: the site's row count, taken
    as known (any one sent total of a row group gives it). Raises :class:`Unprotectable` when a
    hidden cell stays exact with its whole cluster hidden.
    """
    out = {g: list(h) for g, h in hidden.items()}
    for cluster in clusters():
        present = {g: values[g] for g in cluster.cells if g in values}
        if not any(any(out[g]) for g in present):
            continue
        state = _State(cluster, {g: [int(v) for v in present[g]] for g in present}, {g: out[g] for g in present},
                       {g: totals.get(g, True) for g in present}, rows, int(min_count))
        _protect(state)
    return out


def _protect(state: _State) -> None:
    """Hide shown cells of the cluster until no hidden non-zero cell is exact (see the module doc).

    For an exact cell: the first shown cell (its own group first, smallest first) whose hiding
    frees it; else the first pair among the leading candidates (a table cell needs a partner in
    its row and one in its column); else the smallest candidate, and look again. Every step hides
    at least one more cell, so it ends."""
    pinned = state.exposed()
    while pinned:
        group, i = pinned[0]
        candidates = state.candidates(group)
        if not candidates:
            raise Unprotectable(f"{group} cell {i} stays exact with the whole {state.cluster.name} cluster hidden")
        choice = _first_freeing(state, (group, i), [[c] for c in candidates])
        if choice is None:
            head = candidates[:PAIR_CANDIDATES]
            choice = _first_freeing(state, (group, i), [[a, b] for n, a in enumerate(head) for b in head[n + 1:]])
        for g, j in choice or candidates[:1]:
            state.hidden[g][j] = True
        pinned = state.exposed()


def _first_freeing(state: _State, cell: tuple[str, int], options: list[list[tuple[str, int]]]):
    """The first set of shown cells whose hiding leaves ``cell`` with more than one value, or None."""
    for option in options:
        for g, j in option:
            state.hidden[g][j] = True
        freed = not state.exact(*cell)
        for g, j in option:
            state.hidden[g][j] = False
        if freed:
            return option
    return None


__all__ = ["Cluster", "EVERY_ROW_GROUPS", "Unprotectable", "acquisition_cluster", "audit", "clusters",
           "demographics_cluster", "split_cluster"]
