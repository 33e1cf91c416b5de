"""Planning a consortium on a simulated clock: for 100 hospitals, share asked per round × round deadline →
the simulated wall time of the run and the AUROC it reaches (issue 31 item 2; README "Running a consortium").

Setting (fixed before any result was seen):

* ``pneumoniamnist_merged.npz`` dealt iid to 100 sites (``fedcxr ingest medmnist --site-by iid:100``,
  official splits kept: ~47 training rows a site) under a fixed pseudonym key; FedAvg over the 100
  sources, ``resnet_tiny`` at 28 px, each asked site 5 Adam steps of 16 images per round; the score
  is the final model's test AUROC on the official test split (621 images: the same file ingested
  whole as one evaluation site, ``pooled``, which never trains);
* the consortium (:data:`PROFILE`, ``simulate:``): each hospital's compute speed log-normal (median 1,
  spread 0.7: the fastest tenth ~2.5× the median, the slowest tenth ~2.5× slower), its one-way network
  delay log-normal (median 2 s, spread 1.0), a 5 % chance of dropping out of any round; one
  optimiser step at speed 1 takes ``step_s`` seconds: **measured** here first (:func:`calibrate`:
  a real round's wall time on this machine divided by the steps it took) unless ``--step-s`` says;
* the grid: ``participation.fraction`` (the share of the 100 asked each round, ``min_sites`` 1) ×
  ``participation.deadline_s``, given as a quantile of the consortium's reply-time distribution
  (``p50``: half of the hospitals answer in time; ``none``: the round waits for the last asked
  hospital) × seeds (each seed draws its own consortium, samples and training).

Every number is a mean over seeds with a 95 % t-interval. A run whose round fell below
``min_sites`` stops (the table counts it; its AUROC is not averaged in).

Small version (the one in BENCHMARKS.md; ~12 min on 2 shared cores)::

    nice -n 15 python benchmarks/bench_consortium.py --fractions 0.05 0.2 --deadlines p50 none \\
        --seeds 2 --rounds 10

Full grid (the command and its time estimate are in BENCHMARKS.md)::

    nice -n 15 python benchmarks/bench_consortium.py --fractions 0.05 0.1 0.2 0.5 \\
        --deadlines p50 p90 none --seeds 5 --rounds 30
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_NPZ = REPO.parent / "shared" / "data" / "medmnist" / "pneumoniamnist_merged.npz"
N_SITES = 100
POOLED = "pooled"

#: the consortium (``simulate:`` without ``step_s``, which is measured or given)
PROFILE = {"speed": {"median": 1.0, "spread": 0.7}, "latency_s": {"median": 2.0, "spread": 1.0}, "dropout": 0.05}

BASE_CONFIG: dict = {
    "name": "consortium",
    "method": "FedAvg",
    "source": {"lr": 1.0e-3, "batch_size": 16, "steps": 5},
    "model": {"backbone": "resnet_tiny", "hidden": 64},
    "image_size": 28,
    "augment": False,
    "device": "cpu",
    "eval_every": 0,
}

log = logging.getLogger("bench_consortium")


def prepare(npz: Path, work: Path, n_sites: int = N_SITES) -> tuple[Path, Path]:
    """``fedcxr ingest medmnist --site-by iid:N`` and the whole file as the evaluation site, once each."""
    from fedcxr.site_adapters.ingest import run_ingest

    manifests, pooled = work / "manifests", work / "pooled"
    key = work / "bench_site_key"  # a public benchmark's key: only makes the deal reproducible
    work.mkdir(parents=True, exist_ok=True)
    if not key.is_file():
        key.write_text(hashlib.sha256(b"fedcxr bench_consortium").hexdigest() + "\n")
        os.chmod(key, 0o600)
    if not (manifests / f"site-{n_sites}" / "site.json").is_file():
        run_ingest("medmnist", npz, manifests, site_by=f"iid:{n_sites}", site_key=key, progress=False)
    if not (pooled / POOLED / "site.json").is_file():
        run_ingest("medmnist", npz, pooled, site_name=POOLED, site_key=key, progress=False)
    return manifests, pooled / POOLED


def config(manifests: Path, pooled: Path, work: Path, *, rounds: int, seed: int, n_sites: int = N_SITES,
           fraction: float = 1.0, deadline_s: Optional[float] = None, step_s: Optional[float] = None) -> dict:
    """One run's config: FedAvg over the N sites, the pooled site as the evaluation target."""
    cfg = json.loads(json.dumps(BASE_CONFIG))
    cfg.update({"manifests": str(manifests.resolve()), "cache_dir": str((work / "cache").resolve()),
                "sites": [f"site-{i}" for i in range(1, n_sites + 1)], "target": str(pooled.resolve()),
                "rounds": rounds, "seed": seed,
                "participation": {"fraction": fraction, "min_sites": 1, "deadline_s": deadline_s}})
    if step_s is not None:
        cfg["simulate"] = {**PROFILE, "step_s": step_s}
    return cfg


def calibrate(manifests: Path, pooled: Path, work: Path, n_sites: int = N_SITES) -> float:
    """Seconds per optimiser step on this machine: round 1 of a real 2-round run (10 % of the sites; round 0
    pays the sites' start-up) divided by the steps its sites took — per-task overhead included."""
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    run_dir = work / "calibration"
    if not (run_dir / "run.json").is_file() or json.loads((run_dir / "run.json").read_text())["status"] != "finished":
        data = config(manifests, pooled, work, rounds=2, seed=0, n_sites=n_sites, fraction=0.1)
        run_experiment(load_config(data=data), run_dir, progress=False)
    row = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    steps = len(row["train"]) * BASE_CONFIG["source"]["steps"]
    return round(float(row["seconds"]) / steps, 4)


def deadline_for(quantile: str, step_s: float, draws: int = 20_000) -> Optional[float]:
    """``p50`` → the median of the consortium's reply times (:data:`PROFILE`, Monte Carlo over ``draws``
    hospitals, 5 steps); ``none`` → None."""
    from fedcxr.pipeline.config_consortium import SimulateConfig
    from fedcxr.pipeline.virtual_clock import reply_seconds, site_timings

    if quantile == "none":
        return None
    spec = SimulateConfig(**PROFILE, step_s=step_s)
    names = [f"h{i}" for i in range(draws)]
    times = sorted(reply_seconds(t, steps=BASE_CONFIG["source"]["steps"], step_s=step_s)
                   for t in site_timings(spec, names, [], seed=12345).values())
    return round(times[int(float(quantile[1:]) / 100 * (draws - 1))], 2)


def run_one(cfg: dict, run_dir: Path) -> dict:
    """Train (or keep a finished run), evaluate on the pooled test split; the run's numbers."""
    from fedcxr.errors import RunFailed
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment
    from fedcxr.workflows.evaluate import evaluate_run

    info_path = run_dir / "run.json"
    done = info_path.is_file() and json.loads(info_path.read_text()).get("status") in ("finished", "stopped")
    if not done:
        try:
            run_experiment(load_config(data=cfg), run_dir, progress=False)
        except RunFailed as exc:
            log.warning("%s stopped: %s", run_dir.name, str(exc)[:200])
    info = json.loads(info_path.read_text())
    metrics = run_dir / "metrics.jsonl"  # absent when the run stopped in its first round
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    auroc = math.nan
    if info["status"] == "finished":
        if not (run_dir / "report.json").is_file():
            evaluate_run(run_dir, n_boot=0, device="cpu")
        value = json.loads((run_dir / "report.json").read_text())["sites"][POOLED].get("mean_auroc")
        auroc = float(value) if value is not None else math.nan
    late = sum(1 for e in info["missed"] if e.get("why") == "late")
    dropped = sum(1 for e in info["missed"] if e.get("why") == "dropped")
    return {"status": info["status"], "rounds_done": len(rows), "auroc": auroc,
            "sim_minutes": (info.get("simulated") or {}).get("clock_s", math.nan) / 60,
            "replies_per_round": float(np.mean([len(r.get("train", {})) for r in rows])) if rows else 0.0,
            "late": late, "dropped": dropped, "wall_s": round(sum(r.get("seconds", 0) for r in rows), 1)}


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    from scipy import stats

    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else math.nan), math.nan, math.nan
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return float(x.mean()), float(x.mean()) - half, float(x.mean()) + half


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (fraction, deadline): AUROC and simulated minutes, mean [95 % interval] over seeds; replies per round."""
    rows = []
    for (fraction, deadline), runs in frame.groupby(["fraction", "deadline"], sort=False):
        finished = runs[runs["status"] == "finished"]
        auc, auc_lo, auc_hi = t_interval(finished["auroc"].tolist())
        minutes, m_lo, m_hi = t_interval(finished["sim_minutes"].tolist())
        rows.append({"fraction": fraction, "deadline": deadline, "deadline_s": runs["deadline_s"].iloc[0],
                     "n": len(runs), "stopped": int((runs["status"] != "finished").sum()),
                     "auroc": auc, "auroc_lo": auc_lo, "auroc_hi": auc_hi,
                     "sim_minutes": minutes, "sim_minutes_lo": m_lo, "sim_minutes_hi": m_hi,
                     "replies_per_round": float(runs["replies_per_round"].mean()),
                     "late_per_run": float(runs["late"].mean()), "dropped_per_run": float(runs["dropped"].mean())})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    def cell(mean, lo, hi, fmt):
        return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]" if np.isfinite(lo) else f"{mean:{fmt}}"

    lines = ["| fraction asked | deadline | test AUROC [95% interval] | simulated minutes [95% interval] | "
             "replies per round | late per run | dropped per run | runs (stopped) |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        deadline = "none" if r["deadline"] == "none" else f"{r['deadline']} ({r['deadline_s']:g} s)"
        lines.append(f"| {r['fraction']:g} | {deadline} | {cell(r['auroc'], r['auroc_lo'], r['auroc_hi'], '.3f')} | "
                     f"{cell(r['sim_minutes'], r['sim_minutes_lo'], r['sim_minutes_hi'], '.1f')} | "
                     f"{r['replies_per_round']:.1f} | {r['late_per_run']:.1f} | {r['dropped_per_run']:.1f} | "
                     f"{r['n']} ({r['stopped']}) |")
    return "\n".join(lines)


def figure(table: pd.DataFrame, path: Path) -> None:
    """Simulated minutes (x) against test AUROC (y), one point per (fraction, deadline) with its intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    markers = {"none": "o", "p50": "v", "p90": "s"}
    colours = {f: plt.cm.viridis(i / max(1, table["fraction"].nunique() - 1))
               for i, f in enumerate(sorted(table["fraction"].unique()))}
    for _, r in table.iterrows():
        xerr = [[r["sim_minutes"] - r["sim_minutes_lo"]], [r["sim_minutes_hi"] - r["sim_minutes"]]] \
            if np.isfinite(r["sim_minutes_lo"]) else None
        yerr = [[r["auroc"] - r["auroc_lo"]], [r["auroc_hi"] - r["auroc"]]] if np.isfinite(r["auroc_lo"]) else None
        ax.errorbar(r["sim_minutes"], r["auroc"], xerr=xerr, yerr=yerr, fmt=markers.get(r["deadline"], "D"),
                    color=colours[r["fraction"]], capsize=3,
                    label=f"fraction {r['fraction']:g}, deadline {r['deadline']}")
    ax.set_xlabel("simulated wall time of the run (minutes)")
    ax.set_ylabel("test AUROC (PneumoniaMNIST)")
    ax.set_title(f"{N_SITES} hospitals: share asked per round × round deadline", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", type=Path, default=DEFAULT_NPZ)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench_consortium", help="manifests, caches, runs")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="tables, CSVs, figure")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5])
    p.add_argument("--deadlines", nargs="+", default=["p50", "p90", "none"],
                   help="pNN: that quantile of the consortium's reply times; none: no deadline")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--sites", type=int, default=N_SITES, help="sites of the iid deal (100; the smoke test: fewer)")
    p.add_argument("--step-s", type=float, default=None, help="seconds per step at speed 1 (unset: measured here)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for resnet_tiny at 28 px)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(args.threads)
    random.seed(0)
    start = time.time()
    manifests, pooled = prepare(args.npz, args.work, args.sites)
    step_s = args.step_s if args.step_s is not None else calibrate(manifests, pooled, args.work, args.sites)
    print(f"step_s = {step_s} s per optimiser step at speed 1 ({'given' if args.step_s else 'measured here'})")
    rows = []
    for fraction in args.fractions:
        for quantile in args.deadlines:
            deadline = deadline_for(quantile, step_s)
            for seed in range(args.seeds):
                name = f"f{fraction:g}-{quantile}-r{args.rounds}-seed{seed}"
                cfg = config(manifests, pooled, args.work, rounds=args.rounds, seed=seed, n_sites=args.sites,
                             fraction=fraction, deadline_s=deadline, step_s=step_s)
                t0 = time.time()
                result = run_one(cfg, args.work / "runs" / name)
                rows.append({"fraction": fraction, "deadline": quantile, "deadline_s": deadline, "seed": seed,
                             **result})
                print(f"{name}: AUROC {result['auroc']:.3f}, {result['sim_minutes']:.1f} simulated min, "
                      f"{result['replies_per_round']:.1f} replies/round, {time.time() - t0:.0f} s")
    frame = pd.DataFrame(rows)
    table = summary(frame)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "consortium_runs.csv", index=False)
    table.to_csv(args.out / "consortium.csv", index=False)
    figure(table, args.out / "consortium.png")
    meta = {"sites": args.sites, "rounds": args.rounds, "seeds": args.seeds, "profile": PROFILE, "step_s": step_s,
            "step_s_measured": args.step_s is None, "base_config": BASE_CONFIG,
            "wall_s": round(time.time() - start), "loadavg": os.getloadavg()}
    md = markdown(table)
    title = (f"PneumoniaMNIST dealt iid to {args.sites} sites, FedAvg, {args.rounds} rounds, {args.seeds} seeds; "
             "simulated consortium (`simulate:`) of bench_consortium.PROFILE")
    (args.out / "consortium.md").write_text(f"{title}\n\n{md}\n\n```json\n{json.dumps(meta, indent=1)}\n```\n")
    print(md)
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return frame


if __name__ == "__main__":
    main()
