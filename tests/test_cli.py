"""The ``fedcxr`` command line: exit codes and messages users see (DESIGN §10)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fedcxr.cli import main

MAPPING = {
    "image": {"column": "image", "extension": ".png"},
    "patient": "pid",
    "classes": ["covid19"],
    "labels": {"covid19": "covid"},
    "groups": ["hospital"],
}
ROWS = [{"image": f"im{i}", "pid": f"p{i}", "covid": str(i % 2), "hospital": "AB"[i % 2]} for i in range(12)]


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ingest_success_prints_a_summary(csv_export, tmp_path, capsys):
    input_dir, mapping = csv_export(ROWS, MAPPING)
    out = tmp_path / "out"
    code, stdout, _ = _run(["ingest", "csv", "--input", input_dir, "--mapping", mapping, "--out", out,
                            "--site-by", "hospital", "--quiet"], capsys)
    assert code == 0
    assert "read 12 rows: kept 12, set aside 0" in stdout
    assert "site A: 6 rows" in stdout and "site B: 6 rows" in stdout
    assert (out / "A" / "manifest.parquet").is_file() and (out / "ingest_report.json").is_file()


def test_unknown_source_exits_2_listing_sources(tmp_path, capsys):
    code, _, err = _run(["ingest", "pacs", "--input", tmp_path, "--out", tmp_path / "o"], capsys)
    assert code == 2
    assert "unknown SOURCE 'pacs'" in err and "csv" in err and "medmnist" in err and "nih" in err


def test_missing_input_dir_exits_2(tmp_path, capsys):
    code, _, err = _run(["ingest", "csv", "--input", tmp_path / "absent", "--out", tmp_path / "o"], capsys)
    assert code == 2 and "absent" in err and "no such directory" in err


def test_missing_column_exits_2_naming_it(csv_export, tmp_path, capsys):
    input_dir, mapping = csv_export([{k: v for k, v in r.items() if k != "covid"} for r in ROWS], MAPPING)
    code, _, err = _run(["ingest", "csv", "--input", input_dir, "--mapping", mapping, "--out", tmp_path / "o"],
                        capsys)
    assert code == 2 and "missing required column(s) 'covid'" in err


def test_bad_mapping_exits_2_naming_the_key(csv_export, tmp_path, capsys):
    input_dir, mapping = csv_export(ROWS, MAPPING)
    mapping.write_text(yaml.safe_dump({**yaml.safe_load(mapping.read_text()), "colour": "red"}))
    code, _, err = _run(["ingest", "csv", "--input", input_dir, "--mapping", mapping, "--out", tmp_path / "o"],
                        capsys)
    assert code == 2 and "colour: unknown key" in err


def test_missing_required_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["ingest", "csv", "--input", "x"])
    assert info.value.code == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["train", "{tmp}/absent.yaml"],
    ["evaluate", "{tmp}/absent-run"],
    ["report", "{tmp}/absent-run", "--out", "{tmp}/rep"],
    ["sweep", "{tmp}/absent.yaml", "--methods", "FedAvg", "--out", "{tmp}/sw"],
    ["flare", "export", "{tmp}/absent.yaml"],
])
def test_other_commands_exit_2_on_missing_input(argv, tmp_path, capsys):
    """Each command either says it is not available yet or names the missing file: exit 2, no traceback."""
    code, _, err = _run([a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2
    assert err.startswith(f"fedcxr {argv[0]}: error:")
    assert "not yet available" in err or "absent" in err


def test_console_exit_code_from_a_fresh_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedcxr.cli", "ingest", "pacs", "--input", str(tmp_path), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "unknown SOURCE" in proc.stderr and "Traceback" not in proc.stderr
