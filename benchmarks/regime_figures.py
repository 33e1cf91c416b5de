"""The regime map's heatmap and BENCHMARKS.md's summary tables, from ``regime_tables.verdict_table``'s rows.

A cell is *resolved* only by the corrected test (Holm's ``p_adj`` < 0.05 for "the winner beats every
other method", :mod:`fedcxr.advice.verdicts`); the margin's 95 % t-interval is shown unadjusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

CELL = ["shift", "labels", "rounds"]


def _resolved(value) -> bool:
    return str(value).lower() == "true"


def heatmap(verdicts: pd.DataFrame, path: Path, methods: Sequence[str], shifts: Sequence[str], rounds: Sequence[int],
            labels: Sequence[int], shift_type: Mapping[str, str]) -> None:
    """Rows: shift × rounds; columns: target labels. Each cell: the winner (colour), its margin over the
    runner-up [unadjusted 95 %], Holm's p_adj; solid when resolved, hatched (the runner-up named) when not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    palette = dict(zip(methods, plt.get_cmap("tab20").colors[:len(methods)]))
    labels_axis = sorted(set(labels) | set(verdicts["labels"].astype(int)))
    row_keys = [(s, r) for s in shifts for r in sorted(set(rounds) | set(verdicts["rounds"].astype(int)))]
    fig, ax = plt.subplots(figsize=(15, 10.5))
    for i, (shift, n_rounds) in enumerate(row_keys):
        for j, n_labels in enumerate(labels_axis):
            hit = verdicts.loc[(verdicts["shift"] == shift) & (verdicts["labels"] == n_labels)
                               & (verdicts["rounds"] == n_rounds)]
            y = len(row_keys) - 1 - i
            if hit.empty:
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor="white", edgecolor="grey"))
                ax.text(j + 0.5, y + 0.5, "not run", ha="center", va="center", fontsize=8, color="grey")
                continue
            c = hit.iloc[0]
            resolved = _resolved(c["resolved"])
            ax.add_patch(Rectangle((j, y), 1, 1, facecolor=palette.get(c["winner"], (0.8, 0.8, 0.8)),
                                   alpha=1.0 if resolved else 0.45, hatch=None if resolved else "//",
                                   edgecolor="white", linewidth=2))
            interval = f" [{c['lo']:+.3f}, {c['hi']:+.3f}]" if np.isfinite(c["lo"]) else ""
            lines = [str(c["winner"]), f"+{c['margin']:.3f}{interval}",
                     ("resolved" if resolved else f"≈ {c['runner_up']}") + f", p_adj {c['p_adj']:.2g} (n={int(c['n_seeds'])})"]
            ax.text(j + 0.5, y + 0.5, "\n".join(lines), ha="center", va="center", fontsize=7.5,
                    fontweight="bold" if resolved else "normal")
    ax.set_xlim(0, len(labels_axis))
    ax.set_ylim(0, len(row_keys))
    ax.set_xticks(np.arange(len(labels_axis)) + 0.5, [str(n) for n in labels_axis])
    ax.set_yticks(np.arange(len(row_keys)) + 0.5,
                  [f"{shift_type.get(s, s)} ({s}), {r} rounds" for s, r in reversed(row_keys)])
    ax.set_xlabel("labeled target training rows (the same count for every method; each seed its own draw)")
    ax.set_title("PneumoniaMNIST regime map: winner by mean target test AUROC; margin over the runner-up, paired "
                 "95 % t-interval over seeds (unadjusted)\nsolid = resolved (Holm p_adj < 0.05 for 'the winner beats "
                 "every other method'); hatched = unresolved (the runner-up named)", fontsize=10)
    for spine in ax.spines.values():
        spine.set_visible(False)
    used = [m for m in methods if m in set(verdicts["winner"])]
    ax.legend(handles=[Patch(facecolor=palette[m], label=m) for m in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.07), ncol=max(1, min(len(used), 6)), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.2, right=0.98, top=0.93, bottom=0.12)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_markdown(verdicts: pd.DataFrame, runs: pd.DataFrame, papers: pd.DataFrame, shifts: Sequence[str],
                     shift_type: Mapping[str, str], papers_methods: Sequence[str]) -> str:
    """BENCHMARKS.md's tables: one line per cell (winner, runner-up, margin, Holm's p_adj, the chooser's
    regret, the best papers' method, Target_Only, FedAvg_Finetune), and per papers' method the cells
    where it wins, ties with the winner or is behind it, and against FedAvg_Finetune."""
    means = runs.groupby([*CELL, "method"])["auroc"].mean()
    out = ["| shift | rounds | labels | winner | runner-up | winner − runner-up [95 %], seeds | p_adj | Selected: "
           "regret [95 %] | best papers' method: mean, winner − it | Target_Only | FedAvg_Finetune |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {s: i for i, s in enumerate(shifts)}
    ordered = verdicts.sort_values(["shift", "rounds", "labels"], key=lambda c: c.map(order) if c.name == "shift" else c)
    for _, c in ordered.iterrows():
        key = (c["shift"], int(c["labels"]), int(c["rounds"]))
        mine = papers.loc[(papers["shift"] == key[0]) & (papers["labels"] == key[1]) & (papers["rounds"] == key[2])]
        best = mine.sort_values("mean", ascending=False).iloc[0] if len(mine) else None
        bold = "**" if _resolved(c["resolved"]) else ""
        interval = f" [{c['lo']:+.3f}, {c['hi']:+.3f}]" if np.isfinite(c["lo"]) else ""
        margin = f"{bold}+{c['margin']:.3f}{interval}{bold}, {int(c['n_seeds'])}"
        regret = (f"{c['selected_regret']:+.3f} [{c['selected_lo']:+.3f}, {c['selected_hi']:+.3f}]"
                  if pd.notna(c.get("selected_regret")) else "not run")
        if best is None:
            paper = ""
        elif best["vs_winner"] == "winner":
            paper = f"{best['method']} {best['mean']:.3f} (the winner)"
        else:
            paper = f"{best['method']} {best['mean']:.3f}, {best['winner_minus']:+.3f} ({best['vs_winner']})"

        def mean_of(m: str) -> str:
            return f"{means.get((*key, m)):.3f}" if (*key, m) in means.index else ""

        out.append(f"| {shift_type.get(key[0], key[0])} | {key[2]} | {key[1]} | {c['winner']} {mean_of(c['winner'])} | "
                   f"{c['runner_up']} {mean_of(c['runner_up'])} | {margin} | {c['p_adj']:.2g} | {regret} | {paper} | "
                   f"{mean_of('Target_Only')} | {mean_of('FedAvg_Finetune')} |")
    out += ["", "| papers' method | wins (resolved / not) | tied with the winner | behind the winner | vs FedAvg_Finetune: "
            "better / same / worse (Holm) |", "|---|---|---|---|---|"]
    for method in papers_methods:
        mine = papers.loc[papers["method"] == method]
        wins = mine.loc[mine["vs_winner"] == "winner"]
        resolved_wins = sum(_resolved(r) for r in verdicts.loc[verdicts["winner"] == method, "resolved"])
        counts = mine["vs_baseline"].value_counts()
        out.append(f"| {method} | {len(wins)} ({resolved_wins} / {len(wins) - resolved_wins}) | "
                   f"{(mine['vs_winner'] == 'tied').sum()} | {(mine['vs_winner'] == 'behind').sum()} | "
                   f"{counts.get('better', 0)} / {counts.get('same', 0)} / {counts.get('worse', 0)} |")
    return "\n".join(out) + "\n"
