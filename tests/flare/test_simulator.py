"""When ``fedcxr flare simulate`` stops waiting for FLARE's simulator (the runs themselves are in
``test_controller.py``, ``test_job.py`` and ``test_stats.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("nvflare")

from fedcxr.flare.simulator import (  # noqa: E402
    LOST_WORKER,
    SERVER_APP_ENDED,
    SimulatorWorkerLost,
    WorkerWatch,
    server_app_ended,
)


def test_the_end_of_the_server_app_is_the_file_nvflares_simulator_writes_then(tmp_path):
    """The simulator writes its cell statistics right after its server app returns (the run over, its
    outputs on disk); the name must stay NVFLARE's, or fedcxr would wait through FLARE's grace again."""
    from nvflare.private.fed.app.simulator import simulator_runner

    assert SERVER_APP_ENDED == Path("server") / simulator_runner.POOL_STATS_DIR / simulator_runner.SIMULATOR_POOL_STATS
    assert not server_app_ended(tmp_path)
    (tmp_path / SERVER_APP_ENDED).parent.mkdir(parents=True)
    (tmp_path / SERVER_APP_ENDED).write_text("{}")
    assert server_app_ended(tmp_path)


def test_the_lines_of_a_lost_worker_are_the_ones_nvflares_simulator_writes():
    """NVFLARE's simulator starts no other worker when one dies (seen in CI: a worker reset at start-up
    under load, and the run waited 600 s for its site); fedcxr must know NVFLARE's own words for it."""
    import inspect

    from nvflare.private.fed.app.simulator import simulator_runner

    source = inspect.getsource(simulator_runner)
    for words in ("Communication error with client {client.client_name}: {e}",
                  "Subprocess died for client {client.client_name}, exit code",
                  "Failed to create connection to the child process in"):
        assert words in source, words
    started = "run_client_thread error: RuntimeError: Failed to create connection to the child process in Sim"
    assert LOST_WORKER.search(started) and LOST_WORKER.search(started).group(1) is None  # which site: not said
    assert LOST_WORKER.search("Communication error with client dicom_style: [Errno 104] Connection reset").group(1) \
        == "dicom_style"
    assert LOST_WORKER.search("Subprocess died for client site-2 before send, exit code: -9").group(1) == "site-2"


def test_a_lost_worker_stops_the_wait_at_once_naming_its_site(tmp_path):
    log = tmp_path / "simulator.log"
    log.write_text("INFO - Simulate Run client: dicom_style on GPU group: None\n"
                   "ERROR - ClientTaskWorker run error: EOFError: \n")  # a client's own end of a job: not lost
    watch = WorkerWatch(log)
    assert watch.check() is False
    with open(log, "a") as out:
        out.write("2026-11-29 16:33:13,780 - SimulatorClientRunner - ERROR - Communication error with cli")
    assert watch.check() is False  # half a line: not read as a line yet
    with open(log, "a") as out:
        out.write("ent dicom_style: [Errno 104] Connection reset by peer\n")
    with pytest.raises(SimulatorWorkerLost, match=r"site dicom_style's worker process.*Errno 104") as caught:
        watch.check()
    assert "--resume" in caught.value.advice  # the finished rounds are kept
    assert WorkerWatch(tmp_path / "absent.log").check() is False


def test_a_lost_worker_runs_the_job_again_resuming_and_raises_when_no_retry_is_left(monkeypatch, tmp_path):
    from fedcxr.flare import simulator

    calls: list[bool] = []

    def job(runs, *, resume=False, **kwargs):
        calls.append(resume)
        if len(calls) <= lost:
            raise SimulatorWorkerLost("NVFLARE's simulator lost site a's worker process")
        return ["payload"]

    monkeypatch.setattr(simulator, "simulate_job", job)
    runs = [(None, tmp_path / "run")]
    lost = 1
    assert simulator.simulate_many(runs) == ["payload"] and calls == [False, True]  # the retry resumes
    calls.clear()
    lost = 2
    with pytest.raises(SimulatorWorkerLost):
        simulator.simulate_many(runs)
    assert calls == [False, True]
    calls.clear()
    with pytest.raises(SimulatorWorkerLost):
        simulator.simulate_many(runs, retries=0)
    assert calls == [False]


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


@pytest.mark.slow  # two FLARE simulator jobs, the first stopped early (~50 s on 2 cores)
def test_a_site_worker_that_dies_under_the_simulator_is_retried_not_waited_for(tiny_manifests, tmp_path, caplog):
    """In CI a site's worker process died at start-up under load; NVFLARE's simulator started no other
    and the run waited its whole 600 s timeout for that site. Killed here the same way (SIGKILL of the
    worker, once the first round is on disk), the job must stop at once, naming the site, and run
    again resuming that round — to the end, within a couple of minutes."""
    import logging
    import signal
    import threading
    import time

    import psutil

    from fedcxr.flare.simulator import simulate
    from fedcxr.pipeline.config import ExperimentConfig

    from ..conftest import tiny_config

    cfg = ExperimentConfig.model_validate(tiny_config(tiny_manifests, tmp_path / "cache", rounds=3))
    run = tmp_path / "run"
    killed: list[int] = []

    def kill_a_worker(simulator) -> None:
        def hunt() -> None:
            deadline = time.time() + 120
            while time.time() < deadline and not (run / "checkpoints" / "round_0000.pt").exists():
                time.sleep(0.05)
            while time.time() < deadline and not killed:
                for proc in psutil.Process(simulator.pid).children(recursive=True):
                    try:
                        line = " ".join(proc.cmdline())
                    except psutil.Error:
                        continue
                    if "simulator_worker" in line and "--client chexpert_style" in line:
                        proc.send_signal(signal.SIGKILL)
                        killed.append(proc.pid)
                        return
                time.sleep(0.05)

        if not killed:  # the first attempt only
            threading.Thread(target=hunt, daemon=True).start()

    start = time.time()
    with caplog.at_level(logging.WARNING, logger="fedcxr.flare.simulator"):
        payload = simulate(cfg, run, progress=False, timeout=300, on_start=kill_a_worker, evaluation={"enabled": False})
    assert killed and time.time() - start < 200, time.time() - start
    said = caplog.text
    assert "site chexpert_style's worker process" in said and "running the job again, resuming" in said
    assert payload["status"] == "finished" and (run / "final_model.pt").is_file()
    assert len(list((run / "flare" / "logs").glob("attempt-*/simulator.log"))) == 2
