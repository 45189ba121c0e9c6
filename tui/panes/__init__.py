"""One module per dashboard pane; each pane is a widget with ``update_from(...)``.

Panes are pure views: they read an immutable :class:`~engine.report.snapshot.RunSnapshot` (or a
:class:`~engine.extract.gpu.GpuReading`) and redraw only what changed since their last update.
"""

from tui.panes.datasets import DatasetsTable
from tui.panes.errors import ErrorsPane
from tui.panes.gpus import GpusPane
from tui.panes.header import HeaderPane
from tui.panes.log import LogPane
from tui.panes.providers import ProvidersPane
from tui.panes.sample import SamplePane
from tui.panes.throughput import ThroughputPane

__all__ = [
    "DatasetsTable", "ErrorsPane", "GpusPane", "HeaderPane", "LogPane", "ProvidersPane", "SamplePane",
    "ThroughputPane",
]
