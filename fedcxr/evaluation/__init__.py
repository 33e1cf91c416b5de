"""Evaluation of runs (DESIGN §6): per-class AUROC with CIs, subgroups, reports, comparisons.

* ``metrics``      AUROC on labeled rows (NaN + reason when undefined), patient-level bootstrap,
                   fast DeLong and patient-clustered DeLong (Obuchowski 1997), paired tests;
                   pure numpy/scipy/scikit-learn.
* ``small_sample`` the rule for numbers resting on few cases (fewer than 10 positive or negative
                   patients): the ``small_sample`` flag, its words, Newcombe's score interval for
                   AUROC, Wilson's for proportions, none for one patient.
* ``operating``    decision thresholds chosen on the val split (Youden, target sensitivity,
                   target specificity) and sensitivity/specificity/PPV/NPV with bootstrap CIs.
* ``calibration``  Brier score, expected calibration error (10 equal-width bins), reliability bins.
* ``runs``         reading ``run.json``, ``predictions/<split>.parquet`` (site, row_key,
                   patient_key, label__/prob__/aux__ columns) and the stored operating points
                   (``operating_points.json``: ``fedcxr predict``, the bundle) with clear user errors.
* ``report``       one run's predictions → the report dict (``report.json``'s content, schema 3);
                   ``report_files``: writing it (``report.json``, ``per_class.csv``, figures, file
                   names of sites); ``report_markdown``: ``report.md`` and the number formats;
                   ``plots``: ROC and reliability PNGs.
* ``report_table`` reports built from sites' summaries (FLARE cross-site evaluation);
                   ``summary_check``: what such a summary may hold (known fields, numbers in range,
                   known reason texts).
* ``compare``      several runs → the method-comparison table and tests against a baseline
                   (clustered DeLong per class with Benjamini–Hochberg q-values, paired t-test).

``fedcxr evaluate`` and ``fedcxr report`` are :mod:`fedcxr.workflows.evaluate` and
:mod:`fedcxr.workflows.report` (the commands print what they return).

No module here imports ``fedcxr.pipeline`` or torch.
"""
