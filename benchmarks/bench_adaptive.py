"""Issue 27's two High attacks on the defences, before and after their fix (real PneumoniaMNIST).

* ``bn_shift`` — ``site-1`` sends honest counts and its honest update but shifts every BatchNorm
  running mean (total change 0.5 × ``norm_limit`` × ‖θ0‖), every round;
* ``liar`` — ``site-1`` claims 1000× its training rows in its metadata reply and in every train
  reply (with the steps those rows allow), sends its update sign-flipped and scaled 100× in round 0
  (BatchNorm statistics left honest) and θ0 (a zero update) after;
* adaptive attackers against the new checks, each just under a bound in this setting:
  ``bn_sigma`` / ``bn_2sigma`` move every running mean by 0.9 / 2 of its own standard deviations
  every round (under the one-σ floor / under k = 10 × the honest sites' ~0.2 σ); ``liar_30`` is
  ``liar`` with a 30× flip (credited at most 4× an honest site's steps, its statistic is 7.5×).

Setting: ``bench_robust.py``'s five IID sources dealt from the official train rows of
``pneumoniamnist_merged.npz`` and its target (official test rows), FedAvg with the default
``defences:``, resnet_tiny at 28 px, but one local epoch per round (Adam lr 1e-3, batch 32) rather
than a fixed step count: a size lie buys steps only when the step budget follows the rows.
Scored as ``bench_robust.py``: mean AUROC on the target's test rows; a run that stops scores 0.5.

"Before" is the same script run on the code before issue 27 (the parent commit, exported to a
folder put first on ``PYTHONPATH``); ``--label`` names the column::

    git archive ff6db77 | tar -x -C ../before-issue27
    PYTHONPATH=../before-issue27 nice -n 15 python benchmarks/bench_adaptive.py --label before --attacks none bn_shift liar
    nice -n 15 python benchmarks/bench_adaptive.py --label after
    python benchmarks/bench_adaptive.py --table           # prints the Markdown table of both
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_robust  # noqa: E402
import bench_shift  # noqa: E402
import hostile_sites  # noqa: E402

HOSTILE = "site-1"
LIAR = {HOSTILE: {"metadata": "lie", 0: "lie_flip", "*": "lie_zero"}}
#: attack → (faults, ``hostile_sites`` constants it sets)
ATTACKS = {
    "none": ({}, {}),
    "bn_shift": ({HOSTILE: {"*": "bn_shift"}}, {}),
    "liar": (LIAR, {}),
    # adaptive attackers against the new checks (just under their bounds, in this setting)
    "bn_0.5sigma": ({HOSTILE: {"*": "bn_sigma"}}, {"BN_SIGMA": 0.5}),
    "bn_0.75sigma": ({HOSTILE: {"*": "bn_sigma"}}, {"BN_SIGMA": 0.75}),
    "bn_sigma": ({HOSTILE: {"*": "bn_sigma"}}, {"BN_SIGMA": 0.9}),
    "bn_2sigma": ({HOSTILE: {"*": "bn_sigma"}}, {"BN_SIGMA": 2.0}),
    "liar_30": (LIAR, {"LIE_FLIP": 30.0}),  # credited 4× the steps: 30/4 = 7.5 × honest, under k = 10
}
SOURCE = {"lr": 1.0e-3, "batch_size": 32, "epochs": 1}


def config(manifests: Path, work: Path, rounds: int, seed: int) -> dict:
    cfg = bench_robust.run_config(manifests, work, 5, rounds, "mean", seed)
    cfg["source"] = dict(SOURCE)
    return cfg


def run(data: dict, run_dir: Path, attack: str) -> dict:
    """One run through the hostile transport, scored on the target's test rows."""
    from fedcxr.workflows.evaluate import evaluate_run
    from fedcxr.errors import RunFailed, UserError
    from fedcxr.pipeline.config import load_config

    shutil.rmtree(run_dir, ignore_errors=True)
    faults, constants = ATTACKS[attack]
    saved = {name: getattr(hostile_sites, name) for name in constants}
    for name, value in constants.items():
        setattr(hostile_sites, name, value)
    t0 = time.time()
    result = {"status": "finished", "auroc": 0.5, "refused": 0, "error": ""}
    try:
        info = hostile_sites.hostile_run(load_config(data=data), run_dir, faults)
        result["refused"] = len(info["refused"])
        if bench_robust.poisoned(run_dir):
            result.update(status="broken", error="the final model holds NaN/Inf or weights above 1e20")
        else:
            report = evaluate_run(run_dir, split="test", n_boot=0)
            result["auroc"] = float(report["sites"][info["eval_sites"][0]].get("mean_auroc") or 0.5)
    except (RunFailed, UserError) as exc:
        result.update(status="stopped", error=str(exc)[:400].replace(str(run_dir), "RUN_DIR"))
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
        result["refused"] = len(info.get("refused", []))
    finally:
        for name, value in saved.items():
            setattr(hostile_sites, name, value)
    result["seconds"] = round(time.time() - t0, 1)
    return result


def table(work: Path) -> str:
    rows = {}
    for path in sorted(work.glob("results-*.json")):
        for entry in json.loads(path.read_text()):
            rows.setdefault(entry["attack"], {}).setdefault(entry["label"], []).append(entry)
    labels = ["before", "after"]
    lines = ["| attack | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for attack in ATTACKS:
        if attack not in rows:
            continue
        cells = []
        for label in labels:
            runs = rows[attack].get(label, [])
            if not runs:
                cells.append("–")
                continue
            mean = sum(r["auroc"] for r in runs) / len(runs)
            notes = sorted({r["status"] for r in runs})
            refused = sum(r["refused"] for r in runs) / len(runs)
            cells.append(f"{mean:.3f} ({', '.join(notes)}; {refused:.3g} refused/run)")
        lines.append(f"| `{attack}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", type=Path, default=bench_shift.DEFAULT_NPZ)
    parser.add_argument("--work", type=Path, default=Path("runs/bench_adaptive"))
    parser.add_argument("--label", default="after")
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="print the Markdown table of the results so far")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.work))
        return
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    manifests = bench_shift.prepare_sites(args.npz, args.work, n_sources=5, target_split=[0.45, 0.15, 0.40])
    results = []
    for attack in args.attacks:
        for seed in range(args.seeds):
            data = config(manifests, args.work, args.rounds, seed)
            out = run(data, args.work / "runs" / f"{args.label}-{attack}-seed{seed}", attack)
            results.append({"label": args.label, "attack": attack, "seed": seed, **out})
            print(json.dumps(results[-1]), flush=True)
    path = args.work / f"results-{args.label}.json"  # the label's earlier results of other attacks are kept
    done = {attack for attack in args.attacks}
    earlier = [r for r in json.loads(path.read_text()) if r["attack"] not in done] if path.is_file() else []
    path.write_text(json.dumps(earlier + results, indent=1))


if __name__ == "__main__":
    main()
