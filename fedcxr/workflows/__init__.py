"""The workflows: what each ``fedcxr`` command does, as library functions (the Python API).

Each function here is what its command runs and what a script or notebook calls
(``fedcxr.train``, ``fedcxr.evaluate``, ... are these, imported lazily by ``fedcxr/__init__.py``).
A workflow takes paths, mappings or typed objects, returns a typed result (a frozen dataclass
holding the run directory, the report, the files written) and **prints nothing**; bad input
raises :class:`fedcxr.errors.UserError` (never ``sys.exit``). The command layer
(:mod:`fedcxr.commands`, reached only from ``cli.py``) parses options, calls one of these and
prints what it returned.

Training and evaluation meet here (``evaluation`` never imports ``pipeline``): this layer sits
above both, below the commands.

=================  ==========================================================================
module             workflow (API name)
=================  ==========================================================================
``experiment``     a config given as a YAML path, a mapping or an ``ExperimentConfig``, with
                   ``--set`` strings and keyword overrides (every workflow that takes a config)
``init``           ``init_study`` — a commented config, csv mapping and example export (``templates/``)
``ingest``         ``ingest`` — an export → per-site manifests (:mod:`fedcxr.site_adapters.ingest`)
``train``          ``train`` — one experiment in-process (:mod:`fedcxr.pipeline.run_driver`)
``evaluate``       ``evaluate`` — predictions (pipeline) → per-class AUROC report (evaluation),
                   operating points; ``evaluate_run`` returns the report dict only
``predict``        ``predict`` — a trained model on new images (keys, probabilities, decisions)
``report``         ``report`` — the method-comparison table across runs (evaluation only)
``stats``          ``statistics`` — federated statistics, shift diagnosis, advice (:mod:`fedcxr.stats`)
``sweep``          ``sweep`` — methods × seeds, each trained, evaluated, then compared
``choose``         ``choose_method``, ``select_and_train`` — ``fedcxr sweep --select``: a method
                   chosen by cross-fitting on the target's labeled rows only, then trained
``demo``           ``run_demo``, ``demo_config`` — the embedded default, synth → ingest → train → evaluate
=================  ==========================================================================
"""
