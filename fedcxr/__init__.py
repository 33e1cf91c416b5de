"""fedcxr: federated chest X-ray classification across hospitals without moving images.

Subpackages follow the data's journey (DESIGN §1): ``site_adapters`` (vendor exports →
canonical per-site manifests), ``models`` (MONAI backbones + class-named heads), ``pipeline``
(data, local training, pure aggregation rules, round protocols, federation and FLARE), and
``evaluation`` (per-class AUROC reports and comparisons).
"""

__version__ = "0.2.0"
