"""``fedcxr flare simulate|poc``: a run that stops ends with fedcxr's message and the command that resumes it."""

from __future__ import annotations

import shlex

import pytest
import yaml

from fedcxr.cli import main

from ..conftest import tiny_config

pytest.importorskip("nvflare")


def test_a_poc_run_whose_server_stopped_ends_with_a_message_and_the_resume_command(tiny_manifests, tmp_path,
                                                                                   monkeypatch, capsys):
    """Issue 31: the command that lost its server died with a 66-line NVFLARE traceback and no hint."""
    from fedcxr.flare import poc
    from fedcxr.flare.poc_watch import ServerLost

    def server_died(cfg, run_dir, **kwargs):
        raise ServerLost("the FLARE server stopped while job 1234 ran (its process is gone; NoConnection); "
                         "run: 2 of 5 rounds done")

    monkeypatch.setattr(poc, "poc", server_died)
    config = tmp_path / "my study.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache")))
    argv = ["flare", "poc", str(config), "--out", str(tmp_path / "run"), "--set", "rounds=5", "--timeout", "20",
            "--bootstrap", "0"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "fedcxr flare: run stopped: the FLARE server stopped while job 1234 ran" in err
    command = err.split("then continue with: ", 1)[1].strip()
    assert shlex.split(command) == ["fedcxr", *argv, "--resume"], "the same config, options and --set values"
