"""Layout: the dashboard's CSS with its width/height breakpoints, and small layout helpers.

Breakpoints (Textual sets these classes on the screen as the terminal resizes):

- below 120 columns or 30 rows (``-w-small``/``-h-small``): header, datasets table (80-column
  set of columns), log and footer only;
- 120-159 columns (``-w-medium``): providers and GPUs hidden;
- 160 columns and 44 rows or more: every pane.
"""

from __future__ import annotations

from typing import Any

from textual.widget import Widget

HORIZONTAL_BREAKPOINTS = [(0, "-w-small"), (120, "-w-medium"), (160, "-w-large")]
VERTICAL_BREAKPOINTS = [(0, "-h-small"), (30, "-h-medium"), (44, "-h-large")]

CSS = """
.pane { border: round $primary-darken-2; border-title-color: $text-accent; padding: 0 1; }
#datasets {
    height: auto; max-height: 45%; border: round $primary; border-title-color: $text-accent;
    border-subtitle-color: $text-muted;
}
#middle { height: 12; }
#middle > .pane, #sample { height: 1fr; }
#bottom { height: 1fr; min-height: 4; }
#throughput { width: 1fr; }
#errors { width: 1fr; }
#providers { width: 62; }
#sample { width: 1fr; }
#right { width: 1fr; }
#gpus { height: auto; max-height: 10; }
#log { height: 1fr; min-height: 3; scrollbar-size: 0 1; }  /* no horizontal scrollbar row: see LogPane */
Screen.-h-medium #middle { height: 8; }
Screen.-w-medium #providers, Screen.-w-medium #gpus { display: none; }
Screen.-w-small #middle, Screen.-h-small #middle { display: none; }
Screen.-w-small #sample, Screen.-h-small #sample { display: none; }
Screen.-w-small #gpus, Screen.-h-small #gpus { display: none; }
/* toasts inside the bottom-right pane (the log): above its bottom border and the footer, clear of its
   side borders (the right column is at least 60 cells wide) */
ToastRack { margin: 0 2 2 0; }
Toast { width: 56; max-width: 50%; }
"""


def shown(w: Widget) -> bool:
    """True when ``w`` and every ancestor up to its screen are displayed."""
    node: Any = w
    while node is not None and node is not w.screen:
        if not node.display:
            return False
        node = node.parent
    return True


def parse_keymap(spec: str) -> dict[str, str]:
    """``"dashboard.pause=f5;dashboard.quit=ctrl+x"`` -> ``{binding id: keys}`` (bad items ignored)."""
    out = {}
    for item in spec.split(";"):
        bid, _, keys = item.partition("=")
        if bid.strip() and keys.strip():
            out[bid.strip()] = keys.strip()
    return out
