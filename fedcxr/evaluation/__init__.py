"""Evaluation of runs (DESIGN §6): per-class AUROC with CIs, subgroups, reports, comparisons.

* ``metrics``  AUROC on labeled rows (NaN + reason when undefined), patient-level bootstrap,
               fast DeLong, paired tests; pure numpy/scipy/scikit-learn.
* ``runs``     reading ``run.json`` and ``predictions/<split>.parquet`` with clear user errors.
* ``report``   one run → ``report.json``, ``per_class.csv``, ``report.md``; ``plots``: ROC PNGs.
* ``compare``  several runs → the method-comparison table and tests against a baseline.
* ``cli``      ``fedcxr evaluate`` and ``fedcxr report``.
"""
