"""A synthetic multi-hospital chest X-ray export in the sources' native formats.

Why: the demo (``fedcxr demo``), the tests and anyone trying fedcxr without credentialed
data need hospitals whose exports go through the *real* adapters, with findings a small CNN
can learn in minutes on a CPU and the site differences federated methods are about.

* :mod:`fedcxr.synth.phantom` draws the images (procedural radiograph-like phantoms);
* :mod:`fedcxr.synth.cohort` decides who is imaged and what each image shows;
* :mod:`fedcxr.synth.hospitals` defines the four hospitals (case mix, look, label sets);
* :mod:`fedcxr.synth.export` / :mod:`fedcxr.synth.dicom_export` / :mod:`fedcxr.synth.midrc_export`
  write the vendor formats;
* :mod:`fedcxr.synth.truth` finds an ingested image's true findings for every class again
  (benchmarks score sites on classes they do not label).

Output of :func:`write_synthetic_export` (``OUT``)::

    OUT/synth.json          how to ingest each hospital, its classes and counts
    OUT/nih_style/          NIH ChestX-ray14 layout      (fedcxr ingest nih)
    OUT/chexpert_style/     CheXpert-v1.0-small layout   (fedcxr ingest chexpert)
    OUT/midrc_style/        MIDRC DICOM + TSV layout     (fedcxr ingest midrc)
    OUT/dicom_style/        DICOM folder + labels.csv    (fedcxr ingest dicom)

Same seed → byte-identical csv/tsv/json files and identical pixel arrays. The command line,
``fedcxr synth``, is :mod:`fedcxr.commands.synth`.

Version 2 (``synth_version``): findings depend on sex, age bin and view as in NIH ChestX-ray14
(:mod:`fedcxr.synth.cohort`, ``demographics: nih``), so a seed's findings differ from version 1's
(its patients, ages and views do not); ``demographics="legacy"`` writes version 1's findings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from fedcxr.errors import UserError

SYNTH_VERSION = 2
SYNTH_JSON = "synth.json"


#: Hospitals whose export is DICOM with JPEG 2000 lossless images: OpenJPEG refuses to encode
#: images under about 28 px (its default wavelet levels), so they need this short side.
DICOM_SOURCES = ("dicom", "midrc")
MIN_DICOM_SIZE = 32


def write_synthetic_export(
    out: Path | str,
    *,
    sites: Sequence[str] | None = None,
    images_per_site: int = 120,
    image_size: int = 64,
    seed: int = 0,
    demographics: str | None = None,
) -> dict:
    """Write the hospitals' native exports into ``out`` and return the ``synth.json`` payload.

    ``sites``: hospital names (default all, :data:`fedcxr.synth.hospitals.HOSPITALS`);
    ``images_per_site``: images per hospital (laterals included); ``image_size``: short side
    of the smallest detector in pixels (larger detectors scale from it); ``demographics``: how
    sex, age and view move the findings at every hospital (:data:`fedcxr.synth.cohort.DEMOGRAPHICS`;
    default: each hospital's own, ``nih``). A hospital folder that already exists is replaced.
    """
    from fedcxr.synth.export import write_hospital
    from fedcxr.synth.hospitals import select, with_demographics

    if int(images_per_site) < 1:
        raise UserError(f"--images-per-site must be at least 1, got {images_per_site}")
    if int(image_size) < 16:
        raise UserError(f"--image-size must be at least 16 pixels, got {image_size}")
    chosen = select(sites)
    if demographics is not None:
        chosen = [with_demographics(h, demographics) for h in chosen]
    dicom = [h.name for h in chosen if h.source in DICOM_SOURCES]
    if dicom and int(image_size) < MIN_DICOM_SIZE:
        raise UserError(f"--image-size {image_size}: {', '.join(dicom)} write(s) JPEG 2000 DICOMs, whose encoder "
                        f"needs at least {MIN_DICOM_SIZE} pixels; use --image-size {MIN_DICOM_SIZE} or more, or "
                        "leave those hospitals out with --sites")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hospitals = {}
    for hospital in chosen:
        target = out / hospital.name
        if target.exists():
            shutil.rmtree(target)
        hospitals[hospital.name] = write_hospital(
            hospital, out, n_images=int(images_per_site), image_size=int(image_size), seed=int(seed))
        hospitals[hospital.name]["demographics"] = hospital.cohort.demographics
    payload = {
        "synth_version": SYNTH_VERSION,
        "seed": int(seed),
        "images_per_site": int(images_per_site),
        "image_size": int(image_size),
        "note": "input and ingest_kwargs paths are relative to the folder holding this file, which "
                "<OUT> stands for in ingest_args and command; each hospital is one site named after it",
        "hospitals": hospitals,
    }
    (out / SYNTH_JSON).write_bytes((json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())
    return payload


def read_synth_json(out: Path | str) -> dict:
    """The ``synth.json`` of an export folder; exit-2 error when it is missing or broken."""
    path = Path(out) / SYNTH_JSON
    if not path.is_file():
        raise UserError(f"{path}: not found; write the export first (fedcxr synth --out {out})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def ingest_synthetic(out: Path | str, manifests: Path | str, **kwargs) -> dict[str, Path]:
    """Ingest every hospital of ``out/synth.json`` with its real adapter; one site per hospital.

    Returns ``{site: manifest dir}`` (``manifests/<site>`` holding ``manifest.parquet`` and
    ``site.json``). Each hospital's ``ingest_report.json`` is moved into its site folder
    (a shared ``manifests/ingest_report.json`` would hold only the last hospital's).
    ``kwargs`` go to :func:`fedcxr.site_adapters.ingest.run_ingest` (``uncertain``,
    ``verify_pixels``, ``progress``...; ``progress`` defaults to False).

    The pseudonym key defaults to one derived from the export's seed (:func:`synthetic_site_key`):
    synthetic patients need no secret, and the same seed must give the same splits (and so the
    same demo and test results) on every machine.
    """
    from fedcxr.site_adapters.ingest import run_ingest

    out, manifests = Path(out), Path(manifests)
    spec = read_synth_json(out)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("site_key", synthetic_site_key(int(spec.get("seed", 0))))
    sites: dict[str, Path] = {}
    for name, info in spec["hospitals"].items():
        options = dict(info["ingest_kwargs"])
        if options.get("labels_csv"):
            options["labels_csv"] = out / options["labels_csv"]
        options.update(kwargs)
        report = run_ingest(info["source"], out / info["input"], manifests, **options)
        if options["site_name"] not in report["sites"]:
            raise UserError(f"synthetic hospital {name!r}: ingest kept no rows "
                            f"(see {manifests / 'ingest_report.json'})")
        site_dir = manifests / options["site_name"]
        (manifests / "ingest_report.json").replace(site_dir / "ingest_report.json")
        (manifests / "set_aside.csv").replace(site_dir / "set_aside.csv")
        sites[name] = site_dir
    return sites


def synthetic_site_key(seed: int):
    """A fixed, public pseudonym key for synthetic exports (never use it for real data)."""
    import hashlib

    from fedcxr.site_adapters.sitekey import SiteKey

    return SiteKey(hashlib.sha256(f"fedcxr-synthetic-export:{seed}".encode()).digest(), "synthetic")


__all__ = ["write_synthetic_export", "ingest_synthetic", "read_synth_json", "SYNTH_JSON"]
