"""Modal screens: confirm, quit (drain/abort), pick one of a list, help.

Each is pushed with ``app.push_screen(screen, callback)``: the callback gets the result, so no
message handler ever awaits a screen (which would deadlock Textual's message loop).
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, OptionList, Static

from tui.fmt import money


def modal_css(name: str) -> str:
    """:data:`MODAL_CSS` for the screen class ``name``: Textual scopes a widget's ``DEFAULT_CSS`` to
    it (a ``ModalScreen ...`` rule in ``QuitScreen.DEFAULT_CSS`` reads ``QuitScreen ModalScreen ...``
    and matches nothing: the dialog lost its frame, its centring and the dimmed dashboard behind)."""
    return MODAL_CSS.replace("ModalScreen", name)


MODAL_CSS = """
ModalScreen { align: center middle; }
ModalScreen > Vertical {
    width: auto; max-width: 90%; min-width: 40; height: auto; max-height: 90%;
    border: thick $warning; background: $surface; padding: 1 2;
}
ModalScreen .title { text-style: bold; margin-bottom: 1; }
ModalScreen Horizontal { height: auto; margin-top: 1; align-horizontal: center; }
ModalScreen Button { margin: 0 1; }
ModalScreen Button:focus { text-style: bold reverse; border: tall $accent; }
ModalScreen OptionList { height: auto; max-height: 20; }
"""


class KeyButton(Button):
    """A dialog button that names its key, ``Skip [y]``, and marks itself while it has the focus,
    ``▸ Skip [y] ◂`` (Enter presses it), so the button Enter presses is plain in any terminal."""

    def __init__(self, label: str, key: str, **kw) -> None:
        self.key_label = f"{label} [{key}]"
        """The label with its key, without the focus marks."""
        super().__init__(self._label(False), **kw)

    def _label(self, focused: bool) -> Content:
        # Content, not a str: "[y]" would be read as markup and vanish
        return Content(f"▸ {self.key_label} ◂" if focused else f"  {self.key_label}  ")

    def on_focus(self) -> None:
        self.label = self._label(True)

    def on_blur(self) -> None:
        self.label = self._label(False)


ARROWS = [
    Binding("left", "app.focus_previous", "Previous", show=False, id="modal.left"),
    Binding("right", "app.focus_next", "Next", show=False, id="modal.right"),
]
"""Left/Right move the focus between a dialog's buttons (like Shift-Tab/Tab)."""


def abort_estimate(snap) -> str:  # engine.report.snapshot.RunSnapshot
    """``"Abort now: est. $4.52 billed (from the billing of 40 aborted stream(s): ...)"``: the
    estimated bill of aborting the streams in flight, labelled as an estimate with its basis."""
    return f"Abort now: est. {money(snap.abort_cost_usd)} billed ({snap.abort_cost_basis or 'estimate'})."


def quit_body(snap) -> str:  # engine.report.snapshot.RunSnapshot
    """The quit dialog's text: streams in flight, what they cost when they finish, what an abort
    is estimated to bill, and what drain and abort do."""
    return (f"{snap.in_flight:,} requests in flight (est. {money(snap.cost_in_flight_usd)} when they finish).\n"
            f"{abort_estimate(snap)}\n"
            "Drain: stop dispatching, let them finish and store them, then exit.\n"
            "Abort: cancel them now (prompts return to pending; streamed tokens are billed).")


def abort_body(snap) -> str:  # engine.report.snapshot.RunSnapshot
    """The abort confirmation's text (see :func:`quit_body`)."""
    return (f"{snap.in_flight:,} requests in flight, est. {money(snap.cost_in_flight_usd)} when they finish.\n"
            f"{abort_estimate(snap)}\n"
            "Their prompts return to pending; tokens already streamed are still billed.")


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no question; ``y`` confirms, ``n``/Escape cancel, Enter presses the focused button (Left/Right
    or Tab move between them). Dismisses with True or False. The footer lists the dialog's keys."""

    DEFAULT_CSS = modal_css("ConfirmScreen")
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
        *ARROWS,
    ]

    def __init__(self, title: str, body: str | Text, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self._title, self._body, self._yes, self._no = title, body, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title, classes="title")
            yield Static(self._body)
            with Horizontal():
                yield KeyButton(self._yes, "y", id="yes", variant="error")
                yield KeyButton(self._no, "n", id="no")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class QuitScreen(ModalScreen[str | None]):
    """Quit with requests in flight: ``d`` drain, ``a`` abort, Escape stay; Left/Right or Tab move
    between the buttons, Enter presses the focused one. Dismisses with
    ``"drain"``, ``"abort"`` or None."""

    DEFAULT_CSS = modal_css("QuitScreen")
    BINDINGS = [
        Binding("d", "choose('drain')", "Drain", id="quit.drain"),
        Binding("a", "choose('abort')", "Abort", id="quit.abort"),
        Binding("escape,n", "choose(None)", "Stay", id="quit.cancel"),
        *ARROWS,
    ]

    def __init__(self, body: str | Text) -> None:
        super().__init__()
        self._body = body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Quit?", classes="title")
            yield Static(self._body)
            with Horizontal():
                yield KeyButton("Drain, then quit", "d", id="drain", variant="primary")
                yield KeyButton("Abort now", "a", id="abort", variant="error")
                yield KeyButton("Stay", "esc", id="stay")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#drain", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "stay" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)


class PickScreen(ModalScreen[str | None]):
    """Choose one of ``options`` (``(value, label)``); Enter picks, Escape cancels."""

    DEFAULT_CSS = modal_css("PickScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="pick.cancel")]

    def __init__(self, title: str, options: list[tuple[str, str]]) -> None:
        super().__init__()
        self._title = title
        self._values = [v for v, _ in options]
        self._labels = [label for _, label in options]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title, classes="title")
            yield OptionList(*self._labels, id="options")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self._values[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """The keys and what they do, two columns (explanations wrap beside their key). Wide enough
    that every line shows at 120x40; in a smaller terminal the keys scroll (Up/Down, Page Up/Down,
    Home/End). Any other key closes it."""

    DEFAULT_CSS = modal_css("HelpScreen") + """
    HelpScreen > Vertical {
        width: 110; max-width: 96%; max-height: 96%; padding: 0 1; border-title-style: bold; border-title-color: $text;
    }
    HelpScreen VerticalScroll { height: auto; max-height: 100%; }
    """

    SCROLL_KEYS = frozenset({"up", "down", "pageup", "pagedown", "home", "end"})
    """Keys that scroll the help instead of closing it."""

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        super().__init__()
        self._lines = lines

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(justify="right", style="bold cyan", no_wrap=True)
        keys.add_column()
        for key, what in self._lines:
            keys.add_row(Text(key), Text(what))  # Text: "[extract]" is no markup
        notes = Text("ctrl+p opens the command palette with the same actions. Keys can be remapped by binding "
                     "id: DATAGEN_KEYS='dashboard.pause=f5;dashboard.quit=ctrl+x'. Any other key closes this.",
                     style="dim")
        with Vertical() as box:  # the title in the border: the scroll is the box's only child, never cut
            box.border_title = "eagle-datagen dashboard: keys"
            with VerticalScroll():
                yield Static(Group(keys, Text(""), notes))

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()

    def on_key(self, event) -> None:  # textual.events.Key
        if event.key in self.SCROLL_KEYS:
            return  # the scroll's own bindings move it
        event.stop()
        self.dismiss(None)
