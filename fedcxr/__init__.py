"""fedcxr: federated chest X-ray classification across hospitals without moving images.

Subpackages follow the data's journey (DESIGN §1); imports point down this list, never up:

==================  ==========================================================================
package             what it holds
==================  ==========================================================================
``commands``        what each ``fedcxr`` command runs; the only place training and
                    evaluation meet (``cli`` parses the options and hands over to it)
``flare``           the same round protocols on NVIDIA FLARE, one client per hospital
``bundle``          a finished run's model as a MONAI bundle MONAI's own runner executes
``stats``           before training: federated statistics, shift diagnosis, method advice
``evaluation``      per-class AUROC with CIs, subgroups, reports, comparisons (no torch)
``pipeline``        data cache, local training, pure aggregation rules, round protocols,
                    the in-process federation, checkpoints, predictions
``synth``           the synthetic hospitals of the demo and the tests (ingested by the real adapters)
``models``          MONAI backbones with class-named main heads and aux heads
``site_adapters``   vendor exports → canonical per-site manifests
``advice``          the regime map (which method wins where) and reading it
``tracking``        per-round scalars to TensorBoard / MLflow
``vocab``, ``atomic``, ``errors``   vocabularies, crash-safe writes, the user-error type
``escape``, ``runlock``, ``yamlfile``  hostile text made safe per format, one process per run
                    directory, bounded YAML reading (SECURITY.md)
``logs``, ``parallel``  the console (one progress-bar policy), chunks of work mapped over worker
                    processes in order with bounded memory (ingest checks, header reads, caching)
``rundir``          the run directory: every file's name, and the readers and writers of its
                    plain files (run.json, metrics.jsonl, config.yaml); training, evaluation,
                    FLARE and the commands all take the layout from it
==================  ==========================================================================
"""

__version__ = "0.2.0"
