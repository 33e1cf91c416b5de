"""``fedcxr train``: a log line per round when the output is a file, RUN_DIR/train.log, and what it
does with a finished run (refused at once; ``--resume`` changes nothing)."""

from __future__ import annotations

import io
import logging
import re
import shutil

import pytest
import yaml

from fedcxr.cli import main
from fedcxr.logs import TqdmHandler
from fedcxr.pipeline.run_log import round_line

from ..conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(tmp_path, manifests, **overrides):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_config(manifests, tmp_path / "cache", **overrides)))
    return path


def test_round_line_by_hand():
    metrics = {"round": 2, "seconds": 4.21, "train": {"a": {"loss": 0.6123, "main_loss": 0.6}, "b": {"loss": None}},
               "target": {"loss": 0.65, "passes": 1}, "val": {"c": {"mean_auroc": 0.7129}, "d": {"mean_auroc": None}}}
    assert round_line(metrics, 10) == ("round 3/10 (4.2 s): loss a 0.612, b n/a, target 0.650; "
                                       "val AUROC c 0.713, d n/a")
    assert round_line({"round": 0}, 1) == "round 1/1"


def test_a_round_line_is_left_to_the_file_while_the_bar_shows_it():
    handler, out = TqdmHandler(), io.StringIO()
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("fedcxr.rounds", logging.INFO, __file__, 1, "round 1/2", None, None)
    record.console = False
    from contextlib import redirect_stderr

    with redirect_stderr(out):
        handler.emit(record)
        record.console = True
        handler.emit(record)
    assert out.getvalue() == "round 1/2\n"


def test_one_line_per_round_on_a_non_terminal_console_and_in_train_log(tiny_manifests, tmp_path, capsys):
    config = _config(tmp_path, tiny_manifests, rounds=2)
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0  # capsys: stderr is no terminal
    captured = capsys.readouterr()
    shown = re.findall(r"round (\d)/2 \([\d.]+ s\): loss nih_style [\d.]+, chexpert_style [\d.]+, target [\d.]+; "
                       r"val AUROC dicom_style", captured.err)
    assert shown == ["1", "2"], captured.err[-2000:]
    assert f"(log: {tmp_path / 'run' / 'train.log'})" in captured.out
    log = (tmp_path / "run" / "train.log").read_text()
    assert "FedAvg_Finetune, 2 rounds; sources nih_style, chexpert_style; target dicom_style" in log
    assert re.findall(r"^\S+ \S+ INFO fedcxr.rounds: round (\d)/2 ", log, re.M) == ["1", "2"]  # time-stamped
    assert "finished: final_model.pt holds round 2 of 2" in log

    assert main(["train", str(config), "--out", str(tmp_path / "quiet"), "-q", "--set", "rounds=1"]) == 0
    assert "round 1/1" not in capsys.readouterr().err  # --quiet: the console stays quiet ...
    assert "round 1/1 (" in (tmp_path / "quiet" / "train.log").read_text()  # ... the log file does not


def _snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*"))


def test_a_finished_run_is_refused_at_once_and_resume_changes_no_file(evaluated_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(evaluated_run, run)
    config = run / "config.yaml"  # the run's own resolved config
    before = _snapshot(run)

    def no_setup(*args, **kwargs):
        raise AssertionError("sites were set up before the run directory was checked")

    monkeypatch.setattr("fedcxr.pipeline.run_driver.site_transport", no_setup)
    assert main(["train", str(config), "--out", str(run)]) == 2
    assert "already holds a finished run; choose another --out" in capsys.readouterr().err
    assert main(["train", str(config), "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "this run is already finished" in out and "no file changed" in out and "note:" not in out
    assert main(["train", str(config), "--out", str(run), "--resume", "--set", "rounds=5"]) == 0
    assert "differs from the config this run was trained with" in capsys.readouterr().out
    assert _snapshot(run) == before


@pytest.mark.slow  # a training process started, stopped by SIGTERM after its first round, then resumed: ~20 s
def test_sigterm_says_where_train_stopped_and_the_command_that_continues_it(tiny_manifests, tmp_path):
    """A scheduler's SIGTERM used to end `fedcxr train` without a word: now it says after which round it
    stopped and prints the `--resume` command, which continues the run to its end."""
    import json
    import shlex
    import signal
    import subprocess
    import sys
    import time

    from fedcxr.rundir import RunDir

    config = _config(tmp_path, tiny_manifests, rounds=40, eval_every=0)  # a tiny round takes ~20 ms: still running
    run = RunDir(tmp_path / "run")

    def checkpointed() -> int:  # rounds a resume continues after: the newest checkpoint's round + 1
        files = sorted((run.root / "checkpoints").glob("round_*.pt"))
        return int(files[-1].stem.split("_")[1]) + 1 if files else 0

    proc = subprocess.Popen([sys.executable, "-c", "import sys; from fedcxr.cli import main; sys.exit(main())",
                             "train", str(config), "--out", str(run.root), "--set", "seed=1", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while checkpointed() < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    done = checkpointed()
    assert proc.returncode == 143 and 1 <= done < 40, (proc.returncode, err[-2000:])
    assert f"fedcxr train: stopped by SIGTERM after round {done} of 40 (its last checkpoint: " in err, err[-2000:]
    command = f"fedcxr train {config} --out {run.root} --set seed=1 --resume"
    assert f"continue it with: {command}" in err and "Traceback" not in err
    assert json.loads(run.run_info.read_text())["status"] == "stopped"
    assert main(shlex.split(command)[1:] + ["-q"]) == 0
    info = json.loads(run.run_info.read_text())
    assert info["status"] == "finished" and info["rounds"] == 40 and len(run.metrics.read_text().splitlines()) == 40
