"""A trained model as a MONAI bundle (``fedcxr export-bundle``).

``export`` writes the bundle (TorchScript model without debug records, metadata, an inference
config MONAI's own runner executes, ``checksums.sha256``); ``runtime`` is what the bundle runs,
shipped into its ``scripts/`` folder (checksum check, contained image listing, per-file set-aside).
The command line is :mod:`fedcxr.commands.export_bundle`.
"""
