"""Running a generation job: the dispatch core and everything that decides what happens next.

``runner`` wires one run together (config, store, ingest, provider, scheduler, writer, reporter);
``scheduler`` dispatches prompts; ``attempt`` is one prompt's request with its retries, ending in an
outcome that ``outcomes`` applies; ``routing`` holds the request body and excluded providers;
``runstate`` holds the run's phase, its one pause record and each dataset's counters; ``guards`` holds
every rule that pauses a dataset or the run; ``commands`` is the one command path (typed
``RunCommand`` values, applied by the ``controller`` live and by ``ctl`` offline);
``observe`` and ``telemetry`` turn the counters into snapshots. Above ``money``, ``report``,
``storage``, ``metrics`` and ``proc``; nothing below imports this package.
"""
