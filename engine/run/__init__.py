"""Running a generation job: the dispatch core and everything that decides what happens next.

``runner`` wires one run together (config, store, ingest, provider, scheduler, writer, reporter);
``scheduler`` dispatches prompts; ``attempt`` is one prompt's request with its retries; ``runstate``
holds the run's phase and each dataset's counters; ``guards`` holds every rule that pauses a dataset
or the run; ``controller`` and ``ctl`` are the command surface (dashboard keys, ``datagen ctl``);
``observe`` and ``telemetry`` turn the counters into snapshots. Above ``money``, ``report``,
``storage``, ``metrics`` and ``proc``; nothing below imports this package.
"""
