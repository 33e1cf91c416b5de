"""The command layer: what ``fedcxr <command>`` parses and prints — one module per command.

Each module declares its command's options beside its handler: ``HELP`` (the one-line
description), ``add_arguments(parser)`` and ``run(args) -> int`` — parse, call one library
function of :mod:`fedcxr.workflows` (the Python API: ``fedcxr.train``, ``fedcxr.evaluate``, ...),
print what it returned. ``cli.py`` assembles them (``cli.COMMANDS``) and is the only module that
imports this package; a piece two commands share, or that a package below needs, moves down to
the package it belongs to (options several commands declare: :mod:`~fedcxr.commands.options`).
Libraries are imported inside ``run``, so building the parser never imports torch.

=================  ===========================================================================
module             command (the library function it calls)
=================  ===========================================================================
``init``           ``fedcxr init`` — a commented starter config, csv mapping and example export
                   (:func:`fedcxr.workflows.init.init_study`)
``ingest``         ``fedcxr ingest`` — an export → per-site manifests (:func:`fedcxr.workflows.ingest.ingest`;
                   the sources: :data:`fedcxr.site_adapters.sources.SOURCES`)
``train``          ``fedcxr train`` — one experiment in-process (:func:`fedcxr.workflows.train.train`)
``evaluate``       ``fedcxr evaluate`` — the per-class AUROC report (:func:`fedcxr.workflows.evaluate.evaluate`)
``predict``        ``fedcxr predict`` — a trained model on new images (:func:`fedcxr.workflows.predict.predict`)
``report``         ``fedcxr report`` — method-comparison table across runs (:func:`fedcxr.workflows.report.report`)
``sweep``          ``fedcxr sweep`` — methods × seeds, trained, evaluated, compared (:func:`fedcxr.workflows.sweep.sweep`)
``demo``           ``fedcxr demo`` — the embedded default (:func:`fedcxr.workflows.demo.run_demo`) and its table
``stats``          ``fedcxr stats`` — federated statistics, shift diagnosis, advice
                   (:func:`fedcxr.workflows.stats.statistics`)
``synth``          ``fedcxr synth`` — the synthetic hospitals' exports (:mod:`fedcxr.synth`)
``shift``          ``fedcxr shift`` — a covariate-shifted copy of a site (:mod:`fedcxr.site_adapters.shift`)
``export_bundle``  ``fedcxr export-bundle`` — a run's model as a MONAI bundle (:mod:`fedcxr.bundle`)
``flare``          ``fedcxr flare export|simulate|poc`` — the same run on NVIDIA FLARE (:mod:`fedcxr.flare`)
``options``        ``--device``, ``--set``, ``--bootstrap``: the options several commands declare
=================  ===========================================================================
"""
