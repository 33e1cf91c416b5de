"""Building a site's decode-once cache: 1 process vs every core, side by side in one run.

The images are the real radiographs of ``../shared/data``: the six chest DICOMs (JPEG
baseline, JPEG 2000, JPEG-LS, uncompressed; up to 1955×1841, 15 bits, windows) and the NIH
PNGs (1024×1024), copied round-robin into one temporary export of ``--n`` files. Each pass
builds the cache at ``--size`` px (:func:`fedcxr.pipeline.data.cache_images`: decode, Modality
and VOI LUTs, resize, uint8) into a fresh folder; the caches of all passes must be equal byte
for byte. Prints images/s per worker count and the speed-up over one process.

    python benchmarks/bench_cache_build.py                      # 120 images at 224 px, 1 vs all cores
    python benchmarks/bench_cache_build.py --n 600 --workers 1 4 16
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedcxr.pipeline.data import SiteInfo, cache_images  # noqa: E402
from fedcxr.pipeline.engine import usable_cores  # noqa: E402


def real_images(shared: Path) -> list[Path]:
    dicoms = sorted((shared / "dicom").glob("*.dcm"))
    pngs = sorted((shared / "nih-chestxray14" / "images").glob("*.png"))
    return dicoms + pngs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=120, help="images in the site (default 120)")
    parser.add_argument("--size", type=int, default=224, help="cached image size in px")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="process counts to compare (default: 1 and every usable core)")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--repeats", type=int, default=2, help="passes per process count (best kept)")
    args = parser.parse_args(argv)
    workers = args.workers or sorted({1, usable_cores()})
    sources = real_images(args.shared)
    if not sources:
        print(f"no images under {args.shared}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fedcxr-cache-bench-") as tmp:
        export = Path(tmp) / "export"
        export.mkdir()
        names = []
        for i in range(args.n):
            source = sources[i % len(sources)]
            name = f"{i:05d}{source.suffix}"
            shutil.copyfile(source, export / name)
            names.append(name)
        size_mb = sum((export / n).stat().st_size for n in names) / 1e6
        site = SiteInfo(name="bench", site_dir=Path(tmp), manifest=pd.DataFrame({"image_path": names}),
                        meta={"content_hash": "bench"}, export_root=export, class_set=[])
        print(f"{args.n} real images ({size_mb:.0f} MB: {len(sources)} distinct files, DICOM and PNG) "
              f"→ cache at {args.size} px; {usable_cores()} usable cores")
        best: dict[int, float] = {}
        caches = []
        for repeat in range(args.repeats):  # alternate the counts: a busy machine slows both alike
            for count in workers:
                folder = Path(tmp) / f"cache-{count}-{repeat}"
                started = time.perf_counter()
                cache = cache_images(site, args.size, folder, progress=False, workers=count)
                seconds = time.perf_counter() - started
                best[count] = min(best.get(count, float("inf")), seconds)
                caches.append(np.array(cache))
                shutil.rmtree(folder)
        rates = {count: args.n / best[count] for count in workers}
        for count in workers:
            print(f"  {count:>2} process(es): {best[count]:7.2f} s  {rates[count]:7.1f} img/s  "
                  f"(best of {args.repeats})")
        same = all(np.array_equal(caches[0], c) for c in caches[1:])
        base = rates[workers[0]]
        print("speed-up over " + f"{workers[0]}: " + ", ".join(f"{w} → {rates[w] / base:.2f}×" for w in workers[1:]))
        print(f"caches identical: {same}")
        return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
