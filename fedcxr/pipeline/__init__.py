"""Training: data, local training, aggregation rules, round protocols and their transports.

Imports flow one way, from the bottom of this table to the top (no module imports one above it):

====================  ========================================================================
layer / module        what it holds
====================  ========================================================================
commands              ``federation`` (run / resume one experiment, checkpoints, run.json),
                      ``predict`` (a finished run's predictions), ``checkpoints``,
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
"""
