"""The regime map of issue 18 §3 on real PneumoniaMNIST, in parts: which method wins where.

The grid (fixed before any of its results was seen):

* shift type: ``none``; ``mix4`` (pixel: gamma 2.5, blur σ 0.05 of the side, noise σ 0.15 on the
  target — the covariate-shift sweep's strongest level); ``shortcut`` (a corner marker on 95 % of
  pneumonia / 5 % of normal images at every source, reversed at the target: the FedGP papers'
  ColoredMNIST −90 % case); ``labelnoise40`` (every source's training labels flipped at rate 0.4);
* target labels 10, 25, 50, 100, 500 (the same nested rows for every method and seed);
* rounds 20, 50 (counting the warm-up rounds);
* methods :data:`METHODS`; 3 seeds, and 5 seeds for a cell's winner and runner-up where their
  margin is under 0.03 (repeated while the new seeds change who they are).

Sites: ``bench_regime.py``'s sources (the official *train* rows dealt to 3 sites by patient hash,
~1,400 training rows each) and a target built from the official *val + test* rows (1,145 images,
50/10/40 by patient hash: 533 training rows — enough for 500 labels — 108 validation, 504 test).
Every run: ``bench_regime.REGIME_CONFIG`` (resnet_tiny, 28 px, sources Adam lr 1e-3, 8 steps of 32
a round; target lr 2e-4, one pass over its labeled rows a round, each method's default target batch
size), scored on the target's 504 test images.

Each part trains at most ~30 minutes on 2 shared cores; finished runs are skipped, so the parts can
be run in any order, interrupted and re-run. From scratch::

    python benchmarks/regime_map.py --list                      # the parts, one per line
    for part in $(python benchmarks/regime_map.py --list); do
        nice -n 10 python benchmarks/regime_map.py --part "$part" --workers 2
    done
    python benchmarks/regime_map.py --tables                    # CSVs, Markdown, heatmap
    python benchmarks/build_regime_map.py                       # fedcxr/advice/regime_map.csv

Outputs (``benchmarks/results/``): ``regime_map_runs.csv`` (one row per run),
``regime_map_cells.csv`` (cell × method: mean, 95 % t-interval, n), ``regime_map_pairs.csv`` (each
cell's winner against every other method, paired by seed), ``regime_map_papers.csv`` (each papers'
method per cell: behind the winner or tied with it, and against FedAvg_Finetune), ``regime_map.md``
(every cell, every method), ``regime_map_summary.md`` (BENCHMARKS.md's tables) and ``regime_map.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_regime  # noqa: E402
import bench_shift  # noqa: E402

REPO = HERE.parent
SHIFTS = ["none", "mix4", "shortcut", "labelnoise40"]
LABELS = [10, 25, 50, 100, 500]
ROUNDS = [20, 50]
#: parts of the label axis (each part: one shift × one rounds value × one group)
LABEL_GROUPS = {"few": [10, 25], "mid": [50, 100], "500": [500]}
METHODS = ["Target_Only", "Finetune_Offline", "FedAvg", "FedAvg_Finetune", "FedDA", "FedDA_Auto", "FedGP",
           "FedGP_Auto", "FedAvg_Finetune_GP", "FedProx_Finetune", "SCAFFOLD_Finetune", "FedAdam_Finetune"]
#: the papers' methods (FedDA/FedGP and their auto versions: Jiang et al.; GP: the AuxInfo+GP paper)
PAPERS = ["FedDA", "FedDA_Auto", "FedGP", "FedGP_Auto", "FedAvg_Finetune_GP"]
SEEDS, CLOSE_SEEDS, CLOSE = 3, 5, 0.03
TARGET_FROM, TARGET_SPLIT = ["val", "test"], [0.5, 0.1, 0.4]
VARIANT, STEM = "map", "regime_map"
#: the map's shift names (fedcxr/advice/regime.py SHIFT_TYPES) for the grid's
SHIFT_TYPE = {"none": "none", "mix4": "pixel", "shortcut": "shortcut", "labelnoise40": "label_noise"}


def parts(shifts: Sequence[str] = SHIFTS, rounds: Sequence[int] = ROUNDS) -> dict[str, tuple[str, list[int], int]]:
    """Part name → (shift, labels, rounds); the 20-round parts first (they decide nothing about the 50-round ones)."""
    return {f"{s}-r{r}-{g}": (s, labels, r) for r in rounds for s in shifts for g, labels in LABEL_GROUPS.items()}


def part_argv(shift: str, labels: Sequence[int], rounds: int, *, work: Path, out: Path, workers: int,
              methods: Sequence[str] = METHODS, seeds: int = SEEDS, close_seeds: int = CLOSE_SEEDS,
              npz: Optional[Path] = None, extra: Sequence[str] = ()) -> list[str]:
    """``bench_regime.py`` arguments of one part."""
    argv = ["--work", str(work), "--out", str(out), "--stem", STEM, "--variant", VARIANT,
            "--target-from", *TARGET_FROM, "--target-split", *map(str, TARGET_SPLIT),
            "--shifts", shift, "--labels", *map(str, labels), "--rounds", str(rounds),
            "--methods", *methods, "--seeds", str(seeds), "--close-seeds", str(close_seeds), "--close", str(CLOSE),
            "--workers", str(workers), *extra]
    return argv + (["--npz", str(npz)] if npz else [])


# --------------------------------------------------------------------------- tables


def papers_table(runs: pd.DataFrame, pairs: pd.DataFrame, papers: Sequence[str] = PAPERS,
                 baseline: str = "FedAvg_Finetune") -> pd.DataFrame:
    """Each papers' method per cell: its mean, where it stands against the cell's winner (``winner``,
    ``tied`` — the paired interval of winner − it includes 0 — or ``behind``) and against ``baseline``
    (paired: ``better``, ``same`` or ``worse``)."""
    rows = []
    for key, cell in runs.groupby(bench_regime.CELL):
        by_seed = cell.pivot_table(index="seed", columns="method", values="auroc")
        mine = pairs.loc[(pairs[bench_regime.CELL] == pd.Series(dict(zip(bench_regime.CELL, key)))).all(axis=1)]
        for method in papers:
            if method not in by_seed:
                continue
            row = {**dict(zip(bench_regime.CELL, key)), "method": method, "mean": by_seed[method].mean()}
            versus = mine.loc[mine["other"] == method]
            if versus.empty:
                row.update(vs_winner="winner", winner_minus=0.0, winner_lo=np.nan, winner_hi=np.nan)
            else:
                v = versus.iloc[0]
                row.update(vs_winner="behind" if v["verdict"] == "resolved" else "tied",
                           winner_minus=v["diff"], winner_lo=v["lo"], winner_hi=v["hi"])
            if baseline in by_seed and method != baseline:
                both = by_seed[[method, baseline]].dropna()
                mean, lo, hi = bench_shift.t_interval((both[method] - both[baseline]).tolist())
                verdict = "better" if lo > 0 else "worse" if hi < 0 else "same"
                row.update(vs_baseline=verdict, baseline_diff=mean, baseline_lo=lo, baseline_hi=hi)
            rows.append(row)
    columns = [*bench_regime.CELL, "method", "mean", "vs_winner", "winner_minus", "winner_lo", "winner_hi",
               "vs_baseline", "baseline_diff", "baseline_lo", "baseline_hi"]
    return pd.DataFrame(rows, columns=columns)  # the columns even without a papers' method (the smoke test's cell)


def winners(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: winner, runner-up, margin and paired interval (:func:`fedcxr.advice.cells.cell_row`);
    ``n_seeds``: the seeds the winner and runner-up were paired over."""
    from fedcxr.advice.cells import cell_row

    rows = []
    for (shift, labels, rounds), cell in runs.groupby(bench_regime.CELL):
        row = cell_row(cell.to_dict("records"), shift=shift, target_labels=labels, rounds=rounds, source="")
        if row["winner"] and row["runner_up"]:  # the seeds the two were paired over (5 where close, else 3)
            by_seed = cell.pivot_table(index="seed", columns="method", values="auroc")
            row["n_seeds"] = int(by_seed[[row["winner"], row["runner_up"]]].dropna().shape[0])
        rows.append({k: row[k] for k in ("shift", "target_labels", "rounds", "winner", "runner_up", "margin",
                                         "ci_low", "ci_high", "resolved", "n_seeds")})
    return pd.DataFrame(rows)


def heatmap(cells: pd.DataFrame, path: Path, methods: Sequence[str] = METHODS) -> None:
    """Rows: shift × rounds; columns: target labels. Each cell: the winner (colour), its margin over
    the runner-up with the paired 95 % interval, and whether that is resolved (solid) or not (hatched,
    the runner-up named)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    palette = dict(zip(methods, plt.get_cmap("tab20").colors[::1][:len(methods)]))
    labels_axis = sorted(set(LABELS) | set(cells["target_labels"].astype(int)))
    row_keys = [(s, r) for s in SHIFTS for r in sorted(set(ROUNDS) | set(cells["rounds"].astype(int)))]
    fig, ax = plt.subplots(figsize=(15, 10.5))
    for i, (shift, rounds) in enumerate(row_keys):
        for j, labels in enumerate(labels_axis):
            hit = cells.loc[(cells["shift"] == shift) & (cells["target_labels"] == labels) & (cells["rounds"] == rounds)]
            y = len(row_keys) - 1 - i
            if hit.empty:
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor="white", edgecolor="grey"))
                ax.text(j + 0.5, y + 0.5, "not run", ha="center", va="center", fontsize=8, color="grey")
                continue
            c = hit.iloc[0]
            resolved = str(c["resolved"]).lower() == "true"
            colour = palette.get(c["winner"], (0.8, 0.8, 0.8))
            ax.add_patch(Rectangle((j, y), 1, 1, facecolor=colour, alpha=1.0 if resolved else 0.45,
                                   hatch=None if resolved else "//", edgecolor="white", linewidth=2))
            interval = f" [{float(c['ci_low']):+.3f}, {float(c['ci_high']):+.3f}]" if c["ci_low"] != "" else ""
            lines = [f"{c['winner']}",
                     f"+{float(c['margin']):.3f}{interval}",
                     ("resolved" if resolved else f"≈ {c['runner_up']}") + f" (n={int(c['n_seeds'])})"]
            ax.text(j + 0.5, y + 0.5, "\n".join(lines), ha="center", va="center", fontsize=7.5,
                    fontweight="bold" if resolved else "normal")
    ax.set_xlim(0, len(labels_axis))
    ax.set_ylim(0, len(row_keys))
    ax.set_xticks(np.arange(len(labels_axis)) + 0.5, [str(n) for n in labels_axis])
    ax.set_yticks(np.arange(len(row_keys)) + 0.5,
                  [f"{SHIFT_TYPE[s]} ({s}), {r} rounds" for s, r in reversed(row_keys)])
    ax.set_xlabel("labeled target training rows (the same for every method)")
    ax.set_title("PneumoniaMNIST regime map: winner by mean target test AUROC; margin over the runner-up, paired "
                 "95 % t-interval over seeds\nsolid = resolved (interval excludes 0); hatched = unresolved "
                 "(the runner-up named)", fontsize=10)
    for spine in ax.spines.values():
        spine.set_visible(False)
    used = [m for m in methods if m in set(cells["winner"])]
    ax.legend(handles=[Patch(facecolor=palette[m], label=m) for m in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.07), ncol=min(len(used), 6), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.2, right=0.98, top=0.93, bottom=0.12)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_markdown(cells: pd.DataFrame, runs: pd.DataFrame, papers: pd.DataFrame) -> str:
    """BENCHMARKS.md's tables: one line per cell (winner, runner-up, margin, the best papers' method and
    Target_Only), and per papers' method the cells where it wins, ties with the winner or is behind it,
    and where it beats, matches or loses to FedAvg_Finetune."""
    means = runs.groupby([*bench_regime.CELL, "method"])["auroc"].mean()
    out = ["| shift | rounds | labels | winner | runner-up | winner − runner-up [95 %], seeds | best papers' method: "
           "mean, winner − it [95 %] | Target_Only | FedAvg_Finetune |", "|---|---|---|---|---|---|---|---|---|"]
    order = {s: i for i, s in enumerate(SHIFTS)}
    cells = cells.sort_values(["shift", "rounds", "target_labels"], key=lambda c: c.map(order) if c.name == "shift" else c)
    for _, c in cells.iterrows():
        key = (c["shift"], int(c["target_labels"]), int(c["rounds"]))
        mine = papers.loc[(papers["shift"] == key[0]) & (papers["labels"] == key[1]) & (papers["rounds"] == key[2])]
        best = mine.sort_values("mean", ascending=False).iloc[0] if len(mine) else None
        resolved = str(c["resolved"]).lower() == "true"
        interval = f" [{float(c['ci_low']):+.3f}, {float(c['ci_high']):+.3f}]" if c["ci_low"] != "" else ""
        margin = f"{'**' if resolved else ''}+{float(c['margin']):.3f}{interval}{'**' if resolved else ''}, {int(c['n_seeds'])}"
        if best is None:
            paper = ""
        elif best["vs_winner"] == "winner":
            paper = f"{best['method']} {best['mean']:.3f} (the winner)"
        else:
            paper = (f"{best['method']} {best['mean']:.3f}, {best['winner_minus']:+.3f} [{best['winner_lo']:+.3f}, "
                     f"{best['winner_hi']:+.3f}] ({best['vs_winner']})")
        def mean_of(m):
            return f"{means.get((*key, m)):.3f}" if (*key, m) in means.index else ""
        out.append(f"| {SHIFT_TYPE[key[0]]} | {key[2]} | {key[1]} | {c['winner']} {mean_of(c['winner'])} | "
                   f"{c['runner_up']} {mean_of(c['runner_up'])} | {margin} | {paper} | {mean_of('Target_Only')} | "
                   f"{mean_of('FedAvg_Finetune')} |")
    out += ["", "| papers' method | wins (resolved / not) | tied with the winner | behind the winner | vs FedAvg_Finetune: "
            "better / same / worse |", "|---|---|---|---|---|"]
    for method in PAPERS:
        mine = papers.loc[papers["method"] == method]
        wins = mine.loc[mine["vs_winner"] == "winner"]
        resolved_wins = sum(str(r).lower() == "true" for r in cells.loc[cells["winner"] == method, "resolved"])
        counts = mine["vs_baseline"].value_counts()
        out.append(f"| {method} | {len(wins)} ({resolved_wins} / {len(wins) - resolved_wins}) | "
                   f"{(mine['vs_winner'] == 'tied').sum()} | {(mine['vs_winner'] == 'behind').sum()} | "
                   f"{counts.get('better', 0)} / {counts.get('same', 0)} / {counts.get('worse', 0)} |")
    return "\n".join(out) + "\n"


def log_part(path: Path, name: str, started: float, new_runs: int) -> None:
    """Append one line to the parts log: which part, when, how long, how many new runs, on which commit, load."""
    import os
    import subprocess

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    row = pd.DataFrame([{"part": name, "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
                         "wall_s": round(time.time() - started), "new_runs": new_runs, "commit": commit,
                         "load_1min_at_end": round(os.getloadavg()[0], 1)}])
    row.to_csv(path, mode="a", header=not path.exists(), index=False)


def write_tables(work: Path, out: Path, meta: dict) -> pd.DataFrame:
    """Every finished run of the map → the CSVs, ``regime_map.md`` and ``regime_map.png``."""
    runs = bench_regime.collect(work, VARIANT)
    runs = runs.loc[runs["method"].isin(METHODS) & runs["shift"].isin(SHIFTS)]
    bench_regime.write_outputs(runs, out, STEM, METHODS, meta)
    pairs = pd.read_csv(out / f"{STEM}_pairs.csv")
    papers = papers_table(runs, pairs)
    papers.to_csv(out / f"{STEM}_papers.csv", index=False)
    cells = winners(runs)
    cells.to_csv(out / f"{STEM}_winners.csv", index=False)
    heatmap(cells, out / f"{STEM}.png")
    (out / f"{STEM}_summary.md").write_text(summary_markdown(cells, runs, papers))
    print(f"{len(runs)} runs in {len(cells)} cells → {out}/{STEM}_*.csv, {STEM}.md, {STEM}.png")
    return runs


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print the parts, one per line")
    what.add_argument("--part", nargs="+", metavar="PART", help="train these parts (names from --list)")
    what.add_argument("--tables", action="store_true", help="write the tables and the heatmap from every finished run")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "regime_map")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--npz", type=Path, default=None, help="PneumoniaMNIST npz (default: ../shared/data/medmnist)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse(argv)
    known = parts()
    if args.list:
        print("\n".join(known))
        return
    meta = {"grid": {"shifts": SHIFTS, "labels": LABELS, "rounds": ROUNDS, "methods": METHODS, "seeds": SEEDS,
                     "close_seeds": CLOSE_SEEDS, "close": CLOSE, "target_from": TARGET_FROM,
                     "target_split": TARGET_SPLIT},
            "config": bench_regime.REGIME_CONFIG, "method_overrides": bench_regime.METHOD_OVERRIDES}
    if args.tables:
        write_tables(args.work, args.out, meta)
        return
    unknown = [p for p in args.part if p not in known]
    if unknown:
        raise SystemExit(f"--part: unknown part(s) {unknown}; see --list")
    for name in args.part:
        shift, labels, rounds = known[name]
        print(f"== part {name}: {shift}, labels {labels}, {rounds} rounds", flush=True)
        started, before = time.time(), len(bench_regime.collect(args.work, VARIANT))
        bench_regime.main(part_argv(shift, labels, rounds, work=args.work, out=args.work / "part_tables",
                                    workers=args.workers, npz=args.npz))
        log_part(args.out / f"{STEM}_parts.csv", name, started, len(bench_regime.collect(args.work, VARIANT)) - before)
    write_tables(args.work, args.out, {**meta, "last_parts": args.part})
    print(json.dumps({"parts": args.part}))


if __name__ == "__main__":
    main()
