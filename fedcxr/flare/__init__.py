"""The same round protocols on NVIDIA FLARE, one client per hospital (DESIGN §8).

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
``wire``            the FLModel payload format of tasks and replies, and what a reply may hold
``controller``      the server: :class:`FedcxrController` (a ModelController running
                    :func:`fedcxr.pipeline.federation.run_experiment`) and its transport
``client``          the hospital: :class:`FlareSite` around a :class:`SiteRunner`, the Client API loop
``fedcxr_client``   the two-line client script FLARE copies into each site's app
``job``             the FLARE job (controller + client script per site), export to a folder
``run``             the FLARE simulator and POC mode: processes started, waited for, stopped
``cli``             ``fedcxr flare export|simulate|poc``
==================  ==========================================================================

A package of its own above :mod:`fedcxr.pipeline` (whose protocols, site runner and
federation loop it reuses unchanged) so that it may also use :mod:`fedcxr.evaluation` at a site.
Install with ``pip install 'fedcxr[flare]'`` (never ``nvflare[pt]``: it pulls torchvision).
"""
