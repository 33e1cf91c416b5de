"""Vendor exports → canonical per-site manifests (DESIGN §2-3): the only package that knows vendors' formats.

=========================  ====================================================================
module                     what it holds
=========================  ====================================================================
**the ingest**
``ingest``                 the driver of ``fedcxr ingest``: adapter dispatch (``ADAPTERS``, derived
                           from ``sources``), pseudonyms, image checks, partition, writing; every
                           row accounted for
``base``                   the contract every adapter fulfils: canonical rows, ``SetAside``,
                           ``SourceTable``, ``AdapterOptions``
``sources``                every SOURCE declared once (``SourceSpec``: adapter, summary, example,
                           ``--plan``, ``--labels-key``): the registry, ``--help`` and ``--plan`` derive from it
``partition``              canonical rows → sites (``--site-by``: column, conditions, iid, skew)
``manifest``               label policy, patient-disjoint splits, ``manifest.parquet`` + ``site.json``
``sitekey``, ``site_names``  the site's secret pseudonym key; names that never merge two hospitals
``paths``                  every image path kept inside its export root; regular files only
``tables``                 reading vendor metadata tables (csv checks, value maps, hints)
**one adapter per source** (TorchXRayVision's "one contract for all")
``nih``, ``chexpert``,     the source of the same name; their module docs are what
``mimic``, ``midrc``,      ``fedcxr ingest SOURCE --help`` prints
``rsna``, ``vindr``,
``siim``, ``openi``,
``padchest``, ``medmnist``
``dicom_folder``           ``dicom`` and ``images``: any folder of DICOM (PNG, JPEG) files + a label csv
``csv_mapping``            ``csv``: any export described by a YAML mapping (its schema:
                           ``csv_mapping_schema``, the pydantic model)
``export_images``          what the public-dataset adapters share: finding each image by name
``body_part``, ``zip3``    is this DICOM a chest radiograph; US ZIP3 → state (MIDRC)
**images** (one path for ingest checks, training's cache, predict and the bundle)
``image_headers``          container and header checks before any decode; the pixel budget; the errors
``images``                 the one decode path (DICOM LUTs/VOI/MONOCHROME1, PIL) → float32 [0, 1]
``image_checks``           one reason per file over whole exports, in worker processes
``shift``                  a seeded covariate shift of a site's images → a new site (``fedcxr shift``)
=========================  ====================================================================

Imports only the L1 leaves (:mod:`fedcxr.vocab`, :mod:`fedcxr.errors`, :mod:`fedcxr.atomic`,
:mod:`fedcxr.logs`, :mod:`fedcxr.parallel`, :mod:`fedcxr.escape`, :mod:`fedcxr.yamlfile`):
nothing downstream of a manifest knows a vendor's format, and nothing here knows training.
"""
