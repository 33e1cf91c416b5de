"""The science regime map: which method won where, read from a CSV shipped with fedcxr.

One row per measured cell (``regime_map.csv`` beside this module; regenerate with
``benchmarks/build_regime_map.py``). Columns:

=====================  ============================================================================
``shift``              none | pixel | shortcut | label_noise
``target_labels``      labeled target training rows every method had (int)
``rounds``             federated rounds (int)
``winner``             method with the highest mean test AUROC (methods with the same target budget;
                       Oracle, which uses every target label, never counts); blank when no method
                       stood out (recorded as measured, e.g. "all noisy")
``runner_up``          the second best
``margin``             winner − runner-up mean AUROC
``ci_low`` ``ci_high`` paired 95 % interval of the margin over seeds (Student t, unadjusted); blank
                       when the source reported none
``p_best``             the cell's p-value of "the winner beats every other method": the largest
                       one-sided paired t p-value against each other method (intersection-union),
                       times the number of methods (the winner is chosen by the same data)
``p_adj``              ``p_best`` adjusted by Holm over every cell of the map
                       (:mod:`fedcxr.advice.verdicts`); blank when it could not be computed
``resolved``           true exactly when ``p_adj`` < 0.05 — the only verdict that recommends
``n_seeds``            seeds per method (planned before any result, the same in every cell)
``n_methods``          (optional) methods in the contest
``selected_regret``    (optional) the chooser's regret (winner − ``Selected``, mean over seeds) and
``selected_lo/hi``     its 95 % interval: what ``fedcxr sweep --select`` lost against the winner here
``selected_among``     (optional) the candidates that chooser picked among, space-separated: its
                       regret holds for that set, not for the leaders the advice names
``auroc__<Method>``    each method's mean AUROC (blank: not run in that cell)
``source``             where the numbers come from (file or issue, code version)
=====================  ============================================================================

The code reads any number of rows and any set of ``auroc__`` columns. A federation is placed
in the cell of its shift type whose label budget and rounds are nearest on a log scale, and
only when both are within a factor :data:`MAX_FACTOR` — otherwise the answer is "no cell close
enough".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from fedcxr.errors import UserError

SHIFT_TYPES = ("none", "pixel", "shortcut", "label_noise")
REQUIRED = ("shift", "target_labels", "rounds", "winner", "runner_up", "margin", "ci_low", "ci_high",
            "p_best", "p_adj", "resolved", "n_seeds")
#: the optional columns: the chooser's regret in the cell
OPTIONAL_NUMBERS = ("selected_regret", "selected_lo", "selected_hi")
#: the family-wise error rate a resolved cell's ``p_adj`` is below (fedcxr.advice.verdicts.ALPHA)
ALPHA = 0.05
METHOD_PREFIX = "auroc__"
#: a method name in the map (winner, runner-up, ``auroc__<Method>``, ``selected_among``): the map may come
#: from a user's ``--regime-map``, and the advice quotes these names into reports
METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: A cell is close enough when the target's label budget and the planned rounds are each within
#: this factor of the cell's (|log2 ratio| ≤ 1): 50 labels match cells of 25–100.
MAX_FACTOR = 2.0
UNRESOLVED = "unresolved: run a sweep"
#: the advice where the map cannot tell: choose on the hospital's own labels, within its budget
SELECT_HINT = "choose on your own labels: fedcxr sweep --select (cross-fit within your label budget)"
#: where the map cannot tell and the chooser measured in the cell lost resolved ground to the
#: winner (its regret's interval above 0): too few labels to choose on, or a candidate list without
#: the leader, so the leader is named
TAKE_LEADER = "unresolved: train the leader"
NO_CELL = "no cell close enough"


@dataclass(frozen=True)
class Cell:
    """One row of the map."""

    row: int
    shift: str
    target_labels: int
    rounds: int
    winner: Optional[str]
    runner_up: Optional[str]
    margin: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    resolved: bool
    n_seeds: int
    p_best: Optional[float] = None
    p_adj: Optional[float] = None
    auroc: dict[str, float] = field(default_factory=dict)
    selected: dict[str, float] = field(default_factory=dict)
    source: str = ""
    selected_among: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "shift": self.shift, "target_labels": self.target_labels, "rounds": self.rounds,
                "winner": self.winner, "runner_up": self.runner_up, "margin": self.margin, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "p_best": self.p_best, "p_adj": self.p_adj, "resolved": self.resolved,
                "n_seeds": self.n_seeds, "auroc": dict(self.auroc), "selected": dict(self.selected),
                "selected_among": list(self.selected_among), "source": self.source}


def map_path() -> Path:
    """The map shipped with fedcxr (package data)."""
    return Path(__file__).with_name("regime_map.csv")


def load_regime_map(path: Path | str | None = None) -> list[Cell]:
    """Every row of the map, checked; a bad row stops with its file, row and column named."""
    import pandas as pd

    path = Path(path) if path is not None else map_path()
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the regime map ({exc})") from None
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: the regime map lacks column(s) {missing}; needs {list(REQUIRED)} and auroc__<Method> "
                        "(a map without p_best/p_adj predates the corrected verdicts: rebuild it with "
                        "benchmarks/build_regime_map.py)")
    methods = [c for c in frame.columns if c.startswith(METHOD_PREFIX)]
    for column in methods:
        if not _is_method(column[len(METHOD_PREFIX):]):
            raise UserError(f"{path}: column {column!r}: {METHOD_PREFIX} and a method name (letters, digits, _)")
    return [_cell(path, i + 2, row, methods) for i, row in enumerate(frame.to_dict("records"))]


def _cell(path: Path, line: int, row: dict, methods: list[str]) -> Cell:
    def bad(column: str, why: str) -> UserError:
        return UserError(f"{path}: row {line}, column {column!r}: {why} (got {row.get(column)!r})")

    shift = row["shift"].strip()
    if shift not in SHIFT_TYPES:
        raise bad("shift", f"one of {', '.join(SHIFT_TYPES)}")
    numbers = {c: _number(row[c], lambda why, c=c: bad(c, why)) for c in ("margin", "ci_low", "ci_high", "p_best", "p_adj")}
    for c in ("p_best", "p_adj"):
        if numbers[c] is not None and not 0 <= numbers[c] <= 1:
            raise bad(c, "a p-value in [0, 1] or blank")
    selected = {c: _number(row[c], lambda why, c=c: bad(c, why)) for c in OPTIONAL_NUMBERS if c in row}
    among = tuple(str(row.get("selected_among", "")).split())
    if not all(map(_is_method, among)):
        raise bad("selected_among", "method names (letters, digits, _) separated by spaces")
    counts = {}
    for column in ("target_labels", "rounds", "n_seeds"):
        value = _number(row[column], lambda why, c=column: bad(c, why))
        if value is None or value != int(value) or value < 1:
            raise bad(column, "a whole number ≥ 1")
        counts[column] = int(value)
    text = row["resolved"].strip().lower()
    if text not in ("true", "false", "1", "0"):
        raise bad("resolved", "true or false")
    resolved = text in ("true", "1")
    lo, hi = numbers["ci_low"], numbers["ci_high"]
    if resolved and (lo is None or hi is None or (lo <= 0 <= hi)):
        raise bad("resolved", "true only with an interval that excludes 0")
    p_adj = numbers["p_adj"]
    if resolved and (p_adj is None or p_adj > ALPHA):
        raise bad("resolved", f"true only with an adjusted p-value (p_adj) below {ALPHA}")
    if not resolved and p_adj is not None and p_adj < ALPHA:
        raise bad("resolved", f"false, but p_adj {p_adj} is below {ALPHA}: the row contradicts itself")
    auroc = {}
    for column in methods:
        value = _number(row[column], lambda why, c=column: bad(c, why))
        if value is not None:
            auroc[column[len(METHOD_PREFIX):]] = value
    named = {column: row[column].strip() for column in ("winner", "runner_up")}
    for column, name in named.items():
        if name and not _is_method(name):
            raise bad(column, "a method name (letters, digits, _) or blank")
    winner = named["winner"] or None
    if resolved and not winner:
        raise bad("winner", "a resolved cell names its winner")
    return Cell(row=line, shift=shift, winner=winner, runner_up=named["runner_up"] or None,
                margin=numbers["margin"], ci_low=lo, ci_high=hi, p_best=numbers["p_best"], p_adj=p_adj,
                resolved=resolved, auroc=auroc, selected={k: v for k, v in selected.items() if v is not None},
                selected_among=among, source=str(row.get("source", "")).strip(), **counts)


def _is_method(name: str) -> bool:
    return METHOD_NAME.fullmatch(name) is not None


def _number(text: str, error) -> Optional[float]:
    text = str(text).strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise error("a number or blank") from None
    if not math.isfinite(value):
        raise error("a finite number")
    return value


# --------------------------------------------------------------------------- placing a federation


def gap(cell: Cell, labels: int, rounds: int) -> float:
    """Distance on a log scale: |log2(labels/cell labels)| + |log2(rounds/cell rounds)|."""
    return abs(math.log2(labels / cell.target_labels)) + abs(math.log2(rounds / cell.rounds))


def within_factor(value: float, cell_value: float) -> bool:
    """Whether a federation's labels or rounds are within :data:`MAX_FACTOR` of a cell's, the
    boundary included (the epsilon keeps an exact factor 2 inside despite float rounding)."""
    return abs(math.log2(value / cell_value)) <= math.log2(MAX_FACTOR) + 1e-9


def place(cells: Sequence[Cell], shift: str, labels: Optional[int], rounds: Optional[int]) -> dict[str, Any]:
    """The nearest cell of ``shift`` within :data:`MAX_FACTOR` on both axes, or why there is none."""
    rule = (f"same shift type; target labels and rounds each within a factor {MAX_FACTOR:g} of the cell's; "
            "nearest by |log2 label ratio| + |log2 rounds ratio|, ties: more seeds")
    if shift not in SHIFT_TYPES:
        return {"cell": None, "rule": rule, "why": f"shift type {shift!r} is not one of the map's ({', '.join(SHIFT_TYPES)})"}
    if not labels or not rounds:
        return {"cell": None, "rule": rule, "why": "the target's label budget or the planned rounds is unknown"}
    same = [c for c in cells if c.shift == shift]
    if not same:
        return {"cell": None, "rule": rule, "why": f"the map has no cell with shift {shift!r}"}
    close = [c for c in same if within_factor(labels, c.target_labels) and within_factor(rounds, c.rounds)]
    if not close:
        nearest = min(same, key=lambda c: gap(c, labels, rounds))
        return {"cell": None, "rule": rule,
                "why": (f"nearest {shift} cell has {nearest.target_labels} labels and {nearest.rounds} rounds "
                        f"(this federation: {labels} labels, {rounds} rounds): more than a factor {MAX_FACTOR:g} away")}
    best = min(close, key=lambda c: (gap(c, labels, rounds), -c.n_seeds, c.row))
    return {"cell": best, "gap": round(gap(best, labels, rounds), 4), "rule": rule,
            "why": f"{shift} cell with {best.target_labels} labels and {best.rounds} rounds (row {best.row})"}


def nearest_leaders(cells: Sequence[Cell], shift: str, labels: Optional[int], rounds: Optional[int],
                    n: int = 3) -> list[str]:
    """The leading methods of the map's cell nearest to a federation that no cell is close to: what
    is worth a sweep on the user's own data. Cells of its shift type when the map has any (all
    cells otherwise), nearest by :func:`gap` on the axes that are known; [] for an empty map."""
    pool = [c for c in cells if c.shift == shift] or list(cells)
    if not pool:
        return []

    def distance(c: Cell) -> float:
        return ((abs(math.log2(labels / c.target_labels)) if labels else 0.0)
                + (abs(math.log2(rounds / c.rounds)) if rounds else 0.0))

    return _top(min(pool, key=lambda c: (distance(c), -c.n_seeds, c.row)), n)


def verdict(cell: Optional[Cell]) -> dict[str, Any]:
    """The map's verdict in a cell: a recommendation only where the corrected test resolved it
    (``p_adj`` < 0.05: the winner beat every other method, corrected for picking the winner and for
    the number of cells); elsewhere the candidates to choose among on the hospital's own labels."""
    if cell is None:
        return {"recommendation": None, "verdict": NO_CELL}
    if not cell.winner:
        return {"recommendation": None, "verdict": UNRESOLVED,
                "why": f"no method stood out in this cell ({cell.source or 'map'}); {SELECT_HINT}",
                "candidates": _top(cell)}
    interval = _interval(cell)
    if cell.resolved:
        return {"recommendation": cell.winner, "verdict": "resolved",
                "why": (f"{cell.winner} beat every other of the cell's {cell_methods(cell)} methods (runner-up "
                        f"{cell.runner_up} by {cell.margin:+.3f} AUROC{interval}) over {cell.n_seeds} seeds; "
                        f"adjusted p = {cell.p_adj:.2g} (intersection-union test, Holm over the map's cells)")}
    margin = f" by {cell.margin:+.3f}" if cell.margin is not None else ""
    if cell.p_adj is not None:
        because = (f"but the map cannot tell: adjusted p = {cell.p_adj:.2g} for \"{cell.winner} beats every other "
                   "method\" (intersection-union test, corrected for the winner's selection and Holm over the cells)")
    else:
        because = "but the interval includes 0" if interval else "but no paired interval was reported"
    reason = f"{cell.winner} led {cell.runner_up}{margin}{interval} over {cell.n_seeds} seeds, {because}"
    regret = _regret(cell)
    if chooser_lost(cell):
        top = _top(cell)
        spread = cell.auroc[top[0]] - min(cell.auroc[m] for m in top)
        hint = (f"resolved (paired by seed, unadjusted): {_why_choosing_lost(cell)} cost more than the leaders "
                f"differ ({_names(top)} within {spread:.3f} AUROC), so train the leader, {cell.winner}, rather than sweep")
        return {"recommendation": None, "verdict": TAKE_LEADER, "why": f"{reason}{regret}, {hint}",
                "candidates": top, "leader": cell.winner}
    return {"recommendation": None, "verdict": UNRESOLVED, "why": f"{reason}{regret}; {SELECT_HINT}",
            "candidates": _top(cell)}


def _why_choosing_lost(cell: Cell) -> str:
    """What the chooser's loss is blamed on. Where the winner was one of its candidates, the labels
    were too few to find it; where it was not (40 % noisy source labels at 500 labels: the choices
    were sharp, the regret against the best candidate +0.002), the loss is the candidate list, and
    blaming the label budget would tell a hospital with 500 labels something the map did not measure."""
    if cell.selected_among and cell.winner not in cell.selected_among:
        return (f"the leader, {cell.winner}, was not among the candidates the map's chooser picked from, and "
                "choosing among them")
    return "with this few labels choosing on them"


def chooser_cost(n_labeled: int, cells: Optional[Sequence[Cell]] = None) -> Optional[str]:
    """What the map measured choosing on N labels to cost, at its measured label count nearest N
    (within :data:`MAX_FACTOR`): the range of the chooser's regrets there and how many were beyond
    doubt. Read from the map rather than written into the text, so that the sentence a hospital
    reads under its choice moves with the map as cells are added. ``None`` where nothing is near."""
    if cells is None:
        try:
            cells = load_regime_map()
        except UserError:
            return None
    measured = [c for c in cells if c.selected.get("selected_regret") is not None]
    if n_labeled <= 0 or not measured:
        return None
    near = min({c.target_labels for c in measured}, key=lambda n: abs(math.log2(n / n_labeled)))
    if not within_factor(n_labeled, near):
        return None
    at = [c for c in measured if c.target_labels == near]
    regrets = [c.selected["selected_regret"] for c in at]
    lost = [c for c in at if chooser_lost(c)]
    text = (f"In the regime map's {len(at)} chooser cell{'s' if len(at) > 1 else ''} with {near} labels "
            f"({_cells_named(at)}), the choice lost {min(regrets):+.3f} to {max(regrets):+.3f} AUROC to the best "
            "method in hindsight (means over seeds; BENCHMARKS.md, the chooser's cells)")
    if lost:
        text += (f"; beyond doubt in {len(lost)} ({_cells_named(lost)}), where training the map's "
                 "leader (`fedcxr stats` names it) was the better bet")
    return text + "."


def _cells_named(cells: Sequence[Cell]) -> str:
    """Cells of one label count by shift, grouped by rounds: "none, pixel at 20 rounds" or
    "pixel, shortcut at 20 rounds; pixel at 50 rounds" (a shift can appear at two round counts)."""
    groups = []
    for rounds in sorted({c.rounds for c in cells}):
        shifts = sorted({c.shift for c in cells if c.rounds == rounds}, key=SHIFT_TYPES.index)
        groups.append(f"{', '.join(shifts)} at {rounds} rounds")
    return "; ".join(groups)


def chooser_lost(cell: Cell) -> bool:
    """Whether the chooser measured in this cell lost to its winner beyond doubt (the regret's 95 %
    interval above 0): then choosing on the hospital's labels, among the candidates measured, cost
    more than training the leader would (too few labels, or a candidate list without the leader).

    Unadjusted over cells on purpose: it only swaps one unresolved piece of advice (sweep) for
    another (the leader, whose own cost is at most the leaders' spread), never makes a recommendation."""
    lo = cell.selected.get("selected_lo")
    return lo is not None and lo > 0


def cell_methods(cell: Cell) -> int:
    """The number of methods the cell's contest had (its ``auroc__`` columns)."""
    return len(cell.auroc)


def _regret(cell: Cell) -> str:
    value = cell.selected.get("selected_regret")
    if value is None:
        return ""
    lo, hi = cell.selected.get("selected_lo"), cell.selected.get("selected_hi")
    interval = f" [95 % {lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else ""
    among = f", picking among {_names(cell.selected_among)}," if cell.selected_among else ""
    return f"; in this cell the chooser{among} lost {value:+.3f}{interval} AUROC against the winner"


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _interval(cell: Cell) -> str:
    if cell.ci_low is None or cell.ci_high is None:
        return ""
    return f" [95 % {cell.ci_low:+.3f}, {cell.ci_high:+.3f}]"


def _top(cell: Cell, n: int = 3) -> list[str]:
    named = [m for m in (cell.winner, cell.runner_up) if m]
    ranked = sorted(cell.auroc, key=lambda m: -cell.auroc[m])
    return list(dict.fromkeys(named + ranked))[:n]
