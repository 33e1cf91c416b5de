"""A small "one CSV + a folder of PNGs" export of three hospitals: what ``fedcxr init`` writes.

Why: a new user's own data is most often exactly this — a spreadsheet exported from a PACS
or a study database, one row per image, plus the image files. ``fedcxr init DIR`` writes this
example beside a commented csv mapping and experiment config made for it, so the three steps
of the README (init → ingest → train + evaluate) run as they are before the user points them
at their own export.

Layout (``<out>/``)::

    findings.csv     ';'-separated (as many European spreadsheet exports are); one row per image:
                     Image Index; Patient ID; Accession; Site; Sex; Age; Projection;
                     Cardiomegaly; Effusion; Edema
    images/<Image Index>.png

``Site`` is hospital_a / hospital_b / hospital_c (``--site-by hospital``). Cardiomegaly and
Edema hold 1 / 0, blank = not read; Effusion holds yes / no / uncertain, blank = not read (so
the mapping shows a ``values:`` map). The images are :mod:`fedcxr.synth.phantom` phantoms
whose findings a small network learns; each hospital has its own acquisition look.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcxr.synth.cohort import CohortProfile, sample_cohort
from fedcxr.synth.export import csv_text, write_text
from fedcxr.synth.hospitals import to_uint
from fedcxr.synth.phantom import SiteStyle, render

CSV_NAME = "findings.csv"
HEADER = ["Image Index", "Patient ID", "Accession", "Site", "Sex", "Age", "Projection",
          "Cardiomegaly", "Effusion", "Edema"]
#: hospital → (case mix, acquisition look, share of images whose Edema was not read)
HOSPITALS = {
    "hospital_a": (CohortProfile(female_fraction=0.45, age_mean=55, prevalence_shift=0.9),
                   SiteStyle(contrast=1.0, noise=0.012, blur=0.3), 0.0),
    "hospital_b": (CohortProfile(female_fraction=0.5, age_mean=62, prevalence_shift=1.1, ap_bias=0.3),
                   SiteStyle(contrast=1.15, gamma=0.85, offset=0.03, noise=0.02, blur=0.6), 0.0),
    "hospital_c": (CohortProfile(female_fraction=0.48, age_mean=60, prevalence_shift=1.0),
                   SiteStyle(contrast=0.9, gamma=1.15, noise=0.025, blur=0.8, max_rotation=6.0), 0.3),
}
EFFUSION_TEXT = {1: "yes", 0: "no"}


def write_csv_example(out: Path | str, *, images_per_hospital: int = 60, image_size: int = 64,
                      seed: int = 0) -> dict[str, int]:
    """Write the export into ``out``; returns the number of images per hospital."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows, counts = [], {}
    for h, (name, (profile, style, unread_edema)) in enumerate(HOSPITALS.items()):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7, h]))
        draws = sample_cohort(images_per_hospital, profile, rng)
        for draw in draws:
            image_id = f"{name[-1].upper()}{draw.index + 1:04d}"
            pixels = render(draw.subject, (image_size, image_size), style, rng)
            _save_png(out / "images" / f"{image_id}.png", to_uint(pixels, 8))
            found = draw.subject.findings
            effusion = int("pleural_effusion" in found)
            rows.append([
                image_id, f"{name[-1].upper()}-P{draw.patient.index + 1:04d}", f"{image_id}-S{draw.study}", name,
                draw.patient.sex, int(round(draw.age)), draw.subject.view,
                int("cardiomegaly" in found),
                "uncertain" if rng.random() < 0.05 else EFFUSION_TEXT[effusion],
                "" if rng.random() < unread_edema else int("edema" in found),
            ])
        counts[name] = len(draws)
    write_text(out / CSV_NAME, csv_text(HEADER, rows, delimiter=";"))
    return counts


def _save_png(path: Path, image: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(image, "L").save(path)
