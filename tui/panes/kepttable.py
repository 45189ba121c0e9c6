"""A Textual ``DataTable`` that keeps what it drew per cell, per row line and per screen line.

Textual's ``DataTable`` (8.2) keys its cell, row and line caches on one table-wide counter that every
``update_cell`` bumps: one changed figure made it render every cell again (Rich), assemble every row's
line from its cells and build every screen line's strip, each frame. :class:`KeptDataTable` keeps:

- each cell's rendered lines until the cell's value object (the ``Text`` that ``update_cell`` set, or
  the column's label for the header), its place, width, row height, style, cursor or hover state
  changes (``cell_renders`` counts the cells drawn again); a one-line ``Text`` data cell is drawn by
  :func:`text_cell_lines`, segment for segment as Textual draws it through Rich's generic render path
  (``Styled(Padding(text))``), ~3x cheaper (``text_cells`` counts those);
- each row line's segments (with a row cursor) until one of the row's value objects, its place, the
  column widths, the widget's width, its style or whether the cursor or hover is on the row changes
  (``row_builds`` counts the row lines assembled);
- each screen line's strip until its row line, crop, width or style changes (``line_builds``).

All are dropped with Textual's own caches (``_clear_caches``, ``notify_style_update``, ``clear``) and
when :data:`DRAWN_MAX` entries are reached. What is drawn is what ``DataTable`` draws: each kept item is
the object built for the same inputs (tests/tui/test_tui_table_text_cells.py compares the text path with
Textual's, segment for segment; the SVG snapshots are unchanged).
"""

from __future__ import annotations

from itertools import chain
from typing import cast

from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._segment_tools import line_crop
from textual.css.styles import RenderStyles
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets._data_table import RowKey

DRAWN_MAX = 4096
"""Most kept cells (and, separately, row lines and screen lines); all of a kind are dropped when it is reached."""

SegmentLines = list[list[Segment]]


class KeptDataTable(DataTable):
    """``DataTable`` whose drawing re-renders only the cells, row lines and screen lines that changed.

    Counters (for tests and profiling): ``cell_renders`` (cells drawn again), ``text_cells`` (of
    those, drawn by :func:`text_cell_lines`), ``row_builds`` (row lines assembled from cells),
    ``line_builds`` (screen-line strips built).
    """

    def __init__(self, *args, **kw) -> None:
        # set before DataTable.__init__, which already clears caches
        self._drawn: dict[tuple, tuple[tuple, object, SegmentLines]] = {}
        """``{(row key, column key, base style, cursor, hover): (place key, value, lines)}``: kept cells."""
        self._rows_drawn: dict[tuple, tuple[tuple, tuple, tuple[SegmentLines, SegmentLines]]] = {}
        """``{(row key, line, base style): (place key, values, (fixed, scrollable))}``: kept row lines."""
        self._lines_drawn: dict[int, tuple[tuple, object, Strip]] = {}
        """``{y: (crop key, row line, strip)}``: kept screen lines."""
        self._styles_pass: dict[tuple[str, ...], RenderStyles] | None = None
        """Component styles of the :meth:`render_lines` pass under way (None outside one)."""
        super().__init__(*args, **kw)
        self.cell_renders = 0
        self.text_cells = 0
        self.row_builds = 0
        self.line_builds = 0

    def render_lines(self, crop: Region) -> list[Strip]:
        """The widget's lines (``DataTable.render_lines``), with each component style (header, fixed,
        odd/even row) computed once in the pass instead of once per row line and cell."""
        self._styles_pass = {}
        try:
            return super().render_lines(crop)
        finally:
            self._styles_pass = None

    def get_component_styles(self, *names: str) -> RenderStyles:
        """``DOMNode.get_component_styles``; during :meth:`render_lines` the same object (its ``rich_style``
        computed once) for the same names: styles do not change within one pass."""
        kept = self._styles_pass
        if kept is None:
            return super().get_component_styles(*names)
        got = kept.get(names)
        if got is None:
            got = kept[names] = cast(RenderStyles, _PassStyles(super().get_component_styles(*names)))
        return got

    def _forget(self) -> None:
        self._drawn.clear()
        self._rows_drawn.clear()
        self._lines_drawn.clear()

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> SegmentLines:
        """One cell's lines (``DataTable._render_cell``), reused while the cell's value object, its
        place, width, row height, style, cursor and hover state are the same."""
        row_key = self._header_row_key if row_index == -1 else self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:  # a row label or a cell out of range: not kept
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if row_index == -1:
            value: object = self.columns[column_key].label
            height = self.header_height
        else:
            value = self._data.get(row_key, {}).get(column_key)
            height = self.rows[row_key].height
        slot = (row_key, column_key, base_style, cursor, hover)  # a cell is drawn in a few styles (fixed, cursor)
        key = (row_index, column_index, width, height, self._show_hover_cursor, self._pseudo_class_state,
               self.cell_padding)
        kept = self._drawn.get(slot)
        if kept is not None and kept[0] == key and kept[1] is value:
            return kept[2]
        lines = self._text_cell(row_index, column_index, value, base_style, width, height, cursor, hover)
        if lines is None:
            lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self.cell_renders += 1
        if len(self._drawn) >= DRAWN_MAX:
            self._drawn.clear()
        self._drawn[slot] = (key, value, lines)
        return lines

    def _text_cell(self, row_index: int, column_index: int, value: object, base_style: Style, width: int,
                   height: int, cursor: bool, hover: bool) -> SegmentLines | None:
        """A one-line ``Text`` data cell's lines as ``DataTable._render_cell`` draws them (same styles,
        meta, padding and segments), without Rich's generic render path (~3x cheaper); None for any other
        cell (the header, a row label, a renderable other than ``Text``, a row higher than 1)."""
        if row_index < 0 or column_index < 0 or height != 1 or type(value) is not Text:
            return None
        component_style, post_style = self._get_styles_to_render_cell(
            False, False, row_index < self.fixed_rows or column_index < self.fixed_columns, hover, cursor,
            self.show_cursor, self._show_hover_cursor, self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css")
        pre_style = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
        lines = text_cell_lines(self.app.console, self.app.console_options, value, width, self.cell_padding,
                                pre_style, post_style)
        if lines is not None:
            self.text_cells += 1
        return lines

    def _row_values(self, row_key: RowKey, row_index: int) -> tuple[tuple, tuple] | None:
        """``(place key, value objects)`` of a row line, or None when it is not kept (cursor not a row
        cursor, row labels shown, auto-height rows)."""
        if self.cursor_type != "row" or (self._labelled_row_exists and self.show_row_labels):
            return None
        columns = self.ordered_columns
        values: tuple[object, ...]
        if row_index == -1:
            values = tuple(c.label for c in columns)
            height = self.header_height
        else:
            row = self.rows.get(row_key)
            if row is None or row.auto_height:
                return None
            data = self._data.get(row_key, {})
            values = tuple(data.get(c.key) for c in columns)
            height = row.height
        place = (row_index, height, tuple(c.key for c in columns), tuple(c.get_render_width(self) for c in columns),
                 self.size.width, self.fixed_columns, self.fixed_rows, self.zebra_stripes, self.show_cursor,
                 self._show_hover_cursor, self._pseudo_class_state, self.cell_padding, self.cursor_foreground_priority,
                 self.cursor_background_priority)
        return place, values

    def _render_line_in_row(self, row_key: RowKey, line_no: int, base_style: Style, cursor_location,
                            hover_location) -> tuple[SegmentLines, SegmentLines]:
        """One row line's (fixed, scrollable) segments (``DataTable._render_line_in_row``), reused while
        the row's value objects, place, widths, styles and whether the cursor or hover is on it are the same."""
        located = self._row_locations.get(row_key)
        row_index = -1 if located is None else located
        got = self._row_values(row_key, row_index)
        if got is None:
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        place, values = got
        # with a row cursor, a row line depends on the cursor and hover only through "is it on this row"
        key = (*place, cursor_location.row == row_index, hover_location.row == row_index)
        slot = (row_key, line_no, base_style)
        kept = self._rows_drawn.get(slot)
        if (kept is not None and kept[0] == key and len(kept[1]) == len(values)
                and all(a is b for a, b in zip(kept[1], values, strict=True))):
            return kept[2]
        pair = super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        self.row_builds += 1
        if len(self._rows_drawn) >= DRAWN_MAX:
            self._rows_drawn.clear()
        self._rows_drawn[slot] = (key, values, pair)
        return pair

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """One screen line's strip (``DataTable._render_line``), reused while its row line (the same
        kept object), crop, width and style are the same."""
        width = self.size.width
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return Strip.blank(width, base_style)
        pair = self._render_line_in_row(row_key, line_no, base_style, self.cursor_coordinate, self.hover_coordinate)
        key = (x1, x2, width, base_style, row_key, line_no)
        kept = self._lines_drawn.get(y)
        if kept is not None and kept[0] == key and kept[1] is pair:
            return kept[2]
        fixed, scrollable = pair
        fixed_width = sum(c.get_render_width(self) for c in self.ordered_columns[: self.fixed_columns])
        fixed_line: list[Segment] = list(chain.from_iterable(fixed)) if fixed else []
        scrollable_line: list[Segment] = list(chain.from_iterable(scrollable))
        segments = fixed_line + line_crop(scrollable_line, x1 + fixed_width, x2, width)
        strip = Strip(segments).adjust_cell_length(width, base_style).simplify()
        self.line_builds += 1
        if len(self._lines_drawn) >= DRAWN_MAX:
            self._lines_drawn.clear()
        self._lines_drawn[y] = (key, pair, strip)
        return strip

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._forget()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget()

    def clear(self, columns: bool = False):
        self._forget()
        return super().clear(columns)



class _PassStyles:
    """A component's ``RenderStyles`` with its ``rich_style`` (an ancestors walk) taken once."""

    __slots__ = ("_styles", "rich_style")

    def __init__(self, styles: RenderStyles) -> None:
        self._styles = styles
        self.rich_style = styles.rich_style

    def __getattr__(self, name: str):
        return getattr(self._styles, name)


def text_cell_lines(console: Console, options: ConsoleOptions, value: Text, width: int, pad: int, pre_style: Style,
                    post_style: Style) -> SegmentLines | None:
    """``value`` drawn in a cell ``width`` cells wide and 1 high with ``pad`` cells each side, as
    ``console.render_lines(Styled(Padding(value, (0, pad)), pre_style, post_style), options at width x 1,
    no_wrap)`` draws it (the same calls on the text: wrap, join, render; the same padding, styling and
    line fitting), or None when that would not be one line (the text wraps to more, or ends with a newline)."""
    inner = width - 2 * pad
    if inner < 1 or value.end:
        return None
    tab_size = console.tab_size if value.tab_size is None else value.tab_size
    no_wrap = True if value.no_wrap is None else value.no_wrap
    wrapped = value.wrap(console, inner, justify=value.justify or options.justify or "default",
                         overflow=value.overflow or options.overflow or "fold", tab_size=tab_size or 8, no_wrap=no_wrap)
    if len(wrapped) != 1:
        return None
    segments = Segment.adjust_line_length(list(Text("\n").join(wrapped).render(console, end="")), inner, pad=True)
    if pad:
        blank = Segment(" " * pad, Style.null())
        segments = [blank, *segments, blank]
    return [Segment.adjust_line_length(list(Segment.apply_style(segments, pre_style, post_style)), width, pad=True)]
