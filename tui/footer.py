"""A footer that never cuts ``q Quit`` or ``? Help`` off: when its keys do not fit the terminal's
width, it leaves out the least important ones instead of the last ones.

Textual's :class:`~textual.widgets.Footer` lays the shown bindings out left to right in binding
order and clips what passes the right edge: one more key (``e Extraction`` with chaining) pushed
``q Quit`` off an 80-column footer. :class:`PriorityFooter` measures each key (the footer's own
CSS: compact ``key description`` plus a 1-cell margin; otherwise 1 cell of padding each side) and
drops keys in ``drop_order`` first, then the others from the right, never those in ``keep``. A
left-out key still works (it is only not drawn; ``?`` and the command palette list every key).

Textual's footer also rebuilds all its keys whenever its screen's bindings may have changed (a view
switch, a new selection), and shows nothing until the rebuild is done: with the engine busy on the
same loop the footer read blank for a second or more after ``e``. :class:`PriorityFooter` composes
its keys at once and rebuilds only when what it shows changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

KEEP = ("quit", "quit_extract", "help")
"""Actions whose keys are never left out."""


def key_width(key_display: str, description: str, compact: bool) -> int:
    """Cells one footer key takes, its margin included (Textual's ``FooterKey`` CSS)."""
    if compact:  # key, a space, the description, then margin-right 1
        return cell_len(key_display) + (1 + cell_len(description) if description else 0) + 1
    return 1 + cell_len(key_display) + 1 + (cell_len(description) + 1 if description else 0)


def left_out(keys: Sequence[tuple[str, int]], width: int, keep: Iterable[str] = KEEP,
             drop_order: Sequence[str] = ()) -> frozenset[str]:
    """The actions to leave out so that ``keys`` (``(action, cells)`` in display order) fit
    ``width`` cells: those in ``drop_order`` first (in that order), then the rest from the right;
    never an action in ``keep`` (if those alone do not fit, the footer clips as Textual's does)."""
    keep = set(keep)
    total = sum(w for _, w in keys)
    order = [a for a in drop_order if any(a == k for k, _ in keys)]
    order += [a for a, _ in reversed(keys) if a not in order]
    out: set[str] = set()
    for action in order:
        if total <= width:
            break
        if action in keep:
            continue
        out.add(action)
        total -= sum(w for a, w in keys if a == action)
    return frozenset(out)


class PriorityFooter(Footer):
    """A :class:`~textual.widgets.Footer` that leaves out the least important keys instead of clipping.

    Args:
        drop_order: actions to leave out first, most expendable first.
        keep: actions never left out (default :data:`KEEP`).
        **kw: as :class:`~textual.widgets.Footer`.

    Attributes:
        hidden: the actions left out at the last composition.
    """

    def __init__(self, *, drop_order: Sequence[str] = (), keep: Iterable[str] = KEEP, **kw) -> None:
        super().__init__(**kw)
        self.drop_order = tuple(drop_order)
        self.keep = tuple(keep)
        self.hidden: frozenset[str] = frozenset()
        self.composed: tuple | None = None
        """What the footer showed at its last composition (see :meth:`shows`)."""

    def _width(self) -> int:
        return self.size.width or self.app.size.width

    def _left_out(self) -> frozenset[str]:
        """What to leave out at the current width and style (from the screen's active bindings)."""
        seen: set[str] = set()
        keys: list[tuple[str, int]] = []
        for _, binding, _, _ in self.screen.active_bindings.values():
            if binding.show and binding.action not in seen:  # the footer shows one key per action
                seen.add(binding.action)
                keys.append((binding.action, key_width(self.app.get_key_display(binding), binding.description,
                                                       self.compact)))
        room = self._width()
        if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE:
            palette = self.screen.active_bindings.get(self.app.COMMAND_PALETTE_BINDING)
            if palette is not None:  # docked right, with a 1-cell border and (not compact) 1 of padding
                b = palette.binding
                room -= key_width(self.app.get_key_display(b), b.description, self.compact) + (1 if self.compact else 2)
        return left_out(keys, room, self.keep, self.drop_order)

    def shows(self) -> tuple:
        """What the footer would show now: each shown binding (key, description, action, enabled),
        the command-palette key, the style and the keys left out."""
        keys = tuple((b.key, b.description, b.action, bool(enabled))
                     for _, b, enabled, _ in self.screen.active_bindings.values() if b.show)
        return keys, self.show_command_palette, self.compact, self._left_out()

    def compose(self) -> ComposeResult:
        # At once, not after the screen first says its bindings are ready (Textual's footer waits,
        # blank, for that): the bindings are the screen's, known when it mounts the footer.
        self._bindings_ready = True
        self.hidden = self._left_out()
        self.composed = self.shows()
        for widget in super().compose():  # lazily: binding groups' ``with`` blocks stay in step
            if isinstance(widget, FooterKey) and widget.action in self.hidden and not widget.has_class("-grouped"):
                continue
            yield widget

    def bindings_changed(self, screen) -> None:  # textual.screen.Screen
        """Rebuild the keys only when what the footer shows changed (Textual's rebuilds each time)."""
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        # Only on the screen shown: a view under another one (the extraction view over the generation
        # view) has its own keys turned off meanwhile; rebuilt for that, its footer read blank when
        # it came back. Its screen says its bindings changed again when it is shown (the focus returns).
        if self.is_attached and self.screen.is_active and self.shows() != self.composed:
            await self.recompose()

    def _refit(self) -> None:
        if self.is_attached and self._bindings_ready and self._left_out() != self.hidden:
            self.refresh(recompose=True)

    def on_resize(self) -> None:
        self._refit()

    def watch_compact(self) -> None:
        self.call_after_refresh(self._refit)


__all__ = ["KEEP", "PriorityFooter", "key_width", "left_out"]
