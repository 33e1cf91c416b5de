"""The same round protocols on NVIDIA FLARE, one client per hospital (DESIGN §8).

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
``wire``            the FLModel payload format of tasks and replies, and what a reply may hold
``controller``      the server: :class:`FedcxrController` (a ModelController running
                    :func:`fedcxr.pipeline.run_driver.run_experiment`) and its transport
``liveness``        which sites a task asks (not those FLARE deems disconnected), how long it waits
                    (a start-up allowance up to a site's first round), why a site is absent
``client``          the hospital: :class:`FlareSite` around a :class:`SiteRunner`, the Client API loop
``fedcxr_client``   the two-line client script FLARE copies into each site's app
``warm_up``         MONAI imported in the background while a FLARE process only waits (first round sooner)
``site_evaluation`` the ``validate`` task: a site scores a model on its own split, replies with summaries
``cross_site``      the server's cross-site evaluation after the last round: report from site summaries
``persistor``       FLARE's persistor and model locator: the global model where FLARE's tools look
``job``             the FLARE job (controller, persistor, tracking receiver, client script per site)
``run``             a fedcxr run on FLARE whatever runs it: config, run directories, job, rounds, results
``processes``       the ``nvflare`` processes a run starts: process tree, clean stop, logs kept (never keys)
``simulator``       ``fedcxr flare simulate``: the run in FLARE's simulator on this machine
``poc``             ``fedcxr flare poc``: a POC system provisioned (mTLS), started, used and stopped here
``poc_watch``       what ``fedcxr flare poc`` watches while its job runs: a stopped server, a restarted
                    site (the job resubmitted), a job FLARE keeps open after its runs ended
``stats``           ``fedcxr stats --flare``, a site: FLARE ``Statistics`` over fedcxr's released counts,
                    and the recorder of what the site sent
``stats_job``       the server: FLARE's ``StatsJob`` and ``StatisticsController`` with fedcxr's pieces;
                    FLARE's result read back and checked
``stats_run``       the statistics job in the simulator or on a POC system
``sealing``         ``privacy.secure_aggregation``, a site: models sealed with CKKS (one packed vector
                    and a check slot) and opened again; the sealed-state format
``secure_aggregation``  the server: FedAvg on ciphertexts, the checks left to it, ``fedcxr flare decrypt``
``he_keys``         where the HE keys come from: FLARE provisioning's ``HEBuilder``, the rehearsals'
==================  ==========================================================================

A package of its own above :mod:`fedcxr.pipeline` (whose protocols, site runner and
run driver it reuses unchanged) so that it may also use :mod:`fedcxr.evaluation` at a site.
``fedcxr flare export|simulate|poc|decrypt`` is :mod:`fedcxr.commands.flare`.
Install with ``pip install 'fedcxr[flare]'`` (never ``nvflare[pt]``: it pulls torchvision); secure
aggregation also needs ``'fedcxr[he]'`` (TenSEAL).
"""

#: Seconds an idle FLARE client waits before asking the server again for a task: FLARE's
#: ``task_request_interval`` (default 2 s, so up to 2 s lost by every site at every task, and at
#: the end of a job). Every job fedcxr writes — training and statistics — sets it.
TASK_REQUEST_INTERVAL = 0.05
