"""The one base of the project's exceptions, and the errors more than one module raises.

:class:`DatagenError` is the root of every exception class defined in ``engine/``: the ``datagen`` CLI
catches it once and prints ``error: <message>`` with the command's error exit status (docs/commands.md,
"Every command"). A subclass keeps its other bases (``ValueError`` for the bad-value errors), so existing
``except ValueError`` clauses keep catching it. Messages name the file, row or config key and what was
expected; they never carry an API key or another secret (the CLI prints them as they are).

Pure: no imports.
"""


class DatagenError(Exception):
    """Base of every exception the project defines; ``str(err)`` is a message for the user."""


class NothingToExport(DatagenError):
    """No record qualifies for the export; nothing was written. The message says why (counts of
    stored, invalid and unvalidated results, the failed checks) and what to do.

    Raised by :mod:`engine.report.export` (raw) and :mod:`engine.tokens.exports` (validated formats); defined
    here, below both, so neither imports the other for it. ``datagen export`` exits 1 for it (not 2)."""
