"""What the extraction view needs from whatever runs extraction: a typed host, and a static host.

The view reads only :class:`engine.extract.snapshot.ExtractSnapshot` (pulled with
``host.snapshot()`` on a timer) and sends only :class:`engine.extract.snapshot.ExtractCommands`
(``host.commands``), like the generation view with :class:`tui.host.DashboardHost`. The engine's
extraction run implements it; :class:`StaticExtractHost` shows an injected snapshot source and
command target (tests, screenshots, ``python -m tui.extract --demo``).
"""

from __future__ import annotations

from typing import Callable, Protocol

from engine.api import ExtractCommands, ExtractSnapshot


class ExtractHost(Protocol):
    """Everything the extraction view asks of its host.

    Attributes:
        commands: the command target (pause, resume, skip, quit); None while extraction is starting.
    """

    @property
    def commands(self) -> ExtractCommands | None: ...

    def snapshot(self) -> ExtractSnapshot | None:
        """The job's state now (None before the job is planned)."""
        ...


class StaticExtractHost:
    """An :class:`ExtractHost` over an injected snapshot source and command target.

    Args:
        source: returns the snapshot to show (or None).
        commands: the command target (e.g. :class:`RecordingCommands`), or None.
    """

    def __init__(self, source: Callable[[], ExtractSnapshot | None], commands: ExtractCommands | None) -> None:
        self._source = source
        self._commands = commands

    @property
    def commands(self) -> ExtractCommands | None:
        """The injected command target."""
        return self._commands

    def snapshot(self) -> ExtractSnapshot | None:
        """What the injected source returns now."""
        return self._source()


class RecordingCommands:
    """An :class:`~engine.extract.snapshot.ExtractCommands` that records each call in ``calls``
    (``(method, args)``) and answers like the engine would.

    Args:
        datasets: the dataset names :meth:`skip` accepts (others raise ``ValueError``, naming them).
    """

    def __init__(self, datasets: tuple[str, ...] = ()) -> None:
        self.datasets = tuple(datasets)
        self.calls: list[tuple[str, tuple]] = []
        self.quits = 0

    def pause(self) -> str:
        self.calls.append(("pause", ()))
        return "extraction pausing: workers finish and write the batch in hand"

    def resume(self) -> str:
        self.calls.append(("resume", ()))
        return "extraction resumed"

    def skip(self, dataset: str) -> str:
        self.calls.append(("skip", (dataset,)))
        if dataset not in self.datasets:
            raise ValueError(f"unknown dataset {dataset!r}; the datasets are: {', '.join(self.datasets)}")
        return f"{dataset} skipped: no more batches of it"

    def quit(self) -> str:
        self.calls.append(("quit", ()))
        self.quits += 1
        if self.quits == 1:
            return "draining: workers finish the batches in hand and flush shards; quit again to abort"
        return "aborting after the current write"


__all__ = ["ExtractHost", "RecordingCommands", "StaticExtractHost"]
