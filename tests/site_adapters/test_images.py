"""The one decode path: real DICOM/PNG files from ../shared/data plus synthetic edge cases."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from fedcxr.site_adapters.image_checks import check_image, check_images_batch, read_headers
from fedcxr.site_adapters.image_headers import ImageError, read_header
from fedcxr.site_adapters.images import read_image, read_image_resized, scale_unit

RSNA_MONO2 = "rsna_pneumonia_cr_chest_pa_jpegbaseline_mono2.dcm"
RSNA_FAKE_MONO1 = "rsna_pneumonia_cr_chest_pa_jpegbaseline_FAKE_mono1_tag.dcm"
RG1_J2K = "wg04_RG1_cr_chest_pa_j2k_lossy_mono1.dcm"
RG1_JLS = "wg04_RG1_cr_chest_pa_jpegls_nearlossless_mono1.dcm"
NO_META = "cr_mono1_10bit_chest_pa_no_file_meta.dcm"
NIH_GCP = "nih_cxr14_gcp_dx_chest_implicit_le_mono2.dcm"
DENTAL = "nonchest/cr_dental_jpeg_lossless_mono1_modality_lut_seq.dcm"


@functools.lru_cache(maxsize=None)
def decoded(path: str) -> np.ndarray:
    """Decode each real file once per test session (the big ones take ~0.5 s)."""
    return read_image(path)


def raw_pixels(path: Path) -> np.ndarray:
    ds = pydicom.dcmread(path, force=True)
    if "TransferSyntaxUID" not in ds.file_meta:
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ImplicitVRLittleEndian
    return ds.pixel_array.astype(np.float64)


def corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def write_dicom(path: Path, pixels: np.ndarray, *, photometric: str = "MONOCHROME2", bits: int = 12,
                compress: str | None = None, **tags) -> Path:
    """A minimal valid DICOM: (rows, cols), (frames, rows, cols) or (rows, cols, 3) uint."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.Modality = "CR"
    colour = photometric == "RGB"
    if colour:
        ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PlanarConfiguration = *pixels.shape[:2], 3, 0
    else:
        ds.Rows, ds.Columns = pixels.shape[-2:]
        ds.SamplesPerPixel = 1
        if pixels.ndim == 3:
            ds.NumberOfFrames = pixels.shape[0]
    ds.PhotometricInterpretation = photometric
    allocated = 8 if bits <= 8 else 16
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = allocated, bits, bits - 1, 0
    ds.PixelData = pixels.astype(np.uint8 if allocated == 8 else "<u2").tobytes()
    for key, value in tags.items():
        setattr(ds, key, value)
    if compress:
        ds.compress(compress)
    ds.save_as(path, enforce_file_format=True)
    return path


def gradient(rows: int = 40, cols: int = 24, top: int = 1000) -> np.ndarray:
    """Top-left bright, bottom-right dark, falling 3× faster down than across: a transpose or
    flip of it (even after squeezing to a square) is a different image."""
    r, c = np.mgrid[0:rows, 0:cols]
    return (top * (1.0 - 0.75 * r / rows - 0.25 * c / cols)).astype(np.uint16)


# --------------------------------------------------------------------------- real files


def test_every_real_dicom_decodes_to_unit_grey(shared_data):
    files = sorted((shared_data / "dicom").rglob("*.dcm"))
    assert len(files) == 8, files
    for path in files:
        header = read_header(path)
        image = decoded(str(path))
        assert header["kind"] == "dicom"
        assert image.shape == (header["rows"], header["cols"]), path.name
        assert image.dtype == np.float32
        assert image.min() == 0.0 and image.max() == 1.0, path.name  # min/max, not /65535
        assert check_image(path, decode=False) is None, path.name


def test_fake_monochrome1_tag_comes_out_inverted(shared_data):
    fake = decoded(str(shared_data / "dicom" / RSNA_FAKE_MONO1))
    true = decoded(str(shared_data / "dicom" / RSNA_MONO2))
    np.testing.assert_allclose(fake, 1.0 - true, atol=1e-6)


def test_rg1_j2k_and_jpegls_twins_agree_and_are_inverted(shared_data):
    j2k_path, jls_path = shared_data / "dicom" / RG1_J2K, shared_data / "dicom" / RG1_JLS
    j2k, jls = decoded(str(j2k_path)), decoded(str(jls_path))
    assert j2k.shape == jls.shape == (1955, 1841)
    assert np.abs(j2k - jls).mean() < 0.01
    assert corr(j2k, jls) > 0.999
    # MONOCHROME1: our output runs opposite to the stored values (MONAI would not invert).
    assert corr(j2k, raw_pixels(j2k_path)) < -0.99


def test_file_without_meta_or_preamble_decodes_inverted(shared_data):
    path = shared_data / "dicom" / NO_META
    header = read_header(path)
    assert header["TransferSyntaxUID"] == "1.2.840.10008.1.2"
    assert header["PhotometricInterpretation"] == "MONOCHROME1"
    image = decoded(str(path))
    assert image.shape == (440, 440)
    assert corr(image, raw_pixels(path)) < -0.99


def test_dental_modality_lut_sequence_is_applied(shared_data):
    path = shared_data / "dicom" / DENTAL
    ds = pydicom.dcmread(path)
    item = ds.ModalityLUTSequence[0]
    entries, first, _ = item.LUTDescriptor
    lut = np.frombuffer(item.LUTData, "<u2").astype(np.float64)
    raw = ds.pixel_array.astype(np.int64)
    looked_up = lut[np.clip(raw - first, 0, entries - 1)]
    expected = 1.0 - (looked_up - looked_up.min()) / (looked_up.max() - looked_up.min())
    image = decoded(str(path))
    np.testing.assert_allclose(image, expected, atol=1e-5)
    without_lut = 1.0 - (raw - raw.min()) / (raw.max() - raw.min())
    assert np.abs(image - without_lut).max() > 0.05  # the LUT is not the identity


def test_real_dicom_header_tags(shared_data):
    rsna = read_header(shared_data / "dicom" / RSNA_MONO2)
    assert (rsna["PatientAge"], rsna["PatientSex"], rsna["ViewPosition"]) == ("62", "M", "PA")
    assert rsna["TransferSyntaxUID"] == "1.2.840.10008.1.2.4.50"
    nih = read_header(shared_data / "dicom" / NIH_GCP)
    assert nih["StudyDescription"] == "No Finding" and nih["ViewPosition"] is None
    assert nih["Modality"] == "DX" and nih["PatientAge"] == "81"


def test_rgba_png_becomes_grey(shared_data):
    path = shared_data / "nih-chestxray14" / "images" / "00000004_000.png"
    rgba = np.asarray(Image.open(path))
    assert rgba.shape == (1024, 1024, 4)
    image = read_image(path)
    assert image.shape == (1024, 1024)
    np.testing.assert_allclose(image, scale_unit(rgba[..., 0]), atol=1 / 255)


def test_nih_png_decodes_like_pil(shared_data):
    path = shared_data / "nih-chestxray14" / "images" / "00000001_000.png"
    header = read_header(path)
    assert header == {"kind": "png", "rows": 1024, "cols": 1024, "bit_depth": 8, "colour_type": 0}
    pil = np.asarray(Image.open(path)).astype(np.float64)
    np.testing.assert_allclose(read_image(path), (pil - pil.min()) / (pil.max() - pil.min()), atol=1e-6)
    assert check_image(path, decode=True) is None


def test_every_real_png_passes_the_header_check(shared_data):
    paths = [str(p) for p in sorted(shared_data.glob("*/images/*.png"))]
    assert len(paths) > 500
    assert check_images_batch(paths, False) == [None] * len(paths)


# --------------------------------------------------------------------------- synthetic DICOM


def test_multiframe_gives_the_first_frame(tmp_path):
    frames = np.stack([gradient(), gradient()[::-1], np.full((40, 24), 7, np.uint16)])
    path = write_dicom(tmp_path / "multi.dcm", frames)
    assert read_header(path)["frames"] == 3
    np.testing.assert_allclose(read_image(path), scale_unit(frames[0]), atol=1e-6)


def test_rgb_dicom_becomes_luma(tmp_path):
    rgb = np.zeros((8, 6, 3), np.uint8)
    rgb[..., 0], rgb[2:, :, 1], rgb[5:, 3:, 2] = 200, 100, 255
    path = write_dicom(tmp_path / "rgb.dcm", rgb, photometric="RGB", bits=8)
    luma = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    np.testing.assert_allclose(read_image(path), scale_unit(luma), atol=1e-6)


@pytest.mark.parametrize("syntax", [RLELossless, JPEG2000Lossless])
def test_compressed_monochrome1_round_trip(tmp_path, syntax):
    pixels = gradient(64, 48)  # J2K's default 6 resolution levels need ≥ 32 px
    path = write_dicom(tmp_path / "c.dcm", pixels, photometric="MONOCHROME1", compress=syntax)
    assert read_header(path)["TransferSyntaxUID"] == syntax
    np.testing.assert_allclose(read_image(path), 1.0 - scale_unit(pixels), atol=1e-6)
    assert check_image(path, decode=True) is None


def test_ten_bit_image_fills_the_unit_range(tmp_path):
    pixels = gradient(top=1023)
    path = write_dicom(tmp_path / "ten.dcm", pixels, bits=10)
    image = read_image(path)
    assert image.max() == 1.0 and image.min() == 0.0


@pytest.mark.parametrize("compress", [None, RLELossless])
def test_truncated_dicom_is_caught_by_the_header_check(tmp_path, compress):
    path = write_dicom(tmp_path / "full.dcm", gradient(64, 64), compress=compress)
    data = path.read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:-300])
    reason = check_image(cut, decode=False)
    assert reason is not None and reason.startswith("truncated DICOM:"), reason
    assert "of" in reason  # says how much is there of what was declared
    assert check_image(path, decode=False) is None


def test_real_dicom_cut_short_is_truncated(shared_data, tmp_path):
    data = (shared_data / "dicom" / RSNA_MONO2).read_bytes()
    cut = tmp_path / "rsna_cut.dcm"
    cut.write_bytes(data[: len(data) // 2])
    assert check_image(cut).startswith("truncated DICOM: pixel data fragment")
    header_only = tmp_path / "rsna_header_only.dcm"
    header_only.write_bytes(data[:1000])
    assert check_image(header_only) is not None


def test_random_bytes_named_dcm_is_not_an_image(tmp_path):
    path = tmp_path / "garbage.dcm"
    path.write_bytes(np.random.default_rng(0).bytes(5000))
    assert check_image(path, decode=True) == "not a DICOM/PNG/JPEG file"
    with pytest.raises(ImageError, match="not a DICOM/PNG/JPEG file"):
        read_header(path)


@pytest.mark.parametrize("uid", ["1.2.840.10008.1.2.4.100", "1.2.826.0.1.3680043.9.7777.1"])
def test_unsupported_transfer_syntax(tmp_path, uid):
    path = write_dicom(tmp_path / "ts.dcm", gradient())
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = uid  # an MPEG2 / private-syntax stream pydicom cannot decode
    ds.PixelData = encapsulate([b"\x00\x00\x01\xb3" + bytes(96)])
    ds.save_as(path)
    reason = check_image(path, decode=False)
    assert reason is not None and reason.startswith(f"unsupported transfer syntax {uid}")
    assert reason.endswith("no decoder installed")


def test_native_pixel_data_shorter_than_rows_times_columns(tmp_path):
    path = write_dicom(tmp_path / "short.dcm", gradient())
    ds = pydicom.dcmread(path)
    ds.Rows = 80  # header claims twice the rows the pixel data holds
    ds.save_as(path)
    reason = check_image(path)
    assert reason.startswith("truncated DICOM: pixel data is 1920 bytes, 3840 needed"), reason


def test_dicom_without_pixel_data(tmp_path):
    path = write_dicom(tmp_path / "nopix.dcm", gradient())
    ds = pydicom.dcmread(path)
    del ds.PixelData
    ds.save_as(path)
    assert check_image(path) == "truncated DICOM or no pixel data: the file ends before a Pixel Data element"


def test_corrupt_compressed_stream_fails_only_on_decode(tmp_path):
    path = write_dicom(tmp_path / "j2k.dcm", gradient(64, 64), compress=JPEG2000Lossless)
    data = bytearray(path.read_bytes())
    start = data.rfind(b"\xff\x4f\xff\x51")  # J2K codestream SOC+SIZ marker
    data[start: start + 40] = b"\x00" * 40
    path.write_bytes(bytes(data))
    assert check_image(path, decode=False) is None  # lengths are intact
    assert check_image(path, decode=True).startswith("pixel decode failed:")


# --------------------------------------------------------------------------- PNG / JPEG / misc


def test_png_and_jpeg_damage_is_reported(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 255, (96, 80), dtype=np.uint8)  # mostly entropy data
    png, jpg = tmp_path / "a.png", tmp_path / "a.jpg"
    Image.fromarray(pixels).save(png)
    Image.fromarray(pixels).save(jpg, quality=95)
    assert check_image(png, decode=True) is None and check_image(jpg, decode=True) is None
    assert read_header(jpg) == {"kind": "jpeg", "rows": 96, "cols": 80, "mode": "L"}
    data = png.read_bytes()
    (tmp_path / "cut.png").write_bytes(data[:-20])
    assert check_image(tmp_path / "cut.png").startswith("truncated PNG")
    bad_ihdr = bytearray(data)
    bad_ihdr[18] ^= 0xFF  # width byte: CRC no longer matches
    (tmp_path / "ihdr.png").write_bytes(bytes(bad_ihdr))
    assert check_image(tmp_path / "ihdr.png") == "corrupt PNG header: IHDR checksum mismatch"
    jdata = jpg.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(jdata[: len(jdata) // 2])
    assert check_image(tmp_path / "cut.jpg").startswith("truncated JPEG")
    (tmp_path / "hdr.jpg").write_bytes(jdata[:3] + b"\x00" * 50)
    assert check_image(tmp_path / "hdr.jpg").startswith("corrupt JPEG header")


def test_png_with_corrupt_pixels_fails_on_decode(tmp_path):
    png = tmp_path / "p.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64), dtype=np.uint8)).save(png)
    data = bytearray(png.read_bytes())
    idat = data.find(b"IDAT")
    data[idat + 20: idat + 60] = b"\x13" * 40
    png.write_bytes(bytes(data))
    assert check_image(png, decode=False) is None
    assert check_image(png, decode=True).startswith("pixel decode failed:")


def test_missing_and_empty_files(tmp_path):
    assert check_image(tmp_path / "nope.png") == "missing file"
    (tmp_path / "empty.dcm").write_bytes(b"")
    assert check_image(tmp_path / "empty.dcm") == "empty file (0 bytes)"
    assert check_image(tmp_path) == "not a file (a directory)"


def test_sixteen_bit_png_keeps_its_range(tmp_path):
    pixels = gradient(top=40000)
    path = tmp_path / "sixteen.png"
    Image.fromarray(pixels).save(path)
    np.testing.assert_allclose(read_image(path), scale_unit(pixels), atol=1e-6)


@pytest.mark.parametrize("kind", ["dcm", "png", "jpg"])
def test_resized_keeps_orientation(tmp_path, kind):
    pixels = gradient(120, 72, top=250)
    if kind == "dcm":
        path = write_dicom(tmp_path / "o.dcm", pixels, bits=8)
    else:
        path = tmp_path / f"o.{kind}"
        Image.fromarray(pixels.astype(np.uint8)).save(path)
    small = read_image_resized(path, 16)
    assert small.shape == (16, 16) and small.dtype == np.uint8
    assert small[0, 0] > 240 and small[-1, -1] < 15
    assert small[-1, 0] < small[0, -1]  # falls faster down the rows than across: not transposed
    expected = np.asarray(Image.fromarray(scale_unit(pixels), "F").resize((16, 16), Image.Resampling.BILINEAR))
    assert np.abs(small.astype(float) - expected * 255).max() <= 6


def test_batch_check_in_a_process_pool_keeps_order(tmp_path):
    good = write_dicom(tmp_path / "good.dcm", gradient())
    (tmp_path / "bad.dcm").write_bytes(b"\x01" * 400)
    paths = [str(good), str(tmp_path / "bad.dcm"), str(tmp_path / "missing.dcm")]
    with ProcessPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(check_images_batch, [paths[:2], paths[2:]], [False, False]))
    assert parts == [[None, "not a DICOM/PNG/JPEG file"], ["missing file"]]
    results = read_headers(paths * 3, workers=2, chunk=2)
    assert [r for _, r in results] == [None, "not a DICOM/PNG/JPEG file", "missing file"] * 3
    assert results[0][0]["rows"] == 40


def test_no_decode_errors_leak_as_exceptions(tmp_path):
    """Every odd file yields a reason string; nothing raises out of check_image."""
    oddities = {
        "preamble_only.dcm": b"\x00" * 128 + b"DICM",
        "dicm_garbage.dcm": b"\x00" * 128 + b"DICM" + os.urandom(300),
        "png_sig_only.png": b"\x89PNG\r\n\x1a\n",
        "jpeg_soi_only.jpg": b"\xff\xd8\xff",
        "text.dcm": b"hello, not an image\n" * 10,
    }
    for name, data in oddities.items():
        (tmp_path / name).write_bytes(data)
        reason = check_image(tmp_path / name, decode=True)
        assert isinstance(reason, str) and reason, name



# --------------------------------------------------------------------------- display pipeline (VOI LUT)


def standard_window(values: np.ndarray, center: float, width: float, top: float) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2.1 (LINEAR) written out from the standard, to output range [0, top]."""
    c, w = center - 0.5, width - 1.0
    out = ((values - c) / w + 0.5) * top
    return np.where(values <= c - w / 2, 0.0, np.where(values > c + w / 2, top, out))


def viewer_export(path: Path, out: Path) -> Path:
    """What a viewer's "save as PNG" writes: window (first view) to 0–255, MONOCHROME1 inverted."""
    ds = pydicom.dcmread(path, force=True)
    if "TransferSyntaxUID" not in ds.file_meta:
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ImplicitVRLittleEndian
    shown = standard_window(ds.pixel_array.astype(np.float64), float(ds.WindowCenter), float(ds.WindowWidth), 255)
    if ds.PhotometricInterpretation == "MONOCHROME1":
        shown = 255 - shown
    Image.fromarray(np.rint(shown).astype(np.uint8)).save(out)
    return out


def modality_only(path: Path) -> np.ndarray:
    """The decode before the VOI step (Modality LUT, min/max, MONOCHROME1 inversion)."""
    ds = pydicom.dcmread(path, force=True)
    if "TransferSyntaxUID" not in ds.file_meta:
        ds.file_meta.TransferSyntaxUID = pydicom.uid.ImplicitVRLittleEndian
    return scale_unit(pydicom.pixels.apply_modality_lut(ds.pixel_array, ds),
                      invert=ds.PhotometricInterpretation == "MONOCHROME1")


def levels(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two uint8 images, in grey levels (0–255)."""
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


def test_real_dicom_and_png_twin_match_after_preprocessing(shared_data):
    """The NIH GCP DICOM is NIH image 00000002_000: cached (224 px uint8) they must agree."""
    dicom = read_image_resized(shared_data / "dicom" / NIH_GCP, 224)
    png = read_image_resized(shared_data / "nih-chestxray14" / "images" / "00000002_000.png", 224)
    assert corr(dicom, png) > 0.999
    assert levels(dicom, png) < 0.5


def test_windowed_dicom_matches_its_viewer_export(shared_data, tmp_path):
    """CR-MONO1 has WC 550 / WW 1024 over 10-bit data (0–979): the window clips the low end.

    The viewer-export twin is rendered with the standard's formula (not pydicom's); after the
    same preprocessing (224 px uint8) the DICOM must match it within half a grey level on
    average (Pearson r > 0.999), and the Modality-LUT-only decode must not (> 3 levels).
    """
    path = shared_data / "dicom" / NO_META
    export = viewer_export(path, tmp_path / "export.png")
    ours, twin = read_image_resized(path, 224), read_image_resized(export, 224)
    assert corr(ours, twin) > 0.999
    assert levels(ours, twin) < 0.5
    from PIL import Image as PILImage

    before = np.asarray(PILImage.fromarray(modality_only(path), "F").resize((224, 224), PILImage.Resampling.BILINEAR))
    before = np.clip(np.rint(before * 255), 0, 255)
    assert levels(before, twin) > 3.0  # the VOI step is what makes them match
    full = decoded(str(path))
    assert np.abs(full - modality_only(path)).mean() > 0.01


def test_window_without_clipping_changes_nothing_after_scaling(shared_data):
    """RG1's window (WC 15000 / WW 30000) spans all its values: linear, so min/max scaling undoes it."""
    path = shared_data / "dicom" / RG1_JLS
    np.testing.assert_allclose(decoded(str(path)), modality_only(path), atol=1e-5)


def test_window_is_applied_after_the_modality_lut(tmp_path):
    pixels = gradient(top=1000)
    path = write_dicom(tmp_path / "w.dcm", pixels, RescaleSlope="2", RescaleIntercept="-100",
                       WindowCenter="700", WindowWidth="800")
    expected = scale_unit(standard_window(pixels * 2.0 - 100, 700, 800, 1.0))
    np.testing.assert_allclose(read_image(path), expected, atol=1e-5)
    assert np.abs(read_image(path) - scale_unit(pixels)).max() > 0.1


def test_first_of_several_windows_and_sigmoid(tmp_path):
    pixels = gradient(top=1000)
    multi = write_dicom(tmp_path / "m.dcm", pixels, WindowCenter=[300, 900], WindowWidth=[200, 50])
    np.testing.assert_allclose(read_image(multi), scale_unit(standard_window(pixels, 300, 200, 1.0)), atol=1e-5)
    sigmoid = write_dicom(tmp_path / "s.dcm", pixels, WindowCenter="500", WindowWidth="200", VOILUTFunction="SIGMOID")
    expected = scale_unit(1.0 / (1.0 + np.exp(-4.0 * (pixels - 500.0) / 200.0)))
    np.testing.assert_allclose(read_image(sigmoid), expected, atol=1e-5)


def test_voi_lut_sequence_is_applied(tmp_path):
    pixels = gradient(top=255)
    ds_path = write_dicom(tmp_path / "lut.dcm", pixels, bits=12)
    ds = pydicom.dcmread(ds_path)
    item = Dataset()
    lut = (np.linspace(0, 1, 256) ** 2 * 4095).astype(np.uint16)  # a curve, not a line
    item.LUTDescriptor = [256, 0, 12]
    item.add_new("LUTData", "US", lut.tolist())
    ds.VOILUTSequence = [item]
    ds.save_as(ds_path)
    np.testing.assert_allclose(read_image(ds_path), scale_unit(lut[pixels].astype(np.float64)), atol=1e-5)


@pytest.mark.parametrize("photometric", ["MONOCHROME1", "MONOCHROME2"])
def test_presentation_lut_shape_inverse(tmp_path, photometric):
    pixels = gradient()
    plain = read_image(write_dicom(tmp_path / "p.dcm", pixels, photometric=photometric))
    inverse = read_image(write_dicom(tmp_path / "i.dcm", pixels, photometric=photometric,
                                     PresentationLUTShape="INVERSE"))
    # MONOCHROME1 + INVERSE (what the DX IOD requires) is one inversion, not two
    expected = 1.0 - scale_unit(pixels)
    np.testing.assert_allclose(inverse, expected, atol=1e-6)
    if photometric == "MONOCHROME2":
        np.testing.assert_allclose(plain, scale_unit(pixels), atol=1e-6)


def _patched(path: Path, old: bytes, new: bytes) -> Path:
    """Replace the element value that starts with ``old`` (right after an explicit-VR header:
    two VR letters and a 2-byte length), never the same digits inside a random UID."""
    import re

    data = path.read_bytes()
    at = re.compile(rb"(?<=[A-Z]{2}[\x00-\xff]{2})" + re.escape(old), re.S)
    assert len(at.findall(data)) == 1
    path.write_bytes(at.sub(new.replace(b"\\", b"\\\\"), data))
    return path


@pytest.mark.parametrize("case, tags, reason", [
    ("letters", {"WindowCenter": "12345", "WindowWidth": "400"}, "WindowCenter 'abcde' is not a number"),
    ("zero width", {"WindowCenter": "500", "WindowWidth": "0"}, "Window Width must be greater than"),
    ("function", {"WindowCenter": "500", "WindowWidth": "400", "VOILUTFunction": "CURVY"}, "VOI LUT Function"),
    ("shape", {"PresentationLUTShape": "SHINY"}, "unsupported Presentation LUT Shape 'SHINY'"),
])
def test_unusable_display_tags_are_a_reason_not_a_traceback(tmp_path, case, tags, reason):
    path = write_dicom(tmp_path / "bad.dcm", gradient(), **tags)
    if case == "letters":
        _patched(path, b"12345", b"abcde")
    found = check_image(path, decode=False)  # the ingest header check already sets it aside
    assert found is not None and reason in found, found
    assert reason in check_image(path, decode=True)
    with pytest.raises(ImageError, match="VOI|Presentation LUT Shape"):
        read_image(path)


def test_blank_window_is_absent(tmp_path):
    pixels = gradient()
    path = _patched(write_dicom(tmp_path / "b.dcm", pixels, WindowCenter="777", WindowWidth="400"), b"777", b"   ")
    assert check_image(path, decode=True) is None
    np.testing.assert_allclose(read_image(path), scale_unit(pixels), atol=1e-6)


# --------------------------------------------------------------------------- checks that pydicom agrees with


def write_ybr_422(path: Path, rows: int = 16, cols: int = 20) -> Path:
    """An uncompressed YBR_FULL_422 DICOM: 2 bytes a pixel (Y Y Cb Cr per pixel pair), as
    PS3.5 8.2 allows natively and pydicom's SC_ybr_full_422_uncompressed.dcm holds."""
    rng = np.random.default_rng(3)
    write_dicom(path, np.zeros((rows, cols, 3), np.uint8), photometric="RGB", bits=8)
    ds = pydicom.dcmread(path)
    ds.PhotometricInterpretation = "YBR_FULL_422"
    ds.PixelData = rng.integers(16, 235, rows * cols * 2, dtype=np.uint8).tobytes()
    ds.save_as(path)
    return path


def write_implicit_body(path: Path, pixels: np.ndarray) -> Path:
    """A file whose meta says Explicit VR Little Endian but whose dataset is written implicit VR
    (pydicom's SC_rgb_jpeg.dcm is such a file; pydicom reads it by looking at the bytes)."""
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info

    full = pydicom.dcmread(write_dicom(path, pixels))
    meta = full.file_meta
    del full.file_meta
    head = DicomBytesIO()
    head.write(b"\x00" * 128 + b"DICM")
    write_file_meta_info(head, meta, enforce_standard=True)
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, True
    write_dataset(body, full)
    path.write_bytes(head.getvalue() + body.getvalue())
    return path


def pydicom_reference(path: Path) -> np.ndarray:
    """pydicom's own pipeline: pixel_array → modality LUT → VOI LUT (grey) or luma (colour), min/max."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(path, force=True)
    arr = ds.pixel_array
    if arr.ndim == 3:
        values = arr[..., 0] * 0.299 + arr[..., 1] * 0.587 + arr[..., 2] * 0.114
    else:
        values = apply_voi_lut(apply_modality_lut(arr, ds), ds)
    return scale_unit(values)


def test_subsampled_ybr_422_is_complete_at_two_bytes_a_pixel(tmp_path):
    path = write_ybr_422(tmp_path / "ybr422.dcm")
    assert check_image(path) is None and check_image(path, decode=True) is None
    np.testing.assert_allclose(read_image(path), pydicom_reference(path), atol=1e-6)
    ds = pydicom.dcmread(path)
    ds.PixelData = ds.PixelData[: 16 * 20]          # one byte a pixel: really short for 4:2:2
    ds.save_as(tmp_path / "short.dcm")
    assert check_image(tmp_path / "short.dcm").startswith("truncated DICOM: pixel data is 320 bytes, 640 needed")


@pytest.mark.parametrize("photometric, factor", [("YBR_FULL_422", 2), ("YBR_PARTIAL_422", 2),
                                                  ("YBR_PARTIAL_420", 1.5), ("RGB", 3), ("YBR_FULL", 3)])
def test_expected_native_bytes_know_chroma_subsampling(photometric, factor):
    from fedcxr.site_adapters.image_headers import expected_native_bytes

    header = {"rows": 10, "cols": 8, "frames": 2, "samples_per_pixel": 3, "bits_allocated": 8,
              "PhotometricInterpretation": photometric}
    assert expected_native_bytes(header) == int(10 * 8 * 2 * factor)
    assert expected_native_bytes({**header, "samples_per_pixel": 1}) == 160


@pytest.mark.filterwarnings("ignore:Expected explicit VR, but found implicit VR")
def test_implicit_vr_body_under_an_explicit_transfer_syntax_is_not_truncated(tmp_path):
    path = write_implicit_body(tmp_path / "implicit_body.dcm", gradient(64, 48))
    with pytest.warns(UserWarning, match="Expected explicit VR, but found implicit VR"):
        assert pydicom.dcmread(path).original_encoding == (False, True)  # pydicom reports the meta's encoding
    assert check_image(path) is None and check_image(path, decode=True) is None
    np.testing.assert_allclose(read_image(path), pydicom_reference(path), atol=1e-6)
    cut = tmp_path / "implicit_body_cut.dcm"
    cut.write_bytes(path.read_bytes()[:-200])
    assert check_image(cut).startswith("truncated DICOM")


def test_float_pixel_data_is_pixel_data(tmp_path):
    """Parametric maps store Float Pixel Data (7FE0,0008); pydicom decodes them, so must fedcxr."""
    path = write_dicom(tmp_path / "f.dcm", gradient(8, 6))
    ds = pydicom.dcmread(path)
    del ds.PixelData
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31
    del ds.PixelRepresentation
    ds.FloatPixelData = gradient(8, 6).astype("<f4").tobytes()
    ds.save_as(path)
    assert check_image(path) is None and check_image(path, decode=True) is None
    np.testing.assert_allclose(read_image(path), scale_unit(gradient(8, 6).astype(float)), atol=1e-6)


PYDICOM_FILES = ("SC_ybr_full_422_uncompressed.dcm", "SC_rgb_jpeg.dcm", "CT_small.dcm", "MR_small.dcm",
                 "JPEG2000.dcm", "emri_small_jpeg_2k_lossless.dcm")


def _pydicom_test_files(tmp_path: Path) -> Path:
    """Copies of a few of pydicom's own test files from $FEDCXR_PYDICOM_TEST_FILES (a checkout's
    ``src/pydicom/data/test_files``), or skip: they are not part of this repository."""
    import shutil

    source = os.environ.get("FEDCXR_PYDICOM_TEST_FILES")
    if not source or not Path(source).is_dir():
        pytest.skip("pydicom's test files not given: set FEDCXR_PYDICOM_TEST_FILES to a pydicom checkout's "
                    "src/pydicom/data/test_files")
    target = tmp_path / "pydicom_files"
    target.mkdir()
    for name in PYDICOM_FILES:
        if (Path(source) / name).is_file():
            shutil.copy(Path(source) / name, target / name)
    return target


@pytest.mark.filterwarnings("ignore:Expected explicit VR, but found implicit VR")
def test_pydicom_test_files_pass_the_checks_and_decode_as_pydicom_does(tmp_path):
    folder = _pydicom_test_files(tmp_path)
    for path in sorted(folder.iterdir()):
        assert check_image(path) is None and check_image(path, decode=True) is None, path.name
        ours, ref = read_image(path), pydicom_reference(path)
        assert ours.shape == ref.shape and float(np.abs(ours - ref).max()) < 1e-5, path.name
