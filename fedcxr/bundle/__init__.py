"""A trained model as a MONAI bundle (``fedcxr export-bundle``).

``export`` writes the bundle (TorchScript model, metadata, an inference config MONAI's own
runner executes); ``runtime`` is what the bundle runs, shipped into its ``scripts/`` folder.
"""
