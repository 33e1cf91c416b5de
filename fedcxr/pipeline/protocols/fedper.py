"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers", arXiv:1912.00818).

Every site trains its whole model — shared base layers and its personalization layers together —
from the round's base and its own personalization layers; the server averages the base layers
only (FedAvg, weighted by training rows, as the paper's Algorithm 1 and PFLlib's ``serverper``);
the personalization layers never leave the site's model. Each site is evaluated with its own
model on its own test split (:mod:`~fedcxr.pipeline.protocols.personal`).

Options (``fedper:``): ``personal`` — which layers are personal: ``head`` (the classification
layer: K_P = 1, PFLlib's ``model.head``) or ``projection_and_head`` (K_P = 2: fedcxr's projection
layer too).

Against PFLlib's ``clientper.py`` / ``serverper.py``: the same rule (the client trains the whole
model, uploads ``model.base`` only, receives the base). Departures: the local optimiser is the
house's (``source.optimizer``, Adam by default; PFLlib: SGD), and a site's first round starts
from the server's initial head, as PFLlib's clients do (their heads are copies of the initial
global model).
"""

from __future__ import annotations

from pydantic import Field

from fedcxr.pipeline.protocols.personal import PersonalLayers, PersonalLayersProtocol
from fedcxr.pipeline.protocols.spec import MethodOptions, method


class FedPerOptions(MethodOptions):
    """``fedper:`` — its options."""

    personal: PersonalLayers = Field("head", description="the personalization layers kept at each site: head "
                                     "(K_P = 1) or projection_and_head (K_P = 2)")


class FedPerProtocol(PersonalLayersProtocol):
    """Base layers averaged, personalization layers kept at each site (Algorithm 1)."""

    reads_each_update = "leaves each site's personalization layers out of the average entry by entry"
    options_key = "fedper"
    Options = FedPerOptions

    def personal_layers(self, ctx):
        return self.options(ctx.cfg).personal


METHODS = {"FedPer": method(FedPerProtocol)}
