"""What the dashboard and extraction-view tests read off a running Textual app: the footer row, the toasts."""

from __future__ import annotations

from typing import Any

from tui.testing import screen_text


def footer(app: Any) -> str:
    """The footer row's text."""
    return screen_text(app).split("\n")[-1]


def toasts(app: Any) -> list[str]:
    """The messages of the notifications (toasts) the app shows, oldest first."""
    return [str(n.message) for n in app._notifications]
