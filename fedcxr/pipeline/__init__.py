"""Training: data, local training, aggregation rules, round protocols and their transports.

Imports flow one way, from the bottom of this table to the top (no module imports one above it):

====================  ========================================================================
layer / module        what it holds
====================  ========================================================================
commands              ``federation`` (run / resume one experiment, checkpoints, run.json),
                      ``predictions`` (a finished run's ``predictions/<split>.parquet``),
                      ``inference`` (a finished run's model on image files), ``checkpoints``,
                      ``dp_ledger`` (each site's DP spending over a run → ε in run.json)
transports            ``inprocess`` (every site in this process, the default); NVIDIA FLARE
                      lives one level up in :mod:`fedcxr.flare` (it imports this package)
protocols             ``protocols/`` (one module per family of methods, by the papers' names)
protocol framework    ``protocols/base`` (context, asking sites, reply checks), ``transport``
                      (the interface), ``site_tasks`` (site-side tasks registered with the
                      runner), ``combine`` (GP/FedDA/FedGP applied from a round's spec)
site side             ``site_runner`` (one site: its data, model, tasks), ``local`` (local
                      training + prediction), ``dp`` (DP-SGD with Opacus, ε accounting),
                      ``data`` (decode-once cache, datasets, loaders)
rules and helpers     ``aggregate`` (pure aggregation rules, robust ones too), ``screening``
                      (pure checks of a reply's counts and update norm), ``state`` (state-dict plumbing,
                      the one flatten), ``messages`` (the reply type and payload layouts),
                      ``keys`` (derived seeds, local-state key prefixes: server and sites alike),
                      ``config`` (the experiment YAML), ``engine`` (how training uses the
                      hardware: AMP, channels-last, cuDNN, loader workers, offloading)
====================  ========================================================================

``evaluation`` never imports this package and this package never imports ``evaluation``:
:mod:`fedcxr.commands` (and, at a FLARE site, :mod:`fedcxr.flare`) join the two.

"Predict" means four things in fedcxr; each has its own name:

* ``fedcxr predict`` (:mod:`fedcxr.commands.predict`): new images → a shareable CSV of keys,
  probabilities and decisions, plus a private key map;
* :mod:`~fedcxr.pipeline.inference` (``load_run_model``, ``score_files``): a finished run's model
  applied to image files, preprocessed exactly as training saw them (``fedcxr predict``, the
  MONAI bundle, Grad-CAM);
* :mod:`~fedcxr.pipeline.predictions` (``write_predictions``): a finished run's scores of every
  evaluated site's split, ``RUN_DIR/predictions/<split>.parquet``, the input of ``fedcxr evaluate``;
* ``local.predict``: one forward pass of a model over a loader (probabilities, labels, mask) —
  what ``predictions`` and a site's per-round validation call.
"""
