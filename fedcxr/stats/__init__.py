"""Know the federation before training: federated statistics, a shift diagnosis, the advice.

==============  ==============================================================================
module          what it holds
==============  ==============================================================================
``groups``      what a site counts: every statistic a group of count cells over fixed categories
``site``        one site's true counts from its manifest, file headers and decode-once cache
``release``     what leaves a site: Laplace noise (optional), min-count and complementary
                suppression, and the last check before anything is sent
``merge``       the global section: released payloads summed, prevalence, intensity quantiles
``distances``   pairwise site distances (Jensen–Shannon, Wasserstein-1) and the shift type
``pilot``       σ², d², τ²d², β from one auto-weighted FedGP round (the pipeline's own machinery)
``recommend``   the advice: the federation's cell of the regime map and its verdict there
``figures``     prevalence bars, age/sex pyramids, intensity curves, distance heatmaps
``report``      ``stats.md`` (every text escaped)
``run``         ``fedcxr stats`` in-process; assembling ``stats.json``
==============  ==============================================================================

An L3 package beside :mod:`fedcxr.pipeline`, whose data loading and round protocols it reuses;
:mod:`fedcxr.flare` builds FLARE's federated statistics workflow on :mod:`fedcxr.stats.site` and
:mod:`fedcxr.stats.release`, and ``fedcxr stats`` (:mod:`fedcxr.workflows.stats`, the API's ``fedcxr.statistics``) drives both.
Nothing in :mod:`fedcxr.pipeline` imports this package.
"""

from __future__ import annotations

import sys
import types


class _CallableStatsPackage(types.ModuleType):
    """This package, callable: ``fedcxr.stats(config, out, ...)`` is the API's ``fedcxr.statistics``.

    Users write ``fedcxr.stats(...)`` after the command's name (issue 28 asked for it); the package
    keeps its name for its modules, and a call goes to the one function ``fedcxr stats`` calls, imported
    on first use so that this package stays below the workflow layer at import time.
    """

    def __call__(self, *args: object, **kwargs: object) -> object:
        import fedcxr

        return fedcxr.statistics(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableStatsPackage
