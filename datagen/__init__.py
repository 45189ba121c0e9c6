"""The ``datagen`` command line: the layer above both the engine (``engine/``) and the dashboard (``tui/``).

Layers, top to bottom (enforced by ``lint-imports``, contracts in ``pyproject.toml``)::

    datagen   the CLI: parses arguments, starts the engine headless or under the dashboard, maps errors to exit codes
    tui       the Textual dashboard: imports the engine, never the CLI
    engine    the run: config, datasets, client, scheduler, store, tokens, export, extract, simulator

``python -m datagen`` is the same as the ``datagen`` console script.
"""
