"""The command layer: what ``fedcxr <command>`` runs, joining training and evaluation.

The packages below never import each other across the train/evaluate divide
(``evaluation`` never imports ``pipeline``); the commands here are the only place both meet.

=============  ===============================================================================
module         command
=============  ===============================================================================
``init``       ``fedcxr init`` — a commented starter config, csv mapping and example export
``ingest``     ``fedcxr ingest`` — an export → per-site manifests (:mod:`fedcxr.site_adapters`)
``train``      ``fedcxr train`` — one experiment in-process (:mod:`fedcxr.pipeline.run_driver`)
``evaluate``   ``fedcxr evaluate`` — predictions (pipeline) → per-class AUROC report (evaluation)
``predict``    ``fedcxr predict`` — a trained model on new images (keys, probabilities, decisions)
``report``     ``fedcxr report`` — method-comparison table across runs (evaluation only)
``sweep``      ``fedcxr sweep`` — methods × seeds, each trained, evaluated, then compared
``demo``       ``fedcxr demo`` — synth → ingest → train → evaluate on the embedded default
``stats``      ``fedcxr stats`` — federated statistics, shift diagnosis, advice (:mod:`fedcxr.stats`)
=============  ===============================================================================

``fedcxr synth`` needs no training side (:mod:`fedcxr.synth`); ``fedcxr flare`` lives with FLARE (:mod:`fedcxr.flare.cli`).
"""
