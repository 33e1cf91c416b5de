"""The command layer: what ``fedcxr <command>`` runs, joining training and evaluation.

The packages below never import each other across the train/evaluate divide
(``evaluation`` never imports ``pipeline``); the commands here are the only place both meet.

=================  ===========================================================================
module             command
=================  ===========================================================================
``init``           ``fedcxr init`` — a commented starter config, csv mapping and example export
``ingest``         ``fedcxr ingest`` — an export → per-site manifests (:mod:`fedcxr.site_adapters`)
``train``          ``fedcxr train`` — one experiment in-process (:mod:`fedcxr.pipeline.run_driver`)
``evaluate``       ``fedcxr evaluate`` — predictions (pipeline) → per-class AUROC report (evaluation)
``predict``        ``fedcxr predict`` — a trained model on new images (keys, probabilities, decisions)
``report``         ``fedcxr report`` — method-comparison table across runs (evaluation only)
``sweep``          ``fedcxr sweep`` — methods × seeds, each trained, evaluated, then compared
``demo``           ``fedcxr demo`` — synth → ingest → train → evaluate on the embedded default
``stats``          ``fedcxr stats`` — federated statistics, shift diagnosis, advice (:mod:`fedcxr.stats`)
``synth``          ``fedcxr synth`` — the synthetic hospitals' exports (:mod:`fedcxr.synth`)
``shift``          ``fedcxr shift`` — a covariate-shifted copy of a site (:mod:`fedcxr.site_adapters.shift`)
``export_bundle``  ``fedcxr export-bundle`` — a run's model as a MONAI bundle (:mod:`fedcxr.bundle`)
``flare``          ``fedcxr flare export|simulate|poc`` — the same run on NVIDIA FLARE (:mod:`fedcxr.flare`)
=================  ===========================================================================

Every ``fedcxr`` handler lives here (``cli.py`` names them in ``HANDLERS``) and nothing but
``cli.py`` imports this package: a piece two commands share, or that a package below needs (the
bundle reads a run's operating points: :func:`fedcxr.evaluation.runs.thresholds_for`), moves down
to the package it belongs to.
"""
