"""Tables of one-line cells, drawn as `rich.table.Table(box=None, pad_edge=False, padding=(0, 1))` draws
them, at a fraction of the cost (rich only, no textual).

A rich Table measures every cell, then renders every cell through a Padding: for the block's small table
that was most of what a redraw cost. Here a table whose cells all fit their columns is laid out once, a
line of Text per row; one that would need rich's cropping, folding or collapsing (a cell wider than its
column, a table wider than the room) is left to rich (`lines()` says None, `rich()` is the same table as
a rich Table). tests/tui/test_tui_redraw.py holds the two to the same output
(test_the_fast_tables_draw_what_rich_draws, test_the_block_draws_what_rich_draws)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text


@dataclass
class Column:
    header: str = ""
    justify: str = "left"  # "left" or "right"
    style: str = ""  # under every cell's own style (not the header's)
    min_width: int | None = None
    max_width: int | None = None
    ratio: int | None = None  # with `expand`: the column takes the room left


@dataclass
class Grid:
    columns: list[Column]
    show_header: bool = True
    header_style: str = "bold"
    expand: bool = False
    rows: list[tuple[list[Text], str]] = field(default_factory=list)  # cells, the row's style

    def add_row(self, *cells: Text | str, style: str = "") -> None:
        self.rows.append(([c if isinstance(c, Text) else Text(c) for c in cells], style))

    def rich(self) -> Table:
        """The same table as a rich Table."""
        table = Table(box=None, show_header=self.show_header, header_style=self.header_style, pad_edge=False,
                      padding=(0, 1), expand=self.expand)
        for c in self.columns:
            table.add_column(c.header, justify=c.justify, style=c.style or None, no_wrap=True,
                             min_width=c.min_width, max_width=c.max_width, ratio=c.ratio)
        for cells, style in self.rows:
            table.add_row(*cells, style=style or None)
        return table

    def lines(self, width: int) -> list[Text] | None:
        """A Text per row (the header first), each `width` wide if `expand` else as wide as the table; None
        when a cell would not fit its column or the table the width (rich's Table draws those)."""
        n = len(self.columns)
        pads = [(0 if i == 0 else 1) + (0 if i == n - 1 else 1) for i in range(n)]
        widths = []
        for i, c in enumerate(self.columns):
            cells = [row[0][i] for row in self.rows if i < len(row[0])]
            if any("\n" in cell.plain for cell in cells) or "\n" in c.header:
                return None
            most = max([cell.cell_len for cell in cells] + ([cell_len(c.header)] if self.show_header else []),
                       default=0)
            w = most + pads[i]
            if c.min_width is not None:
                w = max(w, c.min_width + pads[i])
            if c.max_width is not None:
                if most > c.max_width:
                    return None  # rich would cut it with an ellipsis
                w = min(w, c.max_width + pads[i])
            widths.append(min(w, width) or 1)
        if self.expand:
            flexible = [i for i, c in enumerate(self.columns) if c.ratio]
            if len(flexible) != 1:
                return None
            (f,) = flexible
            room = width - sum(w for i, w in enumerate(widths) if i != f)
            if room < widths[f]:
                return None  # the flexible column's cells would be cut
            widths[f] = room
        if sum(widths) > width:
            return None
        out = []
        if self.show_header:
            out.append(self._line([Text(c.header) for c in self.columns], widths, pads, self.header_style,
                                  header=True))
        for cells, style in self.rows:
            if len(cells) != n:
                return None
            out.append(self._line(cells, widths, pads, style))
        return out

    def _line(self, cells: list[Text], widths: list[int], pads: list[int], row_style: str,
              header: bool = False) -> Text:
        line = Text(no_wrap=True, overflow="crop", end="")
        for i, (cell, c, w) in enumerate(zip(cells, self.columns, widths)):
            base = self.header_style if header else " ".join(s for s in (c.style, row_style) if s)
            piece = cell.copy()  # padded as rich pads it: the gap takes the cell's own style, not its spans
            if c.justify == "right":
                piece.rstrip()
                piece.pad_left(w - pads[i] - piece.cell_len)
            else:
                piece.pad_right(w - pads[i] - piece.cell_len)
            start = len(line)
            if i:
                line.append(" ")
            line.append_text(piece)
            if i < len(cells) - 1:
                line.append(" ")
            if base:
                line.stylize_before(base, start, len(line))
        return line


class Lines:
    """Text lines drawn as they are (no wrapping: each was laid out for the width it is shown at)."""

    def __init__(self, lines: list[Text], width: int):
        self.lines, self.width = lines, width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        for line in self.lines:
            yield from line.render(console)
            yield new_line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.width, self.width)


def beside(left: list[Text], left_width: int, right: Text, gap: int, width: int) -> Lines | None:
    """`left` (lines `left_width` wide), then `right`'s lines `gap` cells further, as rich draws a grid of
    the two (`right` on the room left); None if a line of `right` would have to wrap."""
    room = width - left_width - gap
    right_lines = right.split("\n", allow_blank=True)
    if room < 1 or any(line.cell_len > room for line in right_lines):
        return None
    out = []
    for i in range(max(len(left), len(right_lines))):
        line = left[i].copy() if i < len(left) else Text(" " * left_width)
        line.append(" " * gap)
        if i < len(right_lines):
            part = right_lines[i]
            line.append_text(part)
            line.append(" " * (room - part.cell_len))
        else:
            line.append(" " * room)
        out.append(line)
    return Lines(out, width)

