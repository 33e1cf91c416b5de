"""Robust aggregation and reply screening against one hostile site (real PneumoniaMNIST).

Issue 19's question, measured: what does each ``aggregation.rule`` cost in AUROC when every site
is honest, and what does it save when one of five sites is hostile in every round — by itself
(every ``defences:`` check off) and with the default reply checks?

Setting (sites from ``pneumoniamnist_merged.npz`` exactly as ``bench_shift.py`` builds them):

* **sources** ``site-1..site-5``: the official *train* rows dealt to five sites by patient hash
  (IID), 90/10 train/val inside each;
* **scored on** the official *test* rows (the ``target-base`` site of ``bench_shift.py``, its
  test split; the target never trains: the method is FedAvg over the sources);
* **attacks** (``benchmarks/hostile_sites.py``, site-1, every round): ``none``; ``huge`` (every
  weight of its model 1e30); ``inflate`` (claims 10¹² training rows); ``flip`` (θ0 − 10·Δ, a
  sign-flipped update ten times its size);
* **rules**: ``mean`` (FedAvg), ``median``, ``trimmed_mean`` (β 0.2: one of five cut per
  side), ``krum`` and ``multi_krum`` (f = 1), ``clip`` (norm bound = the round's median
  update norm);
* **grid**: every rule honest (the checks refuse nothing there: on or off, the same model bit
  for bit); every rule against every attack with every check off (``<rule>_undefended``, the
  rule alone; ``mean_undefended`` is the code before issue 19); the default ``mean`` with the
  default checks against every attack (``--defended``: which rules run that way).

A run that stops (its round failed, or the suspect rule stopped it) or ends with a model that
predicts NaN is counted as failed and scored 0.5 (no usable model); the table says how many
seeds failed.

Re-run (≈ 17 min with ``--workers 2`` on 2 cores shared with other jobs)::

    nice -n 10 python benchmarks/bench_robust.py --work runs/bench_robust --out benchmarks/results --workers 2

Finished runs are skipped, so an interrupted benchmark continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # real modules: the worker processes import them
import bench_shift  # noqa: E402
import hostile_sites  # noqa: E402

REPO = HERE.parent
HOSTILE = "site-1"
ATTACKS = {"none": None, "huge": "huge", "inflate": "inflate", "flip": "flip"}
OFF = {"check_counts": False, "check_variance": False, "norm_factor": None, "norm_limit": None,
       "stop_on_suspect": False, "bn_factor": None, "max_share": None}
UNDEFENDED = "_undefended"
#: rule → its ``aggregation`` block
RULES: dict[str, dict] = {
    "mean": {"rule": "mean"},
    "median": {"rule": "median"},
    "trimmed_mean": {"rule": "trimmed_mean", "trim": 0.2},
    "krum": {"rule": "krum", "byzantine": 1},
    "multi_krum": {"rule": "multi_krum", "byzantine": 1},
    "clip": {"rule": "clip"},
}
#: One config for every run (bench_shift's network and budgets; fixed before any result was seen).
BASE_CONFIG: dict = {**bench_shift.BASE_CONFIG, "name": "robust", "strategy": "FedAvg"}

log = logging.getLogger("bench_robust")


def run_config(manifests: Path, work: Path, n_sources: int, rounds: int, label: str, seed: int) -> dict:
    """The run's config; ``label`` = a rule, or ``<rule>_undefended`` (every ``defences:`` check off)."""
    rule = label.removesuffix(UNDEFENDED)
    cfg = json.loads(json.dumps(BASE_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()), "sites": [f"site-{k}" for k in range(1, n_sources + 1)],
                "target": "target-base", "cache_dir": str((work / "cache").resolve()), "rounds": rounds,
                "seed": seed, "eval_every": 0, "aggregation": dict(RULES[rule])})
    if label.endswith(UNDEFENDED):
        cfg["defences"] = dict(OFF)
    return cfg


def grid(rules: Sequence[str], attacks: Sequence[str], defended: Sequence[str]) -> list[tuple[str, str]]:
    """``(label, attack)`` pairs: each rule honest; each rule undefended against each attack; the
    ``defended`` rules with the default checks against each attack."""
    pairs = [(rule, "none") for rule in rules] if "none" in attacks else []
    hostile = [a for a in attacks if a != "none"]
    pairs += [(rule + UNDEFENDED, attack) for rule in rules for attack in hostile]
    pairs += [(rule, attack) for rule in defended for attack in hostile]
    return pairs


def run_one(job: tuple) -> dict:
    """One (rule, attack, seed) run in a worker: train through the hostile transport, score on test."""
    import torch

    from fedcxr.workflows.evaluate import evaluate_run
    from fedcxr.errors import RunFailed, UserError
    from fedcxr.pipeline.config import load_config

    data, run_dir, attack, threads = job
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.ERROR)
    run_dir = Path(run_dir)
    done = run_dir / "bench_result.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)  # a run interrupted before it was scored starts again
    faults = {HOSTILE: {"*": ATTACKS[attack]}} if ATTACKS[attack] else {}
    t0 = time.time()
    result = {"status": "finished", "auroc": float("nan"), "refused": 0, "error": ""}
    try:
        run = hostile_sites.hostile_run(load_config(data=data), run_dir, faults)
        result["refused"] = len(run["refused"])
        if poisoned(run_dir):
            result.update(status="broken", error="the final model holds NaN/Inf or weights above 1e20")
        else:
            report = evaluate_run(run_dir, split="test", n_boot=0)
            value = report["sites"][run["eval_sites"][0]].get("mean_auroc")
            result["auroc"] = float(value) if value is not None else float("nan")
    except UserError as exc:  # evaluate refuses predictions that are not probabilities (NaN): a diverged model
        result.update(status="broken", error=str(exc)[:300])
    except RunFailed as exc:
        result.update(status="failed", error=str(exc)[:300])
    result["error"] = result["error"].replace(str(run_dir), "RUN_DIR")
    if result["status"] == "finished" and not np.isfinite(result["auroc"]):
        result["status"] = "broken"
    if result["status"] != "finished":
        result["auroc"] = 0.5  # no usable model: chance
    result["seconds"] = round(time.time() - t0, 1)
    run_dir.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(result))
    return result


def poisoned(run_dir: Path) -> bool:
    """The final model holds NaN/Inf or weights no training produces (a 1e30 update got in)."""
    import torch

    state = torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)["global"]
    return any(not bool(torch.isfinite(v).all()) or float(v.abs().max()) > 1e20
               for v in state.values() if v.is_floating_point() and v.numel())


def run_all(args) -> pd.DataFrame:
    manifests = bench_shift.prepare_sites(args.npz, args.work, n_sources=args.sources,
                                          target_split=[0.45, 0.15, 0.40])
    first = run_config(manifests, args.work, args.sources, args.rounds, "mean", 0)
    config = args.work / "warm.yaml"
    config.write_text(json.dumps(first))
    bench_shift.warm_caches(config)  # decode every site once before parallel runs
    jobs, keys = [], []
    for label, attack in grid(args.rules, args.attacks, args.defended):
        for seed in range(args.seeds):
            run_dir = args.work / "runs" / f"{label}-{attack}-seed{seed}"
            data = run_config(manifests, args.work, args.sources, args.rounds, label, seed)
            jobs.append((data, str(run_dir), attack, args.threads))
            keys.append({"rule": label, "attack": attack, "seed": seed})
    if args.workers <= 1:
        results = [run_one(job) for job in jobs]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(run_one, jobs))
    return pd.DataFrame([{**k, **r} for k, r in zip(keys, results)])


# --------------------------------------------------------------------------- summary


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (rule, attack), group in frame.groupby(["rule", "attack"], sort=False):
        mean, lo, hi = bench_shift.t_interval(group["auroc"].tolist())
        rows.append({"rule": rule, "attack": attack, "n": len(group), "mean": mean, "lo": lo, "hi": hi,
                     "failed": int((group["status"] != "finished").sum()),
                     "refused_per_run": float(group["refused"].mean())})
    return pd.DataFrame(rows)


def _cell(table: pd.DataFrame, rule: str, attack: str) -> str:
    row = table.loc[(table["rule"] == rule) & (table["attack"] == attack)]
    if row.empty:
        return "–"
    r = row.iloc[0]
    text = f"{r['mean']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]" if np.isfinite(r["lo"]) else f"{r['mean']:.3f}"
    if r["failed"]:
        text += f" ({int(r['failed'])}/{int(r['n'])} failed)"
    if r["refused_per_run"]:
        text += f", {r['refused_per_run']:.3g} refused/run"
    return text


def markdown(table: pd.DataFrame, rules: Sequence[str], attacks: Sequence[str], *, undefended: bool) -> str:
    """Rows: rules; columns: attacks. The honest column is the rule's own run (checks on or off:
    the same model), the attack columns the undefended or the defended runs."""
    lines = ["| rule | " + " | ".join(f"{a}" for a in attacks) + " |", "|---|" + "---|" * len(attacks)]
    for rule in rules:
        label = rule + UNDEFENDED if undefended else rule
        if not undefended and table.loc[(table["rule"] == rule) & (table["attack"] != "none")].empty:
            continue
        cells = [_cell(table, rule if a == "none" else label, a) for a in attacks]
        lines.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(frame: pd.DataFrame, rules: Sequence[str]) -> str:
    """Each rule's honest-run AUROC minus the defended mean's, paired by seed."""
    lines = ["| rule | honest AUROC − `mean` (paired over seeds) |", "|---|---|"]
    honest = frame.loc[frame["attack"] == "none"]
    base = honest.loc[honest["rule"] == "mean"].set_index("seed")["auroc"]
    for rule in rules:
        if rule == "mean":
            continue
        x = honest.loc[honest["rule"] == rule].set_index("seed")["auroc"]
        both = x.index.intersection(base.index)
        mean, lo, hi = bench_shift.t_interval((x[both] - base[both]).tolist())
        text = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" if np.isfinite(lo) else f"{mean:+.3f}"
        lines.append(f"| `{rule}` | {text} |")
    return "\n".join(lines)


def write_outputs(frame: pd.DataFrame, args, wall: float) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / f"{args.stem}_runs.csv", index=False)
    table = summary(frame)
    table.to_csv(out / f"{args.stem}.csv", index=False)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    text = [
        f"# One hostile site of {args.sources}: robust rules and reply checks (PneumoniaMNIST)",
        "",
        f"FedAvg over {args.sources} IID sources (official train rows), {args.rounds} rounds, resnet_tiny at "
        f"28 px, {args.seeds} seeds; mean test AUROC on the official test rows with a 95% t-interval over "
        f"seeds. `{HOSTILE}` is hostile in every round. A failed run (a round failed, the run stopped naming "
        "the suspect, or its model predicts NaN) scores 0.5.",
        "",
        "Each rule alone (every `defences:` check off; `mean` is then the code before issue 19):",
        "",
        markdown(table, args.rules, args.attacks, undefended=True),
        "",
        "With the default `defences:` (the checks refuse the hostile replies before any rule sees them):",
        "",
        markdown(table, args.rules, args.attacks, undefended=False),
        "",
        "Cost with honest sites (paired over seeds):",
        "",
        cost_table(frame, args.rules),
        "",
        f"Command: `nice -n 10 python benchmarks/bench_robust.py --seeds {args.seeds} --rounds {args.rounds} "
        f"--workers {args.workers}`; wall {wall:.0f} s (this invocation; finished runs are reused), load "
        f"average at the end {load}.",
    ]
    (out / f"{args.stem}.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", type=Path, default=bench_shift.DEFAULT_NPZ)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_robust", help="manifests, caches and runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="table and CSVs")
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    p.add_argument("--defended", nargs="*", default=["mean"], choices=list(RULES),
                   help="rules also run with the default defences against each attack")
    p.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sources", type=int, default=5)
    p.add_argument("--rounds", type=int, default=BASE_CONFIG["rounds"])
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--workers", type=int, default=1, help="runs at once (processes)")
    p.add_argument("--stem", default="robust", help="output file stem")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    args = parse(argv)
    logging.basicConfig(level=logging.ERROR)
    start = time.time()
    frame = run_all(args)
    write_outputs(frame, args, time.time() - start)
    return frame


if __name__ == "__main__":
    main()
