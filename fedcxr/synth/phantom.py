"""Procedural chest-radiograph-like images with learnable findings (numpy + scipy only).

Why: the demo and the tests need images whose findings a small CNN can learn at 32-64 px,
written by every vendor format we ingest, without shipping or downloading any real data.
These are *phantoms*, not simulations of physics: each finding has one distinct, stable
visual signature, and demographics and sites change the picture in documented ways.

Geometry is drawn in normalised coordinates so one description renders at any detector
shape: ``X`` runs left→right and ``Y`` top→bottom, both in ``[-1, 1]`` across the *shorter*
image side (a wider or taller detector sees more of the body at its edges). Image left is
the patient's right, as on a PA film. Densities add: brighter = more attenuating (bone,
fluid, soft tissue), darker = air.

Anatomy: body silhouette (wider for ``M``), neck, two lung fields (one oval field on a
lateral view), mediastinum, heart shadow (lower, to the image right), spine, clavicles,
curved rib bands, lung markings radiating from the hila, stomach bubble; breast shadows for
``F``. Age lowers bone brightness. AP views magnify the heart by 12 % and put scapulae over
the lateral upper lungs. ``race`` adds a small soft-tissue density offset (±0.02): a
synthetic stand-in so that the race auxiliary head has something to find, *not* a model of
anatomy.

Finding signatures (:data:`RENDERED`): see each ``_f_<class>`` function. ``lung_lesion``
(nodule or mass), ``lung_opacity`` (any parenchymal opacity) and ``no_finding`` are derived
labels, drawn through the findings that imply them (:func:`derived_labels`).

Site shifts (:class:`SiteStyle`): rotation, shift and zoom of the patient, contrast, gamma,
intensity offset, blur and noise.

Output of :func:`render`: ``float32`` array ``(H, W)`` in ``[0, 1]``; ~1 ms at 64 × 64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np
from scipy import ndimage

from fedcxr.vocab import ADDED_CLASSES

VIEWS = ("PA", "AP", "LATERAL")

#: Race offsets (soft-tissue density): deliberately small, see module doc.
RACE_OFFSET = {"white": 0.0, "black": 0.02, "asian": -0.01, "hispanic": 0.01, "other": -0.02}

LUNG_DARKENING = 0.34  # how much aerated lung darkens the soft-tissue level
TISSUE = 0.50  # soft-tissue brightness of the body before lungs are cut out


@dataclass(frozen=True)
class Subject:
    """What one image shows: demographics, projection and the set of true findings."""

    sex: str = "M"  # "M" or "F"
    age: float = 55.0  # years
    race: Optional[str] = None  # canonical race name (fedcxr.vocab.AUX_VOCAB["race"]) or None
    view: str = "PA"  # "PA", "AP" or "LATERAL"
    findings: frozenset = frozenset()  # canonical class names drawn in the image


@dataclass(frozen=True)
class SiteStyle:
    """A hospital's acquisition look (per-site domain shift).

    ``blur`` and ``noise`` are in pixels / intensity units at a 64-px short side and scale
    with the image; rotations in degrees; shifts in normalised units.
    """

    contrast: float = 1.0
    gamma: float = 1.0
    offset: float = 0.0
    noise: float = 0.015
    blur: float = 0.4
    max_rotation: float = 3.0
    max_shift: float = 0.04
    zoom: tuple[float, float] = (0.96, 1.04)


@dataclass
class Lung:
    """One lung field: centre, radii and the sign of its lateral direction (+1: image right)."""

    cx: float
    cy: float
    rx: float
    ry: float
    side: float

    def coords(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lateral, vertical) lung-relative coordinates: ``lat`` = 1 at the lateral edge."""
        return (X - self.cx) / self.rx * self.side, (Y - self.cy) / self.ry


@dataclass
class Anatomy:
    """Geometry of one patient before drawing (findings may edit it, e.g. a bigger heart)."""

    body_rx: float
    lungs: list[Lung]
    heart: tuple[float, float, float, float]  # cx, cy, rx, ry
    mediastinum_halfwidth: float
    bone: float  # rib/spine brightness factor (falls with age)
    tissue: float
    lung_dark: float = LUNG_DARKENING
    texture: float = 1.0  # lung markings amplitude
    lateral: bool = False
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- primitives


def soft_ellipse(X, Y, cx, cy, rx, ry, edge: float = 0.03, taper: float = 0.0) -> np.ndarray:
    """1 inside the ellipse, 0 outside, a linear ramp ``edge`` (normalised units) wide.

    ``taper`` > 0 narrows the top and widens the bottom (a lung's apex and base).
    """
    dy = (Y - cy) / ry
    width = rx * (1.0 + taper * np.clip(dy, -1.0, 1.0)) if taper else rx
    d = np.sqrt(((X - cx) / width) ** 2 + dy ** 2)
    return np.clip(0.5 + (1.0 - d) * min(rx, ry) / edge, 0.0, 1.0)


def blob(X, Y, cx, cy, sigma: float, sy: Optional[float] = None) -> np.ndarray:
    """Gaussian bump of height 1 (optionally elongated: ``sy`` vertical sigma)."""
    sy = sigma if sy is None else sy
    return np.exp(-(((X - cx) / sigma) ** 2 + ((Y - cy) / sy) ** 2) / 2.0)


def segment(X, Y, x0, y0, x1, y1, width: float) -> np.ndarray:
    """Gaussian-profile line from (x0, y0) to (x1, y1); ``width`` is the profile sigma."""
    dx, dy = x1 - x0, y1 - y0
    t = np.clip(((X - x0) * dx + (Y - y0) * dy) / (dx * dx + dy * dy + 1e-12), 0.0, 1.0)
    dist2 = (X - x0 - t * dx) ** 2 + (Y - y0 - t * dy) ** 2
    return np.exp(-dist2 / (2.0 * width * width))


def sigmoid(z) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def lowres_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int = 6) -> np.ndarray:
    """Smooth noise in about [-1, 1]: a ``cells``-grid of normals, bilinearly upsampled."""
    small = rng.standard_normal((cells, cells))
    out = ndimage.zoom(small, (shape[0] / cells, shape[1] / cells), order=1, mode="nearest", grid_mode=True)
    return out[: shape[0], : shape[1]] / 1.5


def grid(shape: tuple[int, int], rng: np.random.Generator, style: SiteStyle) -> tuple[np.ndarray, np.ndarray]:
    """Normalised (X, Y) of every pixel after the site's random rotation, shift and zoom."""
    h, w = shape
    s = min(h, w) / 2.0
    ys = (np.arange(h, dtype=np.float32) + 0.5 - h / 2.0) / s
    xs = (np.arange(w, dtype=np.float32) + 0.5 - w / 2.0) / s
    Xg, Yg = np.meshgrid(xs, ys)
    angle = math.radians(rng.uniform(-style.max_rotation, style.max_rotation))
    zoom = rng.uniform(*style.zoom)
    tx, ty = rng.uniform(-style.max_shift, style.max_shift, size=2)
    c, sn = math.cos(angle) / zoom, math.sin(angle) / zoom
    X = c * Xg - sn * Yg - tx
    Y = sn * Xg + c * Yg - ty
    return X.astype(np.float32), Y.astype(np.float32)


# --------------------------------------------------------------------------- anatomy


def anatomy(subject: Subject, rng: np.random.Generator) -> Anatomy:
    """Patient geometry from demographics and view (before findings edit it)."""
    male = subject.sex == "M"
    jitter = lambda scale: float(rng.normal(0.0, scale))  # noqa: E731 - tiny local helper
    bone = float(np.clip(1.15 - 0.0075 * max(subject.age - 25.0, 0.0), 0.55, 1.15))
    tissue = TISSUE + RACE_OFFSET.get(subject.race or "", 0.0) + jitter(0.01)
    if subject.view == "LATERAL":
        lung = Lung(-0.02 + jitter(0.02), -0.05 + jitter(0.02), 0.55 + jitter(0.02), 0.58 + jitter(0.02), 1.0)
        return Anatomy(
            body_rx=0.78 + (0.05 if male else 0.0), lungs=[lung],
            heart=(-0.22, 0.30, 0.30, 0.26), mediastinum_halfwidth=0.0, bone=bone, tissue=tissue,
            lateral=True,
        )
    width = 1.0 + (0.06 if male else -0.02) + jitter(0.02)
    lungs = [
        Lung(-0.36 * width, -0.02 + jitter(0.015), 0.27 * width, 0.55 + jitter(0.02), -1.0),
        Lung(0.36 * width, 0.00 + jitter(0.015), 0.26 * width, 0.52 + jitter(0.02), 1.0),
    ]
    magnify = 1.12 if subject.view == "AP" else 1.0
    heart = (0.10 + jitter(0.01), 0.30, 0.25 * magnify * (1.0 + jitter(0.03)), 0.21 * magnify)
    return Anatomy(
        body_rx=0.80 * width, lungs=lungs, heart=heart, mediastinum_halfwidth=0.12,
        bone=bone, tissue=tissue,
    )


def _draw_anatomy(X, Y, a: Anatomy, subject: Subject, rng) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Base image, heart mask and per-lung masks (lungs already exclude the heart)."""
    body = soft_ellipse(X, Y, 0.0, 0.25, a.body_rx, 1.15, edge=0.05)
    if not a.lateral:
        body = np.maximum(body, soft_ellipse(X, Y, 0.0, -1.0, 0.17, 0.45))  # neck
        shoulders = soft_ellipse(X, Y, 0.0, -0.45, a.body_rx * 1.08, 0.35, edge=0.05)
        body = np.maximum(body, shoulders)
    img = 0.04 + a.tissue * body
    hx, hy, hrx, hry = a.heart
    heart = soft_ellipse(X, Y, hx, hy, hrx, hry)
    taper = 0.0 if a.lateral else 0.3
    lungs = [soft_ellipse(X, Y, l.cx, l.cy, l.rx, l.ry, taper=taper) for l in a.lungs]
    medi = np.zeros_like(X)
    if a.mediastinum_halfwidth > 0:
        medi = soft_ellipse(X, Y, 0.0, -0.2, a.mediastinum_halfwidth, 0.62)
    cover = np.maximum(heart, medi)
    lungs = [m * (1.0 - cover) for m in lungs]
    lung_any = np.maximum.reduce(lungs) if len(lungs) > 1 else lungs[0]
    img = img - a.lung_dark * lung_any
    img += 0.05 * a.texture * lung_any * _markings(X, Y, a, rng)
    img += a.bone * _bones(X, Y, a, body, lung_any)
    if not a.lateral:
        img -= 0.12 * soft_ellipse(X, Y, 0.42, 0.72, 0.09, 0.06) * body  # stomach bubble
        if subject.sex == "F":
            for side in (-1.0, 1.0):
                img += 0.05 * soft_ellipse(X, Y, 0.45 * side, 0.55, 0.26, 0.2, edge=0.08)
        if subject.view == "AP":
            for side in (-1.0, 1.0):
                img += 0.07 * a.bone * soft_ellipse(X, Y, 0.66 * side, -0.32, 0.13, 0.32, edge=0.06)
    return img, heart, lungs


def _markings(X, Y, a: Anatomy, rng) -> np.ndarray:
    """Vessel-like streaks radiating from the hila plus smooth noise, about [-1, 1]."""
    out = 0.5 * lowres_noise(rng, X.shape)
    for lung in a.lungs:
        hx = lung.cx - lung.side * 0.7 * lung.rx
        ang = np.arctan2(Y - lung.cy, (X - hx) * lung.side)
        out += 0.5 * np.cos(11.0 * ang + rng.uniform(0, 2 * np.pi)) * np.exp(-np.hypot(X - hx, Y - lung.cy))
    return out


def _bones(X, Y, a: Anatomy, body, lung_any) -> np.ndarray:
    """Ribs (curved bands), spine and clavicles, before the bone-density factor."""
    if a.lateral:
        spine = soft_ellipse(X, Y, 0.5, 0.1, 0.08, 1.2) * (0.8 + 0.2 * np.cos(Y * 22.0))
        return 0.16 * spine + 0.05 * lung_any * (0.5 + 0.5 * np.cos(2 * np.pi * (Y * 4.5 - 0.3 * X))) ** 4
    ribs = (0.5 + 0.5 * np.cos(2 * np.pi * (Y * 5.0 + 0.55 * X * X))) ** 4
    out = 0.07 * ribs * (0.4 * body + 0.6 * lung_any)
    out += 0.14 * soft_ellipse(X, Y, 0.0, 0.0, 0.06, 1.3) * (0.8 + 0.2 * np.cos(Y * 24.0)) * body
    for side in (-1.0, 1.0):
        out += 0.16 * segment(X, Y, 0.12 * side, -0.62, 0.72 * side, -0.74, 0.03)
    return out


# --------------------------------------------------------------------------- findings
#
# Geometry editors run before the anatomy is drawn; painters add densities afterwards.
# Each painter: (img, X, Y, anatomy, lung masks, rng) -> img.


def _edit_cardiomegaly(a: Anatomy, rng) -> None:
    hx, hy, hrx, hry = a.heart
    f = rng.uniform(1.35, 1.5)
    a.heart = (hx + 0.03, hy - 0.02, hrx * f, hry * (1.0 + 0.5 * (f - 1.0)))


def _edit_enlarged_cardiomediastinum(a: Anatomy, rng) -> None:
    a.mediastinum_halfwidth *= rng.uniform(2.0, 2.4)
    if a.lateral:
        hx, hy, hrx, hry = a.heart
        a.heart = (hx, hy - 0.05, hrx * 1.1, hry * 1.25)


def _edit_emphysema(a: Anatomy, rng) -> None:
    for lung in a.lungs:
        lung.ry *= 1.12
        lung.cy += 0.05
        lung.rx *= 1.04
    hx, hy, hrx, hry = a.heart
    a.heart = (hx, hy + 0.04, hrx * 0.88, hry)
    a.lung_dark *= 1.22
    a.texture *= 0.35


def _edit_atelectasis(a: Anatomy, rng) -> None:
    lung = a.lungs[int(rng.integers(len(a.lungs)))]
    lung.ry *= 0.85
    lung.cy -= 0.06
    a.extra["atelectasis_lung"] = lung


def _edit_fibrosis(a: Anatomy, rng) -> None:
    for lung in a.lungs:
        lung.ry *= 0.94
        lung.cy -= 0.02


def _pick(lungs: list, rng) -> int:
    return int(rng.integers(len(lungs)))


def _f_pleural_effusion(img, X, Y, a, masks, rng):
    """Bright fluid filling a lung base, with a meniscus rising laterally (blunted angle)."""
    sides = range(len(a.lungs)) if rng.random() < 0.3 else [_pick(a.lungs, rng)]
    for k in sides:
        lat, v = a.lungs[k].coords(X, Y)
        level = rng.uniform(0.25, 0.55)
        fluid = sigmoid((v - (level - 0.45 * np.clip(lat, -1, 1))) / 0.06) * masks[k]
        img = img + 0.95 * a.lung_dark * fluid
    return img


def _f_pneumothorax(img, X, Y, a, masks, rng):
    """Dark rim without lung markings at an apex, bounded by a thin bright pleural line."""
    k = _pick(a.lungs, rng)
    lung = a.lungs[k]
    f = rng.uniform(0.25, 0.38)
    inner = soft_ellipse(
        X, Y, lung.cx - lung.side * f * lung.rx * 0.5, lung.cy + f * lung.ry * 0.6,
        lung.rx * (1 - f), lung.ry * (1 - 0.6 * f), edge=0.02,
    )
    lat, v = lung.coords(X, Y)
    rim = masks[k] * (1.0 - inner) * sigmoid(-(v - 0.3) / 0.1)
    line = masks[k] * np.exp(-(((inner - 0.5) / 0.22) ** 2)) * sigmoid(-(v - 0.3) / 0.1)
    return img - 0.16 * rim + 0.09 * line


def _spots_in(lung: Lung, rng, n: int, margin: float = 0.7) -> list[tuple[float, float]]:
    """``n`` random points well inside a lung field."""
    pts = []
    for _ in range(n):
        r, t = margin * math.sqrt(rng.random()), rng.uniform(0, 2 * math.pi)
        pts.append((lung.cx + r * lung.rx * math.cos(t), lung.cy + r * lung.ry * math.sin(t)))
    return pts


def _f_nodule(img, X, Y, a, masks, rng):
    """Two to four small bright round spots (σ ≈ 0.035: 1-2 px at 64 px)."""
    for _ in range(int(rng.integers(2, 5))):
        (x, y), = _spots_in(a.lungs[_pick(a.lungs, rng)], rng, 1)
        img = img + 0.3 * blob(X, Y, x, y, rng.uniform(0.03, 0.045))
    return img


def _f_mass(img, X, Y, a, masks, rng):
    """One larger, lobulated bright blob."""
    (x, y), = _spots_in(a.lungs[_pick(a.lungs, rng)], rng, 1, margin=0.55)
    s = rng.uniform(0.09, 0.13)
    return img + 0.32 * np.maximum(blob(X, Y, x, y, s), 0.8 * blob(X, Y, x + 0.6 * s, y - 0.4 * s, 0.7 * s))


def _f_consolidation(img, X, Y, a, masks, rng):
    """Dense, homogeneous lobar opacity in one lung's mid/lower zone with a fuzzy border."""
    k = _pick(a.lungs, rng)
    lung = a.lungs[k]
    cy = lung.cy + lung.ry * rng.uniform(0.0, 0.35)
    cx = lung.cx + lung.side * lung.rx * rng.uniform(-0.1, 0.25)
    patch = soft_ellipse(X, Y, cx, cy, lung.rx * 0.65, lung.ry * 0.38, edge=0.1)
    return img + 0.8 * a.lung_dark * patch * masks[k] * (0.85 + 0.15 * lowres_noise(rng, X.shape, 8))


def _f_pneumonia(img, X, Y, a, masks, rng):
    """Patchy opacity: several medium soft blobs clustered in a lower zone."""
    k = _pick(a.lungs, rng)
    lung = a.lungs[k]
    acc = np.zeros_like(X)
    cx0, cy0 = lung.cx + lung.side * 0.1 * lung.rx, lung.cy + 0.4 * lung.ry
    for _ in range(int(rng.integers(4, 7))):
        x, y = cx0 + rng.normal(0, 0.35 * lung.rx), cy0 + rng.normal(0, 0.2 * lung.ry)
        acc = np.maximum(acc, blob(X, Y, x, y, rng.uniform(0.06, 0.09)))
    return img + 0.55 * a.lung_dark * acc * masks[k]


def _f_infiltration(img, X, Y, a, masks, rng):
    """Diffuse faint blotches scattered over both mid zones."""
    acc = np.zeros_like(X)
    for lung in a.lungs:
        for x, y in _spots_in(lung, rng, int(rng.integers(4, 7)), margin=0.8):
            acc = np.maximum(acc, blob(X, Y, x, y, rng.uniform(0.05, 0.07)))
    lung_any = np.maximum.reduce(masks) if len(masks) > 1 else masks[0]
    return img + 0.4 * a.lung_dark * acc * lung_any


def _f_edema(img, X, Y, a, masks, rng):
    """Bilateral perihilar ("bat-wing") haze fading towards the periphery."""
    out = img
    for lung, m in zip(a.lungs, masks):
        hx = lung.cx - lung.side * 0.45 * lung.rx
        haze = blob(X, Y, hx, lung.cy + 0.1 * lung.ry, 0.55 * lung.rx, 0.55 * lung.ry)
        out = out + 0.6 * a.lung_dark * haze * m
    return out


def _f_atelectasis(img, X, Y, a, masks, rng):
    """A plate-like bright band across a lower zone (the lung's volume loss is the editor's)."""
    lung = a.extra.get("atelectasis_lung") or a.lungs[_pick(a.lungs, rng)]
    k = a.lungs.index(lung)
    y = lung.cy + lung.ry * rng.uniform(0.2, 0.45)
    tilt = rng.uniform(-0.08, 0.08)
    band = segment(X, Y, lung.cx - 0.8 * lung.rx, y - tilt, lung.cx + 0.8 * lung.rx, y + tilt, 0.035)
    return img + 0.75 * a.lung_dark * band * np.clip(masks[k] * 1.5, 0, 1)


def _f_emphysema(img, X, Y, a, masks, rng):
    """Hyperlucent lungs (the editor enlarged them and thinned the markings): bullae."""
    (x, y), = _spots_in(a.lungs[_pick(a.lungs, rng)], rng, 1, margin=0.5)
    lung_any = np.maximum.reduce(masks) if len(masks) > 1 else masks[0]
    return img - 0.08 * soft_ellipse(X, Y, x, y - 0.2, 0.12, 0.1, edge=0.04) * lung_any


def _f_fibrosis(img, X, Y, a, masks, rng):
    """Coarse reticular net in the lower, peripheral lung zones."""
    out = img
    phase = rng.uniform(0, 2 * np.pi, size=2)
    net = np.maximum(np.cos(19.0 * X + phase[0]), np.cos(19.0 * Y + phase[1])) > 0.75
    for lung, m in zip(a.lungs, masks):
        lat, v = lung.coords(X, Y)
        zone = sigmoid((v - 0.0) / 0.15) * sigmoid((lat - 0.1) / 0.15)
        out = out + 0.6 * a.lung_dark * net * zone * m
    return out


def _f_pleural_thickening(img, X, Y, a, masks, rng):
    """A bright rim along the lateral and apical lung edge (apical cap)."""
    k = _pick(a.lungs, rng)
    lung = a.lungs[k]
    inner = soft_ellipse(X, Y, lung.cx - lung.side * 0.04, lung.cy + 0.06, lung.rx * 0.8, lung.ry * 0.88, edge=0.03, taper=0.3)
    lat, v = lung.coords(X, Y)
    return img + 1.0 * a.lung_dark * masks[k] * (1.0 - inner) * sigmoid(-(v + 0.1) / 0.2)


def _f_hernia(img, X, Y, a, masks, rng):
    """Retrocardiac bubble: a dark round air pocket with a bright rim behind the heart."""
    hx, hy, hrx, hry = a.heart
    x, y, r = hx - 0.05, hy + 0.35 * hry, rng.uniform(0.1, 0.13)
    inside = soft_ellipse(X, Y, x, y, r, r * 0.85, edge=0.02)
    rim = soft_ellipse(X, Y, x, y, r * 1.25, r * 1.1, edge=0.02) - inside
    return img - 0.22 * inside + 0.12 * rim


def _f_pleural_other(img, X, Y, a, masks, rng):
    """Calcified pleural plaques: one to three small very bright elongated spots laterally."""
    out = img
    for _ in range(int(rng.integers(1, 4))):
        lung = a.lungs[_pick(a.lungs, rng)]
        t = rng.uniform(-0.6, 0.6)
        x, y = lung.cx + lung.side * lung.rx * 0.95 * math.cos(t), lung.cy + lung.ry * math.sin(t)
        out = out + 0.45 * blob(X, Y, x, y, 0.025, 0.07)
    return out


def _f_fracture(img, X, Y, a, masks, rng):
    """Rib fracture: bright callus with a dark gap at a lateral rib."""
    lung = a.lungs[_pick(a.lungs, rng)]
    t = rng.uniform(-0.7, 0.3)
    x, y = lung.cx + lung.side * lung.rx * 0.9 * math.cos(t), lung.cy + lung.ry * 0.9 * math.sin(t)
    return img + 0.4 * blob(X, Y, x, y, 0.05, 0.035) - 0.25 * blob(X, Y, x, y, 0.012, 0.05)


def _f_support_devices(img, X, Y, a, masks, rng):
    """Very bright thin lines and discs: tube, central line, ECG leads, pacemaker."""
    w = 0.018
    out = img
    devices = rng.permutation(["tube", "line", "leads", "pacer"])[: int(rng.integers(1, 4))]
    for dev in devices:
        if dev == "tube":
            out = out + 0.5 * segment(X, Y, 0.02, -1.3, 0.02, -0.35 + rng.uniform(-0.05, 0.05), w)
        elif dev == "line":
            side = rng.choice([-1.0, 1.0])
            out = out + 0.45 * segment(X, Y, 0.55 * side, -0.72, 0.05, -0.15 + rng.uniform(-0.05, 0.1), w)
        elif dev == "leads":
            for _ in range(3):
                x, y = rng.uniform(-0.7, 0.7), rng.uniform(-0.6, 0.5)
                ring = soft_ellipse(X, Y, x, y, 0.06, 0.06, 0.015) - soft_ellipse(X, Y, x, y, 0.035, 0.035, 0.015)
                out = out + 0.45 * ring
        else:
            px, py = 0.5, -0.58
            out = out + 0.55 * soft_ellipse(X, Y, px, py, 0.1, 0.07, 0.02)
            out = out + 0.4 * segment(X, Y, px - 0.05, py, a.heart[0], a.heart[1], w)
    return out


def _f_covid19(img, X, Y, a, masks, rng):
    """Peripheral, bilateral, lower-zone ground-glass patches (markings stay visible)."""
    out = img
    for lung, m in zip(a.lungs, masks):
        lat, v = lung.coords(X, Y)
        band = sigmoid((lat - 0.35) / 0.12) * sigmoid((v + 0.1) / 0.15)
        patchy = 0.75 + 0.35 * lowres_noise(rng, X.shape, 7)
        out = out + 0.6 * a.lung_dark * band * np.clip(patchy, 0, 1) * m
    return out


EDITORS: dict[str, Callable[[Anatomy, np.random.Generator], None]] = {
    "cardiomegaly": _edit_cardiomegaly,
    "enlarged_cardiomediastinum": _edit_enlarged_cardiomediastinum,
    "emphysema": _edit_emphysema,
    "atelectasis": _edit_atelectasis,
    "fibrosis": _edit_fibrosis,
}

PAINTERS: dict[str, Callable] = {
    "pleural_effusion": _f_pleural_effusion,
    "pneumothorax": _f_pneumothorax,
    "nodule": _f_nodule,
    "mass": _f_mass,
    "consolidation": _f_consolidation,
    "pneumonia": _f_pneumonia,
    "infiltration": _f_infiltration,
    "edema": _f_edema,
    "atelectasis": _f_atelectasis,
    "emphysema": _f_emphysema,
    "fibrosis": _f_fibrosis,
    "pleural_thickening": _f_pleural_thickening,
    "hernia": _f_hernia,
    "pleural_other": _f_pleural_other,
    "fracture": _f_fracture,
    "support_devices": _f_support_devices,
    "covid19": _f_covid19,
}

#: Classes with a visual signature of their own.
RENDERED: frozenset = frozenset(EDITORS) | frozenset(PAINTERS)

#: Derived labels: class → the rendered findings that imply it.
DERIVED: dict[str, frozenset] = {
    "lung_lesion": frozenset({"nodule", "mass"}),
    "lung_opacity": frozenset({
        "consolidation", "pneumonia", "infiltration", "edema", "atelectasis", "covid19",
        "pleural_effusion", "mass",
    }),
}
#: Canonical classes no phantom shows: those added for VinDr-CXR, Open-i and PadChest
#: (:data:`fedcxr.vocab.ADDED_CLASSES`). No synthetic hospital labels them, so :func:`truth`
#: leaves them out rather than claiming a negative the image cannot show.
NOT_DRAWN: frozenset = frozenset(ADDED_CLASSES)
#: Findings that do not clear ``no_finding`` (CheXpert convention: devices are not a disease).
NOT_A_FINDING: frozenset = frozenset({"support_devices"})

# Painting order: large soft opacities first, small bright details last.
_ORDER = [
    "edema", "covid19", "infiltration", "pneumonia", "consolidation", "pleural_effusion",
    "atelectasis", "fibrosis", "emphysema", "pneumothorax", "pleural_thickening", "mass",
    "nodule", "hernia", "pleural_other", "fracture", "support_devices",
]


def derived_labels(findings: Iterable[str]) -> dict[str, int]:
    """0/1 for every derived class (``lung_lesion``, ``lung_opacity``, ``no_finding``)."""
    found = frozenset(findings)
    out = {cls: int(bool(found & implied)) for cls, implied in DERIVED.items()}
    out["no_finding"] = int(not (found - NOT_A_FINDING))
    return out


def truth(findings: Iterable[str]) -> dict[str, int]:
    """0/1 for every canonical class a phantom can show (rendered and derived)."""
    found = frozenset(findings)
    out = {cls: int(cls in found) for cls in sorted(RENDERED)}
    out.update(derived_labels(found))
    return out


# --------------------------------------------------------------------------- rendering


def render(
    subject: Subject,
    shape: tuple[int, int] = (64, 64),
    style: SiteStyle = SiteStyle(),
    rng: Optional[np.random.Generator] = None,
) -> np.ndarray:
    """Draw one phantom: ``float32`` ``(H, W)`` in ``[0, 1]`` (bright = dense).

    Deterministic for a given ``rng`` state. Raises ``ValueError`` for an unknown finding
    or view (a derived class such as ``lung_opacity`` cannot be drawn directly).
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    unknown = set(subject.findings) - RENDERED
    if unknown:
        raise ValueError(f"cannot draw finding(s) {sorted(unknown)}; drawable: {sorted(RENDERED)}")
    if subject.view not in VIEWS:
        raise ValueError(f"unknown view {subject.view!r}; expected one of {VIEWS}")
    X, Y = grid(shape, rng, style)
    a = anatomy(subject, rng)
    for name in sorted(subject.findings & EDITORS.keys()):
        EDITORS[name](a, rng)
    img, _heart, masks = _draw_anatomy(X, Y, a, subject, rng)
    for name in _ORDER:
        if name in subject.findings:
            img = PAINTERS[name](img, X, Y, a, masks, rng)
    return _acquire(img, style, rng, min(shape))


def _acquire(img: np.ndarray, style: SiteStyle, rng, short_side: int) -> np.ndarray:
    """Detector look: blur, contrast/offset/gamma, noise; clipped to [0, 1]."""
    scale = short_side / 64.0
    if style.blur > 0:
        img = ndimage.gaussian_filter(img, style.blur * scale, mode="nearest")
    img = np.clip(0.5 + style.contrast * (img - 0.45) + style.offset, 0.0, 1.0)
    if style.gamma != 1.0:
        img = img ** style.gamma
    if style.noise > 0:
        img = img + rng.normal(0.0, style.noise, size=img.shape)
    return np.clip(img, 0.0, 1.0).astype(np.float32)
