"""README's "Try it on one machine" block of `fedcxr flare`, command by command, as written.

The demo's hospitals and config come from the same steps `fedcxr demo --quick` runs (synth →
ingest → demo config; its training is tested in tests/commands/test_demo.py), then every line
of the block runs: the simulator, POC mode, the comparison table and TensorBoard (``--inspect``:
the server would not return).

This is the suite's one POC run (a POC system costs ~40 s to provision, start and stop), so it
also carries POC mode's own checks: the same weights as the in-process run of the same config,
and nothing left behind (workspace, keys, processes, ``~/.nvflare/config.conf``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("nvflare")
pytest.importorskip("tensorboard")

from fedcxr.cli import main  # noqa: E402
from fedcxr.workflows.demo import DEMO_TARGET, demo_config  # noqa: E402
from fedcxr.pipeline.config import load_config  # noqa: E402
from fedcxr.pipeline.run_driver import run_experiment  # noqa: E402

from .conftest import final_model as _final, max_diff as _max_diff  # noqa: E402
from .conftest import processes_mentioning as _processes_mentioning  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    text = README.read_text()
    section = text.split("### Try it on one machine", 1)[1].split("\n### ", 1)[0]
    block = section.split("run on FLARE as", 1)[1]
    commands = []
    for line in block.splitlines():
        if not line.startswith("    ") and line.strip() and commands:
            break
        if line.strip().startswith(("fedcxr ", "tensorboard ")):
            commands.append(line.strip())
    return commands


def prepare_demo(out: Path) -> None:
    """What `fedcxr demo --quick` writes before it trains (four hospitals, manifests, demo.yaml), with
    48 images per hospital instead of 80: the FLARE commands are the same, the runs cheaper."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    write_synthetic_export(out / "export", images_per_site=48, image_size=64, seed=0)
    site_dirs = ingest_synthetic(out / "export", out / "manifests", progress=False)
    sites = sorted(Path(d).name for d in site_dirs.values())
    data = demo_config(out / "manifests", sites, DEMO_TARGET, quick=True)
    data["device"] = "cpu"
    (out / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    """One folder after `fedcxr demo` (:func:`prepare_demo`) for both README blocks: they write different
    run directories (``runs/demo-flare``, ``runs/demo-poc``, ``runs/demo-he``) from the same demo."""
    root = tmp_path_factory.mktemp("readme_demo")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        prepare_demo(Path("fedcxr-demo"))
    return root


@pytest.mark.slow
def test_the_readme_flare_commands_run_as_written(demo_dir, monkeypatch, capsys):
    commands = readme_commands()
    assert [c.split()[1] for c in commands] == ["flare", "flare", "report", "--logdir"], commands
    monkeypatch.chdir(demo_dir)
    home_conf = Path.home() / ".nvflare" / "config.conf"
    conf_before = None
    for command in commands:
        argv = shlex.split(command)
        if argv[1:3] == ["flare", "poc"]:  # `nvflare poc` rewrites it; fedcxr must restore it
            conf_before = home_conf.read_bytes() if home_conf.is_file() else None
        if argv[0] == "fedcxr":
            assert main(argv[1:]) == 0, command
        else:  # tensorboard: list what it would serve
            done = subprocess.run([str(Path(sys.executable).with_name("tensorboard")), *argv[1:], "--inspect"],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            for tag in ("train/nih_style/loss", "round/seconds", "train/loss"):  # server's and streamed
                assert re.search(rf"^\s*{re.escape(tag)}\s*$", done.stdout, re.M), (tag, done.stdout[-3000:])
    out = capsys.readouterr().out
    for run in ("runs/demo-flare", "runs/demo-poc"):
        assert f"cross-site evaluation (each site on its own test split): {run}/report.md" in out
        report = json.loads(Path(run, "report.json").read_text())
        assert report["source"] == "site summaries" and report["ci"]["n_boot"] == 200
        assert list(report["sites"]) == [DEMO_TARGET] and report["sites"][DEMO_TARGET]["n_rows"] > 0
        assert Path(run, "per_class.csv").is_file() and Path(run, "tensorboard").is_dir()
    table = json.loads(Path("runs/demo-flare-table/comparison.json").read_text())["table"]
    assert table[0]["cells"][DEMO_TARGET]["seeds"] == [0, 1]
    check_poc_mode(commands[1], Path("runs/demo-poc"), conf_before)


def check_poc_mode(command: str, run: Path, conf_before) -> None:
    """POC mode (provision with mTLS, start, submit, wait, fetch, stop, clean) ends with the weights of
    the in-process run of the same config and leaves nothing behind."""
    argv = shlex.split(command)
    config = argv[argv.index("poc") + 1]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["missed"] == []
    run_experiment(load_config(config, overrides=overrides), Path("in-process"), progress=False)
    assert _max_diff(_final(run)["global"], _final(Path("in-process"))["global"]) <= 1e-5
    flare_dir = run / "flare"
    assert not (flare_dir / "poc").exists(), "the POC workspace is removed"
    logs = flare_dir / "logs" / "attempt-1"
    # FLARE's own stop (a second request says "already stopped" when the first timed out under load)
    assert re.search(r"POC system (was already )?stopped", (logs / "poc.log").read_text())
    assert (logs / "fedcxr" / "prod_00" / "server" / "log.txt").is_file()
    assert not list(logs.rglob("*.key")) and not list(logs.rglob("*.pem")), "no key leaves the POC workspace"
    home_conf = Path.home() / ".nvflare" / "config.conf"
    assert (home_conf.read_bytes() if home_conf.is_file() else None) == conf_before
    assert not _processes_mentioning(str(flare_dir.resolve())), "a FLARE process of this run is still alive"


def readme_secure_aggregation_commands() -> list[str]:
    text = README.read_text()
    section = text.split("### Secure aggregation (homomorphic encryption)", 1)[1].split("\n#", 1)[0]
    return [line.strip() for line in section.splitlines() if line.strip().startswith("fedcxr ")]


@pytest.mark.slow
def test_the_readme_secure_aggregation_commands_run_as_written(demo_dir, monkeypatch, capsys):
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    import torch

    commands = readme_secure_aggregation_commands()
    assert [shlex.split(c, comments=True)[1:3] for c in commands] == [["flare", "simulate"], ["evaluate", "runs/demo-he"]]
    monkeypatch.chdir(demo_dir)
    for command in commands:
        assert main(shlex.split(command, comments=True)[1:]) == 0, command
    final = torch.load(Path("runs/demo-he/final_model.pt"), weights_only=True)
    assert final["global"] and not any(k.startswith("sealed.") for k in final["global"])
    checkpoint = torch.load(Path("runs/demo-he/checkpoints/round_0001.pt"), weights_only=True)
    assert sorted(checkpoint["state"]["global"]) == ["sealed.model.data", "sealed.model.layout"]
    assert "runs/demo-he/report.md" in capsys.readouterr().out
