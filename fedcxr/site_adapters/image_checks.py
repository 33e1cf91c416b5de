"""Image checks over many files: one reason per file, never an exception, in worker processes.

Why a module of its own: ingest (:func:`fedcxr.site_adapters.ingest.check_images`), the DICOM
adapters (:func:`read_headers`: tags for their rows) and ``fedcxr stats`` (acquisition counts)
check whole exports. A bad file must become a short reason on its row, never a traceback that
stops the run, and the work is spread over chunks in worker processes
(:func:`fedcxr.parallel.map_chunks`), so the per-file functions here are module-level (picklable).
Header checks only (:mod:`fedcxr.site_adapters.image_headers`) unless ``decode`` asks for the
pixels too (:mod:`fedcxr.site_adapters.images`, ``--verify-pixels``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from fedcxr.parallel import map_chunks
from fedcxr.site_adapters.image_headers import MAX_PIXELS, ImageError, read_header, short_reason
from fedcxr.site_adapters.images import decode_unit


def check_image(path: str | Path, decode: bool = False, max_pixels: int = MAX_PIXELS) -> Optional[str]:
    """``None`` when the image is usable, else a short reason (never raises for bad files).

    ``decode=False`` checks the header only (see :func:`~fedcxr.site_adapters.image_headers.read_header`); ``decode=True`` also
    decodes the pixels and compares the decoded shape with the header's rows × cols.
    """
    return header_or_reason(path, decode=decode, max_pixels=max_pixels)[1]


def header_or_reason(
    path: str | Path, decode: bool = False, max_pixels: int = MAX_PIXELS, tags: Sequence[str] = ()
) -> tuple[Optional[dict], Optional[str]]:
    """``(header, None)`` for a usable image, ``(header or None, reason)`` otherwise.

    With ``decode``, an image whose pixels all have one value (a blank export, a failed
    anonymiser burn-out) is unusable too: it carries no information and would train as noise.
    ``tags``: DICOM keywords to copy into the header besides :data:`~fedcxr.site_adapters.image_headers.DICOM_TAGS`.
    """
    try:
        header = read_header(path, max_pixels, tags=tags)
    except ImageError as exc:
        return None, str(exc)
    except Exception as exc:  # a bug or an exotic file: report it, never crash the ingest
        return None, f"unreadable file: {short_reason(exc)}"
    if decode:
        try:
            unit = decode_unit(os.fspath(path), None, max_pixels)
        except ImageError as exc:
            return header, str(exc)
        except Exception as exc:
            return header, f"pixel decode failed: {short_reason(exc)}"
        if unit.shape != (header["rows"], header["cols"]):
            return header, (
                f"pixel decode failed: decoded {unit.shape[0]}x{unit.shape[1]}, "
                f"header says {header['rows']}x{header['cols']}"
            )
        if unit.size and float(unit.max()) == float(unit.min()):
            return header, "constant image: every pixel has the same value"
    return header, None


def check_images_batch(paths: list[str], decode: bool = False, max_pixels: int = MAX_PIXELS) -> list[Optional[str]]:
    """:func:`check_image` over a chunk of paths (module-level, so process pools can pickle it)."""
    return [check_image(p, decode, max_pixels) for p in paths]


def headers_batch(
    paths: list[str], decode: bool = False, max_pixels: int = MAX_PIXELS, tags: Sequence[str] = ()
) -> list[tuple[Optional[dict], Optional[str]]]:
    """:func:`header_or_reason` over a chunk of paths (picklable for process pools)."""
    return [header_or_reason(p, decode, max_pixels, tags) for p in paths]


def read_headers(
    paths: Sequence[str], *, workers: int = 1, decode: bool = False, progress: bool = False,
    chunk: int = 256, max_pixels: int = MAX_PIXELS, tags: Sequence[str] = (),
) -> list[tuple[Optional[dict], Optional[str]]]:
    """:func:`header_or_reason` for every path, in ``workers`` processes; results in input order.

    ``tags``: DICOM keywords to read besides :data:`~fedcxr.site_adapters.image_headers.DICOM_TAGS` (a label csv's key tag).
    """
    paths = [os.fspath(p) for p in paths]
    chunks = [paths[i:i + chunk] for i in range(0, len(paths), chunk)]
    parts = map_chunks(headers_batch, chunks, decode, max_pixels, tuple(tags), workers=workers, progress=progress,
                       desc="reading headers", unit="file", leave=False)
    return [result for part in parts for result in part]


__all__ = ["check_image", "check_images_batch", "header_or_reason", "headers_batch", "read_headers"]
