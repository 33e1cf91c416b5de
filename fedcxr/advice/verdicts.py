"""Corrected verdicts of the regime map: "this cell's winner beats every other method", and pairs.

A cell of the map holds k methods run over the same planned seeds (each seed: its own initial
weights, batch order and draw of labeled target rows; the number of seeds fixed before any result
is seen and the same in every cell — no seeds added where a margin looks close). Two families of
claims are made from it, each with its family-wise error rate held at :data:`ALPHA`:

**The cell's verdict** (what ``fedcxr stats`` recommends). The winner ``w`` is the method with the
highest mean test AUROC. The claim "w is better than every other method of the cell" is an
intersection-union test (Berger 1982, *Technometrics* 24:295; Berger & Hsu 1996, *Statist. Sci.*
11:283): for each other method m, a one-sided paired t-test over the seeds of H0: μ_w ≤ μ_m, and
the claim's p-value is the largest of them — the union of the nulls is rejected only when every
one is. The winner is chosen by the same data, so the test is made for every method A of the
cell ("A beats every other"), and only the method with the highest mean can reach p < 0.5 (its
mean difference against each other method is positive; any other method's is not against the
winner): the k tests' rejections are disjoint events, and a Bonferroni factor k over them holds
the cell's error rate at α whichever method the data make the winner
(``p_best = min(1, k · max_m p_m)``). Across the cells of the map, Holm's step-down procedure
(Holm 1979, *Scand. J. Statist.* 6:65) adjusts the cells' ``p_best`` → ``p_adj``; a cell is
**resolved** when ``p_adj < α``. Conservative by construction — the price of a promise.

**Pair statements** (the tables' "tied with / behind the winner", a method against
FedAvg_Finetune). Every pair of methods of every cell gets a two-sided paired t-test; Holm over
all of them gives each pair's ``p_adj``. Because every pair is in the family, a pair picked after
seeing the data (the winner against the rest) is covered as well.

Paired t-tests assume roughly normal per-seed differences; with few seeds the p-values are only
as good as that assumption, and the margins' 95 % t-intervals are shown unadjusted beside them.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any, Mapping, Optional, Sequence

#: family-wise error rate of both families
ALPHA = 0.05

#: per method: seed → AUROC
BySeed = Mapping[int, float]


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean (NaN half-width below two values)."""
    from scipy import stats

    x = [float(v) for v in values if math.isfinite(float(v))]
    if not x:
        return math.nan, math.nan, math.nan
    mean = sum(x) / len(x)
    if len(x) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1)) * sd / math.sqrt(len(x))
    return mean, mean - half, mean + half


def paired_p(a: BySeed, b: BySeed, alternative: str = "greater") -> tuple[float, int]:
    """p-value of a paired t-test of ``a`` − ``b`` over the seeds both have, and that count.

    ``alternative``: ``greater`` (H0: mean difference ≤ 0) or ``two-sided``. Below two pairs the
    test cannot be made: p = 1. Differences all equal: p = 0 when the mean points the alternative's
    way, else 1 (the t statistic is infinite or undefined)."""
    from scipy import stats

    diffs = [float(a[s]) - float(b[s]) for s in a if s in b and math.isfinite(float(a[s])) and math.isfinite(float(b[s]))]
    n = len(diffs)
    if n < 2:
        return 1.0, n
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        hit = mean > 0 if alternative == "greater" else mean != 0
        return (0.0 if hit else 1.0), n
    t = mean / (sd / math.sqrt(n))
    if alternative == "greater":
        return float(stats.t.sf(t, n - 1)), n
    if alternative == "two-sided":
        return float(min(1.0, 2 * stats.t.sf(abs(t), n - 1))), n
    raise ValueError(f"alternative: greater or two-sided, got {alternative!r}")


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input's order; NaN stays NaN."""
    index = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(p)]
    ordered = sorted(index, key=lambda i: p_values[i])
    m, out, running = len(ordered), [math.nan] * len(p_values), 0.0
    for rank, i in enumerate(ordered):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        out[i] = running
    return out


def ranked(by_method: Mapping[str, BySeed]) -> list[str]:
    """Methods by mean AUROC over their seeds, best first (ties: name order, so a rerun is stable)."""
    def mean(m: str) -> float:
        values = [float(v) for v in by_method[m].values() if math.isfinite(float(v))]
        return sum(values) / len(values) if values else -math.inf

    return sorted(by_method, key=lambda m: (-mean(m), m))


def best_test(by_method: Mapping[str, BySeed]) -> dict[str, Any]:
    """The cell's winner and ``p_best``: the intersection-union p-value of "the winner beats every other
    method" (the largest one-sided paired p), times k for the winner's selection (module doc)."""
    order = ranked(by_method)
    if len(order) < 2:
        return {"winner": order[0] if order else None, "p_best": math.nan, "p_iut": math.nan, "k": len(order),
                "weakest": None}
    winner = order[0]
    tests = {m: paired_p(by_method[winner], by_method[m])[0] for m in order[1:]}
    weakest = max(tests, key=lambda m: tests[m])
    p_iut = tests[weakest]
    return {"winner": winner, "p_iut": p_iut, "p_best": min(1.0, len(order) * p_iut), "k": len(order),
            "weakest": weakest}


def adjust_cells(p_best: Sequence[float], alpha: float = ALPHA) -> list[tuple[float, bool]]:
    """(``p_adj``, resolved) per cell: Holm over the cells' ``p_best``."""
    adjusted = holm(p_best)
    return [(p, bool(math.isfinite(p) and p < alpha)) for p in adjusted]


def pair_tests(cells: Mapping[Any, Mapping[str, BySeed]], alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Every pair of methods of every cell: the mean paired difference (first − second, the first the
    higher mean), the seeds paired, the two-sided p and Holm's ``p_adj`` over all pairs of all cells."""
    rows = []
    for key, by_method in cells.items():
        order = ranked(by_method)
        for a, b in combinations(order, 2):
            p, n = paired_p(by_method[a], by_method[b], "two-sided")
            diffs = [by_method[a][s] - by_method[b][s] for s in by_method[a] if s in by_method[b]]
            rows.append({"cell": key, "a": a, "b": b, "n": n, "diff": sum(diffs) / len(diffs) if diffs else math.nan,
                         "p": p})
    for row, p_adj in zip(rows, holm([r["p"] for r in rows])):
        row["p_adj"] = p_adj
        row["significant"] = bool(math.isfinite(p_adj) and p_adj < alpha)
    return rows


def pair_lookup(rows: Sequence[dict]) -> dict[tuple, dict]:
    """``(cell, a, b)`` → the pair's row, either order of ``a`` and ``b``."""
    out = {}
    for row in rows:
        out[(row["cell"], row["a"], row["b"])] = row
        out[(row["cell"], row["b"], row["a"])] = row
    return out


def selected_regret(by_method: Mapping[str, BySeed], selected: BySeed,
                    winner: Optional[str] = None) -> dict[str, Any]:
    """The chooser's regret in a cell: winner − Selected, paired over seeds (mean and 95 % t-interval).

    ``selected``: seed → the test AUROC of the method the chooser picked with that seed's labels.
    Descriptive (no multiplicity correction: no recommendation rests on it)."""
    winner = winner or ranked(by_method)[0]
    diffs = [by_method[winner][s] - selected[s] for s in selected if s in by_method[winner]]
    mean, lo, hi = t_interval(diffs)
    return {"winner": winner, "n": len(diffs), "regret": mean, "lo": lo, "hi": hi}
