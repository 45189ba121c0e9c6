"""Durable state: the run's SQLite store and every query and write on it, the batched exactly-once
writer, atomic file output.

Only this package imports ``sqlite3`` / ``aiosqlite`` (the ``storage-owns-sqlite`` import contract in
``pyproject.toml``): ``schema`` (every table), ``store`` (the engine's async store: with ``ingest``,
``dispatch``, ``resume``), ``writer`` (batched commits), ``handle`` (synchronous, opaque handles for
other processes and commands), ``read`` (status, report, raw export, ``ctl``), ``dollars`` (a run's
dollars, one definition), ``offline`` (``ctl``'s writes with no engine running), ``validations``
(validation's table and the validated records), ``atomic`` (files).
"""
