"""Container and header checks of an image file, before (and without) any pixel decode.

Why a module of its own: ingest checks every file of an export (often 10^5) and must stay
cheap, and the decoder (:mod:`fedcxr.site_adapters.images`) needs the same checks before it
allocates anything; both read a file's header through here, and both raise the errors defined
here (:class:`ImageError` and its kinds), whose text is the reason a user sees.

Header checks are cheap and never decode: PNG by parsing the IHDR chunk and looking for the
IEND chunk at the end of the file (a cut-off download has none), JPEG by Pillow's lazy open
plus the end-of-image marker, DICOM by ``stop_before_pixels`` plus a walk over the pixel data
element's length (or its encapsulated fragments) against the file size, and a check that a
decoder for the transfer syntax is installed. The DICOM display tags the decoder will apply
(Modality LUT, window / VOI LUT, Presentation LUT Shape) are checked here too, so a file that
would fail in training is set aside at ingest with the tag named.

Memory is bounded before any decode: a header that declares more than ``max_pixels`` values
(default :data:`MAX_PIXELS`, 100 million: a 10k × 10k radiograph; DICOM counts Rows × Columns ×
frames × samples per pixel) raises :class:`ImageTooLarge`, at ingest (the row is set aside)
and before every decode in training, so a 6 KB file declaring 60000 × 60000 pixels never gets
its 7 GB allocated. Pillow's own decompression-bomb guard is set to the same limit
(:func:`pil_pixel_limit`).
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import warnings
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from fedcxr.site_adapters.paths import NotRegularFile, open_regular

KIND_DICOM, KIND_PNG, KIND_JPEG = "dicom", "png", "jpeg"

#: DICOM tags a DICOM adapter needs, copied into :func:`read_header`'s dict (str or None).
DICOM_TAGS: tuple[str, ...] = (
    "PatientID", "PatientSex", "PatientAge", "ViewPosition", "SOPInstanceUID",
    "StudyInstanceUID", "SeriesInstanceUID", "PhotometricInterpretation", "StudyDescription",
    "SeriesDescription", "BodyPartExamined", "Modality", "Manufacturer",
)

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_JPEG_SOI, _JPEG_EOI = b"\xff\xd8\xff", b"\xff\xd9"
_TAIL_SEARCH = 65536  # bytes searched for an end marker when trailing data follows it
_IMPLICIT_LE = "1.2.840.10008.1.2"
_EXPLICIT_LE = "1.2.840.10008.1.2.1"
_EXPLICIT_BE = "1.2.840.10008.1.2.2"
_DEFLATED = "1.2.840.10008.1.2.1.99"
_NATIVE = {_IMPLICIT_LE, _EXPLICIT_LE, _EXPLICIT_BE, _DEFLATED}
_LONG_VRS = {b"OB", b"OW", b"OF", b"OD", b"OL", b"OV", b"UN", b"UT", b"SQ", b"UC", b"UR", b"SV", b"UV"}
_MAX_FRAGMENTS = 1_000_000
_MAX_REASON = 240
#: Default bound on the values one image may declare (``fedcxr ingest --max-pixels``).
MAX_PIXELS = 100_000_000


class ImageError(ValueError):
    """A file that cannot be used as an image; ``str(exc)`` is the short reason users see."""


class ImageTooLarge(ImageError):
    """The header declares more pixel values than allowed: never decoded."""


class NotAnImageFile(ImageError):
    """A named pipe, socket, device or directory (:func:`fedcxr.site_adapters.paths.open_regular`): never opened."""


def check_pixel_count(rows: int, cols: int, max_pixels: int, *, frames: int = 1, samples: int = 1) -> None:
    """Raise :class:`ImageTooLarge` when ``rows × cols × frames × samples`` exceeds ``max_pixels``."""
    count = int(rows) * int(cols) * max(1, int(frames)) * max(1, int(samples))
    if count > int(max_pixels):
        extra = (f", {frames} frames" if frames > 1 else "") + (f", {samples} samples per pixel" if samples > 1 else "")
        raise ImageTooLarge(f"image too large: header declares {rows}x{cols}{extra} = {count:,} values, "
                            f"more than --max-pixels {int(max_pixels):,}")


@contextlib.contextmanager
def pil_pixel_limit(max_pixels: int):
    """Pillow's decompression-bomb limit set to ``max_pixels`` (its warning silenced) while open."""
    from PIL import Image

    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max(1, int(max_pixels))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


# --------------------------------------------------------------------------- headers


def read_header(path: str | Path, max_pixels: int = MAX_PIXELS, *, tags: Sequence[str] = ()) -> dict[str, Any]:
    """Cheap header of one image, without decoding pixels.

    Returns at least ``kind`` (``'dicom'|'png'|'jpeg'``), ``rows`` and ``cols`` (ints). DICOM
    adds ``frames``, ``samples_per_pixel``, ``bits_stored``, ``TransferSyntaxUID`` and every
    tag in :data:`DICOM_TAGS` and ``tags`` (DICOM keywords; stripped ``str`` or ``None``). Raises :class:`ImageError`
    with the reason when the file is missing, not an image, truncated, needs a decoder
    that is not installed, or declares more than ``max_pixels`` values (:class:`ImageTooLarge`).
    """
    path = os.fspath(path)
    try:
        fd = open_regular(path)  # never a named pipe, socket or device: reading one blocks or never ends
    except FileNotFoundError:
        raise ImageError("missing file") from None
    except NotRegularFile as exc:
        raise NotAnImageFile(str(exc)) from None
    except IsADirectoryError:
        raise ImageError("not a file (a directory)") from None
    except OSError as exc:
        raise ImageError(f"unreadable file: {exc.strerror or type(exc).__name__}") from None
    try:
        size = os.fstat(fd).st_size
        head = os.read(fd, 132)
        if head[:8] == _PNG_SIG:
            header = _png_header(fd, head, size)
            check_pixel_count(header["rows"], header["cols"], max_pixels)
            return header
    except IsADirectoryError:
        raise ImageError("not a file (a directory)") from None
    finally:
        os.close(fd)
    if size == 0:
        raise ImageError("empty file (0 bytes)")
    if head[:3] == _JPEG_SOI:
        return _jpeg_header(path, size, max_pixels)
    return _dicom_header(path, size, has_preamble=head[128:132] == b"DICM", max_pixels=max_pixels, tags=tags)


def _png_header(fd: int, head: bytes, size: int) -> dict[str, Any]:
    """IHDR fields (checked against its CRC) and an IEND chunk at the end of the file."""
    if len(head) < 33 or head[12:16] != b"IHDR" or head[8:12] != b"\x00\x00\x00\x0d":
        raise ImageError("corrupt PNG header: no valid IHDR chunk")
    if zlib.crc32(head[12:29]) != int.from_bytes(head[29:33], "big"):
        raise ImageError("corrupt PNG header: IHDR checksum mismatch")
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    if width == 0 or height == 0 or depth not in _PNG_DEPTHS.get(colour, ()):
        raise ImageError(f"corrupt PNG header: {width}x{height}, bit depth {depth}, colour type {colour}")
    if _read_at(fd, max(0, size - 12), 12) != _PNG_IEND:
        tail = _read_at(fd, max(0, size - _TAIL_SEARCH), _TAIL_SEARCH)
        if b"IEND" not in tail:
            raise ImageError(f"truncated PNG: no IEND chunk at the end of the file ({size} bytes)")
    return {"kind": KIND_PNG, "rows": height, "cols": width, "bit_depth": depth, "colour_type": colour}


def _read_at(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset`` (``os.pread`` is POSIX-only; this works on Windows too)."""
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, n)


def _jpeg_header(path: str, size: int, max_pixels: int = MAX_PIXELS) -> dict[str, Any]:
    """Pillow's lazy open (markers up to the frame header) plus the end-of-image marker."""
    from PIL import Image, UnidentifiedImageError

    try:
        with pil_pixel_limit(max_pixels), Image.open(path) as im:
            width, height, mode = im.size[0], im.size[1], im.mode
    except Image.DecompressionBombError as exc:
        raise ImageTooLarge(f"image too large: {short_reason(exc)}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"corrupt JPEG header: {short_reason(exc)}") from None
    check_pixel_count(height, width, max_pixels)
    with open(path, "rb") as fp:
        fp.seek(max(0, size - 2))
        if fp.read(2) != _JPEG_EOI:
            fp.seek(max(0, size - _TAIL_SEARCH))
            if _JPEG_EOI not in fp.read():
                raise ImageError(f"truncated JPEG: no end-of-image marker ({size} bytes)")
    if width == 0 or height == 0:
        raise ImageError(f"corrupt JPEG header: size {width}x{height}")
    return {"kind": KIND_JPEG, "rows": height, "cols": width, "mode": mode}


def _dicom_header(path: str, size: int, *, has_preamble: bool, max_pixels: int = MAX_PIXELS,
                  tags: Sequence[str] = ()) -> dict[str, Any]:
    """Tags up to the pixel data, the pixel data's length against the file, decoder check."""
    with quiet_pydicom():
        return _dicom_header_inner(path, size, has_preamble, max_pixels, tags)


def _dicom_header_inner(path: str, size: int, has_preamble: bool, max_pixels: int = MAX_PIXELS,
                        tags: Sequence[str] = ()) -> dict[str, Any]:
    import pydicom

    not_image = "not a DICOM/PNG/JPEG file"
    with open(path, "rb") as fp:
        try:
            ds = pydicom.dcmread(fp, force=True, stop_before_pixels=True, defer_size=1024)
        except Exception as exc:  # pydicom raises many types on garbage
            if has_preamble:
                raise ImageError(f"unreadable DICOM header: {short_reason(exc)}") from None
            raise ImageError(not_image) from None
        pixel_pos = fp.tell()
    if not has_preamble and not ("Rows" in ds and "Columns" in ds):
        raise ImageError(not_image)
    ts = transfer_syntax(ds)
    rows, cols = int_tag(ds, "Rows"), int_tag(ds, "Columns")
    if not rows or not cols:
        raise ImageError("DICOM has no image: Rows/Columns missing (a non-image object or a cut-off header)")
    check_pixel_count(rows, cols, max_pixels, frames=int_tag(ds, "NumberOfFrames") or 1,
                      samples=int_tag(ds, "SamplesPerPixel") or 1)  # before anything sized by them
    check_modality_tags(ds)
    header: dict[str, Any] = {
        "kind": KIND_DICOM, "rows": rows, "cols": cols,
        "frames": int_tag(ds, "NumberOfFrames") or 1,
        "samples_per_pixel": int_tag(ds, "SamplesPerPixel") or 1,
        "bits_allocated": int_tag(ds, "BitsAllocated") or 0,
        "bits_stored": int_tag(ds, "BitsStored") or 0,
        "TransferSyntaxUID": ts,
    }
    header.update({kw: str_tag(ds, kw) for kw in (*DICOM_TAGS, *tags)})
    _check_decoder(ts)
    check_display_tags(ds)
    if ts != _DEFLATED:  # offsets of a deflated file are in the inflated stream
        _check_pixel_data_length(path, size, pixel_pos, ds, header)
    return header


def check_modality_tags(ds) -> None:
    """Raise :class:`ImageError` when the Modality LUT cannot be applied as the file states it.

    pydicom keeps an unparseable ``RescaleSlope`` (``'abcd'``) as text and the decoder would
    then ignore or trip over it; a broken ``ModalityLUTSequence`` fails only at decode time,
    in training. Both are found here, at the header check, with the tag named.
    """
    from pydicom.pixels import apply_modality_lut

    values = {}
    for keyword in ("RescaleSlope", "RescaleIntercept"):
        if keyword not in ds:
            continue
        raw = ds[keyword].value
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        try:
            values[keyword] = float(raw)
        except (TypeError, ValueError):
            raise ImageError(f"unusable Modality LUT: {keyword} {str(raw)[:40]!r} is not a number") from None
        if not np.isfinite(values[keyword]):
            raise ImageError(f"unusable Modality LUT: {keyword} is {values[keyword]}")
    if values.get("RescaleSlope") == 0.0:
        raise ImageError("unusable Modality LUT: RescaleSlope is 0 (every pixel would get the same value)")
    if "ModalityLUTSequence" in ds:
        signed = (int_tag(ds, "PixelRepresentation") or 0) == 1
        probe = np.zeros((1, 1), dtype=np.int16 if signed else np.uint16)
        try:
            apply_modality_lut(probe, ds)
        except Exception as exc:  # pydicom raises many types on a malformed sequence
            raise ImageError(f"unusable Modality LUT Sequence: {short_reason(exc)}") from None


@contextlib.contextmanager
def quiet_pydicom():
    """Silence pydicom's value-validation warnings and log lines while reading.

    Real exports are full of non-conformant values (``62`` as an age, over-long UIDs); they
    are handled by the adapters, and a warning per file would drown the ingest's output.
    """
    from pydicom import config

    previous = config.settings.reading_validation_mode
    config.settings.reading_validation_mode = config.IGNORE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        config.settings.reading_validation_mode = previous


def transfer_syntax(ds) -> str:
    """The dataset's transfer syntax UID; for a file with no file meta, the one its encoding implies."""
    meta = getattr(ds, "file_meta", None)
    ts = meta.get("TransferSyntaxUID") if meta is not None else None
    if ts:
        return str(ts).strip().rstrip("\x00")
    implicit, little = getattr(ds, "original_encoding", (True, True))
    if implicit is False:
        return _EXPLICIT_LE if little is not False else _EXPLICIT_BE
    return _IMPLICIT_LE


def _check_decoder(ts: str) -> None:
    from pydicom.pixels import get_decoder
    from pydicom.uid import UID

    name = UID(ts).name
    label = ts if name == ts else f"{ts} ({name})"
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        raise ImageError(f"unsupported transfer syntax {label}: no decoder installed") from None
    if not decoder.is_available:
        raise ImageError(f"unsupported transfer syntax {label}: no decoder installed")


#: Pixel data elements: (7FE0,0010) Pixel Data, (7FE0,0008) Float and (7FE0,0009) Double Float
#: Pixel Data (parametric maps), with the bits per sample the last two imply.
_PIXEL_ELEMENTS = {0x0010: None, 0x0008: 32, 0x0009: 64}
#: Samples stored per pixel of a 3-sample image, by subsampled photometric interpretation
#: (PS3.3 C.7.6.3.1.2: 4:2:2 keeps one Cb and one Cr per two pixels, 4:2:0 per four).
_SUBSAMPLED = {"YBR_FULL_422": 2.0, "YBR_PARTIAL_422": 2.0, "YBR_PARTIAL_420": 1.5}
_VR_BYTES = re.compile(rb"[A-Z]{2}")


def _element_header(head: bytes, endian: str, implicit: bool) -> tuple[int, int]:
    """``(value length, header size)`` of the element whose first 12 bytes are ``head``."""
    if implicit:
        return struct.unpack(endian + "I", head[4:8])[0], 8
    if head[4:6] in _LONG_VRS:
        return struct.unpack(endian + "I", head[8:12])[0], 12
    return struct.unpack(endian + "H", head[6:8])[0], 8


def _pixel_element_length(head: bytes, endian: str, implicit: bool, pos: int, size: int) -> tuple[int, int]:
    """``(length, value offset)`` of the pixel data element, whichever VR encoding it uses.

    The transfer syntax says explicit or implicit VR, but some files disagree with it in their
    body (pydicom's ``SC_rgb_jpeg.dcm``: an implicit-VR body under an explicit syntax), and
    pydicom reads them by looking at the bytes. So does this: explicit VR has two upper-case
    letters where implicit VR has the low half of its 4-byte length. Of the two readings the
    one the file's bytes allow wins (a VR-looking pair under implicit VR is tried both ways,
    the stated encoding first), so no decodable file is called truncated.
    """
    looks_explicit = bool(_VR_BYTES.fullmatch(head[4:6]))
    order = [implicit, not implicit] if looks_explicit else [True]
    readings = []
    for as_implicit in order:
        length, header = _element_header(head, endian, as_implicit)
        readings.append((length, pos + header))
        if length == 0xFFFFFFFF or pos + header + length <= size:
            return length, pos + header
    return readings[0]


def _check_pixel_data_length(path: str, size: int, pos: int, ds, header: dict) -> None:
    """Compare the pixel data element (at file offset ``pos``) with the file size.

    Native data: declared length vs bytes left in the file, and vs Rows × Columns × samples ×
    frames × bits allocated (4:2:2 / 4:2:0 YBR store fewer samples: :data:`_SUBSAMPLED`).
    Encapsulated data: walk the fragment items to the sequence delimiter (two or three 8-byte
    reads for a single-frame radiograph). The body's own VR encoding is read from its bytes
    (:func:`_pixel_element_length`).
    """
    implicit, little = getattr(ds, "original_encoding", (True, True))
    if implicit is None:
        implicit = header["TransferSyntaxUID"] == _IMPLICIT_LE
    endian = "<" if little is not False else ">"
    with open(path, "rb") as fp:
        fp.seek(pos)
        head = fp.read(12)
        if len(head) < 8:
            raise ImageError("truncated DICOM or no pixel data: the file ends before a Pixel Data element")
        group, elem = struct.unpack(endian + "HH", head[:4])
        if group != 0x7FE0 or elem not in _PIXEL_ELEMENTS:
            raise ImageError(f"DICOM has no pixel data (next element is ({group:04X},{elem:04X}))")
        length, start = _pixel_element_length(head, endian, bool(implicit), pos, size)
        if length == 0xFFFFFFFF:
            _walk_fragments(fp, start, size)
            return
    if start + length > size:
        raise ImageError(f"truncated DICOM: pixel data has {max(0, size - start)} of {length} declared bytes")
    if header["TransferSyntaxUID"] in _NATIVE:
        expected = expected_native_bytes(header, bits=_PIXEL_ELEMENTS[elem])
        if length < expected:
            raise ImageError(
                f"truncated DICOM: pixel data is {length} bytes, {expected} needed for "
                f"{header['rows']}x{header['cols']}x{header['samples_per_pixel']} samples x "
                f"{header['frames']} frame(s) at {_PIXEL_ELEMENTS[elem] or header['bits_allocated'] or 8} bits"
                + (f" ({header['PhotometricInterpretation']})"
                   if header.get("PhotometricInterpretation") in _SUBSAMPLED else "")
            )


def expected_native_bytes(header: dict, bits: Optional[int] = None) -> int:
    """Bytes that uncompressed pixel data of this header needs at least (pydicom reads no fewer).

    Rows × Columns × frames × samples × bits, where a 3-sample image in a subsampled YBR
    interpretation stores 2 (4:2:2) or 1.5 (4:2:0) samples per pixel. Rounded down, so the
    check errs towards accepting a file.
    """
    bits = bits or header["bits_allocated"] or 8
    samples = float(header["samples_per_pixel"])
    if samples == 3:
        samples = _SUBSAMPLED.get(str(header.get("PhotometricInterpretation") or "").upper(), samples)
    n = header["rows"] * header["cols"] * header["frames"] * samples
    return int(n * bits) // 8


def _walk_fragments(fp, pos: int, size: int) -> None:
    """Follow encapsulated items (FFFE,E000) to the delimiter (FFFE,E0DD); raise if cut short."""
    fragments = 0
    for _ in range(_MAX_FRAGMENTS):
        fp.seek(pos)
        item = fp.read(8)
        if len(item) < 8:
            raise ImageError(
                f"truncated DICOM: encapsulated pixel data ends after {max(0, fragments - 1)} "
                "fragment(s) without a sequence delimiter"
            )
        group, elem, length = struct.unpack("<HHI", item)
        if (group, elem) == (0xFFFE, 0xE0DD):
            if fragments < 2:
                raise ImageError("DICOM has empty pixel data (no compressed fragment)")
            return
        if (group, elem) != (0xFFFE, 0xE000) or length == 0xFFFFFFFF:
            raise ImageError(f"corrupt DICOM: unexpected tag ({group:04X},{elem:04X}) in encapsulated pixel data")
        if pos + 8 + length > size:
            raise ImageError(
                f"truncated DICOM: pixel data fragment {fragments} has {max(0, size - pos - 8)} "
                f"of {length} bytes"
            )
        pos += 8 + length
        fragments += 1
    raise ImageError("corrupt DICOM: too many pixel data fragments")


def int_tag(ds, keyword: str) -> Optional[int]:
    """A tag as an integer, ``None`` when absent, blank or not a number."""
    try:
        value = ds.get(keyword)
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def str_tag(ds, keyword: str) -> Optional[str]:
    """A tag as stripped text (multi-valued: backslash-joined), ``None`` when absent/blank."""
    try:
        value = ds.get(keyword)
    except Exception:  # an unparseable value is treated as absent
        return None
    if value is None:
        return None
    if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
        value = "\\".join(str(v) for v in value)
    text = str(value).strip().strip("\x00").strip()
    return text or None



# --------------------------------------------------------------------------- the file's kind


def sniff_kind(path: str | Path) -> str:
    """``'png'``/``'jpeg'`` by signature, otherwise ``'dicom'`` (DICM preamble or raw dataset)."""
    try:
        with open(path, "rb") as fp:
            head = fp.read(8)
    except FileNotFoundError:
        raise ImageError("missing file") from None
    if head[:8] == _PNG_SIG:
        return KIND_PNG
    if head[:3] == _JPEG_SOI:
        return KIND_JPEG
    if not head:
        raise ImageError("empty file (0 bytes)")
    return KIND_DICOM


# --------------------------------------------------------------------------- DICOM display tags


def check_display_tags(ds) -> None:
    """Raise :class:`ImageError` when the window or Presentation LUT Shape cannot be used.

    The header check of ingest (pixels not read): the window values are parsed and applied to
    a two-value probe with pydicom's ``apply_windowing``, so a file that would fail at decode
    time is set aside at ingest. A VOI LUT *sequence* is only checked when decoding (its table
    may be deferred past the header).
    """
    from pydicom.pixels import apply_windowing

    presentation_inverse(ds)
    photometric = (str_tag(ds, "PhotometricInterpretation") or "MONOCHROME2").upper()
    tags = voi_tags(ds)
    if photometric not in ("MONOCHROME1", "MONOCHROME2") or not voi_present(ds) or ds.get("VOILUTSequence"):
        return
    probe = ds.copy()
    probe.PhotometricInterpretation = photometric
    for keyword, default in (("BitsStored", 16), ("PixelRepresentation", 0)):
        if int_tag(probe, keyword) is None:
            setattr(probe, keyword, default)
    try:
        apply_windowing(np.zeros(2), probe, index=0)
    except Exception as exc:
        raise ImageError(f"unusable VOI LUT / window ({tags}): {short_reason(exc)}") from None


def presentation_inverse(ds) -> bool:
    """True when ``PresentationLUTShape`` is INVERSE; IDENTITY or absent: False; else ImageError."""
    shape = str_tag(ds, "PresentationLUTShape")
    if shape is None or shape.upper() == "IDENTITY":
        return False
    if shape.upper() == "INVERSE":
        return True
    raise ImageError(f"unsupported Presentation LUT Shape {shape!r} (2050,0020): expected IDENTITY or INVERSE")


_WINDOW_TAGS = ("WindowCenter", "WindowWidth")


def voi_present(ds) -> bool:
    """Whether a VOI step applies; normalises the window tags in ``ds`` to floats on the way.

    A blank window value is removed (absent); a window needs both centre and width (one
    alone is ignored, as viewers do); a value that is not a number raises :class:`ImageError`.
    """
    for keyword in _WINDOW_TAGS:
        if keyword not in ds:
            continue
        raw = ds[keyword].value
        items = list(raw) if isinstance(raw, (list, tuple)) or type(raw).__name__ == "MultiValue" else [raw]
        items = [v for v in items if v is not None and str(v).strip(" \x00") != ""]
        if not items:
            del ds[keyword]
            continue
        try:
            numbers = [float(str(v).strip()) for v in items]
        except ValueError:
            raise ImageError(f"unusable VOI window: {keyword} {str_tag(ds, keyword)!r} is not a number") from None
        if not all(np.isfinite(numbers)):
            raise ImageError(f"unusable VOI window: {keyword} {str_tag(ds, keyword)!r} is not finite")
        ds[keyword].value = numbers if len(numbers) > 1 else numbers[0]
    has_window = all(keyword in ds for keyword in _WINDOW_TAGS)
    return bool(ds.get("VOILUTSequence")) or has_window


def voi_tags(ds) -> str:
    """The VOI tags as text for an error message."""
    parts = [f"{kw}={str_tag(ds, kw)!r}" for kw in (*_WINDOW_TAGS, "VOILUTFunction") if kw in ds]
    if "VOILUTSequence" in ds:
        parts.append("VOILUTSequence")
    return ", ".join(parts) or "no VOI tags"


def short_reason(exc: BaseException) -> str:
    """``Type: first line of the message``, bounded, for reasons shown to users."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


__all__ = [
    "DICOM_TAGS", "ImageError", "ImageTooLarge", "NotAnImageFile", "KIND_DICOM", "KIND_JPEG", "KIND_PNG", "MAX_PIXELS",
    "check_display_tags", "check_modality_tags", "check_pixel_count", "expected_native_bytes", "int_tag",
    "pil_pixel_limit", "presentation_inverse", "quiet_pydicom", "read_header", "short_reason", "sniff_kind",
    "str_tag", "transfer_syntax", "voi_present", "voi_tags",
]
