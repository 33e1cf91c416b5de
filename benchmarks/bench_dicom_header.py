"""Header-check throughput on DICOM files: 1 worker vs N workers, side by side.

Copies one real DICOM from ``../shared/data/dicom`` N times into a temporary folder and runs
the ingest's header check (:func:`fedcxr.site_adapters.image_checks.read_headers`: tags up to the
pixel data, pixel-data length against the file size, decoder availability) over all copies,
once per worker count. Prints images/s for each and the speed-up over one worker.

    python benchmarks/bench_dicom_header.py                 # 2000 copies, workers 1 vs 2
    python benchmarks/bench_dicom_header.py --n 5000 --workers 1 2 4 --file wg04_RG1_cr_chest_pa_j2k_lossy_mono1.dcm

The first pass over the copies is untimed (warms the page cache), so the numbers measure
parsing, not the disk.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedcxr.site_adapters.image_checks import read_headers  # noqa: E402

DEFAULT_FILE = "rsna_pneumonia_cr_chest_pa_jpegbaseline_mono2.dcm"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="copies of the DICOM (default 2000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to compare")
    parser.add_argument("--file", default=DEFAULT_FILE, help="file name under ../shared/data/dicom")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data" / "dicom")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per worker count (best kept)")
    args = parser.parse_args(argv)

    source = args.shared / args.file
    if not source.is_file():
        print(f"no such file: {source}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-") as tmp:
        paths = []
        for i in range(args.n):
            target = Path(tmp) / f"{i:06d}.dcm"
            shutil.copyfile(source, target)
            paths.append(str(target))
        size_mb = source.stat().st_size * args.n / 1e6
        print(f"{args.n} copies of {args.file} ({size_mb:.0f} MB) in a temporary folder")
        read_headers(paths, workers=1)  # warm the page cache and imports
        rates = {}
        for workers in args.workers:
            best = float("inf")
            for _ in range(args.repeats):
                started = time.perf_counter()
                results = read_headers(paths, workers=workers)
                best = min(best, time.perf_counter() - started)
            bad = sum(reason is not None for _, reason in results)
            if bad:
                print(f"  {bad} file(s) failed the check: {results[0][1]}", file=sys.stderr)
            rates[workers] = args.n / best
    base = rates[args.workers[0]]
    print(f"{'workers':>8} {'images/s':>10} {'vs ' + str(args.workers[0]) + ' worker(s)':>16}")
    for workers, rate in rates.items():
        print(f"{workers:>8} {rate:>10.0f} {rate / base:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
