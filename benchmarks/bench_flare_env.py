"""FLARE 2.9's SimEnv/PocEnv (job recipe API) vs fedcxr's own process control (run on demand).

    python benchmarks/bench_flare_env.py [--rounds 2] [--modes sim poc]

The same FedAvg job (two synthetic hospitals, 32 px, resnet_tiny, one step per site per round,
cross-site evaluation with 50 bootstrap resamples) is run four ways, side by side:

* ``fedcxr sim`` — :func:`fedcxr.flare.simulator.simulate` (``nvflare simulator`` in its own process
  group, progress from ``metrics.jsonl``, timeout, logs kept, every process ended);
* ``SimEnv`` — ``nvflare.recipe.SimEnv(clients=...).deploy(job)`` on the very job
  :func:`fedcxr.flare.job.build_job` builds (``FedJob.simulator_run``);
* ``fedcxr poc`` — :func:`fedcxr.flare.poc.poc` (provision with our project file on a free
  port, allow-list the controller, start, submit, wait, download, stop, clean);
* ``PocEnv`` — ``nvflare.recipe.PocEnv(clients=...).deploy(job)``, then ``get_job_status``
  until finished, ``get_job_result``, ``stop(clean_up=True)``.

Reported per way: wall seconds, whether the run finished (``flare_status.json``), whether the
cross-site report was written, and what was left behind (processes mentioning the workspace,
files in ``~/.nvflare``). Robustness points the numbers cannot show are listed in
BENCHMARKS.md ("FLARE process control").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def config(manifests: Path, cache: Path, rounds: int):
    from fedcxr.pipeline.config import load_config

    return load_config(data={
        "name": "bench-env", "manifests": str(manifests), "sites": ["nih_style", "chexpert_style"],
        "strategy": "FedAvg", "rounds": rounds, "source": {"lr": 1e-3, "batch_size": 8, "steps": 1},
        "model": {"backbone": "resnet_tiny", "hidden": 16}, "image_size": 32, "augment": False,
        "device": "cpu", "seed": 0, "cache_dir": str(cache), "eval_every": 0, "tracking": "none",
    })


def leftovers(text: str) -> int:
    import psutil

    mine = os.getpid()
    return sum(1 for p in psutil.process_iter(["cmdline", "pid"])
               if p.info["pid"] != mine and text in " ".join(p.info["cmdline"] or []))


def outcome(run_dir: Path) -> dict:
    status = json.loads((run_dir / "flare_status.json").read_text()) if (run_dir / "flare_status.json").is_file() else {}
    return {"status": status.get("status", "none"), "report": (run_dir / "report.json").is_file()}


def ours(mode: str, cfg, run_dir: Path) -> dict:
    from fedcxr.flare.poc import poc
    from fedcxr.flare.simulator import simulate

    start = time.perf_counter()
    try:
        (simulate if mode == "sim" else poc)(cfg, run_dir, progress=False, timeout=600, evaluation={"n_boot": 50})
        error = ""
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:120]}"
    return {"seconds": time.perf_counter() - start, "error": error, **outcome(run_dir)}


def recipe(mode: str, cfg, run_dir: Path, root: Path) -> dict:
    """The recipe API on fedcxr's job (the job written exactly as ``fedcxr flare`` writes it)."""
    from nvflare.recipe import PocEnv, SimEnv

    from fedcxr.flare.job import build_job
    from fedcxr.flare.run import write_site_configs

    run_dir = run_dir.resolve()
    sites = [cfg.site_name(s) for s in cfg.all_sites()]
    site_configs = write_site_configs([cfg], run_dir / "flare", device="cpu")
    job = build_job([(cfg, str(run_dir), False)], site_configs=site_configs, evaluation={"n_boot": 50})
    start = time.perf_counter()
    error = ""
    try:
        if mode == "sim":
            env = SimEnv(clients=sites, workspace_root=str(root / f"simenv-{run_dir.name}"))
            env.deploy(job)
        else:
            os.environ["NVFLARE_POC_WORKSPACE"] = str(root / "pocenv")
            env = PocEnv(clients=sites)
            try:
                job_id = env.deploy(job)
                deadline = time.time() + 600
                while time.time() < deadline:
                    status = str(env.get_job_status(job_id) or "")
                    if status.startswith("FINISHED"):
                        break
                    time.sleep(1)
                else:
                    error = "timeout"
                env.get_job_result(job_id, timeout=60)
            finally:
                env.stop(clean_up=True)
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:160]}"
    return {"seconds": time.perf_counter() - start, "error": error, **outcome(run_dir)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["sim", "poc"], choices=["sim", "poc"])
    parser.add_argument("--repeats", type=int, default=1, help="runs per way; the order alternates")
    args = parser.parse_args()

    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    conf = Path.home() / ".nvflare"
    before = sorted(p.name for p in conf.iterdir()) if conf.is_dir() else []
    with tempfile.TemporaryDirectory(prefix="fedcxr-bench-env-") as tmp:
        root = Path(tmp)
        write_synthetic_export(root / "export", sites=["nih_style", "chexpert_style"], images_per_site=48,
                               image_size=32, seed=1)
        ingest_synthetic(root / "export", root / "manifests", progress=False)
        cfg = config(root / "manifests", root / "cache", args.rounds)
        from fedcxr.pipeline.run_driver import run_experiment

        run_experiment(cfg.model_copy(update={"rounds": 1}), root / "warm", progress=False)  # fill the image cache
        results = {}
        for mode in args.modes:
            for k in range(args.repeats):
                for way in (("fedcxr", "recipe") if k % 2 == 0 else ("recipe", "fedcxr")):
                    run_dir = root / f"{way}-{mode}-{k}"
                    result = ours(mode, cfg, run_dir) if way == "fedcxr" else recipe(mode, cfg, run_dir, root)
                    time.sleep(2)
                    result["leftover_processes"] = leftovers(str(root))
                    results[f"{way} {mode} #{k}"] = result
                print(f"{way:7s} {mode:4s} {result['seconds']:6.1f} s  status={result['status']:9s} "
                      f"report={result['report']}  leftovers={result['leftover_processes']}  {result['error']}",
                      flush=True)
    after = sorted(p.name for p in conf.iterdir()) if conf.is_dir() else []
    print(f"~/.nvflare before {before}, after {after}")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
