"""The console: another library's record is one line, the decoders are silent under --quiet."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from fedcxr.logs import OneLineFormatter, SilenceDecoders, configure


def _record(name: str, message: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, exc_info)


def test_other_libraries_records_lose_their_traceback():
    try:
        raise RuntimeError("libjpeg error code -1038\nsecond line")
    except RuntimeError as exc:
        error = exc
    text = OneLineFormatter().format(_record("pydicom.pixels.decoders.base", "Unable to decode", error))
    assert text == "ERROR pydicom.pixels.decoders.base: Unable to decode (RuntimeError: libjpeg error code -1038)"
    same = OneLineFormatter().format(_record("pydicom", "libjpeg error code -1038", error))
    assert same == "ERROR pydicom: libjpeg error code -1038 (RuntimeError)"
    own = OneLineFormatter().format(_record("fedcxr.x", "ours", error))
    assert "Traceback" in own  # fedcxr's own bugs keep their traceback


def test_fedcxr_info_lines_are_plain_like_printed_lines_and_warnings_keep_their_level():
    """The console has one format for what fedcxr says: `fedcxr demo` printed `[3/4] training ...` and
    then `INFO fedcxr.rounds: round 1/2 ...`; now both are plain lines."""
    info = logging.LogRecord("fedcxr.rounds", logging.INFO, __file__, 1, "round %d/%d", (1, 2), None)
    assert OneLineFormatter().format(info) == "round 1/2"
    warning = logging.LogRecord("fedcxr.pipeline.x", logging.WARNING, __file__, 1, "careful", None, None)
    assert OneLineFormatter().format(warning) == "WARNING fedcxr.pipeline.x: careful"
    other = logging.LogRecord("nvflare.x", logging.INFO, __file__, 1, "chatter", None, None)
    assert OneLineFormatter().format(other) == "INFO nvflare.x: chatter"


def test_quiet_filter_drops_decoder_records_only():
    keep = SilenceDecoders()
    assert not keep.filter(_record("pydicom.pixels.decoders.base", "x"))
    assert not keep.filter(_record("pydicom", "x")) and not keep.filter(_record("PIL.Image", "x"))
    assert keep.filter(_record("fedcxr.site_adapters.sitekey", "x")) and keep.filter(_record("pydicomx", "x"))


def test_configure_removes_a_handler_pydicom_attached_itself():
    import pydicom.config

    pydicom.config.debug(False, default_handler=True)   # attaches a bare StreamHandler to 'pydicom'
    try:
        configure("quiet")
        assert all(isinstance(h, logging.NullHandler) for h in logging.getLogger("pydicom").handlers)
    finally:
        configure("normal")


@pytest.fixture
def corrupt_dicom_folder(tmp_path):
    """One JPEG 2000 DICOM whose codestream is damaged: pydicom logs each failed decoder at ERROR."""
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, SecondaryCaptureImageStorage, generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.Modality, ds.PatientID = generate_uid(), "CR", "P1"
    ds.Rows = ds.Columns = 32
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = np.random.default_rng(0).integers(0, 4096, (32, 32)).astype("<u2").tobytes()
    ds.compress(JPEG2000Lossless)
    folder = tmp_path / "scans"
    folder.mkdir()
    ds.save_as(folder / "bad.dcm", enforce_file_format=True)
    data = bytearray((folder / "bad.dcm").read_bytes())
    start = data.rfind(b"\xff\x4f\xff\x51")
    data[start: start + 40] = b"\x00" * 40
    (folder / "bad.dcm").write_bytes(bytes(data))
    ds.PatientID = "P2"
    ds.SOPInstanceUID = generate_uid()
    pydicom.dcmread(folder / "bad.dcm")  # still readable: only the pixels are broken
    return folder


@pytest.mark.parametrize("quiet", [True, False])
def test_a_failed_decode_is_one_line_and_silent_under_quiet(corrupt_dicom_folder, tmp_path, quiet):
    argv = ["ingest", "images", "--input", str(corrupt_dicom_folder), "--out", str(tmp_path / "out"),
            "--verify-pixels"] + (["-q"] if quiet else [])
    proc = subprocess.run([sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main())", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "pixel decode failed" in proc.stderr   # nothing kept: exit 2, reason named
    assert "Traceback" not in proc.stderr
    pydicom_lines = [line for line in proc.stderr.splitlines() if "pydicom" in line]
    if quiet:
        assert pydicom_lines == []
    else:
        assert pydicom_lines and all(line.startswith(("ERROR pydicom", "WARNING pydicom")) for line in pydicom_lines)
