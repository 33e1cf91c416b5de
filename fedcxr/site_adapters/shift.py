"""A seeded, documented covariate shift of one site's images (a new site): ``fedcxr shift``.

``fedcxr shift SITE_DIR --out OUT --kind noise|gamma|blur|mix --level 0..4 [--seed N]``
``fedcxr shift SITE_DIR --out OUT --kind shortcut --marker-rates P N [--marker-class C] [--seed N]``

Reads an ingested site (``SITE_DIR/manifest.parquet`` + ``site.json``), decodes every image
(:func:`fedcxr.site_adapters.images.read_image`: grey, [0, 1], native size), applies the shift
with MONAI transforms and writes the result as 8-bit PNGs under
``OUT/_images/<site>/<kind><level>-seed<seed>/`` plus a new site ``OUT/<site>/`` whose rows,
labels, patients and splits are the input's, unchanged. Only the pixels move, which is what
"covariate shift" means in the FedDA/FedGP paper's experiments (same labels, different
acquisition). Use it to ask "how would the methods fare if the target hospital's scanner
differed from the sources'" on your own data.

Strength levels (one table, :data:`LEVELS`; BENCHMARKS.md quotes it):

=====  ==========  =====  ===============================  ==============================
level  noise std   gamma  blur σ (fraction of short side)  blur σ at 28 px / 224 px
=====  ==========  =====  ===============================  ==============================
0      0           1.0    0                                0 / 0 (identity)
1      0.02        1.25   0.0125                           0.35 / 2.8 px
2      0.05        1.6    0.025                            0.7 / 5.6 px
3      0.10        2.0    0.0375                           1.05 / 8.4 px
4      0.15        2.5    0.05                             1.4 / 11.2 px
=====  ==========  =====  ===============================  ==============================

Kinds: ``noise`` — additive Gaussian noise (MONAI ``RandGaussianNoise``, std on the [0, 1]
scale, clipped back to [0, 1]); ``gamma`` — contrast curve x ↦ x^γ (MONAI ``AdjustContrast``;
γ > 1 darkens the mid-tones as a harder exposure does); ``blur`` — Gaussian smoothing (MONAI
``GaussianSmooth``, σ scaled to the image so a level means the same at 28 and 1024 px);
``mix`` — gamma, then blur, then noise, all at the same level. Level 0 copies the pixels
exactly (re-encoded as 8-bit PNG).

``shortcut`` (a label-dependent shift, :class:`Shortcut`): a bright square in the top-left
corner (side 1/7 of the short side: 4 px at 28 px) on a fraction P of the rows labeled 1 for
``--marker-class`` and a fraction N of the rows labeled 0, in every split (exact counts: the
rows of each split and label with the smallest per-image hash get it). ``--marker-rates 0.95
0.05`` at the sources and ``0.05 0.95`` at the target is the FedGP papers' ColoredMNIST −90 %
case (a spurious feature that predicts the label at the sources and the opposite at the
target) on X-rays. Nothing else changes, except that the decode path rescales every image to
[0, 1] by its own minimum and maximum: where the marker hides an image's darkest pixels the rest
of that image is stretched by a few grey levels (at most 11 of 255 on real PneumoniaMNIST).

Reproducible: the noise of each image is drawn from a generator seeded by ``(seed, image
path)``, so the same input, kind, level and seed give byte-identical PNGs whatever the row
order. ``image_key`` (the keyed name predictions use) is kept, so a shifted image's
predictions pair with its original's. The new manifest's image paths carry
``<kind><level>-seed<seed>/`` so its content hash (and the training cache key) differs from
the input's and from every other shift.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

import numpy as np

from fedcxr.errors import UserError

log = logging.getLogger(__name__)

KINDS = ("noise", "gamma", "blur", "mix")
#: The label-dependent kind (a spurious corner marker), :class:`Shortcut`.
SHORTCUT = "shortcut"


@dataclass(frozen=True)
class ShiftLevel:
    """One row of the strength table: what each kind does at this level."""

    noise_std: float
    gamma: float
    blur_sigma: float  # fraction of the image's short side


#: The strength table (module doc, BENCHMARKS.md): level 0 = none … level 4 = strong.
LEVELS: dict[int, ShiftLevel] = {
    0: ShiftLevel(noise_std=0.0, gamma=1.0, blur_sigma=0.0),
    1: ShiftLevel(noise_std=0.02, gamma=1.25, blur_sigma=0.0125),
    2: ShiftLevel(noise_std=0.05, gamma=1.6, blur_sigma=0.025),
    3: ShiftLevel(noise_std=0.10, gamma=2.0, blur_sigma=0.0375),
    4: ShiftLevel(noise_std=0.15, gamma=2.5, blur_sigma=0.05),
}


@dataclass(frozen=True)
class Shortcut:
    """A spurious marker tied to a label: ``positive_rate`` of the rows labeled 1 for ``class_name``
    and ``negative_rate`` of those labeled 0 get a bright corner square (rows without a label: none).

    ``size``: the square's side as a fraction of the image's short side (1/7: 4 px at 28 px)."""

    class_name: str
    positive_rate: float
    negative_rate: float
    size: float = 1 / 7

    def __post_init__(self):
        for name in ("positive_rate", "negative_rate"):
            value = getattr(self, name)
            if not 0.0 <= float(value) <= 1.0:
                raise UserError(f"--marker-rates: {name.replace('_', ' ')} must lie in [0, 1], got {value}")
        if not 0.0 < float(self.size) <= 0.5:
            raise UserError(f"shortcut marker size must lie in (0, 0.5] of the short side, got {self.size}")

    def tag(self) -> str:
        """``shortcut<P%>-<N%>``: the folder prefix part that names the rates (e.g. ``shortcut95-05``)."""
        return f"{SHORTCUT}{round(100 * self.positive_rate):02d}-{round(100 * self.negative_rate):02d}"


def add_marker(unit: np.ndarray, size: float = 1 / 7) -> np.ndarray:
    """The image with a bright (1.0) square in its top-left corner, side ``size`` of the short side
    (at least 1 px); float32 in [0, 1], the input untouched."""
    image = np.array(unit, dtype=np.float32, copy=True)
    if image.ndim != 2:
        raise ValueError(f"add_marker expects a (H, W) image, got shape {image.shape}")
    side = max(1, int(round(size * min(image.shape))))
    image[:side, :side] = 1.0
    return image


def marked_rows(frame, spec: Shortcut, seed: int) -> np.ndarray:
    """Boolean mask of the rows that get the marker: in each split, ``round(rate · n)`` of the rows of
    each label, those with the smallest per-image hash (:func:`image_seed`), so the rates are exact
    and the choice depends on the seed and the image paths only (not on the row order)."""
    from fedcxr.vocab import label_column

    column = label_column(spec.class_name)
    if column not in frame:
        raise UserError(f"--marker-class {spec.class_name!r}: the site has no {column} column")
    labels = frame[column].to_numpy(dtype=float)
    hashes = np.array([image_seed(seed, str(p)) for p in frame["image_path"]], dtype=np.int64)
    splits = frame["split"].astype(str).to_numpy()
    marked = np.zeros(len(frame), dtype=bool)
    for split in np.unique(splits):
        for value, rate in ((1.0, spec.positive_rate), (0.0, spec.negative_rate)):
            rows = np.flatnonzero((splits == split) & (labels == value))
            count = int(round(rate * len(rows)))
            chosen = rows[np.argsort(hashes[rows], kind="stable")[:count]]
            marked[chosen] = True
    return marked


def check_shift(kind: str, level: int) -> ShiftLevel:
    """The table row for ``level``; a clear error for an unknown kind or level."""
    if kind not in KINDS:
        raise UserError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    if level not in LEVELS:
        raise UserError(f"--level {level}: expected one of {', '.join(map(str, LEVELS))} (0 = none, 4 = strong)")
    return LEVELS[level]


def image_seed(seed: int, image_path: str) -> int:
    """A per-image seed from the run seed and the image's manifest path (order-independent)."""
    digest = hashlib.sha256(f"fedcxr-shift:{int(seed)}:{image_path}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def shift_image(unit: np.ndarray, kind: str, level: int, *, seed: int = 0) -> np.ndarray:
    """Apply ``kind`` at ``level`` to one grey image in [0, 1] (H, W); returns float32 in [0, 1].

    ``seed`` drives the noise only (gamma and blur are deterministic).
    """
    import torch
    from monai.transforms import AdjustContrast, GaussianSmooth, RandGaussianNoise

    params = check_shift(kind, level)
    image = np.asarray(unit, dtype=np.float32)
    if image.ndim != 2:
        raise ValueError(f"shift_image expects a (H, W) image, got shape {image.shape}")
    x = torch.from_numpy(np.ascontiguousarray(image))[None]  # (1, H, W): MONAI's channel-first
    if kind in ("gamma", "mix") and params.gamma != 1.0:
        # retain_stats=False, invert_image=False: the plain curve on [0, 1] (min/max kept by MONAI)
        x = AdjustContrast(gamma=params.gamma)(x)
    if kind in ("blur", "mix") and params.blur_sigma > 0:
        sigma = params.blur_sigma * min(image.shape)
        x = GaussianSmooth(sigma=sigma)(x)
    if kind in ("noise", "mix") and params.noise_std > 0:
        noise = RandGaussianNoise(prob=1.0, mean=0.0, std=params.noise_std, sample_std=False)
        noise.set_random_state(seed=seed)
        x = noise(x)
    out = torch.as_tensor(x).clamp(0.0, 1.0).numpy().astype(np.float32)[0]
    return out


def shifted_path(image_path: str, kind: str, level, seed: int) -> str:
    """``<kind><level>-seed<seed>/<image_path with .png>`` (relative, POSIX); ``level`` may be empty
    (the shortcut kind names its rates in ``kind``)."""
    rel = PurePosixPath(str(image_path).replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts:
        raise UserError(f"image path {image_path!r} leaves the export root; refusing to write outside OUT")
    name = rel.name if rel.suffix.lower() == ".png" else rel.name + ".png"
    return str(PurePosixPath(f"{kind}{'' if level is None else level}-seed{seed}") / rel.parent / name)


def shift_site(site_dir: Path | str, out: Path | str, *, kind: str, level: Optional[int] = None, seed: int = 0,
               site_name: Optional[str] = None, progress: bool = True,
               shortcut: Optional[Shortcut] = None) -> dict:
    """Write the shifted copy of a site into ``out``; returns the new ``site.json`` payload.

    ``kind`` noise|gamma|blur|mix needs ``level``; ``kind="shortcut"`` needs ``shortcut`` (the
    marker's class and rates) and no level."""
    import torch
    from PIL import Image
    from tqdm import tqdm

    from fedcxr.logs import bar_disabled
    from fedcxr.site_adapters.images import read_image, to_uint8
    from fedcxr.site_adapters.manifest import read_manifest, read_site_json, write_site
    from fedcxr.site_adapters.site_names import site_name as name_of

    params = _check_kind(kind, level, shortcut)
    site_dir, out = Path(site_dir), Path(out)
    try:
        meta = read_site_json(site_dir)
        frame = read_manifest(site_dir)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if shortcut is not None and shortcut.class_name not in (meta.get("class_set") or []):
        raise UserError(f"--marker-class {shortcut.class_name!r}: site {site_dir} does not label it (its classes: "
                        f"{list(meta.get('class_set') or [])})")
    name = name_of(site_name or meta.get("site") or site_dir.name)
    src_root = Path(meta.get("export_root", site_dir))
    img_root = out / "_images" / name
    prefix, tag_level = (shortcut.tag(), None) if shortcut is not None else (kind, level)
    new_paths = [shifted_path(p, prefix, tag_level, seed) for p in frame["image_path"].astype(str)]
    if len(set(new_paths)) != len(new_paths):
        dup = next(p for p in new_paths if new_paths.count(p) > 1)
        raise UserError(f"{site_dir}: two images map to the same shifted file {dup!r} (same name, different "
                        "extension); rename one in the export")
    marked = marked_rows(frame, shortcut, seed) if shortcut is not None else None
    what = shortcut.tag() if shortcut is not None else f"{kind} level {level}"
    bar = tqdm(total=len(frame), desc=f"shifting {name} ({what})", unit="img", disable=bar_disabled(progress))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one small image at a time: threads only contend (≈6x slower on 2 cores)
    try:
        for row, (old, new) in enumerate(zip(frame["image_path"].astype(str), new_paths)):
            try:
                unit = read_image(src_root / old)
            except Exception as exc:  # any decoder failure, named with its file and row
                raise UserError(f"{site_dir}: manifest row {row}: cannot decode {src_root / old}: "
                                f"{type(exc).__name__}: {exc}") from None
            if shortcut is not None:
                shifted = add_marker(unit, shortcut.size) if marked[row] else np.asarray(unit, np.float32)
            else:
                shifted = shift_image(unit, kind, level, seed=image_seed(seed, old))
            target = img_root / new
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            Image.fromarray(to_uint8(shifted), "L").save(tmp, format="PNG")
            tmp.replace(target)
            bar.update(1)
    finally:
        torch.set_num_threads(threads)
        bar.close()
    shifted_frame = frame.copy()
    shifted_frame["image_path"] = new_paths
    options = dict(meta.get("options") or {})
    options["shift"] = {"kind": kind, "level": level, "seed": seed, **params,
                        "from_site": meta.get("site"), "from_content_hash": meta.get("content_hash")}
    payload = write_site(out, name, shifted_frame,
                         classes=list(meta.get("class_counts") or meta.get("class_set") or []),
                         source=str(meta.get("source", "unknown")),
                         adapter_version=str(meta.get("adapter_version", "")), export_root=img_root,
                         set_aside=[], options=options)
    log.info("site %s: %d images shifted (%s, seed %d) into %s", name, len(frame), what, seed, out / name)
    return payload


def _check_kind(kind: str, level: Optional[int], shortcut: Optional[Shortcut]) -> dict:
    """The parameters recorded in ``site.json`` for a valid kind/level/shortcut combination."""
    if kind == SHORTCUT:
        if shortcut is None:
            raise UserError("--kind shortcut needs --marker-rates P N (the marked fraction of positive and of "
                            "negative rows)")
        if level is not None:
            raise UserError("--kind shortcut takes no --level (the marker rates say how strong it is)")
        return {"marker_class": shortcut.class_name, "positive_rate": shortcut.positive_rate,
                "negative_rate": shortcut.negative_rate, "marker_size": shortcut.size}
    if shortcut is not None:
        raise UserError(f"--marker-rates/--marker-class belong to --kind shortcut, not --kind {kind}")
    if level is None:
        raise UserError(f"--kind {kind} needs --level 0..4")
    return asdict(check_shift(kind, level))
