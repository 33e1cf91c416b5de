"""Ingest speed: ``run_ingest('nih', ...)`` on the real 112,120-row Data_Entry vs a bare read_csv.

Builds a throw-away NIH export in a temporary folder: the real ``Data_Entry_2017_v2020.csv.gz``
and official split lists (copied from ``../shared/data/nih-chestxray14`` or ``--data``) plus
112,120 tiny valid PNG placeholders laid out as NIH ships them (``images_001/images/`` ...),
so every row passes the header check. Then it times, each in a fresh process:

* ``read_csv``: ``pandas.read_csv`` of the same file (the floor: parsing alone);
* ``ingest``: the whole ``run_ingest`` (adapter, duplicate and image header checks,
  uncertain policy, partition, splits, manifest + ingest_report writing), no pixel decode.

and prints seconds side by side, the ratio and each process's peak resident memory
(``resource.getrusage``; the "after imports" column is the interpreter + libraries floor).
Goal (project brief): ingest ≤ 5 s on 2 cores, < ~1 GB.

    python benchmarks/bench_ingest.py [--data DIR] [--workers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "nih-chestxray14"
CSV_NAME = "Data_Entry_2017_v2020.csv.gz"
LISTS = ("train_val_list.txt", "test_list.txt")
PER_FOLDER = 10_000  # NIH's images_NNN/images/ folders hold ~10,000 images each


def _maxrss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def _tiny_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8), 128).save(buf, format="PNG")
    return buf.getvalue()


def build_export(data: Path, dest: Path) -> int:
    """Copy metadata + lists into ``dest`` and write one placeholder PNG per Data_Entry row."""
    import pandas as pd

    shutil.copy(data / CSV_NAME, dest / CSV_NAME)
    for name in LISTS:
        if (data / name).is_file():
            shutil.copy(data / name, dest / name)
    names = pd.read_csv(dest / CSV_NAME, usecols=["Image Index"])["Image Index"].tolist()
    png = _tiny_png()
    for start in range(0, len(names), PER_FOLDER):
        folder = dest / f"images_{start // PER_FOLDER + 1:03d}" / "images"
        folder.mkdir(parents=True)
        for name in names[start:start + PER_FOLDER]:
            with open(folder / name, "wb") as handle:
                handle.write(png)
    return len(names)


def child(kind: str, export: Path, out: Path, workers: int) -> None:
    """Run one measured side in this (fresh) process and print a JSON line."""
    import pandas as pd

    from fedcxr.site_adapters.ingest import run_ingest

    after_imports = _maxrss_mb()
    start = time.perf_counter()
    if kind == "read_csv":
        rows = len(pd.read_csv(export / CSV_NAME))
        kept = rows
    else:
        report = run_ingest("nih", export, out, workers=workers, progress=False)
        rows, kept = report["rows_read"], report["rows_kept"]
    seconds = time.perf_counter() - start
    print(json.dumps({"kind": kind, "seconds": seconds, "rows": rows, "kept": kept,
                      "maxrss_mb": _maxrss_mb(), "after_imports_mb": after_imports}))


def run_child(kind: str, export: Path, out: Path, workers: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--export", str(export), "--out", str(out),
           "--workers", str(workers)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with Data_Entry + lists")
    parser.add_argument("--workers", type=int, default=1, help="run_ingest workers (image checks)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per side (best is reported)")
    parser.add_argument("--child", choices=["read_csv", "ingest"], help=argparse.SUPPRESS)
    parser.add_argument("--export", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.export, args.out, args.workers)
        return 0
    if not (args.data / CSV_NAME).is_file():
        print(f"no {CSV_NAME} in {args.data} (use --data)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-") as tmp:
        export, out = Path(tmp) / "nih", Path(tmp) / "out"
        export.mkdir()
        t0 = time.perf_counter()
        n = build_export(args.data, export)
        print(f"built export: {n} rows, {n} placeholder PNGs in {time.perf_counter() - t0:.1f} s")
        results = {}
        for kind in ("read_csv", "ingest"):
            runs = [run_child(kind, export, out / f"run{i}", args.workers) for i in range(args.repeat)]
            results[kind] = min(runs, key=lambda r: r["seconds"])
    rc, ing = results["read_csv"], results["ingest"]
    print(f"\n{'side':<10}{'seconds':>10}{'rows':>10}{'kept':>10}{'peak RSS MiB':>15}{'after imports':>15}")
    for r in (rc, ing):
        print(f"{r['kind']:<10}{r['seconds']:>10.2f}{r['rows']:>10}{r['kept']:>10}"
              f"{r['maxrss_mb']:>15.0f}{r['after_imports_mb']:>15.0f}")
    print(f"\ningest / read_csv = {ing['seconds'] / rc['seconds']:.1f}x   "
          f"(goal: ingest <= 5 s; {'met' if ing['seconds'] <= 5 else 'NOT met'}; workers={args.workers}, "
          f"best of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
