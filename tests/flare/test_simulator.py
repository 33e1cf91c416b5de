"""When ``fedcxr flare simulate`` stops waiting for FLARE's simulator (the runs themselves are in
``test_controller.py``, ``test_job.py`` and ``test_stats.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nvflare")

from fedcxr.flare.simulator import SERVER_APP_ENDED, server_app_ended  # noqa: E402


def test_the_end_of_the_server_app_is_the_file_nvflares_simulator_writes_then(tmp_path):
    """The simulator writes its cell statistics right after its server app returns (the run over, its
    outputs on disk); the name must stay NVFLARE's, or fedcxr would wait through FLARE's grace again."""
    from nvflare.private.fed.app.simulator import simulator_runner

    assert SERVER_APP_ENDED == Path("server") / simulator_runner.POOL_STATS_DIR / simulator_runner.SIMULATOR_POOL_STATS
    assert not server_app_ended(tmp_path)
    (tmp_path / SERVER_APP_ENDED).parent.mkdir(parents=True)
    (tmp_path / SERVER_APP_ENDED).write_text("{}")
    assert server_app_ended(tmp_path)


@pytest.mark.slow  # one FLARE simulator job (~30 s on 2 cores): one source, the target, two short rounds
def test_simulate_off_a_terminal_prints_a_line_per_round_as_train_does(tiny_manifests, tmp_path, capsys):
    """Off a terminal (CI, nohup) `fedcxr flare simulate` said nothing until the end; now the round lines
    of `fedcxr train` reach the console as FLARE's server writes each round."""
    import yaml

    from fedcxr.cli import main

    from ..conftest import tiny_config

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_manifests, tmp_path / "cache", sites=["nih_style"])))
    assert main(["flare", "simulate", str(config), "--out", str(tmp_path / "run"), "--no-cross-site"]) == 0
    console = capsys.readouterr().err
    assert "Traceback" not in console
    rounds = [line for line in console.splitlines() if "round 1/2" in line or "round 2/2" in line]
    assert len(rounds) == 2 and "val AUROC dicom_style" in rounds[1], console
