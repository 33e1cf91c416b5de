"""The former name of :mod:`fedcxr.pipeline.run_driver` (the transport-agnostic run driver).

Kept so that scripts and tests written against ``fedcxr.pipeline.federation`` still import; new
code imports :mod:`fedcxr.pipeline.run_driver`. Nothing in fedcxr imports this module.
(``check_run_dir`` is gone: the run directory's checks are
:meth:`fedcxr.rundir.RunDir.check_start`.)
"""

from fedcxr.pipeline.run_driver import (  # noqa: F401
    build_context,
    head_classes,
    initial_model,
    run_experiment,
)
