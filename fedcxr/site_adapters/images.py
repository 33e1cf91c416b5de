"""The one image decode path: DICOM, PNG and JPEG → a 2-D float32 array in [0, 1].

Training's cache (:func:`read_image_resized`, from ``pipeline/data.py``), ingest's
``--verify-pixels`` check (:mod:`fedcxr.site_adapters.image_checks`), ``fedcxr predict``, the
bundle and ``fedcxr shift`` all decode through this module, so an image that passes ingest
decodes the same way in training. Each decode first reads the file's header
(:mod:`fedcxr.site_adapters.image_headers`: kind, size, the ``max_pixels`` budget).

Decoding rules (DESIGN §3):

* **Orientation** is pydicom's / PIL's: ``array[row, col]``, shape ``(Rows, Columns)``. MONAI's
  loaders return the transpose; never mix the two without ``.T``.
* **DICOM**: ``pydicom.dcmread(force=True)``; a file with no preamble and no file meta gets
  the transfer syntax its encoding implies (implicit VR little endian for the classic
  ``CR-MONO1`` sample). Compressed syntaxes are decoded by pydicom's plugins (pylibjpeg +
  openjpeg + libjpeg: JPEG baseline/extended, JPEG lossless, JPEG-LS, JPEG 2000, RLE).
  Only the **first frame** of a multi-frame object is decoded. Monochrome images go through
  the display pipeline a viewer (or a PACS "export as JPEG") uses, with pydicom's own
  functions: the **Modality LUT** (LUT sequence or rescale slope/intercept,
  ``pydicom.pixels.apply_modality_lut``), then the **VOI LUT** (``VOILUTSequence``, else
  ``WindowCenter``/``WindowWidth`` with ``VOILUTFunction``; the first view when several are
  given; ``pydicom.pixels.apply_voi_lut``). So a DICOM and a JPEG/PNG exported from it by a
  viewer decode to the same image. A window or VOI LUT that is present but unusable (a
  centre that is not a number, a LINEAR width < 1, an unknown function) is an
  :class:`ImageError` naming the tag: ingest sets the file aside, it never becomes a
  traceback. A blank window value counts as absent. ``PALETTE COLOR`` goes through its
  colour LUT.
* **Scaling**: by the image's own min/max to [0, 1] for every format — bits stored vary
  (8, 10, 15, 16 in real exports), so fixed divisors (4095, 65535) would leave most images
  dark. A constant image comes out all zeros.
* **MONOCHROME1** (bright = low value) is inverted after scaling (``1 - x``) so that bone is
  bright everywhere. MONAI's DICOM reader does not do this. ``PresentationLUTShape``
  ``INVERSE`` asks for the same inversion: the DX IOD requires INVERSE exactly when the
  image is MONOCHROME1 (both say "low values are white", so the pair inverts once), and on a
  MONOCHROME2 image it inverts it. Any other shape than IDENTITY/INVERSE is an
  :class:`ImageError`.
* **Colour** (RGB/RGBA/palette PNG or JPEG, RGB/YBR DICOM) → grey with ITU-R 601 luma
  (``0.299 R + 0.587 G + 0.114 B``, Pillow's ``L``); alpha is dropped.

Memory is bounded before any decode: the header's declared size is checked against
``max_pixels`` (:class:`~fedcxr.site_adapters.image_headers.ImageTooLarge`, nothing decoded) and
Pillow's decompression-bomb guard is set to the same limit
(:func:`~fedcxr.site_adapters.image_headers.pil_pixel_limit`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from fedcxr.site_adapters.image_headers import (
    KIND_DICOM,
    MAX_PIXELS,
    ImageError,
    ImageTooLarge,
    NotAnImageFile,
    pil_pixel_limit,
    presentation_inverse,
    quiet_pydicom,
    read_header,
    short_reason,
    sniff_kind,
    str_tag,
    transfer_syntax,
    voi_present,
    voi_tags,
)


def read_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode one image: float32 ``(rows, cols)`` in [0, 1], grey, pydicom/PIL orientation.

    See the module doc for the rules (first frame, Modality LUT, min/max scaling, MONOCHROME1
    inversion, colour → luma). Raises :class:`ImageError` for files that are not images,
    :class:`ImageTooLarge` (before decoding) for a header over ``max_pixels``, and the
    decoder's own exception when the pixel data is corrupt.
    """
    path = os.fspath(path)
    ensure_pixel_budget(path, max_pixels)
    return decode_unit(path, None, max_pixels)


def ensure_pixel_budget(path: str, max_pixels: int) -> None:
    """Raise :class:`ImageTooLarge` when the header declares too many values, :class:`NotAnImageFile`
    for a named pipe, socket or device (the decoder would block on it); nothing else.

    Other header problems are left to the decoder, which reports them in its own words.
    """
    try:
        read_header(path, max_pixels)
    except (ImageTooLarge, NotAnImageFile):
        raise
    except Exception:  # noqa: BLE001 — the decode that follows names the problem
        pass


def decode_unit(path: str, draft: Optional[int], max_pixels: int) -> np.ndarray:
    """The decode of :func:`read_image` without its header check (the caller has read the header):
    float32 [0, 1]; JPEGs at the smallest DCT scale ≥ ``draft`` when given; Pillow bounded by
    ``max_pixels``."""
    with pil_pixel_limit(max_pixels):
        return _read_unit(path, draft=draft)


def read_image_resized(path: str | Path, size: int, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """:func:`read_image` resized to ``(size, size)`` and quantised to uint8 (0–255).

    The aspect ratio is not kept (the whole image is squeezed into the square, as MONAI's
    ``Resize`` does); antialiased bilinear resampling (Pillow). JPEGs are decoded at the
    smallest DCT scale that is still ≥ ``size`` (Pillow ``draft``), which is much faster for
    large JPEGs and indistinguishable after the resize. Training caches these arrays. The
    header is checked against ``max_pixels`` first (:class:`ImageTooLarge`, nothing decoded).
    """
    from PIL import Image

    path = os.fspath(path)
    ensure_pixel_budget(path, max_pixels)
    unit = decode_unit(path, int(size), max_pixels)
    image = Image.fromarray(unit, mode="F") if unit.shape != (size, size) else None
    if image is not None:
        unit = np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0))
    return to_uint8(unit)


def to_uint8(unit: np.ndarray) -> np.ndarray:
    """[0, 1] floats → uint8 0–255 (rounded, clipped)."""
    return np.clip(np.rint(unit * 255.0), 0, 255).astype(np.uint8)


def _read_unit(path: str, *, draft: Optional[int]) -> np.ndarray:
    kind = sniff_kind(path)
    if kind == KIND_DICOM:
        values, invert = _decode_dicom(path)
    else:
        values, invert = _decode_pil(path, draft), False
    return scale_unit(values, invert=invert)


def scale_unit(values: np.ndarray, *, invert: bool = False) -> np.ndarray:
    """Min/max scale to float32 [0, 1]; ``invert`` gives ``1 - x`` (MONOCHROME1)."""
    out = np.asarray(values, dtype=np.float32)
    if not np.isfinite(out).all():
        out = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(out.min()), float(out.max())
    if hi <= lo:
        return np.zeros(out.shape, dtype=np.float32)
    out = (out - np.float32(lo)) / np.float32(hi - lo)  # divide (not × 1/range): max → exactly 1
    return 1.0 - out if invert else out


def _decode_dicom(path: str) -> tuple[np.ndarray, bool]:
    """First frame after the Modality and VOI LUTs (or colour → luma); ``invert`` for
    MONOCHROME1 or Presentation LUT Shape INVERSE."""
    with quiet_pydicom():
        return _decode_dicom_inner(path)


def _decode_dicom_inner(path: str) -> tuple[np.ndarray, bool]:
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.pixels import apply_color_lut, apply_modality_lut

    try:
        ds = pydicom.dcmread(path, force=True)
    except Exception as exc:
        raise ImageError(f"unreadable DICOM: {short_reason(exc)}") from None
    if not any(keyword in ds for keyword in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise ImageError("DICOM has no pixel data")
    if getattr(ds, "file_meta", None) is None:
        ds.file_meta = FileMetaDataset()
    if not ds.file_meta.get("TransferSyntaxUID"):
        ds.file_meta.TransferSyntaxUID = transfer_syntax(ds)
    ds.pixel_array_options(index=0)
    arr = ds.pixel_array
    photometric = (str_tag(ds, "PhotometricInterpretation") or "MONOCHROME2").upper()
    if photometric == "PALETTE COLOR":
        arr = apply_color_lut(arr, ds)
    if arr.ndim == 3:
        return _luma(arr), False
    values = apply_modality_lut(arr, ds)
    if photometric in ("MONOCHROME1", "MONOCHROME2"):  # the only ones a VOI LUT is defined for
        values = apply_voi(values, ds)
    return values, photometric == "MONOCHROME1" or presentation_inverse(ds)


def apply_voi(values: np.ndarray, ds) -> np.ndarray:
    """``values`` (after the Modality LUT) through the dataset's VOI LUT or window, if any.

    Uses ``pydicom.pixels.apply_voi_lut`` (a VOI LUT sequence wins over a window, as in
    pydicom); raises :class:`ImageError` naming the tags when they cannot be applied.
    """
    from pydicom.pixels import apply_voi_lut

    tags = voi_tags(ds)  # as written in the file, before the values are normalised
    if not voi_present(ds):
        return values
    try:
        out = apply_voi_lut(values, ds, index=0)
    except Exception as exc:
        raise ImageError(f"unusable VOI LUT / window ({tags}): {short_reason(exc)}") from None
    if not np.isfinite(np.asarray(out, dtype=np.float64)).all():
        raise ImageError(f"unusable VOI LUT / window ({tags}): it gives non-finite values")
    return out


def _luma(rgb: np.ndarray) -> np.ndarray:
    """(rows, cols, ≥3) → (rows, cols) float32 ITU-R 601 luma; extra channels (alpha) ignored."""
    rgb = rgb.astype(np.float32, copy=False)
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def _decode_pil(path: str, draft: Optional[int]) -> np.ndarray:
    """PNG/JPEG through Pillow; 16-bit and float modes keep their range, colour → ``L``."""
    from PIL import Image, UnidentifiedImageError

    try:
        im = Image.open(path)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ImageError(f"not a readable PNG/JPEG image: {short_reason(exc)}") from None
    with im:
        if draft and im.format == "JPEG":
            im.draft("L", (draft, draft))
        if im.mode in ("L", "I", "F") or im.mode.startswith("I;16"):
            return np.asarray(im)
        return np.asarray(im.convert("L"))


__all__ = ["apply_voi", "decode_unit", "ensure_pixel_budget", "read_image", "read_image_resized", "scale_unit",
           "to_uint8"]
