"""The extraction view of the dashboard (phase two): per-GPU status, per-dataset progress, log, keys.

- :mod:`tui.extract.host`: the typed host the view reads (``snapshot()``, ``commands``), a static host
  and a recording commands object;
- :mod:`tui.extract.cells`: pure text of every pane; :mod:`tui.extract.panes`: the widgets;
- :mod:`tui.extract.screen`: :class:`~tui.extract.screen.ExtractScreen` (panes, keys, polling), usable
  inside the generation dashboard; :mod:`tui.extract.app`: :class:`~tui.extract.app.ExtractApp`, the
  screen alone;
- :mod:`tui.extract.demo`: a fixed snapshot and a scripted job (``python -m tui.extract --demo``).
"""
