"""The dashboard's toasts: keyed toasts that replace each other, and guard-pause announcements."""

from __future__ import annotations

from textual.app import App
from textual.notifications import Notification, SeverityLevel

from engine.api import RunSnapshot


class Toasts:
    """Toasts of one app.

    Args:
        app: the Textual app that shows them.

    Attributes:
        keyed: the latest toast per key (see :meth:`toast`).
        notice_seen: the sequence number of the last guard pause announced (see :meth:`announce`).
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self.keyed: dict[str, Notification] = {}
        self.notice_seen = 0

    def toast(self, message: str, *, key: str | None = None, severity: SeverityLevel = "information",
              timeout: float = 3, title: str = "") -> None:
        """Show a toast. With ``key``, it replaces the toast shown earlier under the same key (if
        still on screen), so a repeated key (``-`` pressed 30 times) shows one toast, not a stack.
        Must run on the app's loop (key handlers and ``commands`` workers do)."""
        if key is None:
            self.app.notify(message, title=title, severity=severity, timeout=timeout)
            return
        shown = self.app._notifications
        old = self.keyed.get(key)
        if old is not None and old in shown:
            del shown[old]
        note = Notification(message, title, severity, timeout)
        self.keyed[key] = note
        # What App.notify's message handler does, done now so the next key finds it to replace.
        shown.add(note)
        self.app._refresh_notifications()

    def announce(self, snap: RunSnapshot) -> None:
        """Toast each guard pause of ``snap.notices`` not yet announced (the log pane shows the
        same pause as a WARNING event line), as loudly as the toast of a user's own pause."""
        for seq, text in snap.notices:
            if seq > self.notice_seen:
                self.notice_seen = seq
                # markup=False: "[dataset]" is text, not markup
                self.app.notify(text, title="paused by a guard", severity="warning", timeout=20, markup=False)


__all__ = ["Toasts"]
