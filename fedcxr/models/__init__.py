"""The network (DESIGN §4): MONAI backbone → optional projection → class-named main head + aux heads.

=============  =====================================================================================
module         what it holds
=============  =====================================================================================
``network``    :class:`~fedcxr.models.network.CXRNet` and its named parts (``backbone.``, ``proj.``,
               ``head.``, ``aux_heads.<task>.``, so aggregation rules pick entries by prefix);
               ``make_backbone`` (MONAI DenseNet121 / ResNet18 / ResNet10 / resnet_tiny, 1 channel,
               BatchNorm or GroupNorm); ``network_from_config``; ``load_weights`` (fedcxr's own
               ``final_model.pt``/checkpoints or a torchvision-style DenseNet/ResNet state dict,
               head rows matched by class name, nothing downloaded); ``bn_keys``, ``head_keys``
=============  =====================================================================================

Imports only :mod:`fedcxr.vocab` and :mod:`fedcxr.errors` (and torch/MONAI): the training side
(:mod:`fedcxr.pipeline`), FLARE and the bundle build the same network from here.
"""
