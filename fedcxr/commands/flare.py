"""``fedcxr flare export|simulate|poc CONFIG.yaml`` and ``fedcxr flare decrypt RUN_DIR``: the same run on NVIDIA FLARE (:mod:`fedcxr.flare`).

* ``export`` writes a job folder for a provisioned (production) FLARE system;
* ``simulate`` runs the job in FLARE's simulator on this machine;
* ``poc`` runs it in a POC system on loopback (mTLS), started and stopped here;
* ``decrypt`` opens the encrypted ``final_model.pt`` a FLARE server wrote under
  ``privacy.secure_aggregation`` with a site's key (``--context client_context.tenseal``).

Both runs write the run directory of ``fedcxr train`` and, unless ``--no-cross-site``, the
cross-site evaluation's ``report.json``/``report.md``/``per_class.csv`` (each site scores the
final model on its own test split; ``--bootstrap N`` resamples there). ``fedcxr evaluate RUN_DIR``
refuses to replace that report silently: ``--replace-cross-site`` moves it to
``RUN_DIR/cross_site_report/`` first (:mod:`fedcxr.workflows.evaluate`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcxr.commands.options import add_bootstrap, add_device, add_set
from fedcxr.errors import RunFailed, UserError

HELP = "the same run on NVIDIA FLARE (export | simulate | poc | decrypt)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("flare_command", choices=["export", "simulate", "poc", "decrypt"],
                   help="export: write a job folder; simulate: FLARE simulator here; poc: POC system on loopback; "
                        "decrypt: open a secure-aggregation run's encrypted final model with a site's key")
    p.add_argument("config", type=Path, metavar="CONFIG.yaml", help="experiment YAML (decrypt: the run directory)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory (simulate, poc; unset: runs/<name>-<method>-seed<seed>-flare) "
                        "or job folder (export, required)")
    add_set(p)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from its last complete round (a finished run is not trained again; "
                        "its cross-site report is kept when every site answered with the same --bootstrap)")
    p.add_argument("--timeout", type=int, default=0, metavar="SECONDS",
                   help="how long a task waits for a site before going on without it (0: no limit); a site's "
                        "first round of a job gets 120 s more (its FLARE process starts); a config's "
                        "participation.deadline_s bounds the rounds' training tasks instead")
    add_device(p, what="the config's `device`, at every site")
    p.add_argument("--run-dir", default=None, metavar="RUN_DIR",
                   help="export: the server's run directory (a stable path makes the run resumable); "
                        "unset: a folder in the FLARE job workspace")
    p.add_argument("--no-cross-site", dest="cross_site", action="store_false",
                   help="skip the cross-site evaluation after the last round; unset: each site scores the final "
                        "model on its own test split and sends back only the AUROC summary")
    add_bootstrap(p, "patient-bootstrap resamples of the cross-site evaluation (0: DeLong CIs)")
    p.add_argument("--context", type=Path, default=None, metavar="FILE",
                   help="decrypt: a client's client_context.tenseal (its FLARE startup kit; privacy.secure_aggregation)")


def run(args) -> int:
    """Dispatch ``fedcxr flare <command>``; FLARE's own INFO lines stay in RUN_DIR/flare/logs."""
    from fedcxr.flare.controller import require_nvflare

    require_nvflare()
    handler = {"export": cli_export, "simulate": cli_simulate, "poc": cli_poc, "decrypt": cli_decrypt}
    return handler[args.flare_command](args)


def _summary(payload: dict, run_dir, what: str, cross_site: bool = False) -> None:
    print(f"{payload['method']} on {what}: finished {payload['rounds']} rounds; run directory {run_dir}")
    if payload.get("missed"):
        print(f"  {len(payload['missed'])} site replies missing or rejected (see run.json 'missed')")
    print(f"  FLARE job and logs: {run_dir.flare_workspace}")
    if cross_site and run_dir.report_md.is_file():
        print(f"  cross-site evaluation (each site on its own test split): {run_dir.report_md}")
        print(f"  a central evaluation beside it: fedcxr evaluate {run_dir} --replace-cross-site (the cross-site "
              "report is moved to cross_site_report/ first)")
    else:
        print(f"  next: fedcxr evaluate {run_dir}")


def _cli_run(args, runner, what: str) -> int:
    from fedcxr.flare.run import load_flare_config
    from fedcxr.logs import progress_wanted
    from fedcxr.rundir import RunDir

    cfg = load_flare_config(args.config, args.overrides, need_manifests=True)
    run_dir = RunDir(args.out) if args.out else RunDir.default_for(cfg, flare=True)
    if getattr(args, "bootstrap", 1000) < 0:
        raise UserError(f"--bootstrap must be 0 (DeLong CIs) or a positive number of resamples, got {args.bootstrap}")
    try:
        payload = runner(cfg, run_dir.root, resume=args.resume, task_timeout=args.timeout, device=args.device,
                         progress=progress_wanted(args), evaluation=_evaluation(args))
    except RunFailed as exc:  # the server stopped, a round failed, ...: say how to go on
        exc.advice = ("checkpoints of the completed rounds are kept; fix the cause (if any), then continue with: "
                      + resume_command(args, run_dir.root))
        raise
    _summary(payload, run_dir, what, cross_site=bool(getattr(args, "cross_site", True)))
    return 0


def resume_command(args, run_dir) -> str:
    """The command line that continues this run: the same config, options and ``--set`` values, ``--resume``."""
    import shlex

    argv = ["fedcxr", "flare", args.flare_command, str(args.config), "--out", str(run_dir)]
    for override in args.overrides or []:
        argv += ["--set", override]
    if args.timeout:
        argv += ["--timeout", str(args.timeout)]
    if args.device:
        argv += ["--device", str(args.device)]
    if not getattr(args, "cross_site", True):
        argv.append("--no-cross-site")
    elif getattr(args, "bootstrap", None) is not None:  # the same resamples keep a finished cross-site report
        argv += ["--bootstrap", str(args.bootstrap)]
    return shlex.join([*argv, "--resume"])


def _evaluation(args) -> dict:
    return {"enabled": bool(getattr(args, "cross_site", True)), "n_boot": int(getattr(args, "bootstrap", 1000))}


def cli_simulate(args) -> int:
    from fedcxr.flare.simulator import simulate

    return _cli_run(args, simulate, "the FLARE simulator")


def cli_poc(args) -> int:
    from fedcxr.flare.poc import poc

    return _cli_run(args, poc, "FLARE POC")


def cli_export(args) -> int:
    from fedcxr.flare.job import check_flare_sites, export_job
    from fedcxr.flare.run import load_flare_config

    cfg = load_flare_config(args.config, args.overrides, need_manifests=False)  # a bad config is named first
    if not args.out:
        raise UserError("fedcxr flare export needs --out JOB_DIR (the job folder to write)")
    # the server never reads the manifests or the image cache: keep this machine's paths out of the job
    cfg = cfg.model_copy(update={"manifests": None, "cache_dir": None})
    job_dir = export_job([(cfg, args.run_dir or "", True)], Path(args.out), task_timeout=args.timeout,
                         evaluation=_evaluation(args))
    sites = ", ".join(check_flare_sites(cfg))
    print(f"FLARE job written to {job_dir} (clients: {sites})")
    print("  each site needs fedcxr[flare] installed and its own local/fedcxr_site.json "
          '({"manifest_dir": ...}) or FEDCXR_SITE_CONFIG')
    print(f"  submit: nvflare job submit -j {job_dir}")
    if cfg.privacy.secure_aggregation:
        print("  secure aggregation: provision the system with nvflare.lighter.impl.he.HEBuilder (before "
              "SignatureBuilder); the server writes the final model encrypted: a site's key holder opens it with "
              "fedcxr flare decrypt RUN_DIR --context client_context.tenseal")
    return 0


def cli_decrypt(args) -> int:
    """``fedcxr flare decrypt RUN_DIR --context FILE``: the key holder's step of a secure-aggregation run."""
    from fedcxr.flare.he_keys import TENSEAL_HINT, have_tenseal, read_context_file
    from fedcxr.flare.sealing import SealError
    from fedcxr.flare.secure_aggregation import decrypt_run
    from fedcxr.rundir import RunDir

    run_dir = Path(args.config)
    if args.context is None:
        raise UserError("fedcxr flare decrypt needs --context FILE: a client's client_context.tenseal (the secret key "
                        "every site of the FLARE system got from provisioning)")
    if not RunDir(run_dir).final_model.is_file():
        raise UserError(f"{run_dir}: no final_model.pt (a finished FLARE run directory is needed)")
    if not have_tenseal():
        raise UserError(TENSEAL_HINT)
    try:
        opened = decrypt_run(run_dir, read_context_file(args.context, private=True))
    except SealError as exc:
        raise UserError(f"{run_dir}: {exc}") from None
    if opened:
        print(f"{RunDir(run_dir).final_model}: decrypted; next: fedcxr evaluate {run_dir}")
    else:
        print(f"{RunDir(run_dir).final_model} holds no encrypted model (decrypted before, or a plain run): unchanged")
    return 0
