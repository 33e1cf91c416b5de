"""The ``fedcxr`` command line: exit codes and messages users see (DESIGN §10)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


# --------------------------------------------------------------------------- a helpful CLI


def test_version_is_printed(capsys):
    import fedcxr

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedcxr {fedcxr.__version__}"


def _subcommands() -> dict:
    import argparse

    from fedcxr.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


COMMANDS = list(_subcommands())  # every subcommand, so a new one is audited too


def test_every_command_module_declares_its_options_beside_its_handler():
    from fedcxr.cli import COMMANDS as MODULES

    assert list(COMMANDS) == list(MODULES)
    for name, module in MODULES.items():
        assert module.__name__.startswith("fedcxr.commands."), name
        assert module.HELP and callable(module.add_arguments) and callable(module.run), name


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_every_command_has_verbose_and_quiet(command, capsys):
    import argparse

    actions = [a for a in _subcommands()[command]._actions if a.option_strings or a.dest != "help"]
    undocumented = [a.dest for a in actions if not a.help]
    assert not undocumented, f"fedcxr {command}: options without help {undocumented}"
    flags = {s for a in actions for s in a.option_strings}
    assert {"-v", "--verbose", "-q", "--quiet"} <= flags
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    shown = [a for a in actions if a.option_strings and not a.required and not isinstance(a.default, bool)
             and a.default not in (None, [], argparse.SUPPRESS) and a.help and "unset:" not in a.help]
    for action in shown:  # a default that says something is shown next to its option
        assert f"(default: {action.default})" in text, (command, action.dest)
    # ... and no default that says nothing or contradicts the help: a required option's "None", a flag's
    # True/False (--no-cross-site's stored True read as "skipped by default"), an empty list
    for noise in ("(default: None)", "(default: True)", "(default: False)", "(default: [])"):
        assert noise not in text, (command, noise)
    for action in actions:  # "unset: X" describes an option (not a flag) whose default is "not given"
        if action.help and "unset:" in action.help and action.nargs != 0:
            assert action.default in (None, 0, False, []), (command, action.dest, action.default)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_section_a_help_text_names_exists(command, capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    headings = [line.lstrip("#").strip() for line in readme.splitlines() if line.startswith("#")]
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in re.findall(r"README: ([^;),]+)", text):
        assert any(name.strip() in heading for heading in headings), (command, name)


def test_device_accepts_a_gpu_number_and_refuses_other_names(capsys):
    from fedcxr.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "x.yaml", "--device", "cuda:1"]).device == "cuda:1"
    assert parser.parse_args(["predict", "r", "--input", "i", "--out", "o.csv", "--device", "CUDA"]).device == "cuda"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["train", "x.yaml", "--device", "gpu1"])
    assert exit_info.value.code == 2
    assert "use auto, cpu, cuda or cuda:N" in capsys.readouterr().err


def test_quiet_ingest_prints_no_info_lines(csv_export, tmp_path, capsys):
    input_dir, mapping = csv_export(ROWS, MAPPING)
    code, stdout, stderr = _run(["ingest", "csv", "--input", input_dir, "--mapping", mapping, "--out", tmp_path / "o",
                                 "-q"], capsys)
    assert code == 0 and "kept 12" in stdout and "INFO" not in stderr


def test_third_party_info_lines_stay_off_the_console(tmp_path):
    """A fresh `fedcxr synth` (pylibjpeg/openjpeg encoders log at INFO) prints only fedcxr's own lines."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main())",
                           "synth", "--out", str(tmp_path / "s"), "--sites", "midrc_style", "--images-per-site", "6"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "openjpeg" not in proc.stderr and "pylibjpeg" not in proc.stderr


# --------------------------------------------------------------------------- output into a closed pipe


def _into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """``fedcxr ARGV | head -0``, deterministically: the reading end is closed before fedcxr writes."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main())",
                               *argv], stdout=write, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write)
    return done


@pytest.mark.parametrize("argv", [("ingest", "nih", "--help"), ("--help",), ("train", "--help")])
def test_output_into_a_closed_pipe_ends_quietly_with_the_sigpipe_status(argv):
    """`fedcxr ingest nih --help | head -1` printed a BrokenPipeError traceback and exited 1. A closed pipe is
    the reader's choice, not an error: nothing on stderr, and 141 (128 + SIGPIPE), what a shell reports for
    a C tool such as `cat` killed by SIGPIPE (as 130 = 128 + SIGINT for Ctrl-C)."""
    done = _into_a_closed_pipe(*argv)
    assert done.stderr.decode() == "" and done.returncode == 141


def test_a_commands_own_output_into_a_closed_pipe_ends_the_same_way_after_its_work(tmp_path):
    done = _into_a_closed_pipe("init", str(tmp_path / "study"))
    assert done.stderr.decode() == "" and done.returncode == 141
    assert (tmp_path / "study" / "experiment.yaml").is_file()     # the work was done; only the summary was lost


# --------------------------------------------------------------------------- typos: did you mean …?


@pytest.mark.parametrize("argv, hint", [
    (["trian", "c.yaml"], "(did you mean `train`?)"),
    (["flare", "simulte", "c.yaml"], "(did you mean `simulate`?)"),
    (["ingest", "csv", "--input", "x", "--out", "y", "--uncertain", "zero"], "(did you mean `zeros`?)"),
])
def test_a_mistyped_command_or_choice_gets_the_nearest_one(argv, hint, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and hint in capsys.readouterr().err


def test_a_mistyped_source_gets_the_nearest_one(tmp_path, capsys):
    code, _, err = _run(["ingest", "chexpret", "--input", tmp_path, "--out", tmp_path / "o"], capsys)
    assert code == 2 and "unknown SOURCE 'chexpret' (did you mean `chexpert`?)" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_usage_line_starts_with_help_then_verbosity(command, capsys):
    """One option order everywhere: `fedcxr ingest` listed `[-v | -q] [-h]`, the others `[-h] [-v | -q]`."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert usage.startswith(f"usage: fedcxr {command} [-h] [-v | -q]"), usage[:120]


@pytest.mark.parametrize("command", ["evaluate", "predict", "export-bundle", "report"])
def test_a_run_directory_argument_is_named_as_the_readme_names_it(command, capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert re.search(rf"fedcxr {command} RUN_DIR", readme), command
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "RUN_DIR" in text.split("\n\n")[0] and "run_dir" not in text, command


def test_the_readme_ingest_synopsis_names_every_ingest_option():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## `fedcxr ingest`", 1)[1]
    synopsis = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    options = [s for a in _subcommands()["ingest"]._actions for s in a.option_strings
               if s.startswith("--") and s not in ("--help", "--verbose", "--quiet")]
    missing = [o for o in options if o not in synopsis]
    assert not missing, f"README's `fedcxr ingest` synopsis lacks {missing}"
