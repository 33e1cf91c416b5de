"""Metadata files are read as images are: regular files, inside the export, bounded once decompressed."""

from __future__ import annotations

import gzip
import io
import os
import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.inputs import (
    LIMIT_ENV,
    MAX_COLUMNS,
    InputTooLarge,
    check_npz,
    following_links,
    open_input,
    read_input_bytes,
)
from fedcxr.site_adapters.tables import read_table

REPO = Path(__file__).resolve().parents[2]
PADCHEST_CSV = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz"


def comma_bomb(path: Path, megabytes: int) -> None:
    """A gzip whose header line is ``megabytes`` MiB of commas (a few hundred kB on disk)."""
    with gzip.open(path, "wb", compresslevel=9) as handle:
        chunk = b"," * (1 << 20)
        for _ in range(megabytes):
            handle.write(chunk)
        handle.write(b"\nImageID\n")


@pytest.mark.timeout(300)
def test_a_padchest_header_bomb_exits_2_naming_the_file_in_bounded_memory(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    comma_bomb(export / PADCHEST_CSV, 128)
    assert (export / PADCHEST_CSV).stat().st_size < 200_000

    def cap_memory():  # 1.2 GB of address space: the whole CLI fits, a 128M-column header does not
        resource.setrlimit(resource.RLIMIT_AS, (1_200_000_000, resource.RLIM_INFINITY))

    result = subprocess.run(
        [sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main(sys.argv[1:]))",
         "ingest", "padchest", "--input", str(export), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=240, preexec_fn=cap_memory,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{PADCHEST_CSV}: a line longer than {1 << 20} bytes" in result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr


def test_a_table_that_expands_past_the_bound_is_refused_and_the_bound_can_be_raised(tmp_path, monkeypatch):
    path = tmp_path / "big.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("a,b\n" + "1,2\n" * 600_000)  # 2.4 MB once decompressed, ~3 kB on disk
    monkeypatch.setenv(LIMIT_ENV, "1")
    with pytest.raises(InputTooLarge, match=rf"big.csv.gz: expands to more than {1 << 20} bytes.*{LIMIT_ENV}"):
        read_table(path, base=tmp_path)
    monkeypatch.setenv(LIMIT_ENV, "4")
    assert len(read_table(path, base=tmp_path)) == 600_000
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(IngestError, match="not a whole number"):
        read_table(path, base=tmp_path)


def test_a_header_with_too_many_columns_is_refused_before_pandas(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(MAX_COLUMNS + 1)) + "\n" + "1\n")
    with pytest.raises(IngestError, match=f"wide.csv: {MAX_COLUMNS + 1} columns"):
        read_table(path, base=tmp_path)


def test_an_xlsx_whose_parts_expand_past_the_bound_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "CHEXPERT DEMO.xlsx"
    pd.DataFrame({"PATIENT": [f"patient{i:05d}" for i in range(50)], "PRIMARY_RACE": "White"}).to_excel(
        path, index=False)
    assert len(read_table(path, base=tmp_path)) == 50
    bomb = tmp_path / "bomb.xlsx"  # an .xlsx is a zip: one part of 3 MB of zeros, a few kB on disk
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("xl/worksheets/sheet1.xml", bytes(3 << 20))
    monkeypatch.setenv(LIMIT_ENV, "2")
    with pytest.raises(InputTooLarge, match=r"bomb.xlsx: its parts expand to 3145728 bytes"):
        read_table(bomb, base=tmp_path)


def test_a_zipped_table_is_read_from_its_one_member_and_bounded(tmp_path, monkeypatch):
    path = tmp_path / "labels.csv.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("labels.csv", "a,b\n" + "1,2\n" * 600_000)
    assert len(read_table(path, base=tmp_path)) == 600_000
    monkeypatch.setenv(LIMIT_ENV, "1")
    with pytest.raises(InputTooLarge, match="expands to more than"):
        read_table(path, base=tmp_path)
    with zipfile.ZipFile(tmp_path / "two.csv.zip", "w") as archive:
        archive.writestr("a.csv", "a\n1\n")
        archive.writestr("b.csv", "a\n1\n")
    with pytest.raises(IngestError, match="a zip holding 2 files"):
        read_table(tmp_path / "two.csv.zip", base=tmp_path)


def npz_with_a_lying_header(path: Path) -> None:
    """A MedMNIST npz whose ``train_images.npy`` declares 10¹⁴ bytes of uint8 and holds 128."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False,
                                                  "shape": (1_000_000, 10_000, 10_000)})
    np.savez(path, train_labels=np.zeros((4, 1)), val_images=np.zeros((4, 8, 8), np.uint8),
             val_labels=np.zeros((4, 1)), test_images=np.zeros((4, 8, 8), np.uint8), test_labels=np.zeros((4, 1)))
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("train_images.npy", header.getvalue() + bytes(128))


def test_an_npz_whose_header_declares_more_than_it_holds_is_refused_before_numpy_allocates(tmp_path, capsys):
    from fedcxr.cli import main

    path = tmp_path / "pneumoniamnist.npz"
    npz_with_a_lying_header(path)
    with pytest.raises(InputTooLarge, match=r"train_images.npy declares shape \(1000000, 10000, 10000\)"):
        check_npz(path, path.name)
    assert main(["ingest", "medmnist", "--input", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "refused before anything is allocated" in err and "Traceback" not in err
    good = tmp_path / "ok.npz"
    np.savez_compressed(good, train_images=np.zeros((4, 8, 8), np.uint8), train_labels=np.zeros((4, 1)))
    check_npz(good, good.name)
    np.savez(tmp_path / "objects.npz", train_images=np.array([{"a": 1}], dtype=object))
    with pytest.raises(IngestError, match="holds Python objects"):
        check_npz(tmp_path / "objects.npz", "objects.npz")


@pytest.mark.timeout(120)
def test_a_metadata_file_that_is_a_pipe_or_links_out_is_never_read(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    os.mkfifo(export / "labels.csv")
    with pytest.raises(IngestError, match=r"labels.csv: cannot read: not a regular file \(a named pipe\)"):
        read_table(export / "labels.csv", base=export)
    (tmp_path / "secret.csv").write_text("a,b\n1,2\n")
    (export / "Data_Entry_2017.csv").symlink_to(tmp_path / "secret.csv")
    with pytest.raises(IngestError, match="Data_Entry_2017.csv: a symbolic link .* pass --follow-links"):
        read_table(export / "Data_Entry_2017.csv", base=export)
    with following_links(True):
        assert read_table(export / "Data_Entry_2017.csv", base=export)["a"].tolist() == [1]
    (export / "zero.csv").symlink_to("/dev/zero")
    with following_links(True), pytest.raises(IngestError, match=r"not a regular file \(a character device\)"):
        read_table(export / "zero.csv", base=export)
    assert read_table(tmp_path / "secret.csv", base=export, root=None)["b"].tolist() == [2]  # a file the user named


@pytest.mark.timeout(120)
def test_a_midrc_tsv_that_is_a_pipe_stops_the_ingest_naming_it(tmp_path, capsys):
    from fedcxr.cli import main

    export = tmp_path / "export"
    export.mkdir()
    os.mkfifo(export / "case.tsv")
    assert main(["ingest", "midrc", "--input", str(export), "--out", str(tmp_path / "out")]) == 2
    assert "case.tsv: cannot read: not a regular file (a named pipe)" in capsys.readouterr().err


def test_read_input_bytes_stops_at_its_limit_and_long_lines(tmp_path):
    path = tmp_path / "list.txt"
    path.write_bytes(b"a\n" * 100)
    assert read_input_bytes(path, limit=200) == b"a\n" * 100
    with pytest.raises(InputTooLarge, match="expands to more than 199 bytes"):
        read_input_bytes(path, limit=199)
    (tmp_path / "long.txt").write_bytes(b"x" * (2 << 20))
    with pytest.raises(InputTooLarge, match="a line longer than"):
        read_input_bytes(tmp_path / "long.txt", limit=8 << 20, lines=True)
    with open_input(tmp_path / "long.txt", lines=False) as handle:
        assert len(handle.read()) == 2 << 20
