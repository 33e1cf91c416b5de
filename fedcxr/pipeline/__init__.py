"""Training: data, local training, aggregation rules, round protocols, their transports and the run driver.

Imports flow one way, from the bottom of this table to the top (no module imports one above it):

====================  ========================================================================
layer / module        what it holds
====================  ========================================================================
run                   ``run_driver`` (the transport-agnostic run driver: rounds, validation,
                      checkpoints, resume, the run directory's files — ``fedcxr train`` and a
                      FLARE server run this same loop; ``federation`` is its former name),
                      ``predictions`` (a finished run's ``predictions/<split>.parquet``),
                      ``inference`` (a finished run's model on image files), ``checkpoints``,
                      ``dp_ledger`` (each site's DP spending over a run → ε in run.json)
transports            ``inprocess`` (every site in this process, the default),
                      ``simulated_consortium`` (those sites on a virtual clock: ``simulate:``);
                      NVIDIA FLARE lives one level up in :mod:`fedcxr.flare` (it imports this package)
protocols             ``protocols/`` (a method is one module: protocol, options, site tasks and
                      their share of the task envelope, names; ``protocols/methods`` the registry
                      derived from the modules; what other modules need to know about a method
                      is a property of its protocol), ``config_compat`` (former config keys)
protocol framework    ``protocols/base`` (context, task configs, asking sites, reply checks,
                      per-method defaults), ``transport`` (the interface), ``combine``
                      (GP/FedDA/FedGP applied from a round's spec)
site side             ``site_runner`` (one site: its data, model, local state, and the explicit
                      tasks it answers by itself; a method's own tasks live in its module in
                      ``protocols/``), ``shared_task`` (one output every site maps its
                      condition onto), ``local`` (the local training loop), ``losses`` (masked
                      BCE, aux CE, FedProx's term), ``optimizers`` (the local optimiser and its
                      kept state), ``forward`` (probabilities over a loader, the quick AUROC),
                      ``devices`` (``--device``), ``dp`` (DP-SGD with Opacus, ε accounting),
                      ``data`` (decode-once cache, datasets, loaders), ``augment``
rules and helpers     ``aggregate/`` (pure aggregation rules, one module per family: mean,
                      surgical, projection, auto_weighting, fact, robust, server_opt), ``screening``
                      (pure checks of a reply's counts and update norm), ``state`` (state-dict
                      plumbing, the one flatten), ``messages`` (a leaf: the typed task configs,
                      the reply with its weight type), ``config`` (the experiment YAML; it checks
                      a method's options against its module; ``config_consortium`` its
                      ``participation:`` and ``simulate:`` blocks), ``participation`` (which sources a
                      round asks), ``virtual_clock`` (a simulated consortium's arithmetic), ``engine`` (how training uses the hardware: AMP,
                      channels-last, cuDNN, loader workers, offloading), ``keys`` (derived seeds,
                      local-state key prefixes: server and sites alike), ``run_log``,
                      ``labeled_rows`` (which labeled target rows a site trains on: the cap, the
                      draw, the held-out fold)
====================  ========================================================================

``evaluation`` never imports this package and this package never imports ``evaluation``:
:mod:`fedcxr.workflows` (and, at a FLARE site, :mod:`fedcxr.flare`) join the two. Both read a run
directory through :mod:`fedcxr.rundir`.

"Predict" means four things in fedcxr; each has its own name:

* ``fedcxr predict`` (:mod:`fedcxr.workflows.predict`): new images → a shareable CSV of keys,
  probabilities and decisions, plus a private key map;
* :mod:`~fedcxr.pipeline.inference` (``load_run_model``, ``score_files``): a finished run's model
  applied to image files, preprocessed exactly as training saw them (``fedcxr predict``, the
  MONAI bundle, Grad-CAM);
* :mod:`~fedcxr.pipeline.predictions` (``write_predictions``): a finished run's scores of every
  evaluated site's split, ``RUN_DIR/predictions/<split>.parquet``, the input of ``fedcxr evaluate``;
* ``forward.predict``: one forward pass of a model over a loader (probabilities, labels, mask) —
  what ``predictions`` and a site's per-round validation call.
"""
